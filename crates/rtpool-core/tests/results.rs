//! Scenarios: worker results, their delivery to clients, and freeing what was delivered.

mod common;

use common::{all_assigned, result_indices, results, TestEnv};
use rtpool_core::{Action, Event, TaskId, TaskStatus};

#[test]
fn timings_are_computed_from_now() {
    let (mut env, client, package) = TestEnv::new().with_package(1);
    env.advance(5);
    let (w, task) = env.new_worker_running();
    env.advance(12);
    let out = env.complete(w, task);
    // The auto-ack of the test env frees the package right after the result is sent.
    let [Action::SendResults {
        client: c,
        package: p,
        results,
        ..
    }, Action::PackageFreed {
        package: freed,
        expired: false,
        ..
    }] = out.as_slice()
    else {
        panic!("one SendResults then PackageFreed expected: {out:?}");
    };
    assert_eq!((*c, *p, *freed), (Some(client), package, package));
    let r = &results[0];
    assert_eq!((r.queue_us, r.worker_us), (5_000, 12_000));
    assert_eq!((r.exec_us, r.wait_us, r.flush_us), (1_000, 200, 300));
    assert_eq!((r.index, r.status), (0, TaskStatus::Ok));
    assert_eq!(r.data, env.args[&task], "the payload is passed through");
}

#[test]
fn package_is_freed_once_its_results_are_delivered() {
    let (mut env, client, package) = TestEnv::new().with_package(2);
    let (w, tasks) = env.new_worker_taking(2);
    env.complete(w, tasks[0]);
    assert_eq!(env.core.stats().packages, 1);
    env.complete(w, tasks[1]);
    let stats = env.core.stats();
    assert_eq!((stats.packages, stats.tasks, stats.functions), (0, 0, 0));
    assert_eq!(
        (stats.running, stats.queued, stats.counters.delivered),
        (0, 0, 2)
    );
    assert_eq!(
        env.status(client, package),
        [Action::UnknownPackage { client, package }]
    );
    assert_eq!(
        env.cancel(client, package, &[]),
        [Action::UnknownPackage { client, package }]
    );
}

#[test]
fn results_are_grouped_per_package_in_completion_order() {
    let (mut env, client, p1) = TestEnv::new().with_package(3);
    let (p2, _) = env.submit(client, 1);
    let (w, tasks) = env.new_worker_taking(4);
    let order = [tasks[2], tasks[3], tasks[0]];
    let batch = order.iter().map(|&t| env.outcome(t, 1)).collect();
    let out = env.step(Event::Results {
        worker: w,
        results: batch,
    });
    let grouped: Vec<_> = results(&out)
        .into_iter()
        .map(|(p, rs)| (p, rs.iter().map(|r| r.index).collect::<Vec<_>>()))
        .collect();
    assert_eq!(grouped, [(p1, vec![2, 0]), (p2, vec![0])]);
    assert_eq!(
        env.core.stats().packages,
        1,
        "p2 is finished, p1 still runs a task"
    );
}

#[test]
fn result_from_the_wrong_worker_is_ignored() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    let task = env.take(a, 1)[0];
    assert!(env.complete(b, task).is_empty());
    assert_eq!(env.core.stats().counters.stale_results, 1);
    assert_eq!(env.core.stats().running, 1, "still running on a");
    assert_eq!(result_indices(&env.complete(a, task)), [0]);
}

#[test]
fn duplicate_result_is_ignored_and_delivered_once() {
    let (mut env, _, _) = TestEnv::new().with_package(2);
    let (w, tasks) = env.new_worker_taking(2);
    let twice = vec![env.outcome(tasks[0], 1), env.outcome(tasks[0], 1)];
    let out = env.step(Event::Results {
        worker: w,
        results: twice,
    });
    assert_eq!(result_indices(&out), [0]);
    assert!(
        env.complete(w, tasks[0]).is_empty(),
        "again, in a later event"
    );
    assert_eq!(env.core.stats().counters.stale_results, 2);
    assert_eq!(env.core.stats().counters.delivered, 1);
}

#[test]
fn result_with_a_wrong_attempt_or_unknown_id_is_ignored() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (w, task) = env.new_worker_running();
    assert!(env.result(w, task, 2).is_empty());
    assert!(env.result(w, task, 0).is_empty());
    assert!(env.result(w, TaskId(task.0 ^ (1 << 40)), 1).is_empty());
    assert!(env.result(w, TaskId(u64::MAX), 1).is_empty());
    assert_eq!(env.core.stats().counters.stale_results, 4);
    assert_eq!(env.core.stats().running, 1);
}

#[test]
fn result_for_a_reused_slot_does_not_reach_the_new_task() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let w = env.new_worker(1);
    env.submit(client, 1);
    let old = env.take(w, 1)[0];
    env.complete(w, old);
    env.submit(client, 1);
    let new = env.take(w, 1)[0];
    assert_eq!(old.0 as u32, new.0 as u32, "the slot is reused");
    assert!(env.result(w, old, 1).is_empty(), "the old id is stale");
    assert_eq!(env.core.stats().running, 1);
}

#[test]
fn error_status_is_passed_through() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (w, task) = env.new_worker_running();
    let mut outcome = env.outcome(task, 1);
    outcome.status = TaskStatus::Error;
    let out = env.step(Event::Results {
        worker: w,
        results: vec![outcome],
    });
    assert_eq!(results(&out)[0].1[0].status, TaskStatus::Error);
    assert_eq!(env.core.stats().packages, 0);
}

#[test]
fn results_from_an_unknown_worker_are_stale() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let w = env.new_worker(1);
    let task = all_assigned(&env.credit(w, 1))[0];
    assert!(env.result(rtpool_core::WorkerId(404), task, 1).is_empty());
    assert_eq!(env.core.stats().counters.stale_results, 1);
}
