//! What the PostgreSQL journal's handle (`pg.rs`) and its writer thread (`pg_writer.rs`)
//! share: its settings, the connection, and reading the table back into replay state.

use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, NoTls};

use super::record::{self, Entry};
use super::replay::State;
use super::{JournalError, DEFAULT_COMPACT_MIN_BYTES};

/// Called once, from the writer thread, when the database refused a write from this epoch.
pub type FenceHandler = Arc<dyn Fn(&JournalError) + Send + Sync>;

/// How to open a [`PgJournal`].
#[derive(Clone)]
pub struct PgJournalConfig {
    /// `postgres://user@host:port/db` (the database of `--ha`).
    pub url: String,
    /// The lease epoch this master holds; every row it writes carries it, and only while the
    /// lease row still has it.
    pub epoch: u64,
    /// The lease, milliseconds: a transaction left open longer (a master frozen mid-commit)
    /// is ended by the server (`idle_in_transaction_session_timeout`), so it cannot hold the
    /// lease row's lock against a takeover; also the connect timeout.
    pub lease_ms: u32,
    /// Never compact below this many bytes of rows; above it, compact when they have doubled
    /// since the last compaction.
    pub compact_min_bytes: u64,
    /// Called once when a write is refused (another master leads): stop leading.
    pub on_fenced: FenceHandler,
}

impl PgJournalConfig {
    /// A config with the default compaction threshold (64 MiB) and a handler that only logs.
    pub fn new(url: String, epoch: u64, lease_ms: u32) -> Self {
        PgJournalConfig {
            url,
            epoch,
            lease_ms,
            compact_min_bytes: DEFAULT_COMPACT_MIN_BYTES,
            on_fenced: Arc::new(|_| {}),
        }
    }
}

/// Connects to `url` with `lease_ms` as the connect timeout and the longest a transaction may
/// stay open idle. Call it off the tokio runtime's threads (the client runs one of its own).
///
/// # Errors
///
/// The client's error when the server cannot be reached or refuses the login.
pub fn connect(url: &str, lease_ms: u32) -> Result<Client, postgres::Error> {
    let mut config: postgres::Config = url.parse()?;
    let lease = Duration::from_millis(lease_ms.into());
    config.connect_timeout(lease);
    config.application_name("rtpool-master");
    let mut client = config.connect(NoTls)?;
    // No NOTICE lines (`relation ... already exists, skipping`) in the master's log.
    client.batch_execute(&format!(
        "SET client_min_messages = warning; SET idle_in_transaction_session_timeout = {lease_ms}"
    ))?;
    Ok(client)
}

/// Reads the rows with `seq <= upto` in order into a replay state (charges at or below
/// `watermark` not kept); returns it with the rows' payload bytes.
pub(super) fn read_state<C: postgres::GenericClient>(
    client: &mut C,
    upto: i64,
    watermark: u64,
) -> Result<(State, u64), JournalError> {
    let rows = client
        .query(
            "SELECT seq, record FROM rtpool_journal WHERE seq <= $1 ORDER BY seq",
            &[&upto],
        )
        .map_err(db("replay"))?;
    let mut state = State::default();
    state.drop_charges_upto = watermark;
    let bytes = apply_rows(&mut state, &rows)?;
    Ok((state, bytes))
}

/// Applies `(seq, record)` rows in order to `state`; returns their payload bytes.
pub(super) fn apply_rows(state: &mut State, rows: &[postgres::Row]) -> Result<u64, JournalError> {
    let mut bytes = 0u64;
    for row in rows {
        let seq: i64 = row.get(0);
        let payload: &[u8] = row.get(1);
        bytes += payload.len() as u64;
        let corrupt = |reason: String| JournalError::CorruptRow {
            seq: seq as u64,
            reason,
        };
        let entry = record::decode(payload).map_err(corrupt)?;
        if let Entry::Meta { version, .. } = entry {
            if !(record::MIN_FORMAT_VERSION..=record::FORMAT_VERSION).contains(&version) {
                return Err(corrupt(format!(
                    "its meta record is of format version {version}; this master reads {} \
                     and {}",
                    record::MIN_FORMAT_VERSION,
                    record::FORMAT_VERSION
                )));
            }
        }
        state.apply(seq as u64, entry);
    }
    Ok(bytes)
}

/// Maps a client error of `op` to [`JournalError::Database`].
pub(super) fn db(op: &'static str) -> impl Fn(postgres::Error) -> JournalError {
    move |e| JournalError::Database {
        op,
        detail: super::pg_detail(&e),
    }
}
