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

/// Masters (and real-time clients, see [`super::ProcessMemoryLock`]) in this process holding
/// the memory lock: `munlockall` when the last one ends.
static LOCK_HOLDERS: Mutex<usize> = Mutex::new(0);

pub fn supported() -> Result<(), String> {
    Ok(())
}

/// `mlockall(MCL_CURRENT | MCL_FUTURE)`, shared by the masters of one process.
pub struct MemoryLock(());

impl MemoryLock {
    /// Lock (or count one more holder of the lock); `whose` names the holder in the warning
    /// ("the master's", "this client process's").
    pub fn acquire(whose: &str) -> Result<Self, String> {
        let mut holders = super::lock(&LOCK_HOLDERS);
        if *holders == 0 {
            mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE).map_err(|e| {
                format!(
                    "real-time mode: cannot lock {whose} memory (mlockall: {e}); its \
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
