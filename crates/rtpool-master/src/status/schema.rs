//! The status snapshot's schema: [`Status`] and its parts, one serde struct tree that
//! `GET /api/status` serves as JSON, `GET /api/events` streams, `CLUSTER_STATUS` answers as a
//! msgpack map and `/metrics` renders. `docs/operations.md` documents every field; a change
//! here must stay backward compatible (add fields, never rename or remove one).

use serde::Serialize;

/// One snapshot of a running master.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    /// The master itself.
    pub master: MasterInfo,
    /// The scheduler's gauges and counters by name (`queued`, `running`, `deadlines_met`, ...).
    pub totals: std::collections::BTreeMap<&'static str, u64>,
    /// Throughput over the last few seconds.
    pub rates: Rates,
    /// Latency percentiles over the last few seconds.
    pub latency: Latency,
    /// Deadlines met and missed since start, and how late the missed ones were.
    pub deadlines: Deadlines,
    /// Connected workers, by id.
    pub workers: Vec<WorkerStatus>,
    /// Live packages, newest first (at most [`MAX_PACKAGES`]).
    pub packages: Vec<PackageStatus>,
    /// Live packages left out of `packages` because there were more than [`MAX_PACKAGES`].
    pub packages_omitted: usize,
    /// Users with live packages, a quota or results since start, by name.
    pub users: Vec<UserStatus>,
    /// Admission refusals since start, by reason (`quota`, `admission`, `rejected`, ...).
    pub refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Connections by role (`client`, `worker`).
    pub connections: std::collections::BTreeMap<&'static str, u64>,
    /// Connections refused with `busy` since start by reason (`max_connections`,
    /// `max_unauthenticated`, `max_unauthenticated_per_host`, `client_reserve`), and those
    /// evicted in their handshake to make room for a newer one (`handshake_evicted`).
    pub connection_refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Tasks by user and priority class, over every live package (not only the listed ones).
    pub classes: Vec<ClassStatus>,
    /// Tasks by resource class (what they ask of their workers), with the workers that can
    /// serve each.
    pub resource_classes: Vec<ResourceClassStatus>,
    /// Histograms since start, by metric name without the `rtpool_` prefix
    /// (`submit_to_assign_seconds`, `assign_to_result_seconds`, `deadline_lateness_seconds`,
    /// `journal_fsync_seconds`): what `/metrics` exports.
    pub histograms: std::collections::BTreeMap<&'static str, HistogramStatus>,
    /// High availability (`--ha`): this master's role; absent for a single master.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ha: Option<HaStatus>,
}

/// A master's place among the masters sharing one `--ha` database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HaStatus {
    /// `leader` (holds the lease and serves) or `standby` (answers `HELLO` with `not_leader`).
    pub role: &'static str,
    /// The lease epoch: the leader's own, or for a standby the last one it saw in the lease
    /// row (0: none yet).
    pub epoch: u64,
    /// The leader's advertised address as the lease row names it (`None`: unknown, e.g. no
    /// leader or the database unreachable).
    pub leader: Option<String>,
    /// Whether this master's last look at the database succeeded (a standby that cannot reach
    /// it could not take over: `/readyz` answers 503).
    pub db_ok: bool,
}

impl HaStatus {
    /// Whether this master leads.
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

/// Tasks of one user at one priority.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassStatus {
    /// User name.
    pub user: String,
    /// Priority (higher runs first).
    pub priority: i32,
    /// Tasks waiting for a worker.
    pub queued: u64,
    /// Tasks on workers.
    pub running: u64,
    /// Results since start.
    pub done: u64,
}

/// A histogram since start.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistogramStatus {
    /// Buckets, each with its own count (not cumulative); the last has no bound.
    pub buckets: Vec<Bucket>,
    /// Values counted.
    pub count: u64,
    /// Their sum, seconds.
    pub sum_s: f64,
}

/// Most packages a snapshot lists (the newest); the rest are counted in `packages_omitted`.
pub const MAX_PACKAGES: usize = 500;

/// The master itself.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MasterInfo {
    /// The main port's address (`HOST:PORT`).
    pub address: String,
    /// Process id.
    pub pid: u32,
    /// rtpool version.
    pub version: &'static str,
    /// Seconds since the master started.
    pub uptime_s: f64,
    /// Unix time of this snapshot, seconds.
    pub time_s: f64,
    /// The crash-recovery journal, `None` without one.
    pub journal: Option<JournalInfo>,
    /// Real-time mode was asked for.
    pub realtime: bool,
    /// Metric collection is on (`--metrics`); when off, `rates`, `latency`, the lateness
    /// histogram and the per-worker `done`/`exec_s` stay empty.
    pub metrics: bool,
}

/// The journal's size and fsync behaviour.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JournalInfo {
    /// Size of `journal.log`, bytes.
    pub bytes: u64,
    /// Records appended since start.
    pub records: u64,
    /// `fdatasync` calls since start.
    pub fsyncs: u64,
    /// The fsync policy (`always`, `batch`, `never`).
    pub fsync: String,
    /// Durations of the fsyncs since start (percentiles are bucket bounds here).
    pub fsync_latency: Percentiles,
    /// The same as a histogram.
    pub fsync_buckets: Vec<Bucket>,
    /// Their sum, seconds.
    pub fsync_sum_s: f64,
    /// Estimated bytes of records waiting for the journal's writer thread now (the queue is
    /// bounded: past 16 MiB the scheduler waits, which is `backpressure_waits`).
    pub queued_bytes: u64,
    /// Capacity of the journal writer thread's group buffer, bytes (at most 1 MiB between
    /// bursts of large records; up to about 8 MiB while one is written).
    pub buffer_bytes: u64,
    /// Appends that waited for room in that queue since start (the disk was slower than the
    /// scheduler).
    pub backpressure_waits: u64,
    /// Time those appends waited in all, seconds.
    pub backpressure_s: f64,
    /// Compactions done since start.
    pub compactions: u64,
    /// A compaction is running now (beside the appends).
    pub compacting: bool,
    /// How long the last compaction took, seconds (0 before the first).
    pub last_compaction_s: f64,
    /// How long the last compaction paused appends to install the compacted file, seconds.
    pub last_compaction_pause_s: f64,
}

/// Throughput.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rates {
    /// Results per second over the last `window_s` seconds.
    pub tasks_per_s: f64,
    /// The window the rates are measured over, seconds (up to 10).
    pub window_s: f64,
}

/// Latency percentiles of the two legs of a task's path through the master.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// From the package's receipt to the task's assignment to a worker (queueing).
    pub submit_to_assign: Percentiles,
    /// From the assignment to the worker's result (transfer, execution, return).
    pub assign_to_result: Percentiles,
}

/// Percentiles of one latency, microseconds; over the last `window_s` seconds for the task
/// latencies, since start for the journal's fsyncs. Each percentile is the upper bound of the
/// histogram bucket it falls in (buckets are 1/8 of a power of two wide: within 12.5 %).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest value seen (exact).
    pub max_us: u64,
    /// Values counted.
    pub count: u64,
}

/// Deadlines.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Deadlines {
    /// Results that came by their package's deadline, since start.
    pub met: u64,
    /// Results that came after it, since start.
    pub missed: u64,
    /// Tasks dropped because they could no longer make it (`on_miss = "drop"`).
    pub dropped: u64,
    /// How late the late results were, since start: a histogram.
    pub lateness: Vec<Bucket>,
    /// Deadlines are being missed because the workers cannot keep up: at least
    /// `--overload-miss-ratio` of the deadline results of the last `--overload-window`
    /// missed while tasks waited in the queue.
    pub overloaded: bool,
    /// For how long it has been overloaded, seconds (0 when it is not).
    pub overloaded_s: f64,
    /// Deadline results in the overload window that came by their deadline.
    pub window_met: u64,
    /// Deadline results in the overload window that missed (late or dropped).
    pub window_missed: u64,
    /// `window_missed / (window_met + window_missed)`; 0 with none.
    pub window_miss_ratio: f64,
}

/// One histogram bucket: values above the previous bucket's `le_s` up to this one's.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Bucket {
    /// Upper bound, seconds; `None` (JSON `null`) for the last bucket, which has none.
    pub le_s: Option<f64>,
    /// Values in this bucket (not cumulative).
    pub count: u64,
}

/// One connected worker.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkerStatus {
    /// Session id.
    pub id: u64,
    /// The name the worker gave in its `HELLO` (`host:pid`, or `slurm-<jobid>-...` for a
    /// Slurm worker).
    pub name: String,
    /// Its `HELLO` identity (`host:supervisor-pid/slot`), the same after its process is
    /// replaced or reconnects; empty if it sent none.
    pub identity: String,
    /// The address it connected from.
    pub host: String,
    /// Tasks it runs at once.
    pub slots: u32,
    /// Tasks it holds now.
    pub running: usize,
    /// Tasks it may still be sent.
    pub credits: u32,
    /// It asked for no more work (draining).
    pub draining: bool,
    /// Results it returned since it connected.
    pub done: u64,
    /// Execution time of those results, seconds (as the worker measured it).
    pub exec_s: f64,
    /// Results per second over the last few seconds.
    pub tasks_per_s: f64,
    /// Seconds since it last sent a `PULL`, `RESULT` or `RETURN` (heartbeats not counted).
    pub last_seen_s: f64,
    /// What it has for tasks that ask (`{"gpu": 2, "mem_gb": 64}`), as it announced.
    pub resources: std::collections::BTreeMap<String, u64>,
    /// How much of each its running tasks hold now.
    pub in_use: std::collections::BTreeMap<String, u64>,
    /// Its labels (`{"zone": "a"}`).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Packages that ask for the same resources and labels of their workers (a resource class);
/// packages that ask for nothing are not listed (their tasks are the other totals).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResourceClassStatus {
    /// `gpu=1,zone=a`.
    pub name: String,
    /// What each task holds while it runs.
    pub resources: std::collections::BTreeMap<String, u64>,
    /// The labels its worker needs.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Tasks waiting for a worker.
    pub queued: u64,
    /// Tasks running.
    pub running: u64,
    /// Connected workers able to serve it.
    pub workers: u64,
    /// No connected worker can serve it: its tasks wait (option `unschedulable="wait"`).
    pub unschedulable: bool,
}

/// One live package.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PackageStatus {
    /// Package id.
    pub id: u64,
    /// Its user.
    pub user: String,
    /// Tasks in it.
    pub tasks: u32,
    /// Tasks waiting for a worker.
    pub queued: u32,
    /// Tasks on workers.
    pub running: u32,
    /// Tasks with a result (any status).
    pub done: u32,
    /// Results whose status is not ok (error, failed, time-out, lost, ...), as far as the
    /// master saw them while metrics were on.
    pub failed: u32,
    /// Tasks cancelled.
    pub cancelled: u32,
    /// Its priority (higher runs first).
    pub priority: i32,
    /// Seconds until its deadline (negative once past); `None` without one.
    pub deadline_in_s: Option<f64>,
    /// Results that came by the deadline.
    pub met: u32,
    /// Results that came after it, and tasks dropped for it.
    pub missed: u32,
}

/// One user.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UserStatus {
    /// User name (`default` for the master's own client token).
    pub user: String,
    /// Its live packages.
    pub packages: usize,
    /// Its tasks waiting for a worker.
    pub queued: u64,
    /// Its tasks on workers.
    pub running: u64,
    /// Its results since start.
    pub done: u64,
    /// Its compute-time quota, seconds; `None` when unlimited.
    pub quota_s: Option<f64>,
    /// Compute time charged to it, seconds (from the user store when there is one, else
    /// since this master started).
    pub used_s: f64,
}
