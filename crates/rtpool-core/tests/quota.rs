//! Scenarios: compute-time quotas. Submissions of a user with no time left are rejected; every
//! accepted result charges its measured execution time to its package's user; a user going
//! below zero has its queued and running tasks failed (running ones aborted), and no one else.

mod common;

use common::{aborts, assert_freed_last, only_rejection, outcomes, results, Spec, TestEnv};
use rtpool_core::{
    Action, Event, RejectReason, TaskId, TaskStatus, UserId, WorkerId, REPORT_MARGIN_US,
};

const ALICE: UserId = UserId(1);
const BOB: UserId = UserId(2);

/// Alice, with `quota_us` of compute time left, submits one task; a new one-slot worker takes
/// it: that worker and the task.
fn one_task_of_alice(env: &mut TestEnv, quota_us: i64) -> (WorkerId, TaskId) {
    let alice = env.new_client_of(ALICE);
    env.set_quota(ALICE, Some(quota_us));
    env.submit(alice, 1);
    let (w, tasks) = env.new_worker_taking(1);
    assert_eq!(tasks.len(), 1, "the worker runs alice's task");
    (w, tasks[0])
}

#[test]
fn submit_is_rejected_when_the_quota_is_exhausted_and_accepted_otherwise() {
    let mut env = TestEnv::new();
    let (alice, bob) = (env.new_client_of(ALICE), env.new_client_of(BOB));
    assert!(env.set_quota(ALICE, Some(0)).is_empty());
    let (_, out) = env.submit_raw(alice, Spec::tasks(1));
    assert_eq!(
        only_rejection(&out),
        RejectReason::QuotaExhausted { over_us: 0 }
    );
    env.set_quota(ALICE, Some(-5));
    let (_, out) = env.submit_raw(alice, Spec::tasks(1));
    assert_eq!(
        only_rejection(&out),
        RejectReason::QuotaExhausted { over_us: 5 }
    );
    assert_eq!(env.core.stats().packages, 0);
    env.submit(bob, 1);
    env.set_quota(ALICE, Some(1));
    env.submit(alice, 1);
    env.set_quota(ALICE, None);
    env.submit(alice, 1);
    assert_eq!(env.core.remaining_us(ALICE), None, "unlimited");
    assert_eq!(env.core.stats().packages, 3);
}

#[test]
fn results_charge_their_exec_us_to_the_packages_user_and_take_usage_resets() {
    let mut env = TestEnv::new();
    let (alice, bob) = (env.new_client_of(ALICE), env.new_client_of(BOB));
    env.set_quota(ALICE, Some(10_000));
    env.submit(alice, 2);
    env.submit(bob, 1);
    let (w, mut tasks) = env.new_worker_taking(3);
    // Users take turns (alice, bob, alice): put alice's two first.
    tasks.sort_by_key(|t| !env.args[t].starts_with(b"1:"));
    env.complete_exec(w, tasks[0], 1_500);
    env.complete_exec(w, tasks[1], 2_000);
    env.complete_exec(w, tasks[2], 700);
    assert_eq!(env.core.remaining_us(ALICE), Some(6_500));
    assert_eq!(env.core.remaining_us(BOB), None, "unlimited, still charged");
    assert_eq!(env.core.take_usage(), [(ALICE, 3_500), (BOB, 700)]);
    assert_eq!(env.core.take_usage(), [], "taken");
}

#[test]
fn stale_results_are_not_charged() {
    let mut env = TestEnv::new();
    let (w, task) = one_task_of_alice(&mut env, 10_000);
    env.result(w, task, 7);
    assert_eq!(env.core.stats().counters.stale_results, 1);
    assert_eq!(env.core.take_usage(), []);
    assert_eq!(env.core.remaining_us(ALICE), Some(10_000));
}

#[test]
fn going_below_zero_fails_queued_and_running_tasks_of_that_user_only() {
    let mut env = TestEnv::new();
    let (alice, bob) = (env.new_client_of(ALICE), env.new_client_of(BOB));
    env.set_quota(ALICE, Some(1_500));
    let (package, _) = env.submit(alice, 4);
    let (w, tasks) = env.new_worker_taking(3);
    // After the assignment: users take turns, so it would have taken one of the three.
    env.submit(bob, 2);
    assert!(
        tasks.iter().all(|&t| env.args[&t].starts_with(b"1:")),
        "alice's first three"
    );
    env.complete_exec(w, tasks[0], 1_000);
    assert_eq!(env.core.remaining_us(ALICE), Some(500), "still above zero");
    let out = env.complete_exec(w, tasks[1], 1_000);
    let got: Vec<(u32, TaskStatus)> = outcomes(&out).into_iter().map(|(i, s, _)| (i, s)).collect();
    assert_eq!(
        got,
        [
            (1, TaskStatus::Ok),
            (2, TaskStatus::Quota),
            (3, TaskStatus::Quota)
        ],
        "the charged result itself is delivered; the running and the queued one fail"
    );
    let message = &outcomes(&out)[1].2;
    assert!(message.contains("quota ran out"), "{message}");
    assert_eq!(aborts(&out), [(w, tasks[2], 1)]);
    assert_freed_last(&out, package);
    let stats = env.core.stats();
    assert_eq!(
        (stats.counters.quota_failed, stats.queued, stats.running),
        (2, 2, 0)
    );
    assert_eq!(env.core.remaining_us(ALICE), Some(-500));
    // Bob's tasks run as usual.
    let (w2, bobs) = env.new_worker_taking(2);
    assert_eq!(bobs.len(), 2);
    for task in bobs {
        assert_eq!(outcomes(&env.complete(w2, task))[0].1, TaskStatus::Ok);
    }
    // The aborted task's late answer is dropped; its package is gone, so it is not charged.
    assert!(env.complete_exec(w, tasks[2], 9_999).is_empty());
    assert_eq!(env.core.take_usage(), [(ALICE, 2_000), (BOB, 2_000)]);
    assert_eq!(env.core.stats().tasks, 0);
    let (_, out) = env.submit_raw(alice, Spec::tasks(1));
    assert_eq!(
        only_rejection(&out),
        RejectReason::QuotaExhausted { over_us: 500 }
    );
}

#[test]
fn set_quota_below_zero_fails_the_users_tasks_at_once() {
    let mut env = TestEnv::new();
    let (alice, bob) = (env.new_client_of(ALICE), env.new_client_of(BOB));
    env.submit(alice, 2);
    env.submit(bob, 1);
    let (w, running) = env.new_worker_running();
    let out = env.set_quota(ALICE, Some(-1));
    let got: Vec<(u32, TaskStatus)> = outcomes(&out).into_iter().map(|(i, s, _)| (i, s)).collect();
    assert_eq!(got, [(0, TaskStatus::Quota), (1, TaskStatus::Quota)]);
    assert_eq!(aborts(&out), [(w, running, 1)]);
    let stats = env.core.stats();
    assert_eq!(
        (stats.counters.quota_failed, stats.queued),
        (2, 1),
        "bob's task waits"
    );
    assert!(
        env.set_quota(ALICE, Some(-2)).is_empty(),
        "nothing left to fail"
    );
}

#[test]
fn set_quota_subtracts_usage_not_yet_taken() {
    let mut env = TestEnv::new();
    let (w, task) = one_task_of_alice(&mut env, 10_000);
    env.complete_exec(w, task, 1_000);
    // The shell's figure predates the charge: the core subtracts what it has not taken yet.
    env.set_quota(ALICE, Some(10_000));
    assert_eq!(env.core.remaining_us(ALICE), Some(9_000));
    assert_eq!(env.core.take_usage(), [(ALICE, 1_000)]);
    env.set_quota(ALICE, Some(9_000));
    assert_eq!(env.core.remaining_us(ALICE), Some(9_000));
}

#[test]
fn a_worker_reporting_more_than_the_master_saw_is_charged_what_the_master_saw() {
    let mut env = TestEnv::new();
    let alice = env.new_client_of(ALICE);
    env.set_quota(ALICE, Some(1_000_000_000));
    env.submit(alice, 3);
    let (w, tasks) = env.new_worker_taking(3);
    // The master saw 10 ms from assignment to result; the worker claims 2^63-1 us.
    env.advance(10);
    let mut lie = env.outcome(tasks[0], env.attempt(tasks[0]));
    lie.exec_us = i64::MAX as u64;
    let out = env.step(Event::Results {
        worker: w,
        results: vec![lie],
    });
    let allowed = 10_000 + REPORT_MARGIN_US;
    assert_eq!(
        out.iter()
            .filter(|a| matches!(a, Action::Overreported { .. }))
            .collect::<Vec<_>>(),
        [&Action::Overreported {
            worker: w,
            task: tasks[0],
            reported_us: i64::MAX as u64,
            allowed_us: allowed,
        }]
    );
    let sent: Vec<_> = results(&out).into_iter().flat_map(|(_, rs)| rs).collect();
    assert_eq!(sent.len(), 1, "{out:?}");
    assert_eq!(
        sent[0].exec_us, allowed,
        "the client sees the clamped time too"
    );
    assert_eq!(sent[0].worker_us, 10_000);
    // The prefetch wait and batching delay are bounded the same way, and a second
    // over-report on the connection is counted but sends no second action.
    let mut lie = env.outcome(tasks[1], env.attempt(tasks[1]));
    (lie.exec_us, lie.wait_us, lie.flush_us) = (5_000, u64::MAX, u64::MAX);
    let out = env.step(Event::Results {
        worker: w,
        results: vec![lie],
    });
    assert!(
        !out.iter().any(|a| matches!(a, Action::Overreported { .. })),
        "{out:?}"
    );
    let sent: Vec<_> = results(&out).into_iter().flat_map(|(_, rs)| rs).collect();
    assert_eq!((sent[0].wait_us, sent[0].flush_us), (allowed, allowed));
    assert_eq!(sent[0].exec_us, 5_000, "within the bound: kept as reported");
    // A report within the bound is charged as reported.
    let mut honest = env.outcome(tasks[2], env.attempt(tasks[2]));
    honest.exec_us = 4_000;
    env.step(Event::Results {
        worker: w,
        results: vec![honest],
    });
    assert_eq!(env.core.stats().counters.overreported_results, 2);
    assert_eq!(env.core.take_usage(), [(ALICE, allowed + 5_000 + 4_000)]);
}

#[test]
fn a_cancelled_task_is_charged_at_most_what_the_master_saw_either() {
    let mut env = TestEnv::new();
    let alice = env.new_client_of(ALICE);
    let (package, _) = env.submit(alice, 1);
    let (w, task) = env.new_worker_running();
    env.advance(3);
    env.cancel(alice, package, &[0]);
    env.advance(2);
    let mut lie = env.outcome(task, env.attempt(task));
    lie.exec_us = u64::MAX;
    env.step(Event::Results {
        worker: w,
        results: vec![lie],
    });
    let usage = env.core.take_usage();
    assert!(
        usage.iter().all(|&(_, us)| us <= 5_000 + REPORT_MARGIN_US),
        "{usage:?}"
    );
}
