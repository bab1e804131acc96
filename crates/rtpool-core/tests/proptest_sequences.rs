//! Random event sequences against a model of what the core must guarantee.
//!
//! After every step: the core's own invariants, plus the model's global properties: every
//! assignment fits the credits the worker granted (and goes to a non-draining worker, with the
//! next attempt and the code only the first time), every delivered result is for a task that is
//! still pending and goes to its owner, the counters and gauges match the model exactly, and the
//! core is work-conserving (no task waits while a worker has credits). At the end the test
//! drains the system (completes everything, with a fresh worker for what is queued) and checks
//! that no task was lost: each one was delivered exactly once, or cancelled by its client, or
//! its client was lost, and the core is empty.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use common::{fn_code, fn_hash, TestEnv};
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_core::{
    Action, AssignTask, ClientId, Event, FnHash, PackageCounts, PackageId, PackageOpts, TaskId,
    TaskOutcome, TaskStatus, WorkerId, WorkerOutcome,
};

/// One random step. Selectors (`w`, `c`, `p`, `k`) are taken modulo what exists.
#[derive(Debug, Clone)]
enum Op {
    AddWorker {
        slots: u32,
    },
    LoseWorker {
        w: usize,
    },
    Credit {
        w: usize,
        n: u32,
    },
    Drain {
        w: usize,
    },
    Complete {
        w: usize,
        k: usize,
        count: usize,
    },
    Stale {
        w: usize,
        k: usize,
        kind: u8,
    },
    Return {
        w: usize,
        mask: u8,
    },
    AddClient,
    LoseClient {
        c: usize,
    },
    Submit {
        c: usize,
        n: usize,
        priority: i32,
        function: u8,
    },
    Cancel {
        p: usize,
        indices: Vec<u32>,
    },
    CancelForeign {
        c: usize,
        p: usize,
    },
    Status {
        p: usize,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let sel = any::<usize>;
    prop_oneof![
        2 => (1u32..4).prop_map(|slots| Op::AddWorker { slots }),
        1 => sel().prop_map(|w| Op::LoseWorker { w }),
        4 => (sel(), 0u32..4).prop_map(|(w, n)| Op::Credit { w, n }),
        1 => sel().prop_map(|w| Op::Drain { w }),
        6 => (sel(), sel(), 1usize..4).prop_map(|(w, k, count)| Op::Complete { w, k, count }),
        2 => (sel(), sel(), 0u8..4).prop_map(|(w, k, kind)| Op::Stale { w, k, kind }),
        1 => (sel(), any::<u8>()).prop_map(|(w, mask)| Op::Return { w, mask }),
        1 => Just(Op::AddClient),
        1 => sel().prop_map(|c| Op::LoseClient { c }),
        4 => (sel(), 1usize..6, -1i32..=1, 0u8..3)
            .prop_map(|(c, n, priority, function)| Op::Submit { c, n, priority, function }),
        2 => (sel(), vec(0u32..7, 0..3)).prop_map(|(p, indices)| Op::Cancel { p, indices }),
        1 => (sel(), sel()).prop_map(|(c, p)| Op::CancelForeign { c, p }),
        1 => sel().prop_map(|p| Op::Status { p }),
        1 => (0u64..50).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// What became of one task, in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pending,
    Delivered,
    Cancelled,
    ClientLost,
}

struct MPackage {
    id: PackageId,
    client: ClientId,
    function: u8,
    fates: Vec<Fate>,
}

#[derive(Default)]
struct MWorker {
    /// Credits granted minus tasks assigned.
    avail: u64,
    draining: bool,
    in_flight: Vec<(TaskId, u32)>,
    fn_seen: HashSet<FnHash>,
}

struct Model {
    env: TestEnv,
    workers: BTreeMap<WorkerId, MWorker>,
    clients: Vec<ClientId>,
    packages: Vec<MPackage>,
    /// `(package index, task index, latest attempt)` of every task ever assigned.
    tasks: HashMap<TaskId, (usize, u32, u32)>,
    holder: HashMap<TaskId, WorkerId>,
    /// Assignments that were answered or returned: results for them are stale.
    history: Vec<(WorkerId, TaskId, u32)>,
    stale: u64,
}

fn args(package: usize, index: u32) -> Bytes {
    Bytes::from(format!("{package}:{index}"))
}

fn parse_args(args: &Bytes) -> (usize, u32) {
    let s = std::str::from_utf8(args).unwrap();
    let (p, i) = s.split_once(':').unwrap();
    (p.parse().unwrap(), i.parse().unwrap())
}

fn pick<T: Copy>(items: &[T], sel: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[sel % items.len()])
}

impl Model {
    fn new() -> Self {
        Self {
            env: TestEnv::new(),
            workers: BTreeMap::new(),
            clients: Vec::new(),
            packages: Vec::new(),
            tasks: HashMap::new(),
            holder: HashMap::new(),
            history: Vec::new(),
            stale: 0,
        }
    }

    fn pick_worker(&self, sel: usize) -> Option<WorkerId> {
        pick(&self.workers.keys().copied().collect::<Vec<_>>(), sel)
    }

    fn is_live(&self, p: usize) -> bool {
        let pkg = &self.packages[p];
        self.clients.contains(&pkg.client) && pkg.fates.contains(&Fate::Pending)
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::AddWorker { slots } => {
                let w = self.env.new_worker(slots);
                self.workers.insert(w, MWorker::default());
            }
            Op::LoseWorker { w } => self.lose_worker(w),
            Op::Credit { w, n } => self.credit(w, n),
            Op::Drain { w } => self.drain(w),
            Op::Complete { w, k, count } => self.complete(w, k, count),
            Op::Stale { w, k, kind } => self.stale_result(w, k, kind),
            Op::Return { w, mask } => self.return_tasks(w, mask),
            Op::AddClient => self.clients.push(self.env.new_client()),
            Op::LoseClient { c } => self.lose_client(c),
            Op::Submit {
                c,
                n,
                priority,
                function,
            } => self.submit(c, n, priority, function),
            Op::Cancel { p, indices } => self.cancel(p, &indices),
            Op::CancelForeign { c, p } => self.cancel_foreign(c, p),
            Op::Status { p } => self.status(p),
            Op::Advance { ms } => self.env.advance(ms),
        }
        self.check_global();
    }

    /// Steps the core and checks its assignments and deliveries against the model. Returns the
    /// delivered `(package, index)` in order, and the other actions.
    fn step(&mut self, event: Event) -> (Vec<(usize, u32)>, Vec<Action>) {
        let out = self.env.step(event);
        self.observe(out)
    }

    /// Checks assignments and deliveries against the model, as [`Model::step`].
    fn observe(
        &mut self,
        out: impl IntoIterator<Item = Action>,
    ) -> (Vec<(usize, u32)>, Vec<Action>) {
        let mut delivered = Vec::new();
        let mut replies = Vec::new();
        let mut assigned_to = HashSet::new();
        for action in out {
            match action {
                Action::Assign { worker, tasks } => {
                    assert!(
                        assigned_to.insert(worker),
                        "two Assign for {worker} in one event"
                    );
                    self.check_assign(worker, &tasks);
                }
                Action::SendResults {
                    client,
                    package,
                    results,
                } => self.check_delivery(client, package, &results, &mut delivered),
                other => replies.push(other),
            }
        }
        (delivered, replies)
    }

    fn check_assign(&mut self, worker: WorkerId, tasks: &[AssignTask]) {
        let w = self.workers.get_mut(&worker);
        let w = w.unwrap_or_else(|| panic!("assign to unknown {worker}"));
        assert!(!w.draining, "assign to draining {worker}");
        let n = tasks.len() as u64;
        assert!(
            n <= w.avail,
            "{worker} got {n} tasks with {} credits",
            w.avail
        );
        w.avail -= n;
        for t in tasks {
            self.check_assigned_task(worker, t);
        }
    }

    /// One assigned task: pending, not held elsewhere, next attempt, code only the first time.
    fn check_assigned_task(&mut self, worker: WorkerId, t: &AssignTask) {
        let (p, index) = parse_args(&t.args);
        let fate = self.packages[p].fates[index as usize];
        assert_eq!(
            fate,
            Fate::Pending,
            "assigned task {p}:{index}, which is {fate:?}"
        );
        let other = self.holder.insert(t.task, worker);
        assert!(
            other.is_none(),
            "{} assigned while held by {other:?}",
            t.task
        );
        let previous = self.tasks.get(&t.task).map_or(0, |&(pp, ii, a)| {
            assert_eq!((pp, ii), (p, index), "task id {} changed identity", t.task);
            a
        });
        assert_eq!(
            t.attempt,
            previous + 1,
            "attempts of {} count up by one",
            t.task
        );
        self.tasks.insert(t.task, (p, index, t.attempt));
        let w = self.workers.get_mut(&worker).unwrap();
        w.in_flight.push((t.task, t.attempt));
        let function = self.packages[p].function;
        assert_eq!(t.fn_hash, fn_hash(function));
        let first = w.fn_seen.insert(t.fn_hash);
        assert_eq!(
            t.fn_code,
            first.then(|| fn_code(function)),
            "code cache of {worker}"
        );
    }

    fn check_delivery(
        &mut self,
        client: ClientId,
        package: PackageId,
        results: &[TaskOutcome],
        delivered: &mut Vec<(usize, u32)>,
    ) {
        let p = self
            .packages
            .iter()
            .position(|m| m.id == package)
            .expect("results of an unknown package");
        assert_eq!(
            self.packages[p].client, client,
            "results of {package} sent to another client"
        );
        assert!(!results.is_empty());
        for r in results {
            let fate = &mut self.packages[p].fates[r.index as usize];
            assert_eq!(
                *fate,
                Fate::Pending,
                "result for {p}:{} which is {fate:?}",
                r.index
            );
            *fate = Fate::Delivered;
            assert_eq!(r.data, args(p, r.index), "result routed to the wrong task");
            delivered.push((p, r.index));
        }
    }

    fn submit(&mut self, c: usize, n: usize, priority: i32, function: u8) {
        let Some(client) = pick(&self.clients, c) else {
            return;
        };
        let p = self.packages.len();
        let req_id = p as u64;
        let out = self.env.step(Event::Submit {
            client,
            req_id,
            fn_hash: fn_hash(function),
            fn_code: fn_code(function),
            opts: PackageOpts { priority },
            tasks: (0..n as u32).map(|i| args(p, i)).collect(),
        });
        let Some(&Action::Accepted {
            client: c,
            req_id: r,
            package,
        }) = out.first()
        else {
            panic!("not accepted first: {out:?}");
        };
        assert_eq!((c, r), (client, req_id));
        assert!(
            self.packages.iter().all(|m| m.id != package),
            "{package} reused"
        );
        let fates = vec![Fate::Pending; n];
        self.packages.push(MPackage {
            id: package,
            client,
            function,
            fates,
        });
        let (delivered, replies) = self.observe(out.into_iter().skip(1));
        assert!(delivered.is_empty() && replies.is_empty());
    }

    fn credit(&mut self, w: usize, n: u32) {
        if let Some(worker) = self.pick_worker(w) {
            self.credit_worker(worker, n);
        }
    }

    fn credit_worker(&mut self, worker: WorkerId, n: u32) {
        let mw = self.workers.get_mut(&worker).unwrap();
        if !mw.draining {
            mw.avail += u64::from(n);
        }
        let (delivered, replies) = self.step(Event::Credit { worker, credits: n });
        assert!(delivered.is_empty() && replies.is_empty());
    }

    fn drain(&mut self, w: usize) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let mw = self.workers.get_mut(&worker).unwrap();
        (mw.avail, mw.draining) = (0, true);
        assert!(self.env.step(Event::Drain { worker }).is_empty());
    }

    fn lose_worker(&mut self, w: usize) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let mw = self.workers.remove(&worker).unwrap();
        for (task, attempt) in mw.in_flight {
            self.holder.remove(&task);
            self.history.push((worker, task, attempt));
        }
        let (delivered, replies) = self.step(Event::WorkerLost { worker });
        assert!(delivered.is_empty() && replies.is_empty());
    }

    /// Takes entries out of a worker's in-flight list, as answered or returned.
    fn take_in_flight(&mut self, worker: WorkerId, chosen: &[usize]) -> Vec<(TaskId, u32)> {
        let mw = self.workers.get_mut(&worker).unwrap();
        let taken: Vec<_> = chosen.iter().map(|&i| mw.in_flight[i]).collect();
        let mut i = 0;
        mw.in_flight.retain(|_| {
            i += 1;
            !chosen.contains(&(i - 1))
        });
        for &(task, attempt) in &taken {
            self.holder.remove(&task);
            self.history.push((worker, task, attempt));
        }
        taken
    }

    fn complete(&mut self, w: usize, k: usize, count: usize) {
        if let Some(worker) = self.pick_worker(w) {
            self.complete_on(worker, k, count);
        }
    }

    /// The worker answers `count` of its tasks (from the `k`th on) in one event.
    fn complete_on(&mut self, worker: WorkerId, k: usize, count: usize) {
        let len = self.workers[&worker].in_flight.len();
        if len == 0 {
            return;
        }
        let chosen: Vec<usize> = (0..count.min(len)).map(|j| (k + j) % len).collect();
        let taken = self.take_in_flight(worker, &chosen);
        let mut expected: Vec<(usize, u32)> = Vec::new();
        let mut results = Vec::new();
        for &(task, attempt) in &taken {
            let (p, index, _) = self.tasks[&task];
            if self.packages[p].fates[index as usize] == Fate::Pending {
                expected.push((p, index));
            }
            results.push(outcome(task, attempt, args(p, index)));
        }
        // One SendResults per package, packages in order of their first result.
        let mut order: Vec<usize> = Vec::new();
        expected.iter().for_each(|&(p, _)| {
            if !order.contains(&p) {
                order.push(p)
            }
        });
        let grouped: Vec<_> = order
            .iter()
            .flat_map(|&p| expected.iter().filter(move |e| e.0 == p).copied())
            .collect();
        let (delivered, replies) = self.step(Event::Results { worker, results });
        assert_eq!(delivered, grouped);
        assert!(replies.is_empty());
    }

    fn stale_result(&mut self, w: usize, k: usize, kind: u8) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let held = pick(&self.workers[&worker].in_flight, k);
        let other = self
            .workers
            .keys()
            .copied()
            .find(|&o| o != worker)
            .unwrap_or(WorkerId(u64::MAX));
        let (from, task, attempt) = match (kind, held, pick(&self.history, k)) {
            (0, Some((task, attempt)), _) => (worker, task, attempt + 1),
            (1, Some((task, attempt)), _) => (other, task, attempt),
            (2, _, Some(old)) => old,
            _ => (
                worker,
                TaskId(0xFFFF_0000_0000_0000 | (k as u64 & 0xFFFF)),
                1,
            ),
        };
        self.stale += 1;
        let results = vec![outcome(task, attempt, Bytes::from_static(b"stale"))];
        let (delivered, replies) = self.step(Event::Results {
            worker: from,
            results,
        });
        assert!(delivered.is_empty() && replies.is_empty());
    }

    fn return_tasks(&mut self, w: usize, mask: u8) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let len = self.workers[&worker].in_flight.len().min(7);
        let chosen: Vec<usize> = (0..len).filter(|i| mask & (1 << i) != 0).collect();
        let mut tasks = self.take_in_flight(worker, &chosen);
        if mask & 0x80 != 0 {
            if let Some(&(task, attempt)) = tasks.first() {
                tasks.push((task, attempt + 3));
            }
        }
        // Returning withdraws the worker's unused credits.
        self.workers.get_mut(&worker).expect("picked worker").avail = 0;
        let (delivered, replies) = self.step(Event::Returned { worker, tasks });
        assert!(delivered.is_empty() && replies.is_empty());
    }

    fn lose_client(&mut self, c: usize) {
        let Some(client) = pick(&self.clients, c) else {
            return;
        };
        self.clients.retain(|&x| x != client);
        for pkg in self.packages.iter_mut().filter(|m| m.client == client) {
            pkg.fates
                .iter_mut()
                .filter(|f| **f == Fate::Pending)
                .for_each(|f| *f = Fate::ClientLost);
        }
        assert!(self.env.step(Event::ClientLost { client }).is_empty());
    }

    fn cancel(&mut self, p: usize, indices: &[u32]) {
        let Some(p) = pick(&(0..self.packages.len()).collect::<Vec<_>>(), p) else {
            return;
        };
        let (client, package) = (self.packages[p].client, self.packages[p].id);
        if !self.clients.contains(&client) {
            return;
        }
        let live = self.is_live(p);
        if live {
            let fates = &mut self.packages[p].fates;
            let all: Vec<u32> = (0..fates.len() as u32).collect();
            for &i in if indices.is_empty() { &all } else { indices } {
                if let Some(f) = fates.get_mut(i as usize).filter(|f| **f == Fate::Pending) {
                    *f = Fate::Cancelled;
                }
            }
        }
        let (delivered, replies) = self.step(Event::Cancel {
            client,
            package,
            indices: indices.to_vec(),
        });
        assert!(delivered.is_empty());
        let expected = if live {
            vec![]
        } else {
            vec![Action::UnknownPackage { client, package }]
        };
        assert_eq!(replies, expected);
    }

    fn cancel_foreign(&mut self, c: usize, p: usize) {
        let (Some(client), Some(pkg)) = (
            pick(&self.clients, c),
            self.packages.get(p % self.packages.len().max(1)),
        ) else {
            return;
        };
        if pkg.client == client {
            return;
        }
        let package = pkg.id;
        let (delivered, replies) = self.step(Event::Cancel {
            client,
            package,
            indices: vec![],
        });
        assert!(delivered.is_empty());
        assert_eq!(replies, [Action::UnknownPackage { client, package }]);
    }

    fn status(&mut self, p: usize) {
        let Some(p) = pick(&(0..self.packages.len()).collect::<Vec<_>>(), p) else {
            return;
        };
        let (client, package) = (self.packages[p].client, self.packages[p].id);
        if !self.clients.contains(&client) {
            return;
        }
        let expected = if self.is_live(p) {
            Action::StatusReply {
                client,
                req_id: 5,
                package,
                counts: self.counts(p),
            }
        } else {
            Action::UnknownPackage { client, package }
        };
        let (delivered, replies) = self.step(Event::Status {
            client,
            req_id: 5,
            package,
        });
        assert!(delivered.is_empty());
        assert_eq!(replies, [expected]);
    }

    /// The counters the model expects for package `p`.
    fn counts(&self, p: usize) -> PackageCounts {
        let pkg = &self.packages[p];
        let count = |fate| pkg.fates.iter().filter(|&&f| f == fate).count() as u32;
        let running = self
            .holder
            .keys()
            .filter(|t| self.is_pending_of(t, p))
            .count() as u32;
        let pending = count(Fate::Pending);
        PackageCounts {
            total: pkg.fates.len() as u32,
            queued: pending - running,
            running,
            done: count(Fate::Delivered),
            cancelled: count(Fate::Cancelled),
        }
    }

    fn is_pending_of(&self, task: &TaskId, p: usize) -> bool {
        let (tp, index, _) = self.tasks[task];
        tp == p && self.packages[p].fates[index as usize] == Fate::Pending
    }

    fn is_pending(&self, task: &TaskId) -> bool {
        let (p, index, _) = self.tasks[task];
        self.packages[p].fates[index as usize] == Fate::Pending
    }

    /// Gauges, counters, credits and work conservation, after every step.
    fn check_global(&self) {
        let stats = self.env.core.stats();
        let fates = || self.packages.iter().flat_map(|p| p.fates.iter());
        let pending = fates().filter(|&&f| f == Fate::Pending).count();
        let running = self.holder.keys().filter(|t| self.is_pending(t)).count();
        assert_eq!(stats.running, running, "running");
        assert_eq!(stats.cancelling, self.holder.len() - running, "cancelling");
        assert_eq!(stats.queued, pending - running, "queued");
        assert_eq!(stats.tasks, stats.queued + stats.running + stats.cancelling);
        assert_eq!(
            stats.delivered,
            fates().filter(|&&f| f == Fate::Delivered).count() as u64
        );
        assert_eq!(
            stats.packages,
            (0..self.packages.len())
                .filter(|&p| self.is_live(p))
                .count()
        );
        assert_eq!(
            (stats.workers, stats.clients),
            (self.workers.len(), self.clients.len())
        );
        assert_eq!(stats.stale_results, self.stale);
        for (&id, w) in &self.workers {
            let s = self.env.core.worker_stats(id).unwrap();
            assert_eq!(
                (u64::from(s.credits), s.in_flight, s.draining),
                (w.avail, w.in_flight.len(), w.draining),
                "{id}"
            );
            assert!(
                stats.queued == 0 || w.avail == 0 || w.draining,
                "{id} has credits while tasks wait"
            );
        }
    }

    /// Completes everything still running, hands what is queued to a fresh worker, and checks
    /// that every task ended delivered or cancelled and the core is empty.
    fn finish(&mut self) {
        for _ in 0..3 {
            let workers: Vec<WorkerId> = self.workers.keys().copied().collect();
            for w in workers {
                let len = self.workers[&w].in_flight.len();
                self.complete_on(w, 0, len);
                self.check_global();
            }
            if self.env.core.stats().queued > 0 {
                let w = self.env.new_worker(1);
                self.workers.insert(w, MWorker::default());
                self.credit_worker(w, 1_000_000);
                self.check_global();
            }
        }
        self.check_global();
        let stats = self.env.core.stats();
        assert_eq!(
            (stats.tasks, stats.packages, stats.functions),
            (0, 0, 0),
            "{stats:?}"
        );
        for (p, pkg) in self.packages.iter().enumerate() {
            assert!(
                !pkg.fates.contains(&Fate::Pending),
                "package {p} lost a task: {:?}",
                pkg.fates
            );
        }
    }
}

fn outcome(task: TaskId, attempt: u32, data: Bytes) -> WorkerOutcome {
    WorkerOutcome {
        task,
        attempt,
        status: TaskStatus::Ok,
        data,
        exec_us: 1,
        wait_us: 2,
        flush_us: 3,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_promise(ops in vec(op(), 1..120)) {
        let mut model = Model::new();
        for op in ops {
            model.apply(op);
        }
        model.finish();
    }
}
