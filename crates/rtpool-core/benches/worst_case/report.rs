//! What the bench prints and writes: the tables, the ratios of the largest size over the
//! smallest, issue 17's bar, and each cell as JSON.

use serde_json::json;

use crate::cell::{exposure_s, Cell};
use crate::plan::Plan;
use crate::probe::SchedProbe;
use crate::rig::Op;
use crate::run::Totals;

/// `1.23 us` style, three significant digits.
pub fn fmt_ns(ns: f64) -> String {
    let (value, unit) = match ns {
        n if n < 1e3 => (n, "ns"),
        n if n < 1e6 => (n / 1e3, "us"),
        n if n < 1e9 => (n / 1e6, "ms"),
        n => (n / 1e9, "s"),
    };
    match value {
        v if v >= 100.0 => format!("{v:.0} {unit}"),
        v if v >= 10.0 => format!("{v:.1} {unit}"),
        v => format!("{v:.2} {unit}"),
    }
}

/// `10^6` for powers of ten from 100, the number otherwise.
pub fn fmt_count(n: usize) -> String {
    let (mut m, mut p) = (n, 0);
    while m >= 10 && m % 10 == 0 {
        m /= 10;
        p += 1;
    }
    if m == 1 && p >= 2 {
        format!("10^{p}")
    } else {
        n.to_string()
    }
}

pub fn print_table(title: &str, cells: &[&Cell]) {
    println!("\n{title}\n");
    println!(
        "| operation | tasks queued | workers | runs | mean | p99 | p99.9 | max | max on CPU | \
         recurring max | runs > 100 us on CPU (with a page fault) | max thread CPU | \
         runs > 100 us thread CPU (with a page fault; else with a softirq) | page faults / run |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for c in cells {
        let h = &c.wall;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} ({}; {}) | {:.2} |",
            c.name(),
            fmt_count(c.queued),
            fmt_count(c.workers),
            h.len(),
            fmt_ns(h.mean()),
            fmt_ns(h.value_at_quantile(0.99) as f64),
            fmt_ns(h.value_at_quantile(0.999) as f64),
            fmt_ns(h.max() as f64),
            fmt_ns(c.on_cpu.max() as f64),
            fmt_ns(c.recurring_max() as f64),
            c.over_bar,
            c.over_bar_faulted,
            fmt_ns(c.thread_cpu.max() as f64),
            c.over_bar_cpu.0,
            c.over_bar_cpu.1,
            c.over_bar_cpu.2,
            c.faults as f64 / h.len().max(1) as f64,
        );
    }
}

/// Issue 17's bar side by side: for each core, the steady operations' worst (max thread CPU
/// over every operation, and which) next to the growing submission's, with the runs over
/// 100 us of thread CPU (and of those, the runs that took a page fault, and the others during
/// which a softirq ran on the thread's CPU).
pub fn print_bar(plan: &Plan, cells: &[Cell]) {
    println!(
        "\nThe bar (issue 17): max thread CPU of every operation under 100 us, growing case \
         included; steady next to growing:\n"
    );
    println!(
        "| tasks queued | workers | steady: max thread CPU (operation) | steady: runs > 100 us \
         (with a page fault; else with a softirq) | growing: max thread CPU | growing: runs > \
         100 us (with a page fault; else with a softirq) | growing: page faults / run |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let (mut over, mut runs) = (0, 0);
    for &n in &plan.sizes {
        for &w in &plan.workers {
            let of = |growing: bool| {
                cells
                    .iter()
                    .filter(move |c| c.growing == growing && c.queued == n && c.workers == w)
                    .filter(|c| !c.thread_cpu.is_empty())
            };
            // `-` for the steady side with `RTPOOL_WORST_CASE_GROWTH_ONLY=1`.
            let worst = of(false).max_by_key(|c| c.thread_cpu.max()).map_or_else(
                || "-".to_owned(),
                |c| format!("{} ({})", fmt_ns(c.thread_cpu.max() as f64), c.name()),
            );
            let steady_over = of(false).fold((0, 0, 0), |a, c| {
                let o = c.over_bar_cpu;
                (a.0 + o.0, a.1 + o.1, a.2 + o.2)
            });
            let Some(grow) = of(true).next() else {
                continue;
            };
            over += steady_over.0 + grow.over_bar_cpu.0;
            runs += of(false).map(|c| c.thread_cpu.len()).sum::<u64>() + grow.thread_cpu.len();
            println!(
                "| {} | {} | {} | {} ({}; {}) | {} | {} ({}; {}) | {:.3} |",
                fmt_count(n),
                fmt_count(w),
                worst,
                steady_over.0,
                steady_over.1,
                steady_over.2,
                fmt_ns(grow.thread_cpu.max() as f64),
                grow.over_bar_cpu.0,
                grow.over_bar_cpu.1,
                grow.over_bar_cpu.2,
                grow.faults as f64 / grow.thread_cpu.len().max(1) as f64,
            );
        }
    }
    println!(
        "\n{over} of {runs} runs over 100 us of thread CPU. A run over it without a page fault \
         is the core's cost or the machine's: this kernel counts the softirqs that run on the \
         thread's CPU as its CPU time (no CONFIG_IRQ_TIME_ACCOUNTING); otherwise repeat the \
         cell: one that does not come back in every round (recurring max) is not the core's"
    );
}

/// `b / a`, with a floor of 1 on `a`.
fn ratio(b: f64, a: f64) -> f64 {
    b / a.max(1.0)
}

/// For each operation and worker count, the figures at the largest size over those at the
/// smallest; prints one line per operation and returns them as JSON.
pub fn ratios(plan: &Plan, cells: &[Cell]) -> Vec<serde_json::Value> {
    let (small, large) = (plan.sizes[0], *plan.sizes.last().expect("sizes"));
    let find = |op: Op, growing: bool, n: usize, w: usize| {
        cells
            .iter()
            .find(|c| c.op == op && c.growing == growing && c.queued == n && c.workers == w)
    };
    let mut kinds: Vec<(Op, bool)> = cells.iter().map(|c| (c.op, c.growing)).collect();
    kinds.dedup();
    let mut json = Vec::new();
    println!(
        "\nRecurring max at {} / at {} (in brackets: max on CPU, max of wall time, p99.9, \
         mean):\n",
        fmt_count(large),
        fmt_count(small)
    );
    for (op, growing) in kinds {
        let mut parts = Vec::new();
        let mut worst: f64 = 0.0;
        let mut name = String::new();
        for &w in &plan.workers {
            let (Some(a), Some(b)) = (find(op, growing, small, w), find(op, growing, large, w))
            else {
                continue;
            };
            name = a.name();
            let recurring = ratio(b.recurring_max() as f64, a.recurring_max() as f64);
            let on_cpu = ratio(b.on_cpu.max() as f64, a.on_cpu.max() as f64);
            let wall = ratio(b.wall.max() as f64, a.wall.max() as f64);
            let p999 = ratio(
                b.wall.value_at_quantile(0.999) as f64,
                a.wall.value_at_quantile(0.999) as f64,
            );
            let mean = ratio(b.wall.mean(), a.wall.mean());
            worst = worst.max(recurring);
            parts.push(format!(
                "W={} {recurring:.2} ({on_cpu:.2}, {wall:.2}, {p999:.2}, {mean:.2})",
                fmt_count(w)
            ));
            json.push(json!({
                "operation": op.slug(), "growing": growing, "workers": w,
                "recurring_max_ratio": recurring, "max_on_cpu_ratio": on_cpu,
                "max_ratio": wall, "p999_ratio": p999, "mean_ratio": mean,
            }));
        }
        let verdict = if worst <= 3.0 { "within 3x" } else { "OVER 3x" };
        println!("- {name}: {} -- {verdict}", parts.join("; "));
    }
    json
}

pub fn cell_json(c: &Cell) -> serde_json::Value {
    let h = &c.wall;
    json!({
        "operation": c.op.slug(), "name": c.name(), "growing": c.growing,
        "tasks_queued": c.queued, "workers": c.workers, "runs": h.len(),
        "mean_ns": h.mean(), "p99_ns": h.value_at_quantile(0.99),
        "p999_ns": h.value_at_quantile(0.999), "max_ns": h.max(),
        "max_on_cpu_ns": c.on_cpu.max(), "round_max_on_cpu_ns": c.round_max(),
        "recurring_max_ns": c.recurring_max(), "descheduled_runs": c.descheduled,
        "runs_over_100us_on_cpu": c.over_bar,
        "runs_over_100us_with_page_fault": c.over_bar_faulted, "minor_faults": c.faults,
        "max_thread_cpu_ns": c.thread_cpu.max(),
        "p999_thread_cpu_ns": c.thread_cpu.value_at_quantile(0.999),
        "runs_over_100us_thread_cpu": c.over_bar_cpu.0,
        "runs_over_100us_thread_cpu_with_page_fault": c.over_bar_cpu.1,
        "runs_over_100us_thread_cpu_with_softirq_no_fault": c.over_bar_cpu.2,
    })
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The first lines: which grid, how many rounds, the memory and the probe.
pub fn print_header(
    plan: &Plan,
    locked: &Result<bool, nix::Error>,
    probe: &SchedProbe,
    load_before: &str,
) {
    println!(
        "worst_case: {} grid, {} round(s), Core::prepare between growing submissions: {}, \
         load average before: {load_before}",
        if plan.quick { "quick" } else { "full" },
        plan.rounds,
        if plan.prepare { "yes" } else { "no" }
    );
    match locked {
        Ok(true) => println!("  memory locked (mlockall), as the --realtime master's"),
        Ok(false) => println!(
            "  memory not locked, as a normal master's (RTPOOL_WORST_CASE_LOCK=1 locks it)"
        ),
        Err(e) => println!("  memory not locked, as a normal master's: mlockall refused ({e})"),
    }
    if !probe.is_available() {
        println!("  no /proc/thread-self/schedstat: on-CPU time is wall time");
    }
}

/// The machine's floor next to the core's runs over the bar, steady and growing.
pub fn print_floor(cells: &[Cell], totals: &Totals) {
    let steady_floor = &totals.steady_floor;
    println!(
        "\nMachine floor, same probe and thread, interleaved: after every timed call of the \
         core, a fixed computation (2,048 multiply-adds) timed once. Steady cells: {} runs, p50 \
         {}, p99.9 {}, max {} thread CPU, runs over 100 us: {} (with a page fault: {}). Runs of \
         the core over 100 us without a page fault, at about the floor's rate and in no fixed \
         cell, are the machine's.",
        steady_floor.thread_cpu.len(),
        fmt_ns(steady_floor.thread_cpu.value_at_quantile(0.5) as f64),
        fmt_ns(steady_floor.thread_cpu.value_at_quantile(0.999) as f64),
        fmt_ns(steady_floor.thread_cpu.max() as f64),
        steady_floor.over_bar.0,
        steady_floor.over_bar.1,
    );
    for (what, growing, floor) in [
        ("steady cells", false, steady_floor),
        ("growing case", true, &totals.growth_floor),
    ] {
        let mine: Vec<&Cell> = cells.iter().filter(|c| c.growing == growing).collect();
        let runs: u64 = mine.iter().map(|c| c.thread_cpu.len()).sum();
        let over: u64 = mine.iter().map(|c| c.over_bar_cpu.0).sum();
        let faulted: u64 = mine.iter().map(|c| c.over_bar_cpu.1).sum();
        let exposed: f64 = mine.iter().map(|c| exposure_s(&c.thread_cpu)).sum();
        println!(
            "{what}: {over} of {runs} runs over 100 us of thread CPU ({faulted} with a page \
             fault), {:.2} per second of thread CPU; the floor interleaved with them: {} of {}, \
             {:.2} per second (max {}).",
            over as f64 / exposed.max(1e-9),
            floor.over_bar.0,
            floor.thread_cpu.len(),
            floor.over_bar.0 as f64 / exposure_s(&floor.thread_cpu).max(1e-9),
            fmt_ns(floor.thread_cpu.max() as f64),
        );
    }
}

/// The rigs' tick counters: what the deadline and hedge ticks did, and the sink's extra tasks.
pub fn print_ticks(totals: &Totals) {
    println!(
        "\ndeadline ticks: {}, each dropped its package's {} tasks \
         (core.stats().deadline_dropped checked); hedge ticks: {}, each fired one \
         straggler check and re-armed it; tasks the sink took besides lost workers' ones: \
         {}",
        totals.deadline_ticks,
        crate::rig::DEADLINE_TASKS,
        totals.hedge_ticks,
        totals.sink_extra,
    );
}
