//! The journal's writer thread: group commit, the fsync policy, publishing the durable LSN,
//! starting and installing compactions (which run beside it, `background.rs`), and stopping
//! on a fatal error. The [`super::Journal`] handle (`writer.rs`) only assigns LSNs and queues
//! commands (`queue.rs`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::background::{self, Compactor, Outcome};
use super::compact::{self, InstallError};
use super::frame;
use super::queue::{Cmd, Queue, Taken};
use super::record::{self, Entry, Record};
use super::shared::Shared;
use super::{FatalHandler, FsyncPolicy, JournalConfig, JournalError};

/// Most bytes one group write carries; the rest of what was taken goes in the next write.
const GROUP_MAX_BYTES: usize = 4 << 20;

/// Most room the group buffer keeps between bursts. Small records (no-op results, about
/// 100 bytes each) never grow it past this, so it is reused; a burst of large ones (512 KiB
/// results) grows it to [`GROUP_MAX_BYTES`] and more, and that allocation is given back once
/// the burst is written rather than held for the master's life (issue 29: 4 MiB of a
/// master's resident size after its results were freed).
const GROUP_KEEP_BYTES: usize = 1 << 20;

/// How long a busy writer waits for more records before it asks to be woken: under load the
/// scheduler thread then appends without waking it (a system call and a context switch per
/// group, ~5 % of the scheduler's time in the `journal_ceiling` bench), at the cost of records
/// reaching the file up to this much later (not under `always`).
const LINGER: Duration = Duration::from_millis(1);

/// How often the writer looks whether a running compaction has finished while no record
/// comes.
const COMPACTION_POLL: Duration = Duration::from_millis(20);

fn log_skipped(err: &JournalError) {
    tracing::error!(error = %err, "journal compaction failed; keeping the old file");
}

/// A writer and the handle's ends of its counters and durable LSN.
pub(super) type NewWriter = (Writer, Arc<Shared>, watch::Receiver<u64>);

/// A compaction running beside the writer, and who waits for it.
struct Running {
    compactor: Compactor,
    started: Instant,
    /// Size of the file at the cut.
    cut: u64,
    /// `compact_now` callers to answer when it ends.
    acks: Vec<mpsc::Sender<Result<(), JournalError>>>,
}

/// The writer thread's state.
pub(super) struct Writer {
    path: PathBuf,
    policy: FsyncPolicy,
    compact_min_bytes: u64,
    compact_bytes_per_s: u64,
    on_fatal: FatalHandler,
    file: File,
    /// Size of `journal.log`.
    size: u64,
    /// Size right after the last compaction (0 at open: a file found over
    /// `compact_min_bytes` is compacted at once).
    base_size: u64,
    queue: Arc<Queue>,
    durable_tx: watch::Sender<u64>,
    shared: Arc<Shared>,
    written_lsn: u64,
    synced_lsn: u64,
    last_sync: Instant,
    /// The group being built; reused.
    buf: Vec<u8>,
    /// LSN of the last record in `buf`.
    group_lsn: u64,
    /// The compaction in progress, if any.
    compaction: Option<Running>,
    /// `compact_now` callers who asked while one was running: a new one starts after it.
    next_acks: Vec<mpsc::Sender<Result<(), JournalError>>>,
}

impl Writer {
    /// A writer appending to `cfg.path` after `last_lsn`, taking commands from `queue`, with
    /// the handle's ends of its counters and durable LSN.
    pub(super) fn new(
        cfg: &JournalConfig,
        last_lsn: u64,
        queue: Arc<Queue>,
    ) -> Result<NewWriter, JournalError> {
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
        let writer = Writer {
            path,
            policy: cfg.policy,
            compact_min_bytes: cfg.compact_min_bytes,
            compact_bytes_per_s: cfg.compact_bytes_per_s,
            on_fatal: cfg.on_fatal.clone(),
            file,
            size,
            base_size: 0,
            queue,
            durable_tx,
            shared: shared.clone(),
            written_lsn: last_lsn,
            synced_lsn: last_lsn,
            last_sync: Instant::now(),
            buf: Vec::new(),
            group_lsn: last_lsn,
            compaction: None,
            next_acks: Vec::new(),
        };
        Ok((writer, shared, durable))
    }

    /// The thread's body; returns the fatal error, if any, after calling `on_fatal` with it.
    pub(super) fn run(mut self) -> Option<JournalError> {
        let result = self.serve();
        // Closing or failed: a compaction still running is abandoned, the old file kept.
        if let Some(running) = self.compaction.take() {
            self.shared.compactions_cancelled.fetch_add(1, Relaxed);
            running.compactor.cancel(&self.path);
            self.shared.compacting.store(false, SeqCst);
            tracing::info!(
                path = %self.path.display(),
                "journal compaction abandoned: the journal is closing (the next start \
                 compacts it)"
            );
        }
        match result {
            Ok(()) => None,
            Err(err) => {
                self.shared.failed.store(true, SeqCst);
                // No append may wait for room that will never come.
                self.queue.close();
                // Logging is the handler's: the default one logs, then exits.
                (self.on_fatal)(&err);
                Some(err)
            }
        }
    }

    /// Serves commands until the handle closes; an `Err` is fatal.
    fn serve(&mut self) -> Result<(), JournalError> {
        let mut cmds = Vec::new();
        self.maybe_compact()?;
        // Whether the last take found work: then linger (not under `always`, where a package's
        // acknowledgement waits for its record).
        let mut busy = false;
        loop {
            let linger = (busy && self.policy != FsyncPolicy::Always).then_some(LINGER);
            let wait = self.wait_limit();
            match self.queue.take(&mut cmds, wait, linger, &self.shared) {
                Taken::Closed => break,
                Taken::Timeout => {
                    busy = false;
                    if self.written_lsn > self.synced_lsn && self.policy != FsyncPolicy::Off {
                        self.sync_per_policy()?;
                    }
                }
                Taken::Some => {
                    busy = true;
                    self.write_cmds(&mut cmds)?;
                }
            }
            self.maybe_compact()?;
        }
        // Closing: whatever the policy, everything written is synced.
        if self.written_lsn > self.synced_lsn || self.policy == FsyncPolicy::Off {
            self.sync()?;
        }
        Ok(())
    }

    /// How long to wait for commands: until a `Batch` window ends while records wait for
    /// their fsync, at most [`COMPACTION_POLL`] while a compaction runs, else for ever.
    fn wait_limit(&self) -> Option<Duration> {
        let window = match self.policy {
            FsyncPolicy::Batch { window } if self.written_lsn > self.synced_lsn => {
                Some((self.last_sync + window).saturating_duration_since(Instant::now()))
            }
            _ => None,
        };
        let poll = self.compaction.as_ref().map(|_| COMPACTION_POLL);
        match (window, poll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes the appends of `cmds` (draining it) in groups of at most [`GROUP_MAX_BYTES`],
    /// syncs per the policy, and starts the compactions asked for.
    fn write_cmds(&mut self, cmds: &mut Vec<Cmd>) -> Result<(), JournalError> {
        let mut records = 0u64;
        let mut wrote = false;
        for cmd in cmds.drain(..) {
            match cmd {
                Cmd::Append(lsn, rec) => {
                    self.encode(lsn, rec)?;
                    records += 1;
                    if self.buf.len() >= GROUP_MAX_BYTES {
                        self.write_group(records)?;
                        (records, wrote) = (0, true);
                    }
                }
                Cmd::Compact(ack) => self.next_acks.push(ack),
            }
        }
        if records > 0 {
            self.write_group(records)?;
            wrote = true;
        }
        if self.buf.capacity() > GROUP_KEEP_BYTES {
            self.buf = Vec::new();
        }
        let capacity = self.buf.capacity() as u64;
        self.shared.buffer_bytes.store(capacity, Relaxed);
        if wrote {
            self.sync_per_policy()?;
        }
        Ok(())
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
        s.file_bytes.store(self.size, SeqCst);
        s.records.fetch_add(records, Relaxed);
        s.bytes_written.fetch_add(bytes, Relaxed);
        s.groups.fetch_add(1, Relaxed);
        s.last_group_records.store(records, Relaxed);
        s.last_group_bytes.store(bytes, Relaxed);
        s.max_group_records.fetch_max(records, Relaxed);
        s.written_lsn.store(self.written_lsn, Relaxed);
        self.buf.clear();
        if self.buf.capacity() > 2 * GROUP_MAX_BYTES {
            // One huge record should not pin its buffer even for the rest of its batch.
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

    /// Installs a finished compaction; starts one when asked or when the file has doubled.
    fn maybe_compact(&mut self) -> Result<(), JournalError> {
        if self
            .compaction
            .as_ref()
            .is_some_and(|r| r.compactor.is_finished())
        {
            let running = self.compaction.take().expect("checked");
            self.finish_compaction(running)?;
        }
        if self.compaction.is_some() {
            return Ok(());
        }
        let due = self.size > self.compact_min_bytes.max(self.base_size.saturating_mul(2));
        if !due && self.next_acks.is_empty() {
            return Ok(());
        }
        // The cut: everything written so far is whole records.
        let watermark = self.shared.watermark.load(SeqCst);
        let acks = std::mem::take(&mut self.next_acks);
        let pace = self.compact_bytes_per_s;
        match Compactor::start(
            self.path.clone(),
            self.size,
            watermark,
            self.shared.clone(),
            pace,
        ) {
            Ok(compactor) => {
                self.shared.compacting.store(true, SeqCst);
                tracing::info!(
                    path = %self.path.display(),
                    size = self.size,
                    "journal compaction started (in the background)"
                );
                self.compaction = Some(Running {
                    compactor,
                    started: Instant::now(),
                    cut: self.size,
                    acks,
                });
            }
            Err(err) => {
                log_skipped(&err);
                self.base_size = self.size;
                for ack in acks {
                    let _ = ack.send(Err(JournalError::Stopped));
                }
            }
        }
        Ok(())
    }

    /// Installs what a compactor left: copies the records written since it last copied,
    /// fsyncs, renames it over the journal and goes on appending to it. Appends wait only for
    /// this last step. A failure before the rename keeps the old file (logged, answered to
    /// `compact_now` callers); one after it is fatal.
    fn finish_compaction(&mut self, running: Running) -> Result<(), JournalError> {
        self.shared.compacting.store(false, SeqCst);
        let outcome = match running.compactor.join() {
            Outcome::Done(done) => {
                let paused = Instant::now();
                match self.install(done)? {
                    Ok(()) => {
                        let pause = paused.elapsed();
                        self.log_compacted(running.started, running.cut, pause);
                        Ok(())
                    }
                    Err(err) => Err(err),
                }
            }
            Outcome::Cancelled => Err(JournalError::Stopped),
            Outcome::Failed(err) => Err(err),
        };
        if let Err(err) = &outcome {
            let _ = std::fs::remove_file(compact::tmp_path(&self.path));
            log_skipped(err);
            // Try again only once the file has doubled again.
            self.base_size = self.size;
        }
        let failed = outcome.is_err();
        let mut first_err = outcome.err();
        for ack in running.acks {
            // The error goes to the first caller; the others learn that it failed.
            let answer = match (failed, first_err.take()) {
                (false, _) => Ok(()),
                (true, Some(err)) => Err(err),
                (true, None) => Err(JournalError::Stopped),
            };
            let _ = ack.send(answer);
        }
        Ok(())
    }

    /// The writer's part of a compaction; the outer `Err` is fatal.
    fn install(
        &mut self,
        mut done: background::Done,
    ) -> Result<Result<(), JournalError>, JournalError> {
        let tmp = compact::tmp_path(&self.path);
        let copied = (|| {
            let mut input =
                File::open(&self.path).map_err(|e| JournalError::io("read", &self.path, e))?;
            let n = background::copy_range(
                &mut input,
                &self.path,
                &mut done.file,
                &tmp,
                done.copied_to,
                self.size,
            )?;
            done.file
                .sync_data()
                .map_err(|e| JournalError::io("fsync", &tmp, e))?;
            Ok(n)
        })();
        let copied = match copied {
            Ok(n) => n,
            Err(err) => return Ok(Err(err)),
        };
        match compact::install(&self.path) {
            Ok(()) => {}
            Err(InstallError::Rename(err)) => return Ok(Err(err)),
            Err(InstallError::DirSync(err)) => return Err(err),
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| JournalError::io("reopen", &self.path, e))?;
        let size = done.size + copied;
        self.size = size;
        self.base_size = size;
        // The compacted file was fsynced and holds the effect of every record written so far.
        self.synced_lsn = self.written_lsn;
        self.last_sync = Instant::now();
        let s = &self.shared;
        s.file_bytes.store(size, SeqCst);
        s.compactions.fetch_add(1, Relaxed);
        s.synced_lsn.store(self.synced_lsn, SeqCst);
        self.publish(self.synced_lsn);
        Ok(Ok(()))
    }

    fn log_compacted(&self, started: Instant, old_size: u64, pause: Duration) {
        let took = started.elapsed();
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.shared.last_compaction_us.store(us(took), Relaxed);
        self.shared
            .last_compaction_pause_us
            .store(us(pause), Relaxed);
        tracing::info!(
            path = %self.path.display(),
            old_size,
            new_size = self.size,
            took_ms = took.as_millis() as u64,
            appends_paused_ms = pause.as_millis() as u64,
            "journal compacted"
        );
    }
}
