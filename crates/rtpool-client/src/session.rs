//! One connection to a master: dialling an address (TCP, optional TLS), the handshake
//! (`HELLO` / `WELCOME` or `ERROR`), reading frames with `rtpool-proto`'s decoder and a
//! writer task that sends frames in order, small ones batched into one write.
//!
//! What to send and what the frames mean is the driver's (`driver.rs`).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rtpool_proto::{
    decode_frame, encode, frame_len, Msg, Role, DEFAULT_MAX_FRAME, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::error::ClientError;

/// A byte stream to the master: TCP, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One encoded frame: the bytes of its prefix and head, then its segments.
pub(crate) type Frame = (Bytes, Vec<Bytes>);

/// What the master's `WELCOME` said.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Welcome {
    pub max_frame_bytes: usize,
    pub heartbeat_ms: u32,
    pub instance: u64,
}

/// The reading side of a connection.
pub(crate) struct Reader {
    half: ReadHalf<Box<dyn Stream>>,
    buf: BytesMut,
    max_frame: usize,
}

/// A connected, authenticated session.
pub(crate) struct Session {
    pub reader: Reader,
    pub writer: mpsc::UnboundedSender<Frame>,
    pub welcome: Welcome,
    pub address: String,
}

/// Why one address did not give a session.
pub(crate) enum DialError {
    /// Try the next address (refused, timed out, busy).
    Retry(String),
    /// Stop: retrying cannot help (bad token, TLS setup, protocol version).
    Fatal(ClientError),
}

/// Tries each address of `config` once, in order; the first session that authenticates.
pub(crate) async fn connect_any(config: &Config, token: &str) -> Result<Session, ClientError> {
    let mut last = String::from("no address");
    for address in config.addresses() {
        match dial(config, address, token).await {
            Ok(s) => return Ok(s),
            Err(DialError::Retry(why)) => last = format!("{address}: {why}"),
            Err(DialError::Fatal(e)) => return Err(e),
        }
    }
    Err(ClientError::Unreachable {
        addresses: config.addresses().join(","),
        reason: last,
    })
}

async fn dial(config: &Config, address: &str, token: &str) -> Result<Session, DialError> {
    let work = async {
        let tcp = TcpStream::connect(address)
            .await
            .map_err(|e| DialError::Retry(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Stream> = match &config.ca_file {
            None => Box::new(tcp),
            Some(ca) => {
                let connector = crate::tls::connector(ca).map_err(DialError::Fatal)?;
                let name = crate::tls::server_name(address, config.server_name.as_deref())
                    .map_err(DialError::Fatal)?;
                let tls = connector.connect(name, tcp).await.map_err(|e| {
                    DialError::Retry(format!("TLS handshake failed: {e} (is the CA file the master's certificate, and does the master use --tls?)"))
                })?;
                Box::new(tls)
            }
        };
        handshake(stream, address, token).await
    };
    match tokio::time::timeout(config.connect_timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Retry(format!(
            "no WELCOME within {:?}",
            config.connect_timeout
        ))),
    }
}

async fn handshake(
    stream: Box<dyn Stream>,
    address: &str,
    token: &str,
) -> Result<Session, DialError> {
    let (half, mut write) = tokio::io::split(stream);
    let hello = Msg::Hello {
        labels: Default::default(),
        resources: Default::default(),
        version: PROTOCOL_VERSION,
        role: Role::Client,
        token: token.to_owned(),
        name: format!("rtpool-client (Rust) pid {}", std::process::id()),
        slots: 0,
        identity: None,
    };
    let mut out = BytesMut::new();
    encode(&hello, &mut out);
    write
        .write_all(&out)
        .await
        .map_err(|e| DialError::Retry(e.to_string()))?;
    let mut reader = Reader {
        half,
        buf: BytesMut::with_capacity(64 * 1024),
        max_frame: DEFAULT_MAX_FRAME,
    };
    let welcome = match reader.next().await {
        Ok(Msg::Welcome {
            max_frame_bytes,
            heartbeat_ms,
            instance,
            ..
        }) => Welcome {
            max_frame_bytes: max_frame_bytes as usize,
            heartbeat_ms,
            instance,
        },
        Ok(Msg::Error { code, message, .. }) => return Err(refusal(address, &code, message)),
        Ok(other) => {
            return Err(DialError::Retry(format!(
                "expected WELCOME, got {}",
                other.name()
            )))
        }
        Err(e) => return Err(DialError::Retry(e)),
    };
    reader.max_frame = welcome.max_frame_bytes.max(DEFAULT_MAX_FRAME);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(write_frames(write, rx));
    Ok(Session {
        reader,
        writer: tx,
        welcome,
        address: address.to_owned(),
    })
}

fn refusal(address: &str, code: &str, message: String) -> DialError {
    match code {
        "auth" => DialError::Fatal(ClientError::Auth {
            address: address.to_owned(),
            message,
        }),
        "version" => DialError::Fatal(ClientError::Config(format!(
            "the master at {address} speaks another protocol version ({message}): upgrade rtpool on one side"
        ))),
        _ => DialError::Retry(format!("{code}: {message}")),
    }
}

impl Reader {
    /// The next message if a whole frame is buffered already; never waits.
    pub(crate) fn try_next(&mut self) -> Option<Result<Msg, String>> {
        match decode_frame(&mut self.buf, self.max_frame) {
            Ok(Some(msg)) => Some(Ok(msg)),
            Ok(None) => None,
            Err(e) => Some(Err(format!(
                "the master sent a frame this client cannot read: {e}"
            ))),
        }
    }

    /// The next message; `Err` with the reason when the connection ended or broke.
    pub(crate) async fn next(&mut self) -> Result<Msg, String> {
        loop {
            match decode_frame(&mut self.buf, self.max_frame) {
                Ok(Some(msg)) => return Ok(msg),
                Ok(None) => {}
                Err(e) => {
                    return Err(format!(
                        "the master sent a frame this client cannot read: {e}"
                    ))
                }
            }
            let want = frame_len(&self.buf).unwrap_or(0).max(64 * 1024);
            self.buf.reserve(want.saturating_sub(self.buf.len()));
            match self.half.read_buf(&mut self.buf).await {
                Ok(0) => return Err("the master closed the connection".into()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// Writes frames in order until the channel closes or a write fails; frames queued together
/// go out in one write when they are small.
async fn write_frames(
    mut write: WriteHalf<Box<dyn Stream>>,
    mut rx: mpsc::UnboundedReceiver<Frame>,
) {
    let mut batch = BytesMut::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some((head, segments)) = next.take() {
            batch.extend_from_slice(&head);
            if !segments.is_empty() {
                if write.write_all(&batch).await.is_err() {
                    return;
                }
                batch.clear();
                for s in &segments {
                    if write.write_all(s).await.is_err() {
                        return;
                    }
                }
            }
            if batch.len() < 64 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() && write.write_all(&batch).await.is_err() {
            return;
        }
        batch.clear();
    }
    let _ = write.shutdown().await;
}

/// Backoff between reconnection attempts: 50 ms doubling to 2 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.min(5)).min(Duration::from_secs(2))
}

/// A message as one plain frame.
pub(crate) fn plain(msg: &Msg) -> Frame {
    let mut out = BytesMut::new();
    encode(msg, &mut out);
    (out.freeze(), Vec::new())
}
