//! RT-BOINC's micro-benchmark: the worst case of every core operation.
//!
//! For each operation of [`rig::Op`] (submit, assign, complete, cancel, worker lost, lease
//! expiry, time-limit tick, deadline tick, hedge tick) on cores holding 10^3, 10^5 and 10^6
//! queued tasks with 10, 1,000 and 10,000 busy workers, it times single `Core::handle` calls,
//! each undone outside the timed region so the state keeps its size, records every one in an
//! HdrHistogram, and prints mean, p99, p99.9 and max per operation and size (with the runs over
//! issue 17's bar of 100 us on CPU, how many of those took a page fault, and the page faults per
//! run), then for each operation the worst case at 10^6 over that at 10^3. The bar: no
//! operation scans all tasks, packages or workers, so that ratio stays within 3x.
//!
//! A shared VM disturbs the max most, so three things keep the noise out of the verdict:
//!
//! * **interleaving**: each operation runs in blocks that alternate over all the cores, so a
//!   burst of background load hits every size alike;
//! * **on-CPU time**, measured two ways: the wall time less the time the thread waited on a
//!   run queue during the call (from `/proc/thread-self/schedstat`, read outside the timed
//!   region), and the thread's own CPU clock (`CLOCK_THREAD_CPUTIME_ID`, read right next to
//!   the call), which counts the kernel's time in the thread's page faults but neither a
//!   preemption, a whole 4 ms tick here, nor time the hypervisor stole from the vCPU;
//! * **rounds**: the whole grid runs several times on freshly built cores. Each round replays
//!   the same operations on the same states, so a worst case of the core (a scan, a table
//!   that grows) comes back at the same run of every round, while an interrupt or a stolen
//!   vCPU does not. The verdict uses the *recurring max*: over the runs, the largest of each
//!   run's smallest on-CPU time across the rounds.
//!
//! The machine's own floor is timed the same way, once after every timed call of the core
//! (interleaved: the machine's excursions in the very same seconds as the core's), and
//! printed next to the steady cells and next to the growing case.
//!
//! ```text
//! cargo bench -p rtpool-core --bench worst_case               # full grid, 3 rounds, ~1 min
//! cargo bench -p rtpool-core --bench worst_case -- --quick    # small grid, under a second
//! RTPOOL_WORST_CASE_JSON=wc.json cargo bench ...              # the figures as JSON too
//! RTPOOL_WORST_CASE_ROUNDS=5 cargo bench ...                  # more rounds
//! RTPOOL_WORST_CASE_GROWTH_ONLY=1 cargo bench ...             # the growing case only
//! RTPOOL_WORST_CASE_PREPARE=0 cargo bench ...                 # growth without Core::prepare
//! RTPOOL_WORST_CASE_LOCK=1 cargo bench ...                    # memory locked first
//! ```
//!
//! By default nothing is done to the memory: no allocator tuning, no heap faulted in ahead, as
//! in a normal-mode master, whose growing calls take about 0.002 page faults each at 10^6
//! queued tasks (first touches of a grown table's pages, tens to hundreds of microseconds each
//! on a VM whose host backs a page on its first use). `RTPOOL_WORST_CASE_LOCK=1` locks the
//! memory first (`mlockall(MCL_CURRENT | MCL_FUTURE)`), as the master does in real-time mode:
//! every page is then faulted in when it is mapped, and the growing calls take no page fault.
//! The runs over 100 us that remain are then the machine's, at the rate of the floor below
//! (docs/benchmarks.md has both).
//!
//! `--test` (what `cargo bench -- --test` passes every bench) runs the quick grid, as does
//! `RTPOOL_WORST_CASE_QUICK=1`. Wall-clock time comes from `std::time::Instant`: this is a
//! bench, not the core.

#[path = "../rig/mod.rs"]
mod rig;

mod cell;
mod hetero;
mod plan;
mod probe;
mod report;
mod run;

use std::time::Instant as WallClock;

use cell::Cell;
use plan::{lock_memory, Plan};
use probe::SchedProbe;

fn main() {
    let plan = Plan::from_env();
    let locked = lock_memory();
    let probe = SchedProbe::open();
    let started = WallClock::now();
    let load_before = report::load_average();
    report::print_header(&plan, &locked, &probe, &load_before);
    let mut cells = run::cells(&plan);
    let mut totals = run::rounds(&plan, &probe, &mut cells);
    let hetero = hetero::run(&plan, &probe, &mut totals.steady_floor);

    let (steady, growth): (Vec<&Cell>, Vec<&Cell>) = cells.iter().partition(|c| !c.growing);
    report::print_table(
        "Steady state: one `Core::handle` call per run, undone outside the timing",
        &steady,
    );
    report::print_table(
        "Growth: submission of a 100-task package, not undone, until the queue has doubled",
        &growth,
    );
    let ratio_json = report::ratios(&plan, &cells);
    hetero::print(&hetero, &cells);
    report::print_bar(&plan, &cells);
    report::print_floor(&cells, &totals);
    if plan.quick {
        println!(
            "\n(quick grid: a smoke test of the bench, not a measurement: verdicts mean nothing)"
        );
    }
    report::print_ticks(&totals);
    let load_after = report::load_average();
    let elapsed = started.elapsed().as_secs_f64();
    println!("load average after: {load_after}; total {elapsed:.1} s");

    if let Ok(path) = std::env::var("RTPOOL_WORST_CASE_JSON") {
        let doc = serde_json::json!({
            "quick": plan.quick,
            "rounds": plan.rounds,
            "prepare": plan.prepare,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "seconds": elapsed,
            "cells": cells.iter().map(report::cell_json).collect::<Vec<_>>(),
            "ratios": ratio_json,
            "heterogeneous": hetero::json(&hetero),
            "deadline_ticks": totals.deadline_ticks,
            "hedge_ticks": totals.hedge_ticks,
            "sink_extra_tasks": totals.sink_extra,
            "floor_interleaved_with_steady": totals.steady_floor.json(),
            "floor_interleaved_with_growth": totals.growth_floor.json(),
        });
        let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
        std::fs::write(&path, text + "\n")
            .unwrap_or_else(|e| panic!("cannot write RTPOOL_WORST_CASE_JSON={path}: {e}"));
        println!("JSON written to {path}");
    }
}
