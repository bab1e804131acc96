//! End-to-end scenarios against an in-process master, with raw protocol peers on loopback.

mod common;

use std::io::Write;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{expect_accepted, expect_error, master, Peer};
use rtpool_proto::{
    decode_frame, encode_to_vec, MissPolicy, Msg, PackageCounts, PackageOpts, Role, WorkerResult,
};
use sha2::{Digest, Sha256};

fn submit(req_id: u64, code: &[u8], tasks: Vec<Bytes>) -> Msg {
    submit_with(req_id, code, tasks, PackageOpts::default())
}

fn submit_with(req_id: u64, code: &[u8], tasks: Vec<Bytes>, opts: PackageOpts) -> Msg {
    let fn_hash = Bytes::copy_from_slice(&Sha256::digest(code));
    Msg::Submit {
        req_id,
        fn_hash,
        fn_code: Bytes::copy_from_slice(code),
        opts,
        tasks,
    }
}

fn tasks(n: u8) -> Vec<Bytes> {
    (0..n).map(|i| Bytes::from(vec![i])).collect()
}

/// Runs the tasks of one `ASSIGN` (after a `PULL` of `credits`), each reporting `exec_us`.
fn run_assigned(worker: &mut Peer, credits: u32, exec_us: u64) -> usize {
    worker.send(&Msg::Pull { credits });
    let assigned = match worker.recv() {
        Msg::Assign { tasks } => tasks,
        other => panic!("expected ASSIGN, got {other:?}"),
    };
    // The tasks run that long (the master charges no more than it sees pass).
    std::thread::sleep(std::time::Duration::from_micros(exec_us));
    let results = assigned
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
    assigned.len()
}

#[test]
fn package_round_trip_with_code_cache_and_credits() {
    let m = master();
    let (mut client, w) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    assert!(matches!(w, Msg::Welcome { version: 2, .. }));
    let (mut worker, w) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 1);
    assert!(matches!(w, Msg::Welcome { .. }));

    let tasks: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i])).collect();
    client.send(&submit(7, b"code", tasks));
    let package = match client.recv() {
        Msg::Accepted {
            req_id: 7, package, ..
        } => package,
        other => panic!("expected ACCEPTED, got {other:?}"),
    };
    // Credits bound what the worker holds: 2 credits, 2 tasks; code only in the first.
    worker.send(&Msg::Pull { credits: 2 });
    let first = match worker.recv() {
        Msg::Assign { tasks } => tasks,
        other => panic!("expected ASSIGN, got {other:?}"),
    };
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].fn_code.as_deref(), Some(&b"code"[..]));
    assert_eq!(first[1].fn_code, None);
    let results: Vec<WorkerResult> = first
        .iter()
        .map(|a| WorkerResult {
            task: a.task,
            attempt: a.attempt,
            status: 0,
            data: a.args.clone(),
            exec_us: 5,
            wait_us: 1,
            flush_us: 1,
        })
        .collect();
    worker.send(&Msg::Result { results });
    worker.send(&Msg::Pull { credits: 1 });
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match client.recv() {
            Msg::Results {
                package: p,
                results,
            } => {
                assert_eq!(p, package);
                for r in results {
                    assert_eq!(r.data.as_ref(), &[r.index as u8]);
                    assert_eq!(r.exec_us, 5);
                    seen.push(r.index);
                }
            }
            other => panic!("expected RESULTS, got {other:?}"),
        }
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1]);
    let last = match worker.recv() {
        Msg::Assign { tasks } => tasks,
        other => panic!("expected ASSIGN, got {other:?}"),
    };
    assert_eq!(last.len(), 1);
    assert_eq!(
        last[0].fn_code, None,
        "code is sent once per worker connection"
    );

    // The worker dies holding the last task: a new worker gets it, with the next attempt.
    drop(worker);
    let (mut worker2, _) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 1);
    worker2.send(&Msg::Pull { credits: 4 });
    let again = match worker2.recv() {
        Msg::Assign { tasks } => tasks,
        other => panic!("expected ASSIGN, got {other:?}"),
    };
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].task, last[0].task);
    assert_eq!(again[0].attempt, last[0].attempt + 1);
    assert!(
        again[0].fn_code.is_some(),
        "a new connection gets the code again"
    );
    let a = &again[0];
    let r = WorkerResult {
        task: a.task,
        attempt: a.attempt,
        status: 0,
        data: a.args.clone(),
        exec_us: 1,
        wait_us: 0,
        flush_us: 0,
    };
    worker2.send(&Msg::Result { results: vec![r] });
    match client.recv() {
        Msg::Results { results, .. } => assert_eq!(results[0].index, 2),
        other => panic!("expected RESULTS, got {other:?}"),
    }
    // Results are kept until the client acknowledges them.
    client.send(&Msg::Status { req_id: 8, package });
    match client.recv() {
        Msg::StatusReply {
            counts: PackageCounts { done: 3, .. },
            ..
        } => {}
        other => panic!("expected STATUS_REPLY with 3 done, got {other:?}"),
    }
    assert_eq!(m.stats().unwrap().core.retained, 3);
    // Acknowledged packages are freed.
    client.send(&Msg::Ack { package, count: 3 });
    client.send(&Msg::Status { req_id: 9, package });
    assert!(expect_error(client.recv(), "unknown_package").contains("package"));
    let stats = m.stats().unwrap();
    assert_eq!(
        (stats.core.tasks, stats.core.packages, stats.core.functions),
        (0, 0, 0)
    );
}

#[test]
fn bad_peers_get_a_clear_error_and_only_they_are_closed() {
    let m = master();
    let (client_tok, worker_tok) = (m.tokens().client.clone(), m.tokens().worker.clone());
    let (mut good, _) = Peer::hello(&m, Role::Client, &client_tok, 0);

    let (mut p, reply) = Peer::hello(&m, Role::Client, "rtc_wrong", 0);
    assert!(expect_error(reply, "auth").contains("invalid client token"));
    assert!(p.is_closed());

    let (mut p, reply) = Peer::hello(&m, Role::Client, &worker_tok, 0);
    assert!(expect_error(reply, "auth").contains("worker token"));
    assert!(p.is_closed());

    let (mut p, reply) = Peer::hello(&m, Role::Worker, &client_tok, 1);
    assert!(expect_error(reply, "auth").contains("client token"));
    assert!(p.is_closed());

    // Version mismatch.
    let mut p = Peer::connect(&m);
    p.send(&Msg::Hello {
        features: 0,
        labels: Default::default(),
        resources: Default::default(),
        version: 99,
        role: Role::Client,
        token: client_tok.clone(),
        name: "x".into(),
        slots: 0,
        identity: None,
    });
    assert!(expect_error(p.recv(), "version").contains("99"));

    // A version-1 peer (before segmented frames) is refused with both versions named.
    let mut p = Peer::connect(&m);
    p.send(&Msg::Hello {
        features: 0,
        labels: Default::default(),
        resources: Default::default(),
        version: 1,
        role: Role::Worker,
        token: "whatever".into(),
        name: "old".into(),
        slots: 1,
        identity: None,
    });
    let text = expect_error(p.recv(), "version");
    assert!(
        text.contains("version 1 is not supported") && text.contains("speaks version 2"),
        "{text}"
    );

    // Oversized length prefix before authentication: refused without reading the body.
    let mut p = Peer::connect(&m);
    p.sock.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    expect_error(p.recv(), "too_large");
    assert!(p.is_closed());

    // Malformed body after authentication.
    let (mut p, _) = Peer::hello(&m, Role::Client, &client_tok, 0);
    p.sock.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).unwrap();
    expect_error(p.recv(), "malformed");
    assert!(p.is_closed());

    // A worker message from a client.
    let (mut p, _) = Peer::hello(&m, Role::Client, &client_tok, 0);
    p.send(&Msg::Pull { credits: 1 });
    expect_error(p.recv(), "unknown_kind");

    // A wrong hash is a non-fatal rejection.
    let (mut w, _) = Peer::hello(&m, Role::Worker, &worker_tok, 1);
    let mut bad = submit(3, b"code", vec![Bytes::from_static(b"a")]);
    if let Msg::Submit { fn_hash, .. } = &mut bad {
        *fn_hash = Bytes::from(vec![0u8; 32]);
    }
    good.send(&bad);
    match good.recv() {
        Msg::Error {
            code, reference: 3, ..
        } => assert_eq!(code, "rejected"),
        other => panic!("expected ERROR rejected, got {other:?}"),
    }
    // ... and the master still serves the good client.
    good.send(&submit(4, b"code", vec![Bytes::from_static(b"a")]));
    assert!(matches!(good.recv(), Msg::Accepted { req_id: 4, .. }));
    w.send(&Msg::Pull { credits: 1 });
    assert!(matches!(w.recv(), Msg::Assign { .. }));
}

#[test]
fn answers_come_in_request_order_also_for_rejections() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let mut bad = submit(2, b"code", vec![Bytes::from_static(b"b")]);
    if let Msg::Submit { fn_hash, .. } = &mut bad {
        *fn_hash = Bytes::from(vec![0u8; 32]);
    }
    // Three submissions in one write: the rejection of the second must not overtake the
    // acceptance of the first, nor come after the third's.
    let mut wire = encode_to_vec(&submit(1, b"code", vec![Bytes::from_static(b"a")]));
    wire.extend(encode_to_vec(&bad));
    wire.extend(encode_to_vec(&submit(
        3,
        b"code",
        vec![Bytes::from_static(b"c")],
    )));
    client.sock.write_all(&wire).unwrap();
    let answers: Vec<(&str, u64)> = (0..3)
        .map(|_| match client.recv() {
            Msg::Accepted { req_id, .. } => ("accepted", req_id),
            Msg::Error {
                code, reference, ..
            } if code == "rejected" => ("rejected", reference),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        answers,
        vec![("accepted", 1), ("rejected", 2), ("accepted", 3)]
    );
}

#[test]
fn a_submit_with_every_deadline_option_is_accepted_and_status_reply_has_ten_fields() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    // Two workers with slots (no credits yet): room for two replicas on distinct workers.
    let worker_token = m.tokens().worker.clone();
    let (_w1, _) = Peer::hello(&m, Role::Worker, &worker_token, 2);
    let (_w2, _) = Peer::hello(&m, Role::Worker, &worker_token, 2);
    let opts = PackageOpts {
        labels: Default::default(),
        resources: Default::default(),
        unschedulable: Default::default(),
        priority: 1,
        timeout_ms: 5_000,
        key: "e2e-every-option".into(),
        deadline_ms: 60_000,
        on_miss: MissPolicy::Drop,
        admit: true,
        replicas: 2,
        quorum: 1,
        max_copies: 3,
        hedge: true,
        max_attempts: 2,
        near: 0,
        after: 0,
        after_index: 0,
    };
    client.send(&submit_with(21, b"code", tasks(3), opts));
    let package = expect_accepted(client.recv(), 21);

    client.send(&Msg::Status {
        req_id: 22,
        package,
    });
    let frame = client.recv_frame();
    // fixarray of 11 (the kind and 10 fields), then kind 15.
    assert_eq!(
        &frame[4..6],
        &[0x9b, 0x0f],
        "STATUS_REPLY is [15, 10 fields]"
    );
    let reply = decode_frame(&mut BytesMut::from(&frame[..]), 1 << 20)
        .unwrap()
        .unwrap();
    match reply {
        Msg::StatusReply {
            req_id: 22,
            package: p,
            counts:
                PackageCounts {
                    total: 3,
                    queued,
                    running: 0,
                    done: 0,
                    cancelled: 0,
                    met: 0,
                    missed: 0,
                },
            // Both workers can run it.
            workers: 2,
        } if p == package => assert_eq!(queued, 3),
        other => panic!("expected STATUS_REPLY of 3 queued tasks, got {other:?}"),
    }
    assert_eq!(m.stats().unwrap().core.counters.admission_refused, 0);
}

#[test]
fn contradictory_options_are_rejected_and_the_client_goes_on() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let d = PackageOpts::default;
    let cases = [
        (
            "quorum above replicas",
            PackageOpts {
                replicas: 2,
                quorum: 3,
                ..d()
            },
        ),
        (
            "more than 16 replicas",
            PackageOpts {
                replicas: 17,
                ..d()
            },
        ),
        (
            "more than 16 copies",
            PackageOpts {
                max_copies: 17,
                ..d()
            },
        ),
        (
            "admission control without a deadline",
            PackageOpts { admit: true, ..d() },
        ),
    ];
    for (req_id, (what, opts)) in (30..).zip(cases) {
        client.send(&submit_with(req_id, b"code", tasks(1), opts));
        match client.recv() {
            Msg::Error {
                code,
                message,
                reference,
            } => {
                assert_eq!((code.as_str(), reference), ("rejected", req_id), "{what}");
                assert!(
                    message.starts_with("invalid options: "),
                    "{what}: {message}"
                );
            }
            other => panic!("{what}: expected ERROR rejected, got {other:?}"),
        }
    }
    // Not fatal: the same connection submits a valid package.
    client.send(&submit(40, b"code", tasks(1)));
    expect_accepted(client.recv(), 40);
}

#[test]
fn a_late_result_reports_its_lateness_and_counts_as_missed() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let (mut worker, _) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 1);
    let opts = PackageOpts {
        deadline_ms: 1,
        ..PackageOpts::default()
    };
    client.send(&submit_with(50, b"code", tasks(1), opts));
    let package = expect_accepted(client.recv(), 50);
    worker.send(&Msg::Pull { credits: 1 });
    let Msg::Assign { tasks: assigned } = worker.recv() else {
        panic!("expected ASSIGN");
    };
    // Not a race: the deadline is 1 ms after the SUBMIT, the result comes 30 ms after.
    std::thread::sleep(Duration::from_millis(30));
    let result = WorkerResult {
        task: assigned[0].task,
        attempt: assigned[0].attempt,
        status: 0,
        data: Bytes::from_static(b"late"),
        exec_us: 10,
        wait_us: 0,
        flush_us: 0,
    };
    worker.send(&Msg::Result {
        results: vec![result],
    });
    match client.recv() {
        Msg::Results { results, .. } => {
            assert_eq!(
                results[0].status, 0,
                "on_miss = run: the late result is kept"
            );
            assert!(results[0].late_us >= 20_000, "{:?}", results[0]);
        }
        other => panic!("expected RESULTS, got {other:?}"),
    }
    client.send(&Msg::Status {
        req_id: 51,
        package,
    });
    match client.recv() {
        Msg::StatusReply {
            counts:
                PackageCounts {
                    done: 1,
                    met: 0,
                    missed: 1,
                    ..
                },
            ..
        } => {}
        other => panic!("expected STATUS_REPLY with 1 missed, got {other:?}"),
    }
    assert_eq!(m.stats().unwrap().core.counters.deadlines_missed, 1);
}

#[test]
fn admission_control_refuses_with_a_non_fatal_admission_error() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let (mut worker, _) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 1);
    // Teach the master that this function takes 30 ms per task.
    client.send(&submit(60, b"slow", tasks(5)));
    expect_accepted(client.recv(), 60);
    let mut ran = 0;
    while ran < 5 {
        ran += run_assigned(&mut worker, 5, 30_000);
    }
    let mut received = 0;
    while received < 5 {
        match client.recv() {
            Msg::Results { results, .. } => received += results.len(),
            other => panic!("expected RESULTS, got {other:?}"),
        }
    }
    // 50 tasks of 30 ms on one slot cannot finish within 100 ms.
    let opts = PackageOpts {
        deadline_ms: 100,
        admit: true,
        ..PackageOpts::default()
    };
    client.send(&submit_with(61, b"slow", tasks(50), opts));
    let message = match client.recv() {
        Msg::Error {
            code,
            message,
            reference: 61,
        } if code == "admission" => message,
        other => panic!("expected ERROR admission for 61, got {other:?}"),
    };
    assert!(
        message.starts_with("admission refused: 50 tasks"),
        "{message}"
    );
    // Not fatal: the same connection submits a package without admission control.
    client.send(&submit(62, b"slow", tasks(1)));
    expect_accepted(client.recv(), 62);
    assert_eq!(m.stats().unwrap().core.counters.admission_refused, 1);
}

#[test]
fn a_package_max_attempts_of_1_fails_its_task_as_poison_at_the_first_lost_worker() {
    let m = master();
    let (mut client, _) = Peer::hello(&m, Role::Client, &m.tokens().client.clone(), 0);
    let opts = PackageOpts {
        max_attempts: 1,
        ..PackageOpts::default()
    };
    client.send(&submit_with(61, b"poison", tasks(1), opts));
    let package = expect_accepted(client.recv(), 61);
    let (mut worker, _) = Peer::hello(&m, Role::Worker, &m.tokens().worker.clone(), 1);
    worker.send(&Msg::Pull { credits: 1 });
    match worker.recv() {
        Msg::Assign { tasks } => assert_eq!((tasks.len(), tasks[0].attempt), (1, 1)),
        other => panic!("expected ASSIGN, got {other:?}"),
    }
    // The worker dies running it: with the master's default of 3 attempts the task would be
    // requeued; this package allows one.
    drop(worker);
    match client.recv() {
        Msg::Results {
            package: p,
            results,
        } => {
            assert_eq!(p, package);
            assert_eq!(results[0].status, rtpool_proto::status::LOST);
            let message = String::from_utf8_lossy(&results[0].data);
            assert!(message.contains("1 times"), "{message}");
        }
        other => panic!("expected RESULTS, got {other:?}"),
    }
    assert_eq!(m.stats().unwrap().core.counters.poisoned, 1);
}
