//! The PostgreSQL journal's writer thread: group commit (everything queued since the last
//! commit goes in one transaction), fencing by the lease row, retries while the database is
//! unreachable, and compaction of the table.
//!
//! Group commit needs no timer here: while one transaction is in flight the scheduler keeps
//! appending, and the next take finds all of it, so under load the groups grow with the
//! database's round trip.

use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use postgres::{Client, Statement, Transaction};
use tokio::sync::watch;

use super::compact;
use super::pg_conn::{connect, read_state, PgJournalConfig};
use super::queue::{Cmd, Queue, Taken};
use super::record::{self, Entry};
use super::shared::Shared;
use super::JournalError;

/// Pause between attempts while the database is unreachable.
const RETRY: Duration = Duration::from_millis(100);

/// At most one "unreachable" warning per this interval.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// The insert of a group, one statement (one round trip, committed on its own): it takes the
/// lease row `FOR SHARE` (a takeover's `UPDATE` waits for it, it waits for a takeover) and
/// adds rows only while that row has this epoch (`$1`). `ON CONFLICT`: a retry after a commit
/// whose answer was lost adds nothing twice.
pub(super) const INSERT_SQL: &str = "WITH lease AS (
        SELECT epoch FROM rtpool_leader WHERE id = 1 AND epoch = $1 FOR SHARE
    )
    INSERT INTO rtpool_journal (seq, epoch, record)
    SELECT s, $1, r FROM unnest($2::int8[], $3::bytea[]) AS t(s, r), lease
    ON CONFLICT (seq) DO NOTHING";

/// The writer thread's state.
pub(super) struct PgWriter {
    /// The connection and its prepared insert; `None` after a failure, until the next
    /// connect.
    pub(super) client: Option<(Client, Statement)>,
    pub(super) cfg: PgJournalConfig,
    pub(super) queue: Arc<Queue>,
    pub(super) shared: Arc<Shared>,
    pub(super) durable_tx: watch::Sender<u64>,
    pub(super) unavailable: Arc<Mutex<Option<String>>>,
    pub(super) written_lsn: u64,
    /// Bytes of record payloads in the table.
    pub(super) table_bytes: u64,
    /// `table_bytes` right after the last compaction (0 at open: a table found over the
    /// threshold is compacted at once).
    pub(super) base_bytes: u64,
    /// `(lsn, payload)` taken but not committed yet.
    pub(super) pending: Vec<(i64, Vec<u8>)>,
    pub(super) last_warned: Option<Instant>,
}

/// Why a commit did not happen.
enum Failed {
    /// Another epoch leads: stop for good.
    Fenced(JournalError),
    /// The database could not be reached or failed: retry.
    Retry(JournalError),
}

impl PgWriter {
    /// Runs until the handle closes or the database refuses this epoch; returns the error
    /// that stopped it.
    pub(super) fn run(mut self) -> Option<JournalError> {
        let mut cmds = Vec::new();
        loop {
            match self.queue.take(&mut cmds, None, None, &self.shared) {
                Taken::Closed => break,
                Taken::Timeout => continue,
                Taken::Some => {}
            }
            let mut acks = Vec::new();
            for cmd in cmds.drain(..) {
                match cmd {
                    Cmd::Append(lsn, rec) => {
                        let payload = record::encode(&Entry::Record(rec));
                        self.pending.push((lsn as i64, payload));
                    }
                    Cmd::Compact(ack) => acks.push(ack),
                }
            }
            if let Err(err) = self.commit_retrying() {
                return Some(self.stop(err, acks));
            }
            let due = self.table_bytes > self.cfg.compact_min_bytes.max(2 * self.base_bytes);
            if due || !acks.is_empty() {
                if let Err(err) = self.compact_retrying(acks) {
                    return Some(self.stop(err, Vec::new()));
                }
            }
        }
        // Closed: what is left, once more (bounded by the retry deadline).
        match self.commit_retrying() {
            Ok(()) => None,
            Err(err) => Some(self.stop(err, Vec::new())),
        }
    }

    /// Stops for good: fenced (reported through `on_fenced`) or closed with the database
    /// unreachable. Nothing more is committed and `durable` never advances again.
    fn stop(
        &mut self,
        err: JournalError,
        acks: Vec<mpsc::Sender<Result<(), JournalError>>>,
    ) -> JournalError {
        self.shared.failed.store(true, SeqCst);
        self.queue.close();
        if matches!(err, JournalError::Fenced { .. }) {
            tracing::error!("{err}; this master no longer leads and stops acknowledging");
            (self.cfg.on_fenced)(&err);
        } else {
            tracing::error!(error = %err, "journal in PostgreSQL stopped with records uncommitted");
        }
        for ack in acks {
            let _ = ack.send(Err(JournalError::Stopped));
        }
        err
    }

    /// Commits `pending`, retrying while the database is unreachable; after the handle closed,
    /// for at most about one lease more.
    fn commit_retrying(&mut self) -> Result<(), JournalError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut closed_at: Option<Instant> = None;
        loop {
            match self.commit() {
                Ok(()) => return Ok(()),
                Err(Failed::Fenced(err)) => return Err(err),
                Err(Failed::Retry(err)) => {
                    self.client = None;
                    self.warn_unreachable(&err);
                    if self.queue.is_closed() {
                        let at = *closed_at.get_or_insert_with(Instant::now);
                        let lease = Duration::from_millis(self.cfg.lease_ms.into());
                        if at.elapsed() >= lease {
                            return Err(err);
                        }
                    }
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// One attempt at committing `pending` in one fenced transaction.
    fn commit(&mut self) -> Result<(), Failed> {
        let epoch = self.cfg.epoch;
        let seqs: Vec<i64> = self.pending.iter().map(|(s, _)| *s).collect();
        let pending = std::mem::take(&mut self.pending);
        let recs: Vec<&[u8]> = pending.iter().map(|(_, r)| r.as_slice()).collect();
        let done = self.commit_rows(epoch, &seqs, &recs);
        drop(recs);
        self.pending = pending;
        done?;
        // Reachable again before the commit is published: whoever sees the record durable
        // must not still see the database as unreachable.
        self.set_unavailable(None);
        self.note_commit();
        Ok(())
    }

    /// The fenced transaction of one group.
    fn commit_rows(&mut self, epoch: u64, seqs: &[i64], recs: &[&[u8]]) -> Result<(), Failed> {
        let (client, insert) = self.connection()?;
        let n = client
            .execute(insert, &[&(epoch as i64), &seqs, &recs])
            .map_err(retry("write"))?;
        if n == 0 {
            // Refused, or every row was there already (a retry): the lease row says which.
            let mut txn = client.transaction().map_err(retry("read the lease of"))?;
            check_epoch(&mut txn, epoch)?;
        }
        Ok(())
    }

    /// Counts the group in `pending` as committed, publishes its LSN and empties it.
    fn note_commit(&mut self) {
        let bytes: u64 = self.pending.iter().map(|(_, r)| r.len() as u64).sum();
        let last = self.pending.last().map_or(0, |(s, _)| *s as u64);
        let s = &self.shared;
        s.records.fetch_add(self.pending.len() as u64, Relaxed);
        s.bytes_written.fetch_add(bytes, Relaxed);
        s.groups.fetch_add(1, Relaxed);
        s.fsyncs.fetch_add(1, SeqCst);
        s.last_group_records
            .store(self.pending.len() as u64, Relaxed);
        s.last_group_bytes.store(bytes, Relaxed);
        s.max_group_records
            .fetch_max(self.pending.len() as u64, Relaxed);
        self.table_bytes += bytes;
        s.file_bytes.store(self.table_bytes, Relaxed);
        self.written_lsn = self.written_lsn.max(last);
        s.written_lsn.store(self.written_lsn, Relaxed);
        s.synced_lsn.store(self.written_lsn, SeqCst);
        self.durable_tx.send_replace(self.written_lsn);
        self.pending.clear();
    }

    /// Compacts, retrying while the database is unreachable; answers `acks`.
    fn compact_retrying(
        &mut self,
        acks: Vec<mpsc::Sender<Result<(), JournalError>>>,
    ) -> Result<(), JournalError> {
        loop {
            match self.compact() {
                Ok(()) => {
                    for ack in acks {
                        let _ = ack.send(Ok(()));
                    }
                    return Ok(());
                }
                Err(Failed::Fenced(err)) => {
                    for ack in acks {
                        let _ = ack.send(Err(JournalError::Stopped));
                    }
                    return Err(err);
                }
                Err(Failed::Retry(err)) => {
                    self.client = None;
                    self.warn_unreachable(&err);
                    if self.queue.is_closed() {
                        for ack in acks {
                            let _ = ack.send(Err(JournalError::Stopped));
                        }
                        return Ok(());
                    }
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// Rewrites the rows up to the last committed LSN as their compacted form (live packages,
    /// undelivered results, deliveries, charges above the watermark, a meta record at seq 0),
    /// in one fenced transaction: deleted and inserted together or not at all.
    fn compact(&mut self) -> Result<(), Failed> {
        let started = Instant::now();
        let epoch = self.cfg.epoch;
        let cut = self.written_lsn as i64;
        let watermark = self.shared.watermark.load(SeqCst);
        let client = self.client()?;
        let mut txn = client
            .transaction()
            .map_err(retry("begin a compaction of"))?;
        check_epoch(&mut txn, epoch)?;
        let (state, _) = read_state(&mut txn, cut, watermark).map_err(Failed::Retry)?;
        let mut rows: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut put = |lsn: u64, entry: &Entry| -> Result<bool, JournalError> {
            rows.push((lsn as i64, record::encode(entry)));
            Ok(true)
        };
        compact::entries(&state, watermark, &mut put).map_err(Failed::Retry)?;
        txn.execute(
            "DELETE FROM rtpool_journal WHERE seq <= $2 AND EXISTS \
             (SELECT 1 FROM rtpool_leader WHERE id = 1 AND epoch = $1)",
            &[&(epoch as i64), &cut],
        )
        .map_err(retry("compact"))?;
        let seqs: Vec<i64> = rows.iter().map(|(s, _)| *s).collect();
        let recs: Vec<&[u8]> = rows.iter().map(|(_, r)| r.as_slice()).collect();
        txn.execute(INSERT_SQL, &[&(epoch as i64), &seqs, &recs])
            .map_err(retry("compact"))?;
        txn.commit().map_err(retry("commit a compaction of"))?;
        let before = self.table_bytes;
        self.table_bytes = rows.iter().map(|(_, r)| r.len() as u64).sum();
        self.base_bytes = self.table_bytes;
        let s = &self.shared;
        s.file_bytes.store(self.table_bytes, Relaxed);
        s.compactions.fetch_add(1, Relaxed);
        let us = started.elapsed().as_micros() as u64;
        s.last_compaction_us.store(us, Relaxed);
        s.last_compaction_pause_us.store(us, Relaxed);
        tracing::info!(
            "journal in PostgreSQL compacted: {before} -> {} bytes of records ({} rows) in {:.1} ms",
            self.table_bytes,
            rows.len(),
            us as f64 / 1e3
        );
        Ok(())
    }

    /// The connection, made again after a failure.
    fn client(&mut self) -> Result<&mut Client, Failed> {
        Ok(self.connection()?.0)
    }

    /// The connection and its prepared insert, both made again after a failure.
    fn connection(&mut self) -> Result<(&mut Client, &Statement), Failed> {
        if self.client.is_none() {
            let mut client =
                connect(&self.cfg.url, self.cfg.lease_ms).map_err(retry("connect to"))?;
            let insert = client
                .prepare(INSERT_SQL)
                .map_err(retry("prepare a write to"))?;
            self.client = Some((client, insert));
        }
        let (client, insert) = self.client.as_mut().expect("connected just now");
        Ok((client, &*insert))
    }

    fn set_unavailable(&self, why: Option<String>) {
        *self
            .unavailable
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = why;
    }

    /// Logs at most once a second that the database is unreachable, and says so to the
    /// scheduler (which refuses new packages meanwhile).
    fn warn_unreachable(&mut self, err: &JournalError) {
        self.set_unavailable(Some(format!(
            "the master's journal database is unreachable ({err}); nothing new can be \
             acknowledged until it is back or another master takes over: retry shortly"
        )));
        if self.last_warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.last_warned = Some(Instant::now());
            tracing::warn!(error = %err, "journal database unreachable; retrying");
        }
    }
}

/// Takes the lease row `FOR SHARE` (a takeover waits for this transaction, and this one for a
/// takeover) and checks that it still has `epoch`.
fn check_epoch(txn: &mut Transaction<'_>, epoch: u64) -> Result<(), Failed> {
    let row = txn
        .query_opt(
            "SELECT epoch FROM rtpool_leader WHERE id = 1 FOR SHARE",
            &[],
        )
        .map_err(retry("read the lease of"))?;
    let leader = row.map_or(0, |r| r.get::<_, i64>(0) as u64);
    if leader != epoch {
        return Err(Failed::Fenced(JournalError::Fenced {
            mine: epoch,
            leader,
        }));
    }
    Ok(())
}

/// Maps a client error to a retry of `op`.
fn retry(op: &'static str) -> impl Fn(postgres::Error) -> Failed {
    move |e| {
        Failed::Retry(JournalError::Database {
            op,
            detail: super::pg_detail(&e),
        })
    }
}
