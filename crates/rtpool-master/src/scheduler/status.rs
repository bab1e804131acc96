//! The scheduler's side of the status snapshot: feeding the [`Recorder`], building a
//! [`Status`] once a second for the HTTP listener (published through a `watch` channel, so a
//! reader only ever sees the latest and the scheduler never waits), and answering a client's
//! `CLUSTER_STATUS`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rtpool_proto::Msg;
use tokio::sync::watch;

use super::Scheduler;
use crate::journal::Journal;
use crate::status::histogram::FsyncCounts;
use crate::status::schema::JournalInfo;
use crate::status::{self, Demand, MasterFacts, Recorder, Status};

/// How often the snapshot is rebuilt and published (and the recorder sampled).
pub const STATUS_PERIOD: Duration = Duration::from_secs(1);

/// A snapshot younger than this answers `CLUSTER_STATUS` without building a new one, so a
/// client asking in a loop costs the scheduler at most one build per period.
const STATUS_REUSE: Duration = Duration::from_millis(500);

/// What the scheduler needs for status: the recorder, the facts, where to publish.
pub struct StatusState {
    pub(super) recorder: Recorder,
    pub(super) facts: MasterFacts,
    /// The HTTP listener's receiving end; `None` without a listener.
    pub(super) publisher: Option<watch::Sender<Arc<Status>>>,
    /// The last snapshot built, and when.
    pub(super) last: Option<(Instant, Arc<Status>)>,
    /// When set, the tick publishes only the snapshots a reader asked for; `None`: every one.
    pub(super) demand: Option<Arc<Demand>>,
}

impl Default for StatusState {
    fn default() -> Self {
        Self {
            recorder: Recorder::new(true),
            facts: MasterFacts::default(),
            publisher: None,
            last: None,
            demand: None,
        }
    }
}

impl Scheduler {
    /// Count metrics or not (`--no-metrics`), describe the master as `facts` say, and publish
    /// a snapshot every [`STATUS_PERIOD`] to `publisher` (the HTTP listener), if any.
    pub fn with_status(
        mut self,
        metrics: bool,
        facts: MasterFacts,
        publisher: Option<watch::Sender<Arc<Status>>>,
    ) -> Self {
        self.status = StatusState {
            recorder: Recorder::new(metrics),
            facts,
            publisher,
            last: None,
            demand: None,
        };
        // A first snapshot now, so the listener never serves an empty one (the master starts
        // it after this, and before the scheduler task runs its first tick).
        if self.status.publisher.is_some() {
            let snapshot = self.build_status();
            if let Some(tx) = &self.status.publisher {
                tx.send_replace(snapshot);
            }
        }
        self
    }

    /// Publish a snapshot only when `demand` says a reader wants one (the HTTP listener
    /// marks each request that reads it), instead of every [`STATUS_PERIOD`].
    pub fn with_status_demand(mut self, demand: Arc<Demand>) -> Self {
        self.status.demand = Some(demand);
        self
    }

    /// The periodic tick: sample the recorder, publish a fresh snapshot to the listener (if
    /// one is wanted).
    pub(super) fn on_status_tick(&mut self) {
        self.status.recorder.sample();
        let wanted = match &self.status.demand {
            Some(demand) => demand.take(),
            None => true,
        };
        if wanted && self.status.publisher.is_some() {
            let snapshot = self.build_status();
            if let Some(tx) = &self.status.publisher {
                tx.send_replace(snapshot);
            }
        }
    }

    /// The tick is needed when counting (for windows) or publishing.
    pub(super) fn needs_status_tick(&self) -> bool {
        self.status.recorder.enabled || self.status.publisher.is_some()
    }

    fn build_status(&mut self) -> Arc<Status> {
        let fsync = &self.status.facts.fsync;
        let journal = self.journal.as_ref().map(|j| journal_info(j, fsync));
        let journal = journal
            .as_ref()
            .map(|(info, counts)| (info.clone(), counts));
        let now = self.now();
        let snapshot = Arc::new(status::build(
            &self.core,
            &self.status.recorder,
            &self.user_names,
            &self.status.facts,
            journal,
            now,
        ));
        self.status.last = Some((Instant::now(), snapshot.clone()));
        snapshot
    }

    /// Answers `CLUSTER_STATUS`: the whole snapshot for the operator (user `default`, the
    /// master's own client token), the master, the workers and only its own packages and
    /// user row for anyone else.
    pub(super) fn on_cluster_status(&mut self, session: u64, req_id: u64) {
        let snapshot = match &self.status.last {
            Some((at, s)) if at.elapsed() < STATUS_REUSE => s.clone(),
            _ => self.build_status(),
        };
        let user = self
            .client_users
            .get(&session)
            .and_then(|u| self.user_names.get(u.0 as usize))
            .map_or("", String::as_str);
        let bytes = if user == crate::auth::DEFAULT_USER {
            status::to_msgpack(&snapshot)
        } else {
            status::to_msgpack(&status::for_user(&snapshot, user))
        };
        self.send(
            session,
            Msg::ClusterStatusReply {
                req_id,
                status: bytes,
            },
        );
    }
}

/// The journal's part of a snapshot.
fn journal_info(journal: &Journal, fsync: &str) -> (JournalInfo, FsyncCounts) {
    let s = journal.stats();
    let info = JournalInfo {
        bytes: s.file_bytes,
        records: s.records,
        fsyncs: s.fsyncs,
        fsync: fsync.to_owned(),
        fsync_latency: s.fsync_us.percentiles(),
        fsync_buckets: s.fsync_us.to_buckets(),
        fsync_sum_s: s.fsync_us.sum_us as f64 / 1e6,
        queued_bytes: s.queued_bytes,
        buffer_bytes: s.buffer_bytes,
        backpressure_waits: s.backpressure_waits,
        backpressure_s: s.backpressure_us as f64 / 1e6,
        compactions: s.compactions,
        compacting: s.compacting,
        last_compaction_s: s.last_compaction_us as f64 / 1e6,
        last_compaction_pause_s: s.last_compaction_pause_us as f64 / 1e6,
    };
    (info, s.fsync_us)
}

#[cfg(test)]
mod tests {
    use rtpool_core::CoreConfig;

    use super::*;

    #[test]
    fn with_a_demand_the_tick_publishes_only_the_snapshots_asked_for() {
        let (tx, mut rx) = watch::channel(Arc::new(Status::default()));
        let demand = Arc::new(Demand::default());
        let mut scheduler = Scheduler::new(CoreConfig::default(), 1)
            .with_status(true, MasterFacts::default(), Some(tx))
            .with_status_demand(demand.clone());
        // The first snapshot is published at once, asked for or not.
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        scheduler.on_status_tick();
        assert!(!rx.has_changed().unwrap(), "nobody asked: no snapshot");
        demand.want();
        scheduler.on_status_tick();
        assert!(
            rx.has_changed().unwrap(),
            "asked: the next tick publishes one"
        );
        rx.borrow_and_update();
        scheduler.on_status_tick();
        assert!(!rx.has_changed().unwrap(), "one request, one snapshot");
    }

    #[test]
    fn without_a_demand_every_tick_publishes() {
        let (tx, mut rx) = watch::channel(Arc::new(Status::default()));
        let mut scheduler = Scheduler::new(CoreConfig::default(), 1).with_status(
            true,
            MasterFacts::default(),
            Some(tx),
        );
        rx.borrow_and_update();
        scheduler.on_status_tick();
        assert!(rx.has_changed().unwrap());
    }
}
