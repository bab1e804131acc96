//! The [`Journal`] handle and its writer thread.
//!
//! This module owns LSN assignment, group commit, the fsync policy, publishing the durable LSN,
//! triggering compaction and stopping on a fatal error. Callers never wait for I/O:
//! [`Journal::append`] only assigns an LSN and queues the record on an unbounded channel; the
//! thread writes whatever has queued with one `write`, then syncs as the policy says.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use super::compact::{self, InstallError};
use super::frame;
use super::record::{self, Entry, Record};
use super::replay;
use super::{FatalHandler, FsyncPolicy, JournalConfig, JournalError, Replay};

/// Most bytes one group write carries; the rest of the queue goes in the next group.
const GROUP_MAX_BYTES: usize = 4 << 20;

/// What the handle sends the writer thread.
enum Cmd {
    /// Write this record with this LSN.
    Append(u64, Record),
    /// Compact now and answer.
    Compact(mpsc::Sender<Result<(), JournalError>>),
}

/// A cheap, cloneable handle to the journal; all clones share one file and writer thread.
///
/// Dropping the last clone closes the journal as [`Journal::close`] does.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The next LSN and the sender, under one lock so that LSNs reach the thread in order.
    queue: Mutex<Queue>,
    /// The writer thread until [`Journal::close`] joins it.
    thread: Mutex<Option<JoinHandle<Option<JournalError>>>>,
    shared: Arc<Shared>,
    durable: watch::Receiver<u64>,
}

struct Queue {
    next_lsn: u64,
    /// `None` once closed.
    tx: Option<mpsc::Sender<Cmd>>,
}

/// Counters the thread updates and [`Journal::stats`] reads.
#[derive(Default)]
struct Shared {
    watermark: AtomicU64,
    failed: AtomicBool,
    dropped_warned: AtomicBool,
    file_bytes: AtomicU64,
    records: AtomicU64,
    bytes_written: AtomicU64,
    groups: AtomicU64,
    fsyncs: AtomicU64,
    compactions: AtomicU64,
    last_group_records: AtomicU64,
    last_group_bytes: AtomicU64,
    max_group_records: AtomicU64,
    written_lsn: AtomicU64,
    synced_lsn: AtomicU64,
    last_compaction_us: AtomicU64,
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
    /// How long the last compaction took, in microseconds.
    pub last_compaction_us: u64,
    /// Whether the writer stopped after a fatal error.
    pub failed: bool,
}

impl Journal {
    /// Replays the journal at `cfg.path` (a missing file is an empty journal, a torn last
    /// record is cut off), then starts the writer thread appending after it. A file of an
    /// older format version ([`super::MIN_FORMAT_VERSION`] or later) is rewritten in the
    /// current one first.
    ///
    /// # Errors
    ///
    /// [`JournalError::Corrupt`] when a damaged record has valid ones after it;
    /// [`JournalError::Io`] when the file or its directory cannot be read or written.
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Replay), JournalError> {
        let started = Instant::now();
        let path = cfg.path.clone();
        remove_stale_compaction(&path)?;
        let mut replay = replay::recover(&path)?;
        replay.elapsed = started.elapsed();
        if replay.bytes == 0 {
            start_file(&path, replay.next_package, replay.last_lsn)?;
        }
        let (writer, tx, shared, durable) = Writer::new(&cfg, replay.last_lsn)?;
        let thread = std::thread::Builder::new()
            .name("rtpool-journal".into())
            .spawn(move || writer.run())
            .map_err(|e| JournalError::io("start writer thread for", &path, e))?;
        let inner = Inner {
            path,
            queue: Mutex::new(Queue {
                next_lsn: replay.last_lsn + 1,
                tx: Some(tx),
            }),
            thread: Mutex::new(Some(thread)),
            shared,
            durable,
        };
        let journal = Journal {
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

    /// Queues `rec` for the writer thread and returns its LSN. Never waits for I/O.
    ///
    /// After [`Journal::close`] or a fatal error the record is dropped (logged once): its LSN
    /// is still returned but [`Journal::durable`] never reaches it.
    pub fn append(&self, rec: Record) -> u64 {
        let mut q = lock(&self.inner.queue);
        let lsn = q.next_lsn;
        q.next_lsn += 1;
        let sent = match &q.tx {
            Some(tx) => tx.send(Cmd::Append(lsn, rec)).is_ok(),
            None => false,
        };
        drop(q);
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
        let s = &self.inner.shared;
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
            last_lsn: lock(&self.inner.queue).next_lsn - 1,
            written_lsn: s.written_lsn.load(Relaxed),
            synced_lsn: s.synced_lsn.load(SeqCst),
            durable_lsn: *self.inner.durable.borrow(),
            watermark: s.watermark.load(Relaxed),
            last_compaction_us: s.last_compaction_us.load(Relaxed),
            failed: s.failed.load(SeqCst),
        }
    }

    /// Compacts now, after everything queued so far is written, and waits for it.
    ///
    /// # Errors
    ///
    /// The compaction's error (the old file is then kept), or [`JournalError::Stopped`].
    pub fn compact_now(&self) -> Result<(), JournalError> {
        let (ack_tx, ack_rx) = mpsc::channel();
        let sent = match &lock(&self.inner.queue).tx {
            Some(tx) => tx.send(Cmd::Compact(ack_tx)).is_ok(),
            None => false,
        };
        if !sent {
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
        // Dropping the only sender makes the thread drain the queue, sync and exit.
        drop(lock(&self.inner.queue).tx.take());
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
        drop(
            self.queue
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .tx
                .take(),
        );
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
    let mut file = OpenOptions::new()
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

fn log_skipped(err: &JournalError) {
    tracing::error!(error = %err, "journal compaction failed; keeping the old file");
}

/// A writer and the handle's ends of its queue, counters and durable LSN.
type NewWriter = (Writer, mpsc::Sender<Cmd>, Arc<Shared>, watch::Receiver<u64>);

/// The writer thread's state.
struct Writer {
    path: PathBuf,
    policy: FsyncPolicy,
    compact_min_bytes: u64,
    on_fatal: FatalHandler,
    file: File,
    /// Size of `journal.log`.
    size: u64,
    /// Size right after the last compaction (or at open).
    base_size: u64,
    rx: mpsc::Receiver<Cmd>,
    durable_tx: watch::Sender<u64>,
    shared: Arc<Shared>,
    written_lsn: u64,
    synced_lsn: u64,
    last_sync: Instant,
    /// The group being built; reused.
    buf: Vec<u8>,
    /// LSN of the last record in `buf`.
    group_lsn: u64,
}

impl Writer {
    /// A writer appending to `cfg.path` after `last_lsn`, with the handle's ends of its
    /// channels and counters.
    fn new(cfg: &JournalConfig, last_lsn: u64) -> Result<NewWriter, JournalError> {
        let path = cfg.path.clone();
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| JournalError::io("open", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| JournalError::io("stat", &path, e))?
            .len();
        let shared = Arc::new(Shared::default());
        shared.file_bytes.store(size, Relaxed);
        shared.written_lsn.store(last_lsn, Relaxed);
        shared.synced_lsn.store(last_lsn, Relaxed);
        let (durable_tx, durable) = watch::channel(last_lsn);
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            path,
            policy: cfg.policy,
            compact_min_bytes: cfg.compact_min_bytes,
            on_fatal: cfg.on_fatal.clone(),
            file,
            size,
            base_size: size,
            rx,
            durable_tx,
            shared: shared.clone(),
            written_lsn: last_lsn,
            synced_lsn: last_lsn,
            last_sync: Instant::now(),
            buf: Vec::new(),
            group_lsn: last_lsn,
        };
        Ok((writer, tx, shared, durable))
    }

    /// The thread's body; returns the fatal error, if any, after calling `on_fatal` with it.
    fn run(mut self) -> Option<JournalError> {
        match self.serve() {
            Ok(()) => None,
            Err(err) => {
                self.shared.failed.store(true, SeqCst);
                // Logging is the handler's: the default one logs, then exits.
                (self.on_fatal)(&err);
                Some(err)
            }
        }
    }

    /// Serves commands until the handle closes; an `Err` is fatal.
    fn serve(&mut self) -> Result<(), JournalError> {
        // Ends when the last sender is dropped (close) or on a fatal error.
        while let Some(first) = self.next_cmd()? {
            let mut compact_ack = None;
            let mut records = 0u64;
            let mut next = Some(first);
            // Bounded by GROUP_MAX_BYTES and by what is already queued.
            while let Some(cmd) = next {
                match cmd {
                    Cmd::Append(lsn, rec) => {
                        self.encode(lsn, rec)?;
                        records += 1;
                    }
                    Cmd::Compact(ack) => {
                        compact_ack = Some(ack);
                        break;
                    }
                }
                if self.buf.len() >= GROUP_MAX_BYTES {
                    break;
                }
                next = self.rx.try_recv().ok();
            }
            if records > 0 {
                self.write_group(records)?;
                self.sync_per_policy()?;
            }
            if let Some(ack) = compact_ack {
                // On a fatal error `ack` is dropped and `compact_now` reports `Stopped`.
                let outcome = self.compact()?;
                if let Err(err) = &outcome {
                    log_skipped(err);
                }
                let _ = ack.send(outcome);
            } else if self.size > self.compact_min_bytes.max(self.base_size.saturating_mul(2)) {
                if let Err(err) = self.compact()? {
                    log_skipped(&err);
                    // Try again only once the file has doubled again.
                    self.base_size = self.size;
                }
            }
        }
        // Closing: whatever the policy, everything written is synced.
        if self.written_lsn > self.synced_lsn || self.policy == FsyncPolicy::Off {
            self.sync()?;
        }
        Ok(())
    }

    /// The next command, syncing a `Batch` group when its window ends while idle; `None` once
    /// the handle closed and the queue is empty.
    fn next_cmd(&mut self) -> Result<Option<Cmd>, JournalError> {
        // At most two rounds: a timeout syncs, after which nothing is pending and we block.
        for _ in 0..2 {
            let window = match self.policy {
                FsyncPolicy::Batch { window } if self.written_lsn > self.synced_lsn => window,
                _ => return Ok(self.rx.recv().ok()),
            };
            let wait = (self.last_sync + window).saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(cmd) => return Ok(Some(cmd)),
                Err(RecvTimeoutError::Timeout) => self.sync()?,
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
        Ok(self.rx.recv().ok())
    }

    /// Frames `rec` into the group buffer.
    fn encode(&mut self, lsn: u64, rec: Record) -> Result<(), JournalError> {
        let entry = Entry::Record(rec);
        frame::put_with(&mut self.buf, lsn, |b| record::encode_into(b, &entry))
            .map_err(|bytes| JournalError::RecordTooLarge { lsn, bytes })?;
        self.group_lsn = lsn;
        Ok(())
    }

    /// Writes the group buffer with one `write` call.
    fn write_group(&mut self, records: u64) -> Result<(), JournalError> {
        self.file
            .write_all(&self.buf)
            .map_err(|e| JournalError::io("write", &self.path, e))?;
        let bytes = self.buf.len() as u64;
        self.size += bytes;
        self.written_lsn = self.group_lsn;
        let s = &self.shared;
        s.file_bytes.store(self.size, Relaxed);
        s.records.fetch_add(records, Relaxed);
        s.bytes_written.fetch_add(bytes, Relaxed);
        s.groups.fetch_add(1, Relaxed);
        s.last_group_records.store(records, Relaxed);
        s.last_group_bytes.store(bytes, Relaxed);
        s.max_group_records.fetch_max(records, Relaxed);
        s.written_lsn.store(self.written_lsn, Relaxed);
        self.buf.clear();
        if self.buf.capacity() > 2 * GROUP_MAX_BYTES {
            // One huge record should not pin its buffer for the life of the master.
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Syncs or publishes after a group write, as the policy says.
    fn sync_per_policy(&mut self) -> Result<(), JournalError> {
        match self.policy {
            FsyncPolicy::Always => self.sync(),
            FsyncPolicy::Batch { window } if self.last_sync.elapsed() >= window => self.sync(),
            // Otherwise `next_cmd` syncs when the window ends, unless more records come first.
            FsyncPolicy::Batch { .. } => Ok(()),
            FsyncPolicy::Off => {
                self.publish(self.written_lsn);
                Ok(())
            }
        }
    }

    /// `fdatasync`s the file, then publishes the written LSN as durable. A failure is fatal
    /// and never retried: after a failed fsync the kernel may have dropped the dirty pages, so a
    /// second fsync succeeding would prove nothing.
    fn sync(&mut self) -> Result<(), JournalError> {
        self.file
            .sync_data()
            .map_err(|e| JournalError::io("fsync", &self.path, e))?;
        self.last_sync = Instant::now();
        self.synced_lsn = self.written_lsn;
        self.shared.fsyncs.fetch_add(1, SeqCst);
        self.shared.synced_lsn.store(self.synced_lsn, SeqCst);
        self.publish(self.synced_lsn);
        Ok(())
    }

    fn publish(&self, lsn: u64) {
        self.durable_tx.send_if_modified(|durable| {
            let newer = lsn > *durable;
            if newer {
                *durable = lsn;
            }
            newer
        });
    }

    /// Compacts, turning a fatal failure into the outer `Err` and any other into the inner one
    /// (the old file is then kept and appends go on).
    fn compact(&mut self) -> Result<Result<(), JournalError>, JournalError> {
        let started = Instant::now();
        let tmp = compact::tmp_path(&self.path);
        let size = match self.write_compacted() {
            Ok(size) => size,
            Err(err) => {
                let _ = std::fs::remove_file(&tmp);
                return Ok(Err(err));
            }
        };
        match compact::install(&self.path) {
            Ok(()) => {}
            Err(InstallError::Rename(err)) => {
                let _ = std::fs::remove_file(&tmp);
                return Ok(Err(err));
            }
            Err(InstallError::DirSync(err)) => return Err(err),
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| JournalError::io("reopen", &self.path, e))?;
        let old_size = self.size;
        self.size = size;
        self.base_size = size;
        // The compacted file was fsynced and holds the effect of every record written so far.
        self.synced_lsn = self.written_lsn;
        self.last_sync = Instant::now();
        let s = &self.shared;
        s.file_bytes.store(size, Relaxed);
        s.compactions.fetch_add(1, Relaxed);
        s.synced_lsn.store(self.synced_lsn, SeqCst);
        let took = started.elapsed();
        s.last_compaction_us
            .store(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
        self.publish(self.synced_lsn);
        tracing::info!(
            path = %self.path.display(),
            old_size,
            new_size = size,
            took_ms = took.as_millis() as u64,
            "journal compacted"
        );
        Ok(Ok(()))
    }

    /// Reads the journal back and writes its compacted form next to it.
    fn write_compacted(&self) -> Result<u64, JournalError> {
        let buf = std::fs::read(&self.path).map_err(|e| JournalError::io("read", &self.path, e))?;
        let scan = replay::scan(&buf, &self.path)?;
        if let Some((offset, reason)) = scan.torn {
            // Every byte of this file was written by this thread: a bad record is damage.
            return Err(JournalError::Corrupt {
                path: self.path.clone(),
                offset: offset as u64,
                reason,
            });
        }
        drop(buf);
        let watermark = self.shared.watermark.load(SeqCst);
        compact::write(&self.path, &scan.state, watermark)
    }
}
