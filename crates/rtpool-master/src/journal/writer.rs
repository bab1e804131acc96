//! The [`FileJournal`] handle: open (replay, upgrade), LSN assignment, stats, compaction on demand
//! and close.
//!
//! Callers never wait for I/O: [`FileJournal::append`] only assigns an LSN and queues the record
//! (`queue.rs`; it waits only while the queue is full); the writer thread (`thread.rs`)
//! takes whatever has queued, writes it with one `write`, then syncs as the policy says.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use super::compact::{self};
use super::frame;
use super::queue::Queue;
use super::record::{self, Entry, Record};
use super::replay;
use super::shared::Shared;
use super::thread::Writer;
use super::{JournalConfig, JournalError, Replay};

/// A cheap, cloneable handle to the journal; all clones share one file and writer thread.
///
/// Dropping the last clone closes the journal as [`FileJournal::close`] does.
#[derive(Clone)]
pub struct FileJournal {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// LSNs and the commands for the writer thread.
    queue: Arc<Queue>,
    /// The writer thread until [`FileJournal::close`] joins it.
    thread: Mutex<Option<JoinHandle<Option<JournalError>>>>,
    shared: Arc<Shared>,
    durable: watch::Receiver<u64>,
}

/// A snapshot of the journal's counters (since open unless said otherwise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Size of `journal.log` now.
    pub file_bytes: u64,
    /// Records written.
    pub records: u64,
    /// Bytes written to `journal.log` by appends (compaction not counted).
    pub bytes_written: u64,
    /// Group writes (one `write` call each).
    pub groups: u64,
    /// Successful `fdatasync` calls on `journal.log` (the compacted file's not counted).
    pub fsyncs: u64,
    /// Compactions done.
    pub compactions: u64,
    /// Records in the last group write.
    pub last_group_records: u64,
    /// Bytes in the last group write.
    pub last_group_bytes: u64,
    /// Most records any group write carried.
    pub max_group_records: u64,
    /// Highest LSN handed out by [`Journal::append`] (or replayed).
    pub last_lsn: u64,
    /// Highest LSN written to the file.
    pub written_lsn: u64,
    /// Highest LSN covered by a finished fsync.
    pub synced_lsn: u64,
    /// Highest LSN reported by [`Journal::durable`].
    pub durable_lsn: u64,
    /// The watermark last set.
    pub watermark: u64,
    /// How long the last compaction took, in microseconds (it ran beside the appends).
    pub last_compaction_us: u64,
    /// How long the last compaction paused appends to install itself, in microseconds.
    pub last_compaction_pause_us: u64,
    /// Compactions abandoned because the journal closed.
    pub compactions_cancelled: u64,
    /// Whether a compaction is running now.
    pub compacting: bool,
    /// Estimated bytes of records waiting for the writer thread now.
    pub queued_bytes: u64,
    /// Capacity of the writer thread's group buffer now, bytes (given back once a burst of
    /// large records is written: see `thread.rs`).
    pub buffer_bytes: u64,
    /// Appends that waited for room in the queue (backpressure).
    pub backpressure_waits: u64,
    /// Time appends waited for room, in all, in microseconds.
    pub backpressure_us: u64,
    /// Whether the writer stopped after a fatal error.
    pub failed: bool,
    /// Durations of the fsyncs of `journal.log`, microseconds (a histogram).
    pub fsync_us: crate::status::histogram::FsyncCounts,
}

impl FileJournal {
    /// Replays the journal at `cfg.path` (a missing file is an empty journal, a torn last
    /// record is cut off), then starts the writer thread appending after it. A file of an
    /// older format version ([`super::MIN_FORMAT_VERSION`] or later) is rewritten in the
    /// current one first.
    ///
    /// # Errors
    ///
    /// [`JournalError::Corrupt`] when a damaged record has valid ones after it;
    /// [`JournalError::Io`] when the file or its directory cannot be read or written.
    pub fn open(cfg: JournalConfig) -> Result<(FileJournal, Replay), JournalError> {
        let started = Instant::now();
        let path = cfg.path.clone();
        remove_stale_compaction(&path)?;
        let mut replay = replay::recover(&path)?;
        replay.elapsed = started.elapsed();
        if replay.bytes == 0 {
            start_file(&path, replay.next_package, replay.last_lsn)?;
        }
        let queue = Arc::new(Queue::new(replay.last_lsn + 1));
        let (writer, shared, durable) = Writer::new(&cfg, replay.last_lsn, queue.clone())?;
        let thread = std::thread::Builder::new()
            .name("rtpool-journal".into())
            .spawn(move || writer.run())
            .map_err(|e| JournalError::io("start writer thread for", &path, e))?;
        let inner = Inner {
            path,
            queue,
            thread: Mutex::new(Some(thread)),
            shared,
            durable,
        };
        let journal = FileJournal {
            inner: Arc::new(inner),
        };
        if replay.format_version < record::FORMAT_VERSION {
            journal.upgrade(replay.format_version);
        }
        Ok((journal, replay))
    }

    /// Rewrites a file of an older format version in the current one (a compaction), so that
    /// its meta record tells a master that reads only the old version to refuse it. On failure
    /// the file is still read and appended to by this master; the next compaction retries.
    fn upgrade(&self, from: u64) {
        match self.compact_now() {
            Ok(()) => tracing::info!(
                path = %self.inner.path.display(),
                "journal upgraded from format version {from} to {}",
                record::FORMAT_VERSION
            ),
            Err(err) => tracing::warn!(
                path = %self.inner.path.display(),
                error = %err,
                "journal format version {from} could not be upgraded to {} now; \
                 retrying at the next compaction",
                record::FORMAT_VERSION
            ),
        }
    }

    /// Queues `rec` for the writer thread and returns its LSN. Never waits for I/O; waits for
    /// the writer thread only while the queue holds more than 16 MiB of records (see
    /// `queue.rs`), which bounds the journal's memory whatever the disk's speed.
    ///
    /// After [`Journal::close`] or a fatal error the record is dropped (logged once): its LSN
    /// is still returned but [`Journal::durable`] never reaches it.
    pub fn append(&self, rec: Record) -> u64 {
        let (lsn, sent) = self.inner.queue.append(rec, &self.inner.shared);
        if !sent && !self.inner.shared.dropped_warned.swap(true, Relaxed) {
            tracing::error!(
                lsn,
                path = %self.inner.path.display(),
                "journal is closed or failed; records are no longer written"
            );
        }
        lsn
    }

    /// Highest LSN on disk per the policy: synced for `Always` and `Batch`, written for `Off`.
    pub fn durable(&self) -> watch::Receiver<u64> {
        self.inner.durable.clone()
    }

    /// Declares that charges with an LSN up to `lsn` are in the user store, so compaction may
    /// drop them. Lowering it has no effect.
    pub fn set_watermark(&self, lsn: u64) {
        self.inner.shared.watermark.fetch_max(lsn, SeqCst);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> JournalStats {
        snapshot(&self.inner.shared, &self.inner.queue, &self.inner.durable)
    }

    /// Compacts now, covering everything queued so far, and waits for it. The compaction runs
    /// beside the writer thread, which goes on appending meanwhile.
    ///
    /// # Errors
    ///
    /// The compaction's error (the old file is then kept), or [`JournalError::Stopped`].
    pub fn compact_now(&self) -> Result<(), JournalError> {
        let (ack_tx, ack_rx) = mpsc::channel();
        if !self.inner.queue.compact(ack_tx) {
            return Err(JournalError::Stopped);
        }
        ack_rx.recv().unwrap_or(Err(JournalError::Stopped))
    }

    /// Writes and fsyncs everything queued, then stops the writer thread. Idempotent; later
    /// appends are dropped.
    ///
    /// # Errors
    ///
    /// The fatal error that stopped the writer (the first call reports it, later ones
    /// [`JournalError::Stopped`]).
    pub fn close(&self) -> Result<(), JournalError> {
        // Held across the join so that a concurrent close returns only once the thread ended.
        let mut thread = lock(&self.inner.thread);
        // The thread drains the queue, syncs, abandons a running compaction and exits.
        self.inner.queue.close();
        if let Some(handle) = thread.take() {
            let fatal = handle.join().unwrap_or_else(|_| {
                tracing::error!("journal writer thread panicked");
                Some(JournalError::Stopped)
            });
            if let Some(err) = fatal {
                return Err(err);
            }
        }
        if self.inner.shared.failed.load(SeqCst) {
            return Err(JournalError::Stopped);
        }
        Ok(())
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue.close();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = thread.take() {
            // The thread already reported a fatal error through `on_fatal`.
            let _ = handle.join();
        }
    }
}

/// The counters of `shared` as [`JournalStats`] (both backends keep the same ones).
pub(super) fn snapshot(s: &Shared, queue: &Queue, durable: &watch::Receiver<u64>) -> JournalStats {
    JournalStats {
        file_bytes: s.file_bytes.load(Relaxed),
        records: s.records.load(Relaxed),
        bytes_written: s.bytes_written.load(Relaxed),
        groups: s.groups.load(Relaxed),
        fsyncs: s.fsyncs.load(SeqCst),
        compactions: s.compactions.load(Relaxed),
        last_group_records: s.last_group_records.load(Relaxed),
        last_group_bytes: s.last_group_bytes.load(Relaxed),
        max_group_records: s.max_group_records.load(Relaxed),
        last_lsn: queue.last_lsn(),
        written_lsn: s.written_lsn.load(Relaxed),
        synced_lsn: s.synced_lsn.load(SeqCst),
        durable_lsn: *durable.borrow(),
        watermark: s.watermark.load(Relaxed),
        last_compaction_us: s.last_compaction_us.load(Relaxed),
        last_compaction_pause_us: s.last_compaction_pause_us.load(Relaxed),
        compactions_cancelled: s.compactions_cancelled.load(Relaxed),
        compacting: s.compacting.load(SeqCst),
        queued_bytes: s.queued_bytes.load(Relaxed),
        buffer_bytes: s.buffer_bytes.load(Relaxed),
        backpressure_waits: s.backpressure_waits.load(Relaxed),
        backpressure_us: s.backpressure_us.load(Relaxed),
        failed: s.failed.load(SeqCst),
        fsync_us: s.fsync_us.read(),
    }
}

/// Locks `m`; a panic elsewhere cannot leave these structures half-updated.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a `.compact` file a crash left behind: the rename never happened, so `journal.log`
/// is the whole truth and the leftover may be incomplete.
fn remove_stale_compaction(path: &Path) -> Result<(), JournalError> {
    let tmp = compact::tmp_path(path);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {
            tracing::warn!(path = %tmp.display(), "journal: removed an unfinished compaction");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(JournalError::io("remove", &tmp, e)),
    }
}

/// Creates (or refills an emptied) journal file with its meta record, durably.
fn start_file(path: &Path, next_package: u64, last_lsn: u64) -> Result<(), JournalError> {
    let mut buf = Vec::new();
    let meta = Entry::Meta {
        version: record::FORMAT_VERSION,
        next_package,
        last_lsn,
    };
    frame::put_with(&mut buf, 0, |b| record::encode_into(b, &meta)).expect("a small meta record");
    let mut file = crate::data_dir::private(&mut OpenOptions::new())
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| JournalError::io("create", path, e))?;
    file.write_all(&buf)
        .map_err(|e| JournalError::io("write", path, e))?;
    file.sync_all()
        .map_err(|e| JournalError::io("fsync", path, e))?;
    compact::sync_dir(path)
}
