//! The master's sweep of shared-memory payload segments whose owner died.
//!
//! Clients on the master's host put large payloads in `/dev/shm/rtpool-<pid>-<start>-...`
//! files (`python/rtpool/_shm.py`; `docs/protocol.md`, "Shared-memory payloads"), named after
//! the client process that owns them: its pid and its start time in clock ticks since boot
//! (field 22 of `/proc/<pid>/stat`, so a reused pid does not pass for the owner). A client frees
//! its segments itself; one killed with `kill -9` cannot, and this sweep removes its segments
//! within [`SWEEP_EVERY`]. The master never reads the segments.

use std::path::Path;
use std::time::Duration;

use tracing::{debug, info};

/// How often the master looks for segments of dead owners.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Directory of the segments.
const SHM_DIR: &str = "/dev/shm";

/// Runs [`sweep_once`] every [`SWEEP_EVERY`] until the task is aborted.
pub async fn run() {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match tokio::task::spawn_blocking(|| sweep_once(Path::new(SHM_DIR))).await {
            Ok(0) | Err(_) => {}
            Ok(n) => info!("removed {n} shared-memory segments of clients that died"),
        }
    }
}

/// Removes every `rtpool-<pid>-<start>-*` file of `dir` whose owner process is gone; returns
/// how many. A directory that cannot be read (no `/dev/shm`) sweeps nothing.
pub fn sweep_once(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, start)) = name.to_str().and_then(owner_of) else {
            continue;
        };
        if start_time(pid) != Some(start) && std::fs::remove_file(entry.path()).is_ok() {
            debug!("removed shared-memory segment {name:?}: its owner {pid} is gone");
            removed += 1;
        }
    }
    removed
}

/// The owner (pid, start time) in a segment's name.
fn owner_of(name: &str) -> Option<(u32, u64)> {
    let mut parts = name.strip_prefix("rtpool-")?.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((pid, start))
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`), None if it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces and parentheses: count fields after its last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_others_do_not() {
        assert_eq!(owner_of("rtpool-12-345-12.0.ab"), Some((12, 345)));
        assert_eq!(owner_of("rtpool-12-345"), None);
        assert_eq!(owner_of("other-12-345-x"), None);
        assert_eq!(owner_of("rtpool-x-345-y"), None);
    }

    #[test]
    fn sweeps_dead_owners_and_keeps_live_ones() {
        let dir = std::env::temp_dir().join(format!("rtpool-sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let live = format!("rtpool-{me}-{}-1.0.aa", start_time(me).unwrap());
        let reused = format!("rtpool-{me}-1-1.0.bb"); // our pid, another start time
        let dead = "rtpool-4194303-7-1.0.cc".to_owned(); // above the largest pid
        for name in [&live, &reused, &dead, &"unrelated".to_owned()] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        assert_eq!(sweep_once(&dir), 2);
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [live, "unrelated".to_owned()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
