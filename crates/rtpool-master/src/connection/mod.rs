//! One task pair per connection: the reader authenticates the peer, then turns frames into core
//! events; the writer encodes whatever the scheduler sends it, several frames per write.
//!
//! Bad input from a peer is that peer's problem only: a fatal protocol error is answered with an
//! `ERROR` frame and closes this connection, never the master. Neither can a slow or silent peer
//! hold the master's resources: the handshake (TLS included) has a deadline, an authenticated
//! peer that sends nothing for its lease or idle timeout is closed, and one that does not read
//! what it is sent is closed once [`OutboundTx`] holds `max_buffered_bytes` for it.
//!
//! The same code serves plain TCP and TLS: the reader and writer are generic over the stream
//! halves, so the plain path keeps tokio's lock-free owned halves of a `TcpStream`. The queue
//! and the writer are [`crate::outbound`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rtpool_core::{ClientId, Event, LossCause, UserId, WorkerId};
use rtpool_proto::{encode, features, Msg, Role, PROTOCOL_VERSION};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub mod bounds;
pub mod gate;
mod handshake;
pub mod keepalive;
mod reader;
mod seldom;

use self::bounds::{Bounds, MAX_SLOTS};
use self::gate::{Gate, Pending, Refusal};
use self::handshake::{
    answer_and_close, check_hello, establish, linger, read_hello, refuse, worker_key, Transport,
};
use self::reader::{ReadEnd, Reader};
use self::seldom::Seldom;
use crate::auth::{Authenticator, Identity, Policy};
use crate::outbound::{error_msg, write_loop, OutboundTx};
use crate::ratelimit::{self, LogLimiter};
use crate::scheduler::ToScheduler;
use crate::tls::Tls;

/// Settings every connection needs.
pub struct ConnCtx {
    /// Checks `HELLO` tokens (built-in and per-user).
    pub auth: Authenticator,
    /// Frame limit after authentication.
    pub max_frame_bytes: usize,
    /// Announced to workers in `WELCOME`.
    pub heartbeat_ms: u32,
    /// How often a worker that holds no task heartbeats, announced in `WELCOME` to workers
    /// that know it (`HELLO.features`); 0: as often as a busy one.
    pub idle_heartbeat_ms: u32,
    /// Time a peer has to complete its handshake, TLS handshake included.
    pub handshake_timeout: Duration,
    /// Worker lease, announced in `WELCOME`.
    pub lease_ms: u32,
    /// This master process's random instance number, announced in `WELCOME`.
    pub instance: u64,
    /// TLS setup; `None` for plain TCP.
    pub tls: Option<Tls>,
    /// Who may hold a connection (handshakes, sessions, the clients' reserve); the others
    /// are answered `ERROR busy`.
    pub gate: Arc<Gate>,
    /// Outbound bytes a connection may have queued before it is closed as a slow consumer.
    pub max_buffered_bytes: usize,
    /// Silence after which a worker is closed (`lease_expired`); `None`: never.
    pub lease: Option<Duration>,
    /// Silence after which a client is closed (`idle`); `None`: never.
    pub client_timeout: Option<Duration>,
}

impl std::fmt::Debug for ConnCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens stay out of logs.
        f.debug_struct("ConnCtx")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("tls", &self.tls)
            .field("limits", &self.gate.limits())
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("lease", &self.lease)
            .field("client_timeout", &self.client_timeout)
            .finish_non_exhaustive()
    }
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// The silence allowed when a timeout is disabled: far enough never to fire, near enough not to
/// overflow an `Instant`.
const NEVER: Duration = Duration::from_secs(30 * 365 * 86_400);
/// How long a connection closed for a fatal error keeps draining the peer's input, so the
/// kernel does not answer unread bytes with a reset that could destroy our `ERROR` frame.
const LINGER: Duration = Duration::from_secs(2);

/// Serve one accepted connection until it closes or the master shuts down.
pub async fn serve(
    stream: TcpStream,
    place: Pending,
    ctx: Arc<ConnCtx>,
    sched: mpsc::UnboundedSender<ToScheduler>,
    shutdown: watch::Receiver<bool>,
) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let deadline = Instant::now() + ctx.handshake_timeout;
    // One body per transport, monomorphized: the plain path pays nothing for TLS.
    // Biased: a plain connection is established at once and answered `busy` below if it
    // was evicted before its task ran.
    let established = tokio::select! {
        biased;
        t = establish(stream, &ctx, deadline) => t,
        // A TLS handshake left unfinished has no channel for an `ERROR`: just closed.
        () = place.evicted() => {
            note_eviction(&ctx, &peer, &place);
            return;
        }
    };
    match established {
        Some(Transport::Plain(s)) => {
            let (rd, wr) = s.into_split();
            serve_halves(rd, wr, peer, place, deadline, ctx, sched, shutdown).await;
        }
        Some(Transport::Tls(s)) => {
            let (rd, wr) = tokio::io::split(*s);
            serve_halves(rd, wr, peer, place, deadline, ctx, sched, shutdown).await;
        }
        None => debug!(%peer, "closed during the transport handshake"),
    }
}

/// Resolves once `identity`'s token is revoked (never for a built-in token).
async fn revoked(policy: &mut watch::Receiver<Arc<Policy>>, identity: &Identity) {
    if identity.token_id.is_none() || policy.wait_for(|p| p.is_revoked(identity)).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One readable line per refused login, at most one per peer host per
/// [`ratelimit::DEFAULT_WINDOW`] (a peer retrying a bad token in a loop must not flood the log):
/// `refused a worker login from 10.0.0.7:51234 (name "w1"): auth: unknown token (and 41 more
/// lines like it held back ...)`.
fn log_refused(peer: &str, name: &str, role: Role, msg: &Msg) {
    static REFUSED: Mutex<Option<LogLimiter<String>>> = Mutex::new(None);
    // The host without the port: each retry comes from a new port.
    let host = peer.rsplit_once(':').map_or(peer, |(h, _)| h).to_string();
    let window = ratelimit::DEFAULT_WINDOW;
    let admitted = {
        let mut guard = REFUSED.lock().unwrap_or_else(|p| p.into_inner());
        let limiter = guard.get_or_insert_with(|| LogLimiter::new(window));
        limiter.check(host, std::time::Instant::now())
    };
    let Some(held) = admitted else { return };
    let (code, message) = match msg {
        Msg::Error { code, message, .. } => (code.as_str(), message.as_str()),
        other => ("error", other.name()),
    };
    let role = role.as_str();
    warn!(
        "refused a {role} login from {peer} (name {name:?}): {code}: {message}{}",
        ratelimit::suppressed_note(held, window)
    );
}

/// Log (rate-limited by the gate) that `place`'s connection from `peer` was evicted.
fn note_eviction(ctx: &ConnCtx, peer: &str, place: &Pending) {
    if let Some(line) = ctx
        .gate
        .note_eviction(peer, place.age(), std::time::Instant::now())
    {
        warn!("{line}");
    }
}

/// Refuse a connection the gate did not admit with `ERROR busy` and the reason, without
/// reading a frame (after a TLS handshake when the master serves TLS, so the peer can read the
/// refusal).
pub async fn refuse_busy(stream: TcpStream, ctx: Arc<ConnCtx>, refusal: Refusal) {
    let msg = error_msg("busy", refusal.message(), 0);
    refuse_with(stream, ctx, msg).await;
}

/// Answer a connection with `msg` (a fatal `ERROR`) without reading a frame, after a TLS
/// handshake when the master serves TLS, drain what the peer sent (its `HELLO`) for a moment
/// and close: a full master's `busy`, a standby's `not_leader`.
pub async fn refuse_with(stream: TcpStream, ctx: Arc<ConnCtx>, msg: Msg) {
    let deadline = Instant::now() + ctx.handshake_timeout.min(LINGER);
    match establish(stream, &ctx, deadline).await {
        Some(Transport::Plain(s)) => {
            let (rd, wr) = s.into_split();
            refuse(rd, wr, msg).await;
        }
        Some(Transport::Tls(s)) => {
            let (rd, wr) = tokio::io::split(*s);
            refuse(rd, wr, msg).await;
        }
        None => {}
    }
}

/// Refuse a connection at once, when too many refusals are already being answered: on plain
/// TCP the `ERROR busy` frame is written if the socket takes it without waiting (a fresh
/// socket always does), then the connection is closed; a TLS connection is just closed. It is
/// counted by the gate like any refusal.
pub fn refuse_now(stream: TcpStream, ctx: &ConnCtx, refusal: &Refusal) {
    if ctx.tls.is_none() {
        let mut out = BytesMut::new();
        encode(&error_msg("busy", refusal.message(), 0), &mut out);
        let _ = stream.try_write(&out);
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_halves<R, W>(
    mut rd: R,
    mut wr: W,
    peer: String,
    place: Pending,
    deadline: Instant,
    ctx: Arc<ConnCtx>,
    sched: mpsc::UnboundedSender<ToScheduler>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // Before authentication the buffer holds at most one HELLO and what came with it.
    let mut buf = BytesMut::with_capacity(16 * 1024);
    // Biased: a HELLO already received wins over an eviction that came with it.
    let hello = tokio::select! {
        biased;
        hello = tokio::time::timeout_at(deadline, read_hello(&mut rd, &mut buf)) => hello,
        () = place.evicted() => {
            note_eviction(&ctx, &peer, &place);
            let limit = ctx.gate.limits().max_unauthenticated;
            // No drain (it sent nothing to drain): under a flood, evicted connections waiting
            // for their peers to close would hold the descriptors the eviction freed.
            drop(rd);
            return answer_and_close(wr, error_msg("busy", gate::eviction_message(limit), 0)).await;
        }
    };
    place.hello_received();
    let (role, slots, name, worker_identity, identity, has, _session) = match hello {
        Ok(Ok(Msg::Hello {
            version,
            role,
            token,
            name,
            slots,
            identity: worker_identity,
            resources,
            labels,
            features,
        })) => match check_hello(&ctx, version, role, &token).await {
            Ok(identity) => match place.promote(role) {
                // The session guard holds this connection's place until the function ends.
                Ok(session) => (
                    role,
                    slots,
                    name,
                    worker_identity,
                    identity,
                    (resources, labels, features),
                    session,
                ),
                Err(refusal) => {
                    if let Some(line) = ctx.gate.note_refusal(&refusal, std::time::Instant::now()) {
                        warn!("{line}");
                    }
                    return refuse(rd, wr, error_msg("busy", refusal.message(), 0)).await;
                }
            },
            Err(msg) => {
                log_refused(&peer, &name, role, &msg);
                return refuse(rd, wr, msg).await;
            }
        },
        Ok(Ok(other)) => {
            let msg = error_msg(
                "unknown_kind",
                format!("the first message must be HELLO, not {}", other.name()),
                0,
            );
            return refuse(rd, wr, msg).await;
        }
        Ok(Err(e)) => {
            debug!(%peer, "handshake failed: {e}");
            return refuse(rd, wr, e.to_msg()).await;
        }
        Err(_) => {
            debug!(%peer, "no HELLO within the handshake timeout");
            let msg = error_msg(
                "timeout",
                format!("no HELLO within {:?}; closing", ctx.handshake_timeout),
                0,
            );
            return refuse(rd, wr, msg).await;
        }
    };
    let session = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    // A worker that said it heartbeats slower while idle is told how slow (and judged by the
    // idle limit while it holds no task); any other peer as before issue 25.
    let idle_heartbeat_ms = match (role, ctx.lease) {
        (Role::Worker, Some(_)) if has.2 & features::IDLE_HEARTBEAT != 0 => ctx.idle_heartbeat_ms,
        _ => 0,
    };
    let idle_limit = (idle_heartbeat_ms > 0)
        .then(|| Duration::from_millis(idle_heartbeat_ms.into()) + ctx.lease.unwrap_or_default());
    let welcome = Msg::Welcome {
        idle_heartbeat_ms,
        version: PROTOCOL_VERSION,
        session,
        max_frame_bytes: ctx.max_frame_bytes.min(u32::MAX as usize) as u32,
        heartbeat_ms: ctx.heartbeat_ms,
        lease_ms: ctx.lease_ms,
        instance: ctx.instance,
    };
    let mut out = BytesMut::new();
    encode(&welcome, &mut out);
    if wr.write_all(&out).await.is_err() {
        return;
    }
    let user = identity.user.clone();
    let mut bounds = Bounds::new(session, user.clone(), ctx.auth.policy());
    let slots = bounds.clamp("HELLO.slots", slots, MAX_SLOTS);
    info!(%peer, %name, %user, session, ?role, slots, "connected");
    let (tx, rx) = OutboundTx::new(ctx.max_buffered_bytes);
    let overflow = tx.shared.clone();
    let shared = tx.shared.clone();
    let join = match role {
        // The scheduler fills in the user's id from `user`.
        Role::Client => Event::ClientJoined {
            client: ClientId(session),
            user: UserId(0),
        },
        Role::Worker => Event::WorkerJoined {
            resources: has.0,
            labels: has.1,
            worker: WorkerId(session),
            slots,
            key: worker_key(&user, worker_identity.as_deref(), session),
        },
    };
    let _ = sched.send(ToScheduler::Register {
        session,
        user: user.clone(),
        name: name.clone(),
        identity: worker_identity.clone().unwrap_or_default(),
        host: peer
            .rsplit_once(':')
            .map_or(peer.clone(), |(h, _)| h.to_owned()),
        tx,
        event: join,
    });
    let idle = master_heartbeat_period(ctx.lease_ms, ctx.heartbeat_ms);
    let mut writer = tokio::spawn(write_loop(wr, rx, Some(idle)));
    let mut policy = ctx.auth.policy();
    let mut reader = Reader {
        session,
        role,
        ctx,
        sched: sched.clone(),
        verified: None,
        served: false,
        pulled: false,
        bounds,
        answered: false,
        idle_limit,
        shared,
    };
    // What ends a session besides its peer: polled only when one of them fires, not for each
    // frame the reader wakes for (`seldom.rs`).
    let dismissal = Seldom::new(async {
        tokio::select! {
            () = revoked(&mut policy, &identity) => Dismissal::Revoked,
            _ = shutdown.wait_for(|stop| *stop) => Dismissal::Shutdown,
            () = overflow.notify.notified() => Dismissal::SlowConsumer,
        }
    });
    let end = tokio::select! {
        end = reader.read_loop(&mut rd, buf) => End::Read(end),
        why = dismissal => match why {
            Dismissal::Revoked => {
                let id = identity.token_id.as_deref().unwrap_or_default();
                warn!(session, %user, token = id, "token revoked: closing the session");
                let msg = error_msg(
                    "auth",
                    format!(
                        "token {id} of user {user} was revoked (`rtpool token revoke`): the \
                         master closed this session; connect again with a valid token"
                    ),
                    0,
                );
                let _ = sched.send(ToScheduler::Reply { session, msg, close: true });
                End::Dismissed { answered: true }
            }
            Dismissal::Shutdown => End::Dismissed { answered: false },
            Dismissal::SlowConsumer => {
                warn!(session, "slow consumer: closing");
                End::Dismissed { answered: true }
            }
        },
    };
    let lost = match role {
        Role::Client => Event::ClientLost {
            client: ClientId(session),
        },
        Role::Worker => Event::WorkerLost {
            worker: WorkerId(session),
            cause: end.cause(),
        },
    };
    let _ = sched.send(ToScheduler::Closed {
        session,
        event: lost,
    });
    drop(reader);
    if end.is_answered() {
        linger(&mut rd).await;
    }
    // The writer ends once the scheduler dropped this route (or after its closing frame); a
    // peer that does not read gets LINGER to take it, then loses its connection anyway.
    if tokio::time::timeout(LINGER, &mut writer).await.is_err() {
        writer.abort();
    }
    info!(session, "disconnected");
}

/// How long the master lets a link it wrote nothing on stay silent before it sends a
/// `HEARTBEAT` of its own: half of 3 leases, the bulk of its peers' patience (they judge the
/// master silent after 3 leases and one of their heartbeats; 3 heartbeats stand for the lease
/// when there is none: docs/protocol.md). A peer then hears from an idle master at least twice
/// per window, so a period lost to a stall on either side still leaves it a whole one: 4.5 s
/// at the defaults, where the patience is 10 s. Each of these frames is a write on the master
/// and a wake-up on the peer: with 10,000 idle workers, a period of one lease (3 s) cost the
/// master about as much CPU as their own heartbeats (issue 25).
fn master_heartbeat_period(lease_ms: u32, heartbeat_ms: u32) -> Duration {
    let lease = if lease_ms > 0 {
        u64::from(lease_ms)
    } else {
        3 * u64::from(heartbeat_ms.max(1))
    };
    Duration::from_millis(3 * lease / 2)
}

/// Why the master ends a session its peer did not.
enum Dismissal {
    /// The session's token was revoked.
    Revoked,
    /// The master shuts down.
    Shutdown,
    /// The peer does not read what it is sent.
    SlowConsumer,
}

/// How a session ended, as the master saw it.
#[derive(Debug, Clone, Copy)]
enum End {
    /// Its reader ended (see [`ReadEnd`]).
    Read(ReadEnd),
    /// The master closed it (token revoked, slow consumer, shutdown); `answered`: with an
    /// `ERROR` the peer should get time to read.
    Dismissed { answered: bool },
}

impl End {
    /// Whether a worker lost this way may be blamed for its running tasks: only when the
    /// connection ended on the peer's side (it may have died with a task in it).
    fn cause(self) -> LossCause {
        match self {
            Self::Read(ReadEnd::Closed | ReadEnd::Fatal) => LossCause::Closed,
            Self::Read(ReadEnd::Silent) => LossCause::Silent,
            Self::Dismissed { .. } => LossCause::Dismissed,
        }
    }

    fn is_answered(self) -> bool {
        match self {
            Self::Read(end) => end.is_answered(),
            Self::Dismissed { answered } => answered,
        }
    }
}

/// Make room for the next read. Inside a large frame whose prefix is known, the buffer grows
/// geometrically towards the frame's size (one copy per doubling instead of one per 64 KiB),
/// but never by more than what already arrived: a peer cannot make the master reserve memory
/// for bytes it has not sent. Returns whether it reserved room for a large frame (the buffer is
/// then replaced once emptied: `reader::shrink`).
fn grow(buf: &mut BytesMut) -> bool {
    const MIN_READ: usize = 64 * 1024;
    let free = buf.capacity() - buf.len();
    let missing = rtpool_proto::frame_len(buf).map_or(0, |len| len.saturating_sub(buf.len()));
    // Room for the rest of the frame, at most doubling what is buffered.
    let want = missing.min(buf.len().max(MIN_READ));
    if missing > 0 && free < want {
        buf.reserve(want);
        return true;
    } else if free < 4096 {
        buf.reserve(MIN_READ);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_master_heartbeats_twice_per_window_of_its_peers_patience() {
        // Defaults: peers wait 3 x 3 s + 1 s = 10 s; the master speaks every 4.5 s.
        assert_eq!(
            master_heartbeat_period(3000, 1000),
            Duration::from_millis(4500)
        );
        // No lease: 3 heartbeats stand for it (peers wait 3 x 300 + 100 = 1000 ms).
        assert_eq!(master_heartbeat_period(0, 100), Duration::from_millis(450));
        // A heartbeat of 0 is read as 1 ms, never a period of nothing.
        assert_eq!(master_heartbeat_period(0, 0), Duration::from_millis(4));
    }
}
