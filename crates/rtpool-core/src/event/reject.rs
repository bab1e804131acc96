//! [`RejectReason`]: why the core refused a submission, carried by
//! [`Action::Rejected`](super::Action::Rejected).

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
    /// No connected worker has the resources or labels the package asks for (its option
    /// `unschedulable` is `"error"`).
    #[error("{0}")]
    Unschedulable(String),
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
