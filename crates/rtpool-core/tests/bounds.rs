//! Scenarios: the per-user bounds on queued tasks and their argument bytes (a submission past
//! one is refused, naming it; finished and cancelled tasks make room; other users are not
//! affected), and the per-client bound on unacknowledged results (the client is told to close
//! once; a re-attach gets every result back).

mod common;

use common::{Spec, TestEnv};
use rtpool_core::{Action, CoreConfig, RejectReason, UserId};

const ALICE: UserId = UserId(1);
const BOB: UserId = UserId(2);

fn refusal(out: &[Action]) -> RejectReason {
    match out {
        [Action::Rejected { reason, .. }] => reason.clone(),
        other => panic!("not one refusal: {other:?}"),
    }
}

#[test]
fn a_user_past_its_queued_task_bound_is_refused_and_others_are_not() {
    let mut env = TestEnv::with_config(CoreConfig {
        max_queued_tasks_per_user: 5,
        ..CoreConfig::default()
    });
    let (alice, bob) = (env.new_client_of(ALICE), env.new_client_of(BOB));
    let (first, _) = env.submit(alice, 3);
    let (_, out) = env.submit_raw(alice, Spec::tasks(3));
    let reason = refusal(&out);
    assert_eq!(
        reason,
        RejectReason::UserLimit {
            what: "tasks",
            option: "--max-queued-tasks-per-user",
            used: 3,
            adding: 3,
            limit: 5,
        }
    );
    let text = reason.to_string();
    assert!(
        text.contains("has 3 tasks queued or running and this package adds 3"),
        "{text}"
    );
    assert!(
        text.contains("limit of 5 (master option --max-queued-tasks-per-user)"),
        "{text}"
    );
    // Another user has a bound of its own.
    env.submit(bob, 5);
    // A finished task and a cancelled one make room.
    let (w, task) = env.new_worker_running();
    env.complete(w, task);
    env.cancel(alice, first, &[2]);
    // The worker ran one of alice's (users take turns, alice first): 3 - 1 - 1 + 3 = 4.
    env.submit(alice, 3);
    assert!(matches!(
        refusal(&env.submit_raw(alice, Spec::tasks(2)).1),
        RejectReason::UserLimit {
            used: 4,
            adding: 2,
            ..
        }
    ));
    env.submit(alice, 1);
}

#[test]
fn a_user_past_its_queued_bytes_bound_is_refused_naming_the_bytes() {
    // Payloads are "<req_id>:<i>": 3 bytes each for req 1 with fewer than 10 tasks.
    let mut env = TestEnv::with_config(CoreConfig {
        max_queued_bytes_per_user: 10,
        ..CoreConfig::default()
    });
    let alice = env.new_client_of(ALICE);
    env.submit(alice, 3);
    let reason = refusal(&env.submit_raw(alice, Spec::tasks(1)).1);
    assert_eq!(
        reason,
        RejectReason::UserLimit {
            what: "argument bytes",
            option: "--max-queued-mb-per-user",
            used: 9,
            adding: 3,
            limit: 10,
        }
    );
}

#[test]
fn a_client_past_its_unacked_bound_is_told_to_close_once_and_a_reattach_gets_everything() {
    let mut env = TestEnv::with_config(CoreConfig {
        max_unacked_results_per_client: 2,
        ..CoreConfig::default()
    });
    env.auto_ack = false;
    let alice = env.new_client_of(ALICE);
    let (package, _) = env.submit(alice, 6);
    let (w, tasks) = env.new_worker_taking(6);
    let mut told = 0;
    for (i, &task) in tasks[..5].iter().enumerate() {
        let out = env.complete(w, task);
        let limits: Vec<_> = out
            .iter()
            .filter(|a| matches!(a, Action::UnackedLimit { .. }))
            .collect();
        if i == 2 {
            let at = |f: fn(&Action) -> bool| out.iter().position(f).expect("present");
            assert!(
                at(|a| matches!(a, Action::SendResults { .. }))
                    < at(|a| matches!(a, Action::UnackedLimit { .. })),
                "the results go out before the order to close: {out:?}"
            );
            assert!(
                matches!(
                    limits[..],
                    [Action::UnackedLimit {
                        results: 3,
                        max_results: 2,
                        ..
                    }]
                ),
                "{out:?}"
            );
        }
        told += limits.len();
    }
    assert_eq!(told, 1, "told once");
    // The shell closes it; a new connection re-attaches and gets all five, not judged.
    env.lose_client(alice);
    let again = env.new_client_of(ALICE);
    let out = env.attach(again, package);
    assert!(
        !out.iter().any(|a| matches!(a, Action::UnackedLimit { .. })),
        "{out:?}"
    );
    let resent: usize = out
        .iter()
        .map(|a| match a {
            Action::Resend { results, .. } => results.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(resent, 5);
    // What follows is judged on its own: one more result is within the bound.
    let out = env.complete(w, tasks[5]);
    assert!(
        !out.iter().any(|a| matches!(a, Action::UnackedLimit { .. })),
        "{out:?}"
    );
    env.ack(again, package, 6);
    assert_eq!(env.core.stats().packages, 0, "acknowledged: freed");
}
