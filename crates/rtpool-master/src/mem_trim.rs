//! Giving freed memory back to the operating system (issue 29).
//!
//! glibc keeps the pages of freed heap chunks: a master that held 200 MiB of unacknowledged
//! results stays at that resident size after they are freed (`benches/mem_release.py`: 19 MB at
//! start, 300-370 MB at the peak, 25-92 MB after the release, 26 MB after a `malloc_trim(0)`).
//! Once a second this task asks the allocator how many bytes its arenas hold free
//! (`mallinfo2().fordblks`) and, when at least [`TRIM_MIN_BYTES`] more became free since the
//! lowest count seen after the last trim, returns the free pages with `malloc_trim(0)`. It runs
//! on a blocking thread, never on the scheduler's; a master whose memory is locked (real-time
//! mode, `mlockall`) keeps its pages: re-faulting them later would cost the hot path.

use std::time::Duration;

use tracing::debug;

/// How often the allocator's free bytes are read.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Bytes that must have become free since the last trim (its low point) before the next one.
pub const TRIM_MIN_BYTES: u64 = 16 << 20;

/// Runs [`Trimmer::tick`] every [`TRIM_EVERY`] until the task is aborted.
pub async fn run() {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trimmer = Trimmer::default();
    loop {
        tick.tick().await;
        match tokio::task::spawn_blocking(move || {
            let mut t = trimmer;
            let trimmed = t.tick();
            (t, trimmed)
        })
        .await
        {
            Ok((t, trimmed)) => {
                trimmer = t;
                if let Some((before, after)) = trimmed {
                    debug!("returned free heap pages: resident {before} -> {after} KiB");
                }
            }
            Err(_) => return,
        }
    }
}

/// The trim decision: the low point of the allocator's free bytes since the last trim.
#[derive(Clone, Copy, Debug, Default)]
pub struct Trimmer {
    low: Option<u64>,
}

impl Trimmer {
    /// Reads the free bytes; trims when [`TRIM_MIN_BYTES`] more are free than at the low
    /// point. Returns the resident KiB before and after a trim it made.
    pub fn tick(&mut self) -> Option<(u64, u64)> {
        let free = sys::free_bytes()?;
        if !self.should_trim(free) || sys::memory_locked() {
            return None;
        }
        let before = sys::resident_kib();
        sys::trim();
        Some((before, sys::resident_kib()))
    }

    /// Whether `free` bytes held free call for a trim (and, if so, the low point restarts).
    pub fn should_trim(&mut self, free: u64) -> bool {
        let low = self.low.map_or(free, |l| l.min(free));
        if free - low >= TRIM_MIN_BYTES {
            self.low = Some(free);
            true
        } else {
            self.low = Some(low);
            false
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod sys {
    /// Bytes in free chunks of every arena (`mallinfo2`, glibc 2.33+).
    pub fn free_bytes() -> Option<u64> {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value.
        let info = unsafe { libc::mallinfo2() };
        Some(info.fordblks as u64)
    }

    /// Returns the free pages of every arena to the OS.
    pub fn trim() {
        // SAFETY: malloc_trim(0) only releases memory the allocator holds free.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn status_kib(field: &str) -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    pub fn resident_kib() -> u64 {
        status_kib("VmRSS:")
    }

    pub fn memory_locked() -> bool {
        status_kib("VmLck:") > 0
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod sys {
    pub fn free_bytes() -> Option<u64> {
        None
    }
    pub fn trim() {}
    pub fn resident_kib() -> u64 {
        0
    }
    pub fn memory_locked() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_enough_became_free_since_the_low_point() {
        let mut t = Trimmer::default();
        assert!(!t.should_trim(40 << 20)); // the first reading is the low point
        assert!(!t.should_trim(50 << 20));
        assert!(t.should_trim(56 << 20)); // 16 MiB above the low point of 40
        assert!(!t.should_trim(56 << 20)); // the pages are returned; still free, no new trim
        assert!(!t.should_trim(8 << 20)); // reused: a new low point
        assert!(t.should_trim(30 << 20)); // and 22 MiB freed again
    }

    #[test]
    fn this_allocator_reports_its_free_bytes() {
        // The trim itself is shown end to end by tests/test_memory_release.py (a real master's
        // resident size); other tests of this binary allocate in parallel, so none here.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(sys::free_bytes().is_some());
        let mut t = Trimmer::default();
        assert!(t.tick().is_none(), "the first reading only sets the low point");
        assert!(t.low.is_some() || cfg!(not(all(target_os = "linux", target_env = "gnu"))));
    }
}
