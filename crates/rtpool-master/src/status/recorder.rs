//! [`Recorder`]: what the scheduler task counts for the status snapshot and the metrics,
//! beside the core's own counters. It is fed from the events and actions the scheduler
//! handles anyway (results, refusals, acceptances), in plain integers: a few instructions per
//! task, nothing rendered here. `sample` (once a second) keeps the history the windowed rates
//! and percentiles are computed from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use rtpool_core::{Action, Event, PackageId, TaskOutcome, TaskStatus, UserId, WorkerId};

use super::histogram::{Buckets, Histogram, LATENCY_BOUNDS_US};

/// Samples kept for windowed rates and percentiles: ten seconds at one a second.
const WINDOW: usize = 10;

/// One connected worker as the recorder knows it.
#[derive(Debug, Clone)]
pub struct WorkerRecord {
    /// Its `HELLO` name.
    pub name: String,
    /// The address it connected from.
    pub host: String,
    /// Results it returned.
    pub done: u64,
    /// Their execution time, microseconds.
    pub exec_us: u64,
    /// Last `PULL`, `RESULT` or `RETURN`.
    pub last_seen: Instant,
}

/// Per-user counts.
#[derive(Debug, Clone, Default)]
pub struct UserRecord {
    /// Results since start.
    pub done: u64,
    /// Their execution time, microseconds.
    pub exec_us: u64,
    /// Quota and usage as last read from the user store: `(quota_us, used_us)`.
    pub stored: Option<(Option<u64>, u64)>,
}

/// A package's user and priority, kept for labelling its results, and its failed count.
#[derive(Debug, Clone, Copy)]
struct PackageRecord {
    user: UserId,
    priority: i32,
    failed: u32,
}

/// One second's sample, for windows.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken.
    pub at: Instant,
    /// Results since start then.
    pub done: u64,
    /// The latency histograms then.
    pub submit_to_assign: Histogram,
    /// The latency histograms then.
    pub assign_to_result: Histogram,
    /// Each worker's results then.
    pub worker_done: HashMap<u64, u64>,
}

/// Everything the scheduler counts for status and metrics.
#[derive(Debug)]
pub struct Recorder {
    /// Counting is on (`--no-metrics` turns it off; worker names are kept regardless).
    pub enabled: bool,
    /// When the master started.
    pub started: Instant,
    /// Receipt to assignment, microseconds (fine buckets, for percentiles).
    pub submit_to_assign: Histogram,
    /// Assignment to result, microseconds.
    pub assign_to_result: Histogram,
    /// The same two with Prometheus bounds.
    pub submit_to_assign_buckets: Buckets,
    /// See `submit_to_assign_buckets`.
    pub assign_to_result_buckets: Buckets,
    /// Lateness of late results, microseconds.
    pub lateness: Buckets,
    /// Connected workers by session.
    pub workers: HashMap<u64, WorkerRecord>,
    /// Users by core id.
    pub users: HashMap<UserId, UserRecord>,
    /// Results by `(user, priority)`.
    pub done_by_class: HashMap<(UserId, i32), u64>,
    /// Results since start.
    pub done: u64,
    /// Results whose status was not ok.
    pub failed: u64,
    /// Refused submissions by error code.
    pub refusals: BTreeMap<&'static str, u64>,
    packages: HashMap<PackageId, PackageRecord>,
    /// Submissions waiting for their `Accepted`: `(package, user, priority)`.
    pending: Option<(PackageId, UserId, i32)>,
    /// The last [`WINDOW`] + 1 samples, oldest first.
    pub samples: VecDeque<Sample>,
}

impl Recorder {
    /// A recorder; `enabled: false` counts nothing but worker names.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            started: Instant::now(),
            submit_to_assign: Histogram::default(),
            assign_to_result: Histogram::default(),
            submit_to_assign_buckets: Buckets::new(LATENCY_BOUNDS_US),
            assign_to_result_buckets: Buckets::new(LATENCY_BOUNDS_US),
            lateness: Buckets::new(LATENCY_BOUNDS_US),
            workers: HashMap::new(),
            users: HashMap::new(),
            done_by_class: HashMap::new(),
            done: 0,
            failed: 0,
            refusals: BTreeMap::new(),
            packages: HashMap::new(),
            pending: None,
            samples: VecDeque::with_capacity(WINDOW + 1),
        }
    }

    /// A worker authenticated.
    pub fn worker_joined(&mut self, session: u64, name: String, host: String) {
        self.workers.insert(
            session,
            WorkerRecord {
                name,
                host,
                done: 0,
                exec_us: 0,
                last_seen: Instant::now(),
            },
        );
    }

    /// A worker's connection closed.
    pub fn worker_left(&mut self, session: u64) {
        self.workers.remove(&session);
    }

    /// Before the core handles `event`: a worker's results and signs of life, and the user and
    /// priority of a submission (kept if the core accepts it).
    pub fn on_event(&mut self, event: &Event, user: impl FnOnce() -> Option<UserId>) {
        if !self.enabled {
            return;
        }
        match event {
            Event::Results { worker, results } => {
                if let Some(w) = self.workers.get_mut(&worker.0) {
                    w.done += results.len() as u64;
                    w.exec_us += results.iter().map(|r| r.exec_us).sum::<u64>();
                    w.last_seen = Instant::now();
                }
            }
            Event::Credit { worker, .. } | Event::Returned { worker, .. } => self.seen(*worker),
            // A package the journal replayed: no `Accepted` comes for it.
            Event::Restore(p) => {
                let record = PackageRecord {
                    user: p.user,
                    priority: p.opts.priority,
                    failed: 0,
                };
                self.packages.insert(p.package, record);
            }
            Event::Submit { package, opts, .. } | Event::SubmitCalls { package, opts, .. } => {
                if let Some(user) = user() {
                    self.pending = Some((*package, user, opts.priority));
                }
            }
            _ => {}
        }
    }

    fn seen(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker.0) {
            w.last_seen = Instant::now();
        }
    }

    /// One of the core's actions, before it is routed.
    pub fn on_action(&mut self, action: &Action) {
        if !self.enabled {
            return;
        }
        match action {
            Action::Accepted { package, .. } => {
                if let Some((p, user, priority)) = self.pending.take() {
                    if p == *package {
                        let record = PackageRecord {
                            user,
                            priority,
                            failed: 0,
                        };
                        self.packages.insert(p, record);
                    }
                }
            }
            Action::Rejected { reason, .. } => {
                *self.refusals.entry(refusal_code(reason)).or_default() += 1;
            }
            Action::SendResults {
                package, results, ..
            } => self.results(*package, results),
            Action::PackageFreed { package, .. } => {
                self.packages.remove(package);
            }
            _ => {}
        }
    }

    fn results(&mut self, package: PackageId, results: &[TaskOutcome]) {
        let record = self.packages.get_mut(&package);
        let (user, priority) = record
            .as_ref()
            .map_or((None, 0), |r| (Some(r.user), r.priority));
        let mut failed = 0;
        let mut exec_us = 0;
        for r in results {
            // Results the master made itself (lost, quota, dropped for a deadline) never
            // reached a worker: no latency to count.
            if r.worker_us > 0 || r.exec_us > 0 {
                self.submit_to_assign.record(r.queue_us);
                self.submit_to_assign_buckets.record(r.queue_us);
                self.assign_to_result.record(r.worker_us);
                self.assign_to_result_buckets.record(r.worker_us);
            }
            if r.late_us > 0 {
                self.lateness.record(r.late_us);
            }
            if r.status != TaskStatus::Ok {
                failed += 1;
            }
            exec_us += r.exec_us;
        }
        let n = results.len() as u64;
        self.done += n;
        self.failed += u64::from(failed);
        if let Some(record) = record {
            record.failed += failed;
        }
        if let Some(user) = user {
            let u = self.users.entry(user).or_default();
            u.done += n;
            u.exec_us += exec_us;
            *self.done_by_class.entry((user, priority)).or_default() += n;
        }
    }

    /// Results of `package` whose status was not ok, as far as counted.
    pub fn failed_of(&self, package: PackageId) -> u32 {
        self.packages.get(&package).map_or(0, |r| r.failed)
    }

    /// A user's quota and usage as the store reported them.
    pub fn set_stored(&mut self, user: UserId, quota_us: Option<u64>, used_us: u64) {
        self.users.entry(user).or_default().stored = Some((quota_us, used_us));
    }

    /// Takes this second's sample (keeps the last [`WINDOW`] + 1).
    pub fn sample(&mut self) {
        if !self.enabled {
            return;
        }
        if self.samples.len() > WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at: Instant::now(),
            done: self.done,
            submit_to_assign: self.submit_to_assign.clone(),
            assign_to_result: self.assign_to_result.clone(),
            worker_done: self.workers.iter().map(|(id, w)| (*id, w.done)).collect(),
        });
    }

    /// The oldest sample of the window, if any.
    pub fn window_start(&self) -> Option<&Sample> {
        self.samples.front()
    }
}

/// The `ERROR` code a refused submission is answered with (as `scheduler::route` sends it).
pub fn refusal_code(reason: &rtpool_core::RejectReason) -> &'static str {
    use rtpool_core::RejectReason as R;
    match reason {
        R::QuotaExhausted { .. } => "quota",
        R::Admission { .. } | R::NoWorkerSlots { .. } => "admission",
        R::UnknownFunction { .. } => "unknown_function",
        R::Empty | R::TooManyTasks { .. } | R::InvalidOptions(_) | R::InvalidCall { .. } => {
            "rejected"
        }
    }
}
