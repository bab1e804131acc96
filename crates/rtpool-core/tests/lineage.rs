//! Scenarios: transaction intermediates (calls not fetched, kept on their workers) are dropped
//! once every dependent finished, and made again when their worker is lost before
//! (`docs/rpc.md`, "Transactions").

mod common;

use bytes::Bytes;
use common::*;
use rtpool_core::{Action, TaskId, TaskStatus, WorkerId};

/// The reference a worker answers a kept call with: msgpack ext 3 of
/// `["127.0.0.1", 40000, key, 10, 7, 1]` (as `rpc.codec.kept_blob` packs it).
fn reference(key: u8) -> Vec<u8> {
    let mut inner = vec![0x96, 0xa9];
    inner.extend_from_slice(b"127.0.0.1");
    inner.extend_from_slice(&[0xcd, 0x9c, 0x40, 0xc4, 16]);
    inner.extend_from_slice(&[key; 16]);
    inner.extend_from_slice(&[0x0a, 0x07, 0x01]);
    let mut out = vec![0xc7, inner.len() as u8, 3];
    out.extend_from_slice(&inner);
    out
}

fn drops(out: &[Action]) -> Vec<(WorkerId, Vec<Bytes>)> {
    out.iter()
        .filter_map(|a| match a {
            Action::DropKept { worker, keys } => Some((*worker, keys.clone())),
            _ => None,
        })
        .collect()
}

fn key(n: u8) -> Bytes {
    Bytes::from(vec![n; 16])
}

/// A worker with `slots` slots and credits serving `f`.
fn server(env: &mut TestEnv, slots: u32) -> WorkerId {
    let w = env.new_worker(slots);
    assert!(env.serve(w, &[("f", "1")]).is_empty());
    env.credit(w, slots);
    w
}

/// The one call assigned in `out` (to any worker), with its worker.
fn assigned(out: &[Action]) -> Vec<(WorkerId, TaskId, Vec<u8>)> {
    call_assignments(out)
        .into_iter()
        .flat_map(|(w, calls)| calls.into_iter().map(move |c| (w, c.task, c.args.to_vec())))
        .collect()
}

#[test]
fn an_intermediate_is_dropped_once_its_last_dependent_is_done() {
    let mut env = TestEnv::new();
    let w = server(&mut env, 4);
    let client = env.new_client();
    // a -> c, a -> d: a's value is read by two calls.
    let (_, out) = env.submit_calls(
        client,
        vec![
            call("f", "a", &[]),
            call("f", "c", &[0]),
            call("f", "d", &[0]),
        ],
    );
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, &reference(1), 10);
    assert!(drops(&out).is_empty(), "c and d still read it: {out:?}");
    let deps = assigned(&out);
    assert_eq!(deps.len(), 2, "{out:?}");
    let out = env.complete(w, deps[0].1);
    assert!(drops(&out).is_empty(), "d still reads it: {out:?}");
    let out = env.complete(w, deps[1].1);
    assert_eq!(drops(&out), vec![(w, vec![key(1)])], "{out:?}");
    assert_eq!(env.core.stats().counters.kept_calls_released, 1);
}

#[test]
fn an_intermediate_is_dropped_when_its_dependent_fails_or_is_cancelled() {
    let mut env = TestEnv::new();
    let w = server(&mut env, 4);
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, vec![call("f", "a", &[]), call("f", "c", &[0])]);
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, &reference(1), 10);
    let c = assigned(&out)[0].1;
    let out = env.answer(w, c, TaskStatus::Error, b"boom", 10);
    assert_eq!(
        drops(&out),
        vec![(w, vec![key(1)])],
        "a failed reader: {out:?}"
    );

    let (package, out) = env.submit_calls(client, vec![call("f", "a", &[]), call("f", "c", &[0])]);
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, &reference(2), 10);
    assert_eq!(assigned(&out).len(), 1, "c runs: {out:?}");
    let out = env.cancel(client, package, &[]);
    assert_eq!(
        drops(&out),
        vec![(w, vec![key(2)])],
        "the package cancelled: {out:?}"
    );
}

#[test]
fn an_intermediate_no_dependent_will_read_is_dropped_at_once() {
    let mut env = TestEnv::new();
    let w = server(&mut env, 4);
    let client = env.new_client();
    // c takes a and b; b fails first, so c fails before a is done.
    let (_, out) = env.submit_calls(
        client,
        vec![
            call("f", "a", &[]),
            call("f", "b", &[]),
            call("f", "c", &[0, 1]),
        ],
    );
    let started = assigned(&out);
    let out = env.answer(w, started[1].1, TaskStatus::Error, b"boom", 10);
    assert!(drops(&out).is_empty());
    let out = env.answer(w, started[0].1, TaskStatus::Ok, &reference(3), 10);
    assert_eq!(drops(&out), vec![(w, vec![key(3)])], "{out:?}");
}

#[test]
fn each_intermediate_is_dropped_on_the_worker_that_keeps_it() {
    let mut env = TestEnv::new();
    let (w, v) = (server(&mut env, 1), server(&mut env, 1));
    let client = env.new_client();
    let (_, out) = env.submit_calls(
        client,
        vec![
            call("f", "a", &[]),
            call("f", "b", &[]),
            call("f", "c", &[0, 1]),
        ],
    );
    let started = assigned(&out);
    let (holder, a) = (started[0].0, started[0].1);
    let other = if holder == w { v } else { w };
    env.answer(holder, a, TaskStatus::Ok, &reference(4), 10);
    env.credit(holder, 1);
    let out = env.answer(other, started[1].1, TaskStatus::Ok, &reference(5), 10);
    let c = assigned(&out);
    assert_eq!(c.len(), 1, "{out:?}");
    let out = env.complete(c[0].0, c[0].1);
    let mut got = drops(&out);
    got.sort();
    let mut expect = vec![(holder, vec![key(4)]), (other, vec![key(5)])];
    expect.sort();
    assert_eq!(got, expect, "{out:?}");
}
