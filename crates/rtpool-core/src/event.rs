//! Events (facts the shell observed) and actions (orders the core gives the shell).

use bytes::Bytes;

use crate::ids::{ClientId, FnHash, PackageId, TaskId, UserId, WorkerId};

/// Options of a package.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackageOpts {
    /// Higher runs first; FIFO within one priority.
    pub priority: i32,
    /// Execution time limit per task, milliseconds; 0 = none.
    pub timeout_ms: u32,
    /// Idempotency key; empty = none. A submission whose key names a live package of the same
    /// user attaches to that package instead of creating one.
    pub key: String,
}

/// Outcome of a task as the protocol's status byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// The function returned.
    Ok = 0,
    /// The function raised.
    Error = 1,
    /// Cancelled before it ran.
    Cancelled = 2,
    /// The system could not run it.
    Failed = 3,
    /// It ran past its time limit.
    Timeout = 4,
    /// Its worker was lost on each of its attempts (a poison task).
    Lost = 5,
    /// Its user's quota ran out.
    Quota = 6,
}

impl TaskStatus {
    /// From the wire's status byte; unknown values are `None`.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Ok),
            1 => Some(Self::Error),
            2 => Some(Self::Cancelled),
            3 => Some(Self::Failed),
            4 => Some(Self::Timeout),
            5 => Some(Self::Lost),
            6 => Some(Self::Quota),
            _ => None,
        }
    }
}

/// One result a worker published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOutcome {
    /// The task, as the assignment named it.
    pub task: TaskId,
    /// The attempt, as the assignment named it.
    pub attempt: u32,
    /// Ok, error, ...
    pub status: TaskStatus,
    /// Opaque result payload.
    pub data: Bytes,
    /// Worker-measured execution time, microseconds.
    pub exec_us: u64,
    /// Worker-measured prefetch wait, microseconds.
    pub wait_us: u64,
    /// Worker-measured result batching delay, microseconds.
    pub flush_us: u64,
}

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
    /// A worker's connection closed: its assigned tasks go back to the ready queue.
    WorkerLost {
        /// The worker.
        worker: WorkerId,
    },
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
}

/// One task inside an [`Action::Assign`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignTask {
    /// The task.
    pub task: TaskId,
    /// Its attempt number, from 1.
    pub attempt: u32,
    /// Its function.
    pub fn_hash: FnHash,
    /// The code, only the first time this worker gets `fn_hash`.
    pub fn_code: Option<Bytes>,
    /// Opaque argument payload.
    pub args: Bytes,
    /// Execution time limit, milliseconds; 0 = none.
    pub timeout_ms: u32,
}

/// One task's result inside an [`Action::SendResults`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    /// Position of the task in its package.
    pub index: u32,
    /// Ok, error, cancelled, failed.
    pub status: TaskStatus,
    /// Opaque payload or UTF-8 message.
    pub data: Bytes,
    /// Receipt of the package to assignment, microseconds.
    pub queue_us: u64,
    /// Assignment to result, microseconds.
    pub worker_us: u64,
    /// Worker-measured execution time, microseconds.
    pub exec_us: u64,
    /// Worker-measured prefetch wait, microseconds.
    pub wait_us: u64,
    /// Worker-measured result batching delay, microseconds.
    pub flush_us: u64,
}

/// Counters of a package.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackageCounts {
    /// Tasks in the package.
    pub total: u32,
    /// Waiting for a worker.
    pub queued: u32,
    /// Assigned to a worker.
    pub running: u32,
    /// Finished: a result exists (sent, or waiting for the client to attach).
    pub done: u32,
    /// Cancelled.
    pub cancelled: u32,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// A package needs at least one task.
    #[error("package has no tasks; submit at least one")]
    Empty,
    /// Too many tasks in one package.
    #[error("package has {tasks} tasks, more than the limit of {limit}; split it")]
    TooManyTasks {
        /// Tasks submitted.
        tasks: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The user's compute-time quota is used up.
    #[error("user's compute-time quota is used up ({over_us} us over); ask an admin for more (`rtpool token quota`)")]
    QuotaExhausted {
        /// Microseconds used beyond the quota (0 when exactly used up).
        over_us: u64,
    },
}

/// An order the shell carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send these tasks to the worker (never more than its credits).
    Assign {
        /// The worker.
        worker: WorkerId,
        /// The tasks.
        tasks: Vec<AssignTask>,
    },
    /// Tell the client its package was accepted.
    Accepted {
        /// The client.
        client: ClientId,
        /// Its request id.
        req_id: u64,
        /// The new package.
        package: PackageId,
    },
    /// Tell the client its package was refused.
    Rejected {
        /// The client.
        client: ClientId,
        /// Its request id.
        req_id: u64,
        /// Why.
        reason: RejectReason,
    },
    /// New results of one package: record them (journal) and send them to the client if one
    /// is attached (`client` is `None` while the package is detached).
    SendResults {
        /// The attached client.
        client: Option<ClientId>,
        /// The package.
        package: PackageId,
        /// Results, in completion order.
        results: Vec<TaskOutcome>,
    },
    /// Send results again (after an attach): not new, so not recorded again.
    Resend {
        /// The client.
        client: ClientId,
        /// The package.
        package: PackageId,
        /// Every unacknowledged result, in their original order.
        results: Vec<TaskOutcome>,
    },
    /// The client acknowledged these results; they are freed (journal: delivered).
    Delivered {
        /// The package.
        package: PackageId,
        /// Their indices.
        indices: Vec<u32>,
    },
    /// The package is gone: all results acknowledged, cancelled, rejected after journaling, or
    /// expired by the TTL (journal: end).
    PackageFreed {
        /// The package.
        package: PackageId,
        /// The TTL expired with results undelivered.
        expired: bool,
    },
    /// Tell the worker to stop these tasks (the master already answered them).
    Abort {
        /// The worker.
        worker: WorkerId,
        /// `(task, attempt)` pairs.
        tasks: Vec<(TaskId, u32)>,
    },
    /// Answer a status request.
    StatusReply {
        /// The client.
        client: ClientId,
        /// Its request id.
        req_id: u64,
        /// The package.
        package: PackageId,
        /// Its counters.
        counts: PackageCounts,
    },
    /// The client named a package that is not its own or no longer exists.
    UnknownPackage {
        /// The client.
        client: ClientId,
        /// The package it named.
        package: PackageId,
    },
}
