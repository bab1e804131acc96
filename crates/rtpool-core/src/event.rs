//! Events (facts the shell observed) and actions (orders the core gives the shell).

use bytes::Bytes;

use crate::ids::{ClientId, FnHash, PackageId, TaskId, WorkerId};

/// Options of a package.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackageOpts {
    /// Higher runs first; FIFO within one priority.
    pub priority: i32,
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
}

impl TaskStatus {
    /// From the wire's status byte; unknown values are `None`.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Ok),
            1 => Some(Self::Error),
            2 => Some(Self::Cancelled),
            3 => Some(Self::Failed),
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
    /// A client authenticated.
    ClientJoined {
        /// The client.
        client: ClientId,
    },
    /// A client's connection closed: its unfinished packages are cancelled and freed.
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
    /// Result sent to the client.
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
    /// Stream results of one package to its client.
    SendResults {
        /// The client.
        client: ClientId,
        /// The package.
        package: PackageId,
        /// Results, in completion order.
        results: Vec<TaskOutcome>,
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
