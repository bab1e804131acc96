//! Redundant execution: replicas on distinct workers, quorum agreement and disagreement, the
//! first result winning, straggler hedging, and copies meeting worker loss, cancels and time
//! limits. Every step checks the core's invariants (through `TestEnv`).

mod common;

use std::collections::HashMap;

use common::{aborts, ok, outcomes, results, tasks_of, Spec, TestEnv};
use proptest::prelude::*;
use rtpool_core::{Action, ClientId, CoreConfig, TaskId, TaskStatus, WorkerId, WorkerKey};

#[test]
fn replicas_go_to_distinct_workers() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(3, 2));
    let (_, got) = env.new_worker_taking(4);
    assert_eq!(got.len(), 1, "one copy per worker, however many credits");
    let rest = env.new_workers_taking(2, 4);
    assert!(rest.iter().all(|(_, t)| t.len() == 1));
    let all: Vec<TaskId> = got
        .iter()
        .chain(rest.iter().flat_map(|(_, t)| t))
        .copied()
        .collect();
    let distinct: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), 3, "three different copies");
    let stats = env.core.stats();
    assert_eq!((stats.running, stats.counters.extra_copies), (3, 2));
}

#[test]
fn a_quorum_of_agreeing_results_is_accepted_once() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(1).replicas(2, 2));
    let ws = env.new_workers_taking(2, 1);
    let first = env.answer(ws[0].0, ws[0].1[0], TaskStatus::Ok, b"42", 100);
    assert!(results(&first).is_empty(), "one vote is not a quorum");
    let second = env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"42", 100);
    assert_eq!(outcomes(&second), [ok(0, "42")]);
    assert!(aborts(&second).is_empty(), "no copy left to cancel");
    assert_eq!(common::freed(&second), [(package, false)]);
    assert_eq!(env.core.stats().tasks, 0);
}

#[test]
fn a_disagreement_starts_another_copy_which_decides() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(2, 2).max_copies(3));
    let ws = env.new_workers_taking(3, 1);
    assert!(ws[2].1.is_empty(), "two copies, two workers");
    env.answer(ws[0].0, ws[0].1[0], TaskStatus::Ok, b"right", 100);
    let out = env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"wrong", 100);
    assert!(results(&out).is_empty());
    // The third copy goes to the idle third worker (which had a credit).
    let third = tasks_of(&out, ws[2].0);
    assert_eq!(third.len(), 1, "{out:?}");
    assert_eq!(env.core.stats().counters.disagreements, 1);
    let out = env.answer(ws[2].0, third[0], TaskStatus::Ok, b"right", 100);
    assert_eq!(outcomes(&out), [ok(0, "right")]);
    assert_eq!(env.core.stats().counters.extra_copies, 2);
}

#[test]
fn without_a_quorum_the_task_fails_with_every_answer_attached() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(2, 2).max_copies(2));
    let ws = env.new_workers_taking(2, 1);
    env.answer(ws[0].0, ws[0].1[0], TaskStatus::Ok, b"liar", 100);
    let out = env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"honest", 100);
    let got = results(&out);
    let r = &got[0].1[0];
    assert_eq!(r.status, TaskStatus::Disagree);
    // msgpack [message, [[worker, status, data], [worker, status, data]]]
    assert_eq!(r.data[0], 0x92);
    let text = String::from_utf8_lossy(&r.data);
    for needle in ["no quorum", "liar", "honest", "worker-1", "worker-2"] {
        assert!(text.contains(needle), "{needle} missing from {text:?}");
    }
    assert_eq!(env.core.stats().counters.quorum_failed, 1);
    assert_eq!(env.core.stats().tasks, 0);
}

#[test]
fn the_first_result_wins_and_the_other_copies_are_aborted() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(3, 1));
    let ws = env.new_workers_taking(3, 1);
    let out = env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"fast", 100);
    assert_eq!(outcomes(&out), [ok(0, "fast")]);
    let mut aborted = aborts(&out);
    aborted.sort();
    assert_eq!(
        aborted,
        [(ws[0].0, ws[0].1[0], 1), (ws[2].0, ws[2].1[0], 1)]
    );
    assert_eq!(env.core.stats().counters.copies_cancelled, 2);
    // The losers answer anyway (or report the abort): nothing more reaches the client.
    for i in [0, 2] {
        let out = env.answer(ws[i].0, ws[i].1[0], TaskStatus::Cancelled, b"", 0);
        assert!(results(&out).is_empty(), "{out:?}");
    }
    let stats = env.core.stats();
    assert_eq!(
        (stats.tasks, stats.cancelling, stats.counters.delivered),
        (0, 0, 1)
    );
}

#[test]
fn when_the_listed_copy_answers_first_without_quorum_another_copy_takes_its_place() {
    let mut env = TestEnv::new();
    env.auto_ack = false;
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(1).replicas(3, 2));
    let ws = env.new_workers_taking(3, 1);
    // Whichever copy the package lists, answer copies one by one and check the counters.
    env.answer(ws[0].0, ws[0].1[0], TaskStatus::Ok, b"a", 10);
    let status = env.status(client, package);
    let Action::StatusReply { counts, .. } = status[0] else {
        panic!("{status:?}")
    };
    assert_eq!(
        (counts.running, counts.done),
        (1, 0),
        "one task, still running"
    );
    env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"b", 10);
    let out = env.answer(ws[2].0, ws[2].1[0], TaskStatus::Ok, b"a", 10);
    assert_eq!(outcomes(&out), [ok(0, "a")]);
}

#[test]
fn a_lost_worker_s_copy_is_requeued_for_another_worker() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(2, 2));
    let ws = env.new_workers_taking(2, 1);
    env.lose_worker(ws[0].0);
    let (w3, again) = env.new_worker_taking(1);
    assert_eq!(again, [ws[0].1[0]], "the lost copy runs again elsewhere");
    env.answer(ws[1].0, ws[1].1[0], TaskStatus::Ok, b"x", 10);
    let out = env.answer(w3, again[0], TaskStatus::Ok, b"x", 10);
    assert_eq!(outcomes(&out), [ok(0, "x")]);
}

#[test]
fn cancelling_a_replicated_task_aborts_every_copy() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(2).replicas(2, 2));
    let ws = env.new_workers_taking(2, 1);
    let out = env.cancel(client, package, &[]);
    let mut aborted: Vec<WorkerId> = aborts(&out).into_iter().map(|a| a.0).collect();
    aborted.sort();
    assert_eq!(aborted, [ws[0].0, ws[1].0]);
    assert_eq!(env.core.stats().queued, 0, "the queued copies went too");
}

#[test]
fn a_time_limit_on_one_copy_lets_the_other_copy_answer() {
    let mut env = TestEnv::with_config(CoreConfig {
        timeout_grace_ns: 0,
        ..CoreConfig::default()
    });
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).replicas(2, 1).timeout_ms(100));
    let (w1, t1) = env.new_worker_taking(1);
    env.advance(50);
    let (w2, t2) = env.new_worker_taking(1);
    let out = env.tick_after(60);
    assert!(
        results(&out).is_empty(),
        "the other copy may still answer: {out:?}"
    );
    assert_eq!(aborts(&out), [(w1, t1[0], 1)]);
    let out = env.answer(w2, t2[0], TaskStatus::Ok, b"ok", 10);
    assert_eq!(outcomes(&out), [ok(0, "ok")]);
    assert!(results(&env.tick_after(100)).is_empty());
}

#[test]
fn a_straggler_gets_a_hedge_on_an_idle_worker_and_the_first_result_wins() {
    let (mut env, slow, t) = one_straggler(10, Spec::tasks(1));
    let fast = env.new_worker(1);
    assert!(env.credit(fast, 1).is_empty(), "nothing to run yet");
    // 1.5 x p95 (10-12.5 ms): not yet at 14 ms, a hedge by 19 ms.
    assert!(env.tick_after(14).is_empty());
    let out = env.tick_after(5);
    let backup = tasks_of(&out, fast);
    assert_eq!(backup.len(), 1, "{out:?}");
    assert_eq!(env.core.stats().counters.hedges, 1);
    let out = env.answer(fast, backup[0], TaskStatus::Ok, b"done", 10_000);
    assert_eq!(outcomes(&out), [ok(0, "done")]);
    assert_eq!(aborts(&out), [(slow, t, 1)]);
    assert_eq!(env.core.stats().counters.hedge_wins, 1);
    let late = env.answer(slow, t, TaskStatus::Ok, b"done", 100_000);
    assert!(results(&late).is_empty());
    assert_eq!(
        env.core.stats().counters.delivered,
        11,
        "10 learning results + 1"
    );
}

#[test]
fn a_hedge_waits_until_another_worker_has_a_free_credit() {
    let (mut env, _, _) = one_straggler(10, Spec::tasks(1));
    assert!(env.tick_after(40).is_empty(), "no idle worker: no hedge");
    assert_eq!(env.core.stats().counters.hedges, 0);
    let idle = env.new_worker(1);
    env.credit(idle, 1);
    let out = env.tick_after(15);
    assert_eq!(tasks_of(&out, idle).len(), 1, "{out:?}");
}

#[test]
fn a_deadline_at_risk_hedges_before_the_straggler_factor() {
    let (mut env, _, _) = one_straggler(10, Spec::tasks(1).deadline_ms(20));
    let idle = env.new_worker(1);
    env.credit(idle, 1);
    // At deadline - p95 (about 8-10 ms), before 1.5 x p95.
    let out = env.tick_after(10);
    assert_eq!(tasks_of(&out, idle).len(), 1, "{out:?}");
}

#[test]
fn no_hedge_without_a_trusted_estimate() {
    let (mut env, _, _) = one_straggler(2, Spec::tasks(1));
    let idle = env.new_worker(1);
    env.credit(idle, 1);
    let out = env.tick_after(1_000);
    assert!(
        tasks_of(&out, idle).is_empty(),
        "2 results are too few to act on"
    );
    assert_eq!(env.core.stats().counters.hedges, 0);
}

/// What a random run may do.
#[derive(Debug, Clone)]
enum Op {
    /// A worker (by index) answers its oldest copy with one of two values.
    Answer(usize, bool),
    /// A worker is lost (and a new one joins in its place).
    Lose(usize),
    /// A worker gets credits.
    Credit(usize, u32),
    /// The clock moves on and timers fire.
    Tick(u64),
    /// The client cancels one index.
    Cancel(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, any::<bool>()).prop_map(|(w, v)| Op::Answer(w, v)),
        1 => (0..4usize).prop_map(Op::Lose),
        2 => (0..4usize, 1..3u32).prop_map(|(w, c)| Op::Credit(w, c)),
        2 => (1..40u64).prop_map(Op::Tick),
        1 => (0..6u32).prop_map(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whatever the workers answer, lose or cancel, the invariants hold at every step (checked
    /// by `TestEnv::step`) and the client never gets two results for one index.
    #[test]
    fn copies_never_deliver_twice(
        replicas in 1..4u8,
        quorum_pick in 0..3u8,
        hedge in any::<bool>(),
        timeout in prop_oneof![Just(0u32), Just(30u32)],
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut env = TestEnv::with_config(CoreConfig {
            timeout_grace_ns: 0,
            estimate_min_samples: 1,
            ..CoreConfig::default()
        });
        env.learn(1, 5_000, 2);
        let quorum = 1 + quorum_pick % replicas;
        let client = env.new_client();
        let mut spec = Spec::tasks(6).function(1).replicas(replicas, quorum).timeout_ms(timeout);
        if hedge {
            spec = spec.hedge();
        }
        let (package, _) = env.submit_spec(client, spec);
        let mut ws: Vec<WorkerId> = (0..4).map(|_| env.new_worker(2)).collect();
        let mut held: HashMap<WorkerId, Vec<TaskId>> = HashMap::new();
        let mut delivered: HashMap<u32, u32> = HashMap::new();
        for op in ops {
            let out = match op {
                Op::Answer(i, v) => {
                    let w = ws[i];
                    let Some(task) = held.get_mut(&w).and_then(|t| (!t.is_empty()).then(|| t.remove(0))) else {
                        continue;
                    };
                    env.answer(w, task, TaskStatus::Ok, if v { b"a" } else { b"b" }, 5_000)
                }
                Op::Lose(i) => {
                    held.remove(&ws[i]);
                    let out = env.lose_worker(ws[i]);
                    ws[i] = env.new_worker(2);
                    out
                }
                Op::Credit(i, c) => env.credit(ws[i], c),
                Op::Tick(ms) => {
                                        env.tick_after(ms)
                }
                Op::Cancel(index) => env.cancel(client, package, &[index]),
            };
            for action in &out {
                match action {
                    Action::Assign { worker, tasks } => {
                        held.entry(*worker).or_default().extend(tasks.iter().map(|t| t.task));
                    }
                    Action::Abort { worker, tasks } => {
                        if let Some(h) = held.get_mut(worker) {
                            h.retain(|t| !tasks.iter().any(|a| a.0 == *t));
                        }
                    }
                    Action::SendResults { results, .. } => {
                        for r in results {
                            let n = delivered.entry(r.index).or_default();
                            *n += 1;
                            prop_assert_eq!(*n, 1, "index {} delivered twice", r.index);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A core that learnt that test function 2 runs 10 ms (from `samples` results), and one task
/// of `spec` (made function 2, hedged) running on a new one-slot worker: the core, that worker
/// and its task.
fn one_straggler(samples: usize, spec: Spec) -> (TestEnv, WorkerId, TaskId) {
    let mut env = TestEnv::new();
    env.learn(2, 10_000, samples);
    let client = env.new_client();
    env.submit_spec(client, spec.function(2).hedge());
    let (slow, tasks) = env.new_worker_taking(1);
    assert_eq!(tasks.len(), 1, "the straggler runs the task");
    (env, slow, tasks[0])
}

/// The client submits one hedged task of test function 2 and `worker` takes it (one credit):
/// what it got.
fn hedged(env: &mut TestEnv, client: ClientId, worker: WorkerId) -> Vec<TaskId> {
    env.submit_spec(client, Spec::tasks(1).function(2).hedge());
    env.take(worker, 1)
}

/// Two new workers of `slots` slots that ran `n` packages in turn, as [`alternate`] does, at
/// `fast_us` and `slow_us` a task: `(fast, slow)`.
fn paced(
    env: &mut TestEnv,
    slots: [u32; 2],
    fast_us: u64,
    slow_us: u64,
    n: usize,
) -> (WorkerId, WorkerId) {
    let fast = env.new_worker(slots[0]);
    let slow = env.new_worker(slots[1]);
    alternate(env, fast, slow, fast_us, slow_us, n);
    (fast, slow)
}

/// Runs `n` single-task packages of test function 2 one after another, alternating between
/// the `fast` worker (`fast_us` each) and the `slow` one (`slow_us`): what the issue's
/// request-at-a-time client teaches the master.
fn alternate(
    env: &mut TestEnv,
    fast: WorkerId,
    slow: WorkerId,
    fast_us: u64,
    slow_us: u64,
    n: usize,
) {
    let client = env.new_client();
    for i in 0..n {
        let (w, us) = if i % 2 == 0 {
            (fast, fast_us)
        } else {
            (slow, slow_us)
        };
        env.submit_spec(client, Spec::tasks(1).function(2));
        let t = env.take(w, 1);
        assert_eq!(t.len(), 1);
        env.complete_exec(w, t[0], us);
    }
}

#[test]
fn a_slow_worker_does_not_teach_the_hedge_that_slow_is_normal() {
    let mut env = TestEnv::new();
    let (fast, _) = paced(&mut env, [1, 1], 20_000, 200_000, 20);
    // Half the results took 200 ms: the function's own p95 is about 200 ms.
    assert!(env.core.estimate(&common::fn_hash(2)).unwrap().p95_us >= 150_000);
    // A worker the master knows nothing of runs the next task: judged against the fast
    // worker's 20 ms (hedged by 1.5 x ~20 ms), not against the 300 ms the p95 would give.
    let fresh = env.new_worker(1);
    let client = env.new_client();
    let t = hedged(&mut env, client, fresh);
    assert_eq!(t.len(), 1);
    env.credit(fast, 1);
    let out = env.tick_after(40);
    let backup = tasks_of(&out, fast);
    assert_eq!(backup.len(), 1, "hedged after 40 ms: {out:?}");
    assert_eq!(env.core.stats().counters.hedges, 1);
}

#[test]
fn a_known_straggler_is_hedged_as_soon_as_its_task_starts() {
    let mut env = TestEnv::new();
    let (fast, slow) = paced(&mut env, [1, 1], 20_000, 200_000, 20);
    let client = env.new_client();
    let t = hedged(&mut env, client, slow);
    assert_eq!(t.len(), 1);
    let out = env.credit_then_tick(fast);
    let backup = tasks_of(&out, fast);
    assert_eq!(backup.len(), 1, "no wait for the slow worker: {out:?}");
    let out = env.answer(fast, backup[0], TaskStatus::Ok, b"done", 20_000);
    assert_eq!(outcomes(&out), [ok(0, "done")]);
    assert_eq!(aborts(&out), [(slow, t[0], 1)]);
    // The fast worker's own tasks are not hedged before 1.5 x its p95.
    let t = hedged(&mut env, client, fast);
    assert_eq!(t.len(), 1);
    assert!(tasks_of(&env.tick_after(25), slow).is_empty());
    assert_eq!(env.core.stats().counters.hedges, 1);
}

#[test]
fn with_equal_workers_nothing_is_hedged_early() {
    let mut env = TestEnv::new();
    let (a, b) = paced(&mut env, [1, 1], 20_000, 20_000, 20);
    let client = env.new_client();
    hedged(&mut env, client, a);
    env.credit(b, 1);
    env.advance(25);
    assert!(
        env.tick().is_empty(),
        "a 20 ms function at 25 ms is not late"
    );
    // The pace's deviation starts at half the first sample and decays by 1/8 a result:
    // after 10 results the mark is about 1.5 x 26 ms.
    assert_eq!(tasks_of(&env.tick_after(20), b).len(), 1, "at 45 ms it is");
}

#[test]
fn a_straggler_that_loses_its_race_still_teaches_its_pace() {
    let mut env = TestEnv::new();
    // Four results of the slow worker: one short of a known pace.
    let (fast, slow) = paced(&mut env, [1, 1], 20_000, 200_000, 8);
    alternate(&mut env, fast, fast, 20_000, 20_000, 2);
    let client = env.new_client();
    let (pkg, _) = env.submit_spec(client, Spec::tasks(1).function(2).hedge());
    let t = env.take(slow, 1);
    env.credit(fast, 1);
    assert!(
        env.tick().is_empty(),
        "not yet a known straggler: no hedge at once"
    );
    // 1.5 x the fast worker's p95 (mean + 2 deviations, ~30 ms after 6 results).
    let backup = tasks_of(&env.tick_after(60), fast);
    assert_eq!(backup.len(), 1);
    env.answer(fast, backup[0], TaskStatus::Ok, b"done", 20_000);
    env.ack_all(client, pkg);
    // The package is gone when the straggler answers; its time still counts.
    env.advance(160);
    env.answer(slow, t[0], TaskStatus::Ok, b"done", 200_000);
    hedged(&mut env, client, slow);
    let out = env.credit_then_tick(fast);
    assert_eq!(
        tasks_of(&out, fast).len(),
        1,
        "a known straggler now: {out:?}"
    );
}

#[test]
fn a_known_straggler_checks_again_soon_for_a_free_credit() {
    let mut env = TestEnv::new();
    let (fast, slow) = paced(&mut env, [1, 2], 20_000, 200_000, 20);
    let client = env.new_client();
    // The fast worker is busy: the hedged task goes to the slow worker, no credit elsewhere.
    env.submit_spec(client, Spec::tasks(1).function(2));
    let busy = env.take(fast, 1);
    env.submit_spec(client, Spec::tasks(1).function(2).hedge());
    assert_eq!(env.take(slow, 1).len(), 1);
    assert!(env.tick().is_empty(), "no free credit elsewhere yet");
    env.complete_exec(fast, busy[0], 20_000);
    env.credit(fast, 1);
    // Checked again within an eighth of the fast worker's p95 (a few ms), not a p95 later.
    assert_eq!(tasks_of(&env.tick_after(5), fast).len(), 1);
}

#[test]
fn a_straggler_whose_copy_is_killed_still_gets_a_known_pace() {
    let mut env = TestEnv::new();
    // Four results of the slow worker: one short of a known pace.
    let (fast, slow) = paced(&mut env, [1, 1], 20_000, 200_000, 8);
    alternate(&mut env, fast, fast, 20_000, 20_000, 2);
    let client = env.new_client();
    let t = hedged(&mut env, client, slow);
    env.credit(fast, 1);
    let backup = tasks_of(&env.tick_after(60), fast);
    assert_eq!(backup.len(), 1);
    env.advance(20);
    let out = env.answer(fast, backup[0], TaskStatus::Ok, b"done", 20_000);
    assert_eq!(aborts(&out), [(slow, t[0], 1)]);
    // The slow worker's process is killed: it answers "cancelled", never a time.
    env.answer(slow, t[0], TaskStatus::Cancelled, b"killed", 0);
    // The abort after 80 ms counted as at least its 200 ms mean: a known straggler now.
    hedged(&mut env, client, slow);
    let out = env.credit_then_tick(fast);
    assert_eq!(tasks_of(&out, fast).len(), 1, "hedged at once: {out:?}");
}

#[test]
fn a_straggler_whose_process_is_replaced_is_still_known_when_it_comes_back() {
    // The case: a supervised worker replaces its process when the master aborts a
    // task there (the straggler's losing copy), and the new process connects again. Its pace
    // is kept under its key, so the new connection is a known straggler at once.
    let mut env = TestEnv::new();
    let fast = env.new_worker(1);
    let key = WorkerKey(900);
    let slow = env.new_worker_keyed(1, key);
    alternate(&mut env, fast, slow, 20_000, 200_000, 20);
    let client = env.new_client();
    let t = hedged(&mut env, client, slow);
    let backup = tasks_of(&env.credit_then_tick(fast), fast);
    assert_eq!(backup.len(), 1, "a known straggler: hedged at once");
    env.advance(20);
    let out = env.answer(fast, backup[0], TaskStatus::Ok, b"done", 20_000);
    assert_eq!(aborts(&out), [(slow, t[0], 1)]);
    // The abort kills the slow worker's process: its connection is lost, a new one joins.
    env.lose_worker(slow);
    let again = env.new_worker_keyed(1, key);
    let t = hedged(&mut env, client, again);
    assert_eq!(t.len(), 1);
    let out = env.credit_then_tick(fast);
    assert_eq!(
        tasks_of(&out, fast).len(),
        1,
        "the new connection is the same straggler: hedged at once: {out:?}"
    );
    // A connection under a key never seen is judged on its own (no hedge before the mark).
    let stranger = env.new_worker_keyed(1, WorkerKey(901));
    let t = hedged(&mut env, client, stranger);
    assert_eq!(t.len(), 1);
    let spare = env.new_worker(1);
    assert!(tasks_of(&env.credit_then_tick(spare), spare).is_empty());
}

#[test]
fn a_lost_fast_worker_does_not_set_the_mark_until_its_key_is_back() {
    let mut env = TestEnv::new();
    let key = WorkerKey(700);
    let fast = env.new_worker_keyed(1, key);
    let slow = env.new_worker(1);
    alternate(&mut env, fast, slow, 20_000, 200_000, 20);
    env.lose_worker(fast);
    // Only the slow worker is connected: its own pace is the healthy one, nothing is late at
    // 40 ms (a fresh worker gets the task; the slow one's credit waits).
    let fresh = env.new_worker(1);
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).function(2).hedge());
    assert_eq!(env.take(fresh, 1).len(), 1);
    env.credit(slow, 1);
    env.advance(40);
    assert!(
        env.tick().is_empty(),
        "judged against 200 ms, not a gone worker's 20 ms"
    );
    assert_eq!(env.core.stats().counters.hedges, 0);
    // The fast worker's key reconnects: its pace counts again, and next to it the slow worker
    // is a known straggler, hedged at once.
    let back = env.new_worker_keyed(1, key);
    env.submit_spec(client, Spec::tasks(1).function(2).hedge());
    let out = env.credit_then_tick(back);
    assert_eq!(tasks_of(&out, back).len(), 1, "hedged at once: {out:?}");
    assert_eq!(env.core.stats().counters.hedges, 1);
}
