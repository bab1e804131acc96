//! The [`Core`]: tables, ready queue, credits, and the one entry point [`Core::handle`].
//!
//! This file holds the state, the entry point and the shell's queries. The rest, by concern:
//!
//! - `core/enqueue.rs`: queueing a task and requeueing one a worker gave back;
//! - `core/finish.rs`: finishing a task, releasing a done one, freeing a finished package;
//! - `core/prepare.rs`: memory made ahead of need in the shell's idle time;
//! - `core/client_events.rs`: a client's events (submit, cancel, attach, ack, status);
//! - `core/admission.rs`: the checks a submission passes (size, options, deadline, quota);
//! - `core/worker_events.rs`: a worker's events (join, credit, results, return, loss);
//! - `core/calls.rs`: packages of calls of named functions (grid RPC) and their dependencies
//!   (`core/calls/`: the registry, dispatch of calls, what a decided call passes on);
//! - `core/lineage.rs`: kept intermediates of transactions, and making a lost one again;
//! - `core/restore_calls.rs`: packages of calls restored from the journal;
//! - `core/copies.rs`: the copies of one task (replicas, quorum, hedges);
//! - `core/dispatch.rs`: assignment of queued tasks to workers' credits;
//! - `core/timers.rs`: time limits, result TTLs, deadlines, hedge and service timers;
//! - `core/unacked.rs`: the per-client bound on results waiting for an acknowledgement;
//! - `core/invariants.rs`: the invariant walk the tests run after every event (`core/invariants/`:
//!   its checks, by table);
//! - `core/view.rs`: read-only views of the tables for status snapshots.
//!
//! The tunables are `config.rs`'s, the gauges and counters `stats.rs`'s.
//!
//! Where a task is, and who points at it:
//!
//! | task state  | ready queue    | worker in-flight set | package counter        |
//! |-------------|----------------|----------------------|------------------------|
//! | `Queued`    | one live entry | none                 | `queued`               |
//! | `Running`   | none           | its worker's         | `running`              |
//! | `Cancelled` | none           | its worker's         | `cancelled`            |
//! | freed       | none           | none                 | `done` or `cancelled`  |
//!
//! A `Cancelled` task's package may already be freed: the client is done with it, and only the
//! worker's answer (or loss) is awaited so the in-flight set stays exact.

mod admission;
mod calls;
mod cancel;
mod class_dispatch;
mod classes;
mod client_events;
mod copies;
mod dispatch;
mod enqueue;
mod finish;
mod held;
mod invariants;
mod kept;
mod lineage;
mod locality;
mod prepare;
mod reported;
mod restore_calls;
mod submit;
mod timers;
mod unacked;
mod view;
mod worker_events;
mod worker_loss;

pub use self::view::{ClassView, PackageView, WorkerView};

use std::collections::{BTreeMap, BTreeSet};

pub use self::calls::CALLS_HASH;
pub use self::reported::REPORT_MARGIN_US;

use bytes::Bytes;

use crate::buffers::IdBuffers;
use crate::class::ClassTable;
use crate::client::{Client, User};
use crate::config::CoreConfig;
use crate::estimate::{Estimate, Estimator};
use crate::event::{Action, Event, TaskOutcome};
use crate::function::FunctionTable;
use crate::group::Group;
use crate::hungry::HungryRing;
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, UserId, WorkerId, WorkerKey};
use crate::kind::KindTable;
use crate::overload::OverloadWatch;
use crate::package::Package;
use crate::placement::Link;
use crate::queue::{Queue, QueueStore};
use crate::service::ServiceTable;
use crate::stats::{CoreStats, Counters, WorkerStats};
use crate::table::{Ahead, IdMap, Map, Table};
use crate::task::Task;
use crate::worker::Worker;

/// A timer: a running attempt's time limit, a detached package's TTL, a package's deadline
/// (`on_miss = drop`), or a hedged attempt's straggler check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// A running attempt's time limit (plus grace): `(task, attempt)`.
    TimeLimit(TaskId, u32),
    /// A detached package's result TTL (slab key of the package).
    ResultTtl(u64),
    /// A package's deadline, armed for `on_miss = drop` (slab key of the package).
    Deadline(u64),
    /// A hedged attempt's straggler check: `(task, attempt)`.
    Hedge(TaskId, u32),
    /// A service's grace period without servers (slab key of the service).
    Service(u64),
    /// A resource class's grace period without servers (slab key of the class).
    Class(u64),
    /// The grace period of a service's calls of one resource class without a worker that
    /// serves both: `(service, class)`, slab keys.
    Calls(u64, u64),
}

/// The scheduler state machine.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    tasks: Table<Task>,
    packages: Table<Package>,
    /// Public package id to slab key.
    package_slots: IdMap<PackageId, u64>,
    /// Grows `package_slots` ahead of need.
    slots_ahead: Ahead,
    /// The user and client of the latest package: [`Core::prepare`] grows their sets of
    /// packages ahead of need.
    latest_owner: Option<(UserId, Option<ClientId>)>,
    /// `(user, idempotency key)` of live packages.
    keys: Map<(UserId, String), PackageId>,
    /// The queue of packages without a request.
    queue: Queue,
    /// The packages' entries and tasks' nodes of `queue` and of every resource class's queue
    /// (`ResClass::queue`): a package queues in one of them only.
    queue_store: QueueStore,
    /// The packages' lists of task ids, recycled and made ahead of need.
    buffers: IdBuffers,
    /// Copy groups of tasks that run as several copies.
    groups: Table<Group>,
    /// Aborts decided while handling the current event, sent at its end.
    pending_aborts: Vec<(WorkerId, TaskId, u32)>,
    /// The latest lost workers' running tasks and which of them were blamed, so that a late
    /// crash report can move the blame to the task that really ran (bounded).
    recent_losses: std::collections::VecDeque<worker_loss::RecentLoss>,
    /// Credits of the connected workers that are not draining.
    free_credits: u64,
    functions: FunctionTable,
    workers: IdMap<WorkerId, Worker>,
    /// Connected workers per [`WorkerKey`] (usually one; two while a replaced process's old
    /// connection is not yet known to be lost): which paces belong to a connected worker.
    worker_keys: IdMap<WorkerKey, u32>,
    clients: IdMap<ClientId, Client>,
    users: IdMap<UserId, User>,
    hungry: HungryRing,
    /// Armed timers, removed eagerly when their task answers or their package re-attaches, so
    /// the map never holds more than the running tasks plus the detached packages.
    timers: BTreeMap<(Instant, Timer), ()>,
    /// The registry of named functions (grid RPC).
    services: ServiceTable,
    /// Services whose queues may hold calls (checked lazily by call dispatch).
    waiting_services: BTreeSet<u64>,
    /// Resource classes (`class.rs`): the queues of packages that ask for resources or labels.
    classes: ClassTable,
    /// Worker kinds (`kind.rs`): the workers of one set of totals and labels, and the
    /// classes they serve.
    kinds: KindTable,
    /// The next turn a served class takes (`ResClass::turn`).
    next_turn: u64,
    /// Workers of a kind that got a credit or freed resources this event: class dispatch
    /// gives each the best task of its kind's ready classes.
    class_workers: Vec<WorkerId>,
    /// A lost worker's held tasks, `(assignment sequence, task)`: the buffer is kept from one
    /// loss to the next, so a loss allocates nothing for it.
    lost_held: Vec<(u64, TaskId)>,
    /// Classes whose head task changed this event while servers may wait for it: class
    /// dispatch places it on one of its offered servers.
    class_pass: Vec<u64>,
    /// What was learned of the links to all workers: the default for a worker not yet measured.
    pool_link: Link,
    /// Transaction intermediates kept on workers (`lineage.rs`).
    kept_calls: Table<lineage::KeptCall>,
    /// Kept values to drop, `(worker, key)`, sent at the end of the event.
    pending_drops: Vec<(WorkerId, Bytes)>,
    /// Results of calls failed because an input failed, sent at the end of the event.
    cascade: Vec<(u64, TaskOutcome)>,
    /// Calls to fail because an input failed, with why (worked off by the outermost
    /// `call_finished`, so a long chain does not recurse).
    doomed: Vec<(TaskId, String)>,
    failing_dependents: bool,
    /// Held packages (option `after`) by slot: their producer and input (`held.rs`).
    held: Map<u64, held::Held>,
    /// Packages waiting for each producer task, by the producer's id (at most
    /// `held::MAX_DEPENDENTS` each).
    waiters: Map<TaskId, Vec<u64>>,
    /// Held packages whose producer will never succeed, with why: failed at the end of the
    /// event (a work list, so a long chain does not recurse).
    doomed_held: Vec<(u64, String)>,
    /// A held package was released during this event: dispatch at its end.
    held_released: bool,
    /// Tasks in state `Running`.
    running: usize,
    /// Tasks in state `Cancelled`.
    cancelling: usize,
    /// Tasks in state `Done`.
    retained: usize,
    /// Execution-time estimate of each function seen, by hash (kept after its packages go:
    /// the next package of the same function starts with what was learned).
    estimates: Map<FnHash, Estimator>,
    /// Slots of the connected workers that are not draining.
    total_slots: u64,
    /// Estimated work of the running tasks, microseconds of one slot.
    running_work_us: u64,
    /// Submission order of the next package.
    next_package_seq: u64,
    /// Deadline results of the latest window: is the master overloaded?
    overload: OverloadWatch,
    /// Epoch of the next worker to join.
    next_epoch: u64,
    /// Sequence number of the next assignment.
    next_seq: u64,
    /// Events counted since start.
    counters: Counters,
}

impl Default for Core {
    fn default() -> Self {
        Self::new(CoreConfig::default())
    }
}

impl Core {
    /// A budget for one [`Core::prepare`] call: 256 slots of each table (about 46 KiB of
    /// tasks and 76 KiB of packages), so one call costs at most a few dozen page faults.
    pub const PREPARE_SLOTS: usize = 256;

    /// An empty core.
    pub fn new(config: CoreConfig) -> Self {
        Self {
            tasks: Table::default(),
            packages: Table::default(),
            package_slots: IdMap::default(),
            slots_ahead: Ahead::default(),
            latest_owner: None,
            keys: Map::default(),
            queue: Queue::default(),
            queue_store: QueueStore::dense(),
            buffers: IdBuffers::default(),
            groups: Table::default(),
            pending_aborts: Vec::new(),
            recent_losses: std::collections::VecDeque::new(),
            free_credits: 0,
            functions: FunctionTable::default(),
            workers: IdMap::default(),
            worker_keys: IdMap::default(),
            clients: IdMap::default(),
            users: IdMap::default(),
            hungry: HungryRing::default(),
            timers: BTreeMap::new(),
            estimates: Map::default(),
            services: ServiceTable::default(),
            waiting_services: BTreeSet::new(),
            classes: ClassTable::default(),
            kinds: KindTable::default(),
            next_turn: 1,
            class_workers: Vec::new(),
            lost_held: Vec::new(),
            class_pass: Vec::new(),
            pool_link: Link::default(),
            kept_calls: Table::default(),
            pending_drops: Vec::new(),
            cascade: Vec::new(),
            doomed: Vec::new(),
            failing_dependents: false,
            held: Map::default(),
            waiters: Map::default(),
            doomed_held: Vec::new(),
            held_released: false,
            total_slots: 0,
            running_work_us: 0,
            next_package_seq: 0,
            overload: OverloadWatch::new(config.overload_window_ns, config.overload_miss_ratio),
            running: 0,
            cancelling: 0,
            retained: 0,
            next_epoch: 0,
            next_seq: 0,
            counters: Counters::default(),
            config,
        }
    }

    /// Apply one event at time `now`, appending the resulting actions to `out`.
    ///
    /// Bad input from a peer (an unknown task id, a result for a task that is not assigned to
    /// that worker, a package of another user) never panics: it is ignored and counted, or
    /// answered with an action such as [`Action::UnknownPackage`].
    pub fn handle(&mut self, event: Event, now: Instant, out: &mut Vec<Action>) {
        match event {
            Event::ClientJoined { client, user } => self.on_client_joined(client, user),
            Event::ClientLost { client } => self.on_client_lost(client, now),
            Event::Submit {
                client,
                req_id,
                package,
                fn_hash,
                fn_code,
                opts,
                tasks,
            } => {
                let submit = submit::Submit {
                    client,
                    req_id,
                    package,
                    fn_hash,
                    fn_code,
                    opts,
                    tasks,
                };
                self.on_submit(submit, now, out);
            }
            Event::Cancel {
                client,
                package,
                indices,
            } => self.on_cancel(client, package, &indices, out),
            Event::Attach {
                client,
                req_id,
                package,
            } => self.on_attach(client, req_id, package, out),
            Event::Ack {
                client,
                package,
                count,
            } => self.on_ack(client, package, count, out),
            Event::Tick => self.on_tick(now, out),
            Event::SetQuota { user, remaining_us } => {
                self.on_set_quota(user, remaining_us, now, out)
            }
            Event::Restore(restored) => self.on_restore(*restored, now, out),
            Event::Status {
                client,
                req_id,
                package,
            } => self.on_status(client, req_id, package, out),
            Event::WorkerJoined {
                worker,
                slots,
                key,
                resources,
                labels,
            } => self.on_worker_joined(worker, slots, key, resources, labels),
            Event::Credit { worker, credits } => self.on_credit(worker, credits, now, out),
            Event::Results { worker, results } => self.on_results(worker, results, now, out),
            Event::Returned { worker, tasks } => self.on_returned(worker, &tasks, now, out),
            Event::Drain { worker } => self.on_drain(worker, now),
            Event::WorkerLost { worker, cause } => self.on_worker_lost(worker, cause, now, out),
            Event::Serve { worker, functions } => self.on_serve(worker, functions, now, out),
            Event::SubmitCalls {
                client,
                req_id,
                package,
                opts,
                calls,
            } => self.on_submit_calls(client, req_id, package, opts, calls, now, out),
            Event::Functions {
                client,
                req_id,
                name,
            } => self.on_functions(client, req_id, &name, out),
            Event::ReleaseKept { client, keys } => self.on_release_kept(client, keys, out),
        }
        if !self.doomed_held.is_empty() {
            self.fail_doomed_held(now);
        }
        if std::mem::take(&mut self.held_released) {
            self.dispatch(now, out);
        }
        if !self.cascade.is_empty() {
            let mut results = timers::Results::default();
            for (slot, outcome) in std::mem::take(&mut self.cascade) {
                results.add(self, slot, outcome);
            }
            self.push_results(results, out);
        }
        if !self.pending_aborts.is_empty() {
            let aborts = std::mem::take(&mut self.pending_aborts);
            self.push_aborts(aborts, out);
        }
        if !self.pending_drops.is_empty() {
            self.push_drops(out);
        }
    }

    /// Current gauges and counters.
    pub fn stats(&self) -> CoreStats {
        CoreStats {
            tasks: self.tasks.len(),
            packages: self.packages.len(),
            queued: self.queue.len() + self.class_queued(),
            running: self.running,
            cancelling: self.cancelling,
            retained: self.retained,
            workers: self.workers.len(),
            clients: self.clients.len(),
            functions: self.functions.len(),
            services: self.services.len(),
            counters: self.counters,
        }
    }

    /// The code stored for `hash`, if a live package uses it.
    pub fn function_code(&self, hash: &FnHash) -> Option<&Bytes> {
        self.functions.code(hash)
    }

    /// Connected workers.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// One worker's gauges, or `None` if it is not connected.
    pub fn worker_stats(&self, worker: WorkerId) -> Option<WorkerStats> {
        self.workers.get(&worker).map(|w| WorkerStats {
            slots: w.slots,
            credits: w.credits,
            in_flight: w.in_flight.len(),
            draining: w.draining,
        })
    }

    /// When the next timer fires, so the shell can send [`Event::Tick`] then; `None` if no
    /// timer is armed.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Compute time charged per user since the last call, microseconds (the shell writes it
    /// behind to the user store).
    pub fn take_usage(&mut self) -> Vec<(UserId, u64)> {
        let mut usage: Vec<(UserId, u64)> = self
            .users
            .iter_mut()
            .filter(|(_, u)| u.pending_us > 0)
            .map(|(id, u)| (*id, std::mem::take(&mut u.pending_us)))
            .collect();
        usage.sort_unstable();
        usage
    }

    /// What the core has learned of a function's execution time (`None`: no result yet).
    pub fn estimate(&mut self, hash: &FnHash) -> Option<Estimate> {
        self.estimates.get_mut(hash).map(Estimator::estimate)
    }

    /// A function's estimate if it rests on enough results to act on (hedging, dropping a
    /// task that cannot make its deadline).
    fn trusted_estimate(&mut self, hash: &FnHash) -> Option<Estimate> {
        let min = u64::from(self.config.estimate_min_samples.max(1));
        self.estimates
            .get_mut(hash)
            .filter(|e| e.samples() >= min)
            .map(Estimator::estimate)
    }

    /// A user's remaining compute time in microseconds (`None`: unlimited or unknown).
    pub fn remaining_us(&self, user: UserId) -> Option<i64> {
        self.users.get(&user).and_then(|u| u.remaining_us)
    }
}
