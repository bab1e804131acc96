//! Scenarios: how queued tasks meet worker credits.

mod common;

use common::{all_assigned, assignments, fn_code, fn_hash, tasks_of, Spec, TestEnv};
use rtpool_core::Action;

#[test]
fn two_tasks_two_idle_workers_go_to_different_workers() {
    let mut env = TestEnv::new();
    let [a, b] = env.new_idle_workers([(2, 2), (2, 2)]);
    let client = env.new_client();
    let (_, out) = env.submit(client, 2);
    assert_eq!(tasks_of(&out, a).len(), 1, "{out:?}");
    assert_eq!(tasks_of(&out, b).len(), 1, "{out:?}");
}

#[test]
fn accepted_comes_before_assign() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    env.credit(w, 1);
    let client = env.new_client();
    let (_, out) = env.submit(client, 1);
    assert!(matches!(out[0], Action::Accepted { .. }));
    assert!(matches!(out[1], Action::Assign { .. }));
    assert_eq!(out.len(), 2);
}

#[test]
fn one_assign_per_worker_per_event_with_all_its_tasks() {
    let mut env = TestEnv::new();
    let [a, b] = env.new_idle_workers([(4, 3), (4, 2)]);
    let client = env.new_client();
    let (_, out) = env.submit(client, 10);
    let batches = assignments(&out);
    assert_eq!(batches.len(), 2, "{batches:?}");
    assert_eq!(batches[0].0, a);
    assert_eq!(batches[0].1.len(), 3);
    assert_eq!(batches[1].0, b);
    assert_eq!(batches[1].1.len(), 2);
    assert_eq!(env.core.stats().queued, 5);
}

#[test]
fn a_worker_never_gets_more_tasks_than_its_credits() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    let client = env.new_client();
    env.submit(client, 10);
    assert!(all_assigned(&env.credit(w, 0)).is_empty());
    assert_eq!(env.take(w, 3).len(), 3);
    let stats = env.core.worker_stats(w).unwrap();
    assert_eq!((stats.credits, stats.in_flight), (0, 3));
    let (_, out) = env.submit(client, 5);
    assert!(all_assigned(&out).is_empty(), "no credits left: {out:?}");
    // Results return no credits by themselves.
    let first = *env.assigned.keys().next().unwrap();
    assert!(all_assigned(&env.complete(w, first)).is_empty());
    assert_eq!(env.take(w, 1).len(), 1);
}

#[test]
fn no_task_is_assigned_without_a_worker_and_credits_wait_for_tasks() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (_, out) = env.submit(client, 3);
    assert_eq!(out.len(), 1);
    let w = env.new_worker(1);
    assert_eq!(env.take(w, 5).len(), 3);
    assert_eq!(env.core.worker_stats(w).unwrap().credits, 2);
    let (_, out) = env.submit(client, 4);
    assert_eq!(
        tasks_of(&out, w).len(),
        2,
        "credits granted earlier are used as tasks arrive"
    );
}

#[test]
fn fast_worker_that_recredits_quickly_takes_more_tasks() {
    let mut env = TestEnv::new();
    let (fast, slow) = (env.new_worker(1), env.new_worker(1));
    let client = env.new_client();
    env.submit(client, 20);
    let mut count = [0usize; 2];
    let mut slow_task = env.take(slow, 1);
    count[1] += slow_task.len();
    let mut fast_task = env.take(fast, 1);
    count[0] += fast_task.len();
    for round in 0..15 {
        env.advance(1);
        env.complete(fast, fast_task[0]);
        fast_task = env.take(fast, 1);
        count[0] += fast_task.len();
        if round % 5 == 4 {
            env.complete(slow, slow_task[0]);
            slow_task = env.take(slow, 1);
            count[1] += slow_task.len();
        }
    }
    assert_eq!(count, [16, 4]);
}

#[test]
fn higher_priority_runs_first() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(2).priority(-1));
    env.submit_spec(client, Spec::tasks(2));
    env.submit_spec(client, Spec::tasks(2).priority(7));
    let w = env.new_worker(1);
    let order: Vec<String> = all_assigned(&env.credit(w, 6))
        .into_iter()
        .map(|t| String::from_utf8(env.args[&t].to_vec()).unwrap())
        .collect();
    assert_eq!(order, ["3:0", "3:1", "2:0", "2:1", "1:0", "1:1"]);
}

#[test]
fn fifo_within_one_priority_across_packages() {
    let mut env = TestEnv::new();
    let (c1, c2) = (env.new_client(), env.new_client());
    env.submit(c1, 2);
    env.submit(c2, 1);
    env.submit(c1, 1);
    let w = env.new_worker(1);
    let order: Vec<String> = all_assigned(&env.credit(w, 4))
        .into_iter()
        .map(|t| String::from_utf8(env.args[&t].to_vec()).unwrap())
        .collect();
    assert_eq!(order, ["1:0", "1:1", "2:0", "3:0"]);
}

#[test]
fn code_is_sent_once_per_worker_per_hash() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(3).function(1));
    env.submit_spec(client, Spec::tasks(1).function(2));
    let out = env.credit(a, 2);
    let sent: Vec<_> = assignments(&out)[0]
        .1
        .iter()
        .map(|t| t.fn_code.clone())
        .collect();
    assert_eq!(sent, [Some(fn_code(1)), None]);
    let out = env.credit(b, 1);
    let first_b = &assignments(&out)[0].1[0];
    assert_eq!(first_b.fn_hash, fn_hash(1));
    assert_eq!(
        first_b.fn_code,
        Some(fn_code(1)),
        "another worker gets the code too"
    );
    let out = env.credit(a, 2);
    let tasks = &assignments(&out)[0].1;
    assert_eq!(tasks[0].fn_hash, fn_hash(2));
    assert_eq!(tasks[0].fn_code, Some(fn_code(2)), "a new hash for a");
    assert!(tasks.iter().all(|t| t.attempt == 1));
}

#[test]
fn code_cache_survives_the_function_being_dropped_and_resubmitted() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    let client = env.new_client();
    env.submit(client, 1);
    let task = env.take(w, 1)[0];
    env.complete(w, task);
    assert_eq!(env.core.stats().functions, 0);
    assert!(env.core.function_code(&fn_hash(0)).is_none());
    env.submit(client, 1);
    assert_eq!(env.core.function_code(&fn_hash(0)), Some(&fn_code(0)));
    let out = env.credit(w, 1);
    assert_eq!(
        assignments(&out)[0].1[0].fn_code,
        None,
        "the worker keeps every code it got"
    );
}

#[test]
fn draining_worker_gets_nothing_more() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    env.credit(w, 5);
    env.drain(w);
    let client = env.new_client();
    let (_, out) = env.submit(client, 3);
    assert!(all_assigned(&out).is_empty());
    assert!(
        all_assigned(&env.credit(w, 5)).is_empty(),
        "credits after drain are ignored"
    );
    assert_eq!(env.core.worker_stats(w).unwrap().credits, 0);
    assert!(env.core.worker_stats(w).unwrap().draining);
}

#[test]
fn credits_saturate_instead_of_overflowing() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    env.credit(w, u32::MAX);
    env.credit(w, 10);
    assert_eq!(env.core.worker_stats(w).unwrap().credits, u32::MAX);
}

#[test]
fn events_for_unknown_workers_are_ignored() {
    let mut env = TestEnv::new();
    let ghost = rtpool_core::WorkerId(999);
    let client = env.new_client();
    env.submit(client, 2);
    assert!(env.credit(ghost, 5).is_empty());
    assert!(env.drain(ghost).is_empty());
    assert!(env.lose_worker(ghost).is_empty());
    assert_eq!(env.core.stats().queued, 2);
}

#[test]
fn rejoining_worker_id_is_ignored_while_connected() {
    let mut env = TestEnv::new();
    let w = env.new_worker(1);
    env.credit(w, 2);
    assert!(env
        .step(rtpool_core::Event::WorkerJoined {
            labels: Default::default(),
            resources: Default::default(),
            worker: w,
            slots: 9,
            key: rtpool_core::WorkerKey(w.0),
        })
        .is_empty());
    assert_eq!(env.core.worker_stats(w).unwrap().credits, 2);
    assert_eq!(env.core.stats().workers, 1);
}
