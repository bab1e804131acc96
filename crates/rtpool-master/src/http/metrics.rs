//! `/metrics`: a [`Status`] snapshot in the OpenMetrics text format (which Prometheus
//! scrapes), written by the `prometheus-client` crate through a [`Collector`] that reads the
//! snapshot at scrape time. Nothing here touches the scheduler: it renders on the HTTP
//! thread what the scheduler published last. `docs/operations.md` lists every metric.

mod classes;
mod ha;

use std::collections::HashSet;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::status::schema::HistogramStatus;
use crate::status::Status;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of one series.
type Labels = Vec<(&'static str, String)>;

/// The snapshot in the OpenMetrics text format.
pub fn render(status: &Arc<Status>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatusCollector(status.clone())));
    let mut out = String::with_capacity(16 << 10);
    // Writing to a String cannot fail, and our collector only fails on the writer's errors.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

#[derive(Debug)]
struct StatusCollector(Arc<Status>);

/// One metric family: its descriptor, then one series per label set.
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut series = series.into_iter().peekable();
    let Some((_, first)) = series.peek() else {
        return Ok(());
    };
    let mut family = enc.encode_descriptor(name, help, unit, first.metric_type())?;
    for (labels, metric) in series {
        if labels.is_empty() {
            // An unlabelled metric has one series.
            return metric.encode(family);
        }
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge's or counter's value, written as an integer when it is one (`7`, not `7.0`).
#[derive(Debug)]
struct Num(MetricType, f64);

impl EncodeMetric for Num {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let Num(kind, v) = *self;
        let integral = v.fract() == 0.0 && v.abs() < 9.0e15;
        match (kind, integral) {
            (MetricType::Counter, true) => ConstCounter::new(v as u64).encode(encoder),
            (MetricType::Counter, false) => ConstCounter::new(v).encode(encoder),
            (_, true) => ConstGauge::new(v as i64).encode(encoder),
            (_, false) => ConstGauge::new(v).encode(encoder),
        }
    }

    fn metric_type(&self) -> MetricType {
        self.0
    }
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let series = series
        .into_iter()
        .map(|(l, v)| (l, Num(MetricType::Gauge, v)));
    family(enc, name, help, unit, series)
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let series = series
        .into_iter()
        .map(|(l, v)| (l, Num(MetricType::Counter, v)));
    family(enc, name, help, unit, series)
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: Option<&HistogramStatus>,
) -> Result<(), std::fmt::Error> {
    let Some(h) = h else {
        return Ok(());
    };
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|b| (b.le_s.unwrap_or(f64::INFINITY), b.count))
        .collect();
    let mut metric =
        enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(h.sum_s, h.count, &buckets, None)
}

fn one(value: f64) -> [(Labels, f64); 1] {
    [(Vec::new(), value)]
}

/// Worker names as labels: a name two connected workers share gets `#<id>` on the later
/// ones, so every series stays unique.
fn worker_labels(status: &Status) -> Vec<Labels> {
    let mut seen = HashSet::new();
    status
        .workers
        .iter()
        .map(|w| {
            let name = if seen.insert(w.name.as_str()) {
                w.name.clone()
            } else {
                format!("{}#{}", w.name, w.id)
            };
            vec![("worker", name)]
        })
        .collect()
}

impl Collector for StatusCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &*self.0;
        tasks(&mut enc, s)?;
        workers(&mut enc, s)?;
        events(&mut enc, s)?;
        classes::classes(&mut enc, s)?;
        ha::ha(&mut enc, s)?;
        resources(&mut enc, s)
    }
}

fn total(s: &Status, key: &str) -> f64 {
    s.totals.get(key).copied().unwrap_or(0) as f64
}

/// Tasks by class, totals, connections.
fn tasks(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    let total = |k: &str| total(s, k);
    let class = |c: &crate::status::schema::ClassStatus| -> Labels {
        vec![
            ("priority", c.priority.to_string()),
            ("user", c.user.clone()),
        ]
    };
    gauge(
        e,
        "rtpool_tasks_queued",
        "Tasks waiting for a worker, by priority and user.",
        None,
        s.classes.iter().map(|c| (class(c), c.queued as f64)),
    )?;
    gauge(
        e,
        "rtpool_tasks_running",
        "Tasks on workers, by priority and user.",
        None,
        s.classes.iter().map(|c| (class(c), c.running as f64)),
    )?;
    counter(
        e,
        "rtpool_tasks_done",
        "Results since start, by priority and user.",
        None,
        s.classes.iter().map(|c| (class(c), c.done as f64)),
    )?;
    counter(
        e,
        "rtpool_tasks_failed",
        "Results whose status was not ok, since start.",
        None,
        one(total("failed")),
    )?;
    gauge(
        e,
        "rtpool_tasks_held",
        "Tasks the master holds: queued, running, cancelling, or a result not yet acknowledged.",
        None,
        one(total("tasks")),
    )?;
    gauge(
        e,
        "rtpool_result_data",
        "Data of the results held until their client acknowledges them.",
        Some(&Unit::Bytes),
        one(total("result_bytes")),
    )?;
    gauge(
        e,
        "rtpool_unacked_result_data",
        "Of those, the results sent to a connected client and not acknowledged yet (the rest \
         wait for a detached client, at most the result TTL).",
        Some(&Unit::Bytes),
        one(total("unacked_bytes")),
    )?;
    gauge(
        e,
        "rtpool_packages",
        "Live packages.",
        None,
        one(total("packages")),
    )?;
    gauge(
        e,
        "rtpool_workers",
        "Connected workers.",
        None,
        one(total("workers")),
    )?;
    gauge(
        e,
        "rtpool_slots",
        "Slots of the connected workers.",
        None,
        one(total("slots")),
    )?;
    gauge(
        e,
        "rtpool_credits",
        "Credits (tasks the workers asked for and were not sent yet).",
        None,
        one(total("credits")),
    )?;
    gauge(
        e,
        "rtpool_connections",
        "Authenticated connections by role.",
        None,
        s.connections
            .iter()
            .map(|(role, n)| (vec![("role", (*role).to_owned())], *n as f64)),
    )?;
    Ok(())
}

/// Per-worker series, labelled by worker name.
fn workers(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    let workers = worker_labels(s);
    let per_worker = |f: fn(&crate::status::schema::WorkerStatus) -> f64| {
        workers
            .iter()
            .cloned()
            .zip(s.workers.iter().map(f))
            .collect::<Vec<_>>()
    };
    gauge(
        e,
        "rtpool_worker_slots",
        "Slots of a worker, by worker name.",
        None,
        per_worker(|w| f64::from(w.slots)),
    )?;
    gauge(
        e,
        "rtpool_worker_credits",
        "Credits of a worker.",
        None,
        per_worker(|w| f64::from(w.credits)),
    )?;
    gauge(
        e,
        "rtpool_worker_running",
        "Tasks a worker holds.",
        None,
        per_worker(|w| w.running as f64),
    )?;
    counter(
        e,
        "rtpool_worker_exec",
        "Execution time of a worker's results since it connected, as it measured it.",
        Some(&Unit::Seconds),
        per_worker(|w| w.exec_s),
    )?;
    counter(
        e,
        "rtpool_worker_tasks",
        "Results a worker returned since it connected.",
        None,
        per_worker(|w| w.done as f64),
    )?;
    gauge(
        e,
        "rtpool_worker_last_seen",
        "Time since a worker's last PULL, RESULT or RETURN.",
        Some(&Unit::Seconds),
        per_worker(|w| w.last_seen_s),
    )?;
    Ok(())
}

/// Deadlines, refusals, retries and the core's counters.
fn events(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    let total = |k: &str| total(s, k);
    counter(
        e,
        "rtpool_deadlines",
        "Results by their deadline (met), after it (missed), and tasks dropped for it.",
        None,
        [
            (vec![("outcome", "met".to_owned())], s.deadlines.met as f64),
            (
                vec![("outcome", "missed".to_owned())],
                s.deadlines.missed as f64,
            ),
            (
                vec![("outcome", "dropped".to_owned())],
                s.deadlines.dropped as f64,
            ),
        ],
    )?;
    gauge(
        e,
        "rtpool_overloaded",
        "1 while deadlines are missed because more work is offered than the workers can do \
         (--overload-miss-ratio of the deadline results of --overload-window missed, with tasks \
         waiting), else 0.",
        None,
        one(if s.deadlines.overloaded { 1.0 } else { 0.0 }),
    )?;
    gauge(
        e,
        "rtpool_deadline_miss_ratio",
        "Share of the deadline results of the overload window that missed their deadline.",
        None,
        one(s.deadlines.window_miss_ratio),
    )?;
    let reasons = ["quota", "admission", "unknown_function", "rejected"];
    counter(
        e,
        "rtpool_admission_refusals",
        "Refused submissions by ERROR code.",
        None,
        reasons.iter().map(|r| {
            (
                vec![("reason", (*r).to_owned())],
                s.refusals.get(r).copied().unwrap_or(0) as f64,
            )
        }),
    )?;
    let reasons = [
        "max_connections",
        "max_unauthenticated",
        "max_unauthenticated_per_host",
        "client_reserve",
        "handshake_evicted",
    ];
    counter(
        e,
        "rtpool_connection_refusals",
        "Connections answered busy by reason: refused, or evicted in their handshake to make \
         room for a newer one (handshake_evicted).",
        None,
        reasons.iter().map(|r| {
            (
                vec![("reason", (*r).to_owned())],
                s.connection_refusals.get(r).copied().unwrap_or(0) as f64,
            )
        }),
    )?;
    counter(
        e,
        "rtpool_task_retries",
        "Tasks requeued because their worker was lost.",
        None,
        one(total("requeued")),
    )?;
    counter(
        e,
        "rtpool_overreported_results",
        "Results whose worker reported a task time longer than the master saw from assignment \
         to result: charged and recorded as what the master saw (plus 1 ms).",
        None,
        one(total("overreported_results")),
    )?;
    counter(
        e,
        "rtpool_task_poison",
        "Tasks failed as poison (their worker was lost on every attempt).",
        None,
        one(total("poisoned")),
    )?;
    counter(
        e,
        "rtpool_task_timeouts",
        "Tasks failed for running past their time limit.",
        None,
        one(total("timed_out")),
    )?;
    let events: Vec<(Labels, f64)> = rtpool_core::Counters::default()
        .iter()
        .map(|(name, _)| (vec![("event", name.to_owned())], total(name)))
        .collect();
    counter(
        e,
        "rtpool_scheduler_events",
        "Every counter of the scheduler core, by name (see crates/rtpool-core/src/stats.rs).",
        None,
        events,
    )?;
    Ok(())
}

/// Uptime, journal, quotas and the histograms.
fn resources(e: &mut DescriptorEncoder, s: &Status) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "rtpool_uptime",
        "Time since the master started.",
        Some(&Unit::Seconds),
        one(s.master.uptime_s),
    )?;
    if let Some(j) = &s.master.journal {
        gauge(
            e,
            "rtpool_journal",
            "Size of the crash-recovery journal.",
            Some(&Unit::Bytes),
            one(j.bytes as f64),
        )?;
        counter(
            e,
            "rtpool_journal_records",
            "Records appended to the journal since start.",
            None,
            one(j.records as f64),
        )?;
        journal_queue(e, j)?;
    }
    let quota = s
        .users
        .iter()
        .filter_map(|u| Some((vec![("user", u.user.clone())], u.quota_s?)));
    gauge(
        e,
        "rtpool_quota",
        "A user's compute-time quota (users without a quota are left out).",
        Some(&Unit::Seconds),
        quota,
    )?;
    gauge(
        e,
        "rtpool_quota_used",
        "Compute time charged to a user.",
        Some(&Unit::Seconds),
        s.users
            .iter()
            .map(|u| (vec![("user", u.user.clone())], u.used_s)),
    )?;
    let h = |name: &str| s.histograms.get(name);
    histogram(
        e,
        "rtpool_submit_to_assign",
        "From a package's receipt to a task's assignment to a worker.",
        h("submit_to_assign_seconds"),
    )?;
    histogram(
        e,
        "rtpool_assign_to_result",
        "From a task's assignment to its worker's result.",
        h("assign_to_result_seconds"),
    )?;
    histogram(
        e,
        "rtpool_deadline_lateness",
        "How late results after their deadline came.",
        h("deadline_lateness_seconds"),
    )?;
    histogram(
        e,
        "rtpool_journal_fsync",
        "Durations of the journal's fdatasync calls.",
        h("journal_fsync_seconds"),
    )?;
    Ok(())
}

/// The journal's queue to its writer thread and its compactions.
fn journal_queue(
    e: &mut DescriptorEncoder,
    j: &crate::status::schema::JournalInfo,
) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "rtpool_journal_queued",
        "Records waiting for the journal's writer thread (estimated; bounded at 16 MiB).",
        Some(&Unit::Bytes),
        one(j.queued_bytes as f64),
    )?;
    gauge(
        e,
        "rtpool_journal_buffer",
        "Capacity of the journal writer thread's group buffer.",
        Some(&Unit::Bytes),
        one(j.buffer_bytes as f64),
    )?;
    counter(
        e,
        "rtpool_journal_backpressure_waits",
        "Appends that waited for room in the journal's queue (the disk slower than the \
         scheduler).",
        None,
        one(j.backpressure_waits as f64),
    )?;
    counter(
        e,
        "rtpool_journal_backpressure",
        "Time appends waited for room in the journal's queue.",
        Some(&Unit::Seconds),
        one(j.backpressure_s),
    )?;
    counter(
        e,
        "rtpool_journal_compactions",
        "Journal compactions done since start.",
        None,
        one(j.compactions as f64),
    )?;
    gauge(
        e,
        "rtpool_journal_compacting",
        "1 while a journal compaction runs (beside the appends), else 0.",
        None,
        one(if j.compacting { 1.0 } else { 0.0 }),
    )?;
    gauge(
        e,
        "rtpool_journal_last_compaction",
        "How long the last journal compaction took.",
        Some(&Unit::Seconds),
        one(j.last_compaction_s),
    )?;
    gauge(
        e,
        "rtpool_journal_last_compaction_pause",
        "How long the last journal compaction paused appends to install the compacted file.",
        Some(&Unit::Seconds),
        one(j.last_compaction_pause_s),
    )
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
