//! Overload: deadlines missed while work waits make the core say "overloaded" (and count it),
//! met deadlines end it; `admit_deadlines` puts every package with a deadline through
//! admission control. Every step checks the core's invariants (through `TestEnv`).

mod common;

use common::{Spec, TestEnv};
use rtpool_core::{Action, CoreConfig, RejectReason, OVERLOAD_MIN_RESULTS};

#[test]
fn missed_deadlines_with_a_backlog_are_overload_and_met_ones_end_it() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    // 60 tasks of 5 ms each on one slot, all due in 20 ms: offered far beyond capacity.
    env.submit_spec(client, Spec::tasks(60).deadline_ms(20));
    let w = env.new_worker(1);
    let mut done = 0;
    while done < OVERLOAD_MIN_RESULTS + 5 {
        let t = env.take(w, 1);
        env.advance(5);
        env.complete_exec(w, t[0], 5_000);
        done += 1;
    }
    let s = env.core.overload(env.now);
    assert!(s.overloaded, "{s:?}");
    assert!(s.miss_ratio > 0.5 && s.queued > 0, "{s:?}");
    assert_eq!(env.core.stats().counters.overloads, 1);
    // The backlog drains late, then fresh packages meet their deadlines: it is over.
    while env.core.stats().queued > 0 {
        let t = env.take(w, 1);
        env.complete_exec(w, t[0], 1);
    }
    env.advance(20_000);
    for _ in 0..OVERLOAD_MIN_RESULTS {
        env.submit_spec(client, Spec::tasks(1).deadline_ms(20));
        let t = env.take(w, 1);
        env.advance(1);
        env.complete_exec(w, t[0], 1_000);
    }
    let s = env.core.overload(env.now);
    assert!(!s.overloaded, "{s:?}");
    assert_eq!(s.missed, 0);
    assert_eq!(env.core.stats().counters.overloads, 1, "one episode");
}

#[test]
fn late_results_without_a_backlog_are_not_overload() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let w = env.new_worker(1);
    // One at a time, each 30 ms against a 20 ms deadline: the function is too slow for its
    // deadline, but nothing waits for a worker.
    for _ in 0..(OVERLOAD_MIN_RESULTS + 5) {
        env.submit_spec(client, Spec::tasks(1).deadline_ms(20));
        let t = env.take(w, 1);
        env.advance(30);
        env.complete_exec(w, t[0], 30_000);
    }
    let s = env.core.overload(env.now);
    assert!(!s.overloaded, "{s:?}");
    assert_eq!(s.missed, OVERLOAD_MIN_RESULTS + 5);
}

fn admission_refused(out: &[Action]) -> bool {
    out.iter().any(|a| {
        matches!(
            a,
            Action::Rejected {
                reason: RejectReason::Admission { .. },
                ..
            }
        )
    })
}

#[test]
fn admit_deadlines_refuses_a_package_with_a_deadline_that_did_not_ask() {
    for admit_deadlines in [false, true] {
        let mut env = TestEnv::with_config(CoreConfig {
            admit_deadlines,
            ..CoreConfig::default()
        });
        env.learn(0, 10_000, 10);
        let w = env.new_worker(1);
        env.credit(w, 1);
        let client = env.new_client();
        // 100 tasks of 10 ms on one slot cannot finish in 50 ms.
        let (_, out) = env.submit_raw(client, Spec::tasks(100).deadline_ms(50));
        assert_eq!(admission_refused(&out), admit_deadlines, "{out:?}");
        // A package without a deadline is never judged.
        let (_, out) = env.submit_spec(client, Spec::tasks(100));
        assert!(!admission_refused(&out));
    }
}
