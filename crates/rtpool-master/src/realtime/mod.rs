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

/// The process's memory locked (`mlockall(MCL_CURRENT | MCL_FUTURE)`) while this value lives,
/// counted with the locks of the masters embedded in the same process: the memory is unlocked
/// when the last holder drops. A real-time client (`rtpool.Client(realtime=True)`) holds one,
/// so that closing an embedded master does not unlock a client still in use, nor the reverse.
pub struct ProcessMemoryLock {
    _lock: os::MemoryLock,
}

impl ProcessMemoryLock {
    /// Lock this process's memory, or count one more holder if it is locked already.
    ///
    /// # Errors
    /// The warning to show when the OS refuses (what failed, the errno, how to permit it),
    /// naming the holder as `whose` ("this client process's").
    pub fn acquire(whose: &str) -> Result<Self, String> {
        os::supported()?;
        os::MemoryLock::acquire(whose).map(|lock| Self { _lock: lock })
    }
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
                    match os::MemoryLock::acquire("the master's") {
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

// The calls to the OS, each returning the warning to log when refused.
#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod os;
#[cfg(not(target_os = "linux"))]
#[path = "other.rs"]
mod os;

#[cfg(test)]
mod tests;
