//! Real-time mode through the embedding handle: what `MasterHandle::stats` reports.

use rtpool_master::{MasterConfig, MasterHandle, RealtimeConfig};

fn start(realtime: RealtimeConfig) -> MasterHandle {
    MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        realtime,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn normal_mode_reports_no_realtime() {
    let m = start(RealtimeConfig::default());
    assert_eq!(m.stats().unwrap().realtime, None);
}

#[test]
fn a_refused_priority_leaves_the_master_serving_in_normal_mode() {
    let m = start(RealtimeConfig {
        enabled: true,
        priority: 0,
        cpus: None,
    });
    let r = m.stats().unwrap().realtime.expect("requested");
    assert!(r.requested);
    assert_eq!(r.fifo_threads, 0);
    let why = if cfg!(target_os = "linux") {
        "SCHED_FIFO priority 0"
    } else {
        "only supported on Linux"
    };
    assert!(r.warnings.iter().any(|w| w.contains(why)), "{r:?}");
    assert!(!r.is_fully_active());
    // Still serving: a second stats round trip goes through the scheduler.
    assert!(m.stats().is_some());
}

#[cfg(target_os = "linux")]
#[test]
fn where_permitted_the_runtime_thread_runs_fifo() {
    let m = start(RealtimeConfig {
        enabled: true,
        priority: 10,
        cpus: None,
    });
    let r = m.stats().unwrap().realtime.expect("requested");
    let fifo_refused = r.warnings.iter().any(|w| w.contains("SCHED_FIFO"));
    if fifo_refused {
        assert_eq!(r.fifo_threads, 0, "{r:?}");
    } else {
        assert!(r.fifo_threads >= 1, "{r:?}");
        assert_eq!(r.priority, 10);
    }
}
