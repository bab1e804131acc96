//! Scenarios: result retention. Results wait for the client's acknowledgement; a lost client's
//! packages are detached and kept for the result TTL; a client of the same user attaches and
//! gets every unacknowledged result again; idempotency keys and restored packages attach the
//! same way.

mod common;

use bytes::Bytes;
use common::{
    aborts, fn_code, fn_hash, freed, resent_indices, result_indices, tasks_of, Spec, TestEnv,
};
use rtpool_core::{
    Action, CoreConfig, Event, Instant, PackageCounts, PackageId, PackageOpts, RestoredPackage,
    ResultBytes, TaskOutcome, TaskStatus, UserId,
};

const TTL_MS: u64 = 300_000;

/// A core without auto-ack, reporting deliveries.
fn env() -> TestEnv {
    let mut env = TestEnv::with_config(CoreConfig {
        report_deliveries: true,
        ..CoreConfig::default()
    });
    env.auto_ack = false;
    env
}

fn counts(out: &[Action]) -> PackageCounts {
    match out {
        [Action::StatusReply { counts, .. }] => *counts,
        other => panic!("one StatusReply expected: {other:?}"),
    }
}

#[test]
fn results_are_retained_until_acknowledged_then_the_package_is_freed() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 2);
    let w = env.new_worker(2);
    for task in env.take(w, 2) {
        env.complete(w, task);
    }
    let stats = env.core.stats();
    assert_eq!((stats.packages, stats.retained, stats.tasks), (1, 2, 2));
    assert_eq!(
        env.ack_all(client, package),
        [
            Action::Delivered {
                journaled: true,
                package,
                indices: vec![0, 1]
            },
            Action::PackageFreed {
                journaled: true,
                package,
                expired: false
            }
        ]
    );
    let stats = env.core.stats();
    assert_eq!((stats.packages, stats.retained, stats.tasks), (0, 0, 0));
}

#[test]
fn partial_acks_free_only_the_acknowledged_prefix() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 3);
    let (w, tasks) = env.new_worker_taking(3);
    for &t in &[tasks[2], tasks[0], tasks[1]] {
        env.complete(w, t);
    }
    assert_eq!(
        env.ack(client, package, 2),
        [Action::Delivered {
            journaled: true,
            package,
            indices: vec![2, 0]
        }],
        "the first two in the order they were sent"
    );
    assert_eq!(env.core.stats().retained, 1);
    assert!(env.ack(client, package, 1).is_empty(), "an older count");
    assert!(env.ack(client, package, 2).is_empty(), "the same count");
    let c = counts(&env.status(client, package));
    assert_eq!((c.done, c.queued, c.running), (3, 0, 0));
    let out = env.ack(client, package, 99);
    assert_eq!(
        out,
        [
            Action::Delivered {
                journaled: true,
                package,
                indices: vec![1]
            },
            Action::PackageFreed {
                journaled: true,
                package,
                expired: false
            }
        ],
        "a count beyond what was sent is capped"
    );
}

#[test]
fn detach_then_attach_resends_unacked_results_in_order_and_restarts_the_count() {
    let mut env = env();
    let first = env.new_client();
    let (package, _) = env.submit(first, 4);
    let (w, tasks) = env.new_worker_taking(4);
    env.complete(w, tasks[2]);
    env.complete(w, tasks[0]);
    env.ack(first, package, 1); // index 2
    assert!(env.lose_client(first).is_empty(), "nothing is cancelled");
    let out = env.complete(w, tasks[1]);
    assert!(
        matches!(&out[..], [Action::SendResults { client: None, .. }]),
        "recorded for no client: {out:?}"
    );
    let second = env.new_client();
    let out = env.attach(second, package);
    assert!(
        matches!(out[0], Action::Accepted { client, package: p, .. } if client == second && p == package)
    );
    assert_eq!(resent_indices(&out), [0, 1], "every unacked one, in order");
    assert!(
        matches!(out[1], Action::Resend { client, .. } if client == second),
        "{out:?}"
    );
    // The count restarts: 1 = the first resent result.
    assert_eq!(
        env.ack(second, package, 1),
        [Action::Delivered {
            journaled: true,
            package,
            indices: vec![0]
        }]
    );
    let out = env.complete(w, tasks[3]);
    assert!(matches!(&out[..], [Action::SendResults { client: Some(c), .. }] if *c == second));
    let out = env.ack(second, package, 3);
    assert_eq!(freed(&out), [(package, false)]);
    assert!(
        env.ack(first, package, 9).is_empty(),
        "the lost client is gone"
    );
}

#[test]
fn attach_by_a_second_client_moves_the_package_and_acks_of_the_first_are_ignored() {
    let mut env = env();
    let (a, b) = (env.new_client(), env.new_client());
    let (package, _) = env.submit(a, 1);
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    assert_eq!(resent_indices(&env.attach(b, package)), [0]);
    assert!(env.ack(a, package, 1).is_empty(), "a is no longer attached");
    assert!(env.lose_client(a).is_empty());
    assert_eq!(
        env.core.next_timer(),
        None,
        "losing a does not detach it from b"
    );
    assert_eq!(freed(&env.ack(b, package, 1)), [(package, false)]);
}

#[test]
fn a_different_user_cannot_attach_cancel_or_ack() {
    let mut env = env();
    let owner = env.new_client_of(UserId(1));
    let stranger = env.new_client_of(UserId(2));
    let (package, _) = env.submit(owner, 1);
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    let unknown = [Action::UnknownPackage {
        client: stranger,
        package,
    }];
    assert_eq!(env.attach(stranger, package), unknown);
    assert_eq!(env.cancel(stranger, package, &[]), unknown);
    assert_eq!(env.status(stranger, package), unknown);
    assert!(env.ack(stranger, package, 1).is_empty());
    env.lose_client(owner);
    assert_eq!(env.attach(stranger, package), unknown, "not even detached");
    assert_eq!(env.core.stats().retained, 1, "untouched");
}

#[test]
fn ttl_expiry_drops_unacked_results_aborts_running_tasks_and_counts_them() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 3);
    let (w, tasks) = env.new_worker_taking(2);
    env.complete(w, tasks[0]);
    let lost_at = env.now;
    env.lose_client(client);
    assert_eq!(
        env.core.next_timer(),
        Some(Instant(lost_at.0 + TTL_MS * 1_000_000))
    );
    assert!(env.tick_after(TTL_MS - 1).is_empty());
    let out = env.tick_after(1);
    assert_eq!(aborts(&out), [(w, tasks[1], 1)]);
    assert_eq!(freed(&out), [(package, true)]);
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.packages_expired,
            stats.counters.results_dropped
        ),
        (1, 1)
    );
    assert_eq!((stats.packages, stats.queued, stats.retained), (0, 0, 0));
    assert_eq!(
        (stats.cancelling, stats.tasks),
        (1, 1),
        "until the worker answers"
    );
    assert!(env.complete(w, tasks[1]).is_empty());
    assert_eq!(env.core.stats().tasks, 0);
    let again = env.new_client();
    assert_eq!(
        env.attach(again, package),
        [Action::UnknownPackage {
            client: again,
            package
        }]
    );
}

#[test]
fn held_result_bytes_name_unacked_then_detached_results_until_ack_or_ttl() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 3);
    let w = env.new_worker(3);
    let tasks = tasks_of(&env.credit(w, 3), w);
    assert_eq!(env.core.result_bytes_held(), ResultBytes::default());
    env.answer(w, tasks[0], TaskStatus::Ok, &[7; 1000], 1000);
    env.answer(w, tasks[1], TaskStatus::Ok, &[7; 300], 1000);
    let sent = ResultBytes {
        held: 1300,
        unacked: 1300,
    };
    assert_eq!(env.core.result_bytes_held(), sent);
    env.ack(client, package, 1);
    let after_ack = ResultBytes {
        held: 300,
        unacked: 300,
    };
    assert_eq!(env.core.result_bytes_held(), after_ack);
    env.lose_client(client);
    env.answer(w, tasks[2], TaskStatus::Ok, &[7; 50], 1000);
    let detached = ResultBytes {
        held: 350,
        unacked: 0,
    };
    assert_eq!(env.core.result_bytes_held(), detached, "kept for the TTL");
    env.advance(TTL_MS);
    assert_eq!(freed(&env.tick()), [(package, true)]);
    assert_eq!(env.core.result_bytes_held(), ResultBytes::default());
}

#[test]
fn attach_before_the_ttl_disarms_it() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 2);
    env.lose_client(client);
    assert!(env.core.next_timer().is_some());
    env.advance(TTL_MS - 1);
    let again = env.new_client();
    let out = env.attach(again, package);
    assert_eq!(out.len(), 1, "accepted, nothing to resend: {out:?}");
    assert_eq!(env.core.next_timer(), None);
    assert!(env.tick_after(10 * TTL_MS).is_empty());
    assert_eq!(env.core.stats().packages, 1);
    // Detached again: a fresh TTL from now.
    let lost_at = env.now;
    env.lose_client(again);
    assert_eq!(
        env.core.next_timer(),
        Some(Instant(lost_at.0 + TTL_MS * 1_000_000))
    );
}

#[test]
fn whole_package_cancel_drops_its_retained_results() {
    let mut env = env();
    let client = env.new_client();
    let (package, _) = env.submit(client, 3);
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    assert!(
        env.cancel(client, package, &[1]).is_empty(),
        "by index: kept"
    );
    assert_eq!(env.core.stats().retained, 1);
    assert_eq!(
        env.cancel(client, package, &[]),
        [Action::PackageFreed {
            journaled: true,
            package,
            expired: false
        }]
    );
    let stats = env.core.stats();
    assert_eq!((stats.retained, stats.tasks, stats.packages), (0, 0, 0));
    assert_eq!(
        stats.counters.results_dropped, 0,
        "only expiries count as dropped"
    );
}

#[test]
fn idempotent_resubmit_returns_the_same_id_and_resends() {
    let mut env = env();
    let first = env.new_client();
    let (package, _) = env.submit_spec(first, Spec::tasks(2).key("job-1"));
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    env.lose_client(first);
    let second = env.new_client();
    let (offered, out) = env.submit_raw(second, Spec::tasks(2).key("job-1"));
    assert_ne!(offered, package);
    assert!(
        matches!(out[0], Action::Accepted { package: p, .. } if p == package),
        "the existing id, not {offered}: {out:?}"
    );
    assert_eq!(resent_indices(&out), [0]);
    assert_eq!(out.len(), 2, "no new tasks are dispatched: {out:?}");
    let stats = env.core.stats();
    assert_eq!((stats.packages, stats.tasks), (1, 2));
    assert_eq!(env.core.next_timer(), None, "attached again: no TTL");
    // Another user's key is its own.
    let other = env.new_client_of(UserId(2));
    let (theirs, _) = env.submit_spec(other, Spec::tasks(1).key("job-1"));
    assert_ne!(theirs, package);
    assert_eq!(env.core.stats().packages, 2);
    // Once the package is gone, the key is free again.
    env.cancel(second, package, &[]);
    let (fresh, _) = env.submit_spec(second, Spec::tasks(1).key("job-1"));
    assert!(fresh != package && fresh != theirs);
}

fn outcome(index: u32) -> TaskOutcome {
    TaskOutcome {
        index,
        status: TaskStatus::Ok,
        data: Bytes::from(format!("restored {index}")),
        queue_us: 1,
        worker_us: 2,
        exec_us: 3,
        wait_us: 4,
        flush_us: 5,
        late_us: 0,
    }
}

fn restored(package: PackageId, tasks: usize, done: &[u32], delivered: &[u32]) -> Event {
    Event::Restore(Box::new(RestoredPackage {
        package,
        user: UserId(1),
        fn_hash: fn_hash(0),
        fn_code: fn_code(0),
        opts: PackageOpts {
            key: "restored".into(),
            ..PackageOpts::default()
        },
        tasks: (0..tasks).map(|i| Bytes::from(format!("r:{i}"))).collect(),
        done: done.iter().map(|&i| outcome(i)).collect(),
        delivered: delivered.to_vec(),
        calls: Vec::new(),
    }))
}

#[test]
fn restore_recreates_a_detached_package_that_resends_done_results_and_runs_the_rest() {
    let mut env = env();
    let w = env.new_worker(4);
    env.credit(w, 4);
    let package = PackageId(500);
    let at = env.now;
    let out = env.step(restored(package, 5, &[3, 1], &[0]));
    let indices: Vec<u32> = tasks_of(&out, w).iter().map(|&t| env.index(t)).collect();
    assert_eq!(indices, [2, 4], "only what has no result is run");
    assert_eq!(
        env.core.next_timer(),
        Some(Instant(at.0 + TTL_MS * 1_000_000)),
        "detached: the TTL is armed (before the running tasks' 24 h limits)"
    );
    let client = env.new_client();
    let out = env.attach(client, package);
    assert_eq!(resent_indices(&out), [3, 1], "in their original order");
    let c = counts(&env.status(client, package));
    assert_eq!((c.total, c.done, c.running, c.queued), (5, 3, 2, 0));
    // Its key is live again.
    let (_, out) = env.submit_raw(client, Spec::tasks(1).key("restored"));
    assert!(matches!(out[0], Action::Accepted { package: p, .. } if p == package));
    assert_eq!(resent_indices(&out), [3, 1]);
    env.ack(client, package, 2);
    let running: Vec<_> = env.assigned.keys().copied().collect();
    for task in running {
        env.complete(w, task);
    }
    let out = env.ack(client, package, 4);
    assert_eq!(freed(&out), [(package, false)]);
    assert_eq!(env.core.stats().tasks, 0);
}

#[test]
fn restore_of_a_fully_delivered_package_frees_it_at_once_and_a_known_id_is_ignored() {
    let mut env = env();
    let out = env.step(restored(PackageId(7), 2, &[], &[0, 1]));
    assert_eq!(freed(&out), [(PackageId(7), false)]);
    assert_eq!(env.core.stats().packages, 0);
    let client = env.new_client();
    let (package, _) = env.submit(client, 1);
    assert!(env.step(restored(package, 3, &[], &[])).is_empty());
    let c = counts(&env.status(client, package));
    assert_eq!(c.total, 1, "the live package is untouched");
}

#[test]
fn restored_package_expires_like_a_detached_one() {
    let mut env = env();
    env.step(restored(PackageId(9), 3, &[0], &[]));
    let out = env.tick_after(TTL_MS);
    assert_eq!(freed(&out), [(PackageId(9), true)]);
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.results_dropped,
            stats.counters.packages_expired
        ),
        (1, 1)
    );
    assert_eq!((stats.tasks, stats.queued), (0, 0));
    assert!(result_indices(&out).is_empty());
}
