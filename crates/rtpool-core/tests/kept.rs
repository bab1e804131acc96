//! Scenarios: a client's `RELEASE` of results kept on workers becomes one `DropKept` per worker
//! that holds some of them and is still connected (`docs/data.md`, "Freeing").

mod common;

use bytes::Bytes;
use common::{drops, TestEnv};
use rtpool_core::{Action, ClientId, Event, WorkerId};

fn key(n: u8) -> Bytes {
    Bytes::from(vec![n; 16])
}

fn release(env: &mut TestEnv, client: ClientId, keys: &[(WorkerId, u8)]) -> Vec<Action> {
    let keys = keys.iter().map(|&(w, n)| (w, key(n))).collect();
    env.step(Event::ReleaseKept { client, keys })
}

#[test]
fn released_keys_go_to_their_workers_one_drop_each_in_order() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let client = env.new_client();
    let out = release(&mut env, client, &[(a, 1), (b, 2), (a, 3)]);
    assert_eq!(
        drops(&out),
        vec![(a, vec![key(1), key(3)]), (b, vec![key(2)])],
        "{out:?}"
    );
    assert_eq!(out.len(), 2, "nothing else: {out:?}");
    assert_eq!(env.core.stats().counters.kept_released, 3);
    assert!(out.iter().all(|a| !a.is_journaled()));
}

#[test]
fn a_release_for_a_worker_that_is_gone_is_counted_and_dropped() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    env.lose_worker(b);
    let client = env.new_client();
    let out = release(&mut env, client, &[(b, 1), (WorkerId(999), 2), (a, 3)]);
    assert_eq!(drops(&out), vec![(a, vec![key(3)])], "{out:?}");
    let counters = env.core.stats().counters;
    assert_eq!(
        (counters.kept_released, counters.kept_release_unknown),
        (1, 2)
    );
}

#[test]
fn a_release_from_an_unknown_client_is_ignored() {
    let mut env = TestEnv::new();
    let a = env.new_worker(1);
    let client = env.new_client();
    env.lose_client(client);
    let out = release(&mut env, client, &[(a, 1)]);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(env.core.stats().counters.kept_released, 0);
}

#[test]
fn an_empty_release_does_nothing() {
    let mut env = TestEnv::new();
    env.new_worker(1);
    let client = env.new_client();
    assert!(release(&mut env, client, &[]).is_empty());
}
