//! [`PgJournal`]: the journal as rows of a PostgreSQL table, for masters in high-availability
//! mode (`--ha`, docs/ha.md).
//!
//! A row is one record: `rtpool_journal(seq, epoch, record)`, `seq` its LSN, `record` the SAME
//! msgpack payload the file journal frames (`record.rs`; no second format), `epoch` the lease
//! epoch of the master that wrote it. Opening replays the table in `seq` order through the
//! file journal's replay state (`replay.rs`), so both backends rebuild the same packages.
//!
//! Writes are fenced by the database: the writer thread (`pg_writer.rs`) commits each group
//! in one transaction that first takes the lease row `FOR SHARE` (a takeover's `UPDATE` of
//! that row waits for it, and it waits for a takeover) and inserts only `WHERE EXISTS` a lease
//! row with its epoch. A master whose epoch is gone can therefore never add a row; its writer
//! reports [`JournalError::Fenced`] once through [`PgJournalConfig::on_fenced`] and stops.
//! The lease row itself is `crate::ha`'s; this module only reads its `epoch`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use super::pg_conn::db;
pub use super::pg_conn::{connect, FenceHandler, PgJournalConfig};
use super::pg_tail::WarmState;
use super::pg_writer::PgWriter;
use super::queue::Queue;
use super::shared::Shared;
use super::writer::snapshot;
use super::{JournalError, JournalStats, Record, Replay};

/// The journal table. `seq` is the record's LSN (0: the meta record a compaction writes).
pub const JOURNAL_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS rtpool_journal (
    seq BIGINT PRIMARY KEY,
    epoch BIGINT NOT NULL,
    record BYTEA NOT NULL
)";

/// The lease table (`crate::ha::lease` takes and renews it; the journal reads its epoch) and
/// its one row (epoch 0, expired: the first master to look takes it).
pub const LEASE_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS rtpool_leader (
    id INT PRIMARY KEY,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    advertise TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    renewed_at TIMESTAMPTZ NOT NULL
);
INSERT INTO rtpool_leader VALUES (1, 0, '', '', '-infinity', '-infinity') ON CONFLICT (id) DO NOTHING";

/// A cheap, cloneable handle to the PostgreSQL journal; all clones share one writer thread.
#[derive(Clone)]
pub struct PgJournal {
    inner: Arc<Inner>,
}

struct Inner {
    /// `postgres://host:port/db#rtpool_journal`, for log lines (no password).
    path: PathBuf,
    queue: Arc<Queue>,
    thread: Mutex<Option<JoinHandle<Option<JournalError>>>>,
    shared: Arc<Shared>,
    durable: watch::Receiver<u64>,
    /// Why the last commit failed while the writer retries (database unreachable).
    unavailable: Arc<Mutex<Option<String>>>,
}

impl PgJournal {
    /// Connects, creates the table if needed, replays it in `seq` order and starts the writer
    /// thread appending after the highest LSN. Blocking: call it off the tokio runtime.
    ///
    /// # Errors
    ///
    /// [`JournalError::Database`] when the database cannot be reached or read,
    /// [`JournalError::CorruptRow`] for a row that does not decode.
    pub fn open(cfg: PgJournalConfig) -> Result<(PgJournal, Replay), JournalError> {
        PgJournal::open_warm(cfg, WarmState::default())
    }

    /// As [`PgJournal::open`], reading only the rows `warm` has not applied yet (a standby's
    /// tailed copy, see [`WarmState`]). Call it once this master holds the lease: then every
    /// row of the epochs before is visible.
    ///
    /// # Errors
    ///
    /// As [`PgJournal::open`].
    pub fn open_warm(
        cfg: PgJournalConfig,
        mut warm: WarmState,
    ) -> Result<(PgJournal, Replay), JournalError> {
        let started = Instant::now();
        let mut client = connect(&cfg.url, cfg.lease_ms).map_err(db("connect to"))?;
        client
            .batch_execute(JOURNAL_TABLE_SQL)
            .map_err(db("create the table of"))?;
        warm.catch_up(&mut client)?;
        let tail = warm.last_rows;
        let (replay, bytes) = warm.into_replay(started);
        tracing::info!(
            "journal in PostgreSQL: {tail} rows read at open, {} records replayed in all",
            replay.records
        );
        let queue = Arc::new(Queue::new(replay.last_lsn + 1));
        let shared = Arc::new(Shared::default());
        shared.file_bytes.store(bytes, Relaxed);
        shared.written_lsn.store(replay.last_lsn, Relaxed);
        shared.synced_lsn.store(replay.last_lsn, Relaxed);
        let (durable_tx, durable) = watch::channel(replay.last_lsn);
        let unavailable = Arc::new(Mutex::new(None));
        let path = PathBuf::from(format!(
            "{}#rtpool_journal",
            crate::store::redact_url(&cfg.url)
        ));
        drop(client); // the writer connects, and prepares its insert, on its own
        let writer = PgWriter {
            client: None,
            cfg,
            queue: queue.clone(),
            shared: shared.clone(),
            durable_tx,
            unavailable: unavailable.clone(),
            written_lsn: replay.last_lsn,
            table_bytes: bytes,
            base_bytes: 0,
            pending: Vec::new(),
            last_warned: None,
        };
        let thread = std::thread::Builder::new()
            .name("rtpool-journal-pg".into())
            .spawn(move || writer.run())
            .map_err(|e| JournalError::io("start writer thread for", &path, e))?;
        let inner = Inner {
            path,
            queue,
            thread: Mutex::new(Some(thread)),
            shared,
            durable,
            unavailable,
        };
        let journal = PgJournal {
            inner: Arc::new(inner),
        };
        Ok((journal, replay))
    }

    /// Queues `rec` for the writer thread and returns its LSN; never waits for the database
    /// (only for room while 16 MiB of records wait, as the file journal).
    pub fn append(&self, rec: Record) -> u64 {
        let (lsn, sent) = self.inner.queue.append(rec, &self.inner.shared);
        if !sent && !self.inner.shared.dropped_warned.swap(true, Relaxed) {
            tracing::error!(
                lsn,
                "journal in PostgreSQL is closed or fenced; records are no longer written"
            );
        }
        lsn
    }

    /// Highest LSN committed.
    pub fn durable(&self) -> watch::Receiver<u64> {
        self.inner.durable.clone()
    }

    /// Why records cannot be committed now, while the writer retries (`None`: they can).
    pub fn unavailable(&self) -> Option<String> {
        self.inner
            .unavailable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Charges up to `lsn` are in the user store: compaction may drop them.
    pub fn set_watermark(&self, lsn: u64) {
        self.inner.shared.watermark.fetch_max(lsn, SeqCst);
    }

    /// A snapshot of the counters (`file_bytes`: bytes of record payloads in the table;
    /// `fsyncs` and `groups`: commits).
    pub fn stats(&self) -> JournalStats {
        snapshot(&self.inner.shared, &self.inner.queue, &self.inner.durable)
    }

    /// Compacts the table now (after what is queued) and waits for it.
    ///
    /// # Errors
    ///
    /// The compaction's error, or [`JournalError::Stopped`].
    pub fn compact_now(&self) -> Result<(), JournalError> {
        let (ack_tx, ack_rx) = mpsc::channel();
        if !self.inner.queue.compact(ack_tx) {
            return Err(JournalError::Stopped);
        }
        ack_rx.recv().unwrap_or(Err(JournalError::Stopped))
    }

    /// Commits what is queued (for at most about a lease while the database is unreachable),
    /// then stops the writer thread. Idempotent.
    ///
    /// # Errors
    ///
    /// The error that stopped the writer ([`JournalError::Fenced`] when another master leads).
    pub fn close(&self) -> Result<(), JournalError> {
        let mut thread = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.queue.close();
        if let Some(handle) = thread.take() {
            let fatal = handle.join().unwrap_or(Some(JournalError::Stopped));
            if let Some(err) = fatal {
                return Err(err);
            }
        }
        if self.inner.shared.failed.load(SeqCst) {
            return Err(JournalError::Stopped);
        }
        Ok(())
    }

    /// The database and table, for log lines.
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
            let _ = handle.join();
        }
    }
}
