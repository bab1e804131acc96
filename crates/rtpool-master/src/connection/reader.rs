//! An authenticated connection's reader: turns each frame into a core event for the
//! scheduler, checks what the core cannot (function hashes, `SERVE` before `PULL`, result
//! statuses) and closes a peer that stays silent past its lease or idle timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rtpool_core::{
    ClientId, Event, FnHash, PackageId, TaskId, TaskStatus, WorkerId, WorkerOutcome,
};
use rtpool_proto::{decode_frame, Msg, Role};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::bounds::{Bounds, MAX_CREDITS};
use super::{grow, ConnCtx, NEVER};
use crate::outbound::{error_msg, on_grid, rejected, Outbound};
use crate::scheduler::ToScheduler;

/// A silence timer that fires this late means the master was stalled, not the peer silent.
const STALL_MIN: Duration = Duration::from_millis(500);

/// How a connection's reading ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadEnd {
    /// End of stream or a read error: the peer closed, died or was reset.
    Closed,
    /// A fatal protocol error, answered with `ERROR` (the peer misbehaved).
    Fatal,
    /// The peer sent nothing for its lease or idle timeout (answered with `ERROR`), or its path
    /// timed out (`TCP_USER_TIMEOUT`): it may be alive, only stopped, starved or cut off.
    Silent,
}

impl ReadEnd {
    /// Whether the master closes with an `ERROR` the peer should get time to read.
    pub(super) fn is_answered(self) -> bool {
        matches!(self, Self::Fatal | Self::Silent)
    }
}

/// How a message is refused.
pub(super) enum Refusal {
    /// Answer with this error; the connection stays open.
    Rejected(Msg),
    /// Answer with this error and close the connection.
    Fatal(Msg),
}

pub(super) struct Reader {
    pub(super) session: u64,
    pub(super) role: Role,
    pub(super) ctx: Arc<ConnCtx>,
    pub(super) sched: mpsc::UnboundedSender<ToScheduler>,
    /// The last (hash, code) pair whose SHA-256 was verified, so a client that submits the same
    /// function again pays a memcmp instead of a hash.
    pub(super) verified: Option<(Bytes, Bytes)>,
    /// This worker sent its `SERVE` (at most one per connection).
    pub(super) served: bool,
    /// This worker sent a `PULL` (a `SERVE` must come before the first one).
    pub(super) pulled: bool,
    /// Bounds on the numbers this peer reports, and its user's priority ceiling.
    pub(super) bounds: Bounds,
    /// This peer's first `HEARTBEAT` was answered (the only one that is).
    pub(super) answered: bool,
    /// A worker that heartbeats slower while it holds no task (`HELLO.features`): the silence
    /// allowed it then (its idle heartbeat plus the lease); `None`: the lease, always.
    pub(super) idle_limit: Option<Duration>,
    /// Shared with the scheduler: whether the worker holds a task, and since when.
    pub(super) shared: Arc<Outbound>,
}

impl Reader {
    /// Read frames until EOF or a read error ([`ReadEnd::Closed`]), a fatal protocol error
    /// ([`ReadEnd::Fatal`], after queueing `ERROR`), or a silence past the peer's lease (worker)
    /// or idle timeout (client) ([`ReadEnd::Silent`], after queueing `ERROR`).
    pub(super) async fn read_loop<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        mut buf: BytesMut,
    ) -> ReadEnd {
        let mut events = Vec::new();
        let (silence, code) = match self.role {
            Role::Worker => (self.ctx.lease, "lease_expired"),
            Role::Client => (self.ctx.client_timeout, "idle"),
        };
        // One timer for the connection's life: a read only notes its time, and the timer,
        // when it fires early, moves itself to the last read plus the allowed silence.
        let silence = silence.unwrap_or(NEVER);
        // A worker that holds no task may be silent for its idle limit, and one that got a
        // task must be heard within a lease of it (or of its last frame, whichever is later):
        // the timer runs to the lease; when it finds the worker idle it parks on the idle
        // limit, and an assignment nudges it back (`Liveness`).
        let idle_limit = self.idle_limit.filter(|_| silence != NEVER);
        let shared = self.shared.clone();
        let live = &shared.live;
        let mut parked = false;
        let mut last_read = Instant::now();
        // The buffer was grown for a large frame since it was last replaced.
        let mut grown = false;
        let timer = tokio::time::sleep_until(on_grid(last_read + silence));
        tokio::pin!(timer);
        loop {
            loop {
                match decode_frame(&mut buf, self.ctx.max_frame_bytes) {
                    // Answered from the status snapshot, after the events before it.
                    Ok(Some(Msg::ClusterStatus { req_id })) if self.role == Role::Client => {
                        self.flush(&mut events);
                        let session = self.session;
                        let _ = self
                            .sched
                            .send(ToScheduler::ClusterStatus { session, req_id });
                    }
                    Ok(Some(msg)) => match self.on_message(msg) {
                        Ok(Some(ev)) => events.push(ev),
                        Ok(None) => {}
                        Err(Refusal::Rejected(msg)) => self.reply(&mut events, msg, false),
                        Err(Refusal::Fatal(msg)) => {
                            self.reply(&mut events, msg, true);
                            return ReadEnd::Fatal;
                        }
                    },
                    Ok(None) => break,
                    Err(e) if !e.is_fatal() => self.reply(&mut events, e.to_msg(), false),
                    Err(e) => {
                        warn!(session = self.session, "protocol error: {e}");
                        self.reply(&mut events, e.to_msg(), true);
                        return ReadEnd::Fatal;
                    }
                }
            }
            self.flush(&mut events);
            shrink(&mut buf, &mut grown);
            grown |= grow(&mut buf);
            let read = loop {
                let judge = tokio::select! {
                    biased;
                    read = rd.read_buf(&mut buf) => break read,
                    () = &mut timer => {
                        let late = Instant::now().saturating_duration_since(timer.deadline());
                        if late > STALL_MIN {
                            // The master itself did not run (SIGSTOP, a frozen VM): the peer's
                            // frames may wait unread in the socket. Judge its silence on time
                            // the master could observe: it gets a full lease from now.
                            warn!(
                                session = self.session,
                                "timer fired {} ms late: the master was stalled; the peer's \
                                 silence is counted from now",
                                late.as_millis()
                            );
                            last_read = Instant::now();
                            timer.as_mut().reset(on_grid(last_read + silence));
                            continue;
                        }
                        true
                    }
                    // An assignment to a parked (idle) worker: its lease runs from now.
                    () = live.nudge.notified(), if parked => false,
                };
                let (deadline, limit) = match idle_limit {
                    None => (last_read + silence, silence),
                    Some(idle) => {
                        // Park first, then look: an assignment racing with this is seen
                        // here, or nudges the timer (`Liveness::park`).
                        match live.park(true) {
                            Some(since) => {
                                live.park(false);
                                parked = false;
                                (last_read.max(since) + silence, silence)
                            }
                            None => {
                                parked = true;
                                (last_read + idle, idle)
                            }
                        }
                    }
                };
                if judge && Instant::now() >= deadline {
                    let msg = self.silence_error(code, limit);
                    self.reply(&mut events, msg, true);
                    return ReadEnd::Silent;
                }
                timer.as_mut().reset(on_grid(deadline));
            };
            match read {
                // TCP_USER_TIMEOUT (set to the lease): data unacknowledged that long, a silence.
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return ReadEnd::Silent,
                Ok(0) | Err(_) => return ReadEnd::Closed,
                // Any bytes count as a sign of life, not only whole frames: a worker uploading
                // a large RESULT over a slow link is busy, not silent.
                Ok(_) => last_read = Instant::now(),
            }
        }
    }

    fn silence_error(&self, code: &str, silence: Duration) -> Msg {
        let ms = silence.as_millis();
        let message = match self.role {
            Role::Worker if Some(silence) == self.idle_limit => format!(
                "no frame from this worker for {ms} ms (the limit for a worker that holds no \
                 task: its idle heartbeat and a lease): closing"
            ),
            Role::Worker => format!(
                "no frame from this worker for {ms} ms (its lease): closing and requeueing its \
                 tasks; a worker sends HEARTBEAT while it computes"
            ),
            Role::Client => format!(
                "no frame from this client for {ms} ms: closing; a client sends HEARTBEAT while \
                 it waits"
            ),
        };
        warn!(session = self.session, "{code}: silent for {ms} ms");
        error_msg(code, message, 0)
    }

    fn flush(&self, events: &mut Vec<Event>) {
        match events.len() {
            0 => {}
            1 => {
                let _ = self
                    .sched
                    .send(ToScheduler::Event(events.pop().expect("one event")));
            }
            _ => {
                let _ = self.sched.send(ToScheduler::Events(std::mem::take(events)));
            }
        }
    }

    /// Answer the peer through the scheduler, after the events decoded before (they are valid
    /// and their answers come first).
    fn reply(&self, events: &mut Vec<Event>, msg: Msg, close: bool) {
        self.flush(events);
        let session = self.session;
        let _ = self.sched.send(ToScheduler::Reply {
            session,
            msg,
            close,
        });
    }

    /// Turn one message into a core event, or the error to answer it with.
    // The refusal is built at most once per connection (or per rejected SUBMIT): its size
    // costs nothing on the accepted path.
    #[allow(clippy::result_large_err)]
    fn on_message(&mut self, msg: Msg) -> Result<Option<Event>, Refusal> {
        match (self.role, msg) {
            (
                Role::Client,
                Msg::Submit {
                    req_id,
                    fn_hash,
                    fn_code,
                    opts,
                    tasks,
                },
            ) => {
                if let Some(refusal) = self.bounds.check_priority(req_id, &opts) {
                    return Err(Refusal::Rejected(refusal));
                }
                let Some(hash) = self.verify(&fn_hash, &fn_code) else {
                    return Err(Refusal::Rejected(rejected(req_id, "fn_hash is not the SHA-256 of fn_code; the client must send the digest of the code it submits".into())));
                };
                let client = ClientId(self.session);
                // The scheduler numbers the package.
                Ok(Some(Event::Submit {
                    client,
                    req_id,
                    package: PackageId(0),
                    fn_hash: hash,
                    fn_code,
                    opts,
                    tasks,
                }))
            }
            (Role::Client, Msg::Cancel { package, indices }) => Ok(Some(Event::Cancel {
                client: ClientId(self.session),
                package: PackageId(package),
                indices,
            })),
            (Role::Client, Msg::Status { req_id, package }) => Ok(Some(Event::Status {
                client: ClientId(self.session),
                req_id,
                package: PackageId(package),
            })),
            (Role::Client, Msg::Attach { req_id, package }) => Ok(Some(Event::Attach {
                client: ClientId(self.session),
                req_id,
                package: PackageId(package),
            })),
            (Role::Client, Msg::Ack { package, count }) => Ok(Some(Event::Ack {
                client: ClientId(self.session),
                package: PackageId(package),
                count,
            })),
            (
                Role::Client,
                Msg::Call {
                    req_id,
                    opts,
                    calls,
                },
            ) => {
                if let Some(refusal) = self.bounds.check_priority(req_id, &opts) {
                    return Err(Refusal::Rejected(refusal));
                }
                Ok(Some(Event::SubmitCalls {
                    client: ClientId(self.session),
                    req_id,
                    // The scheduler numbers the package, as for SUBMIT.
                    package: PackageId(0),
                    opts,
                    calls,
                }))
            }
            (Role::Client, Msg::Release { keys }) => Ok(Some(Event::ReleaseKept {
                client: ClientId(self.session),
                keys: keys.into_iter().map(|(w, k)| (WorkerId(w), k)).collect(),
            })),
            (Role::Client, Msg::Functions { req_id, name }) => Ok(Some(Event::Functions {
                client: ClientId(self.session),
                req_id,
                name,
            })),
            (Role::Worker, Msg::Pull { credits }) => {
                self.pulled = true;
                Ok(Some(Event::Credit {
                    worker: WorkerId(self.session),
                    credits: self.bounds.clamp("PULL.credits", credits, MAX_CREDITS),
                }))
            }
            (Role::Worker, Msg::Serve { functions }) => {
                self.check_serve_order()?;
                self.served = true;
                Ok(Some(Event::Serve {
                    worker: WorkerId(self.session),
                    functions,
                }))
            }
            (Role::Worker, Msg::Result { results }) => {
                let mut outcomes = Vec::with_capacity(results.len());
                for r in results {
                    let status = TaskStatus::from_u8(r.status).ok_or_else(|| {
                        Refusal::Fatal(error_msg("malformed", format!("RESULT for task {} has status {}, which is not a task status (0..=8)", r.task, r.status), 0))
                    })?;
                    outcomes.push(WorkerOutcome {
                        task: TaskId(r.task),
                        attempt: r.attempt,
                        status,
                        data: r.data,
                        exec_us: self.bounds.task_us("RESULT.exec_us", r.exec_us),
                        wait_us: self.bounds.task_us("RESULT.wait_us", r.wait_us),
                        flush_us: self.bounds.task_us("RESULT.flush_us", r.flush_us),
                    });
                }
                Ok(Some(Event::Results {
                    worker: WorkerId(self.session),
                    results: outcomes,
                }))
            }
            (Role::Worker, Msg::Return { tasks }) => Ok(Some(Event::Returned {
                worker: WorkerId(self.session),
                tasks: tasks.into_iter().map(|(t, a)| (TaskId(t), a)).collect(),
            })),
            // Only the first is answered, so that a peer learns at once that this master
            // heartbeats (it then judges the master's silence); after that the master's writer
            // heartbeats a link it left silent for a lease (`outbound::write_loop`). The read
            // itself reset this peer's silence timer.
            (_, Msg::Heartbeat) => {
                if !self.answered {
                    self.answered = true;
                    let session = self.session;
                    let _ = self.sched.send(ToScheduler::Reply {
                        session,
                        msg: Msg::Heartbeat,
                        close: false,
                    });
                }
                Ok(None)
            }
            (Role::Worker, Msg::Drain) => Ok(Some(Event::Drain {
                worker: WorkerId(self.session),
            })),
            (role, other) => Err(Refusal::Fatal(error_msg(
                "unknown_kind",
                format!(
                    "a {} may not send {}",
                    if role == Role::Client {
                        "client"
                    } else {
                        "worker"
                    },
                    other.name()
                ),
                0,
            ))),
        }
    }

    /// A worker declares its functions once, before its first `PULL` (so the registry never
    /// changes under a worker that already holds work): anything else is a broken worker,
    /// answered with a fatal `malformed`.
    #[allow(clippy::result_large_err)]
    fn check_serve_order(&self) -> Result<(), Refusal> {
        let why = if self.served {
            "a second SERVE on this connection"
        } else if self.pulled {
            "SERVE after PULL"
        } else {
            return Ok(());
        };
        warn!(session = self.session, "protocol error: {why}");
        Err(Refusal::Fatal(error_msg(
            "malformed",
            format!(
                "{why}: a worker sends SERVE at most once per connection, right after WELCOME \
                 and before its first PULL; reconnect to serve another set of functions"
            ),
            0,
        )))
    }

    fn verify(&mut self, fn_hash: &Bytes, fn_code: &Bytes) -> Option<FnHash> {
        let hash: [u8; 32] = fn_hash.as_ref().try_into().ok()?;
        let cached = matches!(&self.verified, Some((h, c)) if h == fn_hash && c == fn_code);
        if !cached {
            let digest: [u8; 32] = Sha256::digest(fn_code).into();
            if digest != hash {
                return None;
            }
            self.verified = Some((fn_hash.clone(), fn_code.clone()));
        }
        Some(FnHash(hash))
    }
}

/// Above this much room, an emptied read buffer is given back: a large frame (a 100 MiB
/// `RESULT`) grew it, and the connection would otherwise hold that allocation for its life.
const SHRINK_ABOVE: usize = 1 << 20;

/// Once every frame in it was decoded, a read buffer grown past [`SHRINK_ABOVE`], or `grown`
/// for a large frame, is replaced by a small one (its old allocation is freed when the last
/// payload cut from it is); a buffer still holding part of a frame keeps its room, which that
/// frame needs. `grown` matters because an emptied buffer is a view of what is left of its
/// allocation after the frames cut from it: its own capacity may be small while it keeps a
/// whole 4-8 MiB allocation alive for the connection's life (issue 29: a worker's connection
/// kept up to 7.5 MB after the 512 KiB results it carried were freed).
fn shrink(buf: &mut BytesMut, grown: &mut bool) {
    if buf.is_empty() && (*grown || buf.capacity() > SHRINK_ABOVE) {
        *buf = BytesMut::with_capacity(16 * 1024);
        *grown = false;
    }
}
