//! [`Journal`]: the one handle the scheduler holds, over either backend: the file in the data
//! dir ([`FileJournal`], the default) or a table in PostgreSQL ([`PgJournal`], `--ha`).
//!
//! Both take the same [`Record`]s, number them with increasing LSNs at once, and report the
//! highest durable LSN through a `watch`; the scheduler holds acknowledgements and results
//! back until their LSN is durable, whichever backend it is. Dispatch is one `match` per call.

use std::path::Path;

use tokio::sync::watch;

use super::pg::PgJournal;
use super::writer::FileJournal;
use super::{JournalConfig, JournalError, JournalStats, Record, Replay};

/// A cheap, cloneable handle to the journal; all clones share one writer thread.
#[derive(Clone)]
pub struct Journal {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    File(FileJournal),
    Pg(PgJournal),
}

impl From<PgJournal> for Journal {
    fn from(pg: PgJournal) -> Self {
        Journal {
            backend: Backend::Pg(pg),
        }
    }
}

impl Journal {
    /// Opens the file journal at `cfg.path` (see [`FileJournal::open`]).
    ///
    /// # Errors
    ///
    /// As [`FileJournal::open`].
    pub fn open(cfg: JournalConfig) -> Result<(Journal, Replay), JournalError> {
        let (file, replay) = FileJournal::open(cfg)?;
        let journal = Journal {
            backend: Backend::File(file),
        };
        Ok((journal, replay))
    }

    /// Queues `rec` and returns its LSN; never waits for I/O (see [`FileJournal::append`]).
    #[inline]
    pub fn append(&self, rec: Record) -> u64 {
        match &self.backend {
            Backend::File(j) => j.append(rec),
            Backend::Pg(j) => j.append(rec),
        }
    }

    /// Highest durable LSN: on disk per the fsync policy, or committed in PostgreSQL.
    pub fn durable(&self) -> watch::Receiver<u64> {
        match &self.backend {
            Backend::File(j) => j.durable(),
            Backend::Pg(j) => j.durable(),
        }
    }

    /// Whether a package may be acknowledged only once its record is durable whatever the
    /// fsync policy (PostgreSQL: an acknowledgement is a committed row).
    #[inline]
    pub fn is_commit_acked(&self) -> bool {
        matches!(self.backend, Backend::Pg(_))
    }

    /// `Some(reason)` while the journal cannot make records durable but may again (its
    /// database unreachable): new packages are refused with it rather than left unanswered.
    #[inline]
    pub fn unavailable(&self) -> Option<String> {
        match &self.backend {
            Backend::File(_) => None,
            Backend::Pg(j) => j.unavailable(),
        }
    }

    /// Declares that charges up to `lsn` are in the user store (compaction may drop them).
    pub fn set_watermark(&self, lsn: u64) {
        match &self.backend {
            Backend::File(j) => j.set_watermark(lsn),
            Backend::Pg(j) => j.set_watermark(lsn),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> JournalStats {
        match &self.backend {
            Backend::File(j) => j.stats(),
            Backend::Pg(j) => j.stats(),
        }
    }

    /// Compacts now and waits for it.
    ///
    /// # Errors
    ///
    /// The compaction's error, or [`JournalError::Stopped`].
    pub fn compact_now(&self) -> Result<(), JournalError> {
        match &self.backend {
            Backend::File(j) => j.compact_now(),
            Backend::Pg(j) => j.compact_now(),
        }
    }

    /// Writes everything queued, then stops the writer thread. Idempotent.
    ///
    /// # Errors
    ///
    /// The fatal error that stopped the writer.
    pub fn close(&self) -> Result<(), JournalError> {
        match &self.backend {
            Backend::File(j) => j.close(),
            Backend::Pg(j) => j.close(),
        }
    }

    /// The journal file, or for PostgreSQL a path naming its table and database (password
    /// left out), for log lines.
    pub fn path(&self) -> &Path {
        match &self.backend {
            Backend::File(j) => j.path(),
            Backend::Pg(j) => j.path(),
        }
    }
}
