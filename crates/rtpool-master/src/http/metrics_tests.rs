//! Tests of `metrics.rs`: the rendering of a hand-made snapshot.

use super::*;
use crate::status::schema::{Bucket, ClassStatus, JournalInfo, WorkerStatus};

fn sample() -> Arc<Status> {
    let mut s = Status::default();
    s.totals.insert("workers", 2);
    s.totals.insert("requeued", 4);
    s.connections.insert("worker", 2);
    s.classes.push(ClassStatus {
        user: "alice".into(),
        priority: 5,
        queued: 7,
        running: 2,
        done: 30,
    });
    for (id, name) in [(3, "slurm-812-node1:77"), (4, "dup"), (5, "dup")] {
        s.workers.push(WorkerStatus {
            id,
            name: name.into(),
            slots: 4,
            exec_s: 1.5,
            ..WorkerStatus::default()
        });
    }
    s.deadlines.missed = 3;
    s.deadlines.overloaded = true;
    s.deadlines.window_miss_ratio = 0.25;
    s.histograms.insert(
        "deadline_lateness_seconds",
        HistogramStatus {
            buckets: vec![
                Bucket {
                    le_s: Some(0.1),
                    count: 1,
                },
                Bucket {
                    le_s: Some(1.0),
                    count: 2,
                },
                Bucket {
                    le_s: None,
                    count: 0,
                },
            ],
            count: 3,
            sum_s: 1.25,
        },
    );
    Arc::new(s)
}

#[test]
fn the_contract_metrics_are_rendered_with_their_labels() {
    let text = render(&sample());
    for line in [
        "rtpool_tasks_queued{priority=\"5\",user=\"alice\"} 7",
        "rtpool_tasks_running{priority=\"5\",user=\"alice\"} 2",
        "rtpool_tasks_done_total{priority=\"5\",user=\"alice\"} 30",
        "rtpool_workers 2",
        "rtpool_worker_slots{worker=\"slurm-812-node1:77\"} 4",
        "rtpool_worker_exec_seconds_total{worker=\"slurm-812-node1:77\"} 1.5",
        "rtpool_worker_slots{worker=\"dup\"} 4",
        "rtpool_worker_slots{worker=\"dup#5\"} 4",
        "rtpool_connections{role=\"worker\"} 2",
        "rtpool_deadlines_total{outcome=\"missed\"} 3",
        "rtpool_task_retries_total 4",
        "rtpool_overloaded 1",
        "rtpool_deadline_miss_ratio 0.25",
        "rtpool_admission_refusals_total{reason=\"quota\"} 0",
        "rtpool_deadline_lateness_seconds_bucket{le=\"0.1\"} 1",
        "rtpool_deadline_lateness_seconds_bucket{le=\"1.0\"} 3",
        "rtpool_deadline_lateness_seconds_bucket{le=\"+Inf\"} 3",
        "rtpool_deadline_lateness_seconds_count 3",
        "rtpool_deadline_lateness_seconds_sum 1.25",
        "rtpool_scheduler_events_total{event=\"requeued\"} 4",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn a_histogram_the_snapshot_lacks_is_left_out() {
    let text = render(&sample());
    assert!(!text.contains("rtpool_journal_fsync"), "{text}");
}

#[test]
fn the_journal_queue_and_compaction_are_rendered_with_a_journal_only() {
    let mut s = (*sample()).clone();
    assert!(!render(&Arc::new(s.clone())).contains("rtpool_journal_queued"));
    s.master.journal = Some(JournalInfo {
        queued_bytes: 4096,
        buffer_bytes: 65536,
        backpressure_waits: 3,
        backpressure_s: 0.5,
        compactions: 2,
        compacting: true,
        last_compaction_s: 0.25,
        last_compaction_pause_s: 0.02,
        ..JournalInfo::default()
    });
    let text = render(&Arc::new(s));
    for line in [
        "rtpool_journal_queued_bytes 4096",
        "rtpool_journal_buffer_bytes 65536",
        "rtpool_journal_backpressure_waits_total 3",
        "rtpool_journal_backpressure_seconds_total 0.5",
        "rtpool_journal_compactions_total 2",
        "rtpool_journal_compacting 1",
        "rtpool_journal_last_compaction_seconds 0.25",
        "rtpool_journal_last_compaction_pause_seconds 0.02",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}

#[test]
fn the_bytes_results_hold_are_rendered_from_the_totals() {
    let mut s = (*sample()).clone();
    s.totals.insert("result_bytes", 3 << 20);
    s.totals.insert("unacked_bytes", 1 << 20);
    let text = render(&Arc::new(s));
    for line in [
        "rtpool_result_data_bytes 3145728",
        "rtpool_unacked_result_data_bytes 1048576",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}
