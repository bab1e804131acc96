//! [`Action`]: the orders the core gives the shell, the only output of
//! [`Core::handle`](crate::Core::handle), and the assignments they carry ([`AssignTask`],
//! [`AssignCall`]).

use bytes::Bytes;
use rtpool_proto::Resources;

use super::{PackageCounts, RejectReason, ServiceInfo, TaskOutcome};
use crate::ids::{ClientId, FnHash, PackageId, TaskId, WorkerId};

/// One call inside an [`Action::AssignCalls`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignCall {
    /// The task.
    pub task: TaskId,
    /// Its attempt number, from 1.
    pub attempt: u32,
    /// The function's name.
    pub name: String,
    /// The function's version (the one resolved at submission).
    pub version: String,
    /// Opaque argument payload.
    pub args: Bytes,
    /// Result data of its dependencies, in the order of its `deps`.
    pub inputs: Vec<Bytes>,
    /// Execution time limit, milliseconds; 0 = none.
    pub timeout_ms: u32,
    /// Keep the result on the worker and answer with a reference to it: an intermediate
    /// result of a transaction, which only the calls that depend on it read.
    pub keep: bool,
    /// What the call holds of its worker while it runs (its package's `resources`); empty
    /// for a call that asks for none.
    pub res: Resources,
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
    /// The result of the task it depends on, held by the master (package option `after`);
    /// empty for every other task.
    pub inputs: Vec<Bytes>,
    /// What the task holds of its worker while it runs (its package's `resources`); empty
    /// for a task that asks for none.
    pub res: Resources,
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
        /// The shell must journal this action: false for a package of calls (grid RPC), which
        /// is never journaled.
        journaled: bool,
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
        /// The shell must journal this action: false for a package of calls (grid RPC), which
        /// is never journaled.
        journaled: bool,
    },
    /// The package is gone: all results acknowledged, cancelled, rejected after journaling, or
    /// expired by the TTL (journal: end).
    PackageFreed {
        /// The package.
        package: PackageId,
        /// The TTL expired with results undelivered.
        expired: bool,
        /// The shell must journal this action: false for a package of calls (grid RPC), which
        /// is never journaled.
        journaled: bool,
    },
    /// A worker reported a task time longer than the master saw from assigning the task to
    /// receiving its result; the time was clamped to what the master saw (plus
    /// [`REPORT_MARGIN_US`](crate::REPORT_MARGIN_US)) before anything was charged or learned.
    /// Sent once per worker connection, for its first such result, so the shell can log it.
    Overreported {
        /// The worker.
        worker: WorkerId,
        /// The task.
        task: TaskId,
        /// What it reported, microseconds (the largest of its three times).
        reported_us: u64,
        /// What the master allowed: assignment to result plus the margin, microseconds.
        allowed_us: u64,
    },
    /// Tell the worker to stop these tasks (the master already answered them).
    Abort {
        /// The worker.
        worker: WorkerId,
        /// `(task, attempt)` pairs.
        tasks: Vec<(TaskId, u32)>,
    },
    /// Send these calls to the worker (never more than its credits, together with any
    /// `Assign` of the same event).
    AssignCalls {
        /// The worker.
        worker: WorkerId,
        /// The calls.
        calls: Vec<AssignCall>,
    },
    /// Answer a `Functions` request.
    FunctionsReply {
        /// The client.
        client: ClientId,
        /// Its request id.
        req_id: u64,
        /// The functions, names sorted, newest version first within a name.
        functions: Vec<ServiceInfo>,
    },
    /// A worker's `Serve` entry was refused: another worker serves that name and version with
    /// a different interface.
    ServeRefused {
        /// The worker.
        worker: WorkerId,
        /// The function's name.
        name: String,
        /// Its version.
        version: String,
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
    /// Tell the worker to forget these kept results (`DROP`): their owner released them.
    DropKept {
        /// The worker that holds them.
        worker: WorkerId,
        /// Their keys.
        keys: Vec<Bytes>,
    },
    /// The client holds more unacknowledged results than a client may: close its connection
    /// (its packages detach and keep their results for the result TTL). Sent once per client.
    UnackedLimit {
        /// The client.
        client: ClientId,
        /// Results sent to it and not acknowledged.
        results: u64,
        /// Their data bytes.
        bytes: u64,
        /// The limit on results (0: none).
        max_results: u64,
        /// The limit on bytes (0: none).
        max_bytes: u64,
    },
}

impl Action {
    /// Whether the shell must write this action to its journal: new results, deliveries and
    /// package ends of packages that are journaled (not of call packages). The core decides,
    /// as it alone knows which packages are calls.
    pub fn is_journaled(&self) -> bool {
        match self {
            Action::SendResults { journaled, .. }
            | Action::Delivered { journaled, .. }
            | Action::PackageFreed { journaled, .. } => *journaled,
            _ => false,
        }
    }
}
