//! Scenarios: submission limits, status, cancellation and client loss.

mod common;

use bytes::Bytes;
use common::{fn_code, fn_hash, result_indices, TestEnv};
use rtpool_core::{
    Action, CoreConfig, Event, PackageCounts, PackageId, PackageOpts, RejectReason, UserId,
};

fn counts(out: &[Action]) -> PackageCounts {
    match out {
        [Action::StatusReply {
            counts, req_id: 77, ..
        }] => *counts,
        other => panic!("one StatusReply expected: {other:?}"),
    }
}

fn submit_raw(env: &mut TestEnv, n: usize) -> Vec<Action> {
    let client = rtpool_core::ClientId(1);
    let tasks = vec![Bytes::from_static(b"x"); n];
    let opts = PackageOpts::default();
    env.step(Event::Submit {
        client,
        req_id: 9,
        package: PackageId(900),
        fn_hash: fn_hash(0),
        fn_code: fn_code(0),
        opts,
        tasks,
    })
}

#[test]
fn empty_and_oversized_packages_are_rejected() {
    let mut env = TestEnv::with_config(CoreConfig {
        max_tasks_per_package: 3,
        ..CoreConfig::default()
    });
    let client = env.new_client();
    let rejected = |reason| {
        vec![Action::Rejected {
            client,
            req_id: 9,
            reason,
        }]
    };
    assert_eq!(submit_raw(&mut env, 0), rejected(RejectReason::Empty));
    assert_eq!(
        submit_raw(&mut env, 4),
        rejected(RejectReason::TooManyTasks { tasks: 4, limit: 3 })
    );
    assert!(matches!(
        submit_raw(&mut env, 3)[..],
        [Action::Accepted { .. }]
    ));
    assert_eq!(env.core.stats().packages, 1);
}

#[test]
fn status_counts_every_state() {
    let (mut env, client, package) = TestEnv::new().with_package(5);
    let w = env.new_worker(1);
    let tasks = env.take(w, 2);
    env.complete(w, tasks[0]);
    env.cancel(client, package, &[4]);
    let expected = PackageCounts {
        total: 5,
        queued: 2,
        running: 1,
        done: 1,
        cancelled: 1,
        ..PackageCounts::default()
    };
    assert_eq!(counts(&env.status(client, package)), expected);
}

#[test]
fn cancel_of_a_queued_task_frees_it_and_it_is_never_assigned() {
    let (mut env, client, package) = TestEnv::new().with_package(3);
    assert!(env.cancel(client, package, &[1]).is_empty());
    assert_eq!(env.core.stats().queued, 2);
    assert_eq!(env.core.stats().tasks, 2);
    let w = env.new_worker(1);
    let got: Vec<u32> = env.take(w, 3).iter().map(|&t| env.index(t)).collect();
    assert_eq!(got, [0, 2]);
    assert_eq!(env.core.worker_stats(w).unwrap().credits, 1);
}

#[test]
fn cancel_of_a_running_task_drops_its_result() {
    let (mut env, client, package) = TestEnv::new().with_package(2);
    let w = env.new_worker(1);
    let tasks = env.take(w, 2);
    env.cancel(client, package, &[0]);
    let stats = env.core.stats();
    assert_eq!((stats.running, stats.cancelling, stats.tasks), (1, 1, 2));
    assert!(
        env.complete(w, tasks[0]).is_empty(),
        "the client already considers it cancelled"
    );
    assert_eq!(
        env.core.stats().counters.stale_results,
        0,
        "a cancelled task's result is expected, not stale"
    );
    assert_eq!(env.core.stats().cancelling, 0);
    assert_eq!(result_indices(&env.complete(w, tasks[1])), [1]);
    assert_eq!(env.core.stats().packages, 0);
}

#[test]
fn cancel_of_the_whole_package_frees_it_at_once() {
    let (mut env, client, package) = TestEnv::new().with_package(4);
    let (w, tasks) = env.new_worker_taking(1);
    assert_eq!(
        env.cancel(client, package, &[]),
        [
            Action::Abort {
                worker: w,
                tasks: vec![(tasks[0], 1)]
            },
            Action::PackageFreed {
                journaled: true,
                package,
                expired: false
            }
        ],
        "the worker is told to stop the running task"
    );
    let stats = env.core.stats();
    assert_eq!((stats.packages, stats.functions, stats.queued), (0, 0, 0));
    assert_eq!(
        (stats.tasks, stats.cancelling),
        (1, 1),
        "the worker still holds one"
    );
    assert_eq!(
        env.status(client, package),
        [Action::UnknownPackage { client, package }]
    );
    assert!(env.complete(w, tasks[0]).is_empty());
    assert_eq!(env.core.stats().tasks, 0);
}

/// Changed by design: packages belong to users, not connections, so "another client" is now a
/// client of another user (a second client of the same user may cancel, see below).
#[test]
fn cancel_of_another_users_package_is_unknown() {
    let mut env = TestEnv::new();
    let (owner, other) = (env.new_client(), env.new_client_of(UserId(2)));
    let (package, _) = env.submit(owner, 2);
    assert_eq!(
        env.cancel(other, package, &[]),
        [Action::UnknownPackage {
            client: other,
            package
        }]
    );
    assert_eq!(
        env.status(other, package),
        [Action::UnknownPackage {
            client: other,
            package
        }]
    );
    assert_eq!(counts(&env.status(owner, package)).queued, 2, "untouched");
}

#[test]
fn cancel_by_another_client_of_the_same_user_is_allowed() {
    let mut env = TestEnv::new();
    let (owner, sibling) = (env.new_client(), env.new_client());
    let (package, _) = env.submit(owner, 2);
    assert!(env.cancel(sibling, package, &[1]).is_empty());
    assert_eq!(counts(&env.status(sibling, package)).cancelled, 1);
    assert_eq!(
        env.cancel(sibling, package, &[]),
        [Action::PackageFreed {
            journaled: true,
            package,
            expired: false
        }]
    );
}

#[test]
fn cancel_ignores_out_of_range_duplicate_and_finished_indices() {
    let (mut env, client, package) = TestEnv::new().with_package(3);
    let (w, first) = env.new_worker_running();
    env.complete(w, first);
    assert!(env
        .cancel(client, package, &[0, 2, 2, 99, u32::MAX])
        .is_empty());
    let expected = PackageCounts {
        total: 3,
        queued: 1,
        running: 0,
        done: 1,
        cancelled: 1,
        ..PackageCounts::default()
    };
    assert_eq!(counts(&env.status(client, package)), expected);
}

#[test]
fn cancelled_running_task_returned_or_lost_is_freed_not_requeued() {
    let (mut env, client, package) = TestEnv::new().with_package(3);
    let w = env.new_worker(1);
    let tasks = env.take(w, 3);
    env.cancel(client, package, &[0, 1]);
    env.return_tasks(w, &[tasks[0]]);
    assert_eq!(
        (env.core.stats().queued, env.core.stats().cancelling),
        (0, 1)
    );
    env.lose_worker(w);
    let stats = env.core.stats();
    assert_eq!(
        (stats.queued, stats.cancelling, stats.tasks),
        (1, 0, 1),
        "only index 2 is requeued"
    );
}

/// Changed by design (leases/retention): a lost client used to cancel its packages at once.
/// Now they are detached and keep running; their results are recorded (sent to no client) and
/// retained until the result TTL passes, when the rest is cancelled and the results dropped.
#[test]
fn client_lost_detaches_its_packages_until_the_ttl_frees_them() {
    let mut env = TestEnv::new();
    let (gone, stays) = (env.new_client(), env.new_client_of(UserId(2)));
    let (p1, _) = env.submit(gone, 3);
    let (p2, _) = env.submit(gone, 2);
    let (w, tasks) = env.new_worker_taking(2);
    // Submitted after the assignment: users take turns, so it would have taken one of them.
    let (kept, _) = env.submit(stays, 1);
    assert!(env.lose_client(gone).is_empty());
    let stats = env.core.stats();
    assert_eq!((stats.clients, stats.packages, stats.queued), (1, 3, 4));
    assert_eq!(
        (stats.running, stats.cancelling, stats.functions),
        (2, 0, 1)
    );
    assert!(env.core.next_timer().is_some(), "the TTL is armed");
    for task in tasks {
        let out = env.complete(w, task);
        assert!(
            matches!(out[..], [Action::SendResults { client: None, package, .. }] if package == p1),
            "results of a detached package are recorded for no client: {out:?}"
        );
    }
    assert_eq!(env.core.stats().retained, 2);
    let (w2, third) = env.new_worker_running();
    assert_eq!(env.index(third), 2, "p1's last task, FIFO");
    // The TTL passes: both detached packages expire (the running task is aborted), the kept
    // one is untouched.
    env.now = env.core.next_timer().unwrap();
    let attempt = env.attempt(third);
    assert_eq!(
        env.tick(),
        [
            Action::Abort {
                worker: w2,
                tasks: vec![(third, attempt)]
            },
            Action::PackageFreed {
                journaled: true,
                package: p1,
                expired: true
            },
            Action::PackageFreed {
                journaled: true,
                package: p2,
                expired: true
            },
        ]
    );
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.packages_expired,
            stats.counters.results_dropped
        ),
        (2, 2)
    );
    assert_eq!((stats.packages, stats.queued, stats.retained), (1, 1, 0));
    assert!(
        env.complete(w2, third).is_empty(),
        "the aborted task's answer is dropped"
    );
    let (w3, last) = env.new_worker_running();
    let out = env.complete(w3, last);
    assert!(
        matches!(out[..], [Action::SendResults { client, package, .. }, Action::PackageFreed { .. }] if client == Some(stays) && package == kept),
        "{out:?}"
    );
    let stats = env.core.stats();
    assert_eq!((stats.tasks, stats.packages, stats.functions), (0, 0, 0));
}

/// Changed by design: the loss of a client no longer frees its package at once; the package is
/// detached and only the TTL frees it.
#[test]
fn submit_without_join_registers_the_client_and_its_loss_detaches_the_package() {
    let mut env = TestEnv::new();
    submit_raw(&mut env, 2);
    assert_eq!(env.core.stats().clients, 1);
    env.lose_client(rtpool_core::ClientId(1));
    let stats = env.core.stats();
    assert_eq!((stats.clients, stats.packages, stats.queued), (0, 1, 2));
    assert!(env.tick_after(299_999).is_empty(), "not before the TTL");
    env.advance(1);
    assert_eq!(
        env.tick(),
        [Action::PackageFreed {
            journaled: true,
            package: PackageId(900),
            expired: true
        }]
    );
    assert_eq!(
        env.core.stats(),
        rtpool_core::CoreStats {
            counters: rtpool_core::Counters {
                packages_expired: 1,
                ..rtpool_core::Counters::default()
            },
            ..rtpool_core::CoreStats::default()
        }
    );
}

#[test]
fn many_cancels_without_workers_leave_nothing_behind() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    for _ in 0..50 {
        let (package, _) = env.submit(client, 100);
        env.cancel(client, package, &[]);
    }
    assert_eq!(env.core.stats().tasks, 0);
    let (_, _) = env.submit(client, 1);
    let w = env.new_worker(1);
    assert_eq!(env.take(w, 5).len(), 1, "tombstones are skipped");
}
