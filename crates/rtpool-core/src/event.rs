//! Events (facts the shell observed) and actions (orders the core gives the shell).
//!
//! Where the core and the wire mean the same thing, the core takes the wire's type from
//! `rtpool-proto`: package options ([`PackageOpts`], [`MissPolicy`]), served functions, calls
//! and registry entries. The core keeps its own types only where its view differs: typed ids
//! and statuses ([`AssignTask`], [`AssignCall`], [`TaskOutcome`] against the wire's raw
//! integers), each mapped to the wire in one place in the master.

use bytes::Bytes;

/// One call of an [`Event::SubmitCalls`]: the wire's `CALL` entry.
pub use rtpool_proto::Call as CallSpec;
/// A served function as the registry lists it, for [`Action::FunctionsReply`]: the wire's
/// `FUNCTIONS_REPLY` entry.
pub use rtpool_proto::FunctionInfo as ServiceInfo;
/// A named function a worker serves (grid RPC), as its `SERVE` declares it: the wire's type.
pub use rtpool_proto::ServedFunction as ServiceDecl;
pub use rtpool_proto::{MissPolicy, PackageCounts, PackageOpts};

use crate::ids::{ClientId, FnHash, PackageId, TaskId, UserId, WorkerId, WorkerKey};

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
    /// It could no longer make its deadline and its package's policy is `on_miss = drop`.
    Missed = 7,
    /// Its copies' results disagreed and no quorum was reached within the copy limit; the data
    /// is a msgpack array `[message: str, [[worker: str, status: u8, data: bin], ...]]`.
    Disagree = 8,
    /// From a worker only, for a call: an input kept on another worker could not be read (its
    /// process is gone, or it no longer holds it). The data is the input's position (`u32`,
    /// big-endian) and a UTF-8 message. The master makes the input again and runs the call
    /// again (`docs/rpc.md`, "Transactions"); a client never sees this status.
    InputLost = 9,
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
            7 => Some(Self::Missed),
            8 => Some(Self::Disagree),
            9 => Some(Self::InputLost),
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
        /// What it runs on, the same after a reconnect or a restart of its process: its
        /// pace is learned under this key.
        key: WorkerKey,
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
    /// How late the result came after the package's deadline, microseconds; 0 if on time or
    /// without a deadline.
    pub late_us: u64,
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
    /// Options that contradict each other or exceed a limit.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A call named a function, or a version of it, that no connected worker serves.
    #[error("no worker serves {what}; served: {served}")]
    UnknownFunction {
        /// The function as named: `'dmmul'` or `'dmmul' version 2`.
        what: String,
        /// What is served, `name (versions)` joined by commas, or `nothing`.
        served: String,
    },
    /// Package option `after` names no task whose result can become this package's input.
    #[error("after = {package}, after_index = {index}: {why}; wait for its result and pass the value instead")]
    UnknownDependency {
        /// The package named.
        package: u64,
        /// The task's index in it.
        index: u32,
        /// Why it cannot be used.
        why: &'static str,
    },
    /// A call of a `SubmitCalls` is malformed (a dependency on itself or a later call).
    #[error("call #{index}: {reason}")]
    InvalidCall {
        /// The call's index.
        index: u32,
        /// What is wrong.
        reason: String,
    },
    /// Admission control: no worker slot is connected (or every worker drains), so nothing
    /// can finish by the deadline.
    #[error(
        "admission refused: no worker slot is connected, so nothing can finish by the deadline \
         of {deadline_us} us; start workers or submit without admit"
    )]
    NoWorkerSlots {
        /// Its deadline, after submission.
        deadline_us: u64,
    },
    /// The user's queued and running tasks (or their argument bytes) would pass the
    /// per-user bound with this package.
    #[error(
        "the user has {used} {what} queued or running and this package adds {adding}, past the \
         per-user limit of {limit} (master option {option}); wait for some to finish, submit \
         less at once, or ask the operator to raise {option}"
    )]
    UserLimit {
        /// What is bounded: `"tasks"` or `"argument bytes"`.
        what: &'static str,
        /// The master option that sets the limit.
        option: &'static str,
        /// What the user has queued or running now.
        used: u64,
        /// What the package would add.
        adding: u64,
        /// The limit.
        limit: u64,
    },
    /// Admission control: the package cannot finish by its deadline.
    #[error(
        "admission refused: {tasks} tasks are estimated to finish {finish_us} us after \
         submission but the deadline is {deadline_us} us, short by {short_us} us (estimate \
         {per_task_us} us per task, p95 {p95_us} us, from {samples} runs of the function; \
         {slots} worker slots; {backlog_us} us of queued and running work ahead)",
        short_us = finish_us.saturating_sub(*deadline_us)
    )]
    Admission {
        /// Tasks in the package.
        tasks: u32,
        /// Estimated completion of its last task, after submission.
        finish_us: u64,
        /// Its deadline, after submission.
        deadline_us: u64,
        /// Estimated execution time of one task (the function's mean).
        per_task_us: u64,
        /// The function's p95 execution time (its last task's estimate).
        p95_us: u64,
        /// Results the estimate is learned from (0: no worker slot, nothing learned).
        samples: u32,
        /// Worker slots counted.
        slots: u32,
        /// Estimated work ahead of it, microseconds of one slot.
        backlog_us: u64,
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
