//! Random sequences of servers joining and leaving, credits, call graphs, answers (ok or
//! failed), cancels and time: after every step the core's invariants hold (`TestEnv`), every
//! call is assigned only once all its inputs exist and with exactly those inputs in order,
//! and no call gets two results. At the end, with a server for every function and every
//! call answered, each call has exactly one result or was cancelled, a call whose input
//! failed has failed too, and the core is empty.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::TestEnv;
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_core::{Action, CallSpec, CoreConfig, PackageId, TaskId, TaskStatus, WorkerId};

const FUNCTIONS: [&str; 3] = ["f", "g", "h"];

#[derive(Debug, Clone)]
enum Op {
    AddServer { mask: u8, slots: u32 },
    LoseWorker { w: usize },
    Credit { w: usize, n: u32 },
    Submit { calls: Vec<(usize, Vec<usize>)> },
    Answer { w: usize, k: usize, ok: bool },
    Cancel { p: usize, index: usize },
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let sel = any::<usize>;
    prop_oneof![
        2 => (1u8..8, 1u32..3).prop_map(|(mask, slots)| Op::AddServer { mask, slots }),
        1 => sel().prop_map(|w| Op::LoseWorker { w }),
        3 => (sel(), 1u32..3).prop_map(|(w, n)| Op::Credit { w, n }),
        2 => vec((0usize..3, vec(sel(), 0..3)), 1..6).prop_map(|calls| Op::Submit { calls }),
        5 => (sel(), sel(), prop::bool::weighted(0.8))
            .prop_map(|(w, k, ok)| Op::Answer { w, k, ok }),
        1 => (sel(), sel()).prop_map(|(p, index)| Op::Cancel { p, index }),
        1 => (0u64..3_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// A package: its id, each call's deps, each call's result status once sent, and which
/// calls the client cancelled.
type MPackage = (PackageId, Vec<Vec<u32>>, Vec<Option<TaskStatus>>, Vec<bool>);

#[derive(Default)]
struct Model {
    packages: Vec<MPackage>,
    by_id: HashMap<PackageId, usize>,
    workers: Vec<WorkerId>,
    /// Calls held by each worker, as `(task, package slot, index)`.
    held: HashMap<WorkerId, Vec<(TaskId, usize, u32)>>,
}

fn data(p: usize, index: u32) -> Bytes {
    Bytes::from(format!("{p}:{index}"))
}

impl Model {
    fn observe(&mut self, env: &TestEnv, out: &[Action]) {
        for a in out {
            match a {
                Action::AssignCalls { worker, calls } => {
                    for c in calls {
                        let s = std::str::from_utf8(&c.args).unwrap();
                        let (p, i) = s.split_once(':').unwrap();
                        let (p, i): (usize, u32) = (p.parse().unwrap(), i.parse().unwrap());
                        let deps = &self.packages[p].1[i as usize];
                        let statuses = &self.packages[p].2;
                        let expect: Vec<Bytes> = deps.iter().map(|&d| data(p, d)).collect();
                        for &d in deps {
                            assert_eq!(
                                statuses[d as usize],
                                Some(TaskStatus::Ok),
                                "call {p}:{i} started before its input {d}"
                            );
                        }
                        assert_eq!(c.inputs, expect, "inputs of {p}:{i}");
                        self.held.entry(*worker).or_default().push((c.task, p, i));
                    }
                }
                Action::SendResults {
                    package, results, ..
                } => {
                    let p = self.by_id[package];
                    for r in results {
                        let slot = &mut self.packages[p].2[r.index as usize];
                        assert!(slot.is_none(), "two results for {p}:{}", r.index);
                        *slot = Some(r.status);
                    }
                }
                Action::Abort { worker, tasks } => {
                    // Aborted calls answer "cancelled" at once.
                    let _ = (env, worker, tasks);
                }
                _ => {}
            }
        }
    }

    fn answer(&mut self, env: &mut TestEnv, w: WorkerId, k: usize, ok: bool) {
        let Some(held) = self.held.get_mut(&w).filter(|h| !h.is_empty()) else {
            return;
        };
        let (task, p, i) = held.remove(k % held.len());
        let attempt = env.assigned[&task].1;
        let mut outcome = env.outcome(task, attempt);
        outcome.status = if ok {
            TaskStatus::Ok
        } else {
            TaskStatus::Error
        };
        outcome.data = data(p, i);
        let out = env.step(rtpool_core::Event::Results {
            worker: w,
            results: vec![outcome],
        });
        self.observe(env, &out);
    }
}

fn run(ops: Vec<Op>) {
    let config = CoreConfig {
        service_grace_ns: 2_000_000_000,
        ..CoreConfig::default()
    };
    let mut env = TestEnv::with_config(config);
    let client = env.new_client();
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::AddServer { mask, slots } => {
                let w = env.new_worker(slots);
                let fns: Vec<(&str, &str)> = FUNCTIONS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, f)| (*f, "1"))
                    .collect();
                let out = env.serve(w, &fns);
                m.observe(&env, &out);
                m.workers.push(w);
            }
            Op::LoseWorker { w } => {
                if m.workers.is_empty() {
                    continue;
                }
                let w = m.workers.remove(w % m.workers.len());
                m.held.remove(&w);
                let out = env.lose_worker(w);
                m.observe(&env, &out);
            }
            Op::Credit { w, n } => {
                if let Some(&w) = m.workers.get(w % m.workers.len().max(1)) {
                    let out = env.credit(w, n);
                    m.observe(&env, &out);
                }
            }
            Op::Submit { calls } => {
                let p = m.packages.len();
                let specs: Vec<CallSpec> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (f, deps))| CallSpec {
                        name: FUNCTIONS[*f].to_owned(),
                        version: String::new(),
                        args: data(p, i as u32),
                        deps: if i == 0 {
                            Vec::new()
                        } else {
                            deps.iter().map(|d| (d % i) as u32).collect()
                        },
                        fetch: false,
                    })
                    .collect();
                let deps: Vec<Vec<u32>> = specs.iter().map(|s| s.deps.clone()).collect();
                let (id, out) = env.submit_calls(client, specs);
                if out.iter().any(|a| matches!(a, Action::Accepted { .. })) {
                    let n = deps.len();
                    m.by_id.insert(id, p);
                    m.packages.push((id, deps, vec![None; n], vec![false; n]));
                    m.observe(&env, &out);
                } else {
                    // Refused (a function nobody serves): keep the numbering dense.
                    m.packages.push((id, deps, Vec::new(), Vec::new()));
                }
            }
            Op::Answer { w, k, ok } => {
                if let Some(&w) = m.workers.get(w % m.workers.len().max(1)) {
                    m.answer(&mut env, w, k, ok);
                }
            }
            Op::Cancel { p, index } => {
                if m.packages.is_empty() {
                    continue;
                }
                let p = p % m.packages.len();
                let n = m.packages[p].2.len();
                if n == 0 {
                    continue;
                }
                let index = index % n;
                let id = m.packages[p].0;
                m.packages[p].3[index] = true;
                let out = env.cancel(client, id, &[index as u32]);
                m.observe(&env, &out);
            }
            Op::Advance { ms } => {
                let out = env.tick_after(ms);
                m.observe(&env, &out);
            }
        }
    }
    // Drain: a server of everything with plenty of credits answers every call.
    let w = env.new_worker(4);
    let out = env.serve(w, &[("f", "1"), ("g", "1"), ("h", "1")]);
    m.observe(&env, &out);
    m.workers.push(w);
    for _ in 0..200 {
        let workers = m.workers.clone();
        for &w in &workers {
            let out = env.credit(w, 8);
            m.observe(&env, &out);
            while m.held.get(&w).is_some_and(|h| !h.is_empty()) {
                m.answer(&mut env, w, 0, true);
            }
        }
        if env.core.stats().tasks == 0 {
            break;
        }
    }
    assert_eq!(
        env.core.stats().tasks,
        0,
        "calls left: {:?}",
        env.core.stats()
    );
    assert_eq!(env.core.stats().packages, 0);
    for (p, (_, deps, statuses, cancelled)) in m.packages.iter().enumerate() {
        for (i, status) in statuses.iter().enumerate() {
            let dep_failed = deps[i]
                .iter()
                .any(|&d| statuses[d as usize].is_some_and(|s| s != TaskStatus::Ok));
            match status {
                None => assert!(
                    cancelled[i] || deps[i].iter().any(|&d| statuses[d as usize].is_none()),
                    "call {p}:{i} has no result and was not cancelled"
                ),
                Some(TaskStatus::Ok) => assert!(!dep_failed, "{p}:{i} ran without input"),
                Some(_) => {}
            }
            if dep_failed && status.is_some() {
                assert_ne!(*status, Some(TaskStatus::Ok));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn random_call_graphs_lose_nothing(ops in vec(op(), 1..60)) {
        run(ops);
    }
}
