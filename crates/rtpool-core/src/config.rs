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
        }
    }
}
