//! A task's end as the core sees it: its [`TaskStatus`], a worker's report of it
//! ([`WorkerOutcome`], in an event) and the outcome the core records and sends
//! ([`TaskOutcome`], in actions and in a restored package).

use bytes::Bytes;

use crate::ids::TaskId;

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

/// One task's result inside an [`Action::SendResults`](super::Action::SendResults).
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
