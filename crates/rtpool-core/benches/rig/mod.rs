//! The bench rig shared by `core_ops` and `worst_case`: a [`Core`] holding `n` queued tasks and
//! `w` busy workers, and each core operation as exactly one timed [`Core::handle`] call between
//! an untimed preparation and an untimed undo, so the state keeps its size however many times
//! an operation runs.
//!
//! What "N tasks queued, W workers" means:
//!
//! * 4 users with one client each; packages of 100 tasks submitted round robin over the users,
//!   each user with its own function (so `n` = 10^6 is 10,000 packages of 100, 2,500 a user):
//!   every assignment goes through all three levels of the ready queue (class, the users'
//!   turns, the user's packages);
//! * `n` tasks queued, plus at most 99 (the queue is topped up a whole package at a time);
//! * `w` workers with 4 slots, each running 4 tasks with no credit left, so nothing is assigned
//!   unless an operation adds credits;
//! * one more worker, the sink, that takes and finishes the tasks a lost worker leaves behind:
//!   otherwise the same tasks would be lost again and again and, at the third loss, fail as
//!   poison tasks, which is another path than the one timed;
//! * every running task has a time-limit timer: the master's cap, set a year ahead so it never
//!   fires during a bench; ticks jump the clock straight to the one timer they are meant to fire.
//!
//! The rig never assumes which queued task an assignment takes: users take turns, so a credit
//! takes the front task of whichever user's turn it is, and a returned or requeued task goes to
//! the front of its own package, not of the queue. What each worker holds is read from the
//! `Assign` actions, and the sink keeps taking tasks until it has taken every task a lost worker
//! left, however many other tasks come out first. After every undo [`Rig::check_size`] checks
//! the state: queued tasks (up to the top-up), running tasks, workers, nothing cancelled,
//! retained or poisoned, and no timer due within a day.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant as WallClock};

use bytes::Bytes;

mod ops;

pub use self::ops::Op;
use rtpool_core::{
    Action, ClientId, Core, CoreConfig, Event, FnHash, Instant, LossCause, MissPolicy,
    PackageCounts, PackageId, PackageOpts, TaskId, TaskStatus, UserId, WorkerId, WorkerKey,
    WorkerOutcome,
};

/// Users (and clients: one each).
pub const USERS: u64 = 4;
/// Tasks per background package.
pub const PACKAGE: usize = 100;
/// Slots of every worker; what a worker holds when it runs its slots full.
pub const SLOTS: u32 = 4;
/// Tasks a worker holds with its prefetch full.
pub const PREFETCH: u32 = 16;
/// Tasks of the package whose deadline the deadline tick passes (one of them running).
pub const DEADLINE_TASKS: usize = 4;
/// The master's cap on execution time in the rig: a year, so background timers never fire.
const MAX_EXEC_NS: u64 = 365 * 86_400 * 1_000_000_000;
/// After every undo no timer may be due sooner than this: only the year-ahead caps are left.
const DAY_NS: u64 = 86_400 * 1_000_000_000;
/// Clock advance per untimed event, nanoseconds.
const STEP_NS: u64 = 1_000;
/// The function of the hedged packages (the users' functions are `[user; 32]`).
const HEDGE_FN: FnHash = FnHash([0xEE; 32]);
/// What the hedged function reports as its execution time, microseconds: its p95, so a hedged
/// task's straggler check fires 1.5 ms after it starts.
const HEDGE_EXEC_US: u64 = 1_000;
/// Results of the hedged function learned before the first hedged package, so its estimate is
/// trusted (`CoreConfig::estimate_min_samples` is 5) and hedge timers are armed.
const HEDGE_WARM_UP: usize = 8;

/// A background worker and the tasks it runs, oldest first.
struct Busy {
    id: WorkerId,
    tasks: VecDeque<(TaskId, u32)>,
}

/// What an operation's preparation left for its undo.
enum Pending {
    None,
    /// The tasks a worker about to be lost holds; `replace`: the index in `workers` of a
    /// background worker to replace (`None`: a lease-expiry victim, not replaced).
    Lost {
        tasks: Vec<(TaskId, u32)>,
        replace: Option<usize>,
    },
    /// A victim package that one busy worker runs a task of: its undo has the worker answer
    /// the abort (or the task) and the client acknowledge.
    Victim {
        package: PackageId,
        client: ClientId,
        worker: WorkerId,
        task: (TaskId, u32),
        /// `deadline_dropped` before the tick.
        dropped: u64,
        /// `hedges` before the tick.
        hedges: u64,
    },
}

/// A core of a given size and the bookkeeping that undoes each operation.
pub struct Rig {
    /// The core under test.
    pub core: Core,
    /// Queued tasks the rig keeps (`n` rounded up to what set-up left queued).
    pub target: usize,
    /// Running tasks: 4 per background worker.
    running: usize,
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
    pending: Pending,
    /// Deadline ticks that dropped their package's 4 tasks (every one, or the undo panics).
    pub deadline_fired: u64,
    /// Hedge ticks that fired their straggler check (every one, or the undo panics).
    pub hedge_checks: u64,
    /// Tasks the sink took beyond those lost workers left (users take turns, so the sink takes
    /// other users' front tasks before it reaches all of a lost worker's).
    pub sink_extra: u64,
}

fn client_of(user: u64) -> ClientId {
    ClientId(user)
}

fn result(task: TaskId, attempt: u32, status: TaskStatus, exec_us: u64) -> WorkerOutcome {
    WorkerOutcome {
        task,
        attempt,
        status,
        data: Bytes::from_static(b"ok"),
        exec_us,
        wait_us: 1,
        flush_us: 1,
    }
}

fn ok(task: TaskId, attempt: u32, status: TaskStatus) -> WorkerOutcome {
    result(task, attempt, status, 1)
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
            running: 0,
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
            pending: Pending::None,
            deadline_fired: 0,
            hedge_checks: 0,
            sink_extra: 0,
        };
        for user in 1..=USERS {
            rig.apply(Event::ClientJoined {
                client: client_of(user),
                user: UserId(user),
            });
        }
        rig.sink = rig.join(PREFETCH, 0).id;
        rig.warm_up_hedged_function();
        // The workers' tasks first, so the packages submitted after stay whole.
        for _ in 0..(w * SLOTS as usize).div_ceil(PACKAGE) {
            rig.submit_untimed(PACKAGE, PackageOpts::default(), None);
        }
        for _ in 0..w {
            let busy = rig.join(SLOTS, SLOTS);
            rig.workers.push(busy);
        }
        for _ in 0..n.div_ceil(PACKAGE) {
            let (package, client) = rig.submit_untimed(PACKAGE, PackageOpts::default(), None);
            rig.intact.push((package, client));
        }
        let stats = rig.core.stats();
        rig.target = stats.queued;
        rig.running = stats.running;
        assert_eq!(rig.running, w * SLOTS as usize);
        rig.check_size();
        rig
    }

    /// Runs `op` once and returns the duration of its one `handle` call.
    pub fn step(&mut self, op: Op) -> Duration {
        self.step_probed(op, |_| ()).0
    }

    /// Runs `op` once; `probe` is called right before (`probe(true)`) and right after
    /// (`probe(false)`) the timed region, to read counters that the timing must not include.
    /// Returns the duration of the one `handle` call and the two probes.
    pub fn step_probed<P>(&mut self, op: Op, mut probe: impl FnMut(bool) -> P) -> (Duration, P, P) {
        let event = self.prepare(op);
        let now = Instant(self.now);
        self.out.clear();
        let before = probe(true);
        let start = WallClock::now();
        self.core.handle(event, now, &mut self.out);
        let elapsed = start.elapsed();
        let after = probe(false);
        let out = std::mem::take(&mut self.out);
        self.undo(op, &out);
        self.out = out;
        self.out.clear();
        (elapsed, before, after)
    }

    /// Submits a 100-task package with no undo (the queue grows); returns the duration of its
    /// `handle` call and the probes, as [`Rig::step_probed`].
    pub fn grow_probed<P>(&mut self, mut probe: impl FnMut(bool) -> P) -> (Duration, P, P) {
        let (event, package, client) = self.submit_event(PACKAGE, PackageOpts::default(), None);
        self.now += STEP_NS;
        let now = Instant(self.now);
        self.out.clear();
        let before = probe(true);
        let start = WallClock::now();
        self.core.handle(event, now, &mut self.out);
        let elapsed = start.elapsed();
        let after = probe(false);
        self.intact.push((package, client));
        self.target += PACKAGE;
        self.out.clear();
        (elapsed, before, after)
    }

    fn prepare_submit(&mut self, tasks: usize, opts: PackageOpts) -> Event {
        let (event, _, _) = self.submit_event(tasks, opts, None);
        self.now += STEP_NS;
        event
    }

    /// The newest package of 100 whose tasks are all queued.
    fn take_intact(&mut self) -> (PackageId, ClientId) {
        while let Some((package, client)) = self.intact.pop() {
            if self
                .counts(client, package)
                .is_some_and(|c| c.queued as usize == PACKAGE)
            {
                return (package, client);
            }
        }
        panic!("no whole package queued: the queue is too short for this bench");
    }

    /// A package's counters, or `None` if it is freed.
    fn counts(&mut self, client: ClientId, package: PackageId) -> Option<PackageCounts> {
        let reply = self.apply(Event::Status {
            client,
            req_id: 0,
            package,
        });
        match reply.as_slice() {
            [Action::StatusReply { counts, .. }] => Some(*counts),
            _ => None,
        }
    }

    /// Gives the next busy worker one credit, which must assign a task of `package` (queued
    /// at a higher priority than the background). Returns the worker and the task.
    fn run_one_of(&mut self, package: PackageId, client: ClientId) -> (WorkerId, (TaskId, u32)) {
        let i = self.next_index();
        let worker = self.workers[i].id;
        let got = self.give(worker, 1);
        let counts = self.counts(client, package).expect("the victim is live");
        assert_eq!(counts.running, 1, "the victim's task is assigned");
        (worker, got[0])
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

    /// The next user's submission; `fn_hash` overrides the user's function.
    fn submit_event(
        &mut self,
        tasks: usize,
        opts: PackageOpts,
        fn_hash: Option<FnHash>,
    ) -> (Event, PackageId, ClientId) {
        let user = self.next_user % USERS + 1;
        self.next_user += 1;
        let package = PackageId(self.next_package);
        self.next_package += 1;
        let client = client_of(user);
        let event = Event::Submit {
            client,
            req_id: package.0,
            package,
            fn_hash: fn_hash.unwrap_or(FnHash([user as u8; 32])),
            fn_code: Bytes::from_static(b"def f(x): return x"),
            opts,
            tasks: vec![Bytes::from_static(b"args"); tasks],
        };
        (event, package, client)
    }

    fn submit_untimed(
        &mut self,
        tasks: usize,
        opts: PackageOpts,
        fn_hash: Option<FnHash>,
    ) -> (PackageId, ClientId) {
        let (event, package, client) = self.submit_event(tasks, opts, fn_hash);
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

    /// The sink runs a few tasks of the hedged function (ahead of everything: a higher
    /// priority), so its estimate is trusted and hedged tasks arm their straggler check.
    fn warm_up_hedged_function(&mut self) {
        let opts = PackageOpts {
            priority: 1,
            ..PackageOpts::default()
        };
        self.submit_untimed(HEDGE_WARM_UP, opts, Some(HEDGE_FN));
        let sink = self.sink;
        let results = self
            .give(sink, HEDGE_WARM_UP as u32)
            .into_iter()
            .map(|(task, attempt)| result(task, attempt, TaskStatus::Ok, HEDGE_EXEC_US))
            .collect();
        let out = self.apply(Event::Results {
            worker: sink,
            results,
        });
        self.settle(&out);
        let estimate = self.core.estimate(&HEDGE_FN).expect("learned");
        assert_eq!(estimate.p95_us, HEDGE_EXEC_US);
        assert_eq!(
            self.core.stats().packages,
            0,
            "the warm-up package is freed"
        );
    }

    /// A new worker with `slots`, given `credits`: what it was assigned.
    fn join(&mut self, slots: u32, credits: u32) -> Busy {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.apply(Event::WorkerJoined {
            worker: id,
            slots,
            key: WorkerKey(id.0),
            resources: Default::default(),
            labels: Default::default(),
        });
        let tasks = if credits > 0 {
            self.give(id, credits).into()
        } else {
            VecDeque::new()
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

    /// The sink takes queued tasks until it has taken every one of `lost` (requeued at the
    /// front of their packages, but the users take turns, so other users' front tasks come out
    /// in between), and finishes all it took; the clients acknowledge the results. Returns how
    /// many it took.
    fn finish_on_sink(&mut self, lost: &[(TaskId, u32)]) -> usize {
        let sink = self.sink;
        let mut missing: HashSet<TaskId> = lost.iter().map(|&(task, _)| task).collect();
        let mut taken = Vec::new();
        while !missing.is_empty() {
            assert!(
                taken.len() <= 2 * USERS as usize * lost.len(),
                "the lost tasks are not at the front of their users' queues"
            );
            for (task, attempt) in self.give(sink, missing.len() as u32) {
                missing.remove(&task);
                taken.push((task, attempt));
            }
        }
        self.sink_extra += (taken.len() - lost.len()) as u64;
        let results = taken
            .iter()
            .map(|&(task, attempt)| ok(task, attempt, TaskStatus::Ok))
            .collect();
        let out = self.apply(Event::Results {
            worker: sink,
            results,
        });
        self.settle(&out);
        taken.len()
    }

    /// The clients acknowledge every result in `out`.
    fn settle(&mut self, out: &[Action]) {
        for action in out {
            if let Action::SendResults {
                client: Some(client),
                package,
                results,
                ..
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

    /// Queues whole packages of 100 at the back for the tasks taken out of the queue, then
    /// checks the state's size.
    fn top_up(&mut self) {
        while self.deficit >= PACKAGE {
            let (package, client) = self.submit_untimed(PACKAGE, PackageOpts::default(), None);
            self.intact.push((package, client));
            self.deficit -= PACKAGE;
        }
        self.check_size();
    }

    /// The state has the size it was built with: `target` queued tasks less the deficit (under
    /// 100), 4 running tasks per background worker, the workers and the sink, no cancelled,
    /// retained or poisoned task, and no timer due within a day (only the year-ahead caps).
    pub fn check_size(&self) {
        let s = self.core.stats();
        assert_eq!(
            s.queued + self.deficit,
            self.target,
            "the queue keeps its size"
        );
        assert!(self.deficit < PACKAGE);
        assert_eq!(s.running, self.running, "the workers keep their tasks");
        assert_eq!(
            s.workers,
            self.workers.len() + 1,
            "the workers and the sink"
        );
        assert_eq!(s.tasks, s.queued + s.running, "no task besides");
        assert_eq!(
            (
                s.cancelling,
                s.retained,
                s.counters.poisoned,
                s.counters.stale_results
            ),
            (0, 0, 0, 0),
            "nothing cancelled, retained, poisoned or stale"
        );
        if let Some(at) = self.core.next_timer() {
            assert!(at.0 > self.now + DAY_NS, "a timer is due within a day");
        }
    }
}
