//! [`Activity`]: what the scheduler logs about the work itself, as opposed to connections.
//!
//! * At debug, each package's lifecycle: created (user, tasks, deadline), its first task
//!   assigned (how long after creation, to which worker), its first result (and how long that
//!   task waited for a worker), done (ok and failed results, deadline met/missed), and freed
//!   (delivered, cancelled or expired).
//! * At info, a one-line summary every [`Activity::every`] (`--log-summary`, default 60 s),
//!   only when something changed since the last one: `workers 4 (16 slots), tasks 1,234 done
//!   (+120/min), 5 queued, 3 running, deadlines 100 met 2 missed`.
//!
//! It reads the actions the scheduler routes and the core's counters; it never changes them.
//! Per-package bookkeeping happens only while debug is enabled for this module, so the hot path
//! pays one hash lookup per result batch at most.

use crate::status::recorder::IdMap;
use std::time::{Duration, Instant};

use rtpool_core::{Action, Core, CoreStats, Event, PackageId, TaskStatus, WorkerId};
use tracing::{debug, enabled, info, Level};

/// One live package, as its lifecycle lines need it.
#[derive(Debug)]
struct PackageLog {
    created: Instant,
    /// A task of it was assigned to a worker.
    assigned: bool,
    tasks: u32,
    has_deadline: bool,
    results: u32,
    failed: u32,
    missed: u32,
}

/// What the summary compares to say "+N/min" and to stay quiet when nothing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Snapshot {
    workers: usize,
    slots: u64,
    done: u64,
    queued: usize,
    running: usize,
    met: u64,
    missed: u64,
    refused: u64,
}

/// The scheduler's activity log (see the module docs).
#[derive(Debug)]
pub(super) struct Activity {
    /// Summary period; zero: no summary.
    every: Duration,
    last_summary: Instant,
    last: Snapshot,
    /// Slots of each connected worker (the core's stats count workers, not slots).
    slots: IdMap<WorkerId, u32>,
    /// A submission seen but not yet accepted: (user, tasks, has deadline).
    submitted: Option<(PackageId, String, u32, bool)>,
    packages: IdMap<PackageId, PackageLog>,
    /// Packages in `packages` none of whose tasks was assigned yet: while 0, assignments are
    /// not looked at.
    unassigned: usize,
}

impl Activity {
    /// An activity log writing a summary every `every` (zero: never).
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            last_summary: Instant::now(),
            last: Snapshot::default(),
            slots: IdMap::default(),
            submitted: None,
            packages: IdMap::default(),
            unassigned: 0,
        }
    }

    /// Notes what an event says before the core handles it (`user` is the submitter's name).
    pub(super) fn on_event(&mut self, event: &Event, user: &str) {
        match event {
            Event::WorkerJoined { worker, slots, .. } => {
                self.slots.insert(*worker, *slots);
            }
            Event::WorkerLost { worker, .. } => {
                self.slots.remove(worker);
            }
            Event::Submit {
                package,
                opts,
                tasks,
                ..
            } if enabled!(Level::DEBUG) => {
                let deadline = opts.deadline_ms > 0;
                self.submitted = Some((*package, user.to_owned(), tasks.len() as u32, deadline));
            }
            _ => {}
        }
    }

    /// Logs what an action means for a package's lifecycle (debug only); `core` names the
    /// package of an assigned task.
    pub(super) fn on_action(&mut self, action: &Action, core: &Core) {
        match action {
            Action::Assign { worker, tasks } if self.unassigned > 0 => {
                for t in tasks {
                    let Some(id) = core.package_of(t.task) else {
                        continue;
                    };
                    let Some(p) = self.packages.get_mut(&id).filter(|p| !p.assigned) else {
                        continue;
                    };
                    p.assigned = true;
                    self.unassigned -= 1;
                    debug!(
                        "package {}: first task assigned after {} ms (to the worker of session {})",
                        id.0,
                        p.created.elapsed().as_millis(),
                        worker.0
                    );
                }
            }
            Action::Accepted { package, .. } => {
                if let Some((id, user, tasks, has_deadline)) = self.submitted.take() {
                    if id == *package {
                        debug!(
                            "package {}: created by user {user:?}: {}{}",
                            id.0,
                            plural(u64::from(tasks), "task"),
                            if has_deadline {
                                ", with a deadline"
                            } else {
                                ""
                            }
                        );
                        self.unassigned += 1;
                        self.packages.insert(
                            id,
                            PackageLog {
                                created: Instant::now(),
                                assigned: false,
                                tasks,
                                has_deadline,
                                results: 0,
                                failed: 0,
                                missed: 0,
                            },
                        );
                    }
                }
            }
            Action::Rejected { reason, .. } => {
                if let Some((id, user, tasks, _)) = self.submitted.take() {
                    debug!(
                        "package {}: refused ({} of user {user:?}): {reason}",
                        id.0,
                        plural(u64::from(tasks), "task")
                    );
                }
            }
            Action::SendResults {
                package, results, ..
            } => {
                let Some(p) = self.packages.get_mut(package) else {
                    return;
                };
                if p.results == 0 {
                    let queue_ms = results.first().map_or(0, |r| r.queue_us) / 1000;
                    debug!(
                        "package {}: first result after {} ms (its task waited {queue_ms} ms \
                         for a worker)",
                        package.0,
                        p.created.elapsed().as_millis()
                    );
                }
                p.results += results.len() as u32;
                p.failed += results
                    .iter()
                    .filter(|r| r.status != TaskStatus::Ok)
                    .count() as u32;
                p.missed += results
                    .iter()
                    .filter(|r| r.late_us > 0 || r.status == TaskStatus::Missed)
                    .count() as u32;
                if p.results >= p.tasks {
                    let deadlines = if p.has_deadline {
                        format!(
                            ", deadline met {} missed {}",
                            p.results - p.missed,
                            p.missed
                        )
                    } else {
                        String::new()
                    };
                    debug!(
                        "package {}: done in {} ms: {} ok, {} failed{deadlines}",
                        package.0,
                        p.created.elapsed().as_millis(),
                        p.results - p.failed,
                        p.failed
                    );
                }
            }
            Action::PackageFreed {
                package, expired, ..
            } => {
                if let Some(p) = self.packages.remove(package) {
                    if !p.assigned {
                        self.unassigned -= 1;
                    }
                    let how = if *expired {
                        "expired: no client attached within the result TTL"
                    } else if p.results < p.tasks {
                        "cancelled"
                    } else {
                        "every result delivered"
                    };
                    debug!("package {}: freed ({how})", package.0);
                }
            }
            _ => {}
        }
    }

    /// Writes the summary line if it is due and something changed since the last one.
    pub(super) fn maybe_summary(&mut self, stats: &CoreStats) {
        if self.every.is_zero() || self.last_summary.elapsed() < self.every {
            return;
        }
        let now = Snapshot {
            workers: stats.workers,
            slots: self.slots.values().map(|&s| u64::from(s)).sum(),
            done: stats.counters.delivered,
            queued: stats.queued,
            running: stats.running,
            met: stats.counters.deadlines_met,
            missed: stats.counters.deadlines_missed + stats.counters.deadline_dropped,
            refused: stats.counters.admission_refused,
        };
        let minutes = self.last_summary.elapsed().as_secs_f64() / 60.0;
        self.last_summary = Instant::now();
        if now == self.last {
            return;
        }
        let rate = (now.done - self.last.done) as f64 / minutes.max(1e-9);
        info!("{}", summary_line(&now, rate));
        self.last = now;
    }
}

/// `workers 4 (16 slots), tasks 1,234 done (+120/min), 5 queued, 3 running, deadlines 100 met
/// 2 missed, 1 package refused by admission`.
fn summary_line(s: &Snapshot, per_min: f64) -> String {
    let mut line = format!(
        "workers {} ({}), tasks {} done (+{}/min), {} queued, {} running",
        s.workers,
        plural(s.slots, "slot"),
        thousands(s.done),
        thousands(per_min.round() as u64),
        thousands(s.queued as u64),
        thousands(s.running as u64)
    );
    if s.met + s.missed > 0 {
        line += &format!(
            ", deadlines {} met {} missed",
            thousands(s.met),
            thousands(s.missed)
        );
    }
    if s.refused > 0 {
        let packages = if s.refused == 1 {
            "package"
        } else {
            "packages"
        };
        line += &format!(", {} {packages} refused by admission", thousands(s.refused));
    }
    line
}

/// `1 task`, `2 tasks`, `1,234 tasks`.
fn plural(n: u64, word: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{} {word}{s}", thousands(n))
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    // The first group has 1-3 digits, every other group 3.
    let lead = match digits.len() % 3 {
        0 => 3.min(digits.len()),
        r => r,
    };
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    out.push_str(&digits[..lead]);
    for group in digits.as_bytes()[lead..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(group).expect("ASCII digits"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1234), "1,234");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(plural(1, "slot"), "1 slot");
        assert_eq!(plural(1234, "task"), "1,234 tasks");
    }

    #[test]
    fn the_summary_names_what_happened() {
        let s = Snapshot {
            workers: 4,
            slots: 16,
            done: 1234,
            queued: 5,
            running: 3,
            met: 100,
            missed: 2,
            refused: 1,
        };
        assert_eq!(
            summary_line(&s, 120.4),
            "workers 4 (16 slots), tasks 1,234 done (+120/min), 5 queued, 3 running, \
             deadlines 100 met 2 missed, 1 package refused by admission"
        );
        let quiet = Snapshot {
            met: 0,
            missed: 0,
            refused: 0,
            ..s
        };
        assert!(!summary_line(&quiet, 0.0).contains("deadlines"));
    }

    #[test]
    fn nothing_is_logged_twice_when_nothing_changed() {
        let mut a = Activity::new(Duration::from_nanos(1));
        let stats = CoreStats::default();
        a.maybe_summary(&stats);
        assert_eq!(a.last, Snapshot::default(), "an idle master stays quiet");
        let busy = CoreStats {
            workers: 1,
            ..CoreStats::default()
        };
        a.maybe_summary(&busy);
        assert_eq!(a.last.workers, 1);
    }
}
