//! Compaction: rewriting the journal as the smallest file that replays to the same state.
//!
//! This module owns what the compacted file holds and the write-fsync-rename-fsync sequence
//! that makes it replace the old one atomically. When to compact is the writer's
//! (`thread.rs`); running it beside the writer, which goes on appending, is
//! `background.rs`'s.
//!
//! The compacted file holds, in order: a meta record (`next_package`, `last_lsn`); for each
//! live package its `Package` record, its undelivered `Done` records and one `Delivered` record
//! with all its delivered indices; then a `Charge` record for every charge above the watermark
//! that no kept `Done` record carries. Every record keeps the LSN it had (the merged `Delivered`
//! takes the highest of those it merges), so LSNs stay unique and the watermark keeps meaning
//! the same thing.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use super::frame;
use super::record::{self, Entry, Record};
use super::replay::State;
use super::JournalError;

/// `<path>.compact`: where the compacted file is written before it is renamed over `path`.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(".compact");
    PathBuf::from(name)
}

/// Bytes written between two fsyncs of the compacted file: each fsync then takes a bounded
/// time (tens of milliseconds on a common disk), and a cancelled compaction stops after at
/// most one of them instead of after the whole file's.
pub(crate) const SYNC_EVERY_BYTES: u64 = 8 << 20;

/// The pace of a compaction's writes (`--journal-compact-mb-per-s`): after each fsync, the
/// compactor waits until its bytes so far are within the rate, in steps short enough that a
/// cancelled compaction still stops at once.
#[derive(Debug)]
pub(crate) struct Pace {
    started: std::time::Instant,
    bytes_per_s: u64,
}

impl Pace {
    /// Longest single wait: a cancel (the journal closing) is seen within it.
    const STEP: std::time::Duration = std::time::Duration::from_millis(10);

    /// A pace of `bytes_per_s` (0: no waiting), counted from now.
    pub(crate) fn new(bytes_per_s: u64) -> Self {
        Pace {
            started: std::time::Instant::now(),
            bytes_per_s,
        }
    }

    /// Waits until `written` bytes are within the pace; false if `cancel` was set meanwhile.
    pub(crate) fn wait(&self, written: u64, cancel: &AtomicBool) -> bool {
        if self.bytes_per_s == 0 {
            return !cancel.load(SeqCst);
        }
        let due = std::time::Duration::from_secs_f64(written as f64 / self.bytes_per_s as f64);
        loop {
            if cancel.load(SeqCst) {
                return false;
            }
            let elapsed = self.started.elapsed();
            if elapsed >= due {
                return true;
            }
            std::thread::sleep((due - elapsed).min(Self::STEP));
        }
    }
}

/// Writes the compacted form of `state` to [`tmp_path`], fsyncing as it goes (and keeping to
/// `pace` after each fsync); returns the file (positioned at its end, not yet fsynced past
/// the last [`SYNC_EVERY_BYTES`]) and its size, or `None` when `cancel` was set meanwhile.
///
/// Charges with an LSN at or below `watermark` are dropped: the user store has them.
pub(crate) fn write(
    path: &Path,
    state: &State,
    watermark: u64,
    cancel: &AtomicBool,
    pace: &Pace,
) -> Result<Option<(File, u64)>, JournalError> {
    let tmp = tmp_path(path);
    let file = crate::data_dir::private(&mut OpenOptions::new())
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| JournalError::io("create", &tmp, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut buf = Vec::new();
    let mut size = 0u64;
    let mut synced = 0u64;
    // Ok(false): cancelled.
    let mut put = |lsn: u64, entry: &Entry| -> Result<bool, JournalError> {
        buf.clear();
        let len = frame::put_with(&mut buf, lsn, |b| record::encode_into(b, entry))
            .map_err(|bytes| JournalError::RecordTooLarge { lsn, bytes })?;
        size += len as u64;
        out.write_all(&buf)
            .map_err(|e| JournalError::io("write", &tmp, e))?;
        if size - synced >= SYNC_EVERY_BYTES {
            synced = size;
            out.flush()
                .and_then(|()| out.get_ref().sync_data())
                .map_err(|e| JournalError::io("fsync", &tmp, e))?;
            return Ok(pace.wait(size, cancel));
        }
        Ok(!cancel.load(SeqCst))
    };
    if !entries(state, watermark, &mut put)? {
        return Ok(None);
    }
    let file = out
        .into_inner()
        .map_err(|e| JournalError::io("write", &tmp, e.into_error()))?;
    Ok(Some((file, size)))
}

/// Calls `put` with every record of the compacted form of `state`, meta record first, with
/// its LSN; stops early and returns `Ok(false)` when `put` returns `Ok(false)` (cancelled).
/// The file and the PostgreSQL journal ([`super::pg`]) both compact through it.
///
/// Charges with an LSN at or below `watermark` are left out: the user store has them.
pub(crate) fn entries<E>(
    state: &State,
    watermark: u64,
    put: &mut impl FnMut(u64, &Entry) -> Result<bool, E>,
) -> Result<bool, E> {
    let meta = Entry::Meta {
        version: record::FORMAT_VERSION,
        next_package: state.next_package,
        last_lsn: state.last_lsn,
    };
    // The meta record is not a sequenced record: LSN 0 is never assigned.
    put(0, &meta)?;
    for p in state.live.values() {
        let mut going = put(p.lsn, &Entry::Record(Record::Package(p.record.clone())))?;
        for (lsn, done) in &p.done {
            going &= put(*lsn, &Entry::Record(Record::Done(done.clone())))?;
        }
        if !p.delivered.is_empty() {
            let indices = p.delivered.iter().copied().collect();
            let package = p.record.package;
            going &= put(
                p.delivered_lsn,
                &Entry::Record(Record::Delivered { package, indices }),
            )?;
        }
        if !going {
            return Ok(false);
        }
    }
    let kept = state.kept_done_lsns();
    let mut charges: Vec<_> = state
        .charges
        .iter()
        .filter(|(_, _, lsn)| *lsn > watermark && !kept.contains(lsn))
        .collect();
    charges.sort_by_key(|c| c.2);
    for (user, exec_us, lsn) in charges {
        let user = state.user_name(*user).to_owned();
        let exec_us = *exec_us;
        if !put(*lsn, &Entry::Record(Record::Charge { user, exec_us }))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Renames [`tmp_path`] over `path` and fsyncs the directory so the rename survives a crash.
pub(crate) fn install(path: &Path) -> Result<(), InstallError> {
    let tmp = tmp_path(path);
    std::fs::rename(&tmp, path)
        .map_err(|e| InstallError::Rename(JournalError::io("rename", &tmp, e)))?;
    sync_dir(path).map_err(InstallError::DirSync)
}

/// Why [`install`] failed.
#[derive(Debug)]
pub(crate) enum InstallError {
    /// The rename failed: the old file is still in place and complete.
    Rename(JournalError),
    /// The rename happened but may not be on disk: whether a crash leaves the old or the new
    /// file is unknown, so appends to the new one cannot be promised.
    DirSync(JournalError),
}

/// Fsyncs the directory holding `path`, making a create or rename in it durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), JournalError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io("fsync directory of", path, e))
}

#[cfg(test)]
mod tests {
    use super::Pace;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::Instant;

    #[test]
    fn a_pace_holds_the_writer_to_its_rate_and_gives_way_to_a_cancel() {
        let cancel = AtomicBool::new(false);
        let started = Instant::now();
        // 1 MB/s: 40 kB written are due 40 ms after the start.
        assert!(Pace::new(1_000_000).wait(40_000, &cancel));
        assert!(
            started.elapsed().as_millis() >= 40,
            "{:?}",
            started.elapsed()
        );
        // No pace: never waits. A cancel ends a wait however far behind the writer is.
        assert!(Pace::new(0).wait(u64::MAX / 2, &cancel));
        cancel.store(true, SeqCst);
        let started = Instant::now();
        assert!(!Pace::new(1).wait(1 << 30, &cancel));
        assert!(!Pace::new(0).wait(1, &cancel));
        assert!(
            started.elapsed().as_secs() < 5,
            "a cancelled wait returns at once"
        );
    }
}
