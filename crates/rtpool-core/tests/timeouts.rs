//! Scenarios: time limits. The master fails a running attempt at its limit plus the grace
//! (capped by `max_exec_ns`), tells the worker to abort it, and drops the worker's late answer.

mod common;

use common::{aborts, outcomes, Spec, TestEnv};
use rtpool_core::{Action, CoreConfig, Instant, TaskStatus};

const GRACE_MS: u64 = 2_000;

fn ns(ms: u64) -> u64 {
    ms * 1_000_000
}

#[test]
fn timer_fires_only_after_the_limit_plus_grace() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).timeout_ms(100));
    let w = env.new_worker(1);
    let start = env.now;
    let task = env.take(w, 1)[0];
    assert_eq!(
        env.core.next_timer(),
        Some(Instant(start.0 + ns(100 + GRACE_MS)))
    );
    assert!(
        env.tick_after(100 + GRACE_MS - 1).is_empty(),
        "the grace has not passed"
    );
    assert_eq!(env.core.stats().running, 1);
    let out = env.tick_after(1);
    assert_eq!(outcomes(&out).len(), 1);
    assert_eq!(aborts(&out), [(w, task, 1)]);
    assert_eq!(env.core.next_timer(), None);
}

#[test]
fn result_before_the_limit_disarms_the_timer() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).timeout_ms(100));
    let (w, task) = env.new_worker_running();
    assert!(env.core.next_timer().is_some());
    env.advance(99);
    assert_eq!(outcomes(&env.complete(w, task))[0].1, TaskStatus::Ok);
    assert_eq!(env.core.next_timer(), None, "disarmed by the result");
    assert!(env.tick_after(10 * GRACE_MS).is_empty());
    assert_eq!(env.core.stats().counters.timed_out, 0);
}

#[test]
fn time_out_sends_a_timeout_result_and_aborts_the_worker_which_keeps_holding_it() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(1).timeout_ms(250));
    let (w, task) = env.new_worker_running();
    let out = env.tick_after(250 + GRACE_MS);
    let [Action::SendResults {
        client: to,
        package: p,
        results,
        ..
    }, Action::Abort { worker, tasks }, Action::PackageFreed { .. }] = &out[..]
    else {
        panic!("SendResults, Abort, then (auto-ack) PackageFreed expected: {out:?}");
    };
    assert_eq!((*to, *p), (Some(client), package));
    assert_eq!((*worker, tasks.clone()), (w, vec![(task, 1)]));
    let r = &results[0];
    assert_eq!((r.index, r.status), (0, TaskStatus::Timeout));
    assert_eq!(r.worker_us, (250 + GRACE_MS) * 1_000);
    let message = std::str::from_utf8(&r.data).expect("a UTF-8 message");
    assert!(message.contains("time limit of 0.250 s"), "{message}");
    assert!(message.contains(&format!("{w}, attempt 1")), "{message}");
    let stats = env.core.stats();
    assert_eq!(
        (stats.counters.timed_out, stats.running, stats.retained),
        (1, 0, 1)
    );
    assert_eq!(
        env.core.worker_stats(w).unwrap().in_flight,
        1,
        "the worker holds it until it answers"
    );
}

#[test]
fn late_answer_after_a_time_out_is_dropped_and_frees_the_hold() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).timeout_ms(10));
    let (w, task) = env.new_worker_running();
    env.tick_after(10 + GRACE_MS);
    assert!(
        env.complete(w, task).is_empty(),
        "the client already has Timeout"
    );
    let stats = env.core.stats();
    assert_eq!(stats.counters.stale_results, 0, "expected, not stale");
    assert_eq!(
        (stats.tasks, stats.retained, stats.counters.delivered),
        (0, 0, 1)
    );
    assert_eq!(env.core.worker_stats(w).unwrap().in_flight, 0);
}

#[test]
fn late_answer_before_the_client_acks_leaves_the_timeout_result_retained() {
    let mut env = TestEnv::new();
    env.auto_ack = false;
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(1).timeout_ms(10));
    let (w, task) = env.new_worker_running();
    env.tick_after(10 + GRACE_MS);
    assert!(env.complete(w, task).is_empty());
    let stats = env.core.stats();
    assert_eq!((stats.tasks, stats.retained, stats.packages), (1, 1, 1));
    assert_eq!(
        env.ack_all(client, package),
        [Action::PackageFreed {
            journaled: true,
            package,
            expired: false
        }]
    );
    assert_eq!(env.core.stats().tasks, 0);
}

#[test]
fn tasks_without_a_limit_are_capped_by_max_exec_ns() {
    let (mut env, client, _) = TestEnv::with_config(CoreConfig {
        max_exec_ns: ns(5_000),
        ..CoreConfig::default()
    })
    .with_package(1);
    env.submit_spec(client, Spec::tasks(1).timeout_ms(60_000));
    let w = env.new_worker(2);
    let start = env.now;
    let tasks = env.take(w, 2);
    assert_eq!(env.core.next_timer(), Some(Instant(start.0 + ns(5_000))));
    let out = env.tick_after(5_000);
    let got = outcomes(&out);
    assert_eq!(got.len(), 2, "a longer own limit is capped too: {out:?}");
    assert!(got.iter().all(|(_, s, _)| *s == TaskStatus::Timeout));
    assert!(
        got[0].2.contains("maximum execution time of 5 s"),
        "{}",
        got[0].2
    );
    assert_eq!(aborts(&out), [(w, tasks[0], 1), (w, tasks[1], 1)]);
}

#[test]
fn no_timer_without_a_limit_when_max_exec_ns_is_zero() {
    let (mut env, _, _) = TestEnv::with_config(CoreConfig {
        max_exec_ns: 0,
        ..CoreConfig::default()
    })
    .with_package(1);
    let w = env.new_worker(1);
    env.credit(w, 1);
    assert_eq!(env.core.next_timer(), None);
}

#[test]
fn worker_lost_after_a_time_out_releases_the_task_without_requeue_or_loss() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).timeout_ms(10));
    let w = env.new_worker(1);
    env.credit(w, 1);
    env.tick_after(10 + GRACE_MS);
    assert!(env.lose_worker(w).is_empty());
    let stats = env.core.stats();
    assert_eq!(
        (stats.tasks, stats.queued, stats.counters.requeued),
        (0, 0, 0)
    );
    assert_eq!(
        (
            stats.counters.timed_out,
            stats.counters.poisoned,
            stats.counters.delivered
        ),
        (1, 0, 1)
    );
}

#[test]
fn worker_lost_before_the_limit_disarms_it_and_the_next_attempt_gets_its_own() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).timeout_ms(100));
    let (lost, next) = (env.new_worker(1), env.new_worker(1));
    let task = env.take(lost, 1)[0];
    env.advance(50);
    env.lose_worker(lost);
    assert_eq!(env.core.next_timer(), None, "nothing runs");
    env.advance(1_000);
    let again = env.now;
    assert_eq!(env.take(next, 1), [task]);
    assert_eq!(
        env.core.next_timer(),
        Some(Instant(again.0 + ns(100 + GRACE_MS)))
    );
    assert_eq!(aborts(&env.tick_after(100 + GRACE_MS)), [(next, task, 2)]);
}
