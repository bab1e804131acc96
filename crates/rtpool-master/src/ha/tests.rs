//! The lease against a real PostgreSQL (`$RTPOOL_TEST_PG_URL`; skipped with a note without
//! one): take, renew, expiry by the database's clock, loss, and the lease thread's view.

use std::time::{Duration, Instant};

use super::lease::{look, look_live, renew, setup, take, take_from, LeaseConfig, LeaseThread};
use crate::journal::pg::connect;

/// A fresh schema's URL (see `journal/pg_tests.rs`), or `None` when there is no server.
fn fresh_url() -> Option<String> {
    let url = match std::env::var("RTPOOL_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            eprintln!(
                "\n*** NOTE: RTPOOL_TEST_PG_URL is not set: the lease tests did NOT run. \
                 `make test` starts a server (scripts/pg-test-server). ***\n"
            );
            return None;
        }
    };
    let mut raw = [0u8; 6];
    getrandom::getrandom(&mut raw).unwrap();
    let schema = format!("rtpool_lease_test_{}", hex::encode(raw));
    let mut client = connect(&url, 5000).expect("connect to the test server");
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}options=-csearch_path%3D{schema}"))
}

fn config(url: &str, name: &str, lease_ms: u32) -> LeaseConfig {
    LeaseConfig {
        url: url.to_owned(),
        holder: format!("{name}/test"),
        advertise: format!("{name}:7070"),
        lease_ms,
    }
}

/// Calls `f` every 20 ms until it gives `Some`, for at most `timeout`.
fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_lease_is_taken_once_renewed_by_its_holder_and_taken_over_after_expiry() {
    let Some(url) = fresh_url() else { return };
    let (a, b) = (config(&url, "a", 400), config(&url, "b", 400));
    let mut ca = connect(&url, 5000).unwrap();
    let mut cb = connect(&url, 5000).unwrap();
    setup(&mut ca, 5000).unwrap();
    setup(&mut cb, 5000).unwrap();
    let (epoch, locked) = take(&mut ca, &a)
        .unwrap()
        .expect("the first master takes the lease");
    assert_eq!((epoch, locked), (1, true));
    assert_eq!(
        take(&mut cb, &b).unwrap(),
        None,
        "a live lease is not taken"
    );
    assert_eq!(look(&mut cb).unwrap(), (1, Some("a:7070".into())));
    assert!(renew(&mut ca, epoch, 400).unwrap());
    // Not renewed: it expires by the database's clock and b takes it with a new epoch.
    let taken = wait_for(Duration::from_secs(5), || take(&mut cb, &b).unwrap());
    assert_eq!(taken, Some((2, true)));
    assert_eq!(look(&mut ca).unwrap(), (2, Some("b:7070".into())));
    // The old holder's renewal affects no row: it has lost the lease.
    assert!(!renew(&mut ca, epoch, 400).unwrap());
}

#[test]
fn the_lease_thread_leads_renews_and_gives_way_when_stopped() {
    let Some(url) = fresh_url() else { return };
    let (mut first, mut view_a) = LeaseThread::start(config(&url, "a", 300)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let led = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            view_a.wait_for(|v| v.held.is_some()),
        )
        .await
        .map(|v| v.map(|v| v.clone()))
    });
    let led = led.expect("took the lease in time").unwrap();
    assert_eq!(led.held, Some(1));
    assert!(led.valid_until.is_some() && led.db_ok);
    let (_second, mut view_b) = LeaseThread::start(config(&url, "b", 300)).unwrap();
    // b stands by while a renews, for several leases.
    let standby = rt.block_on(async {
        let _ = tokio::time::timeout(
            Duration::from_millis(1200),
            view_b.wait_for(|v| v.held.is_some()),
        )
        .await;
        view_b.borrow().clone()
    });
    assert_eq!(standby.held, None, "b took a lease a renews: {standby:?}");
    assert_eq!(standby.leader.as_deref(), Some("a:7070"));
    // a stops: it gives the lease up, and b takes it.
    first.stop();
    let took = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            view_b.wait_for(|v| v.held.is_some()),
        )
        .await
        .map(|v| v.map(|v| v.clone()))
    });
    assert_eq!(took.expect("b took over in time").unwrap().held, Some(2));
}

#[test]
fn a_lease_whose_holders_session_ended_is_taken_at_once_not_at_expiry() {
    let Some(url) = fresh_url() else { return };
    // A lease of a minute: only the early path can take it within this test.
    let (a, b) = (config(&url, "a", 60_000), config(&url, "b", 60_000));
    let mut ca = connect(&url, 5000).unwrap();
    let mut cb = connect(&url, 5000).unwrap();
    setup(&mut ca, 5000).unwrap();
    setup(&mut cb, 5000).unwrap();
    assert_eq!(take(&mut ca, &a).unwrap(), Some((1, true)));
    // While a's session lives, b sees the lease held, and does not hold a's lock after looking.
    let seen = look_live(&mut cb, &b.holder).unwrap();
    assert_eq!((seen.epoch, seen.holder_gone), (1, false));
    assert_eq!(seen.leader.as_deref(), Some("a:7070"));
    assert!(renew(&mut ca, 1, 60_000).unwrap());
    // a's session ends (its process died): b gets the lock and takes the row with epoch 2.
    drop(ca);
    let gone = wait_for(Duration::from_secs(5), || {
        let seen = look_live(&mut cb, &b.holder).unwrap();
        seen.holder_gone.then_some(seen)
    })
    .expect("b sees a's session gone");
    assert_eq!(gone.epoch, 1);
    assert_eq!(take_from(&mut cb, &b, 1).unwrap(), Some((2, true)));
    assert_eq!(look(&mut cb).unwrap(), (2, Some("b:7070".into())));
    // A take from an epoch that moved on changes nothing.
    assert_eq!(take_from(&mut cb, &b, 1).unwrap(), None);
}

#[test]
fn no_early_take_when_the_leader_has_not_renewed_since_the_database_started() {
    let Some(url) = fresh_url() else { return };
    let (a, b) = (config(&url, "a", 60_000), config(&url, "b", 60_000));
    let mut ca = connect(&url, 5000).unwrap();
    let mut cb = connect(&url, 5000).unwrap();
    setup(&mut ca, 5000).unwrap();
    setup(&mut cb, 5000).unwrap();
    assert_eq!(take(&mut ca, &a).unwrap(), Some((1, true)));
    // As after a restart of PostgreSQL: every session ended, the last renewal before it.
    drop(ca);
    cb.batch_execute(
        "UPDATE rtpool_leader SET renewed_at = pg_postmaster_start_time() - interval '1 second'",
    )
    .unwrap();
    let seen = look_live(&mut cb, &b.holder).unwrap();
    assert_eq!((seen.epoch, seen.holder_gone), (1, false));
    // The leader's first renewal on its new session takes its lock again: still no early take.
    let mut ca = connect(&url, 5000).unwrap();
    setup(&mut ca, 5000).unwrap();
    assert_eq!(
        super::lease::renew_locking(&mut ca, 1, 60_000, true).unwrap(),
        Some(true)
    );
    assert!(!look_live(&mut cb, &b.holder).unwrap().holder_gone);
}
