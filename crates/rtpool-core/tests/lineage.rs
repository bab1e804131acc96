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

fn key(n: u8) -> Bytes {
    Bytes::from(vec![n; 16])
}

/// A worker with `slots` slots and credits serving `f`.
fn server(env: &mut TestEnv, slots: u32) -> WorkerId {
    env.new_server(slots, &[("f", "1")], slots)
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
    let (_, out) = env.submit_calls(client, calls("f", &[("a", &[]), ("c", &[0]), ("d", &[0])]));
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
    let (_, out) = env.submit_calls(client, calls("f", &[("a", &[]), ("c", &[0])]));
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, &reference(1), 10);
    let c = assigned(&out)[0].1;
    let out = env.answer(w, c, TaskStatus::Error, b"boom", 10);
    assert_eq!(
        drops(&out),
        vec![(w, vec![key(1)])],
        "a failed reader: {out:?}"
    );

    let (package, out) = env.submit_calls(client, calls("f", &[("a", &[]), ("c", &[0])]));
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
        calls("f", &[("a", &[]), ("b", &[]), ("c", &[0, 1])]),
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
        calls("f", &[("a", &[]), ("b", &[]), ("c", &[0, 1])]),
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

/// The inputs of the call assigned as `task` in `out`.
fn inputs_of(out: &[Action], task: TaskId) -> Vec<Bytes> {
    call_assignments(out)
        .into_iter()
        .flat_map(|(_, calls)| calls)
        .find(|c| c.task == task)
        .unwrap_or_else(|| panic!("{task} not assigned: {out:?}"))
        .inputs
}

/// `InputLost` data: the input's position and a message.
fn input_lost(position: u32) -> Vec<u8> {
    let mut data = position.to_be_bytes().to_vec();
    data.extend_from_slice(b"KeptResultLost: cannot read it");
    data
}

/// Two workers serving `f` (one slot each), a transaction `a -> c <- b` where `a` ran on one
/// worker and answered with `reference(1)`, and `b` still runs on the other. Returns
/// `(a's worker, b's worker, b's task, package, client)`.
fn a_kept_and_b_running(
    env: &mut TestEnv,
    opts: rtpool_core::PackageOpts,
) -> (
    WorkerId,
    WorkerId,
    TaskId,
    rtpool_core::PackageId,
    rtpool_core::ClientId,
) {
    let (w, v) = (server(env, 1), server(env, 1));
    let client = env.new_client();
    let (package, out) = env.submit_calls_with(
        client,
        opts,
        calls("f", &[("a", &[]), ("b", &[]), ("c", &[0, 1])]),
    );
    let started = assigned(&out);
    assert_eq!(started.len(), 2, "{out:?}");
    let (holder, a) = (started[0].0, started[0].1);
    let b = started[1].1;
    let out = env.answer(holder, a, TaskStatus::Ok, &reference(1), 10);
    assert!(drops(&out).is_empty());
    (holder, if holder == w { v } else { w }, b, package, client)
}

/// A worker serving `f` with one slot, its credit not yet given.
fn spare(env: &mut TestEnv) -> WorkerId {
    env.new_server(1, &[("f", "1")], 0)
}

/// `holder` (a's worker, from [`a_kept_and_b_running`]) is lost and a new spare server's one
/// credit takes the copy of a made again: the spare and that copy's task.
fn rerun_on_a_spare(env: &mut TestEnv, holder: WorkerId) -> (WorkerId, TaskId) {
    env.lose_worker(holder);
    let spare = spare(env);
    let out = env.credit(spare, 1);
    let copy = assigned(&out);
    assert_eq!(copy.len(), 1, "a runs again on the spare: {out:?}");
    assert_eq!(
        (copy[0].0, copy[0].2.as_slice()),
        (spare, &b"a"[..]),
        "{out:?}"
    );
    (spare, copy[0].1)
}

/// Results sent to clients in `out`.
fn sent(out: &[Action]) -> usize {
    out.iter()
        .filter(|a| matches!(a, Action::SendResults { .. }))
        .count()
}

#[test]
fn a_lost_intermediate_is_made_again_before_its_dependent_runs() {
    let mut env = TestEnv::new();
    let (holder, other, b, _, _) = a_kept_and_b_running(&mut env, Default::default());
    let out = env.lose_worker(holder);
    assert!(assigned(&out).is_empty(), "no free server: {out:?}");
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 1);
    let spare = spare(&mut env);
    let out = env.credit(spare, 1);
    let a2 = assigned(&out);
    assert_eq!(a2.len(), 1, "a runs again: {out:?}");
    assert_eq!((a2[0].0, a2[0].2.as_slice()), (spare, &b"a"[..]));
    let out = env.answer(spare, a2[0].1, TaskStatus::Ok, &reference(9), 10);
    assert_eq!(
        sent(&out),
        0,
        "the client gets nothing of the copy: {out:?}"
    );
    env.credit(other, 1);
    let out = env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    let c = assigned(&out);
    assert_eq!(c.len(), 1, "{out:?}");
    assert_eq!(
        inputs_of(&out, c[0].1),
        vec![Bytes::from(reference(9)), Bytes::from(reference(2))]
    );
    let out = env.complete(c[0].0, c[0].1);
    let mut got = drops(&out);
    got.sort();
    let mut expect = vec![(spare, vec![key(9)]), (other, vec![key(2)])];
    expect.sort();
    assert_eq!(
        got, expect,
        "the new value is dropped where it was made: {out:?}"
    );
}

#[test]
fn a_running_dependent_that_cannot_read_its_input_waits_for_it_to_be_made_again() {
    let mut env = TestEnv::new();
    let (holder, other, b, _, _) = a_kept_and_b_running(&mut env, Default::default());
    env.credit(holder, 1);
    let out = env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    let c = assigned(&out);
    assert_eq!(c.len(), 1, "{out:?}");
    let (cw, ct) = (c[0].0, c[0].1);
    // c's worker could not read a's value (its holder evicted it, or is going away).
    let out = env.answer(cw, ct, TaskStatus::InputLost, &input_lost(0), 10);
    assert_eq!(sent(&out), 0, "c is not failed: {out:?}");
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 1);
    assert_eq!(
        drops(&out),
        vec![(holder, vec![key(1)])],
        "what is left of it: {out:?}"
    );
    let out = env.credit(cw, 1);
    let a2 = assigned(&out);
    assert_eq!(
        a2.len(),
        1,
        "a runs again at once (c's worker is free): {out:?}"
    );
    assert_eq!(a2[0].2, b"a");
    env.answer(a2[0].0, a2[0].1, TaskStatus::Ok, &reference(7), 10);
    let out = env.credit(cw, 1);
    let c2 = assigned(&out);
    assert_eq!(c2.len(), 1, "c runs again: {out:?}");
    assert_eq!(c2[0].1, ct, "the same call");
    assert_eq!(
        inputs_of(&out, ct),
        vec![Bytes::from(reference(7)), Bytes::from(reference(2))]
    );
    let out = env.complete(c2[0].0, ct);
    assert_eq!(sent(&out), 1, "c's result: {out:?}");
}

#[test]
fn a_dependent_that_lost_an_input_already_made_again_gets_the_new_one() {
    let mut env = TestEnv::new();
    let (holder, other, b, _, _) = a_kept_and_b_running(&mut env, Default::default());
    env.credit(other, 1);
    let out = env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    let c = assigned(&out);
    assert_eq!(c.len(), 1, "{out:?}");
    let (cw, ct) = (c[0].0, c[0].1);
    // a's worker goes while c runs: a is made again on a free worker.
    let (spare, a2) = rerun_on_a_spare(&mut env, holder);
    env.answer(spare, a2, TaskStatus::Ok, &reference(8), 10);
    // c then reports it could not read the old value: it runs with the new one, a once more.
    env.answer(cw, ct, TaskStatus::InputLost, &input_lost(0), 10);
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 1);
    let out = env.credit(cw, 1);
    assert_eq!(
        inputs_of(&out, ct),
        vec![Bytes::from(reference(8)), Bytes::from(reference(2))]
    );
}

#[test]
fn when_the_attempts_are_spent_the_dependent_fails_naming_the_producer() {
    let mut env = TestEnv::new();
    let opts = rtpool_core::PackageOpts {
        max_attempts: 2,
        ..Default::default()
    };
    let (holder, other, b, _, _) = a_kept_and_b_running(&mut env, opts);
    let (spare, a2) = rerun_on_a_spare(&mut env, holder);
    env.answer(spare, a2, TaskStatus::Ok, &reference(9), 10);
    // Its second value is lost too: a ran twice, its package's max_attempts.
    let out = env.lose_worker(spare);
    let (index, status, message) = only_outcome(&out, "the dependent fails");
    assert_eq!((index, status), (2, TaskStatus::Failed));
    assert!(
        message.contains("call #0 f was lost") && message.contains("ran 2 times"),
        "{message}"
    );
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 1);
    // b's value has no reader left: dropped.
    let out = env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    assert_eq!(drops(&out), vec![(other, vec![key(2)])], "{out:?}");
}

#[test]
fn a_copy_that_fails_fails_the_dependent_naming_the_producer() {
    let mut env = TestEnv::new();
    let (holder, _, _, _, _) = a_kept_and_b_running(&mut env, Default::default());
    let (spare, a2) = rerun_on_a_spare(&mut env, holder);
    let out = env.answer(spare, a2, TaskStatus::Error, b"boom", 10);
    let failed = outcomes(&out);
    assert_eq!(failed.len(), 1, "{out:?}");
    assert_eq!((failed[0].0, failed[0].1), (2, TaskStatus::Failed));
    assert!(
        failed[0].2.contains("call #0 f was lost") && failed[0].2.contains("again failed"),
        "{failed:?}"
    );
}

#[test]
fn a_copy_nobody_needs_any_more_is_aborted() {
    let mut env = TestEnv::new();
    let (holder, other, b, package, client) = a_kept_and_b_running(&mut env, Default::default());
    let (spare, a2) = rerun_on_a_spare(&mut env, holder);
    let out = env.cancel(client, package, &[]);
    let aborted = aborts(&out).iter().any(|&(w, t, _)| (w, t) == (spare, a2));
    assert!(aborted, "{out:?}");
    let out = env.answer(spare, a2, TaskStatus::Ok, &reference(9), 10);
    assert_eq!(sent(&out), 0, "{out:?}");
    env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    assert_eq!(env.core.stats().tasks, 0, "everything is freed");
}

#[test]
fn a_copy_whose_worker_is_lost_runs_again_elsewhere() {
    let mut env = TestEnv::new();
    let (holder, other, b, _, _) = a_kept_and_b_running(&mut env, Default::default());
    let (first, a2) = rerun_on_a_spare(&mut env, holder);
    let (second, a3) = rerun_on_a_spare(&mut env, first);
    assert_eq!(a3, a2, "the same copy");
    env.answer(second, a3, TaskStatus::Ok, &reference(6), 10);
    env.credit(other, 1);
    let out = env.answer(other, b, TaskStatus::Ok, &reference(2), 10);
    let c = assigned(&out);
    assert_eq!(
        inputs_of(&out, c[0].1),
        vec![Bytes::from(reference(6)), Bytes::from(reference(2))]
    );
}

#[test]
fn a_copy_past_its_time_limit_fails_the_readers() {
    let mut env = TestEnv::new();
    let opts = rtpool_core::PackageOpts {
        timeout_ms: 100,
        ..Default::default()
    };
    let (holder, _, _, _, _) = a_kept_and_b_running(&mut env, opts);
    let (spare, a2) = rerun_on_a_spare(&mut env, holder);
    let out = env.tick_after(10_000);
    let aborted = aborts(&out).iter().any(|&(w, t, _)| (w, t) == (spare, a2));
    assert!(aborted, "{out:?}");
    let failed = outcomes(&out);
    assert!(
        failed
            .iter()
            .any(|(i, s, m)| *i == 2 && *s == TaskStatus::Failed && m.contains("Timeout")),
        "{out:?}"
    );
}

#[test]
fn input_lost_for_an_input_that_is_not_kept_fails_the_call_with_the_message() {
    let mut env = TestEnv::new();
    let w = server(&mut env, 2);
    let client = env.new_client();
    let mut a = call("f", "a", &[]);
    a.fetch = true; // its data is the input itself: nothing to make again
    let (_, out) = env.submit_calls(client, vec![a, call("f", "c", &[0])]);
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, b"\x91\x01", 10);
    let c = assigned(&out)[0].1;
    let out = env.answer(w, c, TaskStatus::InputLost, &input_lost(0), 10);
    assert_eq!(
        outcomes(&out),
        vec![(
            1,
            TaskStatus::Failed,
            "KeptResultLost: cannot read it".to_owned()
        )]
    );
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 0);
}

#[test]
fn a_copy_no_worker_serves_fails_the_readers_after_the_grace_period() {
    let mut env = TestEnv::new();
    let w = server(&mut env, 1);
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, calls("f", &[("a", &[]), ("c", &[0])]));
    let a = assigned(&out)[0].1;
    let out = env.answer(w, a, TaskStatus::Ok, &reference(1), 10);
    assert!(
        assigned(&out).is_empty(),
        "c is queued (no credit): {out:?}"
    );
    let out = env.lose_worker(w);
    assert!(outcomes(&out).is_empty(), "{out:?}");
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 1);
    let out = env.tick_after(60_000);
    let failed = outcomes(&out);
    assert_eq!(failed.len(), 1, "{out:?}");
    assert_eq!((failed[0].0, failed[0].1), (1, TaskStatus::Failed));
    assert!(failed[0].2.contains("no worker serves 'f'"), "{failed:?}");
}

#[test]
fn in_a_chain_a_lost_value_whose_input_was_dropped_has_that_input_made_again_first() {
    let mut env = TestEnv::new();
    let (w, v) = (server(&mut env, 1), server(&mut env, 1));
    let client = env.new_client();
    // a -> b -> c: a's value is dropped once b is done; b's is lost before c reads it.
    let (_, out) = env.submit_calls(client, calls("f", &[("a", &[]), ("b", &[0]), ("c", &[1])]));
    let (wa, a) = (assigned(&out)[0].0, assigned(&out)[0].1);
    let other = if wa == w { v } else { w };
    let out = env.answer(wa, a, TaskStatus::Ok, &reference(1), 10);
    let (wb, b) = (assigned(&out)[0].0, assigned(&out)[0].1);
    assert_eq!(wb, other, "{out:?}");
    let out = env.answer(wb, b, TaskStatus::Ok, &reference(2), 10);
    assert_eq!(drops(&out), vec![(wa, vec![key(1)])], "b read a: {out:?}");
    assert!(assigned(&out).is_empty(), "no credit for c yet");
    // b's worker goes: b is made again, and a, dropped, before it.
    let out = env.lose_worker(wb);
    assert_eq!(env.core.stats().counters.kept_calls_rerun, 2);
    let out2 = env.credit(wa, 1);
    let a2 = assigned(&out2);
    assert_eq!(a2.len(), 1, "{out:?} {out2:?}");
    assert_eq!(a2[0].2, b"a", "a first: {out2:?}");
    let out = env.answer(wa, a2[0].1, TaskStatus::Ok, &reference(3), 10);
    assert!(drops(&out).is_empty(), "b's copy reads it: {out:?}");
    let out = env.credit(wa, 1);
    let b2 = assigned(&out);
    assert_eq!(b2[0].2, b"b", "{out:?}");
    assert_eq!(inputs_of(&out, b2[0].1), vec![Bytes::from(reference(3))]);
    let out = env.answer(wa, b2[0].1, TaskStatus::Ok, &reference(4), 10);
    assert_eq!(
        drops(&out),
        vec![(wa, vec![key(3)])],
        "a's copy is read: {out:?}"
    );
    let out = env.credit(wa, 1);
    let c = assigned(&out);
    assert_eq!(inputs_of(&out, c[0].1), vec![Bytes::from(reference(4))]);
    let out = env.complete(wa, c[0].1);
    assert_eq!(drops(&out), vec![(wa, vec![key(4)])], "{out:?}");
    assert_eq!(outcomes(&out).len(), 1, "c's result: {out:?}");
    assert_eq!(
        env.core.stats().tasks,
        0,
        "every record and copy is gone: {out:?}"
    );
}
