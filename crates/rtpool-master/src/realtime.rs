//! Real-time mode (`--realtime`): the master's memory locked with `mlockall`, `SCHED_FIFO` for
//! the threads that serve (the runtime thread, which also runs the scheduler, and the blocking
//! pool's threads as they start) and, optionally, those threads pinned to a set of CPUs.
//!
//! This module owns the OS calls and the record of what they achieved ([`RealtimeReport`], part
//! of [`crate::MasterStats`]). Which threads enter real-time mode is decided by
//! [`crate::handle`], which calls [`Realtime::enter_thread`] on them. Each step the OS refuses
//! logs one warning (what failed, the errno, how to permit it) and leaves that aspect in normal
//! mode: a master never fails to start because it could not be real-time.
//!
//! The journal's writer thread stays in normal mode: by default (`fsync batch`) nothing waits
//! for it, and under `fsync always` the fsync it waits on costs milliseconds, far more than the
//! scheduling delay a priority would save.
//!
//! Linux only; elsewhere `--realtime` logs one warning and changes nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::MasterError;

/// `SCHED_FIFO` priority used unless told otherwise (the middle of Linux's 1..=99).
pub const DEFAULT_PRIORITY: u8 = 50;

/// CPUs a CPU list may name: the size of Linux's `cpu_set_t`.
pub const MAX_CPUS: usize = 1024;

/// What real-time mode should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealtimeConfig {
    /// Real-time mode at all (default false: none of the below happens).
    pub enabled: bool,
    /// `SCHED_FIFO` priority of the serving threads, 1..=99 (default [`DEFAULT_PRIORITY`]).
    /// Anything else is refused like a missing permission: one warning, normal scheduling.
    pub priority: u8,
    /// Pin the serving threads to these CPUs (all of them: each thread may run on any one);
    /// `None`: no pinning.
    pub cpus: Option<Vec<usize>>,
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            priority: DEFAULT_PRIORITY,
            cpus: None,
        }
    }
}

/// What real-time mode achieved, as [`crate::MasterStats::realtime`] reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RealtimeReport {
    /// Real-time mode was asked for.
    pub requested: bool,
    /// `mlockall(MCL_CURRENT | MCL_FUTURE)` succeeded: no page of the process is paged out.
    pub memory_locked: bool,
    /// The `SCHED_FIFO` priority asked for.
    pub priority: u8,
    /// Threads of this master running under `SCHED_FIFO` now.
    pub fifo_threads: usize,
    /// CPUs the serving threads are pinned to (empty: not pinned).
    pub cpus: Vec<usize>,
    /// Threads of this master pinned to [`RealtimeReport::cpus`] now.
    pub pinned_threads: usize,
    /// One line per step the OS refused (as logged).
    pub warnings: Vec<String>,
}

impl RealtimeReport {
    /// Every step asked for took effect on at least one thread.
    pub fn is_fully_active(&self) -> bool {
        self.requested && self.memory_locked && self.fifo_threads > 0 && self.warnings.is_empty()
    }
}

/// Parse a CPU list as `taskset -c` and `/sys/devices/system/cpu/online` write it: numbers and
/// ranges separated by commas (`1`, `0,1`, `0-3,6`). Returns the CPUs sorted, without repeats.
///
/// # Errors
/// [`MasterError::BadCpuList`] naming the part that is not a CPU number or range.
pub fn parse_cpus(list: &str) -> Result<Vec<usize>, MasterError> {
    let bad = |reason: String| MasterError::BadCpuList {
        list: list.to_string(),
        reason,
    };
    let number = |part: &str| -> Result<usize, MasterError> {
        let n: usize = part
            .trim()
            .parse()
            .map_err(|_| bad(format!("{:?} is not a CPU number", part.trim())))?;
        if n >= MAX_CPUS {
            return Err(bad(format!(
                "CPU {n} is beyond the {MAX_CPUS} Linux can name"
            )));
        }
        Ok(n)
    };
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return Err(bad(format!("the range {first}-{last} runs backwards")));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `0-3,6` for `[0, 1, 2, 3, 6]`: the inverse of [`parse_cpus`], for messages.
pub fn format_cpus(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Real-time mode of one master: the process-wide steps taken at [`Realtime::start`], the
/// per-thread ones at [`Realtime::enter_thread`], and the counts of both. Clones share them.
#[derive(Clone)]
pub struct Realtime {
    inner: Arc<Inner>,
}

struct Inner {
    config: RealtimeConfig,
    /// CPUs to pin to: those asked for that this process may use; empty: no pinning.
    cpus: Vec<usize>,
    /// Held while this master runs: the process's memory stays locked until the last holder
    /// (another embedded master may share the process) lets go.
    memory: Option<os::MemoryLock>,
    fifo_threads: AtomicUsize,
    pinned_threads: AtomicUsize,
    /// The `SCHED_FIFO` and pinning refusals were logged (once each, however many threads).
    fifo_warned: AtomicBool,
    pin_warned: AtomicBool,
    warnings: Mutex<Vec<String>>,
}

thread_local! {
    /// What [`Realtime::enter_thread`] did to this thread: (`SCHED_FIFO`, pinned).
    static ENTERED: Cell<Option<(bool, bool)>> = const { Cell::new(None) };
}

/// Undoes the counting of [`Realtime::enter_thread`] when dropped (see
/// [`Realtime::leave_thread`]).
pub struct ThreadGuard {
    realtime: Realtime,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        self.realtime.leave_thread();
    }
}

impl Realtime {
    /// Real-time mode off: every method is a no-op and the report says `requested: false`.
    pub fn disabled() -> Self {
        Self::start(&RealtimeConfig::default())
    }

    /// Take the process-wide steps: lock memory, work out which of the CPUs asked for this
    /// process may use. Logs a warning for each refused step, nothing when disabled.
    pub fn start(config: &RealtimeConfig) -> Self {
        let mut warnings = Vec::new();
        let mut memory = None;
        let mut cpus = Vec::new();
        if config.enabled {
            match os::supported() {
                Err(why) => warnings.push(why),
                Ok(()) => {
                    match os::MemoryLock::acquire() {
                        Ok(lock) => memory = Some(lock),
                        Err(why) => warnings.push(why),
                    }
                    if let Some(asked) = &config.cpus {
                        let (usable, why) = os::usable_cpus(asked);
                        cpus = usable;
                        warnings.extend(why);
                    }
                }
            }
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                cpus,
                memory,
                fifo_threads: AtomicUsize::new(0),
                pinned_threads: AtomicUsize::new(0),
                fifo_warned: AtomicBool::new(false),
                pin_warned: AtomicBool::new(false),
                warnings: Mutex::new(warnings),
            }),
        }
    }

    /// Whether real-time mode was asked for.
    pub fn is_enabled(&self) -> bool {
        self.inner.config.enabled
    }

    /// Put the calling thread under `SCHED_FIFO` and pin it to the CPUs (as far as permitted;
    /// the first refusal of each is logged) and count it. Returns what took effect:
    /// (`SCHED_FIFO`, pinned). A thread entered already is left as it is.
    pub fn enter_thread(&self) -> (bool, bool) {
        let inner = &self.inner;
        if !inner.config.enabled || os::supported().is_err() {
            return (false, false);
        }
        if let Some(done) = ENTERED.get() {
            return done;
        }
        let fifo = match os::set_fifo(inner.config.priority) {
            Ok(()) => true,
            Err(why) => {
                self.warn_once(&inner.fifo_warned, why);
                false
            }
        };
        let pinned = !inner.cpus.is_empty()
            && match os::pin(&inner.cpus) {
                Ok(()) => true,
                Err(why) => {
                    self.warn_once(&inner.pin_warned, why);
                    false
                }
            };
        inner.fifo_threads.fetch_add(usize::from(fifo), Relaxed);
        inner.pinned_threads.fetch_add(usize::from(pinned), Relaxed);
        ENTERED.set(Some((fifo, pinned)));
        (fifo, pinned)
    }

    /// [`Realtime::enter_thread`], undone (the counting only) when the guard drops.
    pub fn enter_thread_guard(&self) -> ThreadGuard {
        self.enter_thread();
        ThreadGuard {
            realtime: self.clone(),
        }
    }

    /// The calling thread stops counting as real-time (it is ending). Its policy and affinity
    /// are left as they are: a thread that leaves is about to exit.
    pub fn leave_thread(&self) {
        if let Some((fifo, pinned)) = ENTERED.take() {
            self.inner
                .fifo_threads
                .fetch_sub(usize::from(fifo), Relaxed);
            self.inner
                .pinned_threads
                .fetch_sub(usize::from(pinned), Relaxed);
        }
    }

    /// Install [`Realtime::enter_thread`] and [`Realtime::leave_thread`] as the runtime's
    /// thread start and stop hooks (its blocking pool's threads, on a current-thread runtime).
    pub fn install(&self, builder: &mut tokio::runtime::Builder) {
        if !self.is_enabled() {
            return;
        }
        let (start, stop) = (self.clone(), self.clone());
        builder
            .on_thread_start(move || {
                start.enter_thread();
            })
            .on_thread_stop(move || stop.leave_thread());
    }

    /// What is in effect now.
    pub fn report(&self) -> RealtimeReport {
        let inner = &self.inner;
        RealtimeReport {
            requested: inner.config.enabled,
            memory_locked: inner.memory.is_some(),
            priority: inner.config.priority,
            fifo_threads: inner.fifo_threads.load(Relaxed),
            cpus: inner.cpus.clone(),
            pinned_threads: inner.pinned_threads.load(Relaxed),
            warnings: lock(&inner.warnings).clone(),
        }
    }

    /// One line on what is in effect, for the log: `memory locked, SCHED_FIFO 50 on 1
    /// thread(s), pinned to CPUs 1`.
    pub fn summary(&self) -> String {
        let r = self.report();
        let memory = if r.memory_locked {
            "memory locked".to_string()
        } else {
            "memory NOT locked".to_string()
        };
        let fifo = if r.fifo_threads > 0 {
            format!("SCHED_FIFO {} on {} thread(s)", r.priority, r.fifo_threads)
        } else {
            "SCHED_FIFO refused (normal scheduling)".to_string()
        };
        let pin = match (&r.cpus[..], r.pinned_threads) {
            ([], _) if self.inner.config.cpus.is_some() => "not pinned (no usable CPU)".into(),
            ([], _) => "not pinned".to_string(),
            (cpus, 0) => format!("pinning to CPUs {} refused", format_cpus(cpus)),
            (cpus, _) => format!("pinned to CPUs {}", format_cpus(cpus)),
        };
        format!("{memory}, {fifo}, {pin}")
    }

    fn warn_once(&self, flag: &AtomicBool, why: String) {
        if !flag.swap(true, Relaxed) {
            tracing::warn!("{why}");
            lock(&self.inner.warnings).push(why);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(target_os = "linux")]
mod os {
    //! The Linux calls, each returning the warning to log when refused.

    use std::sync::Mutex;

    use nix::errno::Errno;
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::sys::mman::{mlockall, munlockall, MlockAllFlags};
    use nix::unistd::Pid;
    use thread_priority::{
        set_thread_priority_and_policy, thread_native_id, Error as PrioError,
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
    };

    use super::format_cpus;

    /// Masters in this process holding the memory lock: `munlockall` when the last one ends.
    static LOCK_HOLDERS: Mutex<usize> = Mutex::new(0);

    pub fn supported() -> Result<(), String> {
        Ok(())
    }

    /// `mlockall(MCL_CURRENT | MCL_FUTURE)`, shared by the masters of one process.
    pub struct MemoryLock(());

    impl MemoryLock {
        pub fn acquire() -> Result<Self, String> {
            let mut holders = super::lock(&LOCK_HOLDERS);
            if *holders == 0 {
                mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE).map_err(|e| {
                    format!(
                        "real-time mode: cannot lock the master's memory (mlockall: {e}); its \
                         pages may be paged out or faulted in on the hot path. To permit it, \
                         raise RLIMIT_MEMLOCK above the process's virtual size (`ulimit -l \
                         unlimited`, `memlock` in /etc/security/limits.conf, \
                         LimitMEMLOCK=infinity in a systemd unit) or grant CAP_IPC_LOCK"
                    )
                })?;
            }
            *holders += 1;
            Ok(Self(()))
        }
    }

    impl Drop for MemoryLock {
        fn drop(&mut self) {
            let mut holders = super::lock(&LOCK_HOLDERS);
            *holders -= 1;
            if *holders == 0 {
                let _ = munlockall();
            }
        }
    }

    pub fn set_fifo(priority: u8) -> Result<(), String> {
        let fifo = ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo);
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let value = ThreadPriority::try_from(priority)
            .map_err(PrioError::Priority)
            .and_then(|p| set_thread_priority_and_policy(thread_native_id(), p, fifo));
        let why = match value {
            Ok(()) => return Ok(()),
            Err(PrioError::OS(code)) => Errno::from_raw(code).to_string(),
            Err(e) => e.to_string(),
        };
        Err(format!(
            "real-time mode: cannot run thread {name:?} under SCHED_FIFO priority {priority} \
             ({why}); it and the master's other threads keep normal scheduling. The priority \
             must be 1..=99; to permit it, grant CAP_SYS_NICE (or run as root) or raise \
             RLIMIT_RTPRIO to at least {priority} (`ulimit -r {priority}`, `rtprio` in \
             /etc/security/limits.conf, LimitRTPRIO= in a systemd unit); in a container or \
             cgroup, real-time runtime must also be granted (cpu.rt_runtime_us)"
        ))
    }

    /// The CPUs of `asked` this process may run on, and a warning naming the others.
    pub fn usable_cpus(asked: &[usize]) -> (Vec<usize>, Option<String>) {
        let allowed = match sched_getaffinity(Pid::from_raw(0)) {
            Ok(set) => set,
            Err(e) => {
                return (
                    Vec::new(),
                    Some(format!(
                        "real-time mode: cannot read this process's CPU affinity ({e}); \
                         threads are not pinned"
                    )),
                )
            }
        };
        let is_allowed = |cpu: usize| allowed.is_set(cpu).unwrap_or(false);
        let (usable, missing): (Vec<usize>, Vec<usize>) =
            asked.iter().copied().partition(|&c| is_allowed(c));
        if missing.is_empty() {
            return (usable, None);
        }
        let all: Vec<usize> = (0..CpuSet::count()).filter(|&c| is_allowed(c)).collect();
        let what = if usable.is_empty() {
            "threads are not pinned".to_string()
        } else {
            format!("pinning to CPUs {} only", format_cpus(&usable))
        };
        let why = format!(
            "real-time mode: CPUs {} are not available to this process (it may use {}); {what}. \
             Name CPUs from that list (see `nproc`, `taskset -p $$`, the cgroup's cpuset)",
            format_cpus(&missing),
            format_cpus(&all),
        );
        (usable, Some(why))
    }

    pub fn pin(cpus: &[usize]) -> Result<(), String> {
        let mut set = CpuSet::new();
        for &cpu in cpus {
            // In range: usable_cpus took them from a CpuSet.
            let _ = set.set(cpu);
        }
        sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| {
            format!(
                "real-time mode: cannot pin thread {:?} to CPUs {} ({e}); it runs on any CPU",
                std::thread::current().name().unwrap_or("unnamed"),
                format_cpus(cpus)
            )
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    //! Elsewhere: real-time mode is refused as a whole, with one warning.

    pub fn supported() -> Result<(), String> {
        Err("real-time mode (--realtime) is only supported on Linux; running in normal mode".into())
    }

    pub struct MemoryLock(());

    impl MemoryLock {
        pub fn acquire() -> Result<Self, String> {
            supported().map(|()| Self(()))
        }
    }

    pub fn set_fifo(_priority: u8) -> Result<(), String> {
        supported()
    }

    pub fn usable_cpus(_asked: &[usize]) -> (Vec<usize>, Option<String>) {
        (Vec::new(), supported().err())
    }

    pub fn pin(_cpus: &[usize]) -> Result<(), String> {
        supported()
    }
}

#[cfg(test)]
mod tests {
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
}
