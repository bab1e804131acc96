//! Shared by the integration tests: named sample messages (the source of the shared vectors),
//! proptest strategies for every message kind, and a tiny msgpack builder for hand-made bodies.

#![allow(dead_code)] // each test crate uses a different part of this module

use bytes::{BufMut, Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_proto::{
    Assignment, Call, CallAssignment, FunctionInfo, MissPolicy, Msg, PackageCounts, PackageOpts,
    Resources, Role, ServedFunction, TaskResult, WorkerResult,
};

/// A 32-byte function hash: `start, start+1, ...`.
pub fn hash(start: u8) -> Bytes {
    (0..32u8).map(|i| start.wrapping_add(i)).collect()
}

fn submit(req_id: u64, priority: i32, tasks: Vec<Bytes>) -> Msg {
    Msg::Submit {
        req_id,
        fn_hash: hash(0),
        fn_code: Bytes::from_static(b"\x80\x05\x95code"),
        opts: PackageOpts {
            priority,
            ..PackageOpts::default()
        },
        tasks,
    }
}

fn task_result(index: u32, status: u8, data: &'static [u8]) -> TaskResult {
    TaskResult {
        index,
        status,
        data: Bytes::from_static(data),
        queue_us: 120,
        worker_us: 3_400,
        exec_us: 3_000,
        wait_us: 15,
        flush_us: 200,
        late_us: 0,
    }
}

/// One named sample per message kind and per edge case; `tests/vectors/vectors.json` is made
/// from this list (see `regenerate_vectors` in `tests/vectors.rs`).
pub fn samples() -> Vec<(String, Msg)> {
    let mut out: Vec<(String, Msg)> = vec![
        (
            "hello_client".into(),
            Msg::Hello { features: 0, labels: Default::default(), resources: Default::default(),
                version: 1,
                role: Role::Client,
                token: "client-token".into(),
                name: "laptop:4242".into(),
                slots: 0,
                identity: None,
            },
        ),
        (
            "hello_worker".into(),
            Msg::Hello { features: 0, labels: Default::default(), resources: Default::default(),
                version: 1,
                role: Role::Worker,
                token: "worker-token".into(),
                name: "node-7.cluster.example.org:31337".into(), // 32 bytes: str8
                slots: 4,
                identity: None,
            },
        ),
        (
            "hello_worker_identity".into(),
            Msg::Hello { features: 0, labels: Default::default(), resources: Default::default(),
                version: 2,
                role: Role::Worker,
                token: "worker-token".into(),
                name: "node-7:31337".into(),
                slots: 1,
                identity: Some("node-7:31330/0".into()),
            },
        ),
        (
            "hello_utf8_name".into(),
            Msg::Hello { features: 0, labels: Default::default(), resources: Default::default(),
                version: 1,
                role: Role::Client,
                token: "t".into(),
                name: "Zürich-läptop:1".into(),
                slots: 0,
                identity: None,
            },
        ),
        (
            "welcome".into(),
            Msg::Welcome { idle_heartbeat_ms: 0,
                version: 1,
                session: 42,
                max_frame_bytes: 256 << 20,
                heartbeat_ms: 5_000,
                lease_ms: 3_000,
                instance: 0x1234_5678_9abc_def0,
            },
        ),
        (
            "submit_timeout_and_key".into(),
            Msg::Submit {
                req_id: 9,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    priority: 2,
                    timeout_ms: 1_500,
                    key: "5f0c2d3e9a7b4c1d8e6f0a2b3c4d5e6f".into(),
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"a")],
            },
        ),
        (
            // Every option of the first version away from its default: each key once, in spec
            // order (`max_attempts`, added later, has a vector of its own so that these bytes
            // stay as they were).
            "submit_every_option".into(),
            Msg::Submit {
                req_id: 10,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts { labels: Default::default(), resources: Default::default(), unschedulable: Default::default(),
                    priority: 2,
                    timeout_ms: 1_500,
                    key: "5f0c2d3e9a7b4c1d8e6f0a2b3c4d5e6f".into(),
                    deadline_ms: 250,
                    on_miss: MissPolicy::Drop,
                    admit: true,
                    replicas: 3,
                    quorum: 2,
                    max_copies: 5,
                    hedge: true,
                    max_attempts: 0,
                    near: 0,
                    after: 0,
                    after_index: 0,
                },
                tasks: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
            },
        ),
        (
            // A dependency held by the master: task 0 of package 41 is this package's input.
            "submit_after".into(),
            Msg::Submit {
                req_id: 12,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    near: 0,
                    after: 41,
                    after_index: 0,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"g")],
            },
        ),
        (
            // The common deadline case: a deadline with admission control, nothing else.
            "submit_deadline_admit".into(),
            Msg::Submit {
                req_id: 11,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    deadline_ms: 70_000, // uint32
                    admit: true,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"a")],
            },
        ),
        (
            // Explicit values the decoder accepts though they mean the same as a default (0
            // replicas or quorum is 1) or that the master, not the codec, refuses (quorum
            // above replicas): the codec keeps them as sent.
            "submit_hedge_replicas_0_quorum_9".into(),
            Msg::Submit {
                req_id: 12,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    on_miss: MissPolicy::Run,
                    replicas: 0,
                    quorum: 9,
                    hedge: true,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"a")],
            },
        ),
        (
            // A per-package attempt cap beside a priority: `max_attempts` comes last in spec
            // order.
            "submit_max_attempts".into(),
            Msg::Submit {
                req_id: 13,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    priority: 1,
                    max_attempts: 255,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"a")],
            },
        ),
        (
            // Data locality (kept inputs on worker session 300): `near` comes last in spec
            // order, as a uint16 here.
            "submit_near".into(),
            Msg::Submit {
                req_id: 14,
                fn_hash: hash(0),
                fn_code: Bytes::from_static(b"\x80\x05\x95code"),
                opts: PackageOpts {
                    max_attempts: 2,
                    near: 300,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::from_static(b"a")],
            },
        ),
        (
            "attach".into(),
            Msg::Attach {
                req_id: 12,
                package: 1_001,
            },
        ),
        (
            "ack".into(),
            Msg::Ack {
                package: 1_001,
                count: 300,
            },
        ),
        (
            "abort".into(),
            Msg::Abort {
                tasks: vec![(77, 1), (4_294_967_296, 3)],
            },
        ),
        (
            "error_rejected".into(),
            Msg::Error {
                code: "rejected".into(),
                message: "SUBMIT 7 has a bad option `deadline`: unknown option".into(),
                reference: 7,
            },
        ),
        (
            "error_auth_no_ref".into(),
            Msg::Error {
                code: "auth".into(),
                message: "bad token".into(),
                reference: 0,
            },
        ),
        (
            "error_long_message_str16".into(),
            Msg::Error {
                code: "malformed".into(),
                message: "x".repeat(300),
                reference: 0,
            },
        ),
        (
            "submit_default_opts".into(),
            submit(
                1,
                0,
                vec![Bytes::from_static(b"args-0"), Bytes::from_static(b"args-1")],
            ),
        ),
        (
            "submit_priority_5".into(),
            submit(2, 5, vec![Bytes::from_static(b"a")]),
        ),
        (
            "submit_priority_minus_3".into(),
            submit(3, -3, vec![Bytes::from_static(b"a")]),
        ),
        (
            "submit_empty_task_payload".into(),
            submit(4, 0, vec![Bytes::new()]),
        ),
        (
            "submit_task_bin16_300_bytes".into(),
            submit(5, 0, vec![(0..300u32).map(|i| (i % 251) as u8).collect()]),
        ),
        (
            "accepted".into(),
            Msg::Accepted {
                req_id: 1,
                package: 1_001,
                notice: None,
            },
        ),
        (
            "results_two".into(),
            Msg::Results {
                package: 1_001,
                results: vec![
                    task_result(0, 0, b"\x80\x05K\x2a."),
                    task_result(1, 2, b"cancelled by the master: shutdown"),
                ],
            },
        ),
        (
            "results_bin8_255_and_bin16_256".into(),
            Msg::Results {
                package: 9,
                results: vec![
                    TaskResult {
                        data: Bytes::from(vec![0x55; 255]),
                        ..task_result(0, 0, b"")
                    },
                    TaskResult {
                        data: Bytes::from(vec![0xaa; 256]),
                        ..task_result(1, 3, b"")
                    },
                ],
            },
        ),
        (
            "results_late_missed_disagree".into(),
            Msg::Results {
                package: 1_002,
                results: vec![
                    TaskResult {
                        late_us: 1_250,
                        ..task_result(0, 0, b"\x80\x05K\x2a.")
                    },
                    TaskResult {
                        late_us: 70_000,
                        ..task_result(1, 7, b"missed its deadline")
                    },
                    task_result(
                        2,
                        8,
                        // ["quorum of 2 not reached", [["w1", 0, b"\x01"], ["w2", 0, b"\x02"]]]
                        b"\x92\xb7quorum of 2 not reached\x92\x93\xa2w1\x00\xc4\x01\x01\x93\xa2w2\x00\xc4\x01\x02",
                    ),
                ],
            },
        ),
        (
            "cancel_all".into(),
            Msg::Cancel {
                package: 1_001,
                indices: vec![],
            },
        ),
        (
            "cancel_some".into(),
            Msg::Cancel {
                package: 1_001,
                indices: vec![0, 2, 300],
            },
        ),
        (
            "cancel_array16".into(),
            Msg::Cancel {
                package: 1,
                indices: (0..16).collect(),
            },
        ),
        (
            "status".into(),
            Msg::Status {
                req_id: 5,
                package: 1_001,
            },
        ),
        (
            "status_reply".into(),
            Msg::StatusReply {
                req_id: 5,
                package: 1_001,
                counts: PackageCounts { total: 1_000, queued: 600, running: 8, done: 390, cancelled: 2, met: 0, missed: 0 },
                workers: 4,
            },
        ),
        (
            "status_reply_met_missed".into(),
            Msg::StatusReply {
                req_id: 6,
                package: 1_002,
                counts: PackageCounts { total: 1_000, queued: 0, running: 0, done: 1_000, cancelled: 0, met: 990, missed: 10 },
                workers: 0,
            },
        ),
        ("pull".into(), Msg::Pull { credits: 6 }),
        ("pull_u32_max".into(), Msg::Pull { credits: u32::MAX }),
        (
            "assign_with_fn_code".into(),
            Msg::Assign {
                tasks: vec![Assignment { res: Default::default(),
                    task: 77,
                    attempt: 1,
                    fn_hash: hash(0),
                    fn_code: Some(Bytes::from_static(b"\x80\x05\x95code")),
                    args: Bytes::from_static(b"args-0"),
                    timeout_ms: 2_000,
                    inputs: Vec::new(),
                }],
            },
        ),
        (
            "assign_cached_fn_code_nil".into(),
            Msg::Assign {
                tasks: vec![
                    Assignment { res: Default::default(),
                        task: 78,
                        attempt: 1,
                        fn_hash: hash(0),
                        fn_code: None,
                        args: Bytes::from_static(b"args-1"),
                        timeout_ms: 0,
                        inputs: Vec::new(),
                    },
                    Assignment { res: Default::default(),
                        task: 79,
                        attempt: 2,
                        fn_hash: hash(0),
                        fn_code: None,
                        args: Bytes::new(),
                        timeout_ms: u32::MAX,
                        inputs: Vec::new(),
                    },
                ],
            },
        ),
        (
            "assign_with_inputs".into(),
            Msg::Assign {
                tasks: vec![Assignment { res: Default::default(),
                    task: 80,
                    attempt: 1,
                    fn_hash: hash(0),
                    fn_code: None,
                    args: Bytes::from_static(b"args-2"),
                    timeout_ms: 0,
                    inputs: vec![Bytes::from_static(b"\x80\x05kept-ref")],
                }],
            },
        ),
        (
            "result".into(),
            Msg::Result {
                results: vec![WorkerResult {
                    task: 77,
                    attempt: 1,
                    status: 1,
                    data: Bytes::from_static(b"\x80\x05error-report"),
                    exec_us: 3_000,
                    wait_us: 15,
                    flush_us: 200,
                }],
            },
        ),
        (
            "return".into(),
            Msg::Return {
                tasks: vec![(78, 1), (79, 2)],
            },
        ),
        ("return_none".into(), Msg::Return { tasks: vec![] }),
        ("heartbeat".into(), Msg::Heartbeat),
        ("drain".into(), Msg::Drain),
    ];
    out.extend(rpc_samples());
    // Integer widths: each value in u64 fields, at the edges of fixint/uint8/16/32/64.
    for value in [
        127u64,
        128,
        255,
        256,
        65_535,
        65_536,
        (1 << 32) - 1,
        1 << 32,
        u64::MAX,
    ] {
        out.push((
            format!("accepted_u64_{value}"),
            Msg::Accepted {
                req_id: value,
                package: value,
                notice: None,
            },
        ));
    }
    // i32 edges of the priority option: fixint, int8, int16, int32 and positive uint forms.
    for priority in [-32, -33, -128, -129, i32::MIN, 127, 128, i32::MAX] {
        let name = format!("submit_priority_{priority}").replace('-', "minus_");
        out.push((name, submit(6, priority, vec![Bytes::from_static(b"a")])));
    }
    out
}

/// `{"name": NAME}`: a stand-in for an interface blob (the codec never reads it).
fn interface(name: &str) -> Bytes {
    let mut blob = vec![0x81, 0xa4];
    blob.extend_from_slice(b"name");
    blob.push(0xa0 | name.len() as u8);
    blob.extend_from_slice(name.as_bytes());
    Bytes::from(blob)
}

fn call(name: &str, version: &str, args: &'static [u8], deps: Vec<u32>, fetch: bool) -> Call {
    Call {
        name: name.into(),
        version: version.into(),
        args: Bytes::from_static(args),
        deps,
        fetch,
    }
}

/// The grid RPC messages: `SERVE`, `CALL`, `FUNCTIONS`, `FUNCTIONS_REPLY`, `ASSIGN_CALLS`, and
/// the two errors that belong to them.
fn rpc_samples() -> Vec<(String, Msg)> {
    vec![
        (
            // An empty version, and an interface long enough for a bin16.
            "serve_two_functions".into(),
            Msg::Serve {
                functions: vec![
                    ServedFunction {
                        name: "add".into(),
                        version: "1".into(),
                        interface: interface("add"),
                    },
                    ServedFunction {
                        name: "dmmul".into(),
                        version: String::new(),
                        interface: (0..300u32).map(|i| (i % 251) as u8).collect(),
                    },
                ],
            },
        ),
        ("serve_none".into(), Msg::Serve { functions: vec![] }),
        (
            "call_one_default_opts".into(),
            Msg::Call {
                req_id: 20,
                opts: PackageOpts::default(),
                // msgpack [2, 3]
                calls: vec![call("add", "", b"\x92\x02\x03", vec![], false)],
            },
        ),
        (
            // A transaction: call 1 takes call 0's result, call 2 both; call 0 is fetched too.
            "call_transaction_with_opts".into(),
            Msg::Call {
                req_id: 21,
                opts: PackageOpts {
                    priority: 1,
                    timeout_ms: 500,
                    deadline_ms: 2_000,
                    ..PackageOpts::default()
                },
                calls: vec![
                    call("dgefa", "1", b"\x92\x08\xc4\x00", vec![], true),
                    call(
                        "dgesl",
                        "1",
                        b"\x91\xc7\x03\x02\x92\x00\x01",
                        vec![0],
                        false,
                    ),
                    call("check", "2.10", b"\x90", vec![0, 1], false),
                ],
            },
        ),
        (
            "functions_all".into(),
            Msg::Functions {
                req_id: 22,
                name: String::new(),
            },
        ),
        (
            "functions_one_name".into(),
            Msg::Functions {
                req_id: 23,
                name: "dmmul".into(),
            },
        ),
        (
            "functions_reply_two_versions".into(),
            Msg::FunctionsReply {
                req_id: 23,
                functions: vec![
                    FunctionInfo {
                        name: "dmmul".into(),
                        version: "2".into(),
                        servers: 1,
                        interface: interface("dmmul"),
                    },
                    FunctionInfo {
                        name: "dmmul".into(),
                        version: "1".into(),
                        servers: 300,
                        interface: interface("dmmul"),
                    },
                ],
            },
        ),
        ("cluster_status".into(), Msg::ClusterStatus { req_id: 24 }),
        (
            "release".into(),
            Msg::Release {
                keys: vec![
                    (7, Bytes::from_static(&[0xA5; 16])),
                    (300, Bytes::from_static(b"0123456789abcdef")),
                ],
            },
        ),
        (
            "drop".into(),
            Msg::Drop {
                keys: vec![Bytes::from_static(b"0123456789abcdef")],
            },
        ),
        (
            "cluster_status_reply".into(),
            Msg::ClusterStatusReply {
                req_id: 24,
                // {"totals": {"queued": 3}, "workers": []}
                status: Bytes::from_static(b"\x82\xa6totals\x81\xa6queued\x03\xa7workers\x90"),
            },
        ),
        (
            "functions_reply_empty".into(),
            Msg::FunctionsReply {
                req_id: 22,
                functions: vec![],
            },
        ),
        (
            "assign_calls_with_inputs".into(),
            Msg::AssignCalls {
                calls: vec![
                    CallAssignment {
                        task: 80,
                        attempt: 1,
                        name: "add".into(),
                        version: "1".into(),
                        args: Bytes::from_static(b"\x92\x02\x03"),
                        inputs: vec![],
                        timeout_ms: 0,
                        keep: false,
                        res: Default::default(),
                    },
                    CallAssignment {
                        task: 81,
                        attempt: 2,
                        name: "dgesl".into(),
                        version: "1".into(),
                        args: Bytes::from_static(b"\x91\xc7\x03\x02\x92\x00\x01"),
                        inputs: vec![
                            Bytes::from_static(b"\x93\x00\xc4\x00\xc4\x00"),
                            Bytes::new(),
                        ],
                        timeout_ms: 1_500,
                        keep: true,
                        res: Default::default(),
                    },
                ],
            },
        ),
        (
            // A call of a package that asks for resources: `keep` (false) and `res` follow.
            "assign_calls_with_res".into(),
            Msg::AssignCalls {
                calls: vec![CallAssignment {
                    task: 82,
                    attempt: 1,
                    name: "train".into(),
                    version: "".into(),
                    args: Bytes::from_static(b"\x90"),
                    inputs: vec![],
                    timeout_ms: 0,
                    keep: false,
                    res: Resources::new([("gpu".to_owned(), 1)]).unwrap(),
                }],
            },
        ),
        (
            "error_unknown_function".into(),
            Msg::Error {
                code: "unknown_function".into(),
                message: "no worker serves 'dmmul' version 3; served: dmmul (2, 1)".into(),
                reference: 21,
            },
        ),
        (
            "error_serve_conflict".into(),
            Msg::Error {
                code: "serve_conflict".into(),
                message: "another worker serves add version 1 with a different interface; this \
                          worker's add is not served"
                    .into(),
                reference: 0,
            },
        ),
    ]
}

fn arb_bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn arb_hash() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 32).prop_map(Bytes::from)
}

/// Integers biased towards the edges of msgpack's integer formats.
fn arb_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..300,
        (0u32..64).prop_map(|shift| 1u64 << shift),
        (1u32..64).prop_map(|shift| (1u64 << shift) - 1),
        any::<u64>(),
    ]
}

fn arb_u32() -> impl Strategy<Value = u32> {
    arb_u64().prop_map(|v| v as u32)
}

fn arb_i32() -> impl Strategy<Value = i32> {
    prop_oneof![-300i32..300, any::<i32>(), Just(i32::MIN), Just(i32::MAX)]
}

fn arb_task_result() -> impl Strategy<Value = TaskResult> {
    (
        arb_u32(),
        any::<u8>(),
        arb_bytes(40),
        [
            arb_u64(),
            arb_u64(),
            arb_u64(),
            arb_u64(),
            arb_u64(),
            arb_u64(),
        ],
    )
        .prop_map(|(index, status, data, us)| TaskResult {
            index,
            status,
            data,
            queue_us: us[0],
            worker_us: us[1],
            exec_us: us[2],
            wait_us: us[3],
            flush_us: us[4],
            late_us: us[5],
        })
}

/// Any `u8` option value, defaults (0 and 1) often.
fn arb_u8_option() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0u8), Just(1), 2u8..=16, any::<u8>()]
}

/// Any options the decoder accepts, with the defaults frequent (so that the encoder leaves
/// some keys out and writes others).
fn arb_submit_opts() -> impl Strategy<Value = PackageOpts> {
    (
        (arb_i32(), arb_u32(), "[a-z0-9]{0,32}"),
        (
            arb_u32(),
            prop_oneof![Just(MissPolicy::Run), Just(MissPolicy::Drop)],
            any::<bool>(),
        ),
        (
            arb_u8_option(),
            arb_u8_option(),
            arb_u8_option(),
            any::<bool>(),
        ),
        // 0 is the default (left out); 1 to 255 on the wire.
        (
            prop_oneof![Just(0u32), 1u32..=255],
            prop_oneof![Just(0u64), 0u64..=i64::MAX as u64],
            prop_oneof![Just(0u64), 0u64..=i64::MAX as u64],
            arb_u32(),
        ),
    )
        .prop_map(
            |(
                (priority, timeout_ms, key),
                (deadline_ms, on_miss, admit),
                (replicas, quorum, max_copies, hedge),
                (max_attempts, near, after, after_index),
            )| PackageOpts {
                labels: Default::default(),
                resources: Default::default(),
                unschedulable: Default::default(),
                priority,
                timeout_ms,
                key,
                deadline_ms,
                on_miss,
                admit,
                replicas,
                quorum,
                max_copies,
                hedge,
                max_attempts,
                near,
                after,
                after_index,
            },
        )
}

fn arb_assignment() -> impl Strategy<Value = Assignment> {
    (
        arb_u64(),
        arb_u32(),
        arb_hash(),
        proptest::option::of(arb_bytes(40)),
        arb_bytes(40),
        arb_u32(),
        proptest::collection::vec(arb_bytes(40), 0..3),
    )
        .prop_map(
            |(task, attempt, fn_hash, fn_code, args, timeout_ms, inputs)| Assignment {
                res: Default::default(),
                task,
                attempt,
                fn_hash,
                fn_code,
                args,
                timeout_ms,
                inputs,
            },
        )
}

fn arb_worker_result() -> impl Strategy<Value = WorkerResult> {
    (
        arb_u64(),
        arb_u32(),
        any::<u8>(),
        arb_bytes(40),
        [arb_u64(), arb_u64(), arb_u64()],
    )
        .prop_map(|(task, attempt, status, data, us)| WorkerResult {
            task,
            attempt,
            status,
            data,
            exec_us: us[0],
            wait_us: us[1],
            flush_us: us[2],
        })
}

/// A function name within the decoder's limits (1 to 128 bytes).
fn arb_function_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z_][a-z0-9_.]{0,20}", "\\PC{1,32}", "[a-z]{128}"]
}

/// A function version within the decoder's limits (at most 64 bytes).
fn arb_version() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[0-9]{1,3}(\\.[0-9]{1,3}){0,2}",
        "[a-z]{64}"
    ]
}

fn arb_served_function() -> impl Strategy<Value = ServedFunction> {
    (arb_function_name(), arb_version(), arb_bytes(60)).prop_map(|(name, version, interface)| {
        ServedFunction {
            name,
            version,
            interface,
        }
    })
}

fn arb_call() -> impl Strategy<Value = Call> {
    (
        arb_function_name(),
        arb_version(),
        arb_bytes(40),
        vec(arb_u32(), 0..5),
        any::<bool>(),
    )
        .prop_map(|(name, version, args, deps, fetch)| Call {
            name,
            version,
            args,
            deps,
            fetch,
        })
}

fn arb_call_assignment() -> impl Strategy<Value = CallAssignment> {
    (
        (arb_u64(), arb_u32(), arb_function_name(), arb_version()),
        (
            arb_bytes(40),
            vec(arb_bytes(20), 0..4),
            arb_u32(),
            any::<bool>(),
            arb_resources(),
        ),
    )
        .prop_map(
            |((task, attempt, name, version), (args, inputs, timeout_ms, keep, res))| {
                CallAssignment {
                    task,
                    attempt,
                    name,
                    version,
                    args,
                    inputs,
                    timeout_ms,
                    keep,
                    res,
                }
            },
        )
}

fn arb_function_info() -> impl Strategy<Value = FunctionInfo> {
    (arb_function_name(), arb_version(), arb_u32(), arb_bytes(60)).prop_map(
        |(name, version, servers, interface)| FunctionInfo {
            name,
            version,
            servers,
            interface,
        },
    )
}

/// Any well-formed grid RPC message.
fn arb_rpc_msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        vec(arb_served_function(), 0..6).prop_map(|functions| Msg::Serve { functions }),
        (arb_u64(), arb_submit_opts(), vec(arb_call(), 0..6)).prop_map(|(req_id, opts, calls)| {
            Msg::Call {
                req_id,
                opts,
                calls,
            }
        }),
        (
            arb_u64(),
            prop_oneof![Just(String::new()), arb_function_name()]
        )
            .prop_map(|(req_id, name)| Msg::Functions { req_id, name }),
        (arb_u64(), vec(arb_function_info(), 0..6))
            .prop_map(|(req_id, functions)| Msg::FunctionsReply { req_id, functions }),
        vec(arb_call_assignment(), 0..6).prop_map(|calls| Msg::AssignCalls { calls }),
    ]
}

/// Any well-formed message (within the decoder's limits on name, token and fn_hash).
pub fn arb_msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        arb_rpc_msg(),
        (
            arb_u32(),
            prop_oneof![Just(Role::Client), Just(Role::Worker)],
            "\\PC{0,200}",
            "\\PC{0,64}",
            arb_u32()
        )
            .prop_flat_map(|fields| (Just(fields), proptest::option::of("\\PC{0,64}")))
            .prop_map(
                |((version, role, token, name, slots), identity)| Msg::Hello {
                    features: 0,
                    labels: Default::default(),
                    resources: Default::default(),
                    version,
                    role,
                    token,
                    name,
                    slots,
                    identity
                }
            ),
        (
            arb_u32(),
            arb_u64(),
            arb_u32(),
            arb_u32(),
            arb_u32(),
            arb_u64()
        )
            .prop_map(|(v, s, m, h, l, i)| Msg::Welcome {
                idle_heartbeat_ms: 0,
                version: v,
                session: s,
                max_frame_bytes: m,
                heartbeat_ms: h,
                lease_ms: l,
                instance: i,
            }),
        ("\\PC{0,20}", "\\PC{0,80}", arb_u64()).prop_map(|(code, message, reference)| {
            Msg::Error {
                code,
                message,
                reference,
            }
        }),
        (
            arb_u64(),
            arb_hash(),
            arb_bytes(80),
            arb_submit_opts(),
            vec(arb_bytes(40), 0..20)
        )
            .prop_map(|(req_id, fn_hash, fn_code, opts, tasks)| Msg::Submit {
                req_id,
                fn_hash,
                fn_code,
                opts,
                tasks
            }),
        (arb_u64(), arb_u64(), proptest::option::of("[a-z ]{0,40}")).prop_map(
            |(req_id, package, notice)| Msg::Accepted {
                req_id,
                package,
                notice
            }
        ),
        (arb_u64(), vec(arb_task_result(), 0..8))
            .prop_map(|(package, results)| Msg::Results { package, results }),
        (arb_u64(), vec(arb_u32(), 0..40))
            .prop_map(|(package, indices)| Msg::Cancel { package, indices }),
        (arb_u64(), arb_u64()).prop_map(|(req_id, package)| Msg::Status { req_id, package }),
        (arb_u64(), arb_u64()).prop_map(|(req_id, package)| Msg::Attach { req_id, package }),
        (arb_u64(), arb_u64()).prop_map(|(package, count)| Msg::Ack { package, count }),
        vec((arb_u64(), arb_u32()), 0..20).prop_map(|tasks| Msg::Abort { tasks }),
        (
            arb_u64(),
            arb_u64(),
            [
                arb_u32(),
                arb_u32(),
                arb_u32(),
                arb_u32(),
                arb_u32(),
                arb_u32(),
                arb_u32()
            ],
            arb_u32()
        )
            .prop_map(|(req_id, package, n, workers)| Msg::StatusReply {
                req_id,
                package,
                counts: PackageCounts {
                    total: n[0],
                    queued: n[1],
                    running: n[2],
                    done: n[3],
                    cancelled: n[4],
                    met: n[5],
                    missed: n[6]
                },
                workers,
            }),
        arb_u32().prop_map(|credits| Msg::Pull { credits }),
        vec(arb_assignment(), 0..8).prop_map(|tasks| Msg::Assign { tasks }),
        vec(arb_worker_result(), 0..8).prop_map(|results| Msg::Result { results }),
        vec((arb_u64(), arb_u32()), 0..20).prop_map(|tasks| Msg::Return { tasks }),
        Just(Msg::Heartbeat),
        Just(Msg::Drain),
    ]
}

/// A msgpack value to build hand-made (and broken) bodies with.
#[derive(Debug, Clone)]
pub enum V {
    /// Unsigned integer, most compact form.
    U(u64),
    /// Signed integer, most compact form.
    I(i64),
    /// Raw bytes written as they are (a marker of a chosen width, a broken tail).
    Raw(Vec<u8>),
    /// str.
    S(String),
    /// bin.
    B(Vec<u8>),
    /// nil.
    Nil,
    /// bool.
    Bool(bool),
    /// float64.
    F(f64),
    /// array.
    A(Vec<V>),
    /// map.
    M(Vec<(V, V)>),
}

impl V {
    /// A str value.
    pub fn s(text: &str) -> V {
        V::S(text.to_owned())
    }

    /// The value's msgpack bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        use rmp::encode::*;
        match self {
            V::U(v) => drop(write_uint(out, *v)),
            V::I(v) => drop(write_sint(out, *v)),
            V::Raw(bytes) => out.extend_from_slice(bytes),
            V::S(s) => drop(write_str(out, s)),
            V::B(b) => drop(write_bin(out, b)),
            V::Nil => drop(write_nil(out)),
            V::Bool(b) => drop(write_bool(out, *b)),
            V::F(f) => drop(write_f64(out, *f)),
            V::A(items) => {
                write_array_len(out, items.len() as u32).unwrap();
                items.iter().for_each(|item| item.write(out));
            }
            V::M(entries) => {
                write_map_len(out, entries.len() as u32).unwrap();
                for (k, v) in entries {
                    k.write(out);
                    v.write(out);
                }
            }
        }
    }
}

/// A whole frame (length prefix included) around `body`.
pub fn frame_of(body: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(4 + body.len());
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(body);
    buf
}

/// A whole frame around the msgpack encoding of `value`.
pub fn frame(value: &V) -> BytesMut {
    frame_of(&value.to_bytes())
}

fn arb_resources() -> impl Strategy<Value = Resources> {
    proptest::collection::btree_map(
        prop_oneof![Just("gpu"), Just("mem_gb"), Just("license_x")],
        0u64..100,
        0..3,
    )
    .prop_map(|m| Resources::new(m.into_iter().map(|(n, a)| (n.to_owned(), a))).unwrap())
}
