//! Limits and TLS against an in-process master, with raw protocol peers on loopback: the
//! connection limit, the handshake deadline, worker leases, idle clients, slow consumers, and
//! the same protocol over TLS (and what a peer of the wrong kind sees).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rtpool_master::{MasterConfig, MasterHandle};
use rtpool_proto::{decode_frame, encode_to_vec, Msg, PackageOpts, Role, WorkerResult};
use sha2::{Digest, Sha256};
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Longest any single wait in these tests may take before the test fails.
const WAIT: Duration = Duration::from_secs(10);

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

struct Peer {
    sock: Box<dyn Stream>,
    /// The TCP socket under `sock`, to change its read timeout.
    tcp: TcpStream,
    buf: BytesMut,
}

impl Peer {
    fn tcp(master: &MasterHandle) -> TcpStream {
        let sock = TcpStream::connect(master.addr()).unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        sock.set_nodelay(true).unwrap();
        sock
    }

    fn plain(master: &MasterHandle) -> Self {
        let tcp = Self::tcp(master);
        Self {
            sock: Box::new(tcp.try_clone().unwrap()),
            tcp,
            buf: BytesMut::new(),
        }
    }

    /// A TLS connection that trusts `ca` and checks the certificate against 127.0.0.1.
    fn tls(master: &MasterHandle, ca: &Path) -> Self {
        let tcp = Self::tcp(master);
        let conn =
            ClientConnection::new(tls_config(ca), ServerName::try_from("127.0.0.1").unwrap())
                .unwrap();
        Self {
            sock: Box::new(StreamOwned::new(conn, tcp.try_clone().unwrap())),
            tcp,
            buf: BytesMut::new(),
        }
    }

    fn hello(mut self, role: Role, token: &str, slots: u32) -> (Self, Msg) {
        self.send(&Msg::Hello {
            features: 0,
            labels: Default::default(),
            resources: Default::default(),
            version: rtpool_proto::PROTOCOL_VERSION,
            role,
            token: token.into(),
            name: "limits-test".into(),
            slots,
            identity: None,
        });
        let reply = self.recv();
        (self, reply)
    }

    fn send(&mut self, msg: &Msg) {
        self.sock.write_all(&encode_to_vec(msg)).unwrap();
        self.sock.flush().unwrap();
    }

    /// Next message, or `None` if none came within `timeout`. Panics when the connection closes.
    fn try_recv(&mut self, timeout: Duration) -> Option<Msg> {
        self.tcp.set_read_timeout(Some(timeout)).unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = decode_frame(&mut self.buf, 1 << 30).unwrap() {
                return Some(m);
            }
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => panic!("connection closed while a message was expected"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                }
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Next message, or panic after [`WAIT`].
    fn recv(&mut self) -> Msg {
        self.try_recv(WAIT).expect("no message within the wait")
    }

    /// The next message other than the master's `HEARTBEAT` (it sends one on a link it left
    /// silent for a lease).
    fn recv_skipping_heartbeats(&mut self) -> Msg {
        loop {
            match self.recv() {
                Msg::Heartbeat => {}
                msg => return msg,
            }
        }
    }

    /// True when the master closed the connection (after any pending messages).
    fn is_closed(&mut self) -> bool {
        self.tcp.set_read_timeout(Some(WAIT)).unwrap();
        let mut chunk = [0u8; 1024];
        matches!(self.sock.read(&mut chunk), Ok(0) | Err(_))
    }
}

fn tls_config(ca: &Path) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

fn start(config: MasterConfig) -> MasterHandle {
    MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        ..config
    })
    .unwrap()
}

fn client_token(m: &MasterHandle) -> String {
    m.tokens().client.clone()
}

fn worker_token(m: &MasterHandle) -> String {
    m.tokens().worker.clone()
}

fn submit(req_id: u64, code: &[u8], tasks: Vec<Bytes>) -> Msg {
    Msg::Submit {
        req_id,
        fn_hash: Bytes::copy_from_slice(&Sha256::digest(code)),
        fn_code: Bytes::copy_from_slice(code),
        opts: PackageOpts::default(),
        tasks,
    }
}

fn expect_error(msg: Msg, code: &str) -> String {
    match msg {
        Msg::Error {
            code: c, message, ..
        } if c == code => message,
        other => panic!("expected ERROR {code}, got {other:?}"),
    }
}

fn assignments(msg: Msg) -> Vec<rtpool_proto::Assignment> {
    match msg {
        Msg::Assign { tasks, .. } => tasks,
        other => panic!("expected ASSIGN, got {other:?}"),
    }
}

fn echo_results(tasks: &[rtpool_proto::Assignment]) -> Msg {
    let results = tasks
        .iter()
        .map(|a| WorkerResult {
            task: a.task,
            attempt: a.attempt,
            status: 0,
            data: a.args.clone(),
            exec_us: 1,
            wait_us: 0,
            flush_us: 0,
        })
        .collect();
    Msg::Result { results }
}

/// Wait until `pred` holds, polling every 10 ms for at most [`WAIT`].
fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!("rtpool-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn connections_beyond_the_limit_get_busy_and_the_limit_frees_up() {
    let m = start(MasterConfig {
        max_connections: 2,
        ..Default::default()
    });
    let (a, w) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    assert!(matches!(w, Msg::Welcome { .. }));
    let (_b, w) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    assert!(matches!(w, Msg::Welcome { .. }));

    // Refused before it sends anything: the master reads nothing from it.
    let mut third = Peer::plain(&m);
    let message = expect_error(third.recv(), "busy");
    assert!(message.contains("--max-connections"), "{message}");
    assert!(third.is_closed());

    // Once a connection closes, its place is free again.
    drop(a);
    wait_until("a new connection is welcome", || {
        let mut p = Peer::plain(&m);
        p.send(&Msg::Hello {
            features: 0,
            labels: Default::default(),
            resources: Default::default(),
            version: rtpool_proto::PROTOCOL_VERSION,
            role: Role::Client,
            token: client_token(&m),
            name: "retry".into(),
            slots: 0,
            identity: None,
        });
        matches!(p.recv(), Msg::Welcome { .. })
    });
}

#[test]
fn a_peer_that_sends_nothing_is_closed_at_the_handshake_timeout() {
    let m = start(MasterConfig {
        handshake_timeout: Duration::from_millis(300),
        ..Default::default()
    });
    let started = Instant::now();
    let mut silent = Peer::plain(&m);
    expect_error(silent.recv(), "timeout");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "closed after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "closed after {waited:?}");
    assert!(silent.is_closed());
}

#[test]
fn a_hello_above_the_pre_auth_limit_is_refused_unread() {
    let m = start(MasterConfig::default());
    let mut p = Peer::plain(&m);
    // A length prefix of 1 MiB and no body: refused on the prefix alone.
    p.sock.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    expect_error(p.recv(), "too_large");
    assert!(p.is_closed());
}

#[test]
fn a_silent_worker_loses_its_lease_and_its_task_runs_elsewhere() {
    let m = start(MasterConfig {
        lease_ms: 400,
        ..Default::default()
    });
    let (mut client, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let (mut silent, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 1);
    client.send(&submit(1, b"code", vec![Bytes::from_static(b"x")]));
    assert!(matches!(
        client.recv_skipping_heartbeats(),
        Msg::Accepted { req_id: 1, .. }
    ));
    silent.send(&Msg::Pull { credits: 1 });
    let first = assignments(silent.recv());
    assert_eq!(first[0].attempt, 1);
    let lost_at = Instant::now();

    // A worker that heartbeats keeps its lease across several lease periods, and gets the task
    // back with the next attempt number once the silent one lost it.
    let (mut alive, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 1);
    alive.send(&Msg::Pull { credits: 1 });
    let deadline = Instant::now() + WAIT;
    let second = loop {
        assert!(Instant::now() < deadline, "the task was never reassigned");
        match alive.try_recv(Duration::from_millis(100)) {
            Some(Msg::Heartbeat) | None => alive.send(&Msg::Heartbeat),
            Some(msg) => break assignments(msg),
        }
    };
    assert_eq!(second[0].task, first[0].task);
    assert_eq!(second[0].attempt, 2);

    let message = expect_error(silent.recv_skipping_heartbeats(), "lease_expired");
    assert!(message.contains("400 ms"), "{message}");
    assert!(lost_at.elapsed() >= Duration::from_millis(400));
    assert!(silent.is_closed());

    alive.send(&echo_results(&second));
    match client.recv_skipping_heartbeats() {
        Msg::Results { results, .. } => assert_eq!(results[0].data.as_ref(), b"x"),
        other => panic!("expected RESULTS, got {other:?}"),
    }
}

/// One task at `max_attempts` 1, assigned to a worker that then ends as `end` says; returns
/// the client's next message once another worker asked for the task.
fn lose_the_only_attempt(end: impl FnOnce(Peer)) -> (Msg, Option<Vec<rtpool_proto::Assignment>>) {
    let m = start(MasterConfig {
        lease_ms: 400,
        max_attempts: 1,
        ..Default::default()
    });
    let (mut client, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let (mut first, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 1);
    client.send(&submit(1, b"code", vec![Bytes::from_static(b"x")]));
    assert!(matches!(
        client.recv_skipping_heartbeats(),
        Msg::Accepted { req_id: 1, .. }
    ));
    first.send(&Msg::Pull { credits: 1 });
    assert_eq!(assignments(first.recv())[0].attempt, 1);
    end(first);
    // The other worker heartbeats (it keeps its lease) and runs what it gets.
    let (mut other, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 1);
    other.send(&Msg::Pull { credits: 1 });
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no result and no reassignment");
        match other.try_recv(Duration::from_millis(100)) {
            Some(Msg::Heartbeat) | None => other.send(&Msg::Heartbeat),
            Some(msg) => {
                let second = assignments(msg);
                other.send(&echo_results(&second));
                return (client.recv_skipping_heartbeats(), Some(second));
            }
        }
        if let Some(msg) = client.try_recv(Duration::from_millis(1)) {
            return (msg, None);
        }
    }
}

#[test]
fn a_worker_silent_past_its_lease_is_not_blamed_even_at_max_attempts_1() {
    // Silence (SIGSTOP, a cut link, a starved host) is not evidence against the task: it runs
    // elsewhere as attempt 2 instead of failing as poison.
    let (msg, second) = lose_the_only_attempt(|mut silent| {
        expect_error(silent.recv_skipping_heartbeats(), "lease_expired");
    });
    assert_eq!(second.expect("reassigned")[0].attempt, 2);
    match msg {
        Msg::Results { results, .. } => {
            assert_eq!(
                (results[0].status, results[0].data.as_ref()),
                (0, &b"x"[..])
            );
        }
        other => panic!("expected RESULTS, got {other:?}"),
    }
}

#[test]
fn a_worker_whose_connection_closes_is_blamed_at_max_attempts_1() {
    // The counterpart: a connection that ends on the worker's side (its process died) counts.
    let (msg, second) = lose_the_only_attempt(drop);
    assert!(second.is_none(), "a poison task is not reassigned");
    match msg {
        Msg::Results { results, .. } => assert_eq!(results[0].status, 5, "{results:?}"),
        other => panic!("expected RESULTS, got {other:?}"),
    }
}

#[test]
fn a_silent_client_is_closed_as_idle_and_a_heartbeat_keeps_it() {
    let m = start(MasterConfig {
        client_timeout_ms: 300,
        lease_ms: 400,
        ..Default::default()
    });
    let (mut beating, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let (mut silent, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let started = Instant::now();
    // Heartbeats every 100 ms for 3 timeouts: nothing closes, and nothing but heartbeats comes
    // back: the answer to the first, then the master's own, one per lease (400 ms) it wrote
    // nothing on the link, not an answer to each of the 9 sent.
    let mut answers = 0;
    while started.elapsed() < Duration::from_millis(900) {
        beating.send(&Msg::Heartbeat);
        match beating.try_recv(Duration::from_millis(100)) {
            None => {}
            Some(Msg::Heartbeat) => answers += 1,
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        (1..=3).contains(&answers),
        "{answers} heartbeats from the master in 900 ms"
    );
    expect_error(silent.recv(), "idle");
    assert!(silent.is_closed());
    beating.send(&Msg::Status {
        req_id: 9,
        package: 12345,
    });
    expect_error(beating.recv(), "unknown_package");
}

#[test]
fn a_client_that_does_not_read_is_closed_as_a_slow_consumer() {
    let m = start(MasterConfig {
        max_buffered_bytes: Some(1 << 20),
        max_frame_bytes: 1 << 20,
        ..Default::default()
    });
    let (mut client, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let (mut worker, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 1);
    // 32 MiB of results against a 1 MiB queue (and a few MiB of kernel buffers).
    let n = 256u32;
    let big = Bytes::from(vec![7u8; 128 << 10]);
    client.send(&submit(
        1,
        b"big",
        vec![Bytes::from_static(b"x"); n as usize],
    ));
    assert!(matches!(
        client.recv_skipping_heartbeats(),
        Msg::Accepted { req_id: 1, .. }
    ));
    worker.send(&Msg::Pull { credits: n });
    let client_gone = || m.stats().is_some_and(|s| s.core.clients == 0);
    let mut sent = 0;
    // One RESULT (so one RESULTS frame) per task, until the master gives up on the client.
    while sent < n && !client_gone() {
        let tasks = assignments(worker.recv());
        for task in tasks.chunks(1) {
            let Msg::Result { mut results } = echo_results(task) else {
                unreachable!()
            };
            results[0].data = big.clone();
            worker.send(&Msg::Result { results });
            sent += 1;
        }
    }
    // The client's reader and route go as soon as its queue overflows.
    wait_until("the slow client is dropped", client_gone);
    let mut received = 0usize;
    let message = loop {
        match client.recv_skipping_heartbeats() {
            Msg::Results { results, .. } => received += results.len(),
            Msg::Error { code, message, .. } if code == "slow_consumer" => break message,
            other => panic!("expected RESULTS or ERROR slow_consumer, got {other:?}"),
        }
    };
    assert!(message.contains("--max-buffered-mb"), "{message}");
    assert!(received < n as usize, "all {received} results arrived");
    assert!(client.is_closed());
}

#[test]
fn a_worker_sent_two_64_mib_arguments_before_it_reads_is_not_a_slow_consumer() {
    // The outbound limit used to be 64 MiB whatever the frame limit (256 MiB): a second large
    // ASSIGN queued behind a first that the worker had not read yet closed the worker.
    let m = start(MasterConfig::default());
    let (mut client, _) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let (mut worker, _) = Peer::plain(&m).hello(Role::Worker, &worker_token(&m), 2);
    let big = Bytes::from(vec![5u8; 64 << 20]);
    client.send(&submit(1, b"big", vec![big.clone(), big]));
    assert!(matches!(
        client.recv_skipping_heartbeats(),
        Msg::Accepted { req_id: 1, .. }
    ));
    let running = |n: usize| m.stats().is_some_and(|s| s.core.running == n);
    // One credit at a time, so each task is an ASSIGN of its own; the worker reads nothing
    // until both are queued (the first does not fit the socket buffers).
    worker.send(&Msg::Pull { credits: 1 });
    wait_until("the first task is assigned", || running(1));
    worker.send(&Msg::Pull { credits: 1 });
    wait_until("the second task is assigned", || running(2));
    let mut tasks = assignments(worker.recv());
    tasks.extend(assignments(worker.recv()));
    assert_eq!(tasks.len(), 2);
    assert!(tasks.iter().all(|t| t.args.len() == 64 << 20));
    worker.send(&echo_results(&tasks));
    let mut results = 0;
    while results < 2 {
        match client.recv_skipping_heartbeats() {
            Msg::Results { results: r, .. } => results += r.len(),
            other => panic!("expected RESULTS, got {other:?}"),
        }
    }
}

#[test]
fn an_outbound_limit_below_the_frame_limit_is_refused() {
    let config = MasterConfig {
        max_frame_bytes: 256 << 20,
        max_buffered_bytes: Some(64 << 20),
        ..Default::default()
    };
    let err = MasterHandle::start(config)
        .err()
        .expect("the config is refused");
    let text = err.to_string();
    assert!(
        text.contains("max buffered mb") && text.contains("256 MiB"),
        "{text}"
    );
    assert_eq!(
        MasterConfig::default().outbound_limit_bytes(),
        (256 << 20) + (64 << 20)
    );
}

fn tls_master(dir: &TempDir) -> MasterHandle {
    start(MasterConfig {
        data_dir: Some(dir.0.clone()),
        tls_self_signed: true,
        ..Default::default()
    })
}

#[test]
fn a_package_round_trip_over_tls_with_a_self_signed_certificate() {
    let dir = TempDir::new("tls-roundtrip");
    let m = tls_master(&dir);
    let ca = m
        .tls_cert()
        .expect("a TLS master has a certificate")
        .to_path_buf();
    assert_eq!(ca, dir.0.join("tls/cert.pem"));
    let (mut client, w) = Peer::tls(&m, &ca).hello(Role::Client, &client_token(&m), 0);
    assert!(matches!(w, Msg::Welcome { version: 2, .. }), "{w:?}");
    let (mut worker, _) = Peer::tls(&m, &ca).hello(Role::Worker, &worker_token(&m), 1);

    let tasks: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 1000])).collect();
    client.send(&submit(5, b"tls code", tasks));
    let package = match client.recv_skipping_heartbeats() {
        Msg::Accepted {
            req_id: 5, package, ..
        } => package,
        other => panic!("expected ACCEPTED, got {other:?}"),
    };
    worker.send(&Msg::Pull { credits: 3 });
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let tasks = assignments(worker.recv());
        worker.send(&echo_results(&tasks));
        worker.send(&Msg::Pull {
            credits: tasks.len() as u32,
        });
        while seen.len() < 3 {
            match client.try_recv(Duration::from_millis(200)) {
                Some(Msg::Results {
                    package: p,
                    results,
                }) => {
                    assert_eq!(p, package);
                    for r in results {
                        assert_eq!(r.data.as_ref(), &vec![r.index as u8; 1000][..]);
                        seen.push(r.index);
                    }
                }
                Some(other) => panic!("expected RESULTS, got {other:?}"),
                None => break,
            }
        }
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2]);

    // A restarted master keeps its certificate, so clients keep trusting it.
    let pem = std::fs::read(&ca).unwrap();
    drop(m);
    let again = tls_master(&dir);
    assert_eq!(std::fs::read(again.tls_cert().unwrap()).unwrap(), pem);
    let (_c, w) = Peer::tls(&again, &ca).hello(Role::Client, &client_token(&again), 0);
    assert!(matches!(w, Msg::Welcome { .. }));
}

#[test]
fn a_plain_peer_of_a_tls_master_is_told_to_use_tls() {
    let dir = TempDir::new("tls-plain-peer");
    let m = tls_master(&dir);
    let started = Instant::now();
    let (mut p, reply) = Peer::plain(&m).hello(Role::Client, &client_token(&m), 0);
    let message = expect_error(reply, "malformed");
    assert!(message.contains("requires TLS"), "{message}");
    assert!(p.is_closed());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_tls_peer_of_a_plain_master_fails_fast() {
    let dir = TempDir::new("tls-peer-plain");
    // Any certificate will do: the master never gets to use one.
    let ca = rtpool_master::tls::self_signed_files(&dir.0, "127.0.0.1:0")
        .unwrap()
        .0;
    let m = start(MasterConfig::default());
    let started = Instant::now();
    let tcp = Peer::tcp(&m);
    let mut sock = tcp.try_clone().unwrap();
    let mut conn =
        ClientConnection::new(tls_config(&ca), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut failure = None;
    for _ in 0..100 {
        if !conn.is_handshaking() {
            break;
        }
        if let Err(e) = conn.complete_io(&mut sock) {
            failure = Some(e);
            break;
        }
    }
    let failure = failure.expect("a TLS handshake with a plain master must fail");
    assert_ne!(
        failure.kind(),
        ErrorKind::WouldBlock,
        "timed out: {failure}"
    );
    assert_ne!(failure.kind(), ErrorKind::TimedOut, "timed out: {failure}");
    assert!(started.elapsed() < Duration::from_secs(5), "{failure}");
}

#[test]
fn tls_options_that_contradict_each_other_are_refused_at_start() {
    let dir = TempDir::new("tls-bad-config");
    let no_dir = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        tls_self_signed: true,
        ..Default::default()
    });
    assert!(no_dir.err().unwrap().to_string().contains("--data-dir"));
    let half = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        tls_cert: Some(dir.0.join("cert.pem")),
        ..Default::default()
    });
    assert!(half.err().unwrap().to_string().contains("--tls-key"));
    let missing = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        tls_cert: Some(dir.0.join("cert.pem")),
        tls_key: Some(dir.0.join("key.pem")),
        ..Default::default()
    });
    assert!(missing.err().unwrap().to_string().contains("cannot read"));
}
