//! The heterogeneous case: every operation on cores whose packages ask for resources, spread
//! round robin over 1, 8 or 64 resource classes (`gpu`/`mem_gb` requests every worker can
//! serve, so each worker is a server of every class and each assignment goes through class
//! dispatch), at 10^3 and 10^6 queued tasks and 1,000 busy workers, printed next to the
//! homogeneous figures of the same size. `worker joins` is the case of issue 26: a joining
//! worker of a kind that exists (the same totals as the others) joins its kind, O(1) however
//! many classes there are. At 10^3 tasks there are 10 packages of 100: 64 classes do not fit
//! in them, so that core is left out.

use serde_json::json;

use crate::cell::{Cell, Floor};
use crate::plan::Plan;
use crate::probe::SchedProbe;
use crate::report::{fmt_count, fmt_ns};
use crate::rig::{Op, Rig};
use crate::run::{run_op, Rigs};

/// The heterogeneous grid: (classes, queued tasks) pairs and the worker count.
pub struct Grid {
    pub classes: Vec<usize>,
    pub sizes: Vec<usize>,
    pub workers: usize,
}

impl Grid {
    pub fn of(plan: &Plan) -> Self {
        if plan.quick {
            Self {
                classes: vec![1, 8],
                sizes: vec![1_000],
                workers: 100,
            }
        } else {
            Self {
                classes: vec![1, 8, 64],
                sizes: vec![1_000, 1_000_000],
                workers: 1_000,
            }
        }
    }

    /// (classes, queued) of each core, in rig order. A core with fewer packages of 100 than
    /// classes is left out (`-` in the table): classes take turns, so every package would be
    /// the only one of its class and none stays whole for the cancel operations.
    fn cores(&self) -> Vec<(usize, usize)> {
        let mut cores = Vec::new();
        for &k in &self.classes {
            for &n in &self.sizes {
                if n / crate::rig::PACKAGE >= k {
                    cores.push((k, n));
                }
            }
        }
        cores
    }
}

/// The figures of the heterogeneous case: one cell per operation and core, op-major.
pub struct Hetero {
    pub grid: Grid,
    pub cells: Vec<(usize, Cell)>,
}

/// Runs every round of the heterogeneous grid on freshly built cores.
pub fn run(plan: &Plan, probe: &SchedProbe, floor: &mut Floor) -> Hetero {
    let grid = Grid::of(plan);
    let cores = grid.cores();
    let mut cells: Vec<(usize, Cell)> = Vec::new();
    for &op in &Op::ALL {
        for &(k, n) in &cores {
            cells.push((k, Cell::new(op, false, n, grid.workers)));
        }
    }
    for round in 0..plan.rounds {
        let started = std::time::Instant::now();
        let mut rigs: Rigs = cores
            .iter()
            .map(|&(k, n)| (n, grid.workers, Rig::with_classes(n, grid.workers, k)))
            .collect();
        eprintln!(
            "heterogeneous round {}: built {} cores in {:.2} s",
            round + 1,
            rigs.len(),
            started.elapsed().as_secs_f64()
        );
        for (i, &op) in Op::ALL.iter().enumerate() {
            let per_op = cores.len();
            let mut op_cells: Vec<Cell> = cells[i * per_op..(i + 1) * per_op]
                .iter_mut()
                .map(|(_, c)| std::mem::replace(c, Cell::new(op, false, 0, 0)))
                .collect();
            run_op(plan, probe, op, &mut rigs, &mut op_cells, floor);
            for (slot, cell) in cells[i * per_op..(i + 1) * per_op].iter_mut().zip(op_cells) {
                slot.1 = cell;
            }
            if plan.quick {
                for (_, _, rig) in &rigs {
                    rig.core.check_invariants();
                }
            }
        }
    }
    Hetero { grid, cells }
}

/// The recurring max of each operation per class count and size, next to the homogeneous
/// core's of the same size and worker count (`-` when the homogeneous grid has no such core).
pub fn print(h: &Hetero, homogeneous: &[Cell]) {
    println!(
        "\nHeterogeneous: packages asking for resources, spread over K classes, {} busy \
         workers serving every class; recurring max on CPU (homogeneous core of the same size \
         in brackets):\n",
        fmt_count(h.grid.workers)
    );
    let mut header = "| operation |".to_owned();
    let mut rule = "| --- |".to_owned();
    for &k in &h.grid.classes {
        for &n in &h.grid.sizes {
            header.push_str(&format!(" K={k}, {} queued |", fmt_count(n)));
            rule.push_str(" --- |");
        }
    }
    println!("{header}\n{rule}");
    for &op in &Op::ALL {
        let mut line = format!("| {} |", op.name());
        for &k in &h.grid.classes {
            for &n in &h.grid.sizes {
                let mine = h
                    .cells
                    .iter()
                    .find(|(kk, c)| *kk == k && c.op == op && c.queued == n)
                    .map_or("-".to_owned(), |(_, c)| fmt_ns(c.recurring_max() as f64));
                let base = homogeneous
                    .iter()
                    .find(|c| {
                        c.op == op && !c.growing && c.queued == n && c.workers == h.grid.workers
                    })
                    .filter(|c| !c.runs.is_empty())
                    .map_or("-".to_owned(), |c| fmt_ns(c.recurring_max() as f64));
                line.push_str(&format!(" {mine} ({base}) |"));
            }
        }
        println!("{line}");
    }
}

pub fn json(h: &Hetero) -> Vec<serde_json::Value> {
    h.cells
        .iter()
        .map(|(k, c)| {
            json!({
                "classes": k, "operation": c.op.slug(), "tasks_queued": c.queued,
                "workers": c.workers, "runs": c.wall.len(),
                "recurring_max_ns": c.recurring_max(), "max_on_cpu_ns": c.on_cpu.max(),
                "max_thread_cpu_ns": c.thread_cpu.max(), "mean_ns": c.wall.mean(),
            })
        })
        .collect()
}
