//! The shared vectors in `tests/vectors/vectors.json`, read by the Rust and the Python tests.
//!
//! `vectors_match` checks every vector against this crate: the frame decodes, re-encodes to the
//! same bytes, and its body, read by a generic msgpack reader, is the vector's `value`.
//! `regenerate_vectors` (ignored; run with `cargo test -p rtpool-proto -- --ignored
//! regenerate_vectors`) rewrites the file from `common::samples()`.

mod common;

use std::path::PathBuf;

use bytes::BytesMut;
use rmp::Marker;
use rtpool_proto::{
    decode_frame, encode_to_vec, MissPolicy, Msg, PackageCounts, PackageOpts, DEFAULT_MAX_FRAME,
};
use serde_json::{json, Value};

fn vectors_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/vectors.json")
}

fn load_vectors() -> Vec<Value> {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("vectors.json is a JSON array")
}

/// Reads one msgpack value from `rd` into the vectors' JSON form, with rmp's decoder only (so it
/// shares no code with the crate under test).
fn msgpack_to_json(rd: &mut &[u8]) -> Value {
    use rmp::decode::*;
    let marker = read_marker(&mut <&[u8]>::clone(rd)).expect("a marker");
    match marker {
        Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
            json!(read_int::<u64, _>(rd).unwrap())
        }
        Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
            json!(read_int::<i64, _>(rd).unwrap())
        }
        Marker::Null => {
            read_nil(rd).unwrap();
            Value::Null
        }
        Marker::True | Marker::False => json!(read_bool(rd).unwrap()),
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
            let len = read_str_len(rd).unwrap() as usize;
            let (text, rest) = rd.split_at(len);
            *rd = rest;
            json!(std::str::from_utf8(text).expect("UTF-8 str"))
        }
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
            let len = read_bin_len(rd).unwrap() as usize;
            let (data, rest) = rd.split_at(len);
            *rd = rest;
            json!({ "bin": hex::encode(data) })
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
        other => panic!("{other:?} is not used by the protocol"),
    }
}

/// The JSON form of a whole frame's body.
fn body_to_json(frame: &[u8]) -> Value {
    let mut rd = &frame[4..];
    let value = msgpack_to_json(&mut rd);
    assert!(rd.is_empty(), "trailing bytes after the body");
    value
}

fn bin(bytes: &[u8]) -> Value {
    json!({ "bin": hex::encode(bytes) })
}

/// The JSON form of `SUBMIT.opts` or `CALL.opts`: the keys whose value is not the default, in
/// spec order.
fn opts_to_json(opts: &PackageOpts) -> Value {
    let mut map = serde_json::Map::new();
    if opts.priority != 0 {
        map.insert("priority".into(), json!(opts.priority));
    }
    if opts.timeout_ms != 0 {
        map.insert("timeout_ms".into(), json!(opts.timeout_ms));
    }
    if !opts.key.is_empty() {
        map.insert("key".into(), json!(opts.key));
    }
    if opts.deadline_ms != 0 {
        map.insert("deadline_ms".into(), json!(opts.deadline_ms));
    }
    if opts.on_miss != MissPolicy::Run {
        map.insert("on_miss".into(), json!(opts.on_miss.as_str()));
    }
    if opts.admit {
        map.insert("admit".into(), json!(true));
    }
    if opts.replicas != 1 {
        map.insert("replicas".into(), json!(opts.replicas));
    }
    if opts.quorum != 1 {
        map.insert("quorum".into(), json!(opts.quorum));
    }
    if opts.max_copies != 0 {
        map.insert("max_copies".into(), json!(opts.max_copies));
    }
    if opts.hedge {
        map.insert("hedge".into(), json!(true));
    }
    if opts.max_attempts != 0 {
        map.insert("max_attempts".into(), json!(opts.max_attempts));
    }
    if opts.near != 0 {
        map.insert("near".into(), json!(opts.near));
    }
    if opts.after != 0 {
        map.insert("after".into(), json!(opts.after));
    }
    if opts.after_index != 0 {
        map.insert("after_index".into(), json!(opts.after_index));
    }
    Value::Object(map)
}

/// The JSON form of a message, written from the spec's field tables rather than from bytes,
/// so that regenerating cross-checks the encoder.
fn msg_to_json(msg: &Msg) -> Value {
    let fields = match msg {
        Msg::Hello {
            version,
            role,
            token,
            name,
            slots,
            identity: None,
            ..
        } => json!([version, role.as_str(), token, name, slots]),
        Msg::Hello {
            version,
            role,
            token,
            name,
            slots,
            identity: Some(identity),
            ..
        } => json!([version, role.as_str(), token, name, slots, identity]),
        Msg::Welcome {
            version,
            session,
            max_frame_bytes,
            heartbeat_ms,
            lease_ms,
            instance,
            ..
        } => json!([
            version,
            session,
            max_frame_bytes,
            heartbeat_ms,
            lease_ms,
            instance
        ]),
        Msg::Error {
            code,
            message,
            reference,
        } => json!([code, message, reference]),
        Msg::Submit {
            req_id,
            fn_hash,
            fn_code,
            opts,
            tasks,
        } => {
            let tasks: Vec<Value> = tasks.iter().map(|t| bin(t)).collect();
            json!([
                req_id,
                bin(fn_hash),
                bin(fn_code),
                opts_to_json(opts),
                tasks
            ])
        }
        Msg::Call {
            req_id,
            opts,
            calls,
        } => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!([c.name, c.version, bin(&c.args), c.deps, c.fetch]))
                .collect();
            json!([req_id, opts_to_json(opts), calls])
        }
        Msg::Functions { req_id, name } => json!([req_id, name]),
        Msg::Serve { functions } => json!([functions
            .iter()
            .map(|f| json!([f.name, f.version, bin(&f.interface)]))
            .collect::<Vec<_>>()]),
        Msg::FunctionsReply { req_id, functions } => json!([
            req_id,
            functions
                .iter()
                .map(|f| json!([f.name, f.version, f.servers, bin(&f.interface)]))
                .collect::<Vec<_>>()
        ]),
        Msg::AssignCalls { calls } => json!([calls
            .iter()
            .map(|c| {
                let inputs: Vec<Value> = c.inputs.iter().map(|i| bin(i)).collect();
                let mut entry = vec![
                    json!(c.task),
                    json!(c.attempt),
                    json!(c.name),
                    json!(c.version),
                    bin(&c.args),
                    Value::Array(inputs),
                    json!(c.timeout_ms),
                ];
                if c.keep || !c.res.is_empty() {
                    entry.push(json!(c.keep));
                }
                if !c.res.is_empty() {
                    let res: serde_json::Map<String, Value> = c
                        .res
                        .iter()
                        .map(|(n, a)| (n.to_owned(), json!(a)))
                        .collect();
                    entry.push(Value::Object(res));
                }
                Value::Array(entry)
            })
            .collect::<Vec<_>>()]),
        Msg::Accepted {
            req_id,
            package,
            notice: Some(notice),
        } => json!([req_id, package, notice]),
        Msg::Accepted {
            req_id,
            package,
            notice: None,
        }
        | Msg::Status { req_id, package }
        | Msg::Attach { req_id, package } => {
            json!([req_id, package])
        }
        Msg::Ack { package, count } => json!([package, count]),
        Msg::Results { package, results } => {
            let results: Vec<Value> = results
                .iter()
                .map(|t| {
                    json!([
                        t.index,
                        t.status,
                        bin(&t.data),
                        t.queue_us,
                        t.worker_us,
                        t.exec_us,
                        t.wait_us,
                        t.flush_us,
                        t.late_us
                    ])
                })
                .collect();
            json!([package, results])
        }
        Msg::Cancel { package, indices } => json!([package, indices]),
        Msg::StatusReply {
            req_id,
            package,
            counts:
                PackageCounts {
                    total,
                    queued,
                    running,
                    done,
                    cancelled,
                    met,
                    missed,
                },
            workers,
        } => {
            json!([req_id, package, total, queued, running, done, cancelled, met, missed, workers])
        }
        Msg::Pull { credits } => json!([credits]),
        Msg::Assign { tasks } => {
            let tasks: Vec<Value> = tasks
                .iter()
                .map(|a| {
                    let code = a.fn_code.as_deref().map_or(Value::Null, bin);
                    let mut entry = vec![
                        json!(a.task),
                        json!(a.attempt),
                        bin(&a.fn_hash),
                        code,
                        bin(&a.args),
                        json!(a.timeout_ms),
                    ];
                    if !a.inputs.is_empty() {
                        entry.push(Value::Array(a.inputs.iter().map(|i| bin(i)).collect()));
                    }
                    Value::Array(entry)
                })
                .collect();
            json!([tasks])
        }
        Msg::Result { results } => {
            let results: Vec<Value> = results
                .iter()
                .map(|t| {
                    json!([
                        t.task,
                        t.attempt,
                        t.status,
                        bin(&t.data),
                        t.exec_us,
                        t.wait_us,
                        t.flush_us
                    ])
                })
                .collect();
            json!([results])
        }
        Msg::Return { tasks } | Msg::Abort { tasks } => json!([tasks
            .iter()
            .map(|(task, attempt)| json!([task, attempt]))
            .collect::<Vec<_>>()]),
        Msg::Heartbeat | Msg::Drain => json!([]),
        Msg::ClusterStatus { req_id } => json!([req_id]),
        Msg::Release { keys } => json!([keys
            .iter()
            .map(|(session, key)| json!([session, bin(key)]))
            .collect::<Vec<_>>()]),
        Msg::Drop { keys } => json!([keys.iter().map(|k| bin(k)).collect::<Vec<_>>()]),
        Msg::ClusterStatusReply { req_id, status } => {
            json!([req_id, msgpack_to_json(&mut &status[..])])
        }
    };
    let mut array = vec![json!(msg.kind())];
    array.extend(
        fields
            .as_array()
            .expect("fields are an array")
            .iter()
            .cloned(),
    );
    Value::Array(array)
}

/// The vectors file as `regenerate_vectors` writes it: one compact vector per line, keys in the
/// order name, hex, value.
fn render_vectors() -> String {
    let lines: Vec<String> = common::samples()
        .iter()
        .map(|(name, msg)| {
            let frame = encode_to_vec(msg);
            let value = msg_to_json(msg);
            assert_eq!(
                body_to_json(&frame),
                value,
                "{name}: encoder and spec disagree"
            );
            format!(
                "  {{\"name\": {}, \"hex\": {}, \"value\": {}}}",
                json!(name),
                json!(hex::encode(&frame)),
                value
            )
        })
        .collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

#[test]
#[ignore = "writes tests/vectors/vectors.json; run on purpose after changing the samples"]
fn regenerate_vectors() {
    std::fs::write(vectors_path(), render_vectors()).expect("write vectors.json");
}

#[test]
fn vectors_match() {
    let vectors = load_vectors();
    assert!(vectors.len() >= 20, "only {} vectors", vectors.len());
    let names: std::collections::HashSet<&str> =
        vectors.iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(names.len(), vectors.len(), "vector names are unique");
    for vector in &vectors {
        let name = vector["name"].as_str().expect("name");
        let frame = hex::decode(vector["hex"].as_str().expect("hex")).expect("valid hex");
        let mut buf = BytesMut::from(&frame[..]);
        let msg = decode_frame(&mut buf, DEFAULT_MAX_FRAME)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: incomplete frame"));
        assert!(buf.is_empty(), "{name}: frame not fully consumed");
        assert_eq!(encode_to_vec(&msg), frame, "{name}: re-encoding differs");
        assert_eq!(
            body_to_json(&frame),
            vector["value"],
            "{name}: value differs"
        );
        assert_eq!(
            msg_to_json(&msg),
            vector["value"],
            "{name}: decoded fields differ"
        );
    }
}

#[test]
fn vectors_file_is_up_to_date() {
    let on_disk = std::fs::read_to_string(vectors_path()).expect("read vectors.json");
    assert!(
        on_disk == render_vectors(),
        "tests/vectors/vectors.json is stale: run `cargo test -p rtpool-proto -- --ignored \
         regenerate_vectors`"
    );
}
