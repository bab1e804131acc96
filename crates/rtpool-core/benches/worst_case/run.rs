//! Running the grid: building each round's cores, timing every operation on them in
//! interleaved blocks, and the growing case.

use std::time::{Duration, Instant as WallClock};

use crate::cell::{floor_data, Cell, Floor};
use crate::plan::Plan;
use crate::probe::SchedProbe;
use crate::rig::{Op, Rig};

/// The cores of one round: `(queued, workers, rig)`, in plan order.
pub type Rigs = Vec<(usize, usize, Rig)>;

fn build_rigs(plan: &Plan, round: usize) -> Rigs {
    let started = WallClock::now();
    let mut rigs = Vec::new();
    for &n in &plan.sizes {
        for &w in &plan.workers {
            rigs.push((n, w, Rig::new(n, w)));
        }
    }
    eprintln!(
        "round {}: built {} cores in {:.2} s",
        round + 1,
        rigs.len(),
        started.elapsed().as_secs_f64()
    );
    rigs
}

/// Times `op` on every core, interleaved in blocks; `cells` are the op's, in `rigs` order.
///
/// After each timed call, `floor` times its fixed computation once (outside the call's timing).
pub fn run_op(
    plan: &Plan,
    probe: &SchedProbe,
    op: Op,
    rigs: &mut Rigs,
    cells: &mut [Cell],
    floor: &mut Floor,
) {
    let (count, blocks, warm_up) = (plan.iterations, plan.blocks, plan.warm_up);
    let data = floor_data();
    for (_, _, rig) in rigs.iter_mut() {
        (0..warm_up).for_each(|_| {
            rig.step(op);
        });
    }
    cells.iter_mut().for_each(Cell::start_round);
    let per_block = count.div_ceil(blocks);
    let mut spent = vec![Duration::ZERO; rigs.len()];
    for block in 0..blocks {
        // Rotate which core goes first, so none always follows the same other one.
        for j in 0..rigs.len() {
            let c = (j + block) % rigs.len();
            if spent[c] >= plan.budget {
                continue;
            }
            let start = WallClock::now();
            for _ in 0..per_block {
                cells[c].record(rigs[c].2.step_probed(op, |b| probe.read(b)));
                floor.run_once(probe, &data);
            }
            spent[c] += start.elapsed();
        }
    }
}

/// Submits 100-task packages without undo until each core's queue has doubled: the cost of a
/// submission while the tables grow. Interleaved one call per core at a time.
///
/// After each timed submission, `floor` times its fixed computation once (untimed for the
/// core): the machine's excursions in the very same seconds, next to the growing case's.
fn run_growth(
    plan: &Plan,
    probe: &SchedProbe,
    rigs: &mut Rigs,
    cells: &mut [Cell],
    floor: &mut Floor,
) {
    let data = floor_data();
    let goals: Vec<usize> = rigs.iter().map(|(_, _, r)| 2 * r.target).collect();
    if plan.prepare {
        // The master, idle before the burst, prepares share after share until all is ready.
        for (_, _, rig) in rigs.iter_mut() {
            while rig.core.prepare(rtpool_core::Core::PREPARE_SLOTS) {}
        }
    }
    cells.iter_mut().for_each(Cell::start_round);
    let started = WallClock::now();
    let mut busy = true;
    while busy && started.elapsed() < 4 * plan.budget {
        busy = false;
        for (c, (_, _, rig)) in rigs.iter_mut().enumerate() {
            if rig.target < goals[c] {
                busy = true;
                cells[c].record(rig.grow_probed(|b| probe.read(b)));
                floor.run_once(probe, &data);
                // What the master does between events (untimed): the core's growth made ahead
                // of need, one bounded share per event (`Core::prepare`; an idle master goes
                // on until all is ready, so one share is the least it does).
                if plan.prepare {
                    rig.core.prepare(rtpool_core::Core::PREPARE_SLOTS);
                }
            }
        }
    }
}

/// What the rounds counted besides the cells: the rigs' tick counters and the machine's floor
/// interleaved with the steady and the growing runs.
pub struct Totals {
    pub deadline_ticks: u64,
    pub hedge_ticks: u64,
    pub sink_extra: u64,
    pub steady_floor: Floor,
    pub growth_floor: Floor,
}

/// Every cell of the plan: op-major, then the cores in plan order; the growth cells last.
pub fn cells(plan: &Plan) -> Vec<Cell> {
    let mut cells = Vec::new();
    for (op, growing) in Op::ALL
        .iter()
        .map(|&op| (op, false))
        .chain([(Op::Submit100, true)])
    {
        for &n in &plan.sizes {
            for &w in &plan.workers {
                cells.push(Cell::new(op, growing, n, w));
            }
        }
    }
    cells
}

/// Runs every round of the plan on freshly built cores, recording into `cells` (from
/// [`cells`]).
pub fn rounds(plan: &Plan, probe: &SchedProbe, cells: &mut [Cell]) -> Totals {
    let per_op = plan.sizes.len() * plan.workers.len();
    let mut totals = Totals {
        deadline_ticks: 0,
        hedge_ticks: 0,
        sink_extra: 0,
        steady_floor: Floor::new(),
        growth_floor: Floor::new(),
    };
    for round in 0..plan.rounds {
        let mut rigs = build_rigs(plan, round);
        // `RTPOOL_WORST_CASE_GROWTH_ONLY=1`: only the growing case (a quicker look at it).
        let ops = if std::env::var("RTPOOL_WORST_CASE_GROWTH_ONLY").is_ok_and(|v| v == "1") {
            &[][..]
        } else {
            &Op::ALL[..]
        };
        for (i, &op) in ops.iter().enumerate() {
            let t = WallClock::now();
            let op_cells = &mut cells[i * per_op..(i + 1) * per_op];
            run_op(
                plan,
                probe,
                op,
                &mut rigs,
                op_cells,
                &mut totals.steady_floor,
            );
            eprintln!("  {}: {:.2} s", op.name(), t.elapsed().as_secs_f64());
            if plan.quick {
                // The smoke test also checks that the rig leaves a consistent core (a walk over
                // the whole state: too slow for the full grid).
                for (_, _, rig) in &rigs {
                    rig.core.check_invariants();
                }
            }
        }
        for (_, _, rig) in &rigs {
            totals.deadline_ticks += rig.deadline_fired;
            totals.hedge_ticks += rig.hedge_checks;
            totals.sink_extra += rig.sink_extra;
        }
        let t = WallClock::now();
        let growth_cells = &mut cells[Op::ALL.len() * per_op..];
        run_growth(
            plan,
            probe,
            &mut rigs,
            growth_cells,
            &mut totals.growth_floor,
        );
        eprintln!("  growth: {:.2} s", t.elapsed().as_secs_f64());
    }
    totals
}
