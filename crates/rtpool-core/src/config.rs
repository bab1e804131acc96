//! [`CoreConfig`]: the core's tunables, each with its default.

/// Tunables of the core; every field has a sane default.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Largest number of tasks in one package (default 16,777,216).
    pub max_tasks_per_package: usize,
    /// A task whose worker was lost on this many attempts is not retried (default 3), unless
    /// its package sets its own `max_attempts`.
    pub max_attempts: u32,
    /// The master fails a task with a time limit this long after the limit if its worker has
    /// not reported (default 2 s): the worker kills it at the limit itself.
    pub timeout_grace_ns: u64,
    /// Longest any task may run, with or without its own limit; 0 = no limit (default 24 h).
    pub max_exec_ns: u64,
    /// How long a detached package keeps running and keeps its results (default 300 s).
    pub result_ttl_ns: u64,
    /// Emit [`Action::Delivered`](crate::Action::Delivered) for acknowledged results (the journal needs them).
    pub report_deliveries: bool,
    /// Straggler hedging: a hedged task gets a backup copy once it has run this many times its
    /// function's p95 execution time (default 1.5: a healthy run rarely goes past 1.5 x p95,
    /// so hedges are rare unless a worker is slow, and a straggler's task still finishes within
    /// about 2.5 x p95).
    pub hedge_factor: f64,
    /// Results of a function needed before its estimate is trusted for hedging and for
    /// dropping tasks that cannot make their deadline (default 5). Admission control uses
    /// any estimate it has.
    pub estimate_min_samples: u32,
    /// Calls queued for a function whose last server left wait this long for a server to
    /// return, then fail (default 30 s).
    pub service_grace_ns: u64,
    /// Most tasks one user may have queued or running at once, over all its packages; a
    /// submission that would pass it is refused (`UserLimit`). 0 = no limit (default
    /// 1,048,576: about 300 MiB of master memory for empty tasks).
    pub max_queued_tasks_per_user: u64,
    /// Most argument bytes one user's queued and running tasks may hold at once; a submission
    /// that would pass it is refused (`UserLimit`). 0 = no limit (default 1 GiB).
    pub max_queued_bytes_per_user: u64,
    /// Most result bytes sent to one client connection and not yet acknowledged; past it
    /// ([`Action::UnackedLimit`](crate::Action::UnackedLimit)) the connection is closed and its
    /// packages detach, keeping their results for the result TTL. A client with one result
    /// unacknowledged is never closed for its size. 0 = no limit (default 256 MiB).
    pub max_unacked_bytes_per_client: u64,
    /// Most results sent to one client connection and not yet acknowledged (same rule).
    /// 0 = no limit (default 1,048,576).
    pub max_unacked_results_per_client: u64,
    /// Overload: the window of deadline results the master judges overload on (default 10 s;
    /// see [`OverloadStatus`](crate::OverloadStatus)).
    pub overload_window_ns: u64,
    /// Overload: the share of the window's deadline results that missed (with tasks waiting
    /// in the queue) past which the master is overloaded (default 0.05; 0 = never).
    pub overload_miss_ratio: f64,
    /// Admission control for every package with a deadline, not only those that ask for it
    /// with `admit` (default false; see `docs/deadlines.md` for why).
    pub admit_deadlines: bool,
    /// Most resource classes (distinct requests of resources and labels) at once (default
    /// 256): a package making one more, when no unused class can be forgotten, is refused.
    pub max_resource_classes: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            max_tasks_per_package: 1 << 24,
            max_attempts: 3,
            timeout_grace_ns: 2_000_000_000,
            max_exec_ns: 86_400 * 1_000_000_000,
            result_ttl_ns: 300 * 1_000_000_000,
            report_deliveries: false,
            hedge_factor: 1.5,
            estimate_min_samples: 5,
            service_grace_ns: 30 * 1_000_000_000,
            max_queued_tasks_per_user: 1 << 20,
            max_queued_bytes_per_user: 1 << 30,
            max_unacked_bytes_per_client: 256 << 20,
            max_unacked_results_per_client: 1 << 20,
            overload_window_ns: 10 * 1_000_000_000,
            overload_miss_ratio: 0.05,
            admit_deadlines: false,
            max_resource_classes: 256,
        }
    }
}
