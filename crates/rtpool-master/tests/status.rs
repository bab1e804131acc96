//! The status snapshot end to end, against an in-process master with raw protocol peers: the
//! HTTP listener's routes (`/api/status`, `/api/events`, `/metrics`, `/healthz`, `/`), the
//! `CLUSTER_STATUS` request, and the rule that HTTP beyond loopback needs TLS or a token.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{expect_accepted, wait_until, Peer};
use rtpool_master::{MasterConfig, MasterError, MasterHandle};
use rtpool_proto::{Msg, PackageOpts, Role, WorkerResult};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn master_with(http: &str, token: Option<&str>) -> Result<MasterHandle, MasterError> {
    MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        http: Some(http.into()),
        http_token: token.map(str::to_owned),
        ..Default::default()
    })
}

/// One HTTP/1.1 GET; returns the status code and the body (read until the server closes).
fn get(addr: SocketAddr, path: &str, auth: Option<&str>) -> (u16, String) {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header");
    let code = head[9..12].parse().unwrap();
    (code, body.to_owned())
}

fn status_json(addr: SocketAddr) -> Value {
    let (code, body) = get(addr, "/api/status", None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

fn submit(req_id: u64, n: u8, opts: PackageOpts) -> Msg {
    let code = b"code";
    Msg::Submit {
        req_id,
        fn_hash: Bytes::copy_from_slice(&Sha256::digest(code)),
        fn_code: Bytes::from_static(code),
        opts,
        tasks: (0..n).map(|i| Bytes::from(vec![i])).collect(),
    }
}

/// Pulls `n` tasks and answers them, each after `delay` and reporting `exec_us`.
fn run(worker: &mut Peer, n: u32, delay: Duration, exec_us: u64) {
    worker.send(&Msg::Pull { credits: n });
    let Msg::Assign { tasks } = worker.recv() else {
        panic!("expected ASSIGN");
    };
    std::thread::sleep(delay);
    let results = tasks
        .iter()
        .map(|a| WorkerResult {
            task: a.task,
            attempt: a.attempt,
            status: 0,
            data: a.args.clone(),
            exec_us,
            wait_us: 0,
            flush_us: 0,
        })
        .collect();
    worker.send(&Msg::Result { results });
}

/// The JSON form of one msgpack value (maps with str keys), read with rmp only.
fn msgpack_to_json(rd: &mut &[u8]) -> Value {
    use rmp::decode::*;
    use rmp::Marker;
    let marker = read_marker(&mut <&[u8]>::clone(rd)).expect("a marker");
    match marker {
        Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
            Value::from(read_int::<u64, _>(rd).unwrap())
        }
        Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
            Value::from(read_int::<i64, _>(rd).unwrap())
        }
        Marker::F64 => Value::from(read_f64(rd).unwrap()),
        Marker::Null => {
            read_nil(rd).unwrap();
            Value::Null
        }
        Marker::True | Marker::False => Value::from(read_bool(rd).unwrap()),
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
            let len = read_str_len(rd).unwrap() as usize;
            let (text, rest) = rd.split_at(len);
            *rd = rest;
            Value::from(std::str::from_utf8(text).unwrap())
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let len = read_array_len(rd).unwrap();
            Value::Array((0..len).map(|_| msgpack_to_json(rd)).collect())
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let len = read_map_len(rd).unwrap();
            let mut map = serde_json::Map::new();
            for _ in 0..len {
                let Value::String(key) = msgpack_to_json(rd) else {
                    panic!("map keys are str")
                };
                map.insert(key, msgpack_to_json(rd));
            }
            Value::Object(map)
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// The value of the metric line `series` (name with labels) in a `/metrics` text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn status_metrics_and_events_follow_the_work_including_a_deadline_miss() {
    let m = master_with("127.0.0.1:0", None).unwrap();
    let http = m.http_addr().expect("an HTTP listener");
    assert_eq!(m.dashboard_url(), Some(format!("http://{http}/")));
    // Served at once, never an empty snapshot.
    let first = status_json(http);
    assert_eq!(first["master"]["address"], m.addr().to_string(), "{first}");
    assert_eq!(get(http, "/healthz", None), (200, "ok".into()));
    let (code, page) = get(http, "/", None);
    assert!(code == 200 && page.contains("<html"), "{code} {page}");
    let (code, before) = get(http, "/metrics", None);
    assert_eq!(code, 200);
    assert_eq!(metric(&before, "rtpool_workers"), Some(0.0), "{before}");

    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let (mut worker, _) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 2);
    client.send(&submit(1, 4, PackageOpts::default()));
    expect_accepted(client.recv(), 1);
    for _ in 0..2 {
        run(&mut worker, 2, Duration::ZERO, 1_500);
        let Msg::Results { .. } = client.recv() else {
            panic!("expected RESULTS")
        };
    }
    // A package whose 1 ms deadline passes before its result: a miss the test causes.
    let late = PackageOpts {
        deadline_ms: 1,
        priority: 3,
        ..PackageOpts::default()
    };
    client.send(&submit(2, 1, late));
    let late_package = expect_accepted(client.recv(), 2);
    run(&mut worker, 1, Duration::from_millis(30), 10);
    let Msg::Results { .. } = client.recv() else {
        panic!("expected RESULTS")
    };

    // The snapshot is published once a second: wait for one that saw the results.
    let mut status = Value::Null;
    wait_until("the snapshot shows 5 results", || {
        status = status_json(http);
        status["totals"]["done"] == 5
    });
    assert_eq!(status["deadlines"]["missed"], 1, "{status}");
    // Three rounds of PULL, ASSIGN, RESULT: what one connection per worker host saves.
    assert_eq!(status["totals"]["worker_frames_in"], 6, "{status}");
    assert_eq!(status["totals"]["worker_frames_out"], 3, "{status}");
    assert_eq!(status["connections"]["worker"], 1);
    let w = &status["workers"][0];
    assert_eq!(
        (w["name"].as_str(), w["slots"].as_u64()),
        (Some("test"), Some(2))
    );
    assert_eq!(w["done"], 5);
    assert!(
        (w["exec_s"].as_f64().unwrap() - 0.00601).abs() < 1e-9,
        "{w}"
    );
    assert_eq!(status["latency"]["assign_to_result"]["count"], 5);
    let late_bucket_count: u64 = status["deadlines"]["lateness"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(late_bucket_count, 1, "{status}");
    assert!(status["master"]["uptime_s"].as_f64().unwrap() > 0.0);
    assert_eq!(status["users"][0]["user"], "default");
    assert_eq!(status["users"][0]["done"], 5);
    // Both packages are live until acknowledged; the late one lists its miss.
    let listed = status["packages"].as_array().unwrap();
    let p = listed
        .iter()
        .find(|p| p["id"] == late_package)
        .expect("listed");
    assert_eq!(
        (p["missed"].as_u64(), p["priority"].as_i64()),
        (Some(1), Some(3))
    );
    assert!(p["deadline_in_s"].as_f64().unwrap() < 0.0, "{p}");

    let (_, after) = get(http, "/metrics", None);
    assert_eq!(metric(&after, "rtpool_workers"), Some(1.0), "{after}");
    assert_eq!(
        metric(&after, "rtpool_deadlines_total{outcome=\"missed\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &after,
            "rtpool_tasks_done_total{priority=\"0\",user=\"default\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &after,
            "rtpool_tasks_done_total{priority=\"3\",user=\"default\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&after, "rtpool_worker_slots{worker=\"test\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&after, "rtpool_deadline_lateness_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        metric(&after, "rtpool_assign_to_result_seconds_count"),
        Some(5.0)
    );

    // CLUSTER_STATUS on the main port: the same snapshot, as a msgpack map.
    client.send(&Msg::ClusterStatus { req_id: 77 });
    match client.recv() {
        Msg::ClusterStatusReply { req_id, status } => {
            assert_eq!(req_id, 77);
            let value = msgpack_to_json(&mut &status[..]);
            assert_eq!(value["totals"]["done"], 5, "{value}");
            assert_eq!(value["workers"][0]["name"], "test");
            assert_eq!(value["deadlines"]["missed"], 1);
        }
        other => panic!("expected CLUSTER_STATUS_REPLY, got {other:?}"),
    }
}

#[test]
fn the_event_stream_sends_a_status_event_about_once_a_second() {
    let m = master_with("127.0.0.1:0", None).unwrap();
    let mut sock = TcpStream::connect(m.http_addr().unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(sock, "GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let started = Instant::now();
    let mut text = String::new();
    let mut chunk = [0u8; 65536];
    while text.matches("event: status").count() < 3 {
        let n = sock.read(&mut chunk).expect("an event within 10 s");
        assert!(n > 0, "stream closed: {text}");
        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    assert!(text.contains("text/event-stream"), "{text}");
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("a data line");
    let status: Value = serde_json::from_str(data).expect("JSON data");
    assert!(status["master"]["pid"].as_u64().is_some(), "{status}");
    // The first at once, then one a second: three take about two seconds, not ten.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn http_beyond_loopback_needs_tls_or_a_token() {
    let err = master_with("0.0.0.0:0", None).err().expect("refused");
    assert!(matches!(err, MasterError::HttpExposed { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("0.0.0.0") && text.contains("--http-token"),
        "{text}"
    );

    let m = master_with("0.0.0.0:0", Some("s3cret")).unwrap();
    let port = m.http_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(get(addr, "/api/status", None).0, 401);
    assert_eq!(get(addr, "/metrics", Some("wrong")).0, 401);
    assert_eq!(get(addr, "/metrics", Some("s3cret")).0, 200);
    assert_eq!(get(addr, "/api/status?token=s3cret", None).0, 200);
    // Liveness probes need no token.
    assert_eq!(get(addr, "/healthz", None), (200, "ok".into()));
}

#[test]
fn an_explicit_http_address_that_is_taken_is_an_error_and_the_default_one_is_skipped() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let err = master_with(&taken, None).err().expect("refused");
    assert!(matches!(err, MasterError::HttpBind { .. }), "{err}");
    assert!(err.to_string().contains(&taken), "{err}");

    let m = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        http: Some(taken),
        http_is_default: true,
        ..Default::default()
    })
    .expect("runs without HTTP");
    assert_eq!(m.http_addr(), None);
}
