//! [`Task`]: one unit of work of a package, and where it is ([`TaskState`]).
//!
//! A task lives in the task table from submission until its result is accepted or it is
//! cancelled and no worker holds it any more. Where it is decides who else points at it: a
//! `Queued` task has one live entry in the ready queue; a `Running` or `Cancelled` task is in
//! exactly one worker's in-flight set.

use bytes::Bytes;

use crate::ids::{Instant, PackageId, WorkerId};

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// In the ready queue.
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
}

/// One task.
#[derive(Debug)]
pub(crate) struct Task {
    pub(crate) package: PackageId,
    /// Position in the package.
    pub(crate) index: u32,
    /// Opaque argument payload, kept until the task is freed so it can be reassigned.
    pub(crate) args: Bytes,
    pub(crate) submitted_at: Instant,
    /// Assignments so far; the current one if running.
    pub(crate) attempt: u32,
    pub(crate) state: TaskState,
}

impl Task {
    /// The worker holding this task, if any.
    pub(crate) fn holder(&self) -> Option<WorkerId> {
        match self.state {
            TaskState::Queued => None,
            TaskState::Running { worker, .. } | TaskState::Cancelled { worker, .. } => Some(worker),
        }
    }

    /// Whether `worker` holds this task as attempt `attempt`: the test every worker message
    /// about a task must pass.
    pub(crate) fn is_held_by(&self, worker: WorkerId, attempt: u32) -> bool {
        self.holder() == Some(worker) && self.attempt == attempt
    }
}
