//! Scenarios: workers that return tasks, drain, or vanish.

mod common;

use common::{all_assigned, assignments, result_indices, tasks_of, TestEnv};

#[test]
fn worker_lost_mid_package_requeues_at_the_front_and_its_late_result_is_ignored() {
    let (mut env, client, _) = TestEnv::new().with_package(4);
    let (lost, other) = (env.new_worker(2), env.new_worker(1));
    let held = env.take(lost, 2);
    let done = env.take(other, 1)[0];
    env.complete(other, done);
    let (_, later) = env.submit(client, 1);
    assert!(all_assigned(&later).is_empty());
    assert!(env.lose_worker(lost).is_empty(), "no credits anywhere");
    assert_eq!(env.core.stats().queued, 4);
    let next = env.take(other, 2);
    assert_eq!(
        next, held,
        "requeued ahead of the rest, in assignment order"
    );
    assert!(next.iter().all(|&t| env.attempt(t) == 2), "next attempt");
    assert!(
        env.result(lost, held[0], 1).is_empty(),
        "late result of the lost attempt"
    );
    assert!(
        env.result(other, held[0], 1).is_empty(),
        "old attempt from the new holder too"
    );
    assert_eq!(env.core.stats().counters.stale_results, 2);
    assert_eq!(
        result_indices(&env.complete(other, held[0])),
        [env.index(held[0])]
    );
}

#[test]
fn worker_lost_hands_its_tasks_to_an_idle_worker_at_once() {
    let (mut env, _, _) = TestEnv::new().with_package(2);
    let (lost, idle) = (env.new_worker(2), env.new_worker(2));
    let held = env.take(lost, 2);
    env.credit(idle, 2);
    let out = env.lose_worker(lost);
    assert_eq!(tasks_of(&out, idle), held);
    assert_eq!(env.core.stats().workers, 1);
}

#[test]
fn drain_and_return_hand_tasks_to_another_worker() {
    let (mut env, _, _) = TestEnv::new().with_package(3);
    let (leaving, staying) = (env.new_worker(1), env.new_worker(1));
    let held = env.take(leaving, 3);
    env.drain(leaving);
    env.complete(leaving, held[0]);
    env.credit(staying, 2);
    let out = env.return_tasks(leaving, &held[1..]);
    assert_eq!(
        tasks_of(&out, staying),
        held[1..],
        "returned tasks keep their order"
    );
    assert!(tasks_of(&out, staying).iter().all(|&t| env.attempt(t) == 2));
    assert_eq!(env.core.worker_stats(leaving).unwrap().in_flight, 0);
    env.lose_worker(leaving);
    assert_eq!(env.core.stats().running, 2);
}

#[test]
fn return_withdraws_unused_credits_so_the_tasks_go_to_other_workers() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (hoarder, other) = (env.new_worker(1), env.new_worker(1));
    // Both asked for a deep prefetch while tasks were short; a package of 6 is split 3/3.
    env.credit(hoarder, 10);
    env.credit(other, 10);
    let (_, out) = env.submit(client, 6);
    let held = tasks_of(&out, hoarder);
    assert_eq!(held.len(), 3);
    assert_eq!(env.core.worker_stats(hoarder).unwrap().credits, 7);
    // The tasks turn out long: the hoarder keeps one and returns two. Its 7 unused credits are
    // withdrawn, so both go to the other worker, not straight back.
    let out = env.return_tasks(hoarder, &held[1..]);
    assert_eq!(env.core.worker_stats(hoarder).unwrap().credits, 0);
    assert_eq!(tasks_of(&out, other), held[1..]);
    assert!(tasks_of(&out, hoarder).is_empty());
    // Asking again works as before.
    env.complete(hoarder, held[0]);
    env.credit(hoarder, 1);
    assert_eq!(env.core.worker_stats(hoarder).unwrap().credits, 1);
}

#[test]
fn returned_tasks_go_to_the_front_of_their_priority() {
    let (mut env, _, _) = TestEnv::new().with_package(4);
    let w = env.new_worker(1);
    let held = env.take(w, 2);
    env.return_tasks(w, &held);
    let again = env.take(w, 4);
    let indices: Vec<u32> = again.iter().map(|&t| env.index(t)).collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    let attempts: Vec<u32> = again.iter().map(|&t| env.attempt(t)).collect();
    assert_eq!(attempts, [2, 2, 1, 1]);
}

#[test]
fn return_of_tasks_not_held_is_ignored() {
    let (mut env, _, _) = TestEnv::new().with_package(2);
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let ta = env.take(a, 1)[0];
    let tb = env.take(b, 1)[0];
    env.return_tasks(a, &[tb]);
    let stale_attempt = vec![(ta, 5)];
    env.step(rtpool_core::Event::Returned {
        worker: a,
        tasks: stale_attempt,
    });
    let stats = env.core.stats();
    assert_eq!((stats.running, stats.queued), (2, 0));
}

#[test]
fn worker_ids_may_be_reused_after_loss() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let w = env.new_worker(1);
    env.credit(w, 3);
    env.lose_worker(w);
    let out = env.step(rtpool_core::Event::WorkerJoined {
        labels: Default::default(),
        resources: Default::default(),
        worker: w,
        slots: 1,
        key: rtpool_core::WorkerKey(w.0),
    });
    assert!(out.is_empty());
    assert_eq!(
        env.core.worker_stats(w).unwrap().credits,
        0,
        "a new connection starts at 0"
    );
    env.credit(w, 1);
    let (_, out) = env.submit(client, 3);
    assert_eq!(assignments(&out), vec![(w, assignments(&out)[0].1.clone())]);
    assert_eq!(
        tasks_of(&out, w).len(),
        1,
        "one ring entry: the old one is dead"
    );
}

#[test]
fn many_workers_joining_and_leaving_while_idle_keep_dispatch_exact() {
    let mut env = TestEnv::new();
    for _ in 0..100 {
        let w = env.new_worker(1);
        env.credit(w, 1);
        env.lose_worker(w);
    }
    let w = env.new_worker(1);
    env.credit(w, 2);
    let client = env.new_client();
    let (_, out) = env.submit(client, 3);
    assert_eq!(tasks_of(&out, w).len(), 2);
}
