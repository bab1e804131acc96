//! Simulated workers speaking the real protocol: what `rtpool bench scale` puts in front of a
//! real master to load it with thousands of worker connections at the cost of a few KB and a
//! few microseconds each.
//!
//! A simulated worker connects over TCP, sends `HELLO` with its slots, answers `busy` by
//! retrying after a jittered pause (as real workers do), grants `slots + prefetch` credits with
//! `PULL` and answers every `ASSIGN` at once with `RESULT` (the pickled `None` of a no-op task)
//! plus a `PULL` for as many credits, in one write. It sends `HEARTBEAT` when it sent nothing for
//! the master's `heartbeat_ms`, so a simulated worker never loses its lease by being idle. A
//! worker whose lease the master ended (`ERROR lease_expired`) connects again, as `rtpool
//! worker` does.
//!
//! A lease lost is the master's failure to read in time only if the simulator itself was not
//! silent that long: on a loaded machine its threads may not run for seconds. Each connection
//! measures its own silence (the time between two frames it sent) and the lateness of its
//! heartbeat timer; [`SimStats::silent_past_lease`] counts the sessions that were silent for a
//! lease or more, and [`SimStats::lease_lost_late`] the lost leases of such sessions: those are
//! the simulator's loss, not the master's.
//!
//! The connections run on `threads` threads of their own (a current-thread tokio runtime each,
//! connection `i` on thread `i % threads`), so the simulator costs that many cores at most and
//! leaves the rest to the master it measures. Nothing here belongs to the master: it only shares the protocol
//! crate. [`peer`] is one connection.

mod peer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

/// The pickled `None` (pickle protocol 5) every simulated task returns, as a no-op task does.
pub const NOOP_RESULT: &[u8] = b"\x80\x05N.";

/// What to simulate and where.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The master's `host:port`.
    pub addr: String,
    /// The master's worker token.
    pub token: String,
    /// Worker connections to open.
    pub workers: usize,
    /// Slots each connection announces in `HELLO` (1: one `rtpool worker` process).
    pub slots: u32,
    /// Credits asked beyond `slots` (a real one-slot worker holds about one task more).
    pub prefetch: u32,
    /// Handshakes in flight at once (a burst of thousands would only meet `busy`).
    pub handshake_concurrency: usize,
    /// Connection attempts per worker before it gives up (each `busy` costs one).
    pub max_attempts: u32,
    /// Time allowed for one TCP connect plus handshake.
    pub connect_timeout: Duration,
    /// Threads running the connections (at least 1). More threads keep up on a machine where
    /// other processes take the CPU; each costs the master's CPU share a little.
    pub threads: usize,
}

impl SimConfig {
    /// `workers` one-slot workers for the master at `addr`, with the defaults of
    /// `rtpool bench scale`.
    pub fn new(addr: impl Into<String>, token: impl Into<String>, workers: usize) -> Self {
        Self {
            addr: addr.into(),
            token: token.into(),
            workers,
            slots: 1,
            prefetch: 1,
            handshake_concurrency: 64,
            max_attempts: 20,
            connect_timeout: Duration::from_secs(10),
            threads: 1,
        }
    }
}

/// Counters shared by every simulated connection.
#[derive(Debug, Default)]
pub struct SimCounters {
    connected: AtomicU64,
    open: AtomicU64,
    busy: AtomicU64,
    refused: AtomicU64,
    gave_up: AtomicU64,
    connect_errors: AtomicU64,
    tasks: AtomicU64,
    assign_frames: AtomicU64,
    lease_lost: AtomicU64,
    closed_by_master: AtomicU64,
    disconnected: AtomicU64,
    reconnected: AtomicU64,
    max_silence_us: AtomicU64,
    silent_past_lease: AtomicU64,
    lease_lost_late: AtomicU64,
    max_heartbeat_lag_us: AtomicU64,
    heartbeats_sent: AtomicU64,
    heartbeats_received: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl SimCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn max(counter: &AtomicU64, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        counter.fetch_max(us, Ordering::Relaxed);
    }

    /// Keep the first unexpected error, for the report (later ones are only counted).
    fn note_error(&self, what: String) {
        let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(what);
        }
    }

    fn snapshot(&self) -> SimStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SimStats {
            connected: get(&self.connected),
            open: get(&self.open),
            busy: get(&self.busy),
            refused: get(&self.refused),
            gave_up: get(&self.gave_up),
            connect_errors: get(&self.connect_errors),
            tasks: get(&self.tasks),
            assign_frames: get(&self.assign_frames),
            lease_lost: get(&self.lease_lost),
            closed_by_master: get(&self.closed_by_master),
            disconnected: get(&self.disconnected),
            reconnected: get(&self.reconnected),
            max_silence_ms: get(&self.max_silence_us) / 1000,
            silent_past_lease: get(&self.silent_past_lease),
            lease_lost_late: get(&self.lease_lost_late),
            max_heartbeat_lag_ms: get(&self.max_heartbeat_lag_us) / 1000,
            heartbeats_sent: get(&self.heartbeats_sent),
            heartbeats_received: get(&self.heartbeats_received),
            first_error: self
                .first_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

/// A snapshot of the simulator's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Connections that got `WELCOME` (each worker counts once, however many attempts).
    pub connected: u64,
    /// Connections open now.
    pub open: u64,
    /// `ERROR busy` answers to a `HELLO` (each retried after a pause).
    pub busy: u64,
    /// Other refusals of a `HELLO` (`auth`, `version`, ...): the worker gives up at once.
    pub refused: u64,
    /// Workers that met `busy` or a connect error on every one of their attempts.
    pub gave_up: u64,
    /// TCP connects or handshakes that failed or timed out (each retried like `busy`).
    pub connect_errors: u64,
    /// Results sent.
    pub tasks: u64,
    /// `ASSIGN` frames received (tasks / frames is the batching the master achieved).
    pub assign_frames: u64,
    /// Connections the master closed with `ERROR lease_expired` (or closed while silent for
    /// their lease: the error frame lost in the reset).
    pub lease_lost: u64,
    /// Connections the master closed with another error after `WELCOME` (`shutdown`, ...).
    pub closed_by_master: u64,
    /// Connections that ended without an error frame (reset, EOF) before [`Simulator::stop`].
    pub disconnected: u64,
    /// Connections opened again after a lost lease.
    pub reconnected: u64,
    /// The longest time one connection sent nothing, milliseconds (an idle connection
    /// heartbeats every `heartbeat_ms`: more than that is the simulator's own lateness).
    pub max_silence_ms: u64,
    /// Connections that sent nothing for their lease or longer (counted once per session):
    /// the simulator was late, and the master was right to end their leases.
    pub silent_past_lease: u64,
    /// Of `lease_lost`, the sessions silent for their lease or longer by the time the
    /// simulator read the verdict: lost by the simulator's lateness (the rest: the master's).
    pub lease_lost_late: u64,
    /// How late a heartbeat timer fired at most, milliseconds: how long a ready connection
    /// waited for a thread of the simulator.
    pub max_heartbeat_lag_ms: u64,
    /// `HEARTBEAT` frames sent (each when the connection sent nothing for `heartbeat_ms`).
    pub heartbeats_sent: u64,
    /// `HEARTBEAT` frames received (the master's, on a link it left silent).
    pub heartbeats_received: u64,
    /// The first unexpected error, as text.
    pub first_error: Option<String>,
}

/// Simulated workers running on a thread of their own until [`Simulator::stop`].
#[derive(Debug)]
pub struct Simulator {
    counters: Arc<SimCounters>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl Simulator {
    /// Start `config.workers` simulated workers; they connect in the background (poll
    /// [`Simulator::stats`] for `connected`).
    ///
    /// # Errors
    ///
    /// A thread or its runtime could not be created (the threads already started are stopped).
    pub fn start(config: SimConfig) -> std::io::Result<Self> {
        let counters = Arc::new(SimCounters::default());
        let (stop, stop_rx) = watch::channel(false);
        let config = Arc::new(config);
        let mut sim = Self {
            counters,
            stop,
            threads: Vec::new(),
        };
        let threads = config.threads.max(1);
        for thread in 0..threads {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (config, c, stop_rx) = (
                Arc::clone(&config),
                Arc::clone(&sim.counters),
                stop_rx.clone(),
            );
            sim.threads.push(
                std::thread::Builder::new()
                    .name(format!("rtpool-sim-{thread}"))
                    .spawn(move || runtime.block_on(run(config, c, stop_rx, thread, threads)))?,
            );
        }
        Ok(sim)
    }

    /// The counters now.
    pub fn stats(&self) -> SimStats {
        self.counters.snapshot()
    }

    /// Close every connection and wait for the thread; returns the final counters.
    pub fn stop(&mut self) -> SimStats {
        let _ = self.stop.send(true);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.counters.snapshot()
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The connections of thread `thread` of `threads`: every `threads`-th from `thread`, with a
/// share of the handshakes allowed in flight.
async fn run(
    config: Arc<SimConfig>,
    counters: Arc<SimCounters>,
    stop: watch::Receiver<bool>,
    thread: usize,
    threads: usize,
) {
    let share = config.handshake_concurrency.div_ceil(threads);
    let handshakes = Arc::new(Semaphore::new(share.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for index in (thread..config.workers).step_by(threads) {
        tasks.spawn(peer::run(
            index,
            Arc::clone(&config),
            Arc::clone(&counters),
            Arc::clone(&handshakes),
            stop.clone(),
        ));
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noop_result_is_pickled_none() {
        // protocol 5 header, NONE opcode, STOP opcode
        assert_eq!(NOOP_RESULT, &[0x80, 5, b'N', b'.']);
    }

    #[test]
    fn nothing_listening_is_counted_and_given_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener); // the port now refuses connections
        let mut config = SimConfig::new(addr, "t", 3);
        config.max_attempts = 2;
        let mut sim = Simulator::start(config).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while sim.stats().gave_up < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = sim.stop();
        assert_eq!((s.gave_up, s.connected), (3, 0));
        assert_eq!(s.connect_errors, 6);
        assert!(s.first_error.is_some());
    }
}
