//! What metrics cost the scheduler thread, without the noise of processes and sockets.
//!
//! **Per task.** A task's whole life in the core, as the scheduler task drives it (a client
//! submits a package, a worker's credit assigns it, its result is sent, the client's `ACK`
//! frees the package), with the [`Recorder`] fed every event and action as
//! `scheduler/mod.rs` does: counting on (the default) or off (`--no-metrics`, where the
//! recorder returns at once). Packages of 1 task (the latency bench's shape) and of 64 (the
//! throughput bench's). The two variants alternate in blocks over several rounds; the figure
//! is the median over blocks of nanoseconds per task, and the on/off ratio.
//!
//! **Per second.** What the scheduler does once a second for the HTTP listener: build the
//! snapshot (`status::build`) of a master with 10,000 live packages and 100 workers; and what
//! the HTTP thread does with it (JSON, Prometheus text), for scale.
//!
//! ```text
//! cargo bench -p rtpool-master --bench status_cost            # ~10 s
//! cargo bench -p rtpool-master --bench status_cost -- --quick # under a second
//! ```
//!
//! `--test` (what `cargo bench -- --test` passes) runs the quick version.

use std::sync::Arc;
use std::time::Instant as WallClock;

use bytes::Bytes;
use rtpool_core::{
    Action, ClientId, Core, Event, FnHash, Instant, PackageId, PackageOpts, TaskStatus, UserId,
    WorkerId, WorkerKey, WorkerOutcome,
};
use rtpool_master::status::{self, MasterFacts, Recorder};

const WORKER: WorkerId = WorkerId(1);
const CLIENT: ClientId = ClientId(2);

/// A core with one client and one worker, and a recorder.
struct Rig {
    core: Core,
    recorder: Recorder,
    out: Vec<Action>,
    next_package: u64,
    now: u64,
}

impl Rig {
    fn new(metrics: bool) -> Self {
        let mut rig = Self {
            core: Core::default(),
            recorder: Recorder::new(metrics),
            out: Vec::new(),
            next_package: 1,
            now: 0,
        };
        rig.recorder.worker_joined(
            WORKER.0,
            "bench-worker".into(),
            String::new(),
            "127.0.0.1".into(),
            Instant(0),
        );
        rig.handle(Event::WorkerJoined {
            labels: Default::default(),
            resources: Default::default(),
            worker: WORKER,
            slots: 64,
            key: WorkerKey(WORKER.0),
        });
        rig.handle(Event::ClientJoined {
            client: CLIENT,
            user: UserId(0),
        });
        rig
    }

    /// One event through the recorder and the core, the way `Scheduler::apply_now` does it.
    fn handle(&mut self, event: Event) {
        self.now += 1_000;
        self.recorder
            .on_event(&event, Instant(self.now), || Some(UserId(0)));
        self.core.handle(event, Instant(self.now), &mut self.out);
        for action in self.out.drain(..) {
            self.recorder.on_action(&action);
        }
    }

    /// One package of `n` tasks from submission to its free; returns the tasks run.
    fn package(&mut self, n: usize) -> usize {
        let package = PackageId(self.next_package);
        self.next_package += 1;
        self.handle(Event::Submit {
            client: CLIENT,
            req_id: package.0,
            package,
            fn_hash: FnHash([1; 32]),
            fn_code: Bytes::from_static(b"code"),
            opts: PackageOpts::default(),
            tasks: vec![Bytes::new(); n],
        });
        // The credit's assignment, seen before the recorder drains it in `handle`.
        self.now += 1_000;
        let event = Event::Credit {
            worker: WORKER,
            credits: n as u32,
        };
        self.recorder.on_event(&event, Instant(self.now), || None);
        self.core.handle(event, Instant(self.now), &mut self.out);
        let mut results = Vec::with_capacity(n);
        for action in self.out.drain(..) {
            if let Action::Assign { tasks, .. } = &action {
                results.extend(tasks.iter().map(|t| WorkerOutcome {
                    task: t.task,
                    attempt: t.attempt,
                    status: TaskStatus::Ok,
                    data: Bytes::new(),
                    exec_us: 10,
                    wait_us: 0,
                    flush_us: 0,
                }));
            }
            self.recorder.on_action(&action);
        }
        assert_eq!(results.len(), n, "every task assigned");
        self.handle(Event::Results {
            worker: WORKER,
            results,
        });
        self.handle(Event::Ack {
            client: CLIENT,
            package,
            count: n as u64,
        });
        n
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per task, median over blocks, for metrics on and off, interleaved.
fn per_task(tasks_per_package: usize, rounds: usize, tasks_per_block: usize) -> (f64, f64) {
    let mut rigs = [Rig::new(true), Rig::new(false)];
    let mut samples = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..2 {
            let i = (k + round) % 2;
            let rig = &mut rigs[i];
            let started = WallClock::now();
            let mut done = 0;
            while done < tasks_per_block {
                done += rig.package(tasks_per_package);
            }
            samples[i].push(started.elapsed().as_nanos() as f64 / done as f64);
        }
    }
    let [on, off] = samples;
    (median(on), median(off))
}

/// Milliseconds to build, render as JSON and render as Prometheus text one snapshot of a
/// master with `packages` live packages and `workers` workers.
fn per_second(packages: u64, workers: u64) -> (f64, f64, f64) {
    let mut core = Core::default();
    let mut recorder = Recorder::new(true);
    let mut out = Vec::new();
    for w in 0..workers {
        core.handle(
            Event::WorkerJoined {
                labels: Default::default(),
                resources: Default::default(),
                worker: WorkerId(1_000 + w),
                slots: 8,
                key: WorkerKey(1_000 + w),
            },
            Instant(0),
            &mut out,
        );
        let name = format!("slurm-{w}-node:1");
        recorder.worker_joined(
            1_000 + w,
            name,
            String::new(),
            "10.0.0.1".into(),
            Instant(0),
        );
    }
    core.handle(
        Event::ClientJoined {
            client: CLIENT,
            user: UserId(0),
        },
        Instant(0),
        &mut out,
    );
    for id in 1..=packages {
        core.handle(
            Event::Submit {
                client: CLIENT,
                req_id: id,
                package: PackageId(id),
                fn_hash: FnHash([1; 32]),
                fn_code: Bytes::from_static(b"code"),
                opts: PackageOpts::default(),
                tasks: vec![Bytes::new(); 4],
            },
            Instant(0),
            &mut out,
        );
    }
    recorder.sample();
    let names = vec!["default".to_owned()];
    let facts = MasterFacts::default();
    let t = WallClock::now();
    let snapshot = Arc::new(status::build(
        &core,
        &recorder,
        &names,
        &facts,
        None,
        Instant(1),
    ));
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = WallClock::now();
    let json = serde_json::to_string(&*snapshot).expect("JSON");
    let json_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = WallClock::now();
    let text = rtpool_master::http::metrics::render(&snapshot);
    let prom_ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(json.len() > 1_000 && text.ends_with("# EOF\n"));
    (build_ms, json_ms, prom_ms)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick" || a == "--test");
    let (rounds, block) = if quick { (4, 2_000) } else { (40, 20_000) };
    println!(
        "status_cost: metrics on vs off on the scheduler thread ({rounds} interleaved rounds)"
    );
    for n in [1usize, 64] {
        let (on, off) = per_task(n, rounds, block);
        println!(
            "  packages of {n:>2} tasks: on {on:>7.0} ns/task, off {off:>7.0} ns/task, \
             on/off {:.3} (+{:.0} ns/task)",
            on / off,
            on - off
        );
    }
    let (packages, workers) = if quick { (1_000, 10) } else { (10_000, 100) };
    let (build, json, prom) = per_second(packages, workers);
    println!(
        "  once a second, {packages} packages and {workers} workers: build {build:.2} ms \
         (scheduler thread); JSON {json:.2} ms, Prometheus text {prom:.2} ms (HTTP thread)"
    );
}
