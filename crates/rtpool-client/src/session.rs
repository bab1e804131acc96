//! One connection to a master: dialling an address (TCP, optional TLS), the handshake
//! (`HELLO` / `WELCOME` or `ERROR`), reading frames with `rtpool-proto`'s decoder and a
//! writer task that sends frames in order, small ones batched into one write.
//!
//! What to send and what the frames mean is the driver's (`driver.rs`).

use std::collections::VecDeque;
use std::net::SocketAddr;
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
use crate::masters::{leader_of, Masters};

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
    /// The master is a standby (or a deposed leader): try the leader it names next, if any,
    /// then the other addresses.
    NotLeader { leader: Option<String>, why: String },
    /// Stop: retrying cannot help (bad token, TLS setup, protocol version).
    Fatal(ClientError),
}

/// One pass over the addresses of `config` in the order `masters` gives (the last good one
/// first), each at most once; a standby's `not_leader` puts the leader it names next. A name
/// with several records is several masters: each record is dialled in turn (TLS still checks
/// the name). The first session that authenticates.
pub(crate) async fn connect_any(
    config: &Config,
    masters: &mut Masters,
    token: &str,
) -> Result<Session, ClientError> {
    let mut queue: VecDeque<String> = masters.pass().into();
    let wait = masters.dial_timeout(config.connect_timeout);
    let mut tried: Vec<String> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    let mut answered = false;
    while let Some(address) = queue.pop_front() {
        if tried.contains(&address) {
            continue;
        }
        tried.push(address.clone());
        for (target, label) in records(&address).await {
            match dial(config, &address, target, &label, token, wait).await {
                Ok(s) => {
                    masters.on_connected(&address);
                    return Ok(s);
                }
                Err(DialError::Retry(why)) => reasons.push(format!("{label}: {why}")),
                Err(DialError::NotLeader { leader, why }) => {
                    answered = true;
                    reasons.push(format!("{label}: {why}"));
                    if let Some(leader) = leader.filter(|l| !tried.contains(l)) {
                        queue.retain(|a| *a != leader);
                        queue.push_front(leader);
                        break; // the other records of this name come after the leader
                    }
                }
                Err(DialError::Fatal(e)) => return Err(e),
            }
        }
        masters.on_failed(&address);
    }
    masters.on_pass_failed(answered);
    Err(ClientError::Unreachable {
        addresses: config.addresses().join(","),
        reason: if reasons.is_empty() {
            "no address".into()
        } else {
            reasons.join("; ")
        },
    })
}

/// The records of `address`: each resolved socket address when the name has several (with a
/// label naming it), else the address itself (resolved again by the dial, which reports a
/// failure to resolve it).
async fn records(address: &str) -> Vec<(Option<SocketAddr>, String)> {
    let mut ips: Vec<SocketAddr> = Vec::new();
    if let Ok(found) = tokio::net::lookup_host(address).await {
        for a in found {
            if !ips.contains(&a) {
                ips.push(a);
            }
        }
    }
    if ips.len() <= 1 {
        return vec![(None, address.to_owned())];
    }
    ips.into_iter()
        .map(|ip| (Some(ip), format!("{address} ({})", ip.ip())))
        .collect()
}

async fn dial(
    config: &Config,
    address: &str,
    target: Option<SocketAddr>,
    label: &str,
    token: &str,
    wait: Duration,
) -> Result<Session, DialError> {
    let work = async {
        let tcp = match target {
            Some(ip) => TcpStream::connect(ip).await,
            None => TcpStream::connect(address).await,
        }
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
        handshake(stream, label, token).await
    };
    match tokio::time::timeout(wait, work).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Retry(format!("no WELCOME within {wait:?}"))),
    }
}

async fn handshake(
    stream: Box<dyn Stream>,
    address: &str,
    token: &str,
) -> Result<Session, DialError> {
    let (half, mut write) = tokio::io::split(stream);
    let hello = Msg::Hello {
        features: 0,
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
        "not_leader" => DialError::NotLeader {
            leader: leader_of(&message),
            why: format!("not the leader ({message})"),
        },
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

/// Backoff between reconnection passes: 50 ms doubling to 2 s, each drawn between half and
/// all of it (clients of a failed-over master do not come back in step).
pub(crate) fn backoff(attempt: u32) -> Duration {
    jittered(Duration::from_millis(50u64 << attempt.min(5)).min(Duration::from_secs(2)))
}

/// The pause before the next pass: [`LEADER_SEARCH_PAUSE`](crate::masters::LEADER_SEARCH_PAUSE)
/// while a standby answered the last one (an election), else [`backoff`]`(attempt)`.
pub(crate) fn pause(masters: &Masters, attempt: u32) -> Duration {
    if masters.standby_answered {
        jittered(crate::masters::LEADER_SEARCH_PAUSE)
    } else {
        backoff(attempt)
    }
}

/// Between half and all of `full`.
fn jittered(full: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::getrandom(&mut byte);
    full / 2 + full / 2 * u32::from(byte[0]) / 255
}

/// A message as one plain frame.
pub(crate) fn plain(msg: &Msg) -> Frame {
    let mut out = BytesMut::new();
    encode(msg, &mut out);
    (out.freeze(), Vec::new())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::net::TcpListener;

    use super::*;

    /// A stand-in master on 127.0.0.1 answering every `HELLO` with `answer`; the count of
    /// `HELLO`s it read.
    async fn fake(answer: Msg) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let hellos = Arc::new(AtomicUsize::new(0));
        let count = hellos.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = BytesMut::new();
                while !matches!(decode_frame(&mut buf, DEFAULT_MAX_FRAME), Ok(Some(_))) {
                    if sock.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        break;
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let mut out = BytesMut::new();
                encode(&answer, &mut out);
                let _ = sock.write_all(&out).await;
                if matches!(answer, Msg::Error { .. }) {
                    drop(sock);
                } else {
                    tokio::spawn(async move {
                        let mut sink = [0u8; 1024];
                        while sock.read(&mut sink).await.unwrap_or(0) > 0 {}
                    });
                }
            }
        });
        (address, hellos)
    }

    fn welcome() -> Msg {
        Msg::Welcome {
            idle_heartbeat_ms: 0,
            version: PROTOCOL_VERSION,
            session: 1,
            max_frame_bytes: DEFAULT_MAX_FRAME as u32,
            heartbeat_ms: 1000,
            lease_ms: 3000,
            instance: 7,
        }
    }

    fn not_leader(leader: &str) -> Msg {
        Msg::Error {
            code: "not_leader".into(),
            message: format!("this master is a standby (leader: {leader})"),
            reference: 0,
        }
    }

    fn dead() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[tokio::test]
    async fn a_standby_sends_the_dial_to_the_leader_it_names() {
        let (leader, leader_hellos) = fake(welcome()).await;
        let (other, other_hellos) = fake(not_leader("unknown")).await;
        let (standby, standby_hellos) = fake(not_leader(&leader)).await;
        let config = Config::new(&format!("{},{standby},{other},{leader}", dead())).unwrap();
        let mut masters = Masters::new(config.addresses());
        let s = connect_any(&config, &mut masters, "t").await.unwrap();
        assert_eq!(s.address, leader);
        assert_eq!(s.welcome.instance, 7);
        let counts =
            [&standby_hellos, &other_hellos, &leader_hellos].map(|c| c.load(Ordering::SeqCst));
        assert_eq!(counts, [1, 0, 1]);
        assert_eq!(masters.pass()[0], leader); // the next pass starts where this one ended
    }

    #[tokio::test]
    async fn no_leader_among_the_masters_is_unreachable_with_every_reason() {
        let (a, _) = fake(not_leader("unknown")).await;
        let config = Config::new(&format!("{a},{}", dead())).unwrap();
        let mut masters = Masters::new(config.addresses());
        let Err(e) = connect_any(&config, &mut masters, "t").await else {
            panic!("connected without a leader");
        };
        let text = e.to_string();
        assert!(matches!(e, ClientError::Unreachable { .. }), "{text}");
        assert!(text.contains(&format!("{a}: not the leader")), "{text}");
        assert!(text.contains("refused"), "{text}");
    }
}
