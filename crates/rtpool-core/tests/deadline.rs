//! Deadline scheduling: EDF order, priorities, fair turns between users, deadlines met and
//! missed, the drop policy, and admission control, all on a synthetic clock.

mod common;

use common::{assignments, outcomes, results, Spec, TestEnv};
use rtpool_core::{Action, PackageCounts, RejectReason, TaskStatus, UserId, WorkerId};

/// Gives the worker one credit at a time and returns the argument payloads (`"package:index"`)
/// in assignment order, completing each task right away.
fn order(env: &mut TestEnv, worker: WorkerId, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        let tasks = env.take(worker, 1);
        assert_eq!(tasks.len(), 1, "one credit, one task");
        got.push(String::from_utf8(env.args[&tasks[0]].to_vec()).unwrap());
        env.complete(worker, tasks[0]);
    }
    got
}

fn counts(actions: &[Action]) -> PackageCounts {
    match actions {
        [Action::StatusReply { counts, .. }] => *counts,
        other => panic!("not a status reply: {other:?}"),
    }
}

fn rejected(actions: &[Action]) -> RejectReason {
    match actions {
        [Action::Rejected { reason, .. }] => reason.clone(),
        other => panic!("not rejected: {other:?}"),
    }
}

#[test]
fn earliest_deadline_first_then_packages_without_one_in_order() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1)); // package 1: no deadline
    env.submit_spec(client, Spec::tasks(2).deadline_ms(500)); // package 2
    env.submit_spec(client, Spec::tasks(1).deadline_ms(100)); // package 3
    env.submit_spec(client, Spec::tasks(1)); // package 4: no deadline
    let w = env.new_worker(1);
    assert_eq!(order(&mut env, w, 5), ["3:0", "2:0", "2:1", "1:0", "4:0"]);
}

#[test]
fn a_higher_priority_goes_before_any_deadline() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).deadline_ms(10));
    env.submit_spec(client, Spec::tasks(1).priority(1));
    let w = env.new_worker(1);
    assert_eq!(order(&mut env, w, 2), ["2:0", "1:0"]);
}

#[test]
fn users_take_turns_so_a_flood_does_not_starve_another_user() {
    let mut env = TestEnv::new();
    let (flood, small) = (env.new_client_of(UserId(1)), env.new_client_of(UserId(2)));
    env.submit_spec(flood, Spec::tasks(1000));
    env.submit_spec(flood, Spec::tasks(1000).deadline_ms(5));
    env.submit_spec(small, Spec::tasks(2));
    let w = env.new_worker(1);
    // The flood's earliest deadline goes first within its turns, but the small user gets
    // every other task.
    assert_eq!(order(&mut env, w, 4), ["2:0", "3:0", "2:1", "3:1"]);
    assert_eq!(order(&mut env, w, 1), ["2:2"]);
}

#[test]
fn fairness_holds_for_three_users_over_many_assignments() {
    let mut env = TestEnv::new();
    let clients: Vec<_> = (1..=3).map(|u| env.new_client_of(UserId(u))).collect();
    for (i, &c) in clients.iter().enumerate() {
        env.submit_spec(c, Spec::tasks(100 * (i + 1)));
    }
    let w = env.new_worker(1);
    let got = order(&mut env, w, 90);
    for p in 1..=3 {
        let n = got
            .iter()
            .filter(|a| a.starts_with(&format!("{p}:")))
            .count();
        assert_eq!(n, 30, "user {p} got {n} of 90: {got:?}");
    }
}

#[test]
fn results_are_scored_against_the_deadline_with_their_lateness() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(3).deadline_ms(50));
    let (w, tasks) = env.new_worker_taking(2);
    env.advance(10);
    let on_time = env.complete(w, tasks[0]);
    assert_eq!(results(&on_time)[0].1[0].late_us, 0);
    env.advance(70);
    let late = env.complete(w, tasks[1]);
    assert_eq!(
        results(&late)[0].1[0].late_us,
        30_000,
        "80 ms after a 50 ms deadline"
    );
    let c = counts(&env.status(client, package));
    assert_eq!((c.met, c.missed, c.done, c.queued), (1, 1, 2, 1));
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.deadlines_met,
            stats.counters.deadlines_missed
        ),
        (1, 1)
    );
    assert_eq!(
        stats.counters.deadline_dropped, 0,
        "on_miss = run: the late task still ran"
    );
}

#[test]
fn without_a_deadline_nothing_is_scored() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (w, task) = env.new_worker_running();
    env.advance(10_000);
    let out = env.complete(w, task);
    assert_eq!(results(&out)[0].1[0].late_us, 0);
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.deadlines_met,
            stats.counters.deadlines_missed
        ),
        (0, 0)
    );
}

#[test]
fn on_miss_drop_fails_every_unfinished_task_at_the_deadline() {
    let mut env = TestEnv::new();
    env.auto_ack = false;
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(3).deadline_ms(50).drop_late());
    let (w, running) = env.new_worker_running();
    assert_eq!(
        env.core.next_timer().map(|t| t.0),
        Some(env.now.0 + 50_000_000)
    );
    assert!(env.tick_after(49).is_empty(), "not yet");
    let out = env.tick_after(1);
    let got: Vec<(u32, TaskStatus)> = outcomes(&out).iter().map(|o| (o.0, o.1)).collect();
    assert_eq!(
        got,
        [
            (0, TaskStatus::Missed),
            (1, TaskStatus::Missed),
            (2, TaskStatus::Missed)
        ]
    );
    assert!(outcomes(&out)[0].2.contains("deadline passed"));
    assert_eq!(common::aborts(&out), [(w, running, 1)]);
    let c = counts(&env.status(client, package));
    assert_eq!((c.missed, c.met, c.done), (3, 0, 3));
    assert_eq!(env.core.stats().counters.deadline_dropped, 3);
    // The worker's late answer is not a second result.
    let late = env.complete(w, running);
    assert!(results(&late).is_empty(), "{late:?}");
}

#[test]
fn the_drop_timer_goes_with_a_package_that_finished_in_time() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).deadline_ms(50).drop_late());
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    assert_eq!(env.core.stats().packages, 0);
    assert_eq!(env.core.next_timer(), None, "disarmed with the package");
}

#[test]
fn on_miss_drop_does_not_start_a_task_its_estimate_says_is_too_late() {
    let mut env = TestEnv::new();
    env.learn(7, 40_000, 5);
    let client = env.new_client();
    env.submit_spec(
        client,
        Spec::tasks(2).function(7).deadline_ms(100).drop_late(),
    );
    env.advance(70);
    let w = env.new_worker(1);
    let out = env.credit(w, 2);
    assert!(
        assignments(&out).is_empty(),
        "30 ms left, 40 ms needed: {out:?}"
    );
    let got = outcomes(&out);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|o| o.1 == TaskStatus::Missed));
    assert!(
        got[0].2.contains("could not finish by its deadline"),
        "{}",
        got[0].2
    );
    assert_eq!(env.core.stats().counters.deadline_dropped, 2);
}

#[test]
fn on_miss_run_starts_late_tasks_anyway() {
    let mut env = TestEnv::new();
    env.learn(7, 40_000, 5);
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).function(7).deadline_ms(10));
    let w = env.new_worker(1);
    assert_eq!(env.take(w, 1).len(), 1);
}

#[test]
fn the_estimate_is_learned_from_ok_results() {
    let mut env = TestEnv::new();
    env.learn(3, 10_000, 20);
    let est = env
        .core
        .estimate(&common::fn_hash(3))
        .expect("learned from 20 results");
    assert_eq!(est.samples, 20);
    assert_eq!(est.mean_us, 10_000);
    assert!((10_000..=12_500).contains(&est.p95_us), "{est:?}");
    assert!(env.core.estimate(&common::fn_hash(4)).is_none());
}

#[test]
fn admission_refuses_what_cannot_finish_in_time_and_says_by_how_much() {
    let mut env = TestEnv::new();
    env.learn(5, 10_000, 10);
    let client = env.new_client();
    for _ in 0..2 {
        let w = env.new_worker(1);
        env.credit(w, 0);
    }
    // 10 tasks of 10 ms on 2 slots: 9 x 10 ms / 2 + one p95 (10-12.5 ms) > 30 ms.
    let (_, out) = env.submit_raw(client, Spec::tasks(10).function(5).deadline_ms(30).admit());
    let reason = rejected(&out);
    let RejectReason::Admission {
        tasks,
        finish_us,
        deadline_us,
        per_task_us,
        slots,
        backlog_us,
        ..
    } = reason.clone()
    else {
        panic!("{reason:?}");
    };
    assert_eq!(
        (tasks, deadline_us, per_task_us, slots, backlog_us),
        (10, 30_000, 10_000, 2, 0)
    );
    assert!((55_000..=57_500).contains(&finish_us), "{finish_us}");
    let message = reason.to_string();
    assert!(message.contains("short by"), "{message}");
    assert_eq!(env.core.stats().counters.admission_refused, 1);
    assert_eq!(env.core.stats().packages, 0, "nothing of it was kept");
    // 4 tasks: 3 x 10 / 2 + p95 <= 30 ms.
    let (_, out) = env.submit_spec(client, Spec::tasks(4).function(5).deadline_ms(30).admit());
    assert!(matches!(out[0], Action::Accepted { .. }), "{out:?}");
}

#[test]
fn admission_counts_the_work_ahead_at_the_same_priority_or_higher() {
    let mut env = TestEnv::new();
    env.learn(5, 10_000, 10);
    let client = env.new_client();
    let w = env.new_worker(2);
    env.credit(w, 0);
    // 20 queued tasks of 10 ms at priority 0: 100 ms of work for 2 slots.
    env.submit_spec(client, Spec::tasks(20).function(5));
    let urgent = Spec::tasks(1).function(5).deadline_ms(50).admit();
    let (_, out) = env.submit_raw(client, urgent.clone());
    let reason = rejected(&out);
    assert!(
        matches!(
            reason,
            RejectReason::Admission {
                backlog_us: 200_000,
                ..
            }
        ),
        "{reason:?}"
    );
    // At a higher priority the queued work is not ahead of it.
    let (_, out) = env.submit_spec(client, urgent.priority(1));
    assert!(matches!(out[0], Action::Accepted { .. }), "{out:?}");
}

#[test]
fn admission_with_no_worker_refuses_and_with_no_estimate_admits() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let spec = Spec::tasks(1).function(9).deadline_ms(50).admit();
    let (_, out) = env.submit_raw(client, spec.clone());
    let reason = rejected(&out);
    assert_eq!(
        reason,
        RejectReason::NoWorkerSlots {
            deadline_us: 50_000
        }
    );
    assert!(reason.to_string().contains("no worker slot"), "{reason}");
    let w = env.new_worker(1);
    env.credit(w, 0);
    let (_, out) = env.submit_spec(client, spec);
    assert!(
        matches!(out[0], Action::Accepted { .. }),
        "nothing known of function 9 yet: admitted, {out:?}"
    );
}

#[test]
fn a_draining_worker_counts_no_slots() {
    let mut env = TestEnv::new();
    env.learn(5, 10_000, 10);
    let client = env.new_client();
    let w = env.new_worker(4);
    env.drain(w);
    let (_, out) = env.submit_raw(client, Spec::tasks(1).function(5).deadline_ms(500).admit());
    assert!(matches!(rejected(&out), RejectReason::NoWorkerSlots { .. }));
}

#[test]
fn contradictory_options_are_refused_with_a_reason() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    for (spec, words) in [
        (
            Spec::tasks(1).replicas(2, 3),
            "quorum is 3 but replicas is 2",
        ),
        (Spec::tasks(1).replicas(17, 1), "at most 16"),
        (Spec::tasks(1).admit(), "admit needs a deadline"),
        (Spec::tasks(1).drop_late(), "needs a deadline"),
        (
            Spec::tasks(1).replicas(3, 1).max_copies(2),
            "max_copies is 2",
        ),
    ] {
        let (_, out) = env.submit_raw(client, spec);
        let reason = rejected(&out);
        assert!(
            matches!(reason, RejectReason::InvalidOptions(_)),
            "{reason:?}"
        );
        assert!(
            reason.to_string().contains(words),
            "{reason} lacks {words:?}"
        );
    }
    assert_eq!(env.core.stats().packages, 0);
}

#[test]
fn requeued_work_keeps_its_deadline_order() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(2).deadline_ms(500));
    env.submit_spec(client, Spec::tasks(1).deadline_ms(100));
    let (w, first) = env.new_worker_taking(1);
    assert_eq!(env.args[&first[0]].as_ref(), b"2:0");
    env.lose_worker(w);
    let w2 = env.new_worker(1);
    assert_eq!(order(&mut env, w2, 3), ["2:0", "1:0", "1:1"]);
}

#[test]
fn cancelling_a_deadline_package_leaves_the_others_in_order() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (p1, _) = env.submit_spec(client, Spec::tasks(3).deadline_ms(100));
    env.submit_spec(client, Spec::tasks(1).deadline_ms(200));
    env.cancel(client, p1, &[1]);
    let w = env.new_worker(1);
    assert_eq!(order(&mut env, w, 3), ["1:0", "1:2", "2:0"]);
}
