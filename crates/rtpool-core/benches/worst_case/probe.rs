//! The per-call probe: this thread's scheduler statistics, page faults, CPU clock and the
//! softirqs of its CPU, read before and after each timed call outside the timed region.

/// A reading of `/proc/thread-self/schedstat`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sched {
    /// Nanoseconds this thread has waited on a run queue (second field).
    pub waited_ns: u64,
    /// Times it has been put on a CPU (third field).
    pub switches: u64,
    /// Page faults of this thread, minor and major (`/proc/thread-self/stat`, fields 10 and
    /// 12): first touches of fresh memory, which a growing state pays and a steady one does
    /// not, and pages read back.
    pub minflt: u64,
    /// This thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`), nanoseconds.
    pub cpu_ns: u64,
    /// The CPU it last ran on (`/proc/thread-self/stat`, field 39).
    pub cpu: u32,
    /// Softirqs handled on that CPU so far (its column of `/proc/softirqs`, summed). The
    /// kernel here does not account interrupt time apart (no `CONFIG_IRQ_TIME_ACCOUNTING`),
    /// so a softirq that runs on the thread's CPU during a call (network receive for other
    /// processes, timers, RCU) counts as the thread's CPU time.
    pub softirqs: u64,
}

/// This thread's CPU time, nanoseconds (0 if the clock cannot be read).
fn thread_cpu_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// Reads this thread's scheduler statistics, before and after each timed call: a change means
/// the call was preempted, and the waiting time is not the core's. Reads zeros where the file
/// does not exist (not Linux, or no schedstats), so on-CPU time is then the wall time.
pub struct SchedProbe {
    file: Option<std::fs::File>,
    stat: Option<std::fs::File>,
    softirqs: Option<std::fs::File>,
}

impl SchedProbe {
    pub fn open() -> Self {
        Self {
            file: std::fs::File::open("/proc/thread-self/schedstat").ok(),
            stat: std::fs::File::open("/proc/thread-self/stat").ok(),
            softirqs: std::fs::File::open("/proc/softirqs").ok(),
        }
    }

    pub fn is_available(&self) -> bool {
        self.file.is_some()
    }

    /// A reading before the timed call (`before`: the thread CPU clock is read last, right
    /// before the call) or after it (read first), so the probe's own reads are not timed.
    pub fn read(&self, before: bool) -> Sched {
        let cpu = if before { 0 } else { thread_cpu_ns() };
        let mut sched = self.read_files();
        sched.cpu_ns = if before { thread_cpu_ns() } else { cpu };
        sched
    }

    fn read_files(&self) -> Sched {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.file else {
            return Sched::default();
        };
        let mut buf = [0u8; 128];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
        let mut fields = text
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0));
        let (waited_ns, switches) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
        let (minflt, cpu) = self.read_stat();
        Sched {
            waited_ns,
            switches,
            minflt,
            cpu_ns: 0,
            cpu,
            softirqs: self.read_softirqs(cpu),
        }
    }

    /// Fields 10 + 12 (minor and major faults: a major one reads a page back, e.g. code the
    /// host's memory reclaim dropped) and 39 (last CPU) of `/proc/thread-self/stat` (the 8th,
    /// 10th and 37th after the `)` closing the command name), 0 if unreadable.
    fn read_stat(&self) -> (u64, u32) {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.stat else {
            return (0, 0);
        };
        let mut buf = [0u8; 512];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
        let after = text.rsplit_once(')').map_or("", |(_, rest)| rest);
        let mut fields = after.split_whitespace();
        let minflt: u64 = fields.nth(7).and_then(|f| f.parse().ok()).unwrap_or(0);
        let majflt: u64 = fields.nth(1).and_then(|f| f.parse().ok()).unwrap_or(0);
        let cpu = fields.nth(26).and_then(|f| f.parse().ok()).unwrap_or(0);
        (minflt + majflt, cpu)
    }

    /// The softirqs handled on `cpu` so far, all kinds summed (0 if unreadable).
    fn read_softirqs(&self, cpu: u32) -> u64 {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.softirqs else {
            return 0;
        };
        let mut buf = [0u8; 4096];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
        text.lines()
            .skip(1)
            .filter_map(|line| {
                line.split_whitespace()
                    .nth(1 + cpu as usize)?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}
