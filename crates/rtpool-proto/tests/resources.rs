//! Resources and labels on the wire: a worker's `HELLO`, a package's options and a task's
//! `Assignment`, each round-tripped, with the bytes of the new trailing fields pinned.

use bytes::{Bytes, BytesMut};
use rtpool_proto::{
    decode_frame, encode, encode_to_vec, Assignment, CallAssignment, Labels, Msg, PackageOpts,
    Resources, Role, Unschedulable,
};

fn roundtrip(msg: &Msg) -> Msg {
    let mut buf = BytesMut::new();
    encode(msg, &mut buf);
    decode_frame(&mut buf, 1 << 20).unwrap().unwrap()
}

fn res(pairs: &[(&str, u64)]) -> Resources {
    Resources::new(pairs.iter().map(|(n, a)| ((*n).to_owned(), *a))).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::new(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
    .unwrap()
}

fn hello(identity: Option<&str>, resources: Resources, labels: Labels) -> Msg {
    Msg::Hello {
        features: 0,
        version: 2,
        role: Role::Worker,
        token: "t".into(),
        name: "n".into(),
        slots: 2,
        identity: identity.map(str::to_owned),
        resources,
        labels,
    }
}

#[test]
fn hello_carries_resources_and_labels_as_trailing_fields() {
    let with = hello(
        Some("h:1/0"),
        res(&[("mem_gb", 64), ("gpu", 2)]),
        labels(&[("zone", "a")]),
    );
    assert_eq!(roundtrip(&with), with);
    let bytes = encode_to_vec(&with);
    // kind + 5 fields + identity + resources + labels: a fixarray of 9.
    assert_eq!(bytes[4], 0x99);
    // Resources sorted by name: {"gpu": 2, "mem_gb": 64}, then labels {"zone": "a"}.
    let tail: &[u8] = &[
        0x82, 0xa3, b'g', b'p', b'u', 0x02, 0xa6, b'm', b'e', b'm', b'_', b'g', b'b', 0x40, 0x81,
        0xa4, b'z', b'o', b'n', b'e', 0xa1, b'a',
    ];
    assert!(bytes.ends_with(tail), "{bytes:02x?}");
    // Resources without labels: eight fields; neither: the six of before.
    let only = hello(Some("h:1/0"), res(&[("gpu", 1)]), Labels::default());
    assert_eq!(encode_to_vec(&only)[4], 0x98);
    assert_eq!(roundtrip(&only), only);
    let plain = hello(Some("h:1/0"), Resources::default(), Labels::default());
    assert_eq!(encode_to_vec(&plain)[4], 0x97);
    // Labels without an identity still send an (empty) identity first.
    let no_id = hello(None, Resources::default(), labels(&[("zone", "b")]));
    let back = roundtrip(&no_id);
    assert_eq!(
        back,
        hello(Some(""), Resources::default(), labels(&[("zone", "b")]))
    );
}

#[test]
fn package_options_carry_a_request_and_its_policy() {
    let opts = PackageOpts {
        resources: res(&[("gpu", 1)]),
        labels: labels(&[("zone", "a")]),
        unschedulable: Unschedulable::Wait,
        ..PackageOpts::default()
    };
    let msg = Msg::Submit {
        req_id: 1,
        fn_hash: Bytes::from(vec![7; 32]),
        fn_code: Bytes::new(),
        opts,
        tasks: vec![Bytes::from_static(b"x")],
    };
    assert_eq!(roundtrip(&msg), msg);
}

#[test]
fn an_assignment_with_resources_has_eight_fields() {
    let a = Assignment {
        task: 1,
        attempt: 1,
        fn_hash: Bytes::from(vec![1; 32]),
        fn_code: None,
        args: Bytes::new(),
        timeout_ms: 0,
        inputs: Vec::new(),
        res: res(&[("gpu", 1)]),
    };
    let msg = Msg::Assign { tasks: vec![a] };
    assert_eq!(roundtrip(&msg), msg);
    let bytes = encode_to_vec(&msg);
    // [21, [[task, attempt, hash, nil, args, timeout, [], {"gpu": 1}]]]
    assert!(
        bytes.ends_with(&[0x90, 0x81, 0xa3, b'g', b'p', b'u', 0x01]),
        "{bytes:02x?}"
    );
}

#[test]
fn a_call_with_resources_has_nine_fields_and_one_without_stays_as_before() {
    let call = |keep, res| CallAssignment {
        task: 1,
        attempt: 1,
        name: "f".into(),
        version: String::new(),
        args: Bytes::new(),
        inputs: Vec::new(),
        timeout_ms: 0,
        keep,
        res,
    };
    let msg = Msg::AssignCalls {
        calls: vec![call(false, res(&[("gpu", 1)]))],
    };
    assert_eq!(roundtrip(&msg), msg);
    let bytes = encode_to_vec(&msg);
    // [28, [[task, attempt, name, version, args, [], timeout, false, {"gpu": 1}]]]
    assert!(
        bytes.ends_with(&[
            0x99, 0x01, 0x01, 0xa1, b'f', 0xa0, 0xc4, 0x00, 0x90, 0x00, 0xc2, 0x81, 0xa3, b'g',
            b'p', b'u', 0x01
        ]),
        "{bytes:02x?}"
    );
    // Without a request: seven fields, or eight with `keep`, as before.
    let plain = encode_to_vec(&Msg::AssignCalls {
        calls: vec![call(false, Resources::default())],
    });
    assert!(plain.ends_with(&[0x97, 0x01, 0x01, 0xa1, b'f', 0xa0, 0xc4, 0x00, 0x90, 0x00]));
    let kept = Msg::AssignCalls {
        calls: vec![call(true, res(&[("gpu", 2)]))],
    };
    assert_eq!(roundtrip(&kept), kept);
}
