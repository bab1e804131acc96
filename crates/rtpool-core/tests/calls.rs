//! Scenario tests of named functions (grid RPC): the registry, calls, their dependency graphs
//! and placement, on a synthetic clock with the invariants checked after every step.

mod common;

use bytes::Bytes;
use common::*;
use rtpool_core::{
    Action, CoreConfig, PackageOpts, RejectReason, ServiceInfo, TaskStatus, WorkerId,
};

fn functions(env: &mut TestEnv, name: &str) -> Vec<ServiceInfo> {
    let client = env.new_client();
    let out = env.step(rtpool_core::Event::Functions {
        client,
        req_id: 7,
        name: name.to_owned(),
    });
    match &out[..] {
        [Action::FunctionsReply {
            req_id: 7,
            functions,
            ..
        }] => functions.clone(),
        other => panic!("expected one FunctionsReply, got {other:?}"),
    }
}

#[test]
fn the_registry_lists_who_serves_what_as_workers_come_and_go() {
    let mut env = TestEnv::new();
    let a = env.new_server(1, &[("dmmul", "1"), ("add", "1")], 0);
    let b = env.new_server(1, &[("add", "1"), ("add", "2")], 0);
    let listed: Vec<(String, String, u32)> = functions(&mut env, "")
        .into_iter()
        .map(|f| (f.name, f.version, f.servers))
        .collect();
    let expect = vec![
        ("add".to_owned(), "2".to_owned(), 1),
        ("add".to_owned(), "1".to_owned(), 2),
        ("dmmul".to_owned(), "1".to_owned(), 1),
    ];
    assert_eq!(listed, expect);
    let one = functions(&mut env, "dmmul");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].interface, Bytes::from("dmmul:1"));
    assert_eq!(env.core.stats().services, 3);
    env.lose_worker(a);
    let names: Vec<(String, u32)> = functions(&mut env, "")
        .into_iter()
        .map(|f| (format!("{}:{}", f.name, f.version), f.servers))
        .collect();
    // dmmul lost its last server: listed with none for the service grace (calls may still
    // name it and wait for a server to return), after the served ones.
    assert_eq!(
        names,
        vec![
            ("add:2".to_owned(), 1),
            ("add:1".to_owned(), 1),
            ("dmmul:1".to_owned(), 0)
        ]
    );
    // A draining worker serves nothing more: every entry is within its grace, then gone.
    env.drain(b);
    let names: Vec<u32> = functions(&mut env, "").iter().map(|f| f.servers).collect();
    assert_eq!(names, vec![0, 0, 0]);
    assert_eq!(env.core.stats().services, 3);
    env.tick_after(CoreConfig::default().service_grace_ns / 1_000_000);
    assert!(functions(&mut env, "").is_empty());
    assert_eq!(env.core.stats().services, 0);
}

#[test]
fn a_call_naming_a_function_whose_server_just_left_waits_for_the_next_server() {
    let mut env = TestEnv::new();
    let a = env.new_server(1, &[("f", "1")], 0);
    env.lose_worker(a);
    // Within the grace the call is accepted and queued, not refused.
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, vec![call("f", "x", &[])]);
    assert!(
        out.iter().any(|x| matches!(x, Action::Accepted { .. })),
        "refused: {out:?}"
    );
    // A new server of the same interface takes it.
    let b = env.new_server(1, &[("f", "1")], 0);
    assert_eq!(calls_of(&env.credit(b, 1), b).len(), 1);
    assert_eq!(env.core.stats().services, 1);
}

#[test]
fn a_different_interface_under_a_served_name_and_version_is_refused() {
    let mut env = TestEnv::new();
    env.new_server(1, &[("f", "1")], 0);
    let w = env.new_worker(1);
    let out = env.step(rtpool_core::Event::Serve {
        worker: w,
        functions: vec![
            rtpool_core::ServiceDecl {
                name: "f".into(),
                version: "1".into(),
                interface: Bytes::from_static(b"other"),
            },
            rtpool_core::ServiceDecl {
                name: "g".into(),
                version: "1".into(),
                interface: Bytes::from_static(b"g"),
            },
        ],
    });
    assert_eq!(
        out,
        vec![Action::ServeRefused {
            worker: w,
            name: "f".into(),
            version: "1".into()
        }]
    );
    let served: Vec<(String, u32)> = functions(&mut env, "")
        .into_iter()
        .map(|f| (f.name, f.servers))
        .collect();
    assert_eq!(served, vec![("f".to_owned(), 1), ("g".to_owned(), 1)]);
}

#[test]
fn a_call_of_an_unserved_function_names_it_and_what_is_served() {
    let mut env = TestEnv::new();
    env.new_server(1, &[("add", "1"), ("add", "2"), ("dmmul", "1")], 1);
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, vec![call("dgemm", "x", &[])]);
    let reason = rejection(&out);
    assert_eq!(
        reason.to_string(),
        "no worker serves 'dgemm'; served: add (2, 1), dmmul (1)"
    );
    let mut versioned = call("add", "x", &[]);
    versioned.version = "3".into();
    let (_, out) = env.submit_calls(client, vec![versioned]);
    assert!(rejection(&out)
        .to_string()
        .starts_with("no worker serves 'add' version 3;"));
    assert_eq!(env.core.stats().packages, 0);
}

#[test]
fn the_newest_version_is_called_unless_one_is_named() {
    let mut env = TestEnv::new();
    let w = env.new_server(4, &[("add", "1"), ("add", "1.10"), ("add", "1.9")], 4);
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, vec![call("add", "a", &[])]);
    let calls = call_assignments(&out);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, w);
    assert_eq!(calls[0].1[0].version, "1.10");
    let mut named = call("add", "b", &[]);
    named.version = "1".into();
    let (_, out) = env.submit_calls(client, vec![named]);
    assert_eq!(call_assignments(&out)[0].1[0].version, "1");
}

#[test]
fn calls_go_only_to_workers_that_serve_them_and_code_tasks_anywhere() {
    let mut env = TestEnv::new();
    let plain = env.new_worker(1);
    env.credit(plain, 4);
    let client = env.new_client();
    let (_, out) = env.submit_calls(client, vec![call("add", "x", &[])]);
    assert!(matches!(
        rejection(&out),
        RejectReason::UnknownFunction { .. }
    ));
    let s = env.new_server(1, &[("add", "1")], 0);
    let (package, out) = env.submit_calls(client, calls("add", &[("1", &[]), ("2", &[])]));
    assert!(
        call_assignments(&out).is_empty(),
        "nothing for the plain worker"
    );
    let out = env.credit(s, 1);
    let first = calls_of(&out, s);
    assert_eq!(first.len(), 1);
    assert_eq!(env.args[&first[0]], Bytes::from("1"));
    let out = env.complete(s, first[0]);
    let r = results(&out);
    assert_eq!(r[0].0, package);
    assert_eq!(
        r[0].1[0].data,
        Bytes::from("1"),
        "no dependents: data is sent"
    );
    // A code task goes to the plain worker while the second call waits for the server.
    let (_, out) = env.submit(client, 1);
    assert_eq!(tasks_of(&out, plain).len(), 1);
    let out = env.credit(s, 1);
    assert_eq!(calls_of(&out, s).len(), 1);
}

#[test]
fn a_call_whose_worker_leaves_mid_call_runs_on_another_server() {
    let mut env = TestEnv::new();
    let a = env.new_server(1, &[("slow", "1")], 1);
    let client = env.new_client();
    let (package, out) = env.submit_calls(client, vec![call("slow", "s", &[])]);
    let id = calls_of(&out, a)[0];
    let b = env.new_server(1, &[("slow", "1")], 1);
    let out = env.lose_worker(a);
    let moved = call_assignments(&out);
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].0, b);
    assert_eq!(moved[0].1[0].task, id);
    assert_eq!(moved[0].1[0].attempt, 2);
    let out = env.complete(b, id);
    assert_eq!(results(&out)[0].0, package);
    assert_eq!(env.core.stats().counters.requeued, 1);
}

/// A -> (B, C) -> D on two one-slot servers.
#[test]
fn a_diamond_runs_its_middle_in_parallel_and_ships_only_what_is_asked_for() {
    let mut env = TestEnv::new();
    let w1 = env.new_server(1, &[("f", "1")], 1);
    let w2 = env.new_server(1, &[("f", "1")], 1);
    let client = env.new_client();
    let (package, out) = env.submit_calls(
        client,
        calls("f", &[("A", &[]), ("B", &[0]), ("C", &[0]), ("D", &[1, 2])]),
    );
    let a = call_assignments(&out);
    assert_eq!(a.len(), 1, "only A can start");
    let (wa, ta) = (a[0].0, a[0].1[0].task);
    assert_eq!(a[0].1[0].args, Bytes::from("A"));
    let out = env.answer(wa, ta, TaskStatus::Ok, b"a-out", 1_000);
    // A's result goes to the client without its data; B and C start on both workers at once.
    let r = results(&out);
    assert_eq!(r[0].1[0].index, 0);
    assert!(r[0].1[0].data.is_empty(), "intermediate result shipped");
    // The worker that ran A pulls again: B and C take one worker each.
    let out2 = env.credit(wa, 1);
    let mut started: Vec<(WorkerId, String, Vec<Bytes>)> = call_assignments(&out)
        .into_iter()
        .chain(call_assignments(&out2))
        .flat_map(|(w, calls)| {
            calls
                .into_iter()
                .map(move |c| (w, String::from_utf8(c.args.to_vec()).unwrap(), c.inputs))
        })
        .collect();
    started.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(started.len(), 2, "B and C both started: {started:?}");
    assert_eq!(started[0].1, "B");
    assert_eq!(started[1].1, "C");
    assert_ne!(started[0].0, started[1].0, "B and C on different workers");
    assert_eq!(started[0].2, vec![Bytes::from("a-out")]);
    assert_eq!(started[1].2, vec![Bytes::from("a-out")]);
    let ids: Vec<_> = env
        .assigned
        .iter()
        .filter(|(_, (w, _))| *w == w1 || *w == w2)
        .map(|(t, _)| *t)
        .collect();
    let find =
        |env: &TestEnv, arg: &str| *ids.iter().find(|t| env.args[*t] == arg.as_bytes()).unwrap();
    let (tb, tc) = (find(&env, "B"), find(&env, "C"));
    let wb = env.assigned[&tb].0;
    let wc = env.assigned[&tc].0;
    env.answer(wc, tc, TaskStatus::Ok, b"c-out", 1_000);
    env.credit(wc, 1);
    let out = env.answer(wb, tb, TaskStatus::Ok, b"b-out", 1_000);
    let out = [out, env.credit(wb, 1)].concat();
    let d = call_assignments(&out);
    assert_eq!(d.len(), 1, "D starts once both inputs exist");
    assert_eq!(d[0].1[0].args, Bytes::from("D"));
    assert_eq!(
        d[0].1[0].inputs,
        vec![Bytes::from("b-out"), Bytes::from("c-out")],
        "inputs in the order of deps"
    );
    let out = env.answer(d[0].0, d[0].1[0].task, TaskStatus::Ok, b"d-out", 1_000);
    let r = results(&out);
    assert_eq!(r[0].1[0].index, 3);
    assert_eq!(r[0].1[0].data, Bytes::from("d-out"), "the leaf is shipped");
    assert_eq!(freed(&out), vec![(package, false)]);
}

#[test]
fn an_intermediate_result_is_shipped_when_asked_for() {
    let mut env = TestEnv::new();
    let w = env.new_server(1, &[("f", "1")], 2);
    let client = env.new_client();
    let mut first = call("f", "A", &[]);
    first.fetch = true;
    let (_, out) = env.submit_calls(client, vec![first, call("f", "B", &[0])]);
    let ta = calls_of(&out, w)[0];
    let out = env.answer(w, ta, TaskStatus::Ok, b"a-out", 10);
    assert_eq!(results(&out)[0].1[0].data, Bytes::from("a-out"));
    assert_eq!(calls_of(&out, w).len(), 1, "B starts on the same event");
}

#[test]
fn a_failing_call_fails_its_dependents_transitively_and_the_rest_runs() {
    let mut env = TestEnv::new();
    let w = env.new_server(2, &[("f", "1"), ("g", "1")], 2);
    let client = env.new_client();
    let (package, out) = env.submit_calls(
        client,
        vec![
            call("f", "A", &[]),
            call("g", "B", &[0]),
            call("g", "C", &[1]),
            call("g", "E", &[]),
        ],
    );
    let started = calls_of(&out, w);
    assert_eq!(started.len(), 2, "A and E start");
    let ta = *started
        .iter()
        .find(|t| env.args[*t] == "A".as_bytes())
        .unwrap();
    let te = *started.iter().find(|t| **t != ta).unwrap();
    let out = env.answer(w, ta, TaskStatus::Error, b"boom", 10);
    let got = outcomes(&out);
    let statuses: Vec<(u32, TaskStatus)> = got.iter().map(|(i, s, _)| (*i, *s)).collect();
    assert_eq!(
        statuses,
        vec![
            (0, TaskStatus::Error),
            (1, TaskStatus::Failed),
            (2, TaskStatus::Failed)
        ]
    );
    assert_eq!(got[0].2, "boom", "a failed call's error is shipped");
    assert_eq!(
        got[1].2,
        "call #1 g not run: its input from call #0 f raised an error (see that call's result)"
    );
    assert!(got[2]
        .2
        .starts_with("call #2 g not run: its input from call #1 g failed (Failed: call #1"));
    assert!(call_assignments(&out).is_empty(), "no dependent started");
    let out = env.complete(w, te);
    assert_eq!(outcomes(&out)[0].1, TaskStatus::Ok);
    assert_eq!(freed(&out), vec![(package, false)]);
}

#[test]
fn cancelling_a_call_cancels_its_dependents() {
    let mut env = TestEnv::new();
    let w = env.new_server(1, &[("f", "1")], 1);
    let client = env.new_client();
    let (package, out) =
        env.submit_calls(client, calls("f", &[("A", &[]), ("B", &[0]), ("C", &[1])]));
    let ta = calls_of(&out, w)[0];
    let out = env.cancel(client, package, &[0]);
    assert_eq!(aborts(&out).len(), 1, "the running call is aborted");
    assert!(results(&out).is_empty(), "no results for cancelled calls");
    assert_eq!(freed(&out), vec![(package, false)], "nothing left of it");
    assert_eq!(
        env.core.stats().tasks,
        1,
        "the aborted call, until its worker answers"
    );
    env.answer(w, ta, TaskStatus::Cancelled, b"", 0);
    assert_eq!(env.core.stats().tasks, 0);
    assert_eq!(env.core.stats().services, 1, "still served");
}

#[test]
fn the_shortest_known_call_goes_first_within_a_priority() {
    let mut env = TestEnv::new();
    let w = env.new_server(1, &[("long", "1"), ("short", "1")], 0);
    let client = env.new_client();
    // Teach the estimates: long 10 ms, short 1 ms.
    for (name, exec) in [("long", 10_000), ("short", 1_000)] {
        let (_, _) = env.submit_calls(client, vec![call(name, "learn", &[])]);
        let t = calls_of(&env.credit(w, 1), w)[0];
        env.answer(w, t, TaskStatus::Ok, b"", exec);
    }
    let (_, _) = env.submit_calls(client, vec![call("long", "L", &[])]);
    let (_, _) = env.submit_calls(client, vec![call("short", "S", &[])]);
    let high = PackageOpts {
        priority: 5,
        ..PackageOpts::default()
    };
    let (_, _) = env.submit_calls_with(client, high, vec![call("long", "H", &[])]);
    let mut order = Vec::new();
    for _ in 0..3 {
        let t = calls_of(&env.credit(w, 1), w)[0];
        order.push(String::from_utf8(env.args[&t].to_vec()).unwrap());
        env.answer(w, t, TaskStatus::Ok, b"", 10);
    }
    assert_eq!(
        order,
        vec!["H", "S", "L"],
        "priority first, then shortest job"
    );
}

/// Runs one call of `f` on `w` (the only worker given a credit), taking `exec_us`.
fn run_on(env: &mut TestEnv, client: rtpool_core::ClientId, w: WorkerId, exec_us: u64) {
    env.credit(w, 1);
    let (_, out) = env.submit_calls(client, vec![call("f", "run", &[])]);
    let t = calls_of(&out, w)[0];
    env.answer(w, t, TaskStatus::Ok, b"", exec_us);
}

#[test]
fn placement_avoids_a_busy_server() {
    let mut env = TestEnv::new();
    let x = env.new_server(1, &[("f", "1")], 0);
    let busy = env.new_server(1, &[("f", "1")], 0);
    let idle = env.new_server(1, &[("f", "1")], 0);
    let client = env.new_client();
    run_on(&mut env, client, x, 1_000); // f's mean: 1 ms

    // Two calls wait on `busy` (one slot), then one runs on `x`: placement would look at
    // `busy` first now (it rotates past the last worker it chose).
    env.credit(busy, 3);
    let (_, out) = env.submit_calls(client, calls("f", &[("1", &[]), ("2", &[])]));
    assert_eq!(calls_of(&out, busy).len(), 2);
    env.credit(x, 1);
    let (_, out) = env.submit_calls(client, vec![call("f", "3", &[])]);
    assert_eq!(calls_of(&out, x).len(), 1);
    env.credit(idle, 1);
    // `busy` has a credit left but two calls ahead of a third: `idle` wins.
    let (_, out) = env.submit_calls(client, vec![call("f", "4", &[])]);
    assert_eq!(calls_of(&out, idle).len(), 1, "{out:?}");
}

#[test]
fn placement_prefers_the_faster_server() {
    let mut env = TestEnv::new();
    let slow = env.new_server(1, &[("f", "1")], 0);
    let fast = env.new_server(1, &[("f", "1")], 0);
    let client = env.new_client();
    run_on(&mut env, client, fast, 1_000);
    run_on(&mut env, client, fast, 1_000);
    run_on(&mut env, client, slow, 4_000); // 4x the mean
    run_on(&mut env, client, fast, 1_000); // placement now looks at `slow` first
    env.credit(slow, 1);
    env.credit(fast, 1);
    let (_, out) = env.submit_calls(client, vec![call("f", "go", &[])]);
    assert_eq!(calls_of(&out, fast).len(), 1, "{out:?}");
    // With only the slow one free, it still gets the call (no credit is left idle).
    let (_, out) = env.submit_calls(client, vec![call("f", "go2", &[])]);
    assert_eq!(calls_of(&out, slow).len(), 1);
}

#[test]
fn calls_left_without_a_server_wait_for_the_grace_period_then_fail() {
    let config = CoreConfig {
        service_grace_ns: 5_000_000_000,
        ..CoreConfig::default()
    };
    let mut env = TestEnv::with_config(config);
    let w = env.new_server(1, &[("f", "1")], 0);
    let client = env.new_client();
    let (package, _) = env.submit_calls(client, calls("f", &[("1", &[]), ("2", &[])]));
    env.lose_worker(w);
    assert_eq!(env.core.stats().services, 1, "kept: calls name it");
    // A server comes back in time: the calls run.
    assert!(env.tick_after(4_000).is_empty());
    let back = env.new_server(1, &[("f", "1")], 1);
    let t = calls_of(&env.credit(back, 0), back);
    assert!(t.is_empty());
    env.lose_worker(back);
    let out = env.tick();
    assert!(results(&out).is_empty());
    // Gone for good: they fail after the grace period.
    let out = env.tick_after(5_001);
    let got = outcomes(&out);
    assert_eq!(got.len(), 2, "both calls fail");
    for (_, status, message) in &got {
        assert_eq!(*status, TaskStatus::Failed);
        assert!(
            message.starts_with("no worker serves 'f' version 1 any more"),
            "{message}"
        );
    }
    assert_eq!(freed(&out), vec![(package, false)]);
    assert_eq!(env.core.stats().services, 0, "freed with its last call");
}

#[test]
fn options_for_copies_and_bad_dependencies_are_refused() {
    let mut env = TestEnv::new();
    env.new_server(1, &[("f", "1")], 1);
    let client = env.new_client();
    let opts = PackageOpts {
        replicas: 2,
        ..PackageOpts::default()
    };
    let (_, out) = env.submit_calls_with(client, opts, vec![call("f", "x", &[])]);
    assert!(rejection(&out)
        .to_string()
        .contains("replicas is for shipped-code tasks"));
    let opts = PackageOpts {
        resources: rtpool_core::Resources::new([("gpu".to_owned(), 1)]).unwrap(),
        ..PackageOpts::default()
    };
    let (_, out) = env.submit_calls_with(client, opts, vec![call("f", "x", &[])]);
    // A request no server of the function can serve (no worker has a GPU): refused by name
    // (calls_resources.rs has the rest).
    let message = rejection(&out).to_string();
    assert!(
        matches!(rejection(&out), RejectReason::Unschedulable(_)) && message.contains("gpu=1"),
        "{message}"
    );
    let (_, out) = env.submit_calls(client, vec![call("f", "x", &[0])]);
    assert_eq!(
        rejection(&out),
        RejectReason::InvalidCall {
            index: 0,
            reason: "it depends on call #0, which is not an earlier call of the package".into()
        }
    );
    let (_, out) = env.submit_calls(client, vec![]);
    assert_eq!(rejection(&out), RejectReason::Empty);
}

#[test]
fn the_core_marks_a_call_packages_results_as_not_journaled() {
    // With deliveries reported (as the master's journal asks), a call package's results are
    // marked not to journal (a restored call package runs its undelivered calls again), its
    // deliveries and end are; a code package's are all marked to.
    let mut env = TestEnv::with_config(CoreConfig {
        report_deliveries: true,
        ..CoreConfig::default()
    });
    let s = env.new_server(1, &[("add", "1")], 1);
    let plain = env.new_worker(1);
    env.credit(plain, 1);
    let client = env.new_client();
    let (calls, out) = env.submit_calls(client, vec![call("add", "x", &[])]);
    let called = calls_of(&out, s);
    let (code, out) = env.submit(client, 1);
    let task = tasks_of(&out, plain)[0];
    for (package, out) in [
        (calls, env.complete(s, called[0])),
        (code, env.complete(plain, task)),
    ] {
        let journal: Vec<(&str, bool)> = out
            .iter()
            .filter_map(|a| {
                match a {
                    Action::SendResults { package: p, .. } if *p == package => Some("results"),
                    Action::Delivered { package: p, .. } if *p == package => Some("delivered"),
                    Action::PackageFreed { package: p, .. } if *p == package => Some("freed"),
                    _ => None,
                }
                .map(|kind| (kind, a.is_journaled()))
            })
            .collect();
        let expect = package == code;
        assert_eq!(
            journal,
            [("results", expect), ("delivered", true), ("freed", true)],
            "{out:?}"
        );
    }
    // Orders that are not facts to record are never journaled.
    assert!(!Action::Abort {
        worker: s,
        tasks: vec![]
    }
    .is_journaled());
}

#[test]
fn an_intermediate_result_is_kept_on_its_worker_and_a_fetched_or_last_one_is_not() {
    let mut env = TestEnv::new();
    let w = env.new_server(4, &[("f", "1")], 4);
    let client = env.new_client();
    let mut fetched = call("f", "B", &[]);
    fetched.fetch = true;
    let (_, out) = env.submit_calls(
        client,
        vec![call("f", "A", &[]), fetched, call("f", "C", &[0, 1])],
    );
    let keep: Vec<(Vec<u8>, bool)> = call_assignments(&out)
        .into_iter()
        .flat_map(|(_, calls)| calls)
        .map(|c| (c.args.to_vec(), c.keep))
        .collect();
    assert_eq!(
        keep,
        vec![(b"A".to_vec(), true), (b"B".to_vec(), false)],
        "A is an input only; B is an input the client asked for: {out:?}"
    );
    let started = calls_of(&out, w);
    env.complete(w, started[0]);
    let out = env.complete(w, started[1]);
    let last = call_assignments(&out);
    assert!(!last[0].1[0].keep, "C's result goes to the client: {out:?}");
}
