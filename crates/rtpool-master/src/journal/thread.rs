//! The journal's writer thread: group commit, the fsync policy, publishing the durable LSN,
//! triggering compaction and stopping on a fatal error. The [`super::Journal`] handle
//! (`writer.rs`) only assigns LSNs and queues [`Cmd`]s for it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::compact::{self, InstallError};
use super::frame;
use super::record::{self, Entry, Record};
use super::replay;
use super::{FatalHandler, FsyncPolicy, JournalConfig, JournalError};

/// Most bytes one group write carries; the rest of the queue goes in the next group.
const GROUP_MAX_BYTES: usize = 4 << 20;

/// What the handle sends the writer thread.
pub(super) enum Cmd {
    /// Write this record with this LSN.
    Append(u64, Record),
    /// Compact now and answer.
    Compact(mpsc::Sender<Result<(), JournalError>>),
}

/// Counters the thread updates and [`Journal::stats`] reads.
pub(super) struct Shared {
    /// Durations of the `fdatasync`s of `journal.log`, for the status snapshot and metrics.
    pub(super) fsync_us: crate::status::histogram::AtomicBuckets,
    pub(super) watermark: AtomicU64,
    pub(super) failed: AtomicBool,
    pub(super) dropped_warned: AtomicBool,
    pub(super) file_bytes: AtomicU64,
    pub(super) records: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) groups: AtomicU64,
    pub(super) fsyncs: AtomicU64,
    pub(super) compactions: AtomicU64,
    pub(super) last_group_records: AtomicU64,
    pub(super) last_group_bytes: AtomicU64,
    pub(super) max_group_records: AtomicU64,
    pub(super) written_lsn: AtomicU64,
    pub(super) synced_lsn: AtomicU64,
    pub(super) last_compaction_us: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            fsync_us: crate::status::histogram::AtomicBuckets::new(
                crate::status::histogram::FSYNC_BOUNDS_US,
            ),
            watermark: AtomicU64::default(),
            failed: AtomicBool::default(),
            dropped_warned: AtomicBool::default(),
            file_bytes: AtomicU64::default(),
            records: AtomicU64::default(),
            bytes_written: AtomicU64::default(),
            groups: AtomicU64::default(),
            fsyncs: AtomicU64::default(),
            compactions: AtomicU64::default(),
            last_group_records: AtomicU64::default(),
            last_group_bytes: AtomicU64::default(),
            max_group_records: AtomicU64::default(),
            written_lsn: AtomicU64::default(),
            synced_lsn: AtomicU64::default(),
            last_compaction_us: AtomicU64::default(),
        }
    }
}

fn log_skipped(err: &JournalError) {
    tracing::error!(error = %err, "journal compaction failed; keeping the old file");
}

/// A writer and the handle's ends of its queue, counters and durable LSN.
pub(super) type NewWriter = (Writer, mpsc::Sender<Cmd>, Arc<Shared>, watch::Receiver<u64>);

/// The writer thread's state.
pub(super) struct Writer {
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
    pub(super) fn new(cfg: &JournalConfig, last_lsn: u64) -> Result<NewWriter, JournalError> {
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
    pub(super) fn run(mut self) -> Option<JournalError> {
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
        let started = Instant::now();
        self.file
            .sync_data()
            .map_err(|e| JournalError::io("fsync", &self.path, e))?;
        self.last_sync = Instant::now();
        let took = self.last_sync.duration_since(started).as_micros();
        self.shared
            .fsync_us
            .record(took.min(u128::from(u64::MAX)) as u64);
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
