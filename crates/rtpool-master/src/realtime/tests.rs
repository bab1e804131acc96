//! Real-time mode: parsing and formatting of CPU lists, and what a refused step reports.

use super::*;

fn config(priority: u8, cpus: Option<Vec<usize>>) -> RealtimeConfig {
    RealtimeConfig {
        enabled: true,
        priority,
        cpus,
    }
}

/// Enter a fresh thread (the test's own keeps its policy) and return what took effect.
fn enter_on_new_thread(rt: &Realtime) -> (bool, bool) {
    let rt = rt.clone();
    std::thread::spawn(move || {
        let done = rt.enter_thread();
        // Counted while inside, uncounted once it leaves.
        let inside = rt.report();
        assert_eq!(inside.fifo_threads, usize::from(done.0));
        assert_eq!(inside.pinned_threads, usize::from(done.1));
        rt.leave_thread();
        done
    })
    .join()
    .expect("the thread panicked")
}

#[test]
fn cpu_lists_parse_like_taskset() {
    assert_eq!(parse_cpus("1").unwrap(), vec![1]);
    assert_eq!(parse_cpus("0,1").unwrap(), vec![0, 1]);
    assert_eq!(parse_cpus(" 1 , 0 ").unwrap(), vec![0, 1]);
    assert_eq!(parse_cpus("0-3,6").unwrap(), vec![0, 1, 2, 3, 6]);
    assert_eq!(parse_cpus("2,0-2,2").unwrap(), vec![0, 1, 2]);
    assert_eq!(parse_cpus("1023").unwrap(), vec![1023]);
}

#[test]
fn bad_cpu_lists_name_the_bad_part() {
    let reason = |list: &str| match parse_cpus(list) {
        Err(MasterError::BadCpuList { reason, .. }) => reason,
        other => panic!("{list:?}: expected BadCpuList, got {other:?}"),
    };
    assert!(reason("").contains("\"\" is not a CPU number"));
    assert!(reason("1,,2").contains("\"\" is not a CPU number"));
    assert!(reason("x").contains("\"x\" is not a CPU number"));
    assert!(reason("-1").contains("is not a CPU number"));
    assert!(reason("3-1").contains("3-1 runs backwards"));
    assert!(reason("1024").contains("beyond the 1024"));
    let text = parse_cpus("0,a").unwrap_err().to_string();
    assert!(text.contains("0,a"), "{text}");
}

#[test]
fn cpu_lists_format_back() {
    assert_eq!(format_cpus(&[]), "");
    assert_eq!(format_cpus(&[1]), "1");
    assert_eq!(format_cpus(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
    for list in ["0", "0-3,6", "1,3,5-7"] {
        assert_eq!(format_cpus(&parse_cpus(list).unwrap()), list);
    }
}

#[test]
fn disabled_changes_nothing() {
    let rt = Realtime::disabled();
    assert_eq!(enter_on_new_thread(&rt), (false, false));
    let r = rt.report();
    assert!(!r.requested && !r.memory_locked && r.warnings.is_empty());
    assert_eq!((r.fifo_threads, r.pinned_threads), (0, 0));
}

/// A priority outside 1..=99 and a CPU this process cannot use are refused like a missing
/// permission would be: one warning each, however many threads try, and normal mode.
#[test]
fn refused_steps_warn_once_and_stay_normal() {
    let rt = Realtime::start(&config(0, Some(vec![MAX_CPUS - 1])));
    for _ in 0..3 {
        assert_eq!(enter_on_new_thread(&rt), (false, false));
    }
    let r = rt.report();
    assert!(r.requested);
    assert!(r.cpus.is_empty());
    assert_eq!((r.fifo_threads, r.pinned_threads), (0, 0));
    assert!(!r.is_fully_active());
    if cfg!(target_os = "linux") {
        assert_eq!(r.warnings.len(), 2 + usize::from(!r.memory_locked), "{r:?}");
        let fifo = r
            .warnings
            .iter()
            .filter(|w| w.contains("SCHED_FIFO priority 0"));
        assert_eq!(fifo.count(), 1, "{r:?}");
        assert!(r.warnings.iter().any(|w| w.contains("CAP_SYS_NICE")));
        assert!(r
            .warnings
            .iter()
            .any(|w| w.contains("CPUs 1023 are not available")));
        assert!(rt.summary().contains("SCHED_FIFO refused"));
        assert!(rt.summary().contains("not pinned (no usable CPU)"));
    } else {
        assert_eq!(r.warnings.len(), 1, "{r:?}");
    }
}

/// Where the OS permits it (root, CAP_SYS_NICE or RLIMIT_RTPRIO): a thread that enters
/// runs under SCHED_FIFO on the one CPU asked for.
#[cfg(target_os = "linux")]
#[test]
fn permitted_steps_take_effect_on_the_thread() {
    use nix::sched::sched_getaffinity;
    use nix::unistd::Pid;
    use thread_priority::ThreadSchedulePolicy as Policy;
    use thread_priority::{thread_schedule_policy, RealtimeThreadSchedulePolicy as Rt};

    let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let cpu = (0..MAX_CPUS).find(|&c| allowed.is_set(c).unwrap()).unwrap();
    let rt = Realtime::start(&config(10, Some(vec![cpu])));
    let probe = rt.clone();
    let (done, policy, affinity) = std::thread::spawn(move || {
        let done = probe.enter_thread();
        let policy = thread_schedule_policy().unwrap();
        let affinity = sched_getaffinity(Pid::from_raw(0)).unwrap();
        probe.leave_thread();
        (done, policy, affinity)
    })
    .join()
    .unwrap();
    assert!(done.1, "pinning is always permitted: {:?}", rt.report());
    assert!(affinity.is_set(cpu).unwrap());
    assert_eq!(
        (0..MAX_CPUS)
            .filter(|&c| affinity.is_set(c).unwrap())
            .count(),
        1
    );
    if done.0 {
        assert_eq!(policy, Policy::Realtime(Rt::Fifo));
        assert!(rt
            .report()
            .warnings
            .iter()
            .all(|w| !w.contains("SCHED_FIFO")));
    } else {
        // Not permitted here (no root, no CAP_SYS_NICE): the refusal path, with a warning.
        assert_ne!(policy, Policy::Realtime(Rt::Fifo));
        assert!(rt
            .report()
            .warnings
            .iter()
            .any(|w| w.contains("SCHED_FIFO")));
    }
    assert_eq!(rt.report().cpus, vec![cpu]);
    assert_eq!(rt.report().fifo_threads, 0, "the thread left");
}

#[cfg(target_os = "linux")]
#[test]
fn blocking_pool_threads_enter_and_leave() {
    let rt = Realtime::start(&config(DEFAULT_PRIORITY, None));
    let mut builder = tokio::runtime::Builder::new_current_thread();
    rt.install(&mut builder);
    let runtime = builder.build().unwrap();
    let probe = rt.clone();
    let seen = runtime
        .block_on(async {
            tokio::task::spawn_blocking(move || (ENTERED.get(), probe.report())).await
        })
        .unwrap();
    let (entered, report) = seen;
    let (fifo, _) = entered.expect("the blocking thread was entered");
    assert_eq!(report.fifo_threads, usize::from(fifo));
    drop(runtime); // joins the blocking pool: its threads leave
    assert_eq!(rt.report().fifo_threads, 0);
}
