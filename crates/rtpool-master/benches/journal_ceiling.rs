//! The scheduler's dispatch ceiling with and without the journal, and the master's memory
//! meanwhile, without the noise of sockets and worker processes.
//!
//! One run drives the real scheduler task (`Scheduler::run`, on a current-thread runtime as in
//! the master) with a simulated client and 8 simulated workers on the same thread: the client
//! keeps 16 packages of 64 empty tasks in flight and acknowledges every batch of results; each
//! worker has 128 credits and answers each `ASSIGN` with its results and fresh credits at once.
//! With the journal, its writer thread (and compaction thread) run as in the master, under the
//! chosen `--fsync` policy, in a fresh temporary dir. The figure is tasks completed per second
//! over the run (the driver's own work is included, the same in both modes), the process's
//! peak RSS (VmHWM), the journal's counters, and how long the scheduler took to stop (the
//! shutdown path: journal drain, fsync, abandoning a running compaction).
//!
//! Each run is a child process (so that peak RSS is its own); runs alternate off, on, on, off
//! over the rounds, and the summary gives the median of each and the ratio.
//!
//! ```text
//! cargo bench -p rtpool-master --bench journal_ceiling                 # 4 rounds of 5 s
//! cargo bench -p rtpool-master --bench journal_ceiling -- --secs 2 --rounds 2 --fsync always
//! cargo bench -p rtpool-master --bench journal_ceiling -- --compact-mib 16
//! ```
//!
//! `--test` (what `cargo bench -- --test` passes) runs one short round.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtpool_core::{
    ClientId, CoreConfig, Event, FnHash, PackageId, PackageOpts, TaskId, TaskStatus, UserId,
    WorkerId, WorkerKey, WorkerOutcome,
};
use rtpool_master::journal::{FsyncPolicy, Journal, JournalConfig};
use rtpool_master::outbound::{Out, OutboundRx, OutboundTx};
use rtpool_master::scheduler::{Scheduler, ToScheduler};
use rtpool_proto::Msg;
use tokio::sync::{mpsc, oneshot};

const CLIENT: u64 = 1;
const WORKERS: u64 = 8;
const CREDITS: u32 = 128;
const TASKS: usize = 64;
const IN_FLIGHT: usize = 16;

struct Opts {
    secs: f64,
    rounds: usize,
    fsync: String,
    compact_mib: u64,
}

fn parse() -> (Opts, Option<bool>) {
    let mut opts = Opts {
        secs: 5.0,
        rounds: 2,
        fsync: "batch".into(),
        compact_mib: 64,
    };
    let mut child = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--secs" => opts.secs = value().parse().expect("--secs SECONDS"),
            "--rounds" => opts.rounds = value().parse().expect("--rounds N"),
            "--fsync" => opts.fsync = value(),
            "--compact-mib" => opts.compact_mib = value().parse().expect("--compact-mib MIB"),
            "--child" => child = Some(value() == "on"),
            "--test" => {
                opts.secs = 0.5;
                opts.rounds = 1;
            }
            _ => {} // `--bench` and filters from cargo
        }
    }
    (opts, child)
}

fn main() {
    let (opts, child) = parse();
    if let Some(journal) = child {
        run_child(journal, &opts);
        return;
    }
    println!(
        "# journal_ceiling: {WORKERS} workers x {CREDITS} credits, {IN_FLIGHT} packages of \
         {TASKS} tasks in flight, {} s per run, fsync {}, compaction at {} MiB",
        opts.secs, opts.fsync, opts.compact_mib
    );
    let exe = std::env::current_exe().expect("own path");
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut rss: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..opts.rounds {
        // off, on, on, off, ...: drift hits both alike.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for journal in order {
            let out = Command::new(&exe)
                .args(["--child", if journal { "on" } else { "off" }])
                .args(["--secs", &opts.secs.to_string()])
                .args(["--fsync", &opts.fsync])
                .args(["--compact-mib", &opts.compact_mib.to_string()])
                .output()
                .expect("run a child");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child failed: {text}");
            print!("{text}");
            let field = |name: &str| -> f64 {
                text.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .and_then(|v| v.parse().ok())
                    .expect("a figure in the child's line")
            };
            rates[usize::from(journal)].push(field("tasks_per_s="));
            rss[usize::from(journal)].push(field("peak_rss_mb="));
        }
    }
    let [off, on] = rates.map(median);
    let [rss_off, rss_on] = rss.map(median);
    println!(
        "summary: ceiling without journal {off:.0} tasks/s, with journal {on:.0} tasks/s, \
         ratio {:.2}; peak RSS {rss_off:.0} MB without, {rss_on:.0} MB with",
        off / on
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Peak resident set of this process, MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn run_child(journal: bool, opts: &Opts) {
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let policy: FsyncPolicy = opts.fsync.parse().expect("an fsync policy");
    let mut scheduler = Scheduler::new(CoreConfig::default(), 1);
    if journal {
        let mut cfg = JournalConfig::new(dir.path().join("journal.log"));
        cfg.policy = policy;
        cfg.compact_min_bytes = opts.compact_mib << 20;
        let (j, replay) = Journal::open(cfg).expect("open the journal");
        scheduler = scheduler.with_journal(j, replay, policy);
    }
    let line = rt.block_on(drive(scheduler, Duration::from_secs_f64(opts.secs)));
    println!(
        "{} {line} peak_rss_mb={:.1}",
        if journal {
            "journal=on "
        } else {
            "journal=off"
        },
        peak_rss_mb()
    );
}

/// The simulated client and workers; returns the figures of the run.
async fn drive(scheduler: Scheduler, length: Duration) -> String {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(scheduler.run(rx, tx.clone()));
    let register = |session: u64, event: Event| -> OutboundRx {
        let (out, queue) = OutboundTx::new(usize::MAX / 4);
        tx.send(ToScheduler::Register {
            session,
            user: "bench".into(),
            name: format!("peer-{session}"),
            identity: String::new(),
            host: "127.0.0.1".into(),
            tx: out,
            event,
        })
        .expect("scheduler alive");
        queue
    };
    let mut client = register(
        CLIENT,
        Event::ClientJoined {
            client: ClientId(CLIENT),
            user: UserId(0),
        },
    );
    let mut workers: Vec<(u64, OutboundRx)> = (0..WORKERS)
        .map(|i| {
            let session = 100 + i;
            let event = Event::WorkerJoined {
                labels: Default::default(),
                resources: Default::default(),
                worker: WorkerId(session),
                slots: CREDITS,
                key: WorkerKey(session),
            };
            (session, register(session, event))
        })
        .collect();
    for (session, _) in &workers {
        let credit = Event::Credit {
            worker: WorkerId(*session),
            credits: CREDITS,
        };
        tx.send(ToScheduler::Event(credit)).expect("alive");
    }
    let submit = |req_id: u64| {
        let event = Event::Submit {
            client: ClientId(CLIENT),
            req_id,
            package: PackageId(0),
            fn_hash: FnHash([1; 32]),
            fn_code: Bytes::from_static(b"code"),
            opts: PackageOpts::default(),
            tasks: vec![Bytes::from_static(b"\x90"); TASKS],
        };
        tx.send(ToScheduler::Event(event)).expect("alive");
    };
    let mut req_id = 0;
    for _ in 0..IN_FLIGHT {
        req_id += 1;
        submit(req_id);
    }
    let mut received: HashMap<u64, u64> = HashMap::new();
    let mut done = 0u64;
    let started = Instant::now();
    while started.elapsed() < length {
        for (session, queue) in &mut workers {
            while let Some(Out::Send(Msg::Assign { tasks })) = queue.try_recv() {
                let credits = tasks.len() as u32;
                let results = tasks
                    .into_iter()
                    .map(|t| WorkerOutcome {
                        task: TaskId(t.task),
                        attempt: t.attempt,
                        status: TaskStatus::Ok,
                        data: Bytes::from_static(b"\xc0"),
                        exec_us: 1,
                        wait_us: 0,
                        flush_us: 0,
                    })
                    .collect();
                let worker = WorkerId(*session);
                let events = vec![
                    Event::Results { worker, results },
                    Event::Credit { worker, credits },
                ];
                tx.send(ToScheduler::Events(events)).expect("alive");
            }
        }
        while let Some(out) = client.try_recv() {
            let Out::Send(Msg::Results { package, results }) = out else {
                continue;
            };
            done += results.len() as u64;
            let count = received.entry(package).or_default();
            *count += results.len() as u64;
            let ack = Event::Ack {
                client: ClientId(CLIENT),
                package: PackageId(package),
                count: *count,
            };
            tx.send(ToScheduler::Event(ack)).expect("alive");
            if *count == TASKS as u64 {
                received.remove(&package);
                req_id += 1;
                submit(req_id);
            }
        }
        tokio::task::yield_now().await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (stats_tx, stats_rx) = oneshot::channel();
    tx.send(ToScheduler::Stats(stats_tx)).expect("alive");
    let stats = stats_rx.await.expect("stats");
    let stopping = Instant::now();
    tx.send(ToScheduler::Shutdown).expect("alive");
    drop(tx);
    task.await.expect("scheduler task");
    let stop_ms = stopping.elapsed().as_secs_f64() * 1e3;
    let journal = stats.journal.map_or(String::new(), |j| {
        format!(
            "records={} groups={} max_group={} fsyncs={} compactions={} cancelled={} \
             last_compaction_ms={:.0} pause_ms={:.1} backpressure_waits={} backpressure_ms={:.0} \
             file_mb={:.1}",
            j.records,
            j.groups,
            j.max_group_records,
            j.fsyncs,
            j.compactions,
            j.compactions_cancelled,
            j.last_compaction_us as f64 / 1e3,
            j.last_compaction_pause_us as f64 / 1e3,
            j.backpressure_waits,
            j.backpressure_us as f64 / 1e3,
            j.file_bytes as f64 / f64::from(1 << 20),
        )
    });
    format!(
        "tasks_per_s={:.0} stop_ms={stop_ms:.1} {journal}",
        done as f64 / elapsed
    )
}
