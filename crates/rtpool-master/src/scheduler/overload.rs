//! Overload, said out loud: the core judges whether deadlines are being missed because the
//! workers cannot keep up ([`rtpool_core::OverloadStatus`]); here the master tells the log
//! (a warning when it starts, repeated at most once per [`DEFAULT_WINDOW`] while it lasts, a
//! line when it ends) and each client whose package with a deadline it accepts meanwhile (the
//! `notice` of `ACCEPTED`). The gauge and the status fields come from the status snapshot.

use std::time::Instant;

use rtpool_core::{OverloadStatus, PackageId};
use tracing::{info, warn};

use super::Scheduler;
use crate::ratelimit::{LogLimiter, DEFAULT_WINDOW};

/// What the log has been told of overload.
#[derive(Debug)]
pub(super) struct OverloadLog {
    limiter: LogLimiter<()>,
    /// The last check found the master overloaded.
    was: bool,
}

impl Default for OverloadLog {
    fn default() -> Self {
        Self {
            limiter: LogLimiter::new(DEFAULT_WINDOW),
            was: false,
        }
    }
}

/// `37 % of the 120 results with a deadline in the last 10 s missed it while 500 tasks waited
/// for a worker`.
fn describe(s: &OverloadStatus, window_s: f64) -> String {
    format!(
        "{:.0} % of the {} results with a deadline in the last {window_s:.0} s missed it while \
         {} tasks waited for a worker",
        s.miss_ratio * 100.0,
        s.met + s.missed,
        s.queued
    )
}

impl Scheduler {
    fn overload_window_s(&self) -> f64 {
        self.core_config.overload_window_ns as f64 / 1e9
    }

    /// The notice for the `ACCEPTED` of `package`: a warning if the master is overloaded and
    /// the package has a deadline it may well miss, else `None`. O(1).
    pub(super) fn overload_notice(&self, package: PackageId) -> Option<String> {
        let s = self.core.overload(self.now());
        if !s.overloaded || !self.core.has_deadline(package) {
            return None;
        }
        Some(format!(
            "the master is overloaded: {}; this package may miss its deadline too. Add \
             workers or offer less work, or submit with admit=True (refused at once when it \
             cannot finish in time) or on_miss=\"drop\"",
            describe(&s, self.overload_window_s())
        ))
    }

    /// Tells the log when overload starts (then at most once per window while it lasts) and
    /// when it ends. Called on the flush tick (once a second).
    pub(super) fn log_overload(&mut self) {
        let s = self.core.overload(self.now());
        let window_s = self.overload_window_s();
        if s.overloaded {
            if let Some(held) = self.overload_log.limiter.check((), Instant::now()) {
                let more = if held > 0 {
                    format!(" ({held} checks since the last line)")
                } else {
                    String::new()
                };
                warn!(
                    "overloaded: {}; deadlines are missed because more work is offered than \
                     the workers can do; add workers or offer less{more}",
                    describe(&s, window_s)
                );
            }
        } else if self.overload_log.was {
            info!(
                "no longer overloaded: {} % of the {} results with a deadline in the last \
                 {window_s:.0} s missed it",
                (s.miss_ratio * 100.0).round(),
                s.met + s.missed
            );
        }
        self.overload_log.was = s.overloaded;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_names_the_share_the_count_and_the_backlog() {
        let s = OverloadStatus {
            overloaded: true,
            met: 80,
            missed: 40,
            miss_ratio: 1.0 / 3.0,
            queued: 500,
            since: None,
        };
        assert_eq!(
            describe(&s, 10.0),
            "33 % of the 120 results with a deadline in the last 10 s missed it while 500 \
             tasks waited for a worker"
        );
    }
}
