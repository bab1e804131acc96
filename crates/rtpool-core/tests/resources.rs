//! Resource classes: tasks that ask for resources or labels run only on workers that have
//! them, hold them while they run, and are refused (or wait) when no worker could serve them.

mod common;

use common::{assignments, tasks_of, Spec, TestEnv};
use rtpool_core::{Action, RejectReason, TaskStatus};

/// How many of `worker`'s tasks hold `gpu` now, from its view.
fn gpu_in_use(env: &TestEnv, worker: rtpool_core::WorkerId) -> u64 {
    env.core
        .worker_views()
        .find(|w| w.id == worker)
        .map(|w| w.in_use.get("gpu"))
        .unwrap_or(0)
}

#[test]
fn a_worker_with_two_gpus_runs_at_most_two_gpu_tasks_at_once() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = env.new_worker_with(4, &[("gpu", 2)], &[]);
    env.credit(w, 4);
    let (_, out) = env.submit_spec(c, Spec::tasks(5).asking(&[("gpu", 1)], &[]));
    let first = tasks_of(&out, w);
    assert_eq!(first.len(), 2, "{out:?}");
    assert_eq!(gpu_in_use(&env, w), 2);
    // The assignments carry the request, for the worker to pick the devices.
    let (_, tasks) = &assignments(&out)[0];
    assert!(tasks.iter().all(|t| t.res.get("gpu") == 1));
    // Each result frees one GPU for the next task, never more than two at once.
    let mut done = 0;
    let mut running = first;
    while let Some(id) = running.pop() {
        let out = env.complete(w, id);
        done += 1;
        let mut next = tasks_of(&out, w);
        if next.is_empty() {
            next = tasks_of(&env.credit(w, 1), w);
        }
        running.extend(next);
        assert!(running.len() <= 2, "{} gpu tasks at once", running.len());
        assert!(gpu_in_use(&env, w) <= 2);
    }
    assert_eq!(done, 5);
    assert_eq!(gpu_in_use(&env, w), 0);
}

#[test]
fn tasks_land_only_on_workers_that_have_what_they_ask() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let plain = env.new_worker_with(2, &[], &[("zone", "b")]);
    let gpu = env.new_worker_with(2, &[("gpu", 1)], &[("zone", "a")]);
    env.credit(plain, 2);
    env.credit(gpu, 2);
    let (_, out) = env.submit_spec(c, Spec::tasks(2).asking(&[], &[("zone", "a")]));
    assert_eq!(tasks_of(&out, plain), vec![]);
    assert_eq!(tasks_of(&out, gpu).len(), 2);
    // Tasks that ask for nothing may run anywhere, the GPU host included.
    let (_, out) = env.submit(c, 2);
    assert_eq!(tasks_of(&out, plain).len(), 2);
}

#[test]
fn a_request_no_worker_can_serve_is_refused_by_name() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    env.new_worker_with(2, &[("gpu", 2)], &[]);
    let (_, out) = env.submit_raw(c, Spec::tasks(1).asking(&[("gpu", 4)], &[]));
    let reason = out
        .iter()
        .find_map(|a| match a {
            Action::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .expect("refused");
    let RejectReason::Unschedulable(message) = reason else {
        panic!("{reason:?}");
    };
    assert!(
        message.contains("gpu=4") && message.contains("gpu=2"),
        "{message}"
    );
    let (_, out) = env.submit_raw(c, Spec::tasks(1).asking(&[], &[("zone", "x")]));
    assert!(
        matches!(&out[..], [Action::Rejected { reason: RejectReason::Unschedulable(m), .. }] if m.contains("zone=x")),
        "{out:?}"
    );
}

#[test]
fn a_waiting_request_runs_when_a_worker_that_can_serve_it_joins() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let (package, out) = env.submit_spec(c, Spec::tasks(1).asking(&[("gpu", 1)], &[]).waiting());
    assert!(assignments(&out).is_empty());
    assert!(env.core.unschedulable_notice(package).is_some());
    let w = env.new_worker_with(1, &[("gpu", 1)], &[]);
    assert!(env.core.unschedulable_notice(package).is_none());
    let out = env.credit(w, 1);
    assert_eq!(tasks_of(&out, w).len(), 1);
}

#[test]
fn a_task_of_a_lost_worker_reruns_on_another_matching_worker() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let a = env.new_worker_with(1, &[("gpu", 1)], &[]);
    let plain = env.new_worker(1);
    env.credit(plain, 1);
    env.credit(a, 1);
    let (_, out) = env.submit_spec(c, Spec::tasks(1).asking(&[("gpu", 1)], &[]));
    let [id] = tasks_of(&out, a)[..] else {
        panic!("{out:?}");
    };
    let b = env.new_worker_with(1, &[("gpu", 1)], &[]);
    env.lose_worker(a);
    let out = env.credit(b, 1);
    assert_eq!(tasks_of(&out, b), vec![id]);
    assert_eq!(gpu_in_use(&env, b), 1);
}

#[test]
fn queued_tasks_fail_when_the_last_matching_worker_leaves_for_the_grace() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = env.new_worker_with(1, &[("gpu", 1)], &[]);
    env.credit(w, 1);
    let (_, out) = env.submit_spec(c, Spec::tasks(2).asking(&[("gpu", 1)], &[]));
    assert_eq!(tasks_of(&out, w).len(), 1);
    env.lose_worker(w);
    let out = env.tick_after(31_000);
    let outcomes = common::outcomes(&out);
    assert_eq!(outcomes.len(), 2, "{out:?}");
    assert!(outcomes
        .iter()
        .all(|(_, s, m)| *s == TaskStatus::Failed && m.contains("gpu=1")));
}

#[test]
fn replicas_of_a_class_task_go_to_distinct_matching_workers() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let a = env.new_worker_with(2, &[("gpu", 2)], &[]);
    let b = env.new_worker_with(2, &[("gpu", 2)], &[]);
    env.credit(a, 2);
    env.credit(b, 2);
    let mut spec = Spec::tasks(1).asking(&[("gpu", 1)], &[]);
    spec.replicas = 2;
    spec.quorum = 2;
    let (_, out) = env.submit_spec(c, spec);
    assert_eq!(tasks_of(&out, a).len(), 1, "{out:?}");
    assert_eq!(tasks_of(&out, b).len(), 1, "{out:?}");
}

#[test]
fn a_class_with_many_busy_servers_feeds_whichever_one_gets_a_credit() {
    // 100 servers of gpu=1, each running one gpu task; more gpu tasks queued. Whichever
    // server answers and asks again gets the next one, however far down the servers' list it
    // is (a placement that looked at a fixed window of servers left it idle).
    let mut env = TestEnv::new();
    let c = env.new_client();
    let workers: Vec<_> = (0..100)
        .map(|_| env.new_worker_with(2, &[("gpu", 1)], &[]))
        .collect();
    let (_, out) = env.submit_spec(c, Spec::tasks(150).asking(&[("gpu", 1)], &[]));
    assert!(out.is_empty() || assignments(&out).is_empty());
    let mut running = Vec::new();
    for &w in &workers {
        let got = tasks_of(&env.credit(w, 2), w);
        assert_eq!(got.len(), 1, "one gpu, one task, the second credit waits");
        running.push((w, got[0]));
    }
    for &(w, id) in running.iter().rev().take(40) {
        let out = env.complete(w, id);
        assert_eq!(
            tasks_of(&out, w).len(),
            1,
            "{w} freed its gpu and had a credit"
        );
        assert_eq!(gpu_in_use(&env, w), 1);
    }
}

#[test]
fn classes_of_equal_priority_take_turns() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = env.new_worker_with(4, &[("gpu", 4), ("mem_gb", 4)], &[]);
    let (_, gpu) = env.submit_spec(c, Spec::tasks(4).asking(&[("gpu", 1)], &[]));
    let (_, mem) = env.submit_spec(c, Spec::tasks(4).asking(&[("mem_gb", 1)], &[]));
    assert!(assignments(&gpu).is_empty() && assignments(&mem).is_empty());
    let out = env.credit(w, 4);
    let (_, tasks) = &assignments(&out)[0];
    let gpus = tasks.iter().filter(|t| t.res.get("gpu") == 1).count();
    assert_eq!((gpus, tasks.len() - gpus), (2, 2), "{out:?}");
}

#[test]
fn admission_control_counts_only_the_slots_that_can_serve_the_class() {
    let mut env = TestEnv::new();
    env.learn(5, 10_000, 10);
    let c = env.new_client();
    for _ in 0..8 {
        let w = env.new_worker(1);
        env.credit(w, 0);
    }
    let gpu = env.new_worker_with(1, &[("gpu", 1)], &[]);
    env.credit(gpu, 0);
    // 4 tasks of 10 ms: 3 x 10 ms on the one gpu slot + a p95 > 30 ms (on all 9 slots it
    // would fit).
    let spec = Spec::tasks(4)
        .function(5)
        .deadline_ms(30)
        .admit()
        .asking(&[("gpu", 1)], &[]);
    let (_, out) = env.submit_raw(c, spec.clone());
    let reason = out
        .iter()
        .find_map(|a| match a {
            Action::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("refused: {out:?}"));
    assert!(
        matches!(reason, RejectReason::Admission { slots: 1, .. }),
        "{reason:?}"
    );
    // The same package without the request fits the 9 slots.
    let (_, out) = env.submit_raw(c, Spec::tasks(4).function(5).deadline_ms(30).admit());
    assert!(matches!(out[0], Action::Accepted { .. }), "{out:?}");
    // A draining gpu worker's slot does not count any more (a package that waits for a server
    // gets that far: see the next test for one that does not).
    env.drain(gpu);
    let (_, out) = env.submit_raw(c, spec.deadline_ms(1_000).waiting());
    assert!(
        matches!(
            out[0],
            Action::Rejected {
                reason: RejectReason::NoWorkerSlots { .. },
                ..
            }
        ),
        "{out:?}"
    );
}

#[test]
fn a_request_only_draining_workers_could_serve_is_refused_and_its_queue_fails_after_the_grace() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let gpu = env.new_worker_with(1, &[("gpu", 1)], &[]);
    let plain = env.new_worker(1);
    env.credit(plain, 1);
    // Queued behind a running task, then its only server drains.
    env.credit(gpu, 1);
    let (_, out) = env.submit_spec(c, Spec::tasks(2).asking(&[("gpu", 1)], &[]));
    assert_eq!(tasks_of(&out, gpu).len(), 1, "{out:?}");
    env.drain(gpu);
    let (_, out) = env.submit_raw(c, Spec::tasks(1).asking(&[("gpu", 1)], &[]));
    let reason = out
        .iter()
        .find_map(|a| match a {
            Action::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("refused: {out:?}"));
    let RejectReason::Unschedulable(message) = reason else {
        panic!("{reason:?}");
    };
    assert!(
        message.contains("gpu=1") && message.contains("draining"),
        "{message}"
    );
    assert!(env
        .core
        .class_views()
        .any(|v| v.name == "gpu=1" && v.unschedulable && v.workers == 1));
    // The queued task fails after the grace, as when its last server leaves.
    let out = env.tick_after(31_000);
    let outcomes = common::outcomes(&out);
    assert_eq!(outcomes.len(), 1, "{out:?}");
    assert_eq!(outcomes[0].1, TaskStatus::Failed, "{out:?}");
    // A server that joins serves the class again.
    let again = env.new_worker_with(1, &[("gpu", 1)], &[]);
    let (_, out) = env.submit_spec(c, Spec::tasks(1).asking(&[("gpu", 1)], &[]));
    assert!(assignments(&out).is_empty(), "{out:?}");
    let out = env.credit(again, 1);
    assert_eq!(tasks_of(&out, again).len(), 1, "{out:?}");
}

#[test]
fn a_worker_idle_before_its_class_existed_takes_the_class_tasks_when_idle_again() {
    // Idle with no class to wait in, then without a credit while the class is made, then
    // with credits again: it must wait in the new class's offers too.
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = env.new_worker_with(2, &[], &[("zone", "a")]);
    env.credit(w, 1);
    env.return_tasks(w, &[]);
    let (_, out) = env.submit_spec(c, Spec::tasks(1).asking(&[], &[("zone", "a")]));
    assert!(assignments(&out).is_empty(), "no credit: {out:?}");
    let out = env.credit(w, 2);
    assert_eq!(tasks_of(&out, w).len(), 1, "{out:?}");
    let (_, out) = env.submit_spec(c, Spec::tasks(1).asking(&[], &[("zone", "a")]));
    assert_eq!(tasks_of(&out, w).len(), 1, "its second credit: {out:?}");
}
