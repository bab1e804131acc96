//! One simulated worker connection: connect and handshake (with retries on `busy`), then answer
//! every `ASSIGN` at once until the simulator stops or the master closes the connection (after
//! a lost lease it connects again).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rtpool_proto::{
    decode_frame, encode, Msg, Role, WorkerResult, DEFAULT_MAX_FRAME, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::{SimConfig, SimCounters, NOOP_RESULT};

/// First and longest pause before another attempt (each drawn between half and all of it, as
/// the Python peers do in `_dial.py`).
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// How one handshake attempt ended, when it did not end in `WELCOME`.
enum Refusal {
    /// `ERROR busy`: retry after a pause.
    Busy,
    /// Connect error or timeout: retry after a pause.
    Failed(String),
    /// Any other refusal: give up.
    Fatal(String),
}

/// How a session ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// The master ended the lease (`ERROR lease_expired`): connect again.
    LeaseLost,
    /// Stopped, or lost for another reason: the worker is done.
    Done,
}

/// What `WELCOME` said, and the bytes read past it.
struct Session {
    stream: TcpStream,
    heartbeat: Duration,
    lease: Option<Duration>,
    /// The silence allowed while it holds no task (the lease without an idle heartbeat).
    idle_limit: Option<Duration>,
    buf: BytesMut,
}

/// Run simulated worker `index` until `stop` or until the master closes its connection for
/// another reason than its lease.
pub(super) async fn run(
    index: usize,
    config: Arc<SimConfig>,
    counters: Arc<SimCounters>,
    handshakes: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = true;
    while let Some(session) = connect(index, &config, &counters, &handshakes, &mut stop).await {
        if !first {
            SimCounters::add(&counters.reconnected, 1);
        }
        first = false;
        SimCounters::add(&counters.open, 1);
        let ended = serve(session, &config, &counters, &mut stop).await;
        counters
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if ended == Ended::Done || *stop.borrow() {
            return;
        }
    }
}

/// Connect with retries on `busy` and connect errors; `None` when stopped, refused or given
/// up (counted). The first success of a worker counts in `connected`.
async fn connect(
    index: usize,
    config: &SimConfig,
    counters: &SimCounters,
    handshakes: &Semaphore,
    stop: &mut watch::Receiver<bool>,
) -> Option<Session> {
    let mut rng = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut pause = FIRST_PAUSE;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let outcome = {
            let Ok(_permit) = handshakes.acquire().await else {
                return None;
            };
            if *stop.borrow() {
                return None;
            }
            timeout(config.connect_timeout, handshake(config, index))
                .await
                .unwrap_or_else(|_| Err(Refusal::Failed("handshake timed out".into())))
        };
        match outcome {
            Ok(session) => {
                SimCounters::add(&counters.connected, 1);
                return Some(session);
            }
            Err(Refusal::Fatal(what)) => {
                SimCounters::add(&counters.refused, 1);
                counters.note_error(what);
                return None;
            }
            Err(Refusal::Busy) => SimCounters::add(&counters.busy, 1),
            Err(Refusal::Failed(what)) => {
                SimCounters::add(&counters.connect_errors, 1);
                counters.note_error(what);
            }
        }
        if attempt >= config.max_attempts {
            SimCounters::add(&counters.gave_up, 1);
            return None;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let half = pause / 2;
        let jitter = Duration::from_micros(rng % (half.as_micros() as u64).max(1));
        tokio::select! {
            _ = sleep(half + jitter) => {}
            _ = stop.changed() => return None,
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Connect and exchange `HELLO`/`WELCOME`.
async fn handshake(config: &SimConfig, index: usize) -> Result<Session, Refusal> {
    let failed = |e: std::io::Error| Refusal::Failed(format!("connect to {}: {e}", config.addr));
    let mut stream = TcpStream::connect(&config.addr).await.map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    let mut out = BytesMut::new();
    encode(
        &Msg::Hello {
            // It answers every task at once: between frames it holds none, so it heartbeats
            // at the idle rate when the master offers one (issue 25).
            features: rtpool_proto::features::IDLE_HEARTBEAT,
            labels: Default::default(),
            resources: Default::default(),
            version: PROTOCOL_VERSION,
            role: Role::Worker,
            token: config.token.clone(),
            name: format!("sim-{index}"),
            slots: config.slots,
            identity: None,
        },
        &mut out,
    );
    stream.write_all(&out).await.map_err(failed)?;
    let mut buf = BytesMut::with_capacity(512);
    let msg = loop {
        match decode_frame(&mut buf, DEFAULT_MAX_FRAME) {
            Ok(Some(msg)) => break msg,
            Ok(None) => {}
            Err(e) => return Err(Refusal::Fatal(format!("bad frame in handshake: {e}"))),
        }
        if stream.read_buf(&mut buf).await.map_err(failed)? == 0 {
            return Err(Refusal::Failed("master closed the handshake".into()));
        }
    };
    match msg {
        Msg::Welcome {
            heartbeat_ms,
            lease_ms,
            idle_heartbeat_ms,
            ..
        } => {
            let ms = |ms: u32| Duration::from_millis(u64::from(ms));
            let lease = (lease_ms > 0).then(|| ms(lease_ms));
            // The silence the master allows it while it holds no task: the lease, or the idle
            // limit (idle heartbeat + lease) when the master offered an idle heartbeat.
            let (heartbeat, idle_limit) = match idle_heartbeat_ms {
                0 => (ms(heartbeat_ms.max(1)), lease),
                idle => (ms(idle), lease.map(|l| l + ms(idle))),
            };
            Ok(Session {
                stream,
                heartbeat,
                lease,
                idle_limit,
                buf,
            })
        }
        Msg::Error { code, .. } if code == "busy" => Err(Refusal::Busy),
        Msg::Error { code, message, .. } => Err(Refusal::Fatal(format!("{code}: {message}"))),
        other => Err(Refusal::Fatal(format!("{other:?} instead of WELCOME"))),
    }
}

/// Measures one session's silences: the time between two frames it sent.
struct Silence {
    lease: Option<Duration>,
    /// The silence allowed while it holds no task.
    idle_limit: Option<Duration>,
    last_write: Instant,
    /// The last write answered tasks.
    answered: bool,
    past_lease: bool,
}

impl Silence {
    /// Notes the silence that ends now (a write, or the master's verdict on it); `answering`:
    /// this write carries results. A silence between two answers (mid-package) is judged by
    /// the lease (the master assigns at once after a result: the worker then holds a task),
    /// any other by the idle limit (an approximation: the simulator cannot tell when an
    /// `ASSIGN` reached its socket).
    fn end(&mut self, counters: &SimCounters, answering: bool) {
        let now = Instant::now();
        let silent = now - self.last_write;
        SimCounters::max(&counters.max_silence_us, silent);
        let limit = if answering && self.answered {
            self.lease
        } else {
            self.idle_limit
        };
        self.answered = answering;
        if !self.past_lease && limit.is_some_and(|limit| silent >= limit) {
            self.past_lease = true;
            SimCounters::add(&counters.silent_past_lease, 1);
        }
        self.last_write = now;
    }

    /// The master ended this session's lease: count it, and whether the simulator was late.
    fn lease_lost(&mut self, counters: &SimCounters) -> Ended {
        let answered = self.answered;
        self.end(counters, answered);
        SimCounters::add(&counters.lease_lost, 1);
        if self.past_lease {
            SimCounters::add(&counters.lease_lost_late, 1);
        }
        Ended::LeaseLost
    }

    /// The connection failed: after a silence of a lease, that is the master ending the lease
    /// (its `ERROR` lost with the reset, or not read before writing); otherwise a loss.
    fn failed(&mut self, counters: &SimCounters, what: String) -> Ended {
        let limit = if self.answered {
            self.lease
        } else {
            self.idle_limit
        };
        if self.past_lease || limit.is_some_and(|l| self.last_write.elapsed() >= l) {
            return self.lease_lost(counters);
        }
        lost(counters, what)
    }
}

fn lost(counters: &SimCounters, what: String) -> Ended {
    SimCounters::add(&counters.disconnected, 1);
    counters.note_error(what);
    Ended::Done
}

/// Grant credits, answer tasks, heartbeat when idle; count how the connection ends.
async fn serve(
    session: Session,
    config: &SimConfig,
    counters: &SimCounters,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let Session {
        mut stream,
        heartbeat,
        lease,
        idle_limit,
        mut buf,
    } = session;
    let mut silence = Silence {
        lease,
        idle_limit,
        last_write: Instant::now(),
        answered: false,
        past_lease: false,
    };
    let mut answering = false;
    let mut out = BytesMut::with_capacity(256);
    let data = Bytes::from_static(NOOP_RESULT);
    encode(
        &Msg::Pull {
            credits: config.slots + config.prefetch,
        },
        &mut out,
    );
    let mut next_heartbeat = Instant::now();
    loop {
        if !out.is_empty() {
            silence.end(counters, std::mem::take(&mut answering));
            if let Err(e) = stream.write_all(&out).await {
                return silence.failed(counters, format!("write: {e}"));
            }
            out.clear();
            next_heartbeat = Instant::now() + heartbeat;
        }
        tokio::select! {
            _ = stop.changed() => return Ended::Done,
            _ = sleep_until(next_heartbeat) => {
                SimCounters::max(&counters.max_heartbeat_lag_us, next_heartbeat.elapsed());
                SimCounters::add(&counters.heartbeats_sent, 1);
                encode(&Msg::Heartbeat, &mut out);
            }
            read = stream.read_buf(&mut buf) => match read {
                Ok(0) => return silence.failed(counters, "master closed the connection".into()),
                Err(e) => return silence.failed(counters, format!("read: {e}")),
                Ok(_) => {}
            },
        }
        let mut results = Vec::new();
        loop {
            match decode_frame(&mut buf, DEFAULT_MAX_FRAME) {
                Ok(None) => break,
                Ok(Some(Msg::Assign { tasks })) => {
                    SimCounters::add(&counters.assign_frames, 1);
                    results.extend(tasks.into_iter().map(|t| WorkerResult {
                        task: t.task,
                        attempt: t.attempt,
                        status: rtpool_proto::status::OK,
                        data: data.clone(),
                        exec_us: 1,
                        wait_us: 0,
                        flush_us: 0,
                    }));
                }
                Ok(Some(Msg::Error { code, message, .. })) => {
                    counters.note_error(format!("{code}: {message}"));
                    if code == "lease_expired" {
                        return silence.lease_lost(counters);
                    }
                    SimCounters::add(&counters.closed_by_master, 1);
                    return Ended::Done;
                }
                Ok(Some(Msg::Heartbeat)) => SimCounters::add(&counters.heartbeats_received, 1),
                // ABORT names tasks already answered (results go out at once).
                Ok(Some(_)) => {}
                Err(e) => return lost(counters, format!("bad frame from master: {e}")),
            }
        }
        if !results.is_empty() {
            let credits = u32::try_from(results.len()).unwrap_or(u32::MAX);
            SimCounters::add(&counters.tasks, results.len() as u64);
            encode(&Msg::Result { results }, &mut out);
            answering = true;
            encode(&Msg::Pull { credits }, &mut out);
        }
    }
}
