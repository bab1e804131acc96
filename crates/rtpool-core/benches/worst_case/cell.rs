//! The figures of one operation on one core size ([`Cell`]) and of the machine's own floor
//! ([`Floor`]), and the bar of issue 17 they are counted against.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::probe::{Sched, SchedProbe};
use crate::rig::Op;

/// The bar of issue 17: no single scheduler operation over 100 us on CPU at any size. Runs over
/// it are counted per cell: a cost of the core shows as more of them at the larger sizes, or in
/// the growing row than in the steady one; noise hits every cell alike.
pub const BAR_NS: u64 = 100_000;

/// The figures of one operation on one core size, over all rounds.
pub struct Cell {
    pub op: Op,
    /// Set for the growth runs (submissions that are not undone).
    pub growing: bool,
    pub queued: usize,
    pub workers: usize,
    /// Wall time of every run.
    pub wall: Histogram<u64>,
    /// Wall time less the run-queue wait of every run.
    pub on_cpu: Histogram<u64>,
    /// Thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) of every run.
    pub thread_cpu: Histogram<u64>,
    /// Runs over [`BAR_NS`] of thread CPU time; of those, the runs with a page fault, and the
    /// runs without one during which a softirq ran on the thread's CPU.
    pub over_bar_cpu: (u64, u64, u64),
    /// On-CPU time of each run, by round, in run order.
    pub runs: Vec<Vec<u64>>,
    /// Runs during which the thread was scheduled out.
    pub descheduled: u64,
    /// Runs over [`BAR_NS`] on CPU (the bar: no single operation over 100 us).
    pub over_bar: u64,
    /// Of those, runs that took a minor page fault.
    pub over_bar_faulted: u64,
    /// Minor page faults over all runs.
    pub faults: u64,
}

impl Cell {
    pub fn new(op: Op, growing: bool, queued: usize, workers: usize) -> Self {
        Self {
            op,
            growing,
            queued,
            workers,
            wall: histogram(),
            on_cpu: histogram(),
            thread_cpu: histogram(),
            over_bar_cpu: (0, 0, 0),
            runs: Vec::new(),
            descheduled: 0,
            over_bar: 0,
            over_bar_faulted: 0,
            faults: 0,
        }
    }

    pub fn start_round(&mut self) {
        self.runs.push(Vec::new());
    }

    pub fn record(&mut self, (elapsed, before, after): (Duration, Sched, Sched)) {
        let wall = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let waited = after.waited_ns.saturating_sub(before.waited_ns);
        let on_cpu = wall.saturating_sub(waited).max(1);
        let cpu = after.cpu_ns.saturating_sub(before.cpu_ns).max(1);
        self.wall.saturating_record(wall);
        self.on_cpu.saturating_record(on_cpu);
        self.thread_cpu.saturating_record(cpu);
        if after.switches != before.switches {
            self.descheduled += 1;
        }
        let faults = after.minflt.saturating_sub(before.minflt);
        self.faults += faults;
        if on_cpu > BAR_NS {
            self.over_bar += 1;
            self.over_bar_faulted += u64::from(faults > 0);
        }
        if cpu > BAR_NS {
            let softirq = after.cpu == before.cpu && after.softirqs > before.softirqs;
            self.over_bar_cpu.0 += 1;
            self.over_bar_cpu.1 += u64::from(faults > 0);
            self.over_bar_cpu.2 += u64::from(faults == 0 && softirq);
        }
        self.runs
            .last_mut()
            .expect("a round was started")
            .push(on_cpu);
    }

    /// The worst case that recurs: the largest, over the runs, of a run's smallest on-CPU time
    /// over the rounds. Rounds replay the same operations on the same states, so a cost of the
    /// core comes back at the same run of every round; a preemption, an interrupt or a stolen
    /// vCPU does not.
    pub fn recurring_max(&self) -> u64 {
        let n = self.runs.iter().map(Vec::len).min().unwrap_or(0);
        (0..n)
            .map(|i| self.runs.iter().map(|r| r[i]).min().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Each round's largest on-CPU time.
    pub fn round_max(&self) -> Vec<u64> {
        self.runs
            .iter()
            .map(|r| r.iter().copied().max().unwrap_or(0))
            .collect()
    }

    pub fn name(&self) -> String {
        if self.growing {
            format!("{}, growing", self.op.name())
        } else {
            self.op.name().to_owned()
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// The machine's own floor, measured the same way in the same run: a fixed computation of a
/// few microseconds, timed by the same probe on the same thread as often as the core's calls
/// were. Whatever of it goes over [`BAR_NS`] is the VM (a stolen vCPU, an interrupt), not the
/// core: the core's runs over the bar are judged next to this count.
pub struct Floor {
    pub thread_cpu: Histogram<u64>,
    /// Runs over [`BAR_NS`] of thread CPU time, and of those the runs with a page fault.
    pub over_bar: (u64, u64),
}

impl Floor {
    pub fn new() -> Self {
        Self {
            thread_cpu: histogram(),
            over_bar: (0, 0),
        }
    }

    /// Times the fixed computation once over `data` (512 values).
    pub fn run_once(&mut self, probe: &SchedProbe, data: &[u64]) {
        let before = probe.read(true);
        let mut acc = 0u64;
        for round in 0..4u64 {
            for &x in std::hint::black_box(data) {
                acc = acc.wrapping_mul(31).wrapping_add(x ^ round);
            }
        }
        std::hint::black_box(acc);
        let after = probe.read(false);
        let cpu = after.cpu_ns.saturating_sub(before.cpu_ns).max(1);
        self.thread_cpu.saturating_record(cpu);
        if cpu > BAR_NS {
            self.over_bar.0 += 1;
            self.over_bar.1 += u64::from(after.minflt > before.minflt);
        }
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "runs": self.thread_cpu.len(),
            "p50_thread_cpu_ns": self.thread_cpu.value_at_quantile(0.5),
            "p999_thread_cpu_ns": self.thread_cpu.value_at_quantile(0.999),
            "max_thread_cpu_ns": self.thread_cpu.max(),
            "runs_over_100us_thread_cpu": self.over_bar.0,
            "runs_over_100us_thread_cpu_with_page_fault": self.over_bar.1,
        })
    }
}

/// Seconds of thread CPU time a histogram's runs took together (the time an interrupt or a
/// stolen vCPU had to land in them: a longer call is hit more often).
pub fn exposure_s(h: &Histogram<u64>) -> f64 {
    h.mean() * h.len() as f64 / 1e9
}

/// The values the floor's computation runs over.
pub fn floor_data() -> Vec<u64> {
    (0..512).collect()
}
