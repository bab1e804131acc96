//! Calls of named functions (and transactions) whose package asks for resources or labels:
//! they run only on servers of their function that can serve the request, hold the request
//! while they run, and are refused (or wait) when no server of the function could run them.
//! The invariants (class accounting, sub-queue servers) are checked after every step.

mod common;

use common::*;
use rtpool_core::{
    Labels, PackageOpts, RejectReason, Resources, TaskStatus, Unschedulable, WorkerId,
};

fn asking(resources: &[(&str, u64)], labels: &[(&str, &str)]) -> PackageOpts {
    PackageOpts {
        resources: Resources::new(resources.iter().map(|(n, a)| ((*n).to_owned(), *a))).unwrap(),
        labels: Labels::new(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
        .unwrap(),
        ..PackageOpts::default()
    }
}

/// A worker with `slots`, `resources` and `labels`, serving `f` version 1, with `credits`.
fn server(
    env: &mut TestEnv,
    slots: u32,
    resources: &[(&str, u64)],
    labels: &[(&str, &str)],
    credits: u32,
) -> WorkerId {
    let w = env.new_worker_with(slots, resources, labels);
    assert!(env.serve(w, &[("f", "1")]).is_empty());
    if credits > 0 {
        env.credit(w, credits);
    }
    w
}

fn gpu_in_use(env: &TestEnv, worker: WorkerId) -> u64 {
    env.core
        .worker_views()
        .find(|w| w.id == worker)
        .map_or(0, |w| w.in_use.get("gpu"))
}

#[test]
fn calls_with_labels_run_only_on_the_matching_server_and_others_anywhere() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let b = server(&mut env, 4, &[], &[("zone", "b")], 4);
    let a = server(&mut env, 4, &[], &[("zone", "a")], 4);
    let graph: Vec<(&str, &[u32])> = vec![("x", &[]); 3];
    let (_, out) = env.submit_calls_with(c, asking(&[], &[("zone", "a")]), calls("f", &graph));
    assert_eq!(calls_of(&out, b), vec![]);
    assert_eq!(calls_of(&out, a).len(), 3, "{out:?}");
    // Without a request, calls go to either server (b has the most room now).
    let (_, out) = env.submit_calls(c, calls("f", &[("y", &[])]));
    assert_eq!(calls_of(&out, b).len(), 1, "{out:?}");
}

#[test]
fn a_server_with_two_gpus_runs_at_most_two_gpu_calls_at_once() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = server(&mut env, 6, &[("gpu", 2)], &[], 6);
    let graph: Vec<(&str, &[u32])> = vec![("x", &[]); 6];
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 1)], &[]), calls("f", &graph));
    let mut running = calls_of(&out, w);
    assert_eq!(running.len(), 2, "{out:?}");
    assert_eq!(gpu_in_use(&env, w), 2);
    // The entries carry the request, for the worker to pick the devices.
    let (_, assigned) = &call_assignments(&out)[0];
    assert!(assigned.iter().all(|a| a.res.get("gpu") == 1));
    let mut done = 0;
    while let Some(id) = running.pop() {
        let out = env.complete(w, id);
        done += 1;
        let mut next = calls_of(&out, w);
        if next.is_empty() {
            next = calls_of(&env.credit(w, 1), w);
        }
        running.extend(next);
        assert!(running.len() <= 2, "{} gpu calls at once", running.len());
        assert!(gpu_in_use(&env, w) <= 2);
    }
    assert_eq!(done, 6);
    assert_eq!(gpu_in_use(&env, w), 0);
}

#[test]
fn calls_that_ask_for_nothing_are_not_held_up_by_waiting_gpu_calls() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = server(&mut env, 4, &[("gpu", 1)], &[], 4);
    let graph: Vec<(&str, &[u32])> = vec![("x", &[]); 3];
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 1)], &[]), calls("f", &graph));
    assert_eq!(calls_of(&out, w).len(), 1);
    // Two gpu calls wait for the GPU; a plain call takes one of the three free credits.
    let (_, out) = env.submit_calls(c, calls("f", &[("y", &[])]));
    assert_eq!(calls_of(&out, w).len(), 1, "{out:?}");
    assert!(call_assignments(&out)[0].1[0].res.is_empty());
}

#[test]
fn a_call_no_server_of_its_function_can_run_is_refused_by_name() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    // One worker has the GPU but does not serve f; the server of f has none.
    let gpu = env.new_worker_with(1, &[("gpu", 1)], &[]);
    assert!(env.serve(gpu, &[("g", "1")]).is_empty());
    server(&mut env, 1, &[], &[], 1);
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 1)], &[]), calls("f", &[("x", &[])]));
    let RejectReason::Unschedulable(message) = only_rejection(&out) else {
        panic!("{out:?}");
    };
    assert_mentions(
        &message,
        &["gpu=1", "'f' version 1", "unschedulable=\"wait\""],
    );
    // No worker at all has it: the class's own message, naming what the best one has.
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 4)], &[]), calls("f", &[("x", &[])]));
    let RejectReason::Unschedulable(message) = only_rejection(&out) else {
        panic!("{out:?}");
    };
    assert_mentions(&message, &["gpu=4", "gpu=1"]);
}

#[test]
fn a_waiting_call_gets_the_notice_and_runs_when_a_matching_server_comes() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    server(&mut env, 1, &[], &[], 1);
    let opts = PackageOpts {
        unschedulable: Unschedulable::Wait,
        ..asking(&[], &[("zone", "a")])
    };
    let (package, out) = env.submit_calls_with(c, opts, calls("f", &[("x", &[])]));
    assert!(call_assignments(&out).is_empty(), "{out:?}");
    let notice = env.core.unschedulable_notice(package).expect("a notice");
    assert_mentions(&notice, &["zone=a"]);
    let a = env.new_worker_with(1, &[], &[("zone", "a")]);
    env.serve(a, &[("f", "1")]);
    assert!(env.core.unschedulable_notice(package).is_none());
    let out = env.credit(a, 1);
    assert_eq!(calls_of(&out, a).len(), 1, "{out:?}");
}

#[test]
fn a_transaction_with_labels_runs_every_call_on_the_matching_server() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let b = server(&mut env, 2, &[], &[("zone", "b")], 2);
    let a = server(&mut env, 2, &[], &[("zone", "a")], 2);
    let graph = calls("f", &[("x", &[]), ("y", &[0]), ("z", &[0, 1])]);
    let (_, out) = env.submit_calls_with(c, asking(&[], &[("zone", "a")]), graph);
    let mut ran = 0;
    let mut next = calls_of(&out, a);
    assert_eq!(calls_of(&out, b), vec![]);
    while let Some(id) = next.pop() {
        ran += 1;
        let out = env.complete(a, id);
        assert_eq!(calls_of(&out, b), vec![], "{out:?}");
        next.extend(calls_of(&out, a));
        if next.is_empty() {
            let out = env.credit(a, 1);
            assert_eq!(calls_of(&out, b), vec![]);
            next.extend(calls_of(&out, a));
        }
    }
    assert_eq!(ran, 3);
}

#[test]
fn a_lost_matching_server_requeues_its_call_for_the_other_matching_server() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let plain = server(&mut env, 1, &[], &[], 1);
    let first = server(&mut env, 1, &[("gpu", 1)], &[], 1);
    let second = server(&mut env, 1, &[("gpu", 1)], &[], 0);
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 1)], &[]), calls("f", &[("x", &[])]));
    let ran = calls_of(&out, first);
    assert_eq!(ran.len(), 1, "{out:?}");
    let out = env.lose_worker(first);
    assert_eq!(calls_of(&out, plain), vec![], "{out:?}");
    let out = env.credit(second, 1);
    assert_eq!(calls_of(&out, second), ran, "{out:?}");
    assert_eq!(gpu_in_use(&env, second), 1);
    let out = env.complete(second, ran[0]);
    assert_eq!(outcomes(&out)[0].1, TaskStatus::Ok);
    assert_eq!(gpu_in_use(&env, second), 0);
}

#[test]
fn calls_left_without_a_matching_server_fail_after_the_grace_unless_they_wait() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    server(&mut env, 1, &[], &[], 1);
    let a = server(&mut env, 1, &[], &[("zone", "a")], 0);
    let (_, out) =
        env.submit_calls_with(c, asking(&[], &[("zone", "a")]), calls("f", &[("x", &[])]));
    assert!(call_assignments(&out).is_empty());
    let opts = PackageOpts {
        unschedulable: Unschedulable::Wait,
        ..asking(&[], &[("zone", "a")])
    };
    let (waiting, _) = env.submit_calls_with(c, opts, calls("f", &[("y", &[])]));
    env.lose_worker(a);
    // The service has a server still: only the class's grace applies.
    let out = env.tick_after(31_000);
    let failed = outcomes(&out);
    assert_eq!(failed.len(), 1, "{out:?}");
    assert_eq!(failed[0].1, TaskStatus::Failed);
    assert_mentions(&failed[0].2, &["zone=a", "'f'"]);
    // The waiting one is still queued, and runs when a matching server comes back.
    let back = server(&mut env, 1, &[], &[("zone", "a")], 0);
    let ran = calls_of(&env.credit(back, 1), back);
    assert_eq!(ran.len(), 1);
    let out = env.complete(back, ran[0]);
    assert!(results(&out).iter().any(|(p, _)| *p == waiting), "{out:?}");
}

#[test]
fn a_draining_server_stops_getting_class_calls() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let a = server(&mut env, 2, &[], &[("zone", "a")], 2);
    let a2 = server(&mut env, 2, &[], &[("zone", "a")], 0);
    env.drain(a);
    let graph: Vec<(&str, &[u32])> = vec![("x", &[]); 2];
    let (_, out) = env.submit_calls_with(c, asking(&[], &[("zone", "a")]), calls("f", &graph));
    assert!(call_assignments(&out).is_empty(), "{out:?}");
    let out = env.credit(a2, 2);
    assert_eq!(calls_of(&out, a2).len(), 2);
}

#[test]
fn a_restored_package_of_calls_keeps_its_request_and_waits_for_a_matching_server() {
    let mut env = TestEnv::new();
    // Restored before any worker is back: it waits whatever its policy (`error` here).
    let out = env.step(rtpool_core::Event::Restore(Box::new(
        rtpool_core::RestoredPackage {
            package: rtpool_core::PackageId(9),
            user: rtpool_core::UserId(1),
            fn_hash: rtpool_core::CALLS_HASH,
            fn_code: bytes::Bytes::new(),
            opts: asking(&[("gpu", 1)], &[]),
            tasks: Vec::new(),
            done: Vec::new(),
            delivered: Vec::new(),
            // The journal names the version each call was resolved to.
            calls: calls("f", &[("x", &[]), ("y", &[0])])
                .into_iter()
                .map(|mut c| {
                    c.version = "1".to_owned();
                    c
                })
                .collect(),
        },
    )));
    assert!(call_assignments(&out).is_empty(), "{out:?}");
    let plain = server(&mut env, 2, &[], &[], 0);
    assert_eq!(calls_of(&env.credit(plain, 2), plain), vec![]);
    let gpu = server(&mut env, 2, &[("gpu", 1)], &[], 0);
    let out = env.credit(gpu, 2);
    let first = calls_of(&out, gpu);
    assert_eq!(first.len(), 1, "{out:?}");
    assert_eq!(call_assignments(&out)[0].1[0].res.get("gpu"), 1);
    let out = env.complete(gpu, first[0]);
    assert_eq!(calls_of(&out, plain), vec![]);
    assert_eq!(
        calls_of(&out, gpu).len(),
        1,
        "the dependent call follows: {out:?}"
    );
}

#[test]
fn a_class_counts_its_queued_and_running_calls() {
    let mut env = TestEnv::new();
    let c = env.new_client();
    let w = server(&mut env, 4, &[("gpu", 1)], &[], 4);
    let graph: Vec<(&str, &[u32])> = vec![("x", &[]); 3];
    let (_, out) = env.submit_calls_with(c, asking(&[("gpu", 1)], &[]), calls("f", &graph));
    assert_eq!(calls_of(&out, w).len(), 1);
    let view = env
        .core
        .class_views()
        .find(|v| v.name == "gpu=1")
        .expect("its class");
    assert_eq!((view.queued, view.running, view.workers), (2, 1, 1));
}
