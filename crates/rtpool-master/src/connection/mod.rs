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
//! and the writer are `outbound.rs`'s.

mod outbound;

use self::outbound::write_loop;
pub use self::outbound::{OutboundRx, OutboundTx};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rtpool_core::{
    CallSpec, ClientId, Event, FnHash, PackageId, ServiceDecl, TaskId, TaskStatus, UserId,
    WorkerId, WorkerOutcome,
};
use rtpool_proto::{
    decode_frame, encode, Call, Msg, ProtoError, Role, ServedFunction, PRE_AUTH_MAX_FRAME,
    PROTOCOL_VERSION,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

use crate::auth::{AuthError, Authenticator};
use crate::scheduler::{rejected, ToScheduler};
use crate::tls::Tls;

/// Settings every connection needs.
pub struct ConnCtx {
    /// Checks `HELLO` tokens (built-in and per-user).
    pub auth: Authenticator,
    /// Frame limit after authentication.
    pub max_frame_bytes: usize,
    /// Announced to workers in `WELCOME`.
    pub heartbeat_ms: u32,
    /// Time a peer has to complete its handshake, TLS handshake included.
    pub handshake_timeout: Duration,
    /// Worker lease, announced in `WELCOME`.
    pub lease_ms: u32,
    /// This master process's random instance number, announced in `WELCOME`.
    pub instance: u64,
    /// TLS setup; `None` for plain TCP.
    pub tls: Option<Tls>,
    /// Connections served at once; the accept loop refuses more with `ERROR busy`.
    pub max_connections: usize,
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
            .field("max_connections", &self.max_connections)
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

fn error_msg(code: &str, message: impl Into<String>, reference: u64) -> Msg {
    Msg::Error {
        code: code.into(),
        message: message.into(),
        reference,
    }
}

/// A connection after its transport handshake: plain TCP, or TLS over TCP.
enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The first byte of a TLS record carrying a handshake (a ClientHello starts with it). Our own
/// frames start with a big-endian length, whose first byte is 0 for any frame the master takes
/// before authentication.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Bring `stream` to where frames can be read: nothing for plain TCP, the TLS handshake (by
/// `deadline`) for TLS. A plain peer of a TLS master is refused here with a readable `ERROR`.
async fn establish(stream: TcpStream, ctx: &ConnCtx, deadline: Instant) -> Option<Transport> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = &ctx.tls else {
        return Some(Transport::Plain(stream));
    };
    let handshake = async {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(1) if first[0] == TLS_HANDSHAKE_RECORD => {}
            Ok(1) => return Err(Some(stream)),
            _ => return Err(None),
        }
        match tls.acceptor.accept(stream).await {
            Ok(s) => Ok(s),
            Err(e) => {
                debug!("TLS handshake failed: {e}");
                Err(None)
            }
        }
    };
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(s)) => Some(Transport::Tls(Box::new(s))),
        Ok(Err(Some(plain))) => {
            let (rd, wr) = plain.into_split();
            let msg = error_msg(
                "malformed",
                "this master requires TLS: connect with tls=True (rtpool worker --tls) and, for \
                 a self-signed master, its certificate as the CA file",
                0,
            );
            refuse(rd, wr, msg).await;
            None
        }
        // A failed or unfinished TLS handshake leaves no channel to send `ERROR` on.
        Ok(Err(None)) | Err(_) => None,
    }
}

/// Serve one accepted connection until it closes or the master shuts down.
pub async fn serve(
    stream: TcpStream,
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
    match establish(stream, &ctx, deadline).await {
        Some(Transport::Plain(s)) => {
            let (rd, wr) = s.into_split();
            serve_halves(rd, wr, peer, deadline, ctx, sched, shutdown).await;
        }
        Some(Transport::Tls(s)) => {
            let (rd, wr) = tokio::io::split(*s);
            serve_halves(rd, wr, peer, deadline, ctx, sched, shutdown).await;
        }
        None => debug!(%peer, "closed during the transport handshake"),
    }
}

/// Refuse a connection beyond the connection limit with `ERROR busy`, without reading a frame
/// (after a TLS handshake when the master serves TLS, so the peer can read the refusal).
pub async fn refuse_busy(stream: TcpStream, ctx: Arc<ConnCtx>) {
    let deadline = Instant::now() + ctx.handshake_timeout.min(LINGER);
    let msg = error_msg(
        "busy",
        format!(
            "the master serves its limit of {} connections; retry later or raise \
             --max-connections",
            ctx.max_connections
        ),
        0,
    );
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

async fn serve_halves<R, W>(
    mut rd: R,
    mut wr: W,
    peer: String,
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
    let hello = tokio::time::timeout_at(deadline, read_hello(&mut rd, &mut buf)).await;
    let (role, slots, name, user) = match hello {
        Ok(Ok(Msg::Hello {
            version,
            role,
            token,
            name,
            slots,
        })) => match check_hello(&ctx, version, role, &token).await {
            Ok(user) => (role, slots, name, user),
            Err(msg) => {
                warn!(%peer, %name, "refused: {msg:?}");
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
    let welcome = Msg::Welcome {
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
    info!(%peer, %name, %user, session, ?role, slots, "connected");
    let (tx, rx) = OutboundTx::new(ctx.max_buffered_bytes);
    let overflow = tx.shared.clone();
    let (join, lost) = match role {
        Role::Client => (
            // The scheduler fills in the user's id from `user`.
            Event::ClientJoined {
                client: ClientId(session),
                user: UserId(0),
            },
            Event::ClientLost {
                client: ClientId(session),
            },
        ),
        Role::Worker => (
            Event::WorkerJoined {
                worker: WorkerId(session),
                slots,
            },
            Event::WorkerLost {
                worker: WorkerId(session),
            },
        ),
    };
    let _ = sched.send(ToScheduler::Register {
        session,
        user,
        tx,
        event: join,
    });
    let mut writer = tokio::spawn(write_loop(wr, rx));
    let mut reader = Reader {
        session,
        role,
        ctx,
        sched: sched.clone(),
        verified: None,
        served: false,
        pulled: false,
    };
    let fatal = tokio::select! {
        fatal = reader.read_loop(&mut rd, buf) => fatal,
        _ = shutdown.wait_for(|stop| *stop) => false,
        () = overflow.notify.notified() => {
            warn!(session, "slow consumer: closing");
            true
        }
    };
    let _ = sched.send(ToScheduler::Closed {
        session,
        event: lost,
    });
    drop(reader);
    if fatal {
        linger(&mut rd).await;
    }
    // The writer ends once the scheduler dropped this route (or after its closing frame); a
    // peer that does not read gets LINGER to take it, then loses its connection anyway.
    if tokio::time::timeout(LINGER, &mut writer).await.is_err() {
        writer.abort();
    }
    info!(session, "disconnected");
}

/// Check a `HELLO`'s version and token; returns the user the connection acts for.
async fn check_hello(ctx: &ConnCtx, version: u32, role: Role, token: &str) -> Result<String, Msg> {
    if version != PROTOCOL_VERSION {
        return Err(error_msg(
            "version",
            format!("protocol version {version} is not supported; this master speaks version {PROTOCOL_VERSION}: upgrade rtpool on this peer or the master"),
            0,
        ));
    }
    // A store lookup is bounded like the rest of the handshake (an unreachable database must
    // not pin connections).
    let checked = tokio::time::timeout(ctx.handshake_timeout, ctx.auth.authenticate(token, role))
        .await
        .unwrap_or_else(|_| {
            Err(AuthError::Lookup(format!(
                "the token store did not answer within {:?}",
                ctx.handshake_timeout
            )))
        });
    checked.map_err(|e| error_msg("auth", e.to_string(), 0))
}

async fn read_hello<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
) -> Result<Msg, ProtoError> {
    loop {
        if let Some(msg) = decode_frame(buf, PRE_AUTH_MAX_FRAME)? {
            return Ok(msg);
        }
        let n = rd.read_buf(buf).await.map_err(|e| ProtoError::Malformed {
            kind: None,
            reason: format!("connection failed during handshake: {e}"),
        })?;
        if n == 0 {
            return Err(ProtoError::Malformed {
                kind: None,
                reason: "connection closed before HELLO".into(),
            });
        }
    }
}

/// Send a fatal error on a connection that never authenticated, then close it.
async fn refuse<R, W>(mut rd: R, mut wr: W, msg: Msg)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = BytesMut::new();
    encode(&msg, &mut out);
    // Bounded: a peer that does not read cannot keep a refused connection open.
    let _ = tokio::time::timeout(LINGER, async {
        let _ = wr.write_all(&out).await;
        let _ = wr.shutdown().await;
    })
    .await;
    linger(&mut rd).await;
}

/// Discard the peer's input until it closes or [`LINGER`] passes (bounded in time and bytes).
async fn linger<R: AsyncRead + Unpin>(rd: &mut R) {
    let mut sink = [0u8; 8192];
    let mut budget = 16usize << 20;
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = rd.read(&mut sink).await {
            if n == 0 || n >= budget {
                break;
            }
            budget -= n;
        }
    })
    .await;
}

/// How a message is refused.
enum Refusal {
    /// Answer with this error; the connection stays open.
    Rejected(Msg),
    /// Answer with this error and close the connection.
    Fatal(Msg),
}

struct Reader {
    session: u64,
    role: Role,
    ctx: Arc<ConnCtx>,
    sched: mpsc::UnboundedSender<ToScheduler>,
    /// The last (hash, code) pair whose SHA-256 was verified, so a client that submits the same
    /// function again pays a memcmp instead of a hash.
    verified: Option<(Bytes, Bytes)>,
    /// This worker sent its `SERVE` (at most one per connection).
    served: bool,
    /// This worker sent a `PULL` (a `SERVE` must come before the first one).
    pulled: bool,
}

impl Reader {
    /// Read frames until EOF (false) or a fatal protocol error (true, after queueing `ERROR`).
    /// A peer silent past its lease (worker) or idle timeout (client) is such an error.
    async fn read_loop<R: AsyncRead + Unpin>(&mut self, rd: &mut R, mut buf: BytesMut) -> bool {
        let mut events = Vec::new();
        let (silence, code) = match self.role {
            Role::Worker => (self.ctx.lease, "lease_expired"),
            Role::Client => (self.ctx.client_timeout, "idle"),
        };
        // One timer for the connection's life: a read only notes its time, and the timer,
        // when it fires early, moves itself to the last read plus the allowed silence.
        let silence = silence.unwrap_or(NEVER);
        let mut last_read = Instant::now();
        let timer = tokio::time::sleep_until(last_read + silence);
        tokio::pin!(timer);
        loop {
            loop {
                match decode_frame(&mut buf, self.ctx.max_frame_bytes) {
                    Ok(Some(msg)) => match self.on_message(msg) {
                        Ok(Some(ev)) => events.push(ev),
                        Ok(None) => {}
                        Err(Refusal::Rejected(msg)) => self.reply(&mut events, msg, false),
                        Err(Refusal::Fatal(msg)) => {
                            self.reply(&mut events, msg, true);
                            return true;
                        }
                    },
                    Ok(None) => break,
                    Err(e) if !e.is_fatal() => self.reply(&mut events, e.to_msg(), false),
                    Err(e) => {
                        warn!(session = self.session, "protocol error: {e}");
                        self.reply(&mut events, e.to_msg(), true);
                        return true;
                    }
                }
            }
            self.flush(&mut events);
            grow(&mut buf);
            let read = loop {
                tokio::select! {
                    biased;
                    read = rd.read_buf(&mut buf) => break read,
                    () = &mut timer => {
                        let deadline = last_read + silence;
                        if Instant::now() >= deadline {
                            let msg = self.silence_error(code, silence);
                            self.reply(&mut events, msg, true);
                            return true;
                        }
                        timer.as_mut().reset(deadline);
                    }
                }
            };
            match read {
                Ok(0) | Err(_) => return false,
                // Any bytes count as a sign of life, not only whole frames: a worker uploading
                // a large RESULT over a slow link is busy, not silent.
                Ok(_) => last_read = Instant::now(),
            }
        }
    }

    fn silence_error(&self, code: &str, silence: Duration) -> Msg {
        let ms = silence.as_millis();
        let message = match self.role {
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
            ) => Ok(Some(Event::SubmitCalls {
                client: ClientId(self.session),
                req_id,
                // The scheduler numbers the package, as for SUBMIT.
                package: PackageId(0),
                opts,
                calls: calls.into_iter().map(to_call_spec).collect(),
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
                    credits,
                }))
            }
            (Role::Worker, Msg::Serve { functions }) => {
                self.check_serve_order()?;
                self.served = true;
                Ok(Some(Event::Serve {
                    worker: WorkerId(self.session),
                    functions: functions.into_iter().map(to_service_decl).collect(),
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
                        exec_us: r.exec_us,
                        wait_us: r.wait_us,
                        flush_us: r.flush_us,
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
            (_, Msg::Heartbeat) => Ok(None),
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

/// The core's declaration of one function a worker's `SERVE` lists.
fn to_service_decl(f: ServedFunction) -> ServiceDecl {
    let ServedFunction {
        name,
        version,
        interface,
    } = f;
    ServiceDecl {
        name,
        version,
        interface,
    }
}

/// The core's call of one entry of a `CALL`; the payload is passed on untouched.
fn to_call_spec(c: Call) -> CallSpec {
    // Destructured so that a new wire field cannot be forgotten here.
    let Call {
        name,
        version,
        args,
        deps,
        fetch,
    } = c;
    CallSpec {
        name,
        version,
        args,
        deps,
        fetch,
    }
}

/// Make room for the next read. Inside a large frame whose prefix is known, the buffer grows
/// geometrically towards the frame's size (one copy per doubling instead of one per 64 KiB),
/// but never by more than what already arrived: a peer cannot make the master reserve memory
/// for bytes it has not sent.
fn grow(buf: &mut BytesMut) {
    const MIN_READ: usize = 64 * 1024;
    let free = buf.capacity() - buf.len();
    let missing = match buf.get(..4) {
        Some(prefix) => {
            let len = u32::from_be_bytes(prefix.try_into().expect("4 bytes")) as usize;
            (4 + len).saturating_sub(buf.len())
        }
        None => 0,
    };
    // Room for the rest of the frame, at most doubling what is buffered.
    let want = missing.min(buf.len().max(MIN_READ));
    if missing > 0 && free < want {
        buf.reserve(want);
    } else if free < 4096 {
        buf.reserve(MIN_READ);
    }
}
