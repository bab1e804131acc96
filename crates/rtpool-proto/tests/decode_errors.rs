//! Bodies a peer may send by mistake or on purpose: each gets the right error, names what was
//! wrong, and leaves the stream in step.

mod common;

use bytes::BytesMut;
use common::{frame, frame_of, hash, V};
use rtpool_proto::{decode_frame, encode, kind, MissPolicy, Msg, PackageOpts, ProtoError, Role};

const LIMIT: usize = 1 << 20;

fn decode(buf: &mut BytesMut) -> Result<Option<Msg>, ProtoError> {
    decode_frame(buf, LIMIT)
}

/// Decodes the frame of `value`, expects an error, and checks the frame was consumed.
fn error_of(value: &V) -> ProtoError {
    let mut buf = frame(value);
    let err = decode(&mut buf).expect_err("expected an error");
    assert!(buf.is_empty(), "frame not consumed after {err}");
    err
}

/// Expects `Malformed` for the given kind with a reason containing every one of `needles`.
fn assert_malformed(value: &V, expected_kind: Option<u8>, needles: &[&str]) {
    match error_of(value) {
        ProtoError::Malformed { kind, reason } => {
            assert_eq!(kind, expected_kind, "reason: {reason}");
            for needle in needles {
                assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
            }
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
}

fn hello(role: V, token: V, name: V) -> V {
    V::A(vec![V::U(1), V::U(1), role, token, name, V::U(0)])
}

fn submit_with_opts(opts: V) -> V {
    V::A(vec![
        V::U(10),
        V::U(9),
        V::B(hash(0).to_vec()),
        V::B(b"code".to_vec()),
        opts,
        V::A(vec![V::B(b"t".to_vec())]),
    ])
}

#[test]
fn garbage_bodies_are_malformed() {
    for (body, needle) in [
        (&[0xc1][..], "invalid marker 0xc1"),
        (&[0xa3, b'a', b'b', b'c'][..], "body is a str"),
        (&[0x80][..], "body is a map"),
        (&[0x05][..], "body is an integer"),
        (&[0x90][..], "empty array"),
        (&[0x93, 0x01][..], "body: declares 3 elements"),
        (&[0x91][..], "body: declares 1 elements"),
        (
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0x18][..],
            "declares 4294967295 elements",
        ),
        (&[0xdc, 0x00][..], "body ends 1 bytes short"),
    ] {
        let mut buf = frame_of(body);
        match decode(&mut buf) {
            Err(ProtoError::Malformed { reason, .. }) => {
                assert!(
                    reason.contains(needle),
                    "{body:02x?}: {reason:?} lacks {needle:?}"
                )
            }
            other => panic!("{body:02x?}: expected Malformed, got {other:?}"),
        }
        assert!(buf.is_empty());
    }
}

#[test]
fn trailing_bytes_after_the_array() {
    let mut body = V::A(vec![V::U(24)]).to_bytes();
    body.push(0xc0);
    let mut buf = frame_of(&body);
    assert!(matches!(
        decode(&mut buf),
        Err(ProtoError::Malformed { kind: Some(24), reason }) if reason.contains("1 trailing bytes")
    ));
}

#[test]
fn unknown_kinds() {
    for k in [0u64, 4, 9, 34, 35, 99, 255, 256, u64::MAX] {
        let err = error_of(&V::A(vec![V::U(k)]));
        assert_eq!(err, ProtoError::UnknownKind { kind: k });
        assert_eq!(err.code(), "unknown_kind");
        assert!(err.is_fatal());
        assert_eq!(err.to_string(), format!("unknown message kind {k}"));
    }
    assert_malformed(&V::A(vec![V::I(-1)]), None, &["negative message kind -1"]);
    assert_malformed(
        &V::A(vec![V::s("hello")]),
        None,
        &["message kind", "found a str"],
    );
}

#[test]
fn wrong_field_counts() {
    let too_few = V::A(vec![V::U(1), V::U(1), V::s("client"), V::s("t"), V::s("n")]);
    assert_malformed(
        &too_few,
        Some(kind::HELLO),
        &["HELLO has 4 fields, expected 5"],
    );
    let mut fields = vec![
        V::U(1),
        V::U(1),
        V::s("client"),
        V::s("t"),
        V::s("n"),
        V::U(0),
    ];
    // A sixth field is the optional identity, a string; a seventh is one too many.
    fields.push(V::U(0));
    assert_malformed(
        &V::A(fields.clone()),
        Some(kind::HELLO),
        &["HELLO.identity: expected str"],
    );
    fields[6] = V::s("host:1/0");
    // A seventh is the worker's resources (a map of str to integer), an eighth its labels
    // (str to str), a ninth is one too many.
    fields.push(V::U(0));
    assert_malformed(
        &V::A(fields.clone()),
        Some(kind::HELLO),
        &["HELLO.resources: expected a map"],
    );
    fields[7] = V::M(vec![(V::s("GPU"), V::U(1))]);
    assert_malformed(
        &V::A(fields.clone()),
        Some(kind::HELLO),
        &["HELLO.resources", "not a valid name"],
    );
    fields[7] = V::M(vec![(V::s("gpu"), V::U(2))]);
    fields.push(V::M(vec![(V::s("zone"), V::U(1))]));
    assert_malformed(
        &V::A(fields.clone()),
        Some(kind::HELLO),
        &["HELLO.labels", "zone: expected a str"],
    );
    fields[8] = V::M(vec![(V::s("zone"), V::s("a"))]);
    fields.push(V::s("idle"));
    assert_malformed(
        &V::A(fields.clone()),
        Some(kind::HELLO),
        &["HELLO.features"],
    );
    fields[9] = V::U(1);
    fields.push(V::U(0));
    assert_malformed(
        &V::A(fields),
        Some(kind::HELLO),
        &["10 fields, expected 5 to 9"],
    );
    assert_malformed(
        &V::A(vec![V::U(24), V::Nil]),
        Some(kind::HEARTBEAT),
        &["HEARTBEAT has 1 fields, expected 0"],
    );
    // A nested record with a field missing.
    let record = vec![
        V::U(1),
        V::U(1),
        V::U(0),
        V::B(vec![0; 10]),
        V::U(1),
        V::U(1),
    ];
    let short_result = V::A(vec![V::U(22), V::A(vec![V::A(record)])]);
    assert_malformed(
        &short_result,
        Some(kind::RESULT),
        &["RESULT.results[] has 6 fields, expected 7"],
    );
    let long_return = V::A(vec![V::U(23), V::A(vec![V::A(vec![V::U(1); 3])])]);
    assert_malformed(&long_return, Some(kind::RETURN), &["3 fields, expected 2"]);
}

#[test]
fn wrong_types() {
    let cases = [
        (
            V::A(vec![V::U(20), V::s("8")]),
            kind::PULL,
            "PULL.credits: expected an integer, found a str",
        ),
        (V::A(vec![V::U(20), V::F(8.0)]), kind::PULL, "found a float"),
        (
            hello(V::s("client"), V::B(b"tok".to_vec()), V::s("n")),
            kind::HELLO,
            "HELLO.token: expected str, found a bin",
        ),
        (
            V::A(vec![V::U(13), V::U(1), V::A(vec![V::Bool(true)])]),
            kind::CANCEL,
            "CANCEL.indices[]: expected an integer, found a bool",
        ),
        (
            V::A(vec![V::U(13), V::U(1), V::Nil]),
            kind::CANCEL,
            "CANCEL.indices: expected an array, found nil",
        ),
        (
            submit_with_opts(V::A(vec![])),
            kind::SUBMIT,
            "SUBMIT.opts: expected a map, found an array",
        ),
        (
            V::A(vec![
                V::U(10),
                V::U(9),
                V::B(hash(0).to_vec()),
                V::B(vec![]),
                V::M(vec![]),
                V::A(vec![V::s("task as str")]),
            ]),
            kind::SUBMIT,
            "SUBMIT.tasks[]: expected bin, found a str",
        ),
        (
            V::A(vec![
                V::U(21),
                V::A(vec![V::A(vec![
                    V::U(1),
                    V::U(1),
                    V::B(hash(0).to_vec()),
                    V::s("code"),
                    V::B(vec![]),
                    V::U(0),
                ])]),
            ]),
            kind::ASSIGN,
            "ASSIGN.tasks[].fn_code: expected bin or nil, found a str",
        ),
        (
            V::A(vec![V::U(3), V::s("auth"), V::s("bad"), V::Nil]),
            kind::ERROR,
            "ERROR.ref: expected an integer, found nil",
        ),
    ];
    for (value, k, needle) in cases {
        assert_malformed(&value, Some(k), &[needle]);
    }
}

#[test]
fn negative_and_too_large_for_unsigned() {
    assert_malformed(
        &V::A(vec![V::U(20), V::I(-1)]),
        Some(kind::PULL),
        &["PULL.credits: negative value -1 for u32"],
    );
    assert_malformed(
        &V::A(vec![V::U(11), V::I(i64::MIN), V::U(1)]),
        Some(kind::ACCEPTED),
        &["ACCEPTED.req_id: negative value"],
    );
    assert_malformed(
        &V::A(vec![V::U(20), V::U(1 << 32)]),
        Some(kind::PULL),
        &["4294967296 is out of range for u32"],
    );
    let status_256 = V::A(vec![
        V::U(22),
        V::A(vec![V::A(vec![
            V::U(1),
            V::U(1),
            V::U(256),
            V::B(vec![]),
            V::U(0),
            V::U(0),
            V::U(0),
        ])]),
    ]);
    assert_malformed(
        &status_256,
        Some(kind::RESULT),
        &["RESULT.results[].status: 256 is out of range for u8"],
    );
}

#[test]
fn any_integer_width_that_fits_is_accepted() {
    // PULL credits = 5 as uint8, uint16, uint32, uint64, int8, int16, int32, int64.
    let encodings: [&[u8]; 8] = [
        &[0xcc, 5],
        &[0xcd, 0, 5],
        &[0xce, 0, 0, 0, 5],
        &[0xcf, 0, 0, 0, 0, 0, 0, 0, 5],
        &[0xd0, 5],
        &[0xd1, 0, 5],
        &[0xd2, 0, 0, 0, 5],
        &[0xd3, 0, 0, 0, 0, 0, 0, 0, 5],
    ];
    for credits in encodings {
        let mut body = vec![0x92, 20];
        body.extend_from_slice(credits);
        let mut buf = frame_of(&body);
        assert_eq!(
            decode(&mut buf),
            Ok(Some(Msg::Pull { credits: 5 })),
            "{credits:02x?}"
        );
    }
    // The kind itself in a wide form, and a priority of -3 as int64.
    let mut body = vec![0x96, 0xcf, 0, 0, 0, 0, 0, 0, 0, 10, 0x01];
    body.extend_from_slice(&V::B(hash(0).to_vec()).to_bytes());
    body.extend_from_slice(&[0xc4, 0]);
    body.extend_from_slice(&[0x81, 0xa8]);
    body.extend_from_slice(b"priority");
    body.extend_from_slice(&[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfd]);
    body.push(0x90);
    let mut buf = frame_of(&body);
    assert_eq!(
        decode(&mut buf),
        Ok(Some(Msg::Submit {
            req_id: 1,
            fn_hash: hash(0),
            fn_code: bytes::Bytes::new(),
            opts: PackageOpts {
                priority: -3,
                ..PackageOpts::default()
            },
            tasks: vec![],
        }))
    );
}

#[test]
fn role_must_be_client_or_worker() {
    assert_malformed(
        &hello(V::s("admin"), V::s("t"), V::s("n")),
        Some(kind::HELLO),
        &["HELLO.role", "\"admin\""],
    );
    assert_malformed(
        &hello(V::U(1), V::s("t"), V::s("n")),
        Some(kind::HELLO),
        &["HELLO.role: expected str"],
    );
    let mut buf = frame(&hello(V::s("worker"), V::s("t"), V::s("n")));
    assert!(matches!(
        decode(&mut buf),
        Ok(Some(Msg::Hello {
            role: Role::Worker,
            ..
        }))
    ));
}

#[test]
fn name_and_token_limits() {
    let ok = hello(
        V::s("client"),
        V::S("t".repeat(1024)),
        V::S("n".repeat(256)),
    );
    assert!(matches!(
        decode(&mut frame(&ok)),
        Ok(Some(Msg::Hello { .. }))
    ));
    assert_malformed(
        &hello(V::s("client"), V::s("t"), V::S("n".repeat(257))),
        Some(kind::HELLO),
        &["HELLO.name: 257 bytes is longer than the limit of 256"],
    );
    let mut long_identity = vec![V::U(1), V::U(1), V::s("worker"), V::s("t"), V::s("n")];
    long_identity.extend([V::U(1), V::S("i".repeat(257))]);
    assert_malformed(
        &V::A(long_identity),
        Some(kind::HELLO),
        &["HELLO.identity: 257 bytes is longer than the limit of 256"],
    );
    assert_malformed(
        &hello(V::s("client"), V::S("t".repeat(1025)), V::s("n")),
        Some(kind::HELLO),
        &["HELLO.token: 1025 bytes is longer than the limit of 1024"],
    );
}

#[test]
fn invalid_utf8_in_a_str() {
    // fixstr of 2 bytes that are not UTF-8.
    let token = V::Raw(vec![0xa2, 0xff, 0xfe]);
    assert_malformed(
        &hello(V::s("client"), token, V::s("n")),
        Some(kind::HELLO),
        &["HELLO.token: str is not valid UTF-8"],
    );
}

#[test]
fn fn_hash_must_be_32_bytes() {
    let mut value = submit_with_opts(V::M(vec![]));
    if let V::A(fields) = &mut value {
        fields[2] = V::B(vec![0; 31]);
    }
    assert_malformed(
        &value,
        Some(kind::SUBMIT),
        &["SUBMIT.fn_hash: 31 bytes, expected 32"],
    );
}

#[test]
fn declared_lengths_beyond_the_body_are_rejected() {
    // bin32 announcing 4 GiB in a tiny frame: rejected without slicing or allocating.
    let value = V::A(vec![
        V::U(20 + 2), // RESULT
        V::A(vec![V::A(vec![
            V::U(1),
            V::U(1),
            V::U(0),
            V::Raw(vec![0xc6, 0xff, 0xff, 0xff, 0xff]),
            V::U(0),
            V::U(0),
            V::U(0),
        ])]),
    ]);
    assert_malformed(
        &value,
        Some(kind::RESULT),
        &["RESULT.results[].data: declares 4294967295 bytes"],
    );
    // An array of 65535 tasks with no room for them.
    let value = submit_with_opts(V::M(vec![]));
    let mut body = value.to_bytes();
    let tasks_at = body.len() - 3; // [bin "t"] = 0x91 0xc4 0x01 0x74 -> replace from 0x91
    body.truncate(tasks_at - 1);
    body.extend_from_slice(&[0xdc, 0xff, 0xff, 0xc4, 0x00]);
    let mut buf = frame_of(&body);
    match decode(&mut buf) {
        Err(ProtoError::Malformed { reason, .. }) => assert!(
            reason.contains("SUBMIT.tasks: declares 65535 elements, needing at least 131070"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncated_body_is_malformed() {
    let full = V::A(vec![V::U(11), V::U(1 << 40), V::U(2)]).to_bytes();
    for cut in 1..full.len() {
        let mut buf = frame_of(&full[..cut]);
        match decode(&mut buf) {
            Err(ProtoError::Malformed { .. }) => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
        assert!(buf.is_empty());
    }
}

#[test]
fn unknown_option_is_a_non_fatal_bad_option() {
    let value = submit_with_opts(V::M(vec![(V::s("deadline"), V::U(30))]));
    let mut buf = frame(&value);
    encode(&Msg::Heartbeat, &mut buf);
    let err = decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        ProtoError::BadOption {
            kind: kind::SUBMIT,
            req_id: 9,
            key: "deadline".into(),
            reason: "unknown option (version 1 knows `priority`, `timeout_ms`, `key`, \
                     `deadline_ms`, `on_miss`, `admit`, `replicas`, `quorum`, `max_copies`, \
                     `hedge`, `max_attempts`, `near`, `after`, `after_index`, `resources`, `labels` and \
                     `unschedulable`)"
                .into(),
        }
    );
    assert_eq!(err.code(), "rejected");
    assert!(!err.is_fatal());
    assert_eq!(err.reference(), 9);
    assert_eq!(
        err.to_msg(),
        Msg::Error {
            code: "rejected".into(),
            message: "SUBMIT 9 has a bad option `deadline`: unknown option (version 1 knows \
                      `priority`, `timeout_ms`, `key`, `deadline_ms`, `on_miss`, `admit`, \
                      `replicas`, `quorum`, `max_copies`, `hedge`, `max_attempts`, `near`, `after`, \
                      `after_index`, `resources`, `labels` and `unschedulable`)"
                .into(),
            reference: 9,
        }
    );
    // The frame was consumed: the next one decodes.
    assert_eq!(decode(&mut buf), Ok(Some(Msg::Heartbeat)));
}

#[test]
fn non_int_priority_is_a_bad_option() {
    for (value, needle) in [
        (V::s("high"), "expected an integer, found a str"),
        (V::F(1.5), "expected an integer, found a float"),
        (V::Nil, "expected an integer, found nil"),
        (
            V::U(1 << 31),
            "2147483648 is out of range -2147483648..=2147483647",
        ),
        (
            V::I(-(1 << 31) - 1),
            "-2147483649 is out of range -2147483648..=2147483647",
        ),
        (
            V::A(vec![V::A(vec![V::M(vec![(V::U(1), V::Nil)])])]),
            "found an array",
        ),
    ] {
        let mut buf = frame(&submit_with_opts(V::M(vec![(V::s("priority"), value)])));
        match decode(&mut buf) {
            Err(ProtoError::BadOption {
                kind: kind::SUBMIT,
                req_id: 9,
                key,
                reason,
            }) => {
                assert_eq!(key, "priority");
                assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
            }
            other => panic!("expected BadOption, got {other:?}"),
        }
        assert!(buf.is_empty(), "frame consumed");
    }
}

/// The reason of the `BadOption` that a `SUBMIT` with the single option `key: value` gets.
fn bad_option_reason(key: &str, value: V) -> String {
    let mut buf = frame(&submit_with_opts(V::M(vec![(V::s(key), value)])));
    let reason = match decode(&mut buf) {
        Err(ProtoError::BadOption {
            kind: kind::SUBMIT,
            req_id: 9,
            key: got,
            reason,
        }) => {
            assert_eq!(got, key);
            reason
        }
        other => panic!("{key}: expected BadOption, got {other:?}"),
    };
    assert!(buf.is_empty(), "{key}: frame consumed");
    reason
}

#[test]
fn deadline_options_with_a_wrong_type_or_value_are_bad_options() {
    let cases = [
        ("deadline_ms", V::I(-1), "-1 is out of range 0..=4294967295"),
        ("deadline_ms", V::U(1 << 32), "out of range 0..=4294967295"),
        (
            "deadline_ms",
            V::s("1s"),
            "expected an integer, found a str",
        ),
        (
            "deadline_ms",
            V::F(0.5),
            "expected an integer, found a float",
        ),
        (
            "on_miss",
            V::s("later"),
            "expected \"run\" or \"drop\", found \"later\"",
        ),
        ("on_miss", V::s("Drop"), "found \"Drop\""),
        ("on_miss", V::U(1), "expected a str, found an integer"),
        ("on_miss", V::Nil, "expected a str, found nil"),
        ("admit", V::U(1), "expected a bool, found an integer"),
        ("admit", V::s("true"), "expected a bool, found a str"),
        ("hedge", V::Nil, "expected a bool, found nil"),
        (
            "hedge",
            V::A(vec![V::Bool(true)]),
            "expected a bool, found an array",
        ),
        ("replicas", V::U(256), "256 is out of range 0..=255"),
        ("replicas", V::I(-1), "-1 is out of range 0..=255"),
        ("quorum", V::Bool(true), "expected an integer, found a bool"),
        ("quorum", V::U(1_000), "1000 is out of range 0..=255"),
        ("max_copies", V::s("3"), "expected an integer, found a str"),
        ("max_copies", V::U(300), "300 is out of range 0..=255"),
    ];
    for (key, value, needle) in cases {
        let reason = bad_option_reason(key, value);
        assert!(
            reason.contains(needle),
            "{key}: {reason:?} lacks {needle:?}"
        );
    }
    // A long wrong `on_miss` is quoted cut, as a long unknown key is.
    let reason = bad_option_reason("on_miss", V::S("x".repeat(1_000)));
    assert!(reason.len() < 100, "{reason}");
}

#[test]
fn max_attempts_is_1_to_255_and_defaults_to_the_masters_setting() {
    for (value, needle) in [
        (V::U(0), "0 is out of range 1..=255"),
        (V::U(256), "256 is out of range 1..=255"),
        (V::I(-1), "-1 is out of range 1..=255"),
        (V::s("3"), "expected an integer, found a str"),
    ] {
        let reason = bad_option_reason("max_attempts", value);
        assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
    }
    for (value, expected) in [(V::U(1), 1), (V::Raw(vec![0xcd, 0x00, 0xff]), 255)] {
        let opts = V::M(vec![(V::s("max_attempts"), value)]);
        let mut buf = frame(&submit_with_opts(opts));
        let Ok(Some(Msg::Submit { opts, .. })) = decode(&mut buf) else {
            panic!("SUBMIT did not decode");
        };
        assert_eq!(
            opts,
            PackageOpts {
                max_attempts: expected,
                ..PackageOpts::default()
            }
        );
    }
    // Left out: 0, the master's setting; and 0 is never written.
    let mut buf = frame(&submit_with_opts(V::M(vec![])));
    let Ok(Some(Msg::Submit { opts, .. })) = decode(&mut buf) else {
        panic!("SUBMIT did not decode");
    };
    assert_eq!(opts.max_attempts, 0);
}

#[test]
fn near_is_a_session_id_and_defaults_to_none() {
    for (value, needle) in [
        (V::I(-1), "-1 is out of range 0..="),
        (V::s("7"), "expected an integer, found a str"),
    ] {
        let reason = bad_option_reason("near", value);
        assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
    }
    let big = u64::from(u32::MAX) + 5;
    let mut raw = vec![0xcf];
    raw.extend_from_slice(&big.to_be_bytes());
    for (value, expected) in [(V::U(7), 7), (V::Raw(raw), big)] {
        let opts = V::M(vec![(V::s("near"), value)]);
        let mut buf = frame(&submit_with_opts(opts));
        let Ok(Some(Msg::Submit { opts, .. })) = decode(&mut buf) else {
            panic!("SUBMIT did not decode");
        };
        assert_eq!(opts.near, expected);
        // Written back compactly, last in spec order.
        let mut out = BytesMut::new();
        let code = bytes::Bytes::from_static(b"code");
        encode(
            &Msg::Submit {
                req_id: 9,
                fn_hash: hash(1),
                fn_code: code,
                opts: opts.clone(),
                tasks: vec![bytes::Bytes::from_static(b"t")],
            },
            &mut out,
        );
        let Ok(Some(Msg::Submit { opts: again, .. })) = decode(&mut out) else {
            panic!("SUBMIT did not decode again");
        };
        assert_eq!(again, opts);
    }
}

#[test]
fn deadline_options_decode_in_any_order_and_width() {
    // Keys in reverse spec order, integers in wider formats than needed: accepted.
    let opts = V::M(vec![
        (V::s("hedge"), V::Bool(false)),
        (V::s("max_copies"), V::Raw(vec![0xcd, 0x00, 0x04])), // uint16 4
        (V::s("quorum"), V::Raw(vec![0xd0, 0x02])),           // int8 2
        (V::s("replicas"), V::U(3)),
        (V::s("admit"), V::Bool(true)),
        (V::s("on_miss"), V::s("run")),
        (
            V::s("deadline_ms"),
            V::Raw(vec![0xcf, 0, 0, 0, 0, 0, 0, 0x03, 0xe8]),
        ), // uint64 1000
    ]);
    let mut buf = frame(&submit_with_opts(opts));
    let Ok(Some(Msg::Submit { opts, .. })) = decode(&mut buf) else {
        panic!("SUBMIT did not decode");
    };
    assert_eq!(
        opts,
        PackageOpts {
            deadline_ms: 1_000,
            on_miss: MissPolicy::Run,
            admit: true,
            replicas: 3,
            quorum: 2,
            max_copies: 4,
            hedge: false,
            ..PackageOpts::default()
        }
    );
    // Without the keys, the documented defaults: one replica, a quorum of one.
    let mut buf = frame(&submit_with_opts(V::M(vec![])));
    let Ok(Some(Msg::Submit { opts, .. })) = decode(&mut buf) else {
        panic!("SUBMIT did not decode");
    };
    assert_eq!((opts.replicas, opts.quorum, opts.max_copies), (1, 1, 0));
    assert_eq!(
        (opts.on_miss, opts.admit, opts.hedge),
        (MissPolicy::Run, false, false)
    );
}

#[test]
fn a_duplicate_deadline_option_is_a_bad_option() {
    let opts = V::M(vec![
        (V::s("on_miss"), V::s("drop")),
        (V::s("on_miss"), V::s("run")),
    ]);
    match error_of(&submit_with_opts(opts)) {
        ProtoError::BadOption { key, reason, .. } => {
            assert_eq!(key, "on_miss");
            assert_eq!(reason, "duplicate option");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn version_1_records_without_the_deadline_fields_are_malformed() {
    // A STATUS_REPLY with 7 fields (before met/missed) and a TaskResult with 8 (before late_us).
    let status_reply = V::A(vec![
        V::U(15),
        V::U(1),
        V::U(2),
        V::U(3),
        V::U(0),
        V::U(0),
        V::U(3),
        V::U(0),
    ]);
    assert_malformed(
        &status_reply,
        Some(kind::STATUS_REPLY),
        &["STATUS_REPLY has 7 fields, expected 10"],
    );
    // One without `workers` (after met/missed) is as malformed.
    let mut fields = vec![V::U(15), V::U(1), V::U(2)];
    fields.extend([
        V::U(3),
        V::U(0),
        V::U(0),
        V::U(3),
        V::U(0),
        V::U(0),
        V::U(0),
    ]);
    assert_malformed(
        &V::A(fields),
        Some(kind::STATUS_REPLY),
        &["STATUS_REPLY has 9 fields, expected 10"],
    );
    let mut result = vec![V::U(0), V::U(0), V::B(b"data".to_vec())];
    result.extend([V::U(1), V::U(2), V::U(3), V::U(4), V::U(5)]);
    let results = V::A(vec![V::U(12), V::U(1), V::A(vec![V::A(result)])]);
    assert_malformed(
        &results,
        Some(kind::RESULTS),
        &["RESULTS.results[] has 8 fields, expected 9"],
    );
}

#[test]
fn first_bad_option_is_reported_and_later_keys_still_checked() {
    let opts = V::M(vec![
        (V::s("priority"), V::U(3)),
        (V::s("x"), V::Bool(true)),
        (V::s("priority"), V::U(4)),
    ]);
    match error_of(&submit_with_opts(opts)) {
        ProtoError::BadOption { key, .. } => assert_eq!(key, "x"),
        other => panic!("{other:?}"),
    }
    let duplicate = V::M(vec![
        (V::s("priority"), V::U(3)),
        (V::s("priority"), V::U(4)),
    ]);
    match error_of(&submit_with_opts(duplicate)) {
        ProtoError::BadOption { key, reason, .. } => {
            assert_eq!(key, "priority");
            assert_eq!(reason, "duplicate option");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn long_unknown_key_is_cut_in_the_error() {
    let key = "k".repeat(1000);
    match error_of(&submit_with_opts(V::M(vec![(V::S(key), V::U(1))]))) {
        ProtoError::BadOption { key, .. } => assert_eq!(key.len(), 64),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_option_in_an_otherwise_broken_frame_is_fatal() {
    let opts = V::M(vec![(V::s("deadline"), V::U(30))]);
    // tasks is not an array.
    let mut value = submit_with_opts(opts.clone());
    if let V::A(fields) = &mut value {
        fields[5] = V::U(1);
    }
    assert_malformed(
        &value,
        Some(kind::SUBMIT),
        &["SUBMIT.tasks: expected an array"],
    );
    // Trailing bytes after the array.
    let mut body = submit_with_opts(opts.clone()).to_bytes();
    body.push(0x00);
    let mut buf = frame_of(&body);
    assert!(matches!(
        decode(&mut buf),
        Err(ProtoError::Malformed { reason, .. }) if reason.contains("trailing")
    ));
    // A map key that is not a str.
    assert_malformed(
        &submit_with_opts(V::M(vec![(V::U(1), V::U(1))])),
        Some(kind::SUBMIT),
        &["SUBMIT.opts key: expected str, found an integer"],
    );
    // An unknown option's value that is not even valid msgpack.
    assert_malformed(
        &submit_with_opts(V::M(vec![(V::s("x"), V::Raw(vec![0xc1]))])),
        Some(kind::SUBMIT),
        &["invalid msgpack marker 0xc1"],
    );
}

#[test]
fn option_value_nesting_is_capped() {
    let mut deep = V::Nil;
    for _ in 0..40 {
        deep = V::A(vec![deep]);
    }
    assert_malformed(
        &submit_with_opts(V::M(vec![(V::s("x"), deep)])),
        Some(kind::SUBMIT),
        &["nested deeper than 32 levels"],
    );
    let mut shallow = V::Nil;
    for _ in 0..20 {
        shallow = V::M(vec![(V::s("k"), shallow)]);
    }
    assert!(matches!(
        error_of(&submit_with_opts(V::M(vec![(V::s("x"), shallow)]))),
        ProtoError::BadOption { .. }
    ));
}

#[test]
fn skipped_values_of_every_type() {
    let ext = V::Raw(vec![0xd4, 0x01, 0x02]); // fixext1
    let ext8 = V::Raw(vec![0xc7, 0x02, 0x05, 0xaa, 0xbb]);
    let value = V::M(vec![
        (V::s("a"), V::F(1.0)),
        (V::s("b"), V::B(vec![1; 300])),
        (V::s("c"), ext),
        (V::s("d"), ext8),
        (V::s("e"), V::I(-100_000)),
        (
            V::s("f"),
            V::M(vec![(V::s("g"), V::A(vec![V::Bool(false)]))]),
        ),
    ]);
    match error_of(&submit_with_opts(value)) {
        ProtoError::BadOption { key, .. } => assert_eq!(key, "a"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn error_display_names_message_and_field() {
    let err = error_of(&V::A(vec![V::U(20), V::I(-1)]));
    assert_eq!(
        err.to_string(),
        "malformed PULL message: PULL.credits: negative value -1 for u32"
    );
    let err = error_of(&V::U(1));
    assert_eq!(
        err.to_string(),
        "malformed frame: body is an integer, expected an array"
    );
    let err = ProtoError::FrameTooLarge {
        len: 9000,
        limit: 8192,
    };
    assert_eq!(
        err.to_string(),
        "frame of 9000 bytes is above the limit of 8192 bytes"
    );
    assert_eq!(ProtoError::EmptyFrame.code(), "malformed");
    assert!(ProtoError::EmptyFrame.is_fatal());
    assert_eq!(ProtoError::EmptyFrame.reference(), 0);
}

/// `SERVE` of one `[name, version, interface]` entry.
fn serve_one(name: V, version: V, interface: V) -> V {
    V::A(vec![
        V::U(27),
        V::A(vec![V::A(vec![name, version, interface])]),
    ])
}

/// `CALL 9` with `opts` and one call `[name, version, args, deps, fetch]`.
fn call_one(opts: V, name: V, deps: V, fetch: V) -> V {
    V::A(vec![
        V::U(18),
        V::U(9),
        opts,
        V::A(vec![V::A(vec![
            name,
            V::s(""),
            V::B(b"\x90".to_vec()),
            deps,
            fetch,
        ])]),
    ])
}

#[test]
fn serve_limits_on_name_version_interface_and_count() {
    let ok = |value: &V| {
        let mut buf = frame(value);
        assert!(matches!(decode(&mut buf), Ok(Some(Msg::Serve { .. }))));
    };
    let iface = || V::B(b"\x80".to_vec());
    ok(&serve_one(
        V::s(&"n".repeat(128)),
        V::s(&"1".repeat(64)),
        iface(),
    ));
    ok(&serve_one(V::s("f"), V::s(""), V::B(vec![0; 64 << 10])));
    assert_malformed(
        &serve_one(V::s(""), V::s("1"), iface()),
        Some(kind::SERVE),
        &["SERVE.functions[].name: empty", "1 to 128 bytes"],
    );
    assert_malformed(
        &serve_one(V::s(&"n".repeat(129)), V::s("1"), iface()),
        Some(kind::SERVE),
        &["SERVE.functions[].name: 129 bytes", "limit of 128"],
    );
    assert_malformed(
        &serve_one(V::s("f"), V::s(&"1".repeat(65)), iface()),
        Some(kind::SERVE),
        &["SERVE.functions[].version: 65 bytes", "limit of 64"],
    );
    assert_malformed(
        &serve_one(V::s("f"), V::s("1"), V::B(vec![0; (64 << 10) + 1])),
        Some(kind::SERVE),
        &["SERVE.functions[].interface: 65537 bytes", "limit of 65536"],
    );
    assert_malformed(
        &serve_one(V::s("f"), V::U(1), iface()),
        Some(kind::SERVE),
        &["SERVE.functions[].version: expected str, found an integer"],
    );
    assert_malformed(
        &V::A(vec![
            V::U(27),
            V::A(vec![V::A(vec![V::s("func"), V::s("1")])]),
        ]),
        Some(kind::SERVE),
        &["SERVE.functions[] has 2 fields, expected 3"],
    );
    let entry = || V::A(vec![V::s("f"), V::s(""), V::B(vec![])]);
    ok(&V::A(vec![V::U(27), V::A(vec![entry(); 4096])]));
    assert_malformed(
        &V::A(vec![V::U(27), V::A(vec![entry(); 4097])]),
        Some(kind::SERVE),
        &["4097 functions, more than the limit of 4096"],
    );
}

#[test]
fn call_fields_are_checked() {
    let good = call_one(
        V::M(vec![]),
        V::s("add"),
        V::A(vec![V::U(0)]),
        V::Bool(true),
    );
    let mut buf = frame(&good);
    let Ok(Some(Msg::Call { req_id, calls, .. })) = decode(&mut buf) else {
        panic!("a well-formed CALL");
    };
    assert_eq!(
        (req_id, calls[0].deps.as_slice(), calls[0].fetch),
        (9, &[0][..], true)
    );
    assert_malformed(
        &call_one(V::M(vec![]), V::s("add"), V::A(vec![]), V::U(1)),
        Some(kind::CALL),
        &["CALL.calls[].fetch: expected a bool, found an integer"],
    );
    assert_malformed(
        &call_one(
            V::M(vec![]),
            V::s("add"),
            V::A(vec![V::I(-1)]),
            V::Bool(false),
        ),
        Some(kind::CALL),
        &["CALL.calls[].deps[]: negative value -1 for u32"],
    );
    assert_malformed(
        &call_one(V::M(vec![]), V::s(""), V::A(vec![]), V::Bool(false)),
        Some(kind::CALL),
        &["CALL.calls[].name: empty"],
    );
    assert_malformed(
        &call_one(
            V::M(vec![]),
            V::s(&"x".repeat(129)),
            V::A(vec![]),
            V::Bool(false),
        ),
        Some(kind::CALL),
        &["CALL.calls[].name: 129 bytes"],
    );
    assert_malformed(
        &V::A(vec![V::U(18), V::U(9), V::M(vec![])]),
        Some(kind::CALL),
        &["CALL has 2 fields, expected 3"],
    );
}

#[test]
fn a_bad_call_option_is_a_non_fatal_bad_option_naming_call() {
    let value = call_one(
        V::M(vec![(V::s("replicas"), V::s("two"))]),
        V::s("add"),
        V::A(vec![]),
        V::Bool(false),
    );
    let mut buf = frame(&value);
    encode(&Msg::Heartbeat, &mut buf);
    let err = decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        ProtoError::BadOption {
            kind: kind::CALL,
            req_id: 9,
            key: "replicas".into(),
            reason: "expected an integer, found a str".into(),
        }
    );
    assert!(!err.is_fatal());
    assert_eq!(err.reference(), 9);
    assert_eq!(
        err.to_string(),
        "CALL 9 has a bad option `replicas`: expected an integer, found a str"
    );
    assert_eq!(decode(&mut buf), Ok(Some(Msg::Heartbeat)));
    // A bad option in a frame broken further on is fatal, as for SUBMIT.
    let broken = call_one(
        V::M(vec![(V::s("nope"), V::U(1))]),
        V::s("add"),
        V::A(vec![]),
        V::Nil,
    );
    assert_malformed(&broken, Some(kind::CALL), &["CALL.calls[].fetch"]);
}

#[test]
fn functions_name_may_be_empty_but_not_too_long() {
    let mut buf = frame(&V::A(vec![V::U(19), V::U(4), V::s("")]));
    assert_eq!(
        decode(&mut buf),
        Ok(Some(Msg::Functions {
            req_id: 4,
            name: String::new()
        }))
    );
    assert_malformed(
        &V::A(vec![V::U(19), V::U(4), V::s(&"x".repeat(129))]),
        Some(kind::FUNCTIONS),
        &["FUNCTIONS.name: 129 bytes"],
    );
}

#[test]
fn master_to_peer_rpc_messages_are_checked_too() {
    let call = |inputs: V| {
        V::A(vec![
            V::U(28),
            V::A(vec![V::A(vec![
                V::U(1),
                V::U(1),
                V::s("add"),
                V::s("1"),
                V::B(vec![]),
                inputs,
                V::U(0),
            ])]),
        ])
    };
    let mut buf = frame(&call(V::A(vec![V::B(b"r".to_vec())])));
    assert!(matches!(
        decode(&mut buf),
        Ok(Some(Msg::AssignCalls { .. }))
    ));
    assert_malformed(
        &call(V::A(vec![V::s("r")])),
        Some(kind::ASSIGN_CALLS),
        &["ASSIGN_CALLS.calls[].inputs[]: expected bin, found a str"],
    );
    assert_malformed(
        &V::A(vec![
            V::U(29),
            V::U(3),
            V::A(vec![V::A(vec![
                V::s("f"),
                V::s("1"),
                V::I(-2),
                V::B(vec![]),
            ])]),
        ]),
        Some(kind::FUNCTIONS_REPLY),
        &["FUNCTIONS_REPLY.functions[].servers: negative value -2 for u32"],
    );
}

#[test]
fn kept_keys_must_be_sixteen_bytes() {
    let release = |key: Vec<u8>| {
        V::A(vec![
            V::U(u64::from(kind::RELEASE)),
            V::A(vec![V::A(vec![V::U(7), V::B(key)])]),
        ])
    };
    assert_malformed(
        &release(vec![1; 15]),
        Some(kind::RELEASE),
        &["RELEASE.keys[].key is 15 bytes, expected 16"],
    );
    assert_malformed(
        &release(vec![1; 17]),
        Some(kind::RELEASE),
        &["RELEASE.keys[].key is 17 bytes, expected 16"],
    );
    let drop = V::A(vec![
        V::U(u64::from(kind::DROP)),
        V::A(vec![V::B(vec![1; 16]), V::B(vec![2; 20])]),
    ]);
    assert_malformed(
        &drop,
        Some(kind::DROP),
        &["DROP.keys[] is 20 bytes, expected 16"],
    );
    let no_session = V::A(vec![
        V::U(u64::from(kind::RELEASE)),
        V::A(vec![V::A(vec![V::B(vec![1; 16])])]),
    ]);
    assert_malformed(&no_session, Some(kind::RELEASE), &["RELEASE.keys[]"]);
}
