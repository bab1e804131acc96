//! Criterion benches of single core operations with 10^3, 10^5 and 10^6 tasks already queued
//! (10^6 is left out under `--test`, where only compiling and one pass matter).
//!
//! Each bench times one `handle` call and undoes its effect outside the timed region (cancel
//! the submitted package, return the assigned task, refill the queue), so the state size stays
//! put however many iterations criterion runs. The claim under test is the RT-BOINC one: the
//! cost of an operation does not grow with the number of queued tasks.
//!
//! `submit`, `assign` and `complete` use a core with one client and one worker; the `ops` group
//! runs every operation of the `worst_case` bench (`rig::Op`) on its rig's core (4 users, 1,000
//! busy workers) and gives their means. The worst case (max, p99.9) is `worst_case`'s job.

// `criterion_group!` defines an undocumented `pub fn benches`.
#![allow(missing_docs)]

// Shared with `worst_case`, which uses more of it.
#[allow(dead_code)]
mod rig;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant as WallClock};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rtpool_core::{
    Action, ClientId, Core, CoreConfig, Event, FnHash, Instant, PackageId, PackageOpts, TaskId,
    TaskStatus, UserId, WorkerId, WorkerKey, WorkerOutcome,
};

const CLIENT: ClientId = ClientId(1);
const WORKER: WorkerId = WorkerId(1);
/// Workers of the `ops` group's cores.
const OPS_WORKERS: usize = 1_000;

/// Queued tasks of each bench's core: 10^3, 10^5 and 10^6, without 10^6 under `--test`
/// (building that core takes longer than the single pass `--test` makes).
fn queued_sizes() -> Vec<usize> {
    if std::env::args().any(|a| a == "--test") {
        vec![1_000, 100_000]
    } else {
        vec![1_000, 100_000, 1_000_000]
    }
}

/// Package ids are never reused: each submission takes the next one.
static NEXT_PACKAGE: AtomicU64 = AtomicU64::new(1);

fn submit_event(tasks: usize) -> Event {
    Event::Submit {
        client: CLIENT,
        req_id: 1,
        package: PackageId(NEXT_PACKAGE.fetch_add(1, Ordering::Relaxed)),
        fn_hash: FnHash([7; 32]),
        fn_code: Bytes::from_static(b"def f(x): return x"),
        opts: PackageOpts::default(),
        tasks: vec![Bytes::from_static(b"args"); tasks],
    }
}

fn handle(core: &mut Core, event: Event) -> Vec<Action> {
    let mut out = Vec::new();
    core.handle(event, Instant(0), &mut out);
    out
}

fn accepted(out: &[Action]) -> PackageId {
    match out.first() {
        Some(Action::Accepted { package, .. }) => *package,
        other => panic!("not accepted: {other:?}"),
    }
}

/// The single task of the single `Assign` in `out`.
fn assigned(out: &[Action]) -> (TaskId, u32) {
    match out {
        [Action::Assign { tasks, .. }] if tasks.len() == 1 => (tasks[0].task, tasks[0].attempt),
        other => panic!("one assignment expected: {other:?}"),
    }
}

/// A core with one client, one worker without credits, and `queued` tasks in the queue.
fn core_with_queue(queued: usize) -> Core {
    let mut core = Core::new(CoreConfig::default());
    handle(
        &mut core,
        Event::ClientJoined {
            client: CLIENT,
            user: UserId(1),
        },
    );
    handle(
        &mut core,
        Event::WorkerJoined {
            worker: WORKER,
            slots: 1,
            key: WorkerKey(WORKER.0),
            resources: Default::default(),
            labels: Default::default(),
        },
    );
    handle(&mut core, submit_event(queued));
    core
}

/// Times `op` on a core with `queued` tasks; `undo` runs untimed after each call.
fn timed(
    core: &mut Core,
    iters: u64,
    mut op: impl FnMut(&mut Core) -> Vec<Action>,
    mut undo: impl FnMut(&mut Core, Vec<Action>),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = WallClock::now();
        let out = black_box(op(core));
        total += start.elapsed();
        undo(core, out);
    }
    total
}

fn submit(c: &mut Criterion) {
    let mut group = c.benchmark_group("submit");
    for queued in queued_sizes() {
        for size in [1, 1_000] {
            let mut core = core_with_queue(queued);
            group.bench_function(BenchmarkId::new(format!("{size}_tasks"), queued), |b| {
                b.iter_custom(|iters| {
                    let undo = |core: &mut Core, out: Vec<Action>| {
                        let package = accepted(&out);
                        handle(
                            core,
                            Event::Cancel {
                                client: CLIENT,
                                package,
                                indices: vec![],
                            },
                        );
                    };
                    timed(
                        &mut core,
                        iters,
                        |core| handle(core, submit_event(size)),
                        undo,
                    )
                })
            });
        }
    }
    group.finish();
}

fn assign(c: &mut Criterion) {
    let mut group = c.benchmark_group("assign");
    for queued in queued_sizes() {
        let mut core = core_with_queue(queued);
        group.bench_function(BenchmarkId::from_parameter(queued), |b| {
            b.iter_custom(|iters| {
                let undo = |core: &mut Core, out: Vec<Action>| {
                    let tasks = vec![assigned(&out)];
                    handle(
                        core,
                        Event::Returned {
                            worker: WORKER,
                            tasks,
                        },
                    );
                };
                timed(
                    &mut core,
                    iters,
                    |core| {
                        handle(
                            core,
                            Event::Credit {
                                worker: WORKER,
                                credits: 1,
                            },
                        )
                    },
                    undo,
                )
            })
        });
    }
    group.finish();
}

/// Answers the running task (timed), then acknowledges the result, queues one more task and
/// assigns the next (untimed), so the queue keeps its size.
fn complete_once(core: &mut Core, running: &mut (TaskId, u32)) -> Duration {
    let (task, attempt) = *running;
    let data = Bytes::from_static(b"ok");
    let result = WorkerOutcome {
        task,
        attempt,
        status: TaskStatus::Ok,
        data,
        exec_us: 1,
        wait_us: 1,
        flush_us: 1,
    };
    let event = Event::Results {
        worker: WORKER,
        results: vec![result],
    };
    let start = WallClock::now();
    let out = black_box(handle(core, event));
    let elapsed = start.elapsed();
    // The client acknowledges the result (untimed), so the package is freed.
    for action in out {
        if let Action::SendResults {
            client: Some(client),
            package,
            results,
            ..
        } = action
        {
            let count = results.len() as u64;
            handle(
                core,
                Event::Ack {
                    client,
                    package,
                    count,
                },
            );
        }
    }
    handle(core, submit_event(1));
    *running = assigned(&handle(
        core,
        Event::Credit {
            worker: WORKER,
            credits: 1,
        },
    ));
    elapsed
}

fn complete(c: &mut Criterion) {
    let mut group = c.benchmark_group("complete");
    for queued in queued_sizes() {
        let mut core = core_with_queue(queued);
        let mut running = assigned(&handle(
            &mut core,
            Event::Credit {
                worker: WORKER,
                credits: 1,
            },
        ));
        group.bench_function(BenchmarkId::from_parameter(queued), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| complete_once(&mut core, &mut running))
                    .sum()
            })
        });
    }
    group.finish();
}

/// Every operation of the worst-case rig, one core per size.
fn ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("ops");
    // The untimed undo costs up to a few times the timed call: keep criterion's time short.
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(500));
    for queued in queued_sizes() {
        let mut rig = rig::Rig::new(queued, OPS_WORKERS);
        for op in rig::Op::ALL {
            group.bench_function(BenchmarkId::new(op.slug(), queued), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| rig.step(op)).sum())
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = submit, assign, complete, ops
}
criterion_main!(benches);
