//! Events (facts the shell observed) and actions (orders the core gives the shell).
//!
//! Where the core and the wire mean the same thing, the core takes the wire's type from
//! `rtpool-proto`: package options ([`PackageOpts`], [`MissPolicy`]), served functions, calls
//! and registry entries. The core keeps its own types only where its view differs: typed ids
//! and statuses ([`AssignTask`], [`AssignCall`], [`TaskOutcome`] against the wire's raw
//! integers), each mapped to the wire in one place in the master.
//!
//! This file holds the [`Event`]s and their payloads; [`action`] the [`Action`]s, [`outcome`]
//! a task's status and outcome (in both), [`reject`] why a submission is refused.

mod action;
mod outcome;
mod reject;

use bytes::Bytes;

/// One call of an [`Event::SubmitCalls`]: the wire's `CALL` entry.
pub use rtpool_proto::Call as CallSpec;
/// A served function as the registry lists it, for [`Action::FunctionsReply`]: the wire's
/// `FUNCTIONS_REPLY` entry.
pub use rtpool_proto::FunctionInfo as ServiceInfo;
/// A named function a worker serves (grid RPC), as its `SERVE` declares it: the wire's type.
pub use rtpool_proto::ServedFunction as ServiceDecl;
pub use rtpool_proto::{Labels, MissPolicy, PackageCounts, PackageOpts, Resources, Unschedulable};

pub use self::action::{Action, AssignCall, AssignTask};
pub use self::outcome::{TaskOutcome, TaskStatus, WorkerOutcome};
pub use self::reject::RejectReason;

use crate::ids::{ClientId, FnHash, PackageId, TaskId, UserId, WorkerId, WorkerKey};

/// A fact the shell observed. The core's only input.
#[derive(Debug, Clone)]
pub enum Event {
    /// A client authenticated as `user`.
    ClientJoined {
        /// The client.
        client: ClientId,
        /// Its user.
        user: UserId,
    },
    /// A client's connection closed: its packages are detached and kept for the result TTL,
    /// waiting for an `Attach`.
    ClientLost {
        /// The client.
        client: ClientId,
    },
    /// A client submitted a package.
    Submit {
        /// The submitting client.
        client: ClientId,
        /// The client's request id, echoed in `Accepted`/`Rejected`.
        req_id: u64,
        /// The id the new package gets (the shell numbers packages, so ids survive restarts).
        package: PackageId,
        /// Hash of `fn_code`, already verified by the shell.
        fn_hash: FnHash,
        /// The function's code.
        fn_code: Bytes,
        /// Options.
        opts: PackageOpts,
        /// One payload per task.
        tasks: Vec<Bytes>,
    },
    /// A client cancels tasks of its package (empty `indices` = all).
    Cancel {
        /// The client.
        client: ClientId,
        /// Its package.
        package: PackageId,
        /// Indices to cancel, empty for all.
        indices: Vec<u32>,
    },
    /// A client (re-)attaches to a package of its user after a reconnect.
    Attach {
        /// The client.
        client: ClientId,
        /// Echoed in `Accepted`.
        req_id: u64,
        /// The package.
        package: PackageId,
    },
    /// A client received the first `count` results of a package sent since it attached.
    Ack {
        /// The client.
        client: ClientId,
        /// Its package.
        package: PackageId,
        /// Cumulative count.
        count: u64,
    },
    /// The shell's timer: fire every time limit and TTL that has passed.
    Tick,
    /// A user's remaining compute time changed (loaded from the store, or set by an admin).
    SetQuota {
        /// The user.
        user: UserId,
        /// Microseconds left as of the last [`crate::Core::take_usage`] (the core subtracts
        /// what it charged since); `None` = unlimited.
        remaining_us: Option<i64>,
    },
    /// A package recovered from the journal after a restart: detached, waiting for its client.
    Restore(Box<RestoredPackage>),
    /// A client asks for a package's counters.
    Status {
        /// The client.
        client: ClientId,
        /// Echoed in the reply.
        req_id: u64,
        /// Its package.
        package: PackageId,
    },
    /// A worker authenticated with `slots` execution slots (0 credits so far).
    WorkerJoined {
        /// The worker.
        worker: WorkerId,
        /// Tasks it runs at once.
        slots: u32,
        /// What it runs on, the same after a reconnect or a restart of its process: its
        /// pace is learned under this key.
        key: WorkerKey,
        /// What it has for tasks that ask for resources (`gpu=2`); empty: nothing.
        resources: Resources,
        /// Its labels (`zone=a`).
        labels: Labels,
    },
    /// A worker grants `credits` more tasks.
    Credit {
        /// The worker.
        worker: WorkerId,
        /// Credits added.
        credits: u32,
    },
    /// A worker published results.
    Results {
        /// The worker.
        worker: WorkerId,
        /// Results, in the order the worker sent them.
        results: Vec<WorkerOutcome>,
    },
    /// A worker hands back unstarted tasks, as `(task, attempt)`, and withdraws its unused
    /// credits (it sends `Credit` again for what it wants).
    Returned {
        /// The worker.
        worker: WorkerId,
        /// The tasks.
        tasks: Vec<(TaskId, u32)>,
    },
    /// A worker wants no more tasks (graceful shutdown has begun).
    Drain {
        /// The worker.
        worker: WorkerId,
    },
    /// A worker declares the named functions it serves (once, before it pulls).
    Serve {
        /// The worker.
        worker: WorkerId,
        /// Its functions.
        functions: Vec<ServiceDecl>,
    },
    /// A client submitted a package of calls of named functions (a transaction when they
    /// depend on each other).
    SubmitCalls {
        /// The submitting client.
        client: ClientId,
        /// The client's request id, echoed in `Accepted`/`Rejected`.
        req_id: u64,
        /// The id the new package gets.
        package: PackageId,
        /// Options (replicas, quorum, max copies, hedge, admit and `on_miss = drop` are
        /// refused).
        opts: PackageOpts,
        /// The calls; task `i` of the package is call `i`.
        calls: Vec<CallSpec>,
    },
    /// A client asks for the registry of served functions.
    Functions {
        /// The client.
        client: ClientId,
        /// Echoed in the reply.
        req_id: u64,
        /// One name's versions, or every function when empty.
        name: String,
    },
    /// A worker's connection closed: its assigned tasks go back to the ready queue.
    WorkerLost {
        /// The worker.
        worker: WorkerId,
        /// How the master lost it: whether the loss may be held against its running tasks.
        cause: LossCause,
    },
    /// A client no longer needs these results kept on workers (`RELEASE`, `docs/data.md`).
    ReleaseKept {
        /// The client.
        client: ClientId,
        /// `(worker that holds it, key)` pairs; the key (16 random bytes) is the capability,
        /// so whoever knows it may release it.
        keys: Vec<(WorkerId, Bytes)>,
    },
}

/// How the master lost a worker ([`Event::WorkerLost`]), which decides whether the loss counts
/// against the tasks it was running (the poison-task cap, `docs/reliability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCause {
    /// The connection ended: end of stream, reset, a fatal protocol error, a slow consumer. The
    /// process may have died with a task in it: its oldest running tasks are blamed.
    Closed,
    /// The worker sent nothing for its lease (or its path timed out): stopped, cut off, starved
    /// or frozen, maybe alive. Silence is not evidence against a task (a mass expiry would
    /// blame every task the silent workers held), so nothing is blamed; the tasks are requeued
    /// with their next attempt. (`rtpool worker` kills a child whose task holds the GIL past
    /// 70% of the lease and reports the crash: that report is blamed.)
    Silent,
    /// The master closed it (its token revoked, a slow consumer, shutdown): nothing is blamed.
    Dismissed,
}

/// A package as the journal recorded it, for [`Event::Restore`].
#[derive(Debug, Clone)]
pub struct RestoredPackage {
    /// Its id.
    pub package: PackageId,
    /// Its user.
    pub user: UserId,
    /// Hash of `fn_code`.
    pub fn_hash: FnHash,
    /// The function's code.
    pub fn_code: Bytes,
    /// Options (with the idempotency key).
    pub opts: PackageOpts,
    /// Every task's payload, by index.
    pub tasks: Vec<Bytes>,
    /// Results accepted but not acknowledged by the client, in completion order.
    pub done: Vec<TaskOutcome>,
    /// Indices whose results the client acknowledged.
    pub delivered: Vec<u32>,
    /// A package of calls (`fn_hash` is [`crate::CALLS_HASH`], `tasks` empty): its calls, each
    /// naming the version it was resolved to when it was accepted. Its `done` is ignored: its
    /// calls not delivered run again.
    pub calls: Vec<CallSpec>,
}
