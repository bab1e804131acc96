//! [`Task`]: one unit of work of a package, and where it is ([`TaskState`]).
//!
//! A task lives in the task table from submission until its result is acknowledged by the
//! client (or it is cancelled) and no worker holds it any more. Where it is decides who else
//! points at it: a `Queued` task has one live entry in the ready queue; a `Running` or
//! `Cancelled` task is in exactly one worker's in-flight set; a `Done` task has its result in
//! its package's unacknowledged list, and is in a worker's in-flight set too while that worker
//! still runs it (the master answered it first: a time limit or a quota).

use bytes::Bytes;

use crate::event::TaskOutcome;
use crate::ids::{Instant, WorkerId};

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// A call whose inputs (results of earlier calls of its package) do not all exist yet: in
    /// no queue; counted as queued by its package.
    Waiting,
    /// In the ready queue (a call: in its service's queue).
    Queued,
    /// Assigned to `worker` (attempt [`Task::attempt`]) at `assigned_at`.
    Running {
        worker: WorkerId,
        assigned_at: Instant,
        /// Core-wide assignment order, so a lost worker's tasks are requeued in the order they
        /// were assigned whatever order its in-flight set iterates in.
        seq: u64,
    },
    /// Cancelled by its client while `worker` held it: freed silently when the worker's result,
    /// return or loss comes in. Its package may already be gone.
    Cancelled { worker: WorkerId, seq: u64 },
    /// Its result exists ([`Task::outcome`]) and waits for the client's acknowledgement.
    /// `holder`: the worker that still runs it after the master answered it (aborted), with
    /// its assignment order. `acked`: the client acknowledged it; the task is freed as soon as
    /// no worker holds it.
    Done {
        holder: Option<(WorkerId, u64)>,
        acked: bool,
    },
}

/// One task.
#[derive(Debug)]
pub(crate) struct Task {
    /// Slab key of its package.
    pub(crate) package: u64,
    /// Position in the package.
    pub(crate) index: u32,
    /// Opaque argument payload, kept until the task is done so it can be reassigned.
    pub(crate) args: Bytes,
    pub(crate) submitted_at: Instant,
    /// When its current (or last) attempt was assigned: what bounds the times its worker may
    /// report for that attempt, whatever became of the task since (cancelled, answered).
    pub(crate) assigned_at: Instant,
    /// Assignments so far; the current one if running.
    pub(crate) attempt: u32,
    pub(crate) state: TaskState,
    /// When the master fails the running attempt if no result came (time limit + grace).
    pub(crate) time_limit_at: Option<Instant>,
    /// `(worker, attempt, what happened)` of each loss of a worker, or of the process running
    /// this task, while it ran it (the poison-task record); `None` almost always (boxed: 8
    /// bytes per task instead of an empty `Vec`'s 24). What happened is the worker's report
    /// (`worker process killed by signal 9 (SIGKILL) ...`), if one came. Read it through
    /// [`Task::losses`], add to it through [`Task::losses_mut`].
    #[allow(clippy::box_collection)] // the point: 8 bytes in every task, not a Vec's 24
    pub(crate) lost_on: Option<Box<Vec<Loss>>>,
    /// The result, once `Done`.
    pub(crate) outcome: Option<Box<TaskOutcome>>,
    /// Slab key of its copy group, if the task runs as several copies (replicas, a hedge).
    pub(crate) group: Option<u64>,
    /// An extra copy: not the task its package lists, not in the package's counters.
    pub(crate) shadow: bool,
    /// When its straggler check fires (hedged packages), if armed.
    pub(crate) hedge_at: Option<Instant>,
    /// Its position in its ready queue (the slab key of its list node), while `Queued`.
    pub(crate) queue_pos: u64,
    /// The worker whose result decided it (`WorkerId.0`; 0: none yet, or decided by the
    /// master). A kept result stays there, so a package that names this task in `after`
    /// once it is done is still placed near it (held.rs).
    pub(crate) made_on: u64,
    /// A call of a named function (grid RPC), not shipped code.
    pub(crate) call: Option<Box<Call>>,
}

/// What a call adds to a task: its function, and its place in its package's dependency graph.
#[derive(Debug)]
pub(crate) struct Call {
    /// Slab key of its service.
    pub(crate) service: u64,
    /// Indices of the calls whose results are its inputs, in input order.
    pub(crate) deps: Vec<u32>,
    /// The inputs received so far, by position in `deps` (empty until received).
    pub(crate) inputs: Vec<bytes::Bytes>,
    /// Inputs still missing.
    pub(crate) waiting: u32,
    /// Indices of the calls that take its result as an input (each once).
    pub(crate) dependents: Vec<u32>,
    /// Its result's data goes to the client (asked for, or no call depends on it).
    pub(crate) fetch: bool,
    /// By position in `deps`: the record of the kept value it was given there (`lineage.rs`),
    /// else `lineage::NO_SOURCE`. Empty until an input is a kept value.
    pub(crate) sources: Vec<u64>,
    /// This task re-makes the kept value of that record (a copy of its call that no package
    /// lists), else `lineage::NO_SOURCE`.
    pub(crate) remakes: u64,
}

/// One entry of a task's poison-task record: `(worker, attempt, what happened, what the task
/// printed before)`; the last is the opaque task-output head of the worker's report
/// (`docs/protocol.md`, "Task output"), if it had one.
pub(crate) type Loss = (WorkerId, u32, Option<String>, Option<bytes::Bytes>);

impl Task {
    /// The poison-task record (empty almost always).
    pub(crate) fn losses(&self) -> &[Loss] {
        self.lost_on.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The poison-task record, to add to (allocated on the first loss).
    pub(crate) fn losses_mut(&mut self) -> &mut Vec<Loss> {
        self.lost_on.get_or_insert_with(Box::default)
    }

    /// A queued task.
    pub(crate) fn new(package: u64, index: u32, args: Bytes, now: Instant) -> Self {
        Self {
            package,
            index,
            args,
            submitted_at: now,
            assigned_at: now,
            attempt: 0,
            state: TaskState::Queued,
            time_limit_at: None,
            lost_on: None,
            outcome: None,
            group: None,
            shadow: false,
            hedge_at: None,
            queue_pos: 0,
            made_on: 0,
            call: None,
        }
    }

    /// The worker holding this task, if any.
    pub(crate) fn holder(&self) -> Option<WorkerId> {
        match self.state {
            TaskState::Queued | TaskState::Waiting => None,
            TaskState::Running { worker, .. } | TaskState::Cancelled { worker, .. } => Some(worker),
            TaskState::Done { holder, .. } => holder.map(|(w, _)| w),
        }
    }

    /// Whether `worker` holds this task as attempt `attempt`: the test every worker message
    /// about a task must pass.
    pub(crate) fn is_held_by(&self, worker: WorkerId, attempt: u32) -> bool {
        self.holder() == Some(worker) && self.attempt == attempt
    }
}
