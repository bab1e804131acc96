//! A connection's handshake before it is served: the transport (plain TCP or TLS, told apart
//! by the first byte), the `HELLO` with its version and token check, and how a connection that
//! never authenticated is refused (an `ERROR` frame, then a bounded drain of its input), and
//! the [`WorkerKey`] a worker's `HELLO.identity` gives.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use rtpool_core::WorkerKey;
use rtpool_proto::{
    decode_frame, encode, Msg, ProtoError, Role, PRE_AUTH_MAX_FRAME, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use super::{ConnCtx, LINGER};
use crate::auth::{AuthError, Identity};
use crate::outbound::error_msg;

/// The keyed hash of worker identities, with a random key per master process: a peer cannot
/// choose an identity that lands on another worker's key without knowing it.
static WORKER_KEYS: OnceLock<RandomState> = OnceLock::new();

/// The key the core keeps a worker's pace under: its user and `HELLO.identity` (the same after
/// a reconnect or a restart of its process), or, for a peer that sent none, its session (the
/// pace is then this connection's only).
pub(super) fn worker_key(user: &str, identity: Option<&str>, session: u64) -> WorkerKey {
    let keys = WORKER_KEYS.get_or_init(RandomState::new);
    WorkerKey(match identity.filter(|i| !i.is_empty()) {
        Some(identity) => keys.hash_one((user, identity)),
        None => keys.hash_one(session),
    })
}

/// A connection after its transport handshake: plain TCP, or TLS over TCP.
pub(super) enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The first byte of a TLS record carrying a handshake (a ClientHello starts with it). Our own
/// frames start with a big-endian length, whose first byte is 0 for any frame the master takes
/// before authentication.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Bring `stream` to where frames can be read: nothing for plain TCP, the TLS handshake (by
/// `deadline`) for TLS. A plain peer of a TLS master is refused here with a readable `ERROR`.
pub(super) async fn establish(
    stream: TcpStream,
    ctx: &ConnCtx,
    deadline: Instant,
) -> Option<Transport> {
    let _ = stream.set_nodelay(true);
    // Data unacknowledged for the lease (10 s without one) means the path is gone.
    let user_timeout = ctx
        .lease
        .unwrap_or(Duration::from_secs(10))
        .max(Duration::from_secs(1));
    super::keepalive::enable(&stream, user_timeout);
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

/// Check a `HELLO`'s version and token; returns who the connection acts for.
pub(super) async fn check_hello(
    ctx: &ConnCtx,
    version: u32,
    role: Role,
    token: &str,
) -> Result<Identity, Msg> {
    if version != PROTOCOL_VERSION {
        return Err(error_msg(
            "version",
            format!(
                "protocol version {version} is not supported; this master speaks version \
                 {PROTOCOL_VERSION} (segmented frames, out-of-band buffer payloads): install \
                 the same rtpool release on this peer as on the master"
            ),
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

pub(super) async fn read_hello<R: AsyncRead + Unpin>(
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
pub(super) async fn refuse<R, W>(mut rd: R, wr: W, msg: Msg)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    answer_and_close(wr, msg).await;
    linger(&mut rd).await;
}

/// Write `msg` and shut the write side down, without draining the peer's input.
pub(super) async fn answer_and_close<W: AsyncWrite + Unpin>(mut wr: W, msg: Msg) {
    let mut out = BytesMut::new();
    encode(&msg, &mut out);
    // Bounded: a peer that does not read cannot keep a refused connection open.
    let _ = tokio::time::timeout(LINGER, async {
        let _ = wr.write_all(&out).await;
        let _ = wr.shutdown().await;
    })
    .await;
}

/// Discard the peer's input until it closes or [`LINGER`] passes (bounded in time and bytes).
pub(super) async fn linger<R: AsyncRead + Unpin>(rd: &mut R) {
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
