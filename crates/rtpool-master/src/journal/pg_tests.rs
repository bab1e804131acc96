//! The PostgreSQL journal against a real server (`$RTPOOL_TEST_PG_URL`; skipped with a note
//! without one): replay gives what the file journal gives, compaction keeps it, and a write
//! from an epoch that lost the lease is refused by the database itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::pg::{connect, PgJournal, PgJournalConfig};
use super::pg_writer::INSERT_SQL;
use super::tests::{append_all, assert_replay_matches, done, package, scenario, wait_durable};
use super::{Journal, JournalError, Record};

/// A URL of the test server whose connections use a fresh schema of their own (created
/// here), or `None` with a loud note when there is no server.
pub(crate) fn fresh_schema_url() -> Option<String> {
    let url = match std::env::var("RTPOOL_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            eprintln!(
                "\n*** NOTE: RTPOOL_TEST_PG_URL is not set: the PostgreSQL journal and lease \
                 tests did NOT run. `make test` starts a server (scripts/pg-test-server). ***\n"
            );
            return None;
        }
    };
    let mut raw = [0u8; 6];
    getrandom::getrandom(&mut raw).unwrap();
    let schema = format!("rtpool_ha_test_{}", hex::encode(raw));
    let mut client = connect(&url, 5000).expect("connect to the test server");
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}options=-csearch_path%3D{schema}"))
}

/// Creates the tables and sets the lease row to `epoch`, as a lease taken would.
fn set_epoch(url: &str, epoch: u64) {
    let mut client = connect(url, 5000).unwrap();
    client.batch_execute(super::pg::LEASE_TABLE_SQL).unwrap();
    client.batch_execute(super::pg::JOURNAL_TABLE_SQL).unwrap();
    client
        .execute(
            "UPDATE rtpool_leader SET epoch = $1 WHERE id = 1",
            &[&(epoch as i64)],
        )
        .unwrap();
}

fn open(url: &str, epoch: u64, fenced: &Arc<AtomicUsize>) -> (Journal, super::Replay) {
    let mut cfg = PgJournalConfig::new(url.to_owned(), epoch, 5000);
    let count = fenced.clone();
    cfg.on_fenced = Arc::new(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    let (j, replay) = PgJournal::open(cfg).expect("open the journal in PostgreSQL");
    (Journal::from(j), replay)
}

#[test]
fn pg_journal_replays_what_was_committed_and_compaction_keeps_it() {
    let Some(url) = fresh_schema_url() else {
        return;
    };
    set_epoch(&url, 1);
    let fenced = Arc::new(AtomicUsize::new(0));
    let (journal, replay) = open(&url, 1, &fenced);
    assert!(replay.packages.is_empty() && replay.last_lsn == 0);
    let records = scenario();
    let lsns = append_all(&journal, &records);
    assert_eq!(lsns, (1..=records.len() as u64).collect::<Vec<_>>());
    assert!(wait_durable(
        &journal,
        *lsns.last().unwrap(),
        Duration::from_secs(10)
    ));
    journal.close().unwrap();
    // A takeover: the next epoch replays the same state.
    set_epoch(&url, 2);
    let (journal, replay) = open(&url, 2, &fenced);
    assert_replay_matches(&replay, &records);
    assert_eq!(replay.last_lsn, records.len() as u64);
    let rows_before = journal.stats().file_bytes;
    journal.compact_now().unwrap();
    let after = journal.stats();
    assert!(after.file_bytes < rows_before, "{after:?} vs {rows_before}");
    assert_eq!(after.compactions, 1);
    // Appends continue after the highest LSN, and replay after compaction matches.
    let more = vec![done(7, 1, 70), package(9, "erin", 2)];
    let lsn = append_all(&journal, &more);
    assert_eq!(lsn[0], records.len() as u64 + 1);
    assert!(wait_durable(&journal, lsn[1], Duration::from_secs(10)));
    journal.close().unwrap();
    set_epoch(&url, 3);
    let (journal, replay) = open(&url, 3, &fenced);
    let all: Vec<Record> = records.iter().chain(&more).cloned().collect();
    // The watermark was 0: every charge kept, as the file journal keeps them.
    assert_replay_matches(&replay, &all);
    journal.close().unwrap();
    assert_eq!(fenced.load(Ordering::SeqCst), 0);
}

#[test]
fn a_write_from_an_old_epoch_is_refused_by_the_database() {
    let Some(url) = fresh_schema_url() else {
        return;
    };
    set_epoch(&url, 5);
    let fenced = Arc::new(AtomicUsize::new(0));
    let (old, _) = open(&url, 5, &fenced);
    let lsn = old.append(package(1, "alice", 1));
    assert!(wait_durable(&old, lsn, Duration::from_secs(10)));
    // Another master takes the lease.
    set_epoch(&url, 6);
    let refused = old.append(package(2, "alice", 1));
    assert!(!wait_durable(&old, refused, Duration::from_millis(500)));
    match old.close() {
        Err(JournalError::Fenced { mine: 5, leader: 6 }) => {}
        other => panic!("expected the write to be refused as fenced, got {other:?}"),
    }
    assert_eq!(fenced.load(Ordering::SeqCst), 1);
    assert_eq!(
        JournalError::Fenced { mine: 5, leader: 6 }.to_string(),
        "journal write refused: epoch 5 is not the leader's (6)"
    );
    // The database itself refuses the insert of epoch 5, even without the writer's check.
    let mut client = connect(&url, 5000).unwrap();
    let n = client
        .execute(INSERT_SQL, &[&5i64, &vec![100i64], &vec![b"x".as_slice()]])
        .unwrap();
    assert_eq!(n, 0, "a row of an old epoch was inserted");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM rtpool_journal", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "only the record written while epoch 5 led");
}

/// Waits, at most `timeout`, until `f` holds.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

#[test]
fn while_its_database_is_unreachable_the_journal_says_so_and_commits_once_it_is_back() {
    let Ok(base) = std::env::var("RTPOOL_TEST_PG_URL") else {
        return drop(fresh_schema_url()); // prints the note
    };
    // A database of its own: connections to it can be refused without touching the others.
    let mut raw = [0u8; 6];
    getrandom::getrandom(&mut raw).unwrap();
    let name = format!("rtpool_down_test_{}", hex::encode(raw));
    let mut admin = connect(&base, 5000).unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
    set_epoch(&url, 1);
    let fenced = Arc::new(AtomicUsize::new(0));
    let (journal, _) = open(&url, 1, &fenced);
    let lsn = journal.append(package(1, "alice", 1));
    assert!(wait_durable(&journal, lsn, Duration::from_secs(10)));
    assert_eq!(journal.unavailable(), None);
    // The database goes away: no new connection, and the journal's own is ended.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .unwrap();
    let waiting = journal.append(package(2, "alice", 1));
    assert!(wait_until(Duration::from_secs(10), || journal
        .unavailable()
        .is_some()));
    let why = journal.unavailable().unwrap();
    assert!(why.contains("journal database is unreachable"), "{why}");
    assert!(!wait_durable(&journal, waiting, Duration::from_millis(300)));
    // Back: the queued record commits, and the journal says it can commit again.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"
        ))
        .unwrap();
    assert!(wait_durable(&journal, waiting, Duration::from_secs(10)));
    assert_eq!(journal.unavailable(), None);
    journal.close().unwrap();
    assert_eq!(fenced.load(Ordering::SeqCst), 0);
}

#[test]
fn a_standby_tailing_the_table_takes_over_with_the_same_state_reading_only_the_tail() {
    let Some(url) = fresh_schema_url() else {
        return;
    };
    set_epoch(&url, 1);
    let fenced = Arc::new(AtomicUsize::new(0));
    let (leader, _) = open(&url, 1, &fenced);
    let records = scenario();
    let (first, rest) = records.split_at(6);
    let mut tail_client = connect(&url, 5000).unwrap();
    let mut warm = super::WarmState::default();
    warm.catch_up(&mut tail_client).unwrap(); // an empty table
    assert_eq!(warm.last_rows, 0);
    let lsns = append_all(&leader, first);
    assert!(wait_durable(
        &leader,
        *lsns.last().unwrap(),
        Duration::from_secs(10)
    ));
    warm.catch_up(&mut tail_client).unwrap();
    assert_eq!(warm.last_rows, first.len() as u64);
    // Then a compaction (the rows rewritten, a meta row at seq 0) and more records.
    leader.compact_now().unwrap();
    let lsns = append_all(&leader, rest);
    assert!(wait_durable(
        &leader,
        *lsns.last().unwrap(),
        Duration::from_secs(10)
    ));
    warm.catch_up(&mut tail_client).unwrap();
    let more = vec![done(7, 1, 70), package(9, "erin", 2)];
    let lsns = append_all(&leader, &more);
    assert!(wait_durable(
        &leader,
        *lsns.last().unwrap(),
        Duration::from_secs(10)
    ));
    leader.close().unwrap();
    // The takeover reads only the two rows since the last look, and replays what a cold
    // open replays.
    set_epoch(&url, 2);
    let mut cfg = PgJournalConfig::new(url.clone(), 2, 5000);
    cfg.on_fenced = Arc::new(|_| {});
    let (warm_j, warm_replay) = PgJournal::open_warm(cfg, warm).unwrap();
    let all: Vec<Record> = records.iter().chain(&more).cloned().collect();
    assert_replay_matches(&warm_replay, &all);
    assert_eq!(warm_replay.last_lsn, all.len() as u64);
    warm_j.close().unwrap();
    let (cold, cold_replay) = open(&url, 2, &fenced);
    assert_eq!(warm_replay.packages, cold_replay.packages);
    assert_eq!(warm_replay.charges, cold_replay.charges);
    assert_eq!(warm_replay.next_package, cold_replay.next_package);
    cold.close().unwrap();
}
