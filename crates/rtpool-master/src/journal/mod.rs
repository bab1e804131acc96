//! The master's crash-recovery journal: an append-only log of accepted packages, accepted
//! results, deliveries and package ends, replayed at start and compacted as it grows (like
//! Redis's AOF).
//!
//! This module owns the file `<data_dir>/journal.log`, its format (see `docs/journal.md`), the
//! writer thread that group-commits appends under an [`FsyncPolicy`], replay at open and
//! compaction. It does not know the scheduler: the caller turns scheduler events into
//! [`Record`]s and a [`Replay`] back into scheduler state, decides when a result may be
//! released to a client (by watching [`Journal::durable`]) and tells the journal which charges
//! are safely in the user store ([`Journal::set_watermark`]).
//!
//! Files: [`record`] (types, msgpack payloads), [`frame`] (on-disk framing), [`replay`]
//! (reading a file back, torn-tail repair), [`compact`] (rewriting it), `background` (the
//! compaction thread, beside the writer), [`writer`] (the [`Journal`] handle), `queue` (the
//! bounded queue to the writer), `thread` (the writer thread: group commit, fsync policy).

mod backend;
mod background;
mod compact;
mod frame;
pub mod pg;
mod pg_conn;
mod pg_tail;
mod pg_writer;
mod queue;
mod record;
mod replay;
mod shared;
mod thread;
mod writer;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

pub use backend::Journal;
pub use pg_tail::WarmState;
pub use record::{
    decode_call, encode_call, DoneRecord, PackageRecord, Record, FORMAT_VERSION, MIN_FORMAT_VERSION,
};
pub use writer::{FileJournal, JournalStats};

/// When the writer thread calls `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// After every group write: a record is durable before [`Journal::durable`] says so.
    Always,
    /// At most `window` after a record was written (group commit over time). A crash loses at
    /// most the last `window` of records; [`Journal::durable`] only reports synced ones.
    Batch {
        /// Longest time a written record waits for its fsync.
        window: Duration,
    },
    /// Never, except at close: the OS decides. [`Journal::durable`] reports written records,
    /// which survive a master crash but not a machine crash.
    Off,
}

/// Window of `FsyncPolicy::Batch` when none is given.
pub const DEFAULT_BATCH_WINDOW: Duration = Duration::from_millis(10);

impl Default for FsyncPolicy {
    fn default() -> Self {
        FsyncPolicy::Batch {
            window: DEFAULT_BATCH_WINDOW,
        }
    }
}

impl FromStr for FsyncPolicy {
    type Err = JournalError;

    /// Parses `always`, `batch` (10 ms), `batch:<ms>` (ms >= 1) or `off`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || JournalError::BadPolicy {
            text: text.to_owned(),
        };
        match text {
            "always" => Ok(FsyncPolicy::Always),
            "off" => Ok(FsyncPolicy::Off),
            "batch" => Ok(FsyncPolicy::default()),
            _ => {
                let ms = text.strip_prefix("batch:").ok_or_else(bad)?;
                match ms.parse::<u64>() {
                    Ok(ms) if ms > 0 => Ok(FsyncPolicy::Batch {
                        window: Duration::from_millis(ms),
                    }),
                    _ => Err(bad()),
                }
            }
        }
    }
}

impl fmt::Display for FsyncPolicy {
    /// The form [`FromStr`] reads back (`batch:<ms>`, with the window in whole milliseconds).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::Off => f.write_str("off"),
            FsyncPolicy::Batch { window } => write!(f, "batch:{}", window.as_millis()),
        }
    }
}

/// Called once when the journal can no longer promise durability (a failed write or fsync).
pub type FatalHandler = Arc<dyn Fn(&JournalError) + Send + Sync>;

/// Default size above which the journal is compacted (64 MiB).
pub const DEFAULT_COMPACT_MIN_BYTES: u64 = 64 << 20;

/// Exit status of the default [`FatalHandler`] (`EX_TEMPFAIL`: a supervisor may restart us).
pub const FATAL_EXIT_CODE: i32 = 75;

/// How to open a [`Journal`].
#[derive(Clone)]
pub struct JournalConfig {
    /// The journal file, normally `<data_dir>/journal.log`. Compaction writes
    /// `<path>.compact` next to it.
    pub path: PathBuf,
    /// When to fsync.
    pub policy: FsyncPolicy,
    /// Never compact below this size; above it, compact when the file has doubled since the
    /// last compaction.
    pub compact_min_bytes: u64,
    /// Pace of a compaction's writes in bytes per second (0: as fast as the disk goes).
    pub compact_bytes_per_s: u64,
    /// Called once, from the writer thread, when a write or fsync failed. The default logs,
    /// prints to stderr and exits the process with [`FATAL_EXIT_CODE`]: after a failed fsync
    /// the page cache state is unknown, and only a restart and replay can tell what is on disk.
    pub on_fatal: FatalHandler,
}

impl JournalConfig {
    /// A config for `path` with the default policy (batch, 10 ms), 64 MiB compaction threshold
    /// and the exiting fatal handler.
    pub fn new(path: PathBuf) -> Self {
        JournalConfig {
            path,
            policy: FsyncPolicy::default(),
            compact_min_bytes: DEFAULT_COMPACT_MIN_BYTES,
            compact_bytes_per_s: 0,
            on_fatal: Arc::new(exit_on_fatal),
        }
    }
}

impl fmt::Debug for JournalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalConfig")
            .field("path", &self.path)
            .field("policy", &self.policy)
            .field("compact_min_bytes", &self.compact_min_bytes)
            .finish_non_exhaustive()
    }
}

/// The default [`FatalHandler`].
fn exit_on_fatal(err: &JournalError) {
    tracing::error!(error = %err, "journal failed; exiting so that a restart replays it");
    eprintln!("rtpool-master: journal failed: {err}; exiting (status {FATAL_EXIT_CODE})");
    std::process::exit(FATAL_EXIT_CODE);
}

/// What [`Journal::open`] read back: the state to rebuild, and how the read went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Packages not ended, by ascending package id.
    pub packages: Vec<ReplayedPackage>,
    /// 1 + the highest package id ever journaled (0 when none was); survives compaction.
    pub next_package: u64,
    /// `(user, exec_us, lsn)` for every `Done` record (any package, ended or not, whose
    /// `Package` record is in the file) and every `Charge` record in the file, by ascending
    /// LSN. Charges with an LSN at or below the watermark in force at the last compaction may
    /// be gone; the caller compares LSNs with what its user store holds.
    pub charges: Vec<(String, u64, u64)>,
    /// Records read (the per-file meta record not counted).
    pub records: u64,
    /// Bytes of whole records read, i.e. the file's size after any tail repair.
    pub bytes: u64,
    /// Time spent reading and replaying (for a records/s line in the log).
    pub elapsed: Duration,
    /// `(offset, bytes cut)` when a torn last record was cut off.
    pub truncated_tail: Option<(u64, u64)>,
    /// Highest LSN ever assigned (0 for a new journal); appends continue after it.
    pub last_lsn: u64,
    /// Format version of the file as it was read ([`FORMAT_VERSION`] for a new journal). An
    /// older file is rewritten in the current format at open (see [`Journal::open`]).
    pub format_version: u64,
}

/// One live package as replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedPackage {
    /// The package as accepted.
    pub record: PackageRecord,
    /// Accepted results not yet delivered, in journal order.
    pub done: Vec<DoneRecord>,
    /// Task indices delivered, ascending, without duplicates.
    pub delivered: Vec<u32>,
}

/// Why the journal could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file operation failed.
    #[error("cannot {op} journal {path}: {source}; check the data dir's disk and permissions")]
    Io {
        /// What was being done (`read`, `write`, `fsync`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A damaged record with valid records after it: not a torn tail, so the master refuses to
    /// guess.
    #[error(
        "journal {path} is corrupt at byte offset {offset}: {reason}; valid records follow, so \
         this is not a torn write: restore the file from a backup or move it away to start empty"
    )]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Byte offset of the damaged record.
        offset: u64,
        /// Which check failed.
        reason: String,
    },
    /// The file is in a format version this master no longer reads (see the retirement rule
    /// in `docs/journal.md`).
    #[error(
        "journal {path} is in format version {version}, which this master no longer reads (it \
         reads versions {MIN_FORMAT_VERSION} and {FORMAT_VERSION}); to keep its packages, run \
         once on this data dir an older master that still reads version {version} (it rewrites \
         the file in its own format at open), then start this one; or move the file away to start empty \
         (users, tokens and quotas are in the store, not here); see docs/journal.md, \
         \"Format versions\""
    )]
    RetiredFormat {
        /// The journal file.
        path: PathBuf,
        /// The version in its meta record.
        version: u64,
    },
    /// A record whose payload is above the frame limit (1 GiB); a caller bug.
    #[error("journal record {lsn} has a {bytes}-byte payload, above the 1 GiB limit")]
    RecordTooLarge {
        /// The record's LSN.
        lsn: u64,
        /// Its payload size.
        bytes: usize,
    },
    /// The writer thread stopped after a fatal error; nothing more is written.
    #[error("journal writer has stopped after a fatal error; restart the master")]
    Stopped,
    /// A PostgreSQL journal's database refused or failed an operation (`--ha`).
    #[error(
        "cannot {op} the journal in PostgreSQL: {detail}; check that the database of --ha is \
         reachable and the login may create tables"
    )]
    Database {
        /// What was being done (`connect to`, `replay`, `write`, ...).
        op: &'static str,
        /// The client's error with the server's message, if any (see [`pg_detail`]).
        detail: String,
    },
    /// A PostgreSQL journal's write came from an epoch that no longer holds the lease: another
    /// master leads now, and this one must stop (fencing).
    #[error("journal write refused: epoch {mine} is not the leader's ({leader})")]
    Fenced {
        /// This master's epoch.
        mine: u64,
        /// The epoch in the lease row now.
        leader: u64,
    },
    /// A record read back from the PostgreSQL journal does not decode.
    #[error(
        "the journal in PostgreSQL is corrupt at seq {seq}: {reason}; restore the table \
         rtpool_journal from a backup, or empty it to start without its packages"
    )]
    CorruptRow {
        /// The row's sequence number (its LSN).
        seq: u64,
        /// Why it does not decode.
        reason: String,
    },
    /// An fsync policy string [`FsyncPolicy::from_str`] does not know.
    #[error("unknown fsync policy {text:?}; use always, batch, batch:<ms> or off")]
    BadPolicy {
        /// What was given.
        text: String,
    },
}

/// A PostgreSQL client error with what the server said (`postgres::Error`'s own text is only
/// `db error` for those).
pub fn pg_detail(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut text = e.to_string();
            if let Some(src) = std::error::Error::source(e) {
                text = format!("{text}: {src}");
            }
            text
        }
    }
}

impl JournalError {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        JournalError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

#[cfg(test)]
mod pg_tests;
#[cfg(test)]
mod tests;
