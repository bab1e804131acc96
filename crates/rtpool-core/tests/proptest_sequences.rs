//! Random event sequences against a model of what the core must guarantee.
//!
//! The model predicts every effect of an event except which queued task goes to which worker
//! (dispatch is the core's choice; the model checks its legality): results (worker results,
//! time-outs, poison tasks), resends on attach, aborts, acknowledged deliveries, freed and
//! expired packages, and every counter. After every step: the core's own invariants, plus the
//! model's global properties: every assignment fits the credits the worker granted (and goes to
//! a non-draining worker, with the next attempt, the package's time limit, and the code only the
//! first time), every result is for a task that is still pending and goes to the client attached
//! to its package (or to none while it is detached), each result is sent at most once per
//! attachment, the counters, gauges and next timer match the model exactly, and the core is
//! work-conserving (no task waits while a worker has credits). Clients belong to users: a client
//! of the same user may attach, acknowledge, cancel; another user's gets `UnknownPackage`.
//! Acknowledgements are random (the test env's auto-ack is off), time advances past time
//! limits and result TTLs, and lost workers count toward the poison cap.
//!
//! At the end the test drains the system (completes everything, with a fresh worker for what
//! is queued, attaches a client to every detached package and acknowledges everything) and
//! checks that no task was lost: each one was acknowledged exactly once, or cancelled, or its
//! result was dropped with its package (whole cancel, TTL), and the core is empty.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use bytes::Bytes;
use common::{fn_code, fn_hash, TestEnv};
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_core::{
    Action, AssignTask, ClientId, CoreConfig, Event, FnHash, Instant, LossCause, PackageCounts,
    PackageId, PackageOpts, TaskId, TaskStatus, UserId, WorkerId, WorkerOutcome,
};

const MS: u64 = 1_000_000;
const GRACE_MS: u64 = 20;
const MAX_EXEC_MS: u64 = 1_000;
const TTL_MS: u64 = 400;
/// Lower than the default (3) so that random sequences reach the poison cap often.
const MAX_ATTEMPTS: u32 = 2;
/// Time limits a package may have (ms; 0 = none, so only the master's maximum applies).
const TIMEOUTS: [u32; 4] = [0, 0, 30, 100];
/// Idempotency keys a package may have ("" = none).
const KEYS: [&str; 4] = ["", "", "a", "b"];

/// One random step. Selectors (`w`, `c`, `p`, `k`) are taken modulo what exists.
#[derive(Debug, Clone)]
enum Op {
    AddWorker {
        slots: u32,
    },
    LoseWorker {
        w: usize,
        /// Silent past its lease (nothing blamed) rather than closed.
        silent: bool,
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
    AddClient {
        user: u64,
    },
    LoseClient {
        c: usize,
    },
    Submit {
        c: usize,
        n: usize,
        priority: i32,
        function: u8,
        timeout: usize,
        key: usize,
    },
    Cancel {
        p: usize,
        c: usize,
        indices: Vec<u32>,
    },
    CancelForeign {
        c: usize,
        p: usize,
    },
    Status {
        p: usize,
        c: usize,
    },
    Attach {
        p: usize,
        c: usize,
    },
    Ack {
        p: usize,
        c: usize,
        how: u8,
    },
    Advance {
        ms: u64,
    },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    let sel = any::<usize>;
    prop_oneof![
        3 => (1u32..4).prop_map(|slots| Op::AddWorker { slots }),
        3 => (sel(), any::<bool>()).prop_map(|(w, silent)| Op::LoseWorker { w, silent }),
        4 => (sel(), 0u32..4).prop_map(|(w, n)| Op::Credit { w, n }),
        1 => sel().prop_map(|w| Op::Drain { w }),
        6 => (sel(), sel(), 1usize..4).prop_map(|(w, k, count)| Op::Complete { w, k, count }),
        2 => (sel(), sel(), 0u8..4).prop_map(|(w, k, kind)| Op::Stale { w, k, kind }),
        1 => (sel(), any::<u8>()).prop_map(|(w, mask)| Op::Return { w, mask }),
        1 => (0u64..3).prop_map(|user| Op::AddClient { user }),
        1 => sel().prop_map(|c| Op::LoseClient { c }),
        4 => (sel(), 1usize..6, -1i32..=1, 0u8..3, sel(), sel()).prop_map(
            |(c, n, priority, function, timeout, key)| Op::Submit {
                c,
                n,
                priority,
                function,
                timeout,
                key
            }
        ),
        2 => (sel(), sel(), vec(0u32..7, 0..3)).prop_map(|(p, c, indices)| Op::Cancel {
            p,
            c,
            indices
        }),
        1 => (sel(), sel()).prop_map(|(c, p)| Op::CancelForeign { c, p }),
        1 => (sel(), sel()).prop_map(|(p, c)| Op::Status { p, c }),
        2 => (sel(), sel()).prop_map(|(p, c)| Op::Attach { p, c }),
        4 => (sel(), sel(), any::<u8>()).prop_map(|(p, c, how)| Op::Ack { p, c, how }),
        3 => (0u64..250).prop_map(|ms| Op::Advance { ms }),
        2 => Just(Op::Tick),
    ]
}

/// What became of one task, in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Queued or running.
    Pending,
    /// Its result exists and waits for the client's acknowledgement.
    Done,
    /// Its result was acknowledged.
    Acked,
    /// Cancelled before it had a result (by its client, or by the TTL).
    Cancelled,
    /// Its result was dropped unacknowledged with its package (whole cancel, TTL).
    Dropped,
}

struct MPackage {
    id: PackageId,
    user: UserId,
    client: Option<ClientId>,
    function: u8,
    timeout_ms: u32,
    key: &'static str,
    fates: Vec<Fate>,
    /// Workers lost while running each index.
    losses: Vec<u32>,
    /// Indices with a result not acknowledged, in completion order.
    unacked: VecDeque<u32>,
    /// Indices sent to the attached client since it attached.
    sent: Vec<u32>,
    /// Results the attached client acknowledged since it attached.
    acked: u64,
    /// When it expires, while detached.
    expires: Option<Instant>,
    freed: bool,
}

impl MPackage {
    fn count(&self, fate: Fate) -> usize {
        self.fates.iter().filter(|&&f| f == fate).count()
    }

    fn is_finished(&self) -> bool {
        !self.fates.contains(&Fate::Pending) && self.unacked.is_empty()
    }
}

/// A task the core ever assigned.
struct MTask {
    p: usize,
    index: u32,
    /// Its latest attempt.
    attempt: u32,
    /// When the master fails the running attempt.
    deadline: Option<Instant>,
}

#[derive(Default)]
struct MWorker {
    /// Credits granted minus tasks assigned.
    avail: u64,
    draining: bool,
    /// Held `(task, attempt)`, in assignment order.
    in_flight: Vec<(TaskId, u32)>,
    fn_seen: HashSet<FnHash>,
    /// Tasks it runs at once: only its `slots` oldest running tasks count a loss.
    slots: u32,
}

/// The effects of one event other than assignments. Results are `(package, client, index,
/// status)`; aborts `(worker, task, attempt)`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Effects {
    results: Vec<(PackageId, Option<ClientId>, u32, TaskStatus)>,
    resends: Vec<(ClientId, PackageId, Vec<u32>)>,
    aborts: Vec<(WorkerId, TaskId, u32)>,
    delivered: Vec<(PackageId, Vec<u32>)>,
    freed: Vec<(PackageId, bool)>,
    replies: Vec<Action>,
}

impl Effects {
    /// Sorted where the core's order within one event is not part of the contract.
    fn normalized(mut self, keep_result_order: bool) -> Self {
        if !keep_result_order {
            self.results.sort_by_key(|&(p, c, i, s)| (p, c, i, s as u8));
        }
        self.aborts.sort();
        self.freed.sort();
        self
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counters {
    stale: u64,
    requeued: u64,
    poisoned: u64,
    timed_out: u64,
    expired: u64,
    dropped: u64,
}

struct Model {
    env: TestEnv,
    workers: BTreeMap<WorkerId, MWorker>,
    clients: Vec<(ClientId, UserId)>,
    packages: Vec<MPackage>,
    by_id: HashMap<PackageId, usize>,
    tasks: HashMap<TaskId, MTask>,
    holder: HashMap<TaskId, WorkerId>,
    /// Assignments that were answered, returned or lost: results for them are stale.
    history: Vec<(WorkerId, TaskId, u32)>,
    next_package: u64,
    next_req: u64,
    n: Counters,
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

fn config() -> CoreConfig {
    CoreConfig {
        max_attempts: MAX_ATTEMPTS,
        timeout_grace_ns: GRACE_MS * MS,
        max_exec_ns: MAX_EXEC_MS * MS,
        result_ttl_ns: TTL_MS * MS,
        report_deliveries: true,
        ..CoreConfig::default()
    }
}

impl Model {
    fn new() -> Self {
        let mut env = TestEnv::with_config(config());
        env.auto_ack = false;
        Self {
            env,
            workers: BTreeMap::new(),
            clients: Vec::new(),
            packages: Vec::new(),
            by_id: HashMap::new(),
            tasks: HashMap::new(),
            holder: HashMap::new(),
            history: Vec::new(),
            next_package: 1,
            next_req: 1,
            n: Counters::default(),
        }
    }

    fn pick_worker(&self, sel: usize) -> Option<WorkerId> {
        pick(&self.workers.keys().copied().collect::<Vec<_>>(), sel)
    }

    fn pick_package(&self, sel: usize) -> Option<usize> {
        (!self.packages.is_empty()).then(|| sel % self.packages.len())
    }

    /// A connected client of `user` (or, with `same == false`, of any other user).
    fn pick_client_of(&self, user: UserId, same: bool, sel: usize) -> Option<ClientId> {
        let of: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, u)| (*u == user) == same)
            .map(|(c, _)| *c)
            .collect();
        pick(&of, sel)
    }

    fn next_req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::AddWorker { slots } => {
                let w = self.env.new_worker(slots);
                self.workers.insert(
                    w,
                    MWorker {
                        slots,
                        ..MWorker::default()
                    },
                );
            }
            Op::LoseWorker { w, silent } => self.lose_worker(w, silent),
            Op::Credit { w, n } => self.credit(w, n),
            Op::Drain { w } => self.drain(w),
            Op::Complete { w, k, count } => self.complete(w, k, count),
            Op::Stale { w, k, kind } => self.stale_result(w, k, kind),
            Op::Return { w, mask } => self.return_tasks(w, mask),
            Op::AddClient { user } => {
                let user = UserId(user);
                let client = self.env.new_client_of(user);
                self.clients.push((client, user));
            }
            Op::LoseClient { c } => self.lose_client(c),
            Op::Submit {
                c,
                n,
                priority,
                function,
                timeout,
                key,
            } => self.submit(
                c,
                n,
                priority,
                function,
                TIMEOUTS[timeout % 4],
                KEYS[key % 4],
            ),
            Op::Cancel { p, c, indices } => self.cancel(p, c, &indices),
            Op::CancelForeign { c, p } => self.cancel_foreign(c, p),
            Op::Status { p, c } => self.status(p, c),
            Op::Attach { p, c } => self.attach_op(p, c),
            Op::Ack { p, c, how } => self.ack(p, c, how),
            Op::Advance { ms } => self.env.advance(ms),
            Op::Tick => self.tick(),
        }
        self.check_global();
    }

    /// Steps the core and checks its actions against `expected`: assignments are checked for
    /// legality and recorded, everything else must match exactly (results in order when
    /// `ordered`, else as a set).
    fn run(&mut self, event: Event, expected: Effects, ordered: bool) {
        let out = self.env.step(event);
        let mut got = Effects::default();
        let mut assigned_to = HashSet::new();
        let mut freed_now = HashSet::new();
        let mut sends: Vec<(Option<ClientId>, PackageId, Vec<u32>)> = Vec::new();
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
                    ..
                } => {
                    assert!(!results.is_empty(), "empty SendResults");
                    assert!(
                        !freed_now.contains(&package),
                        "results of {package} after it was freed"
                    );
                    assert!(
                        sends.iter().all(|s| s.1 != package) || !ordered,
                        "two SendResults for {package} in one worker event"
                    );
                    let p = self.by_id[&package];
                    for r in &results {
                        self.check_result_data(p, r.index, r.status, &r.data);
                        got.results.push((package, client, r.index, r.status));
                    }
                    sends.push((client, package, results.iter().map(|r| r.index).collect()));
                }
                Action::Resend {
                    client,
                    package,
                    results,
                } => {
                    let p = self.by_id[&package];
                    for r in &results {
                        self.check_result_data(p, r.index, r.status, &r.data);
                    }
                    let indices: Vec<u32> = results.iter().map(|r| r.index).collect();
                    got.resends.push((client, package, indices.clone()));
                    sends.push((Some(client), package, Vec::new()));
                    // A resend restarts the attachment's record.
                    self.packages[p].sent = indices;
                }
                Action::Abort { worker, tasks } => {
                    assert!(!tasks.is_empty(), "empty Abort");
                    got.aborts
                        .extend(tasks.into_iter().map(|(t, a)| (worker, t, a)));
                }
                Action::Delivered {
                    package, indices, ..
                } => got.delivered.push((package, indices)),
                Action::PackageFreed {
                    package, expired, ..
                } => {
                    assert!(freed_now.insert(package), "{package} freed twice");
                    got.freed.push((package, expired));
                }
                other => got.replies.push(other),
            }
        }
        assert_eq!(
            got.normalized(ordered),
            expected.normalized(ordered),
            "effects (left: core, right: model)"
        );
        // At most once per attachment.
        for (client, package, indices) in sends {
            let Some(client) = client else { continue };
            let pkg = &mut self.packages[self.by_id[&package]];
            assert_eq!(
                pkg.client,
                Some(client),
                "{package} sent to a detached client"
            );
            for index in indices {
                assert!(
                    !pkg.sent.contains(&index),
                    "{package}:{index} sent twice to {client} in one attachment"
                );
                pkg.sent.push(index);
            }
        }
    }

    fn check_result_data(&self, p: usize, index: u32, status: TaskStatus, data: &Bytes) {
        let text = String::from_utf8_lossy(data);
        match status {
            TaskStatus::Ok => assert_eq!(*data, args(p, index), "result routed to the wrong task"),
            TaskStatus::Timeout => assert!(
                text.contains("time limit") || text.contains("maximum execution time"),
                "{text}"
            ),
            TaskStatus::Lost => {
                // Each loss is named with its attempt (not every attempt is a loss: a task
                // waiting in a lost worker's prefetch queue is requeued without one).
                assert!(
                    text.contains(&format!("while running it {MAX_ATTEMPTS} times")),
                    "{text}"
                );
                assert_eq!(
                    text.matches(" on worker-").count(),
                    MAX_ATTEMPTS as usize,
                    "{text}"
                );
            }
            other => panic!("unexpected status {other:?}"),
        }
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

    /// One assigned task: pending, not held elsewhere, next attempt, its package's time limit,
    /// code only the first time. Arms the model's deadline.
    fn check_assigned_task(&mut self, worker: WorkerId, t: &AssignTask) {
        let (p, index) = parse_args(&t.args);
        let pkg = &self.packages[p];
        let fate = pkg.fates[index as usize];
        assert!(!pkg.freed, "assigned task {p}:{index} of a freed package");
        assert_eq!(
            fate,
            Fate::Pending,
            "assigned task {p}:{index}, which is {fate:?}"
        );
        assert_eq!(t.timeout_ms, pkg.timeout_ms, "time limit of {p}:{index}");
        let other = self.holder.insert(t.task, worker);
        assert!(
            other.is_none(),
            "{} assigned while held by {other:?}",
            t.task
        );
        let previous = self.tasks.get(&t.task).map_or(0, |m| {
            assert_eq!(
                (m.p, m.index),
                (p, index),
                "task id {} changed identity",
                t.task
            );
            m.attempt
        });
        assert_eq!(
            t.attempt,
            previous + 1,
            "attempts of {} count up by one",
            t.task
        );
        let limit = if pkg.timeout_ms > 0 {
            (u64::from(pkg.timeout_ms) + GRACE_MS).min(MAX_EXEC_MS)
        } else {
            MAX_EXEC_MS
        };
        let deadline = Some(Instant(self.env.now.0 + limit * MS));
        let function = pkg.function;
        self.tasks.insert(
            t.task,
            MTask {
                p,
                index,
                attempt: t.attempt,
                deadline,
            },
        );
        let w = self.workers.get_mut(&worker).unwrap();
        w.in_flight.push((t.task, t.attempt));
        assert_eq!(t.fn_hash, fn_hash(function));
        let first = w.fn_seen.insert(t.fn_hash);
        assert_eq!(
            t.fn_code,
            first.then(|| fn_code(function)),
            "code cache of {worker}"
        );
    }

    /// A pending task gets its result: it waits for the acknowledgement.
    fn produce(&mut self, p: usize, index: u32, status: TaskStatus, fx: &mut Effects) {
        let pkg = &mut self.packages[p];
        let fate = &mut pkg.fates[index as usize];
        assert_eq!(*fate, Fate::Pending, "model: result of {p}:{index}");
        *fate = Fate::Done;
        pkg.unacked.push_back(index);
        fx.results.push((pkg.id, pkg.client, index, status));
    }

    /// The held task of package `p` at `index`, if a worker holds it.
    fn held_task(&self, p: usize, index: u32) -> Option<(TaskId, WorkerId)> {
        self.holder
            .iter()
            .find(|(t, _)| {
                let m = &self.tasks[t];
                (m.p, m.index) == (p, index)
            })
            .map(|(&t, &w)| (t, w))
    }

    /// Cancels a pending task (aborting it if held).
    fn cancel_index(&mut self, p: usize, index: u32, fx: &mut Effects) {
        let Some(fate) = self.packages[p].fates.get_mut(index as usize) else {
            return;
        };
        if *fate != Fate::Pending {
            return;
        }
        *fate = Fate::Cancelled;
        if let Some((task, worker)) = self.held_task(p, index) {
            let m = self.tasks.get_mut(&task).unwrap();
            m.deadline = None;
            fx.aborts.push((worker, task, m.attempt));
        }
    }

    /// Drops every unacknowledged result of the package; returns how many.
    fn drop_unacked(&mut self, p: usize) -> u64 {
        let pkg = &mut self.packages[p];
        let n = pkg.unacked.len() as u64;
        for index in pkg.unacked.drain(..) {
            pkg.fates[index as usize] = Fate::Dropped;
        }
        n
    }

    fn free(&mut self, p: usize, expired: bool, fx: &mut Effects) {
        let pkg = &mut self.packages[p];
        pkg.freed = true;
        pkg.client = None;
        pkg.expires = None;
        fx.freed.push((pkg.id, expired));
    }

    /// Attaches `client` to live package `p`: the unacknowledged results are resent.
    fn attach(&mut self, p: usize, client: ClientId, fx: &mut Effects) {
        let pkg = &mut self.packages[p];
        pkg.client = Some(client);
        pkg.expires = None;
        pkg.acked = 0;
        pkg.sent.clear();
        if !pkg.unacked.is_empty() {
            fx.resends
                .push((client, pkg.id, pkg.unacked.iter().copied().collect()));
        }
    }

    fn submit(
        &mut self,
        c: usize,
        n: usize,
        priority: i32,
        function: u8,
        timeout_ms: u32,
        key: &'static str,
    ) {
        let Some((client, user)) = pick(&self.clients, c) else {
            return;
        };
        let p = self.packages.len();
        let package = PackageId(self.next_package);
        self.next_package += 1;
        let req_id = self.next_req();
        let existing = (!key.is_empty())
            .then(|| {
                self.packages
                    .iter()
                    .position(|m| !m.freed && m.user == user && m.key == key)
            })
            .flatten();
        let mut fx = Effects::default();
        if let Some(e) = existing {
            // Idempotent resubmission: the live package's id, and an attach.
            fx.replies.push(Action::Accepted {
                client,
                req_id,
                package: self.packages[e].id,
            });
            self.attach(e, client, &mut fx);
        } else {
            fx.replies.push(Action::Accepted {
                client,
                req_id,
                package,
            });
            self.by_id.insert(package, p);
            self.packages.push(MPackage {
                id: package,
                user,
                client: Some(client),
                function,
                timeout_ms,
                key,
                fates: vec![Fate::Pending; n],
                losses: vec![0; n],
                unacked: VecDeque::new(),
                sent: Vec::new(),
                acked: 0,
                expires: None,
                freed: false,
            });
        }
        self.run(
            Event::Submit {
                client,
                req_id,
                package,
                fn_hash: fn_hash(function),
                fn_code: fn_code(function),
                opts: PackageOpts {
                    priority,
                    timeout_ms,
                    key: key.to_string(),
                    ..PackageOpts::default()
                },
                tasks: (0..n as u32).map(|i| args(p, i)).collect(),
            },
            fx,
            false,
        );
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
        self.run(
            Event::Credit { worker, credits: n },
            Effects::default(),
            false,
        );
    }

    fn drain(&mut self, w: usize) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let mw = self.workers.get_mut(&worker).unwrap();
        (mw.avail, mw.draining) = (0, true);
        self.run(Event::Drain { worker }, Effects::default(), false);
    }

    /// The worker is lost: each task it ran is requeued with its loss recorded, or fails as a
    /// poison task on its last allowed attempt; what it held otherwise is let go. A silent
    /// worker (lease expired) is blamed for nothing: its tasks are all requeued.
    fn lose_worker(&mut self, w: usize, silent: bool) {
        let Some(worker) = self.pick_worker(w) else {
            return;
        };
        let mw = self.workers.remove(&worker).unwrap();
        let mut fx = Effects::default();
        // Only the `slots` oldest tasks still running can have been executing: the rest waited
        // in the worker's prefetch queue, and their loss is not counted.
        let suspects: HashSet<TaskId> = mw
            .in_flight
            .iter()
            .filter(|(task, _)| {
                let m = &self.tasks[task];
                self.packages[m.p].fates[m.index as usize] == Fate::Pending
            })
            .take(if silent { 0 } else { mw.slots.max(1) as usize })
            .map(|(task, _)| *task)
            .collect();
        // Latest assignment first, as the core does (it requeues each at the front, so they end
        // up in assignment order); this is also the order of the poison results.
        for (task, attempt) in mw.in_flight.into_iter().rev() {
            self.holder.remove(&task);
            self.history.push((worker, task, attempt));
            let m = self.tasks.get_mut(&task).unwrap();
            m.deadline = None;
            let (p, index) = (m.p, m.index);
            if self.packages[p].fates[index as usize] != Fate::Pending {
                continue;
            }
            if !suspects.contains(&task) {
                self.n.requeued += 1;
                continue;
            }
            let losses = &mut self.packages[p].losses[index as usize];
            *losses += 1;
            if *losses >= MAX_ATTEMPTS {
                self.n.poisoned += 1;
                self.produce(p, index, TaskStatus::Lost, &mut fx);
            } else {
                self.n.requeued += 1;
            }
        }
        let cause = if silent {
            LossCause::Silent
        } else {
            LossCause::Closed
        };
        self.run(Event::WorkerLost { worker, cause }, fx, false);
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
            self.tasks.get_mut(&task).unwrap().deadline = None;
        }
        taken
    }

    fn complete(&mut self, w: usize, k: usize, count: usize) {
        if let Some(worker) = self.pick_worker(w) {
            self.complete_on(worker, k, count);
        }
    }

    /// The worker answers `count` of its tasks (from the `k`th on) in one event. Answers for
    /// tasks the master already answered (cancelled, timed out) are dropped silently.
    fn complete_on(&mut self, worker: WorkerId, k: usize, count: usize) {
        let len = self.workers[&worker].in_flight.len();
        if len == 0 {
            return;
        }
        let chosen: Vec<usize> = (0..count.min(len)).map(|j| (k + j) % len).collect();
        let taken = self.take_in_flight(worker, &chosen);
        let mut fx = Effects::default();
        let mut results = Vec::new();
        for &(task, attempt) in &taken {
            let (p, index) = (self.tasks[&task].p, self.tasks[&task].index);
            if self.packages[p].fates[index as usize] == Fate::Pending {
                self.produce(p, index, TaskStatus::Ok, &mut fx);
            }
            results.push(outcome(task, attempt, args(p, index)));
        }
        // One SendResults per package, packages in order of their first result.
        let mut order: Vec<PackageId> = Vec::new();
        for r in &fx.results {
            if !order.contains(&r.0) {
                order.push(r.0);
            }
        }
        let grouped = order
            .iter()
            .flat_map(|&p| fx.results.iter().filter(move |r| r.0 == p).copied())
            .collect();
        fx.results = grouped;
        self.run(Event::Results { worker, results }, fx, true);
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
        self.n.stale += 1;
        let results = vec![outcome(task, attempt, Bytes::from_static(b"stale"))];
        self.run(
            Event::Results {
                worker: from,
                results,
            },
            Effects::default(),
            true,
        );
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
        // Returning withdraws the worker's unused credits; returns are not losses.
        self.workers.get_mut(&worker).expect("picked worker").avail = 0;
        self.run(Event::Returned { worker, tasks }, Effects::default(), false);
    }

    /// The client's packages are detached, with their TTL armed; nothing is cancelled.
    fn lose_client(&mut self, c: usize) {
        let Some((client, _)) = pick(&self.clients, c) else {
            return;
        };
        self.clients.retain(|&(x, _)| x != client);
        let expires = Instant(self.env.now.0 + TTL_MS * MS);
        for pkg in self
            .packages
            .iter_mut()
            .filter(|m| !m.freed && m.client == Some(client))
        {
            pkg.client = None;
            pkg.expires = Some(expires);
        }
        self.run(Event::ClientLost { client }, Effects::default(), false);
    }

    /// A client of the package's user cancels some of its tasks (all if `indices` is empty).
    fn cancel(&mut self, p: usize, c: usize, indices: &[u32]) {
        let Some(p) = self.pick_package(p) else {
            return;
        };
        let Some(client) = self.pick_client_of(self.packages[p].user, true, c) else {
            return;
        };
        let package = self.packages[p].id;
        let mut fx = Effects::default();
        if self.packages[p].freed {
            fx.replies.push(Action::UnknownPackage { client, package });
        } else {
            let all: Vec<u32> = (0..self.packages[p].fates.len() as u32).collect();
            for &i in if indices.is_empty() { &all } else { indices } {
                self.cancel_index(p, i, &mut fx);
            }
            if indices.is_empty() {
                // Not counted as dropped: the client gave up on them.
                self.drop_unacked(p);
            }
            if self.packages[p].is_finished() {
                self.free(p, false, &mut fx);
            }
        }
        self.run(
            Event::Cancel {
                client,
                package,
                indices: indices.to_vec(),
            },
            fx,
            false,
        );
    }

    /// A client of another user names the package: it does not exist for it.
    fn cancel_foreign(&mut self, c: usize, p: usize) {
        let Some(p) = self.pick_package(p) else {
            return;
        };
        let Some(client) = self.pick_client_of(self.packages[p].user, false, c) else {
            return;
        };
        let package = self.packages[p].id;
        let fx = Effects {
            replies: vec![Action::UnknownPackage { client, package }],
            ..Effects::default()
        };
        self.run(
            Event::Cancel {
                client,
                package,
                indices: vec![],
            },
            fx,
            false,
        );
        let fx = Effects {
            replies: vec![Action::UnknownPackage { client, package }],
            ..Effects::default()
        };
        let req_id = self.next_req();
        self.run(
            Event::Attach {
                client,
                req_id,
                package,
            },
            fx,
            false,
        );
    }

    fn status(&mut self, p: usize, c: usize) {
        let Some(p) = self.pick_package(p) else {
            return;
        };
        let Some(client) = self.pick_client_of(self.packages[p].user, true, c) else {
            return;
        };
        let package = self.packages[p].id;
        let reply = if self.packages[p].freed {
            Action::UnknownPackage { client, package }
        } else {
            Action::StatusReply {
                client,
                req_id: 5,
                package,
                counts: self.counts(p),
            }
        };
        let fx = Effects {
            replies: vec![reply],
            ..Effects::default()
        };
        self.run(
            Event::Status {
                client,
                req_id: 5,
                package,
            },
            fx,
            false,
        );
    }

    /// Any connected client attaches to a package: accepted (with a resend) if it is live and
    /// of the client's user.
    fn attach_op(&mut self, p: usize, c: usize) {
        let (Some(p), Some((client, user))) = (self.pick_package(p), pick(&self.clients, c)) else {
            return;
        };
        let package = self.packages[p].id;
        let req_id = self.next_req();
        let mut fx = Effects::default();
        if self.packages[p].freed || self.packages[p].user != user {
            fx.replies.push(Action::UnknownPackage { client, package });
        } else {
            fx.replies.push(Action::Accepted {
                client,
                req_id,
                package,
            });
            self.attach(p, client, &mut fx);
        }
        self.run(
            Event::Attach {
                client,
                req_id,
                package,
            },
            fx,
            false,
        );
    }

    /// The attached client (or, sometimes, another connected client, which is ignored)
    /// acknowledges all, half, more than, or fewer than it already did of what it was sent.
    fn ack(&mut self, p: usize, c: usize, how: u8) {
        let Some(p) = self.pick_package(p) else {
            return;
        };
        let pkg = &self.packages[p];
        let client = if how % 5 == 4 {
            pick(&self.clients, c).map(|(c, _)| c)
        } else {
            pkg.client
        };
        let Some(client) = client else {
            return;
        };
        let sent = pkg.sent.len() as u64;
        let count = match how % 5 {
            1 => sent / 2,
            2 => sent + 3,
            3 => pkg.acked.saturating_sub(1),
            _ => sent,
        };
        let package = pkg.id;
        let mut fx = Effects::default();
        if !pkg.freed && pkg.client == Some(client) {
            let pkg = &mut self.packages[p];
            let count = count.min(sent);
            let n = count.saturating_sub(pkg.acked) as usize;
            pkg.acked = pkg.acked.max(count);
            let indices: Vec<u32> = pkg.unacked.drain(..n).collect();
            for &i in &indices {
                pkg.fates[i as usize] = Fate::Acked;
            }
            if !indices.is_empty() {
                fx.delivered.push((package, indices));
            }
            if pkg.is_finished() {
                self.free(p, false, &mut fx);
            }
        }
        self.run(
            Event::Ack {
                client,
                package,
                count,
            },
            fx,
            false,
        );
    }

    /// Fires every due timer in time order (a task's limit before a package's TTL at the same
    /// instant): running attempts past their limit fail with Timeout and are aborted (their
    /// worker keeps holding them); detached packages past their TTL are dropped.
    fn tick(&mut self) {
        let now = self.env.now;
        let mut due: Vec<(Instant, u8, u64)> = Vec::new();
        for (&task, _) in self.holder.iter() {
            let m = &self.tasks[&task];
            if let Some(at) = m.deadline.filter(|&at| at <= now) {
                if self.packages[m.p].fates[m.index as usize] == Fate::Pending {
                    due.push((at, 0, task.0));
                }
            }
        }
        for (p, pkg) in self.packages.iter().enumerate() {
            if let Some(at) = pkg.expires.filter(|&at| at <= now && !pkg.freed) {
                due.push((at, 1, p as u64));
            }
        }
        due.sort_unstable();
        let mut fx = Effects::default();
        for (_, kind, what) in due {
            if kind == 0 {
                let task = TaskId(what);
                let m = self.tasks.get_mut(&task).unwrap();
                if m.deadline.is_none() {
                    continue; // cancelled by an earlier expiry in this tick
                }
                m.deadline = None;
                let (p, index, attempt) = (m.p, m.index, m.attempt);
                self.n.timed_out += 1;
                self.produce(p, index, TaskStatus::Timeout, &mut fx);
                fx.aborts.push((self.holder[&task], task, attempt));
            } else {
                let p = what as usize;
                for i in 0..self.packages[p].fates.len() as u32 {
                    self.cancel_index(p, i, &mut fx);
                }
                self.n.dropped += self.drop_unacked(p);
                self.n.expired += 1;
                self.free(p, true, &mut fx);
            }
        }
        self.run(Event::Tick, fx, false);
    }

    /// The counters the model expects for live package `p`.
    fn counts(&self, p: usize) -> PackageCounts {
        let pkg = &self.packages[p];
        let running = self
            .holder
            .keys()
            .filter(|t| self.is_running_of(t, p))
            .count() as u32;
        let pending = pkg.count(Fate::Pending) as u32;
        PackageCounts {
            total: pkg.fates.len() as u32,
            queued: pending - running,
            running,
            done: (pkg.count(Fate::Done) + pkg.count(Fate::Acked)) as u32,
            cancelled: pkg.count(Fate::Cancelled) as u32,
            ..PackageCounts::default()
        }
    }

    fn fate_of(&self, task: &TaskId) -> Fate {
        let m = &self.tasks[task];
        self.packages[m.p].fates[m.index as usize]
    }

    fn is_running_of(&self, task: &TaskId, p: usize) -> bool {
        self.tasks[task].p == p && self.fate_of(task) == Fate::Pending
    }

    /// Gauges, counters, credits, timers and work conservation, after every step.
    fn check_global(&self) {
        let stats = self.env.core.stats();
        let fates = || self.packages.iter().flat_map(|p| p.fates.iter());
        let count = |f: Fate| fates().filter(|&&x| x == f).count();
        let held = |f: &[Fate]| {
            self.holder
                .keys()
                .filter(|t| f.contains(&self.fate_of(t)))
                .count()
        };
        let running = held(&[Fate::Pending]);
        assert_eq!(stats.running, running, "running");
        assert_eq!(stats.cancelling, held(&[Fate::Cancelled]), "cancelling");
        assert_eq!(stats.queued, count(Fate::Pending) - running, "queued");
        // Unacknowledged results, plus answered tasks their worker still runs.
        let retained = count(Fate::Done) + held(&[Fate::Acked, Fate::Dropped]);
        assert_eq!(stats.retained, retained, "retained");
        assert_eq!(
            stats.tasks,
            stats.queued + stats.running + stats.cancelling + stats.retained
        );
        assert_eq!(
            stats.counters.delivered,
            (count(Fate::Done) + count(Fate::Acked) + count(Fate::Dropped)) as u64,
            "results produced"
        );
        let live: Vec<&MPackage> = self.packages.iter().filter(|p| !p.freed).collect();
        assert_eq!(stats.packages, live.len());
        for pkg in &live {
            assert!(!pkg.is_finished(), "model: {} finished but live", pkg.id);
        }
        assert_eq!(
            (stats.workers, stats.clients),
            (self.workers.len(), self.clients.len())
        );
        let n = Counters {
            stale: stats.counters.stale_results,
            requeued: stats.counters.requeued,
            poisoned: stats.counters.poisoned,
            timed_out: stats.counters.timed_out,
            expired: stats.counters.packages_expired,
            dropped: stats.counters.results_dropped,
        };
        assert_eq!(n, self.n, "counters (left: core, right: model)");
        let deadlines = self
            .holder
            .keys()
            .filter(|t| self.fate_of(t) == Fate::Pending)
            .filter_map(|t| self.tasks[t].deadline);
        let expiries = live.iter().filter_map(|p| p.expires);
        assert_eq!(
            self.env.core.next_timer(),
            deadlines.chain(expiries).min(),
            "next timer"
        );
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

    /// Completes everything still held, hands what is queued to a fresh worker, attaches a
    /// client to every detached package and acknowledges every result; then checks that every
    /// task ended acknowledged, cancelled or dropped, and the core is empty.
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
        for p in 0..self.packages.len() {
            if self.packages[p].freed {
                continue;
            }
            let user = self.packages[p].user;
            let client = match self.packages[p].client {
                Some(client) => client,
                None => {
                    let client = match self.pick_client_of(user, true, 0) {
                        Some(client) => client,
                        None => {
                            let client = self.env.new_client_of(user);
                            self.clients.push((client, user));
                            client
                        }
                    };
                    let c = self.clients.iter().position(|x| x.0 == client).unwrap();
                    self.attach_op(p, c);
                    client
                }
            };
            assert_eq!(self.packages[p].client, Some(client));
            let how = 0; // everything sent
            let c = self.clients.iter().position(|x| x.0 == client).unwrap();
            self.ack(p, c, how);
            assert!(
                self.packages[p].freed,
                "package {p} not freed by its last ack"
            );
            self.check_global();
        }
        let stats = self.env.core.stats();
        assert_eq!(
            (stats.tasks, stats.packages, stats.functions, stats.retained),
            (0, 0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(self.env.core.next_timer(), None);
        for (p, pkg) in self.packages.iter().enumerate() {
            assert!(
                pkg.fates
                    .iter()
                    .all(|f| matches!(f, Fate::Acked | Fate::Cancelled | Fate::Dropped)),
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
    fn random_sequences_keep_every_promise(ops in vec(op(), 1..150)) {
        let mut model = Model::new();
        for op in ops {
            model.apply(op);
        }
        model.finish();
    }
}
