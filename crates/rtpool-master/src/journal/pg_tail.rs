//! [`WarmState`]: a standby's copy of the journal's replay state, kept up to date by tailing
//! the table by `seq`, so that a takeover reads and applies only the rows written since the
//! last look ("warm core").
//!
//! Rows become visible in `seq` order (one writer commits its groups one after another, and
//! a new leader numbers after the highest row it replayed), so applying `seq > last` in order
//! gives what a full replay gives. A compaction is the exception: it replaces the rows up to
//! its cut and writes a new meta record at seq 0; each look reads the meta row and the tail in
//! one snapshot (repeatable read) and starts over from scratch when the meta row changed.

use std::time::Instant;

use postgres::{Client, IsolationLevel};

use super::pg_conn::{apply_rows, db};
use super::replay::State;
use super::{JournalError, Replay};

/// What the rows read so far replay to, and where the next look starts.
#[derive(Debug, Default)]
pub struct WarmState {
    state: State,
    /// Highest seq applied.
    last_seq: i64,
    /// The meta row (seq 0) as last read; `None`: none yet (never compacted).
    meta: Option<Vec<u8>>,
    /// Payload bytes of the rows applied.
    bytes: u64,
    /// Rows applied by the last look.
    pub last_rows: u64,
}

impl WarmState {
    /// Applies the rows added since the last look (all of them on the first look, or when a
    /// compaction rewrote the table since). Blocking: call it off the tokio runtime.
    ///
    /// # Errors
    ///
    /// [`JournalError::Database`] or [`JournalError::CorruptRow`]; the state is then as before
    /// the look when the read failed, and must be dropped when a row did not decode.
    pub fn catch_up(&mut self, client: &mut Client) -> Result<(), JournalError> {
        let mut txn = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(db("read"))?;
        let meta: Option<Vec<u8>> = txn
            .query_opt("SELECT record FROM rtpool_journal WHERE seq = 0", &[])
            .map_err(db("read"))?
            .map(|r| r.get(0));
        let from = if meta == self.meta { self.last_seq } else { -1 };
        let rows = txn
            .query(
                "SELECT seq, record FROM rtpool_journal WHERE seq > $1 ORDER BY seq",
                &[&from],
            )
            .map_err(db("read"))?;
        txn.commit().map_err(db("read"))?;
        if from < 0 {
            // Compacted since (or a first look at a compacted table): from scratch.
            *self = WarmState::default();
        }
        self.bytes += apply_rows(&mut self.state, &rows)?;
        self.last_rows = rows.len() as u64;
        if let Some(last) = rows.last() {
            self.last_seq = self.last_seq.max(last.get(0));
        }
        self.meta = meta;
        Ok(())
    }

    /// The replay a takeover starts from, with the payload bytes of the table's rows.
    pub(super) fn into_replay(self, started: Instant) -> (Replay, u64) {
        let mut replay = self.state.into_replay();
        replay.bytes = self.bytes;
        replay.elapsed = started.elapsed();
        (replay, self.bytes)
    }
}
