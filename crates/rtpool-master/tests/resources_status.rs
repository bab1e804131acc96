//! Worker resources as the operator sees them, against an in-process master with raw protocol
//! peers: a worker that announces `gpu=2` and `zone=a` in its `HELLO`, packages that ask for
//! `gpu=1` (served) and `gpu=4` (`unschedulable="wait"`), and what `/api/status` and
//! `/metrics` say about them.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use common::{expect_accepted, wait_until, Peer};
use rtpool_master::{MasterConfig, MasterHandle};
use rtpool_proto::{Labels, Msg, PackageOpts, Resources, Role, Unschedulable, WorkerResult};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// One HTTP/1.1 GET; returns the body (read until the server closes) of a 200.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

fn status_json(addr: SocketAddr) -> Value {
    serde_json::from_str(&get(addr, "/api/status")).expect("JSON")
}

/// The value of the metric line `series` (name with labels) in a `/metrics` text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn resources(entries: &[(&str, u64)]) -> Resources {
    Resources::new(entries.iter().map(|(k, v)| (k.to_string(), *v))).unwrap()
}

fn labels(entries: &[(&str, &str)]) -> Labels {
    Labels::new(entries.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
}

/// A worker's `HELLO` with `slots`, resources and labels; panics unless it is welcomed.
fn worker(m: &MasterHandle, name: &str, slots: u32, res: Resources, lab: Labels) -> Peer {
    let mut p = Peer::connect(m);
    p.send(&Msg::Hello {
        features: 0,
        version: rtpool_proto::PROTOCOL_VERSION,
        role: Role::Worker,
        token: m.tokens().worker.clone(),
        name: name.into(),
        slots,
        identity: Some(format!("{name}/0")),
        resources: res,
        labels: lab,
    });
    let reply = p.recv();
    assert!(matches!(reply, Msg::Welcome { .. }), "{reply:?}");
    p
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

/// The `resource_classes` entry named `name`.
fn class<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["resource_classes"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn worker_entry<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .unwrap_or_else(|| panic!("no worker {name} in {status}"))
}

#[test]
fn status_and_metrics_show_worker_resources_labels_and_classes() {
    let m = MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        http: Some("127.0.0.1:0".into()),
        ..Default::default()
    })
    .unwrap();
    let http = m.http_addr().expect("an HTTP listener");
    let mut gpu = worker(
        &m,
        "gpu-a",
        4,
        resources(&[("gpu", 2)]),
        labels(&[("zone", "a")]),
    );
    let _plain = worker(&m, "plain", 1, Resources::default(), Labels::default());
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);

    // Three tasks of gpu=1 on a worker of gpu=2: two run, one waits for a GPU to free.
    let opts = PackageOpts {
        resources: resources(&[("gpu", 1)]),
        ..Default::default()
    };
    client.send(&submit(1, 3, opts));
    expect_accepted(client.recv(), 1);
    // gpu=4 fits no worker; "wait" queues it (with a warning) instead of refusing it.
    let opts = PackageOpts {
        resources: resources(&[("gpu", 4)]),
        unschedulable: Unschedulable::Wait,
        ..Default::default()
    };
    client.send(&submit(2, 2, opts));
    match client.recv() {
        Msg::Accepted {
            req_id: 2, notice, ..
        } => assert!(notice.unwrap_or_default().contains("gpu=4")),
        other => panic!("expected ACCEPTED 2 with a notice, got {other:?}"),
    }
    gpu.send(&Msg::Pull { credits: 4 });
    let Msg::Assign { tasks } = gpu.recv() else {
        panic!("expected ASSIGN");
    };
    assert_eq!(tasks.len(), 2, "gpu=2 holds two tasks of gpu=1");

    let mut status = Value::Null;
    wait_until("the snapshot shows the two running tasks", || {
        status = status_json(http);
        class(&status, "gpu=1").is_some_and(|c| c["running"] == 2)
    });
    let w = worker_entry(&status, "gpu-a");
    assert_eq!(w["resources"], json!({"gpu": 2}));
    assert_eq!(w["in_use"], json!({"gpu": 2}));
    assert_eq!(w["labels"], json!({"zone": "a"}));
    let plain = worker_entry(&status, "plain");
    assert_eq!(plain["resources"], json!({}));
    assert_eq!(plain["in_use"], json!({}));
    assert_eq!(plain["labels"], json!({}));
    let served = class(&status, "gpu=1").unwrap();
    assert_eq!(
        *served,
        json!({"name": "gpu=1", "resources": {"gpu": 1}, "labels": {}, "queued": 1,
               "running": 2, "workers": 1, "unschedulable": false})
    );
    let waiting = class(&status, "gpu=4").expect("the gpu=4 class");
    assert_eq!(waiting["queued"], 2);
    assert_eq!(waiting["workers"], 0);
    assert_eq!(waiting["unschedulable"], true);
    assert_eq!(status["resource_classes"].as_array().unwrap().len(), 2);

    let text = get(http, "/metrics");
    let series = |s: &str| metric(&text, s);
    let gpu_a = r#"{worker="gpu-a",resource="gpu"}"#;
    assert_eq!(
        series(&format!("rtpool_worker_resource_capacity{gpu_a}")),
        Some(2.0)
    );
    assert_eq!(
        series(&format!("rtpool_worker_resource_in_use{gpu_a}")),
        Some(2.0)
    );
    assert!(
        !text.contains(r#"rtpool_worker_resource_capacity{worker="plain""#),
        "a worker without resources has no resource series:\n{text}"
    );
    assert_eq!(series(r#"rtpool_class_queued{class="gpu=1"}"#), Some(1.0));
    assert_eq!(series(r#"rtpool_class_running{class="gpu=1"}"#), Some(2.0));
    assert_eq!(
        series(r#"rtpool_class_unschedulable{class="gpu=1"}"#),
        Some(0.0)
    );
    assert_eq!(series(r#"rtpool_class_queued{class="gpu=4"}"#), Some(2.0));
    assert_eq!(
        series(r#"rtpool_class_unschedulable{class="gpu=4"}"#),
        Some(1.0)
    );

    // One result frees one GPU: the third task starts, and in_use follows.
    gpu.send(&result(&tasks[..1]));
    let Msg::Assign { tasks: third } = gpu.recv() else {
        panic!("expected the third task's ASSIGN");
    };
    assert_eq!(third.len(), 1);
    wait_until("the snapshot shows the third task running", || {
        status = status_json(http);
        class(&status, "gpu=1").is_some_and(|c| c["queued"] == 0 && c["running"] == 2)
    });
    assert_eq!(worker_entry(&status, "gpu-a")["in_use"], json!({"gpu": 2}));

    // Every result in: nothing held, and a name none holds is left out of in_use.
    gpu.send(&result(&[tasks[1].clone(), third[0].clone()]));
    wait_until("the snapshot shows the class done", || {
        status = status_json(http);
        class(&status, "gpu=1").is_none_or(|c| c["running"] == 0)
    });
    assert_eq!(worker_entry(&status, "gpu-a")["in_use"], json!({}));
    let text = get(http, "/metrics");
    assert_eq!(
        metric(&text, &format!("rtpool_worker_resource_in_use{gpu_a}")),
        Some(0.0)
    );
}

/// The worker's `RESULT` for `tasks`, each ok.
fn result(tasks: &[rtpool_proto::Assignment]) -> Msg {
    Msg::Result {
        results: tasks
            .iter()
            .map(|a| WorkerResult {
                task: a.task,
                attempt: a.attempt,
                status: 0,
                data: a.args.clone(),
                exec_us: 10,
                wait_us: 0,
                flush_us: 0,
            })
            .collect(),
    }
}
