//! The bench rig shared by `core_ops` and `worst_case`: a [`Core`] holding `n` queued tasks and
//! `w` busy workers, and each core operation as exactly one timed [`Core::handle`] call between
//! an untimed preparation and an untimed undo, so the state keeps its size however many times
//! an operation runs.
//!
//! What "N tasks queued, W workers" means:
//!
//! * 10 users with one client each; packages of 100 tasks submitted round robin over the users,
//!   each user with its own function (so `n` = 10^6 is 10,000 packages of 100);
//! * `n` tasks queued, plus at most 99 (the queue is topped up a whole package at a time);
//! * `w` workers with 4 slots, each running 4 tasks with no credit left, so nothing is assigned
//!   unless an operation adds credits;
//! * one more worker, the sink, that takes and finishes the tasks a lost worker leaves behind:
//!   otherwise the same tasks would be lost again and again and, at the third loss, fail as
//!   poison tasks, which is another path than the one timed;
//! * every running task has a time-limit timer: the master's cap, set a year ahead so it never
//!   fires during a bench; ticks jump the clock straight to the one timer they are meant to fire.

use std::collections::HashMap;
use std::time::{Duration, Instant as WallClock};

use bytes::Bytes;
use rtpool_core::{
    Action, ClientId, Core, CoreConfig, Event, FnHash, Instant, MissPolicy, PackageId, PackageOpts,
    TaskId, TaskStatus, UserId, WorkerId, WorkerOutcome,
};

/// Users (and clients: one each).
pub const USERS: u64 = 10;
/// Tasks per background package.
pub const PACKAGE: usize = 100;
/// Slots of every worker; what a worker holds when it runs its slots full.
pub const SLOTS: u32 = 4;
/// Tasks a worker holds with its prefetch full.
pub const PREFETCH: u32 = 16;
/// The master's cap on execution time in the rig: a year, so background timers never fire.
const MAX_EXEC_NS: u64 = 365 * 86_400 * 1_000_000_000;
/// Clock advance per untimed event, nanoseconds.
const STEP_NS: u64 = 1_000;

/// One core operation, as timed by the benches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `Submit` of a 1-task package (no worker has credits: nothing is assigned).
    Submit1,
    /// `Submit` of a 100-task package, reported per call.
    Submit100,
    /// `Credit` of 1 that assigns one queued task.
    Assign,
    /// `Results` with one result of a running task.
    Complete,
    /// `Cancel` of a whole package of 100 queued tasks.
    Cancel100,
    /// `Cancel` of one index of a queued package.
    CancelOne,
    /// `Cancel` of a package of 100 queued tasks at the moment the ready queue's tombstones
    /// outnumber its live entries, so this cancel compacts the queue.
    CancelCompacting,
    /// `WorkerLost` of a worker running its 4 slots full.
    WorkerLost,
    /// `WorkerLost` of a worker holding a full prefetch of 16 (4 running, 12 waiting): what the
    /// master sends the core when a worker's lease expires.
    LeaseExpiry,
    /// `Tick` that fires exactly one task's time limit.
    TimeLimitTick,
    /// `Tick` at the deadline of a 1-task package with `on_miss = drop`.
    DeadlineTick,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: [Op; 11] = [
        Op::Submit1,
        Op::Submit100,
        Op::Assign,
        Op::Complete,
        Op::Cancel100,
        Op::CancelOne,
        Op::CancelCompacting,
        Op::WorkerLost,
        Op::LeaseExpiry,
        Op::TimeLimitTick,
        Op::DeadlineTick,
    ];

    /// Name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Submit1 => "submit, 1-task package",
            Op::Submit100 => "submit, 100-task package",
            Op::Assign => "assign (credit of 1)",
            Op::Complete => "complete (1 result)",
            Op::Cancel100 => "cancel, queued package of 100",
            Op::CancelOne => "cancel, 1 index",
            Op::CancelCompacting => "cancel, package of 100, queue compaction due",
            Op::WorkerLost => "worker lost (4 running)",
            Op::LeaseExpiry => "lease expiry = worker lost (16 held)",
            Op::TimeLimitTick => "tick: 1 time limit fires",
            Op::DeadlineTick => "tick: 1 package deadline",
        }
    }

    /// Identifier for JSON and criterion.
    pub fn slug(self) -> &'static str {
        match self {
            Op::Submit1 => "submit_1",
            Op::Submit100 => "submit_100",
            Op::Assign => "assign",
            Op::Complete => "complete",
            Op::Cancel100 => "cancel_100",
            Op::CancelOne => "cancel_one",
            Op::CancelCompacting => "cancel_compacting",
            Op::WorkerLost => "worker_lost",
            Op::LeaseExpiry => "lease_expiry",
            Op::TimeLimitTick => "tick_time_limit",
            Op::DeadlineTick => "tick_deadline",
        }
    }
}

/// A background worker and the tasks it runs, oldest first.
struct Busy {
    id: WorkerId,
    tasks: std::collections::VecDeque<(TaskId, u32)>,
}

/// A core of a given size and the bookkeeping that undoes each operation.
pub struct Rig {
    /// The core under test.
    pub core: Core,
    /// Queued tasks the rig keeps (`n` rounded up to what set-up left queued).
    pub target: usize,
    /// The clock, nanoseconds.
    now: u64,
    /// Actions of the timed call; kept so their buffer is reused.
    out: Vec<Action>,
    next_package: u64,
    next_worker: u64,
    /// Round robin over users for submissions.
    next_user: u64,
    workers: Vec<Busy>,
    /// Round robin over `workers` for the operations that touch one.
    cursor: usize,
    sink: WorkerId,
    /// Results sent per package since it was accepted (the client acknowledges cumulatively).
    sent: HashMap<PackageId, u64>,
    /// Packages of 100 submitted at the back of the queue, newest last; the newest is whole.
    intact: Vec<(PackageId, ClientId)>,
    /// The package `CancelOne` is eating, and its next index.
    partial: Option<(PackageId, ClientId, u32)>,
    /// Tasks taken out of the queue since the last top-up.
    deficit: usize,
    /// The package `DeadlineTick` submitted, and `deadline_dropped` before its tick.
    deadline_victim: Option<(PackageId, ClientId, u64)>,
    /// Deadline ticks that dropped a task (`deadline_dropped` moved), and those that did not.
    pub deadline_fired: u64,
    /// See `deadline_fired`.
    pub deadline_noop: u64,
}

fn client_of(user: u64) -> ClientId {
    ClientId(user)
}

fn ok(task: TaskId, attempt: u32, status: TaskStatus) -> WorkerOutcome {
    WorkerOutcome {
        task,
        attempt,
        status,
        data: Bytes::from_static(b"ok"),
        exec_us: 1,
        wait_us: 1,
        flush_us: 1,
    }
}

impl Rig {
    /// A core with `n` queued tasks and `w` workers running 4 tasks each.
    pub fn new(n: usize, w: usize) -> Self {
        let config = CoreConfig {
            max_exec_ns: MAX_EXEC_NS,
            ..CoreConfig::default()
        };
        let mut rig = Self {
            core: Core::new(config),
            target: 0,
            now: 0,
            out: Vec::with_capacity(16),
            next_package: 1,
            next_worker: 1,
            next_user: 0,
            workers: Vec::with_capacity(w),
            cursor: 0,
            sink: WorkerId(0),
            sent: HashMap::new(),
            intact: Vec::new(),
            partial: None,
            deficit: 0,
            deadline_victim: None,
            deadline_fired: 0,
            deadline_noop: 0,
        };
        for user in 1..=USERS {
            rig.apply(Event::ClientJoined {
                client: client_of(user),
                user: UserId(user),
            });
        }
        rig.sink = rig.join(PREFETCH, 0).id;
        // The workers' tasks first, so the packages submitted after stay whole.
        for _ in 0..(w * SLOTS as usize).div_ceil(PACKAGE) {
            rig.submit_untimed(PACKAGE, PackageOpts::default());
        }
        for _ in 0..w {
            let busy = rig.join(SLOTS, SLOTS);
            rig.workers.push(busy);
        }
        for _ in 0..n.div_ceil(PACKAGE) {
            let (package, client) = rig.submit_untimed(PACKAGE, PackageOpts::default());
            rig.intact.push((package, client));
        }
        rig.target = rig.core.stats().queued;
        rig
    }

    /// Runs `op` once and returns the duration of its one `handle` call.
    pub fn step(&mut self, op: Op) -> Duration {
        self.step_probed(op, || ()).0
    }

    /// Runs `op` once; `probe` is called right before and right after the timed region (to
    /// read a counter that the timing must not include). Returns the duration of the one
    /// `handle` call and the two probes.
    pub fn step_probed<P>(&mut self, op: Op, mut probe: impl FnMut() -> P) -> (Duration, P, P) {
        let event = self.prepare(op);
        let now = Instant(self.now);
        self.out.clear();
        let before = probe();
        let start = WallClock::now();
        self.core.handle(event, now, &mut self.out);
        let elapsed = start.elapsed();
        let after = probe();
        let out = std::mem::take(&mut self.out);
        self.undo(op, &out);
        self.out = out;
        self.out.clear();
        (elapsed, before, after)
    }

    /// Submits a 100-task package with no undo (the queue grows); returns the duration of its
    /// `handle` call and the probes, as [`Rig::step_probed`].
    pub fn grow_probed<P>(&mut self, mut probe: impl FnMut() -> P) -> (Duration, P, P) {
        let (event, package, client) = self.submit_event(PACKAGE, PackageOpts::default());
        self.now += STEP_NS;
        let now = Instant(self.now);
        self.out.clear();
        let before = probe();
        let start = WallClock::now();
        self.core.handle(event, now, &mut self.out);
        let elapsed = start.elapsed();
        let after = probe();
        self.intact.push((package, client));
        self.target += PACKAGE;
        self.out.clear();
        (elapsed, before, after)
    }

    /// Tasks queued now.
    pub fn queued(&self) -> usize {
        self.core.stats().queued
    }

    /// The event to time, with the state set up for it; `self.now` is its instant.
    fn prepare(&mut self, op: Op) -> Event {
        match op {
            Op::Submit1 => self.prepare_submit(1, PackageOpts::default()),
            Op::Submit100 => self.prepare_submit(PACKAGE, PackageOpts::default()),
            Op::Assign => {
                let i = self.next_index();
                let worker = self.workers[i].id;
                self.now += STEP_NS;
                Event::Credit { worker, credits: 1 }
            }
            Op::Complete => {
                let i = self.next_index();
                let (task, attempt) = self.workers[i].tasks.pop_front().expect("busy worker");
                self.now += STEP_NS;
                Event::Results {
                    worker: self.workers[i].id,
                    results: vec![ok(task, attempt, TaskStatus::Ok)],
                }
            }
            Op::Cancel100 => self.prepare_cancel_whole(),
            Op::CancelCompacting => {
                // Compact now (a cancel of more tombstones than live entries), then leave
                // tombstones 150 short of the threshold: the timed cancel of 100 more tasks,
                // with 100 fewer live ones, crosses it (`compact_queue_if_sparse`).
                let live = self.queued();
                self.submit_and_cancel(live + 2048);
                let live = self.queued();
                self.submit_and_cancel(live + 1024 - 150);
                self.prepare_cancel_whole()
            }
            Op::CancelOne => {
                let (package, client, index) = match self.partial {
                    Some(p) if p.2 < PACKAGE as u32 => p,
                    _ => {
                        let (package, client) = self.take_intact();
                        (package, client, 0)
                    }
                };
                self.partial = Some((package, client, index + 1));
                self.now += STEP_NS;
                Event::Cancel {
                    client,
                    package,
                    indices: vec![index],
                }
            }
            Op::WorkerLost => {
                let i = self.next_index();
                let worker = self.workers[i].id;
                self.now += STEP_NS;
                Event::WorkerLost { worker }
            }
            Op::LeaseExpiry => {
                let victim = self.join(SLOTS, PREFETCH);
                assert_eq!(victim.tasks.len(), PREFETCH as usize);
                self.now += STEP_NS;
                Event::WorkerLost { worker: victim.id }
            }
            Op::TimeLimitTick => {
                // A 1-task package with a 1 ms limit, at a higher priority so the next credit
                // takes it, assigned to a busy worker: its timer is the earliest one.
                let opts = PackageOpts {
                    priority: 1,
                    timeout_ms: 1,
                    ..PackageOpts::default()
                };
                self.submit_untimed(1, opts);
                let i = self.next_index();
                let worker = self.workers[i].id;
                let got = self.give(worker, 1);
                assert_eq!(got.len(), 1, "the victim is assigned");
                let at = self.core.next_timer().expect("the victim's timer");
                assert!(
                    at.0 > self.now && at.0 - self.now <= 1_000_000 + 2_000_000_000,
                    "the earliest timer is the victim's"
                );
                self.now = at.0;
                Event::Tick
            }
            Op::DeadlineTick => {
                let opts = PackageOpts {
                    deadline_ms: 1,
                    on_miss: MissPolicy::Drop,
                    ..PackageOpts::default()
                };
                let (package, client) = self.submit_untimed(1, opts);
                let before = self.core.stats().deadline_dropped;
                self.deadline_victim = Some((package, client, before));
                // Just past the deadline, 1 ms after the master received the package.
                self.now += 1_000_000 + STEP_NS;
                Event::Tick
            }
        }
    }

    /// Undoes what the timed call did, from its actions.
    fn undo(&mut self, op: Op, out: &[Action]) {
        match op {
            Op::Submit1 | Op::Submit100 => {
                let Some(Action::Accepted {
                    client, package, ..
                }) = out.first()
                else {
                    panic!("submission not accepted: {out:?}");
                };
                self.cancel_untimed(*client, *package);
            }
            Op::Assign => {
                let [Action::Assign { worker, tasks }] = out else {
                    panic!("one assignment expected: {out:?}");
                };
                assert_eq!(tasks.len(), 1);
                let returned = vec![(tasks[0].task, tasks[0].attempt)];
                self.apply(Event::Returned {
                    worker: *worker,
                    tasks: returned,
                });
            }
            Op::Complete => {
                self.settle(out);
                let i = self.last_index();
                let worker = self.workers[i].id;
                let got = self.give(worker, 1);
                self.workers[i].tasks.extend(got);
                self.deficit += 1;
            }
            Op::Cancel100 | Op::CancelCompacting => {
                assert!(
                    out.iter().any(|a| matches!(a, Action::PackageFreed { .. })),
                    "the cancelled package is freed: {out:?}"
                );
                self.deficit += PACKAGE;
            }
            Op::CancelOne => self.deficit += 1,
            Op::WorkerLost => {
                self.finish_on_sink(SLOTS);
                let i = self.last_index();
                self.workers[i] = self.join(SLOTS, SLOTS);
                self.deficit += SLOTS as usize;
            }
            Op::LeaseExpiry => {
                self.finish_on_sink(PREFETCH);
                self.deficit += PREFETCH as usize;
            }
            Op::TimeLimitTick => {
                assert!(
                    out.iter().any(|a| matches!(a, Action::Abort { .. })),
                    "the time limit fired: {out:?}"
                );
                self.settle(out);
                // The worker answers the abort; the task, acknowledged, is freed.
                for action in out {
                    if let Action::Abort { worker, tasks } = action {
                        let results = tasks
                            .iter()
                            .map(|&(task, attempt)| ok(task, attempt, TaskStatus::Error))
                            .collect();
                        self.apply(Event::Results {
                            worker: *worker,
                            results,
                        });
                    }
                }
            }
            Op::DeadlineTick => {
                let (package, client, before) = self.deadline_victim.take().expect("victim");
                if self.core.stats().deadline_dropped > before {
                    self.deadline_fired += 1;
                } else {
                    self.deadline_noop += 1;
                }
                self.settle(out);
                if self.is_live(client, package) {
                    self.cancel_untimed(client, package);
                }
            }
        }
        self.top_up();
    }

    fn prepare_submit(&mut self, tasks: usize, opts: PackageOpts) -> Event {
        let (event, _, _) = self.submit_event(tasks, opts);
        self.now += STEP_NS;
        event
    }

    fn prepare_cancel_whole(&mut self) -> Event {
        let (package, client) = self.take_intact();
        self.now += STEP_NS;
        Event::Cancel {
            client,
            package,
            indices: vec![],
        }
    }

    /// The newest package of 100 whose tasks are all queued.
    fn take_intact(&mut self) -> (PackageId, ClientId) {
        while let Some((package, client)) = self.intact.pop() {
            let reply = self.apply(Event::Status {
                client,
                req_id: 0,
                package,
            });
            if let [Action::StatusReply { counts, .. }] = reply.as_slice() {
                if counts.queued as usize == PACKAGE {
                    return (package, client);
                }
            }
        }
        panic!("no whole package queued: the queue is too short for this bench");
    }

    fn next_index(&mut self) -> usize {
        let i = self.cursor;
        self.cursor = (self.cursor + 1) % self.workers.len();
        i
    }

    /// The index `next_index` returned last.
    fn last_index(&self) -> usize {
        (self.cursor + self.workers.len() - 1) % self.workers.len()
    }

    /// Applies an untimed event one clock step later.
    fn apply(&mut self, event: Event) -> Vec<Action> {
        self.now += STEP_NS;
        let mut out = Vec::new();
        self.core.handle(event, Instant(self.now), &mut out);
        out
    }

    fn submit_event(&mut self, tasks: usize, opts: PackageOpts) -> (Event, PackageId, ClientId) {
        let user = self.next_user % USERS + 1;
        self.next_user += 1;
        let package = PackageId(self.next_package);
        self.next_package += 1;
        let client = client_of(user);
        let event = Event::Submit {
            client,
            req_id: package.0,
            package,
            fn_hash: FnHash([user as u8; 32]),
            fn_code: Bytes::from_static(b"def f(x): return x"),
            opts,
            tasks: vec![Bytes::from_static(b"args"); tasks],
        };
        (event, package, client)
    }

    fn submit_untimed(&mut self, tasks: usize, opts: PackageOpts) -> (PackageId, ClientId) {
        let (event, package, client) = self.submit_event(tasks, opts);
        let out = self.apply(event);
        assert!(
            matches!(out.first(), Some(Action::Accepted { .. })),
            "submission not accepted: {out:?}"
        );
        (package, client)
    }

    fn cancel_untimed(&mut self, client: ClientId, package: PackageId) {
        let out = self.apply(Event::Cancel {
            client,
            package,
            indices: vec![],
        });
        self.sent.remove(&package);
        assert!(
            out.iter().any(|a| matches!(a, Action::PackageFreed { .. })),
            "the cancelled package is freed: {out:?}"
        );
    }

    fn submit_and_cancel(&mut self, tasks: usize) {
        let (package, client) = self.submit_untimed(tasks, PackageOpts::default());
        self.cancel_untimed(client, package);
    }

    fn is_live(&mut self, client: ClientId, package: PackageId) -> bool {
        let reply = self.apply(Event::Status {
            client,
            req_id: 0,
            package,
        });
        matches!(reply.as_slice(), [Action::StatusReply { .. }])
    }

    /// A new worker with `slots`, given `credits`: what it was assigned.
    fn join(&mut self, slots: u32, credits: u32) -> Busy {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.apply(Event::WorkerJoined { worker: id, slots });
        let tasks = if credits > 0 {
            self.give(id, credits).into()
        } else {
            Default::default()
        };
        Busy { id, tasks }
    }

    /// Gives a worker credits; returns the tasks it was assigned.
    fn give(&mut self, worker: WorkerId, credits: u32) -> Vec<(TaskId, u32)> {
        let out = self.apply(Event::Credit { worker, credits });
        let mut got = Vec::new();
        for action in out {
            if let Action::Assign { worker: w, tasks } = action {
                assert_eq!(w, worker, "only the credited worker is hungry");
                got.extend(tasks.iter().map(|t| (t.task, t.attempt)));
            }
        }
        assert_eq!(got.len(), credits as usize, "the queue has enough tasks");
        got
    }

    /// The sink takes the `count` tasks at the front of the queue (a lost worker's) and
    /// finishes them; the client acknowledges the results.
    fn finish_on_sink(&mut self, count: u32) {
        let sink = self.sink;
        let tasks = self.give(sink, count);
        let results = tasks
            .into_iter()
            .map(|(task, attempt)| ok(task, attempt, TaskStatus::Ok))
            .collect();
        let out = self.apply(Event::Results {
            worker: sink,
            results,
        });
        self.settle(&out);
    }

    /// The clients acknowledge every result in `out`.
    fn settle(&mut self, out: &[Action]) {
        for action in out {
            if let Action::SendResults {
                client: Some(client),
                package,
                results,
            } = action
            {
                let sent = self.sent.entry(*package).or_default();
                *sent += results.len() as u64;
                let count = *sent;
                let freed = self.apply(Event::Ack {
                    client: *client,
                    package: *package,
                    count,
                });
                if freed
                    .iter()
                    .any(|a| matches!(a, Action::PackageFreed { .. }))
                {
                    self.sent.remove(package);
                }
            }
        }
    }

    /// Queues whole packages of 100 at the back for the tasks taken out of the queue.
    fn top_up(&mut self) {
        while self.deficit >= PACKAGE {
            let (package, client) = self.submit_untimed(PACKAGE, PackageOpts::default());
            self.intact.push((package, client));
            self.deficit -= PACKAGE;
        }
        assert_eq!(
            self.queued() + self.deficit,
            self.target,
            "the queue keeps its size"
        );
    }
}
