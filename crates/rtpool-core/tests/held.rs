//! Scenarios: dependencies held by the master (package option `after`): a package waits for
//! a task of another package, takes its result as its input, runs near the worker that made
//! it, and fails when it fails or is cancelled.

mod common;

use bytes::Bytes;
use common::{assignments, only_rejection, outcomes, results, tasks_of, Spec, TestEnv};
use rtpool_core::{
    Action, Event, PackageId, PackageOpts, RejectReason, RestoredPackage, TaskStatus, UserId,
};

/// Submits one task depending on task 0 of `producer`.
fn submit_after(
    env: &mut TestEnv,
    client: rtpool_core::ClientId,
    producer: PackageId,
) -> (PackageId, Vec<Action>) {
    env.submit_spec(client, Spec::tasks(1).after(producer, 0))
}

/// A client, and its one-task package `f` running on worker `a` (given one credit): `(client,
/// f, f's task)`.
fn producer_running_on(
    env: &mut TestEnv,
    a: rtpool_core::WorkerId,
) -> (rtpool_core::ClientId, PackageId, rtpool_core::TaskId) {
    let client = env.new_client();
    env.credit(a, 1);
    let (f, out) = env.submit(client, 1);
    (client, f, tasks_of(&out, a)[0])
}

#[test]
fn a_dependent_waits_for_its_producer_then_runs_near_it_with_its_result_as_input() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let (client, f, producer) = producer_running_on(&mut env, a);
    // g is sent at once; b is idle but g waits for f.
    env.credit(b, 1);
    let (_, out) = submit_after(&mut env, client, f);
    assert!(assignments(&out).is_empty(), "g ran before f: {out:?}");
    // f finishes on a; a asks for more; g goes to a (its input is there) although b is free.
    let out = env.complete(a, producer);
    assert_eq!(
        results(&out).len(),
        1,
        "f's result goes to the client: {out:?}"
    );
    let out = env.credit(a, 1);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(got[0].0, a, "g runs where f's result is: {out:?}");
    let f_data = env.outcome(producer, 1).data;
    assert_eq!(got[0].1[0].inputs, vec![f_data], "g's input is f's result");
    env.core.check_invariants();
}

#[test]
fn a_dependent_of_a_done_producer_runs_at_once_with_its_input() {
    let mut env = TestEnv::new();
    env.auto_ack = false;
    let a = env.new_worker(2);
    let (client, f, producer) = producer_running_on(&mut env, a);
    env.complete(a, producer); // done, not yet acknowledged
    env.credit(a, 1);
    let (_, out) = submit_after(&mut env, client, f);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(got[0].1[0].inputs.len(), 1);
}

#[test]
fn a_dependent_of_a_done_producer_runs_near_the_worker_that_made_its_input() {
    // f is done (not yet acknowledged) before g comes: g still goes where f's result is,
    // not to the other worker that happens to be hungry first.
    let mut env = TestEnv::new();
    env.auto_ack = false;
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let (client, f, producer) = producer_running_on(&mut env, a);
    env.complete(a, producer);
    env.credit(b, 1);
    let (_, out) = submit_after(&mut env, client, f);
    assert!(assignments(&out).is_empty(), "g went to b: {out:?}");
    let out = env.credit(a, 1);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(got[0].0, a, "g runs where f's result is: {out:?}");
    env.core.check_invariants();
}

#[test]
fn a_failed_producer_fails_its_dependents_transitively_naming_it() {
    let mut env = TestEnv::new();
    let a = env.new_worker(1);
    let (client, f, producer) = producer_running_on(&mut env, a);
    let (g, _) = submit_after(&mut env, client, f);
    let (h, _) = submit_after(&mut env, client, g);
    let out = env.answer(a, producer, TaskStatus::Error, b"report", 10);
    let per: Vec<(PackageId, Vec<_>)> = results(&out);
    let failed: Vec<_> = per
        .iter()
        .filter(|(p, _)| *p == g || *p == h)
        .flat_map(|(_, rs)| rs)
        .collect();
    assert_eq!(failed.len(), 2, "g and h fail: {out:?}");
    for r in failed {
        assert_eq!(r.status, TaskStatus::Failed);
    }
    let texts = outcomes(&out);
    assert!(
        texts
            .iter()
            .any(|(_, _, m)| m.contains(&format!("task 0 of {f}")) && m.contains("raised")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|(_, _, m)| m.contains(&format!("task 0 of {g}")) && m.contains("failed")),
        "h names g: {texts:?}"
    );
    env.core.check_invariants();
}

#[test]
fn a_cancelled_producer_fails_its_dependent() {
    let mut env = TestEnv::new();
    let a = env.new_worker(1);
    let client = env.new_client();
    let (f, _) = env.submit(client, 1); // queued: no credit
    let (g, _) = submit_after(&mut env, client, f);
    let out = env.cancel(client, f, &[]);
    let got: Vec<_> = results(&out).into_iter().filter(|(p, _)| *p == g).collect();
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(got[0].1[0].status, TaskStatus::Failed);
    let text = String::from_utf8_lossy(&got[0].1[0].data).into_owned();
    assert!(text.contains("was cancelled"), "{text}");
    let out = env.credit(a, 1);
    assert!(assignments(&out).is_empty(), "{out:?}");
    env.core.check_invariants();
}

#[test]
fn a_cancelled_dependent_is_forgotten_and_its_producer_runs_on() {
    let mut env = TestEnv::new();
    let a = env.new_worker(1);
    let (client, f, producer) = producer_running_on(&mut env, a);
    let (g, _) = submit_after(&mut env, client, f);
    let out = env.cancel(client, g, &[]);
    assert!(results(&out).is_empty(), "{out:?}");
    env.core.check_invariants();
    // A new package may take the freed slot; f's completion must not touch it.
    let (other, _) = env.submit(client, 1);
    let out = env.complete(a, producer);
    assert!(results(&out).iter().all(|(p, _)| *p == f), "{out:?}");
    let out = env.credit(a, 1);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert!(got[0].1[0].inputs.is_empty(), "{other}'s task has no input");
    env.core.check_invariants();
}

#[test]
fn a_producer_whose_worker_is_lost_runs_again_and_its_dependent_still_waits() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let (client, f, producer) = producer_running_on(&mut env, a);
    submit_after(&mut env, client, f);
    env.lose_worker(a);
    let out = env.credit(b, 1);
    assert_eq!(
        tasks_of(&out, b),
        vec![producer],
        "f runs again, not g: {out:?}"
    );
    env.complete(b, producer);
    let out = env.credit(b, 1);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(got[0].1[0].inputs.len(), 1);
    env.core.check_invariants();
}

#[test]
fn a_dependency_on_an_acknowledged_or_foreign_task_is_refused() {
    let mut env = TestEnv::new();
    let a = env.new_worker(1);
    let (client, f, producer) = producer_running_on(&mut env, a);
    env.complete(a, producer);
    env.ack_all(client, f); // f is freed
    let (_, out) = env.submit_raw(client, Spec::tasks(1).after(f, 0));
    assert!(
        matches!(only_rejection(&out), RejectReason::UnknownDependency { .. }),
        "{out:?}"
    );
    let (f2, _) = env.submit(client, 1);
    let stranger = env.new_client_of(UserId(99));
    let (_, out) = env.submit_raw(stranger, Spec::tasks(1).after(f2, 0));
    assert!(
        matches!(only_rejection(&out), RejectReason::UnknownDependency { .. }),
        "another user's task is no dependency: {out:?}"
    );
    let (_, out) = env.submit_raw(client, Spec::tasks(1).after(f2, 1));
    assert!(matches!(out[..], [Action::Rejected { .. }]), "{out:?}");
    let (_, out) = env.submit_raw(client, Spec::tasks(1).after(f2, 0).replicas(2, 1));
    assert!(matches!(out[..], [Action::Rejected { .. }]), "{out:?}");
    let (_, out) = env.submit_raw(client, Spec::tasks(17).after(f2, 0));
    assert!(
        matches!(out[..], [Action::Rejected { .. }]),
        "at most 16 tasks: {out:?}"
    );
    env.core.check_invariants();
}

#[test]
fn a_restored_dependent_waits_for_its_restored_producer_or_fails_when_it_is_gone() {
    let mut env = TestEnv::new();
    let user = UserId(1);
    let restored = |package: u64, after: u64| RestoredPackage {
        package: PackageId(package),
        user,
        fn_hash: common::fn_hash(0),
        fn_code: common::fn_code(0),
        opts: PackageOpts {
            after,
            ..PackageOpts::default()
        },
        tasks: vec![Bytes::from_static(b"args")],
        done: Vec::new(),
        delivered: Vec::new(),
        calls: Vec::new(),
    };
    // 7 waits for 5 (restored, not done); 8 waited for 3, whose result was delivered.
    env.step(Event::Restore(Box::new(restored(5, 0))));
    env.step(Event::Restore(Box::new(restored(7, 5))));
    env.step(Event::Restore(Box::new(restored(8, 3))));
    let client = env.new_client_of(user);
    let out = env.attach(client, PackageId(8));
    let resent: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::Resend { results, .. } => Some(results.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(resent.len(), 1, "{out:?}");
    assert_eq!(resent[0].status, TaskStatus::Failed);
    let text = String::from_utf8_lossy(&resent[0].data);
    assert!(text.contains("master restarted"), "{text}");
    let a = env.new_worker(1);
    let out = env.credit(a, 1);
    let got = assignments(&out);
    assert_eq!(got.len(), 1, "only 5 runs: {out:?}");
    assert!(got[0].1[0].inputs.is_empty());
    let out = env.complete(a, got[0].1[0].task);
    assert!(assignments(&out).is_empty());
    let out = env.credit(a, 1);
    assert_eq!(
        assignments(&out)[0].1[0].inputs.len(),
        1,
        "7 runs now: {out:?}"
    );
    env.core.check_invariants();
}
