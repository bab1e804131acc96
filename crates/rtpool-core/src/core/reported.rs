//! What a worker may report: every time in a result (execution, prefetch wait, batching
//! delay) is bounded by the assignment-to-result time the master saw, so a worker's word
//! never charges a user, or teaches an estimate, more than the master observed. The master's
//! clock comes in only as the events' `now`.

use super::Core;
use crate::event::{Action, WorkerOutcome};
use crate::ids::{Instant, WorkerId};

/// Slack on top of the master-observed time a reported time may have, microseconds: one
/// millisecond for clocks that tick coarser than ours (the worker's timer, a rounding to
/// milliseconds) without letting a report grow a short task's charge by much.
pub const REPORT_MARGIN_US: u64 = 1_000;

impl Core {
    /// Clamps the times a worker reported for a task it holds to what the master saw: each
    /// of them (execution, prefetch wait, batching delay) happened between the assignment and
    /// the result's arrival, so none may exceed that plus [`REPORT_MARGIN_US`] (the worker's
    /// clock may tick coarser than ours). Everything downstream (the user's charge, estimates,
    /// the results' figures, the journal) sees the clamped times. The first clamp of a
    /// worker connection becomes an [`Action::Overreported`]; every one is counted.
    pub(super) fn bound_reported(
        &mut self,
        worker: WorkerId,
        r: &mut WorkerOutcome,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Some(task) = self
            .tasks
            .get(r.task.0)
            .filter(|t| t.is_held_by(worker, r.attempt))
        else {
            return; // stale: charged nothing, learned from nothing
        };
        let allowed_us = now
            .micros_since(task.assigned_at)
            .saturating_add(REPORT_MARGIN_US);
        let reported_us = r.exec_us.max(r.wait_us).max(r.flush_us);
        if reported_us <= allowed_us {
            return;
        }
        r.exec_us = r.exec_us.min(allowed_us);
        r.wait_us = r.wait_us.min(allowed_us);
        r.flush_us = r.flush_us.min(allowed_us);
        self.counters.overreported_results += 1;
        if let Some(w) = self.workers.get_mut(&worker).filter(|w| !w.overreported) {
            w.overreported = true;
            out.push(Action::Overreported {
                worker,
                task: r.task,
                reported_us,
                allowed_us,
            });
        }
    }
}
