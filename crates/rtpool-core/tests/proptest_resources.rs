//! Random workers with random resources and labels, random requests, against a model of what
//! resource classes must guarantee.
//!
//! Workers join with 0-3 `gpu` and no `zone` label, `zone=a` or `zone=b`; packages ask for
//! 0-2 `gpu` and maybe a zone, with the policy `error` or `wait`, and maybe keep their input
//! on one of the workers (`near`); workers grant credits,
//! answer, return their tasks, drain and are lost. The request of a package is encoded in its
//! function (`gpu * 3 + zone`), so every assignment says what its task asked. After every step,
//! besides the core's own invariants (in-use is the sum of the running tasks' requests, class
//! queues and servers consistent, no server idle that could start its class's head), the
//! model checks: a task only lands on a connected, non-draining worker that has what it asks
//! (resources at least the request, labels equal), the assignment carries the request, the
//! requests a worker holds never exceed its totals, and a submission is refused as
//! unschedulable exactly when its policy is `error` and no connected worker that is not
//! draining could serve it.
//!
//! Some workers serve the named function `f`, and packages of calls of `f` ask as packages of
//! tasks do (their request in their arguments): a call lands only on a non-draining server of
//! `f` that has what it asks, carries its request, and is never refused when such a server
//! is connected; when refused as unschedulable, no such server is.

mod common;

use common::{assignments, call, call_assignments, Spec, TestEnv};
use proptest::prelude::*;
use rtpool_core::{Action, RejectReason, TaskId, WorkerId};

const ZONES: [Option<&str>; 3] = [None, Some("a"), Some("b")];

#[derive(Debug, Clone)]
enum Op {
    AddWorker {
        slots: u32,
        gpu: u64,
        zone: usize,
        serves: bool,
    },
    LoseWorker {
        w: usize,
    },
    Drain {
        w: usize,
    },
    Credit {
        w: usize,
        n: u32,
    },
    Submit {
        tasks: usize,
        gpu: u64,
        zone: usize,
        wait: bool,
        /// A peer that keeps the input (`near`), if in range.
        near: usize,
    },
    Complete {
        w: usize,
        k: usize,
    },
    Return {
        w: usize,
    },
    SubmitCalls {
        calls: usize,
        gpu: u64,
        zone: usize,
        wait: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u32..4, 0u64..4, 0usize..3, any::<bool>())
            .prop_map(|(slots, gpu, zone, serves)| Op::AddWorker { slots, gpu, zone, serves }),
        1 => any::<usize>().prop_map(|w| Op::LoseWorker { w }),
        1 => any::<usize>().prop_map(|w| Op::Drain { w }),
        4 => (any::<usize>(), 1u32..4).prop_map(|(w, n)| Op::Credit { w, n }),
        3 => (1usize..5, 0u64..3, 0usize..3, any::<bool>(), 0usize..8)
            .prop_map(|(tasks, gpu, zone, wait, near)| Op::Submit { tasks, gpu, zone, wait, near }),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(w, k)| Op::Complete { w, k }),
        1 => any::<usize>().prop_map(|w| Op::Return { w }),
        3 => (1usize..4, 0u64..3, 0usize..3, any::<bool>())
            .prop_map(|(calls, gpu, zone, wait)| Op::SubmitCalls { calls, gpu, zone, wait }),
    ]
}

/// A worker as the model knows it.
struct Peer {
    id: WorkerId,
    gpu: u64,
    zone: usize,
    /// It serves the named function `f`.
    serves: bool,
    draining: bool,
    /// Tasks it holds and the gpus each asked for.
    held: Vec<(TaskId, u64)>,
}

impl Peer {
    fn serves(&self, gpu: u64, zone: usize) -> bool {
        self.gpu >= gpu && (zone == 0 || self.zone == zone)
    }
}

struct Model {
    env: TestEnv,
    peers: Vec<Peer>,
    client: rtpool_core::ClientId,
}

impl Model {
    fn new() -> Self {
        let mut env = TestEnv::new();
        let client = env.new_client();
        Self {
            env,
            peers: Vec::new(),
            client,
        }
    }

    fn peer(&mut self, w: usize) -> Option<usize> {
        (!self.peers.is_empty()).then(|| w % self.peers.len())
    }

    /// Checks every assignment in `out` against the model, and records it.
    fn observe(&mut self, out: &[Action]) {
        for (worker, tasks) in assignments(out) {
            let peer = self
                .peers
                .iter_mut()
                .find(|p| p.id == worker)
                .expect("assigned to a connected worker");
            assert!(!peer.draining, "assigned to draining {worker}");
            for t in tasks {
                let f = u64::from(t.fn_hash.0[0]);
                let (gpu, zone) = (f / 3, (f % 3) as usize);
                assert!(
                    peer.serves(gpu, zone),
                    "{} asks gpu={gpu} zone={:?}, landed on {worker} with gpu={} zone={:?}",
                    t.task,
                    ZONES[zone],
                    peer.gpu,
                    ZONES[peer.zone]
                );
                assert_eq!(t.res.get("gpu"), gpu, "the assignment carries the request");
                peer.held.push((t.task, gpu));
            }
            Self::check_held(peer);
        }
        for (worker, calls) in call_assignments(out) {
            let peer = self
                .peers
                .iter_mut()
                .find(|p| p.id == worker)
                .expect("assigned to a connected worker");
            assert!(
                !peer.draining && peer.serves,
                "call on {worker}, not a server of f"
            );
            for c in calls {
                let asked: u64 = String::from_utf8_lossy(&c.args).parse().expect("a request");
                let (gpu, zone) = (asked / 3, (asked % 3) as usize);
                assert!(
                    peer.serves(gpu, zone),
                    "a call asking gpu={gpu} zone={:?} landed on {worker} with gpu={} zone={:?}",
                    ZONES[zone],
                    peer.gpu,
                    ZONES[peer.zone]
                );
                assert_eq!(
                    c.res.get("gpu"),
                    gpu,
                    "the call's entry carries the request"
                );
                peer.held.push((c.task, gpu));
            }
            Self::check_held(peer);
        }
    }

    fn check_held(peer: &Peer) {
        let worker = peer.id;
        {
            let used: u64 = peer.held.iter().map(|(_, g)| g).sum();
            assert!(
                used <= peer.gpu,
                "{worker} holds {used} gpu of {}",
                peer.gpu
            );
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::AddWorker {
                slots,
                gpu,
                zone,
                serves,
            } => {
                let resources: Vec<(&str, u64)> = if gpu > 0 { vec![("gpu", gpu)] } else { vec![] };
                let labels: Vec<(&str, &str)> =
                    ZONES[zone].map(|z| ("zone", z)).into_iter().collect();
                let id = self.env.new_worker_with(slots, &resources, &labels);
                if serves {
                    let out = self.env.serve(id, &[("f", "1")]);
                    self.observe(&out);
                }
                self.peers.push(Peer {
                    id,
                    gpu,
                    zone,
                    serves,
                    draining: false,
                    held: Vec::new(),
                });
            }
            Op::LoseWorker { w } => {
                let Some(i) = self.peer(w) else { return };
                let peer = self.peers.remove(i);
                let out = self.env.lose_worker(peer.id);
                self.observe(&out);
            }
            Op::Drain { w } => {
                let Some(i) = self.peer(w) else { return };
                self.peers[i].draining = true;
                let id = self.peers[i].id;
                let out = self.env.drain(id);
                self.observe(&out);
            }
            Op::Credit { w, n } => {
                let Some(i) = self.peer(w) else { return };
                let id = self.peers[i].id;
                let out = self.env.credit(id, n);
                self.observe(&out);
            }
            Op::Submit {
                tasks,
                gpu,
                zone,
                wait,
                near,
            } => self.submit(tasks, gpu, zone, wait, near),
            Op::SubmitCalls {
                calls,
                gpu,
                zone,
                wait,
            } => self.submit_calls(calls, gpu, zone, wait),
            Op::Complete { w, k } => {
                let Some(i) = self.peer(w) else { return };
                if self.peers[i].held.is_empty() {
                    return;
                }
                let k = k % self.peers[i].held.len();
                let (task, _) = self.peers[i].held.remove(k);
                let id = self.peers[i].id;
                let out = self.env.complete(id, task);
                self.observe(&out);
            }
            Op::Return { w } => {
                let Some(i) = self.peer(w) else { return };
                let tasks: Vec<TaskId> = self.peers[i].held.drain(..).map(|(t, _)| t).collect();
                let id = self.peers[i].id;
                let out = self.env.return_tasks(id, &tasks);
                self.observe(&out);
            }
        }
    }

    fn submit(&mut self, tasks: usize, gpu: u64, zone: usize, wait: bool, near: usize) {
        let resources: Vec<(&str, u64)> = if gpu > 0 { vec![("gpu", gpu)] } else { vec![] };
        let labels: Vec<(&str, &str)> = ZONES[zone].map(|z| ("zone", z)).into_iter().collect();
        let mut spec = Spec::tasks(tasks)
            .function((gpu * 3) as u8 + zone as u8)
            .asking(&resources, &labels);
        if wait {
            spec = spec.waiting();
        }
        // Half the time no `near`; otherwise a peer, maybe one that cannot serve it.
        if let Some(p) = self.peers.get(near) {
            spec = spec.near(p.id);
        }
        let asks = gpu > 0 || zone > 0;
        let servable = self
            .peers
            .iter()
            .any(|p| !p.draining && p.serves(gpu, zone));
        let (_, out) = self.env.submit_raw(self.client, spec);
        let refused = out.iter().any(|a| {
            matches!(
                a,
                Action::Rejected {
                    reason: RejectReason::Unschedulable(_),
                    ..
                }
            )
        });
        assert_eq!(
            refused,
            asks && !wait && !servable,
            "gpu={gpu} zone={:?} wait={wait}: refused as unschedulable exactly when no \
             connected, non-draining worker can serve it and it does not wait: {out:?}",
            ZONES[zone]
        );
        self.observe(&out);
    }
}

impl Model {
    fn submit_calls(&mut self, n: usize, gpu: u64, zone: usize, wait: bool) {
        let resources = if gpu > 0 {
            vec![("gpu".to_owned(), gpu)]
        } else {
            vec![]
        };
        let labels: Vec<(String, String)> = ZONES[zone]
            .map(|z| ("zone".to_owned(), z.to_owned()))
            .into_iter()
            .collect();
        let opts = rtpool_core::PackageOpts {
            resources: rtpool_core::Resources::new(resources).unwrap(),
            labels: rtpool_core::Labels::new(labels).unwrap(),
            unschedulable: if wait {
                rtpool_core::Unschedulable::Wait
            } else {
                rtpool_core::Unschedulable::Error
            },
            ..Default::default()
        };
        let asked = (gpu * 3 + zone as u64).to_string();
        // A chain: each call after the first takes the previous one's result.
        let calls = (0..n as u32)
            .map(|i| {
                let deps: Vec<u32> = (i > 0).then(|| i - 1).into_iter().collect();
                call("f", &asked, &deps)
            })
            .collect();
        let servable = self
            .peers
            .iter()
            .any(|p| p.serves && !p.draining && p.serves(gpu, zone));
        let (_, out) = self.env.submit_calls_with(self.client, opts, calls);
        let refusal = out.iter().find_map(|a| match a {
            Action::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        });
        match refusal {
            Some(RejectReason::Unschedulable(m)) => assert!(!wait && !servable, "{m}"),
            Some(other) => assert!(!servable, "refused with a server that can run it: {other}"),
            None => {}
        }
        self.observe(&out);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_workers_and_requests(ops in proptest::collection::vec(op(), 1..60)) {
        let mut model = Model::new();
        for op in ops {
            model.apply(op);
        }
    }
}
