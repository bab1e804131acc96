//! Named functions (grid RPC) end to end, with raw protocol peers: `SERVE`, `FUNCTIONS`,
//! `CALL`, `ASSIGN_CALLS` and their errors, through the shell and the core's registry.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::{expect_accepted, expect_error, master, Peer};
use rtpool_master::{MasterConfig, MasterHandle};
use rtpool_proto::{
    Call, CallAssignment, FunctionInfo, Msg, PackageOpts, Role, ServedFunction, TaskResult,
    WorkerResult,
};

fn client(m: &MasterHandle) -> Peer {
    let (peer, welcome) = Peer::hello(m, Role::Client, &m.tokens().client.clone(), 0);
    assert!(matches!(welcome, Msg::Welcome { .. }), "{welcome:?}");
    peer
}

fn worker(m: &MasterHandle) -> Peer {
    let (peer, welcome) = Peer::hello(m, Role::Worker, &m.tokens().worker.clone(), 1);
    assert!(matches!(welcome, Msg::Welcome { .. }), "{welcome:?}");
    peer
}

fn function(name: &str, version: &str, interface: &'static [u8]) -> ServedFunction {
    ServedFunction {
        name: name.into(),
        version: version.into(),
        interface: Bytes::from_static(interface),
    }
}

fn serve(functions: Vec<ServedFunction>) -> Msg {
    Msg::Serve { functions }
}

fn call(name: &str, args: &'static [u8], deps: Vec<u32>, fetch: bool) -> Call {
    Call {
        name: name.into(),
        version: String::new(),
        args: Bytes::from_static(args),
        deps,
        fetch,
    }
}

fn call_msg(req_id: u64, calls: Vec<Call>) -> Msg {
    Msg::Call {
        req_id,
        opts: PackageOpts::default(),
        calls,
    }
}

fn functions_reply(msg: Msg, req_id: u64) -> Vec<FunctionInfo> {
    match msg {
        Msg::FunctionsReply {
            req_id: r,
            functions,
        } if r == req_id => functions,
        other => panic!("expected FUNCTIONS_REPLY {req_id}, got {other:?}"),
    }
}

fn assigned_calls(msg: Msg) -> Vec<CallAssignment> {
    match msg {
        Msg::AssignCalls { calls } => calls,
        other => panic!("expected ASSIGN_CALLS, got {other:?}"),
    }
}

fn result_of(call: &CallAssignment, data: &'static [u8]) -> Msg {
    Msg::Result {
        results: vec![WorkerResult {
            task: call.task,
            attempt: call.attempt,
            status: 0,
            data: Bytes::from_static(data),
            exec_us: 40,
            wait_us: 0,
            flush_us: 0,
        }],
    }
}

/// Waits until the registry lists `name`: a worker's `SERVE` and a client's next request come
/// on different connections, so nothing else orders them.
fn wait_served(c: &mut Peer, name: &str) {
    let mut req_id = 1_000;
    common::wait_until(&format!("{name} is served"), || {
        req_id += 1;
        c.send(&Msg::Functions {
            req_id,
            name: name.into(),
        });
        !functions_reply(c.recv(), req_id).is_empty()
    });
}

/// Reads `RESULTS` of `package` until `n` task results came, in arrival order.
fn results(client: &mut Peer, package: u64, n: usize) -> Vec<TaskResult> {
    let mut out = Vec::new();
    while out.len() < n {
        match client.recv() {
            Msg::Results {
                package: p,
                results,
            } if p == package => out.extend(results),
            other => panic!("expected RESULTS of {package}, got {other:?}"),
        }
    }
    out
}

#[test]
fn functions_is_answered_with_its_req_id() {
    let m = master();
    let mut c = client(&m);
    c.send(&Msg::Functions {
        req_id: 3,
        name: String::new(),
    });
    assert_eq!(functions_reply(c.recv(), 3), vec![]);
    c.send(&Msg::Functions {
        req_id: 4,
        name: "add".into(),
    });
    assert_eq!(functions_reply(c.recv(), 4), vec![]);
}

#[test]
fn a_call_of_an_unknown_function_is_a_non_fatal_unknown_function_error() {
    let m = master();
    let mut w = worker(&m);
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    let mut c = client(&m);
    c.send(&call_msg(9, vec![call("nosuch", b"\x90", vec![], false)]));
    let Msg::Error {
        code, reference, ..
    } = c.recv()
    else {
        panic!("expected ERROR");
    };
    assert_eq!((code.as_str(), reference), ("unknown_function", 9));
    // Not fatal: the client goes on.
    c.send(&Msg::Functions {
        req_id: 10,
        name: "nosuch".into(),
    });
    functions_reply(c.recv(), 10);
}

#[test]
fn a_second_serve_or_a_serve_after_pull_is_a_fatal_malformed() {
    let m = master();
    let mut w = worker(&m);
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    w.send(&serve(vec![function("mul", "1", b"\x80")]));
    let message = expect_error(w.recv(), "malformed");
    assert!(
        message.starts_with("a second SERVE on this connection"),
        "{message}"
    );
    assert!(message.contains("before its first PULL"), "{message}");
    assert!(w.is_closed());

    let mut w = worker(&m);
    w.send(&Msg::Pull { credits: 1 });
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    let message = expect_error(w.recv(), "malformed");
    assert!(message.starts_with("SERVE after PULL"), "{message}");
    assert!(w.is_closed());

    // Only those connections: the master serves the next worker.
    let mut w = worker(&m);
    w.send(&serve(vec![]));
    w.send(&Msg::Pull { credits: 1 });
    let mut c = client(&m);
    c.send(&Msg::Functions {
        req_id: 1,
        name: String::new(),
    });
    functions_reply(c.recv(), 1);
}

#[test]
fn rpc_messages_of_the_wrong_role_are_unknown_kind() {
    let m = master();
    let cases: Vec<(Role, Msg, &str)> = vec![
        (Role::Client, serve(vec![]), "a client may not send SERVE"),
        (
            Role::Worker,
            call_msg(1, vec![call("add", b"\x90", vec![], false)]),
            "a worker may not send CALL",
        ),
        (
            Role::Worker,
            Msg::Functions {
                req_id: 1,
                name: String::new(),
            },
            "a worker may not send FUNCTIONS",
        ),
        (
            Role::Client,
            Msg::AssignCalls { calls: vec![] },
            "a client may not send ASSIGN_CALLS",
        ),
        (
            Role::Worker,
            Msg::FunctionsReply {
                req_id: 1,
                functions: vec![],
            },
            "a worker may not send FUNCTIONS_REPLY",
        ),
    ];
    for (role, msg, expected) in cases {
        let mut p = match role {
            Role::Client => client(&m),
            Role::Worker => worker(&m),
        };
        p.send(&msg);
        assert_eq!(expect_error(p.recv(), "unknown_kind"), expected);
        assert!(p.is_closed(), "{expected}: still open");
    }
}

#[test]
fn a_bad_call_option_is_rejected_and_the_client_goes_on() {
    // [18, 4, {"replicas": "two"}, [["add", "", b"", [], false]]], by hand: the encoder
    // cannot write a bad option.
    let mut body = Vec::new();
    rmp::encode::write_array_len(&mut body, 4).unwrap();
    rmp::encode::write_uint(&mut body, 18).unwrap();
    rmp::encode::write_uint(&mut body, 4).unwrap();
    rmp::encode::write_map_len(&mut body, 1).unwrap();
    rmp::encode::write_str(&mut body, "replicas").unwrap();
    rmp::encode::write_str(&mut body, "two").unwrap();
    rmp::encode::write_array_len(&mut body, 1).unwrap();
    rmp::encode::write_array_len(&mut body, 5).unwrap();
    rmp::encode::write_str(&mut body, "add").unwrap();
    rmp::encode::write_str(&mut body, "").unwrap();
    rmp::encode::write_bin(&mut body, b"").unwrap();
    rmp::encode::write_array_len(&mut body, 0).unwrap();
    rmp::encode::write_bool(&mut body, false).unwrap();
    let m = master();
    let mut c = client(&m);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend(body);
    std::io::Write::write_all(&mut c.sock, &frame).unwrap();
    match c.recv() {
        Msg::Error {
            code,
            message,
            reference: 4,
        } => {
            assert_eq!(code, "rejected");
            assert_eq!(
                message,
                "CALL 4 has a bad option `replicas`: expected an integer, found a str"
            );
        }
        other => panic!("expected ERROR rejected, got {other:?}"),
    }
    c.send(&Msg::Functions {
        req_id: 5,
        name: String::new(),
    });
    functions_reply(c.recv(), 5);
}

#[test]
fn a_worker_serves_two_functions_and_a_client_lists_them() {
    let m = master();
    let mut w = worker(&m);
    w.send(&serve(vec![
        function("mul", "1", b"\x81\xa4name\xa3mul"),
        function("add", "1", b"\x81\xa4name\xa3add"),
    ]));
    let mut c = client(&m);
    wait_served(&mut c, "mul");
    c.send(&Msg::Functions {
        req_id: 1,
        name: String::new(),
    });
    let listed = functions_reply(c.recv(), 1);
    let expected = vec![
        FunctionInfo {
            name: "add".into(),
            version: "1".into(),
            servers: 1,
            interface: Bytes::from_static(b"\x81\xa4name\xa3add"),
        },
        FunctionInfo {
            name: "mul".into(),
            version: "1".into(),
            servers: 1,
            interface: Bytes::from_static(b"\x81\xa4name\xa3mul"),
        },
    ];
    assert_eq!(listed, expected, "names sorted, interfaces as served");
    assert_eq!(m.stats().unwrap().core.services, 2);
    c.send(&Msg::Functions {
        req_id: 2,
        name: "mul".into(),
    });
    assert_eq!(functions_reply(c.recv(), 2), expected[1..]);
    // An unknown name: the message names it and lists what is served.
    c.send(&call_msg(3, vec![call("nosuch", b"\x90", vec![], false)]));
    let Msg::Error {
        code,
        message,
        reference,
    } = c.recv()
    else {
        panic!("expected ERROR");
    };
    assert_eq!((code.as_str(), reference), ("unknown_function", 3));
    assert!(message.contains("nosuch"), "{message}");
    assert!(
        message.contains("add") && message.contains("mul"),
        "{message}"
    );
    // The worker's functions lose their server with its connection; they stay listed with
    // none for the service grace (calls of them wait for a server to return).
    drop(w);
    common::wait_until("the worker's functions have no server", || {
        c.send(&Msg::Functions {
            req_id: 4,
            name: String::new(),
        });
        let listed = functions_reply(c.recv(), 4);
        listed.len() == 2 && listed.iter().all(|f| f.servers == 0)
    });
}

#[test]
fn a_conflicting_serve_gets_serve_conflict_and_its_other_functions_are_served() {
    let m = master();
    let mut first = worker(&m);
    first.send(&serve(vec![function("add", "1", b"\x81\xa1a\x01")]));
    let mut c = client(&m);
    // The first worker's SERVE is handled before the second worker connects.
    wait_served(&mut c, "add");
    let mut second = worker(&m);
    second.send(&serve(vec![
        function("add", "1", b"\x81\xa1a\x02"),
        function("mul", "1", b"\x81\xa1m\x01"),
    ]));
    match second.recv() {
        Msg::Error {
            code,
            message,
            reference: 0,
        } => {
            assert_eq!(code, "serve_conflict");
            assert_eq!(
                message,
                "another worker serves add version 1 with a different interface; this \
                 worker's add is not served"
            );
        }
        other => panic!("expected ERROR serve_conflict, got {other:?}"),
    }
    // Not fatal: the second worker serves `mul` and the first keeps `add` with its interface.
    c.send(&Msg::Functions {
        req_id: 2,
        name: String::new(),
    });
    let listed = functions_reply(c.recv(), 2);
    let summary: Vec<(&str, u32, &[u8])> = listed
        .iter()
        .map(|f| (f.name.as_str(), f.servers, f.interface.as_ref()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("add", 1, &b"\x81\xa1a\x01"[..]),
            ("mul", 1, &b"\x81\xa1m\x01"[..])
        ]
    );
    second.send(&Msg::Pull { credits: 1 });
    first.send(&Msg::Pull { credits: 1 });
    c.send(&call_msg(
        3,
        vec![call("mul", b"\x92\x02\x03", vec![], false)],
    ));
    expect_accepted(c.recv(), 3);
    let calls = assigned_calls(second.recv());
    assert_eq!(calls[0].name, "mul");
}

#[test]
fn a_call_runs_on_a_worker_that_serves_it_and_its_result_comes_back() {
    let m = master();
    let mut w = worker(&m);
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    w.send(&Msg::Pull { credits: 1 });
    let mut c = client(&m);
    wait_served(&mut c, "add");
    // Not even msgpack: the master never reads the payload.
    let args: &'static [u8] = b"\xc1opaque args\x00\xff";
    c.send(&Msg::Call {
        req_id: 7,
        opts: PackageOpts {
            timeout_ms: 750,
            ..PackageOpts::default()
        },
        calls: vec![call("add", args, vec![], false)],
    });
    let package = expect_accepted(c.recv(), 7);
    let calls = assigned_calls(w.recv());
    assert_eq!(calls.len(), 1);
    let a = &calls[0];
    assert_eq!((a.name.as_str(), a.version.as_str()), ("add", "1"));
    assert_eq!(a.args.as_ref(), args, "args blob passed through untouched");
    assert!(a.inputs.is_empty());
    assert_eq!((a.attempt, a.timeout_ms), (1, 750));
    w.send(&result_of(a, b"\x91\x05"));
    let got = results(&mut c, package, 1);
    assert_eq!((got[0].index, got[0].status), (0, 0));
    assert_eq!(got[0].data.as_ref(), b"\x91\x05");
    assert_eq!(got[0].exec_us, 40);
}

#[test]
fn a_transaction_hands_call_0s_result_to_call_1_and_fetches_only_call_1() {
    let m = master();
    let mut w = worker(&m);
    w.send(&serve(vec![
        function("dgefa", "1", b"\x80"),
        function("dgesl", "1", b"\x80"),
    ]));
    w.send(&Msg::Pull { credits: 2 });
    let mut c = client(&m);
    wait_served(&mut c, "dgesl");
    c.send(&call_msg(
        8,
        vec![
            call("dgefa", b"\x91\x08", vec![], false),
            call("dgesl", b"\x91\xc7\x03\x02\x92\x00\xff", vec![0], false),
        ],
    ));
    let package = expect_accepted(c.recv(), 8);
    // Call 1 waits for its input: only call 0 is assigned, though a credit is free.
    let first = assigned_calls(w.recv());
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].name, "dgefa");
    let lu: &'static [u8] = b"\x93\x00\xc4\x03LU!\xc4\x01\x07";
    w.send(&result_of(&first[0], lu));
    let second = assigned_calls(w.recv());
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(second[0].name, "dgesl");
    assert_eq!(second[0].args.as_ref(), b"\x91\xc7\x03\x02\x92\x00\xff");
    assert_eq!(
        second[0].inputs,
        vec![Bytes::from_static(lu)],
        "call 0's result blob"
    );
    w.send(&result_of(&second[0], b"\x91\xc4\x01x"));
    let mut got = results(&mut c, package, 2);
    got.sort_by_key(|r| r.index);
    assert_eq!((got[0].index, got[0].status), (0, 0));
    assert!(
        got[0].data.is_empty(),
        "call 0 is not fetched: {:?}",
        got[0].data
    );
    assert_eq!((got[1].index, got[1].status), (1, 0));
    assert_eq!(got[1].data.as_ref(), b"\x91\xc4\x01x");
}

fn journaled_master(dir: &Path) -> MasterHandle {
    MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: Some(dir.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn a_call_package_is_journaled_and_a_client_reattaching_after_a_restart_gets_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let m = journaled_master(dir.path());
    let mut w = worker(&m);
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    w.send(&Msg::Pull { credits: 1 });
    let mut c = client(&m);
    wait_served(&mut c, "add");
    c.send(&call_msg(
        1,
        vec![call("add", b"\x92\x02\x03", vec![], false)],
    ));
    let package = expect_accepted(c.recv(), 1);
    let a = assigned_calls(w.recv()).remove(0);
    // The master stops before the result comes: the call runs again after the restart.
    drop((c, w));
    drop(m);

    let again = journaled_master(dir.path());
    let replay = again.stats().unwrap().replay.expect("replayed");
    assert_eq!(replay.packages, 1, "the call package was journaled");
    let mut c = client(&again);
    c.send(&Msg::Attach { req_id: 2, package });
    assert_eq!(expect_accepted(c.recv(), 2), package);
    // A worker serving the function again (its interface unknown until then) runs it.
    let mut w = worker(&again);
    w.send(&serve(vec![function("add", "1", b"\x80")]));
    w.send(&Msg::Pull { credits: 1 });
    let rerun = assigned_calls(w.recv()).remove(0);
    assert_eq!(
        (rerun.name.as_str(), rerun.args.as_ref()),
        ("add", a.args.as_ref())
    );
    w.send(&result_of(&rerun, b"\x91\x05"));
    assert_eq!(results(&mut c, package, 1)[0].data.as_ref(), b"\x91\x05");
}
