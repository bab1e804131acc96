//! [`CoreStats`]: the core's gauges and its [`Counters`]; [`WorkerStats`]: one worker's.
//!
//! The counters are listed once, in `counters!`, and the gauges in `core_stats!`: the macros
//! make the structs and their `iter` ([`Counters::iter`], [`CoreStats::iter`]), so every consumer (status lines, the master's stats, the Python
//! `Master.stats()` dict) loops over `(name, value)` instead of naming each counter.

/// Defines [`Counters`] from one list of documented `u64` counters.
macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident, )*) => {
        /// Events counted since start, each a `u64` that only grows.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name) ),*].into_iter()
            }
        }
    };
}

counters! {
    /// Results produced since start (sent, or kept for a detached client).
    delivered,
    /// Worker results ignored because their task or attempt was no longer assigned there.
    stale_results,
    /// Results whose worker reported a time (execution, prefetch wait or batching delay)
    /// longer than the master saw from assignment to result: clamped to what it saw.
    overreported_results,
    /// Tasks put back in the queue because their worker was lost.
    requeued,
    /// Tasks failed as poison (worker lost on every attempt).
    poisoned,
    /// Tasks the master failed for running past their time limit.
    timed_out,
    /// Tasks failed because their user's quota ran out.
    quota_failed,
    /// Packages dropped because no client attached within the result TTL.
    packages_expired,
    /// Results dropped with them, never delivered.
    results_dropped,
    /// Results of tasks with a deadline that came by it.
    deadlines_met,
    /// Results of tasks with a deadline that came after it (late, `on_miss = run`).
    deadlines_missed,
    /// Tasks dropped because they could no longer make their deadline (`on_miss = drop`).
    deadline_dropped,
    /// Packages refused by admission control.
    admission_refused,
    /// Backup copies started by straggler hedging.
    hedges,
    /// Tasks whose accepted result came from a backup copy.
    hedge_wins,
    /// Copies started beyond the first (replicas, disagreement copies and hedges).
    extra_copies,
    /// Copies cancelled because their task's result was already accepted.
    copies_cancelled,
    /// Results that disagreed with an earlier copy's.
    disagreements,
    /// Tasks failed because their copies never reached a quorum.
    quorum_failed,
    /// Times the master became overloaded (deadlines missed with work waiting; see
    /// [`OverloadStatus`](crate::OverloadStatus)).
    overloads,
    /// Kept results released by their clients and sent to their workers to drop.
    kept_released,
    /// Kept results released for a worker that is not connected (nothing to drop: its process
    /// ended, or it reconnected under a new session and keeps them until its bound evicts them).
    kept_release_unknown,
    /// Transaction intermediates (calls not fetched) dropped on their workers once every
    /// dependent finished.
    kept_calls_released,
    /// Calls re-run because the intermediate result they had made was lost before every
    /// dependent read it (lineage).
    kept_calls_rerun,
}

/// Defines [`CoreStats`] from one list of documented `usize` gauges, beside the [`Counters`].
macro_rules! core_stats {
    ($( $(#[doc = $doc:literal])* $name:ident, )*) => {
        /// Gauges and counters for logs, status and tests.
        ///
        /// `tasks == queued + running + cancelling + retained` at all times.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct CoreStats {
            $( $(#[doc = $doc])* pub $name: usize, )*
            /// Events counted since start.
            pub counters: Counters,
        }

        impl CoreStats {
            /// Every gauge, then every counter, as `(name, value)`.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name as u64) ),*]
                    .into_iter()
                    .chain(self.counters.iter())
            }
        }
    };
}

core_stats! {
    /// Tasks held (queued, running, waiting for a worker's answer, or a result waiting for
    /// its acknowledgement).
    tasks,
    /// Packages held.
    packages,
    /// Tasks in the ready queue.
    queued,
    /// Tasks assigned to workers.
    running,
    /// Tasks their client cancelled while a worker held them: kept until that worker's result,
    /// return or loss, then freed without a result.
    cancelling,
    /// Results kept until the client acknowledges them.
    retained,
    /// Connected workers.
    workers,
    /// Connected clients.
    clients,
    /// Function codes held.
    functions,
    /// Named functions registered (grid RPC), as `(name, version)` entries.
    services,
}

/// Data bytes of the results the core holds until their client acknowledges them, from
/// [`Core::result_bytes_held`](crate::Core::result_bytes_held).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResultBytes {
    /// Every held result: sent to a connected client and not acknowledged yet, or kept for a
    /// detached client until it comes back or the result TTL drops its package.
    pub held: u64,
    /// Those of packages attached to a connected client (sent, waiting for its `ACK`); the
    /// rest (`held - unacked`) wait for a detached client.
    pub unacked: u64,
}

/// Gauges of one worker, from [`Core::worker_stats`](crate::Core::worker_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Tasks it runs at once, as it announced on joining.
    pub slots: u32,
    /// Tasks it may still be sent.
    pub credits: u32,
    /// Tasks it holds: assigned and neither answered nor returned (cancelled ones included).
    pub in_flight: usize,
    /// It sent `DRAIN`: it gets no more tasks.
    pub draining: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iter_lists_every_gauge_and_counter_once_by_field_name() {
        let stats = CoreStats {
            tasks: 7,
            counters: Counters {
                quorum_failed: 3,
                ..Counters::default()
            },
            ..CoreStats::default()
        };
        let all: Vec<_> = stats.iter().collect();
        assert_eq!(all.len(), 10 + 24);
        assert_eq!(all[0], ("tasks", 7));
        assert_eq!(all.last(), Some(&("kept_calls_rerun", 0)));
        let names: std::collections::HashSet<_> = all.iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), all.len(), "no name twice");
    }
}
