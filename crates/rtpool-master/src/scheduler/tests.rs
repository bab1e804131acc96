//! The scheduler's unit tests: what actions become on the wire and in the journal.

use bytes::Bytes;
use rtpool_core::{
    AssignCall, CallSpec, ClientId, MissPolicy, PackageCounts, PackageOpts, RejectReason,
    ServiceInfo, TaskId, WorkerId,
};
use rtpool_proto::{CallAssignment, FunctionInfo};

use super::*;

/// A scheduler with one client route (session 5), and that route's receiving end.
fn with_client() -> (Scheduler, crate::outbound::OutboundRx) {
    let mut scheduler = Scheduler::new(CoreConfig::default(), 0x5eed);
    let (tx, rx) = OutboundTx::new(1 << 20);
    scheduler.routes.insert(5, tx);
    (scheduler, rx)
}

fn sent(rx: &mut crate::outbound::OutboundRx) -> Msg {
    match rx.try_recv() {
        Some(Out::Send(msg)) => msg,
        other => panic!("expected one message, got {other:?}"),
    }
}

#[test]
fn refusals_answer_with_their_code_and_the_reason() {
    let (mut scheduler, mut rx) = with_client();
    let admission = RejectReason::Admission {
        tasks: 100,
        finish_us: 5_000_000,
        deadline_us: 1_000_000,
        per_task_us: 50_000,
        p95_us: 60_000,
        samples: 12,
        slots: 1,
        backlog_us: 0,
    };
    let cases = [
        (admission, "admission"),
        (
            RejectReason::NoWorkerSlots {
                deadline_us: 50_000,
            },
            "admission",
        ),
        (
            RejectReason::InvalidOptions("quorum 3 > replicas 2".into()),
            "rejected",
        ),
        (RejectReason::QuotaExhausted { over_us: 0 }, "quota"),
        (RejectReason::Empty, "rejected"),
    ];
    for (reason, code) in cases {
        let message = reason.to_string();
        scheduler.route(Action::Rejected {
            client: ClientId(5),
            req_id: 9,
            reason,
        });
        let expected = Msg::Error {
            code: code.into(),
            message,
            reference: 9,
        };
        assert_eq!(sent(&mut rx), expected);
    }
}

#[test]
fn unknown_function_is_its_own_error_code() {
    let (mut scheduler, mut rx) = with_client();
    let reason = RejectReason::UnknownFunction {
        what: "'dmmul' version 3".into(),
        served: "add (1)".into(),
    };
    let message = reason.to_string();
    scheduler.route(Action::Rejected {
        client: ClientId(5),
        req_id: 12,
        reason,
    });
    let expected = Msg::Error {
        code: "unknown_function".into(),
        message,
        reference: 12,
    };
    assert_eq!(sent(&mut rx), expected);
    let reason = RejectReason::InvalidCall {
        index: 1,
        reason: "depends on call #1, itself".into(),
    };
    scheduler.route(Action::Rejected {
        client: ClientId(5),
        req_id: 13,
        reason,
    });
    let Msg::Error {
        code, reference, ..
    } = sent(&mut rx)
    else {
        panic!("expected ERROR");
    };
    assert_eq!((code.as_str(), reference), ("rejected", 13));
}

#[test]
fn rpc_actions_become_their_frames() {
    let (mut scheduler, mut rx) = with_client();
    let args = Bytes::from_static(b"\x92\x02\x03");
    let input = Bytes::from_static(b"\x91\x05");
    scheduler.route(Action::AssignCalls {
        worker: WorkerId(5),
        calls: vec![AssignCall {
            task: TaskId(40),
            attempt: 2,
            name: "add".into(),
            version: "1".into(),
            args: args.clone(),
            inputs: vec![input.clone()],
            timeout_ms: 70,
            keep: true,
            res: Default::default(),
        }],
    });
    let expected = Msg::AssignCalls {
        calls: vec![CallAssignment {
            task: 40,
            attempt: 2,
            name: "add".into(),
            version: "1".into(),
            args,
            inputs: vec![input],
            timeout_ms: 70,
            keep: true,
            res: Default::default(),
        }],
    };
    assert_eq!(sent(&mut rx), expected);
    let interface = Bytes::from_static(b"\x80");
    scheduler.route(Action::FunctionsReply {
        client: ClientId(5),
        req_id: 8,
        functions: vec![ServiceInfo {
            name: "add".into(),
            version: "1".into(),
            servers: 2,
            interface: interface.clone(),
        }],
    });
    let expected = Msg::FunctionsReply {
        req_id: 8,
        functions: vec![FunctionInfo {
            name: "add".into(),
            version: "1".into(),
            servers: 2,
            interface,
        }],
    };
    assert_eq!(sent(&mut rx), expected);
    scheduler.route(Action::ServeRefused {
        worker: WorkerId(5),
        name: "add".into(),
        version: "1".into(),
    });
    let expected = Msg::Error {
        code: "serve_conflict".into(),
        message: "another worker serves add version 1 with a different interface; this \
                  worker's add is not served"
            .into(),
        reference: 0,
    };
    assert_eq!(sent(&mut rx), expected);
}

/// A scheduler with a journal in `dir`, and a client route (session 5) of user "alice".
fn with_journal(dir: &std::path::Path) -> (Scheduler, crate::outbound::OutboundRx) {
    let config = crate::journal::JournalConfig::new(dir.join("journal.log"));
    let (journal, replay) = Journal::open(config).expect("open journal");
    let mut scheduler = Scheduler::new(CoreConfig::default(), 0x5eed).with_journal(
        journal,
        replay,
        FsyncPolicy::Off,
    );
    let (tx, rx) = OutboundTx::new(1 << 20);
    scheduler.on_message(ToScheduler::Register {
        session: 5,
        user: "alice".into(),
        name: "test-client".into(),
        identity: String::new(),
        host: "127.0.0.1".into(),
        tx,
        event: Event::ClientJoined {
            client: ClientId(5),
            user: UserId(0),
        },
    });
    (scheduler, rx)
}

fn outcome(index: u32) -> TaskOutcome {
    TaskOutcome {
        index,
        status: TaskStatus::Ok,
        data: Bytes::from_static(b"\x91\x05"),
        queue_us: 0,
        worker_us: 0,
        exec_us: 10,
        wait_us: 0,
        flush_us: 0,
        late_us: 0,
    }
}

#[test]
fn call_packages_leave_no_trace_in_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (mut scheduler, _rx) = with_journal(dir.path());
    let start = scheduler.last_lsn;
    // A refused CALL (the core has no server for it) is numbered, never journaled.
    scheduler.apply(Event::SubmitCalls {
        client: ClientId(5),
        req_id: 1,
        package: PackageId(0),
        opts: PackageOpts::default(),
        calls: vec![CallSpec {
            name: "nobody-serves-this".into(),
            version: String::new(),
            args: Bytes::new(),
            deps: vec![],
            fetch: false,
        }],
    });
    assert_eq!(scheduler.last_lsn, start, "a refused CALL wrote a record");
    // A live call package: the core marks its results, deliveries and end as not journaled.
    let call = PackageId(7);
    for action in [
        Action::SendResults {
            journaled: false,
            client: Some(ClientId(5)),
            package: call,
            results: vec![outcome(0)],
        },
        Action::Delivered {
            journaled: false,
            package: call,
            indices: vec![0],
        },
        Action::PackageFreed {
            journaled: false,
            package: call,
            expired: false,
        },
    ] {
        scheduler.journal_action(&action);
    }
    assert_eq!(scheduler.last_lsn, start);
    // A shipped-code package's results still are.
    scheduler.journal_action(&Action::SendResults {
        journaled: true,
        client: Some(ClientId(5)),
        package: PackageId(8),
        results: vec![outcome(0)],
    });
    assert_eq!(scheduler.last_lsn, start + 1);
}

#[test]
fn met_missed_and_late_us_reach_the_wire() {
    let (mut scheduler, mut rx) = with_client();
    let counts = PackageCounts {
        total: 10,
        done: 10,
        met: 7,
        missed: 3,
        ..PackageCounts::default()
    };
    scheduler.route(Action::StatusReply {
        client: ClientId(5),
        req_id: 4,
        package: PackageId(2),
        counts,
    });
    let Msg::StatusReply { counts: got, .. } = sent(&mut rx) else {
        panic!("expected STATUS_REPLY");
    };
    assert_eq!(got, counts);
    assert_eq!((got.met, got.missed), (7, 3));
    let outcome = TaskOutcome {
        index: 1,
        status: TaskStatus::Missed,
        data: Bytes::from_static(b"missed its deadline"),
        queue_us: 1,
        worker_us: 2,
        exec_us: 3,
        wait_us: 4,
        flush_us: 5,
        late_us: 6,
    };
    scheduler.route(Action::SendResults {
        journaled: true,
        client: Some(ClientId(5)),
        package: PackageId(2),
        results: vec![outcome],
    });
    let Msg::Results { results, .. } = sent(&mut rx) else {
        panic!("expected RESULTS");
    };
    assert_eq!((results[0].status, results[0].late_us), (7, 6));
}

#[test]
fn package_options_survive_the_journal_record() {
    let opts = PackageOpts {
        labels: Default::default(),
        resources: Default::default(),
        unschedulable: Default::default(),
        priority: -2,
        timeout_ms: 900,
        key: "k-1".into(),
        deadline_ms: 250,
        on_miss: MissPolicy::Drop,
        admit: true,
        replicas: 3,
        quorum: 2,
        max_copies: 5,
        hedge: true,
        max_attempts: 2,
        near: 42,
        // A held dependency is journaled with its package: a restarted master holds it again.
        after: 41,
        after_index: 3,
    };
    let tasks = [Bytes::from_static(b"a")];
    let code = Bytes::from_static(b"code");
    let record = package_record(
        PackageId(7),
        "alice".into(),
        FnHash([1; 32]),
        &code,
        &opts,
        &tasks,
    );
    assert_eq!(record.opts, opts);
    assert_eq!((record.package, record.user.as_str()), (7, "alice"));
    let default = PackageOpts::default();
    let record = package_record(
        PackageId(8),
        String::new(),
        FnHash([1; 32]),
        &code,
        &default,
        &tasks,
    );
    assert_eq!(record.opts, default);
}

#[test]
fn a_package_refused_by_its_users_bounds_is_not_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let (mut scheduler, mut rx) = with_journal(dir.path());
    scheduler.core = rtpool_core::Core::new(CoreConfig {
        max_queued_tasks_per_user: 2,
        report_deliveries: true,
        ..CoreConfig::default()
    });
    scheduler.apply(Event::ClientJoined {
        client: ClientId(5),
        user: UserId(0),
    });
    let submit = |req_id: u64, n: usize| Event::Submit {
        client: ClientId(5),
        req_id,
        package: PackageId(0),
        fn_hash: FnHash([1; 32]),
        fn_code: Bytes::from_static(b"code"),
        opts: PackageOpts::default(),
        tasks: vec![Bytes::from_static(b"a"); n],
    };
    let start = scheduler.last_lsn;
    scheduler.apply(submit(1, 3));
    assert!(
        matches!(sent(&mut rx), Msg::Error { code, .. } if code == "queue_limit"),
        "refused"
    );
    assert_eq!(
        scheduler.last_lsn, start,
        "a refused package wrote a record"
    );
    scheduler.apply(submit(2, 2));
    assert!(matches!(sent(&mut rx), Msg::Accepted { req_id: 2, .. }));
    assert_eq!(
        scheduler.last_lsn,
        start + 1,
        "an accepted one is journaled"
    );
}
