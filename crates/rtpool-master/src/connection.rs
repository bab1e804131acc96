//! One task pair per connection: the reader authenticates the peer, then turns frames into core
//! events; the writer encodes whatever the scheduler sends it, several frames per write.
//!
//! Bad input from a peer is that peer's problem only: a fatal protocol error is answered with an
//! `ERROR` frame and closes this connection, never the master.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rtpool_core::{
    ClientId, Event, FnHash, PackageId, PackageOpts, TaskId, TaskStatus, UserId, WorkerId,
    WorkerOutcome,
};
use rtpool_proto::{
    decode_frame, encode, Msg, ProtoError, Role, PRE_AUTH_MAX_FRAME, PROTOCOL_VERSION,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::auth::{AuthError, Authenticator};
use crate::scheduler::{rejected, Out, ToScheduler};

/// Settings every connection needs.
#[derive(Debug)]
pub struct ConnCtx {
    /// Checks `HELLO` tokens (built-in and per-user).
    pub auth: Authenticator,
    /// Frame limit after authentication.
    pub max_frame_bytes: usize,
    /// Announced to workers in `WELCOME`.
    pub heartbeat_ms: u32,
    /// Time a peer has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Worker lease, announced in `WELCOME`.
    pub lease_ms: u32,
    /// This master process's random instance number, announced in `WELCOME`.
    pub instance: u64,
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Largest write the writer batches before flushing.
const WRITE_BATCH_BYTES: usize = 1 << 20;
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

/// Serve one accepted connection until it closes or the master shuts down.
pub async fn serve(
    stream: TcpStream,
    ctx: Arc<ConnCtx>,
    sched: mpsc::UnboundedSender<ToScheduler>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let hello = tokio::time::timeout(ctx.handshake_timeout, read_hello(&mut rd, &mut buf)).await;
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
            let msg = error_msg(
                "malformed",
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
    let (tx, rx) = mpsc::unbounded_channel();
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
    let writer = tokio::spawn(write_loop(wr, rx));
    let mut reader = Reader {
        session,
        role,
        ctx,
        sched: sched.clone(),
        verified: None,
    };
    let fatal = tokio::select! {
        fatal = reader.read_loop(&mut rd, buf) => fatal,
        _ = shutdown.wait_for(|stop| *stop) => false,
    };
    let _ = sched.send(ToScheduler::Closed {
        session,
        event: lost,
    });
    drop(reader);
    if fatal {
        linger(&mut rd).await;
    }
    let _ = writer.await;
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

async fn read_hello(rd: &mut OwnedReadHalf, buf: &mut BytesMut) -> Result<Msg, ProtoError> {
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
async fn refuse(mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, msg: Msg) {
    let mut out = BytesMut::new();
    encode(&msg, &mut out);
    let _ = wr.write_all(&out).await;
    let _ = wr.shutdown().await;
    linger(&mut rd).await;
}

/// Discard the peer's input until it closes or [`LINGER`] passes (bounded in time and bytes).
async fn linger(rd: &mut OwnedReadHalf) {
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
}

impl Reader {
    /// Read frames until EOF (false) or a fatal protocol error (true, after queueing `ERROR`).
    async fn read_loop(&mut self, rd: &mut OwnedReadHalf, mut buf: BytesMut) -> bool {
        let mut events = Vec::new();
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
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
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
                let opts = PackageOpts {
                    priority: opts.priority,
                    timeout_ms: opts.timeout_ms,
                    key: opts.key,
                };
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
            (Role::Worker, Msg::Pull { credits }) => Ok(Some(Event::Credit {
                worker: WorkerId(self.session),
                credits,
            })),
            (Role::Worker, Msg::Result { results }) => {
                let mut outcomes = Vec::with_capacity(results.len());
                for r in results {
                    let status = TaskStatus::from_u8(r.status).ok_or_else(|| {
                        Refusal::Fatal(error_msg("malformed", format!("RESULT for task {} has status {}, which is not a task status (0..=6)", r.task, r.status), 0))
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

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut close = push(first, &mut buf);
        while !close && buf.len() < WRITE_BATCH_BYTES {
            match rx.try_recv() {
                Ok(out) => close = push(out, &mut buf),
                Err(_) => break,
            }
        }
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

fn push(out: Out, buf: &mut BytesMut) -> bool {
    match out {
        Out::Send(msg) => {
            encode(&msg, buf);
            false
        }
        Out::SendAndClose(msg) => {
            encode(&msg, buf);
            true
        }
    }
}
