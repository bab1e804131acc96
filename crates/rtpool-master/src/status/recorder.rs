//! [`Recorder`]: what the scheduler task counts for the status snapshot and the metrics,
//! beside the core's own counters. It is fed from the events and actions the scheduler
//! handles anyway (results, refusals, acceptances), in plain integers: a few instructions per
//! task, nothing rendered here. `sample` (once a second) keeps the history the windowed rates
//! and percentiles are computed from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::Instant;

use rtpool_core::{Action, Event, IdHasher, PackageId, TaskOutcome, TaskStatus, UserId};

use super::histogram::{Buckets, Histogram, LATENCY_BOUNDS_US};

/// Samples kept for windowed rates and percentiles: ten seconds at one a second.
const WINDOW: usize = 10;

/// A map keyed by ids the master hands out (sessions, packages, users), hashed with
/// [`IdHasher`] (one multiplication instead of SipHash: the scheduler pays it per task).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// One connected worker as the recorder knows it.
#[derive(Debug, Clone)]
pub struct WorkerRecord {
    /// Its `HELLO` name.
    pub name: String,
    /// Its `HELLO` identity (empty: none sent).
    pub identity: String,
    /// The address it connected from.
    pub host: String,
    /// Results it returned.
    pub done: u64,
    /// Their execution time, microseconds.
    pub exec_us: u64,
    /// Last `PULL`, `RESULT` or `RETURN`, on the scheduler's clock.
    pub last_seen: rtpool_core::Instant,
}

/// Results of one user at one priority.
#[derive(Debug, Clone)]
pub struct ClassRecord {
    /// The user.
    pub user: UserId,
    /// The priority.
    pub priority: i32,
    /// Results since start.
    pub done: u64,
    /// Their execution time, microseconds.
    pub exec_us: u64,
}

/// A package's class (an index into [`Recorder::classes`]), kept for labelling its results,
/// and its failed count.
#[derive(Debug, Clone, Copy)]
struct PackageRecord {
    class: usize,
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
    pub worker_done: IdMap<u64, u64>,
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
    pub workers: IdMap<u64, WorkerRecord>,
    /// Results by user and priority, in order of first appearance.
    pub classes: Vec<ClassRecord>,
    class_index: IdMap<(UserId, i32), usize>,
    /// Quota and usage per user as last read from the user store: `(quota_us, used_us)`.
    pub stored: IdMap<UserId, (Option<u64>, u64)>,
    /// Results since start.
    pub done: u64,
    /// Results whose status was not ok.
    pub failed: u64,
    /// Refused submissions by error code.
    pub refusals: BTreeMap<&'static str, u64>,
    /// Frames from workers the scheduler handled: `PULL`, `RESULT`, `RETURN` (issue 13: one
    /// connection per worker host sends fewer of them per task than one per process).
    pub worker_frames_in: u64,
    /// Frames the scheduler queued for workers: `ASSIGN`, `ASSIGN_CALLS`, `ABORT` (each a
    /// `sendto` unless the connection's writer finds several queued).
    pub worker_frames_out: u64,
    packages: IdMap<PackageId, PackageRecord>,
    /// The submission being handled: `(package, class)`, kept if the core accepts it.
    pending: Option<(PackageId, usize)>,
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
            workers: IdMap::default(),
            classes: Vec::new(),
            class_index: IdMap::default(),
            stored: IdMap::default(),
            done: 0,
            failed: 0,
            refusals: BTreeMap::new(),
            worker_frames_in: 0,
            worker_frames_out: 0,
            packages: IdMap::default(),
            pending: None,
            samples: VecDeque::with_capacity(WINDOW + 1),
        }
    }

    /// A worker authenticated (at `now` on the scheduler's clock).
    pub fn worker_joined(
        &mut self,
        session: u64,
        name: String,
        identity: String,
        host: String,
        now: rtpool_core::Instant,
    ) {
        self.workers.insert(
            session,
            WorkerRecord {
                name,
                identity,
                host,
                done: 0,
                exec_us: 0,
                last_seen: now,
            },
        );
    }

    /// A worker's connection closed.
    pub fn worker_left(&mut self, session: u64) {
        self.workers.remove(&session);
    }

    /// Before the core handles `event` (at `now` on the scheduler's clock): a worker's results
    /// and signs of life, and the class of a submission (kept if the core accepts it).
    pub fn on_event(
        &mut self,
        event: &Event,
        now: rtpool_core::Instant,
        user: impl FnOnce() -> Option<UserId>,
    ) {
        if !self.enabled {
            return;
        }
        match event {
            Event::Results { worker, results } => {
                self.worker_frames_in += 1;
                if let Some(w) = self.workers.get_mut(&worker.0) {
                    w.done += results.len() as u64;
                    w.exec_us += results.iter().map(|r| r.exec_us).sum::<u64>();
                    w.last_seen = now;
                }
            }
            Event::Credit { worker, .. } | Event::Returned { worker, .. } => {
                self.worker_frames_in += 1;
                if let Some(w) = self.workers.get_mut(&worker.0) {
                    w.last_seen = now;
                }
            }
            Event::Submit { package, opts, .. } | Event::SubmitCalls { package, opts, .. } => {
                if let Some(user) = user() {
                    self.pending = Some((*package, self.class(user, opts.priority)));
                }
            }
            // A package the journal replayed: no `Accepted` comes for it.
            Event::Restore(p) => {
                let class = self.class(p.user, p.opts.priority);
                self.packages
                    .insert(p.package, PackageRecord { class, failed: 0 });
            }
            _ => {}
        }
    }

    /// The index of a class in [`Recorder::classes`], added if new.
    fn class(&mut self, user: UserId, priority: i32) -> usize {
        let classes = &mut self.classes;
        *self.class_index.entry((user, priority)).or_insert_with(|| {
            classes.push(ClassRecord {
                user,
                priority,
                done: 0,
                exec_us: 0,
            });
            classes.len() - 1
        })
    }

    /// One of the core's actions, before it is routed.
    pub fn on_action(&mut self, action: &Action) {
        if !self.enabled {
            return;
        }
        match action {
            Action::Accepted { package, .. } => {
                if let Some((p, class)) = self.pending.take() {
                    if p == *package {
                        self.packages.insert(p, PackageRecord { class, failed: 0 });
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
            Action::Assign { .. } | Action::AssignCalls { .. } | Action::Abort { .. } => {
                self.worker_frames_out += 1;
            }
            _ => {}
        }
    }

    fn results(&mut self, package: PackageId, results: &[TaskOutcome]) {
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
        if let Some(record) = self.packages.get_mut(&package) {
            record.failed += failed;
            let class = &mut self.classes[record.class];
            class.done += n;
            class.exec_us += exec_us;
        }
    }

    /// Results of `package` whose status was not ok, as far as counted.
    pub fn failed_of(&self, package: PackageId) -> u32 {
        self.packages.get(&package).map_or(0, |r| r.failed)
    }

    /// A user's quota and usage as the store reported them.
    pub fn set_stored(&mut self, user: UserId, quota_us: Option<u64>, used_us: u64) {
        self.stored.insert(user, (quota_us, used_us));
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
        R::UserLimit { .. } => "queue_limit",
        R::UnknownDependency { .. } => "unknown_dependency",
        R::Unschedulable(_) => "unschedulable",
        R::Empty | R::TooManyTasks { .. } | R::InvalidOptions(_) | R::InvalidCall { .. } => {
            "rejected"
        }
    }
}
