//! Frame bodies to messages: [`decode_body`].
//!
//! This module owns the schema of every message as the decoder sees it: field order, types,
//! field counts, the limits on `name`, `token` and `fn_hash`, on the names, versions and
//! interfaces of named functions. The options maps (`SUBMIT.opts`, `CALL.opts`) are read by
//! [`PackageOpts::read_map`], generated from the one list of options in `options.rs`.
//! It is on the master's hot path: it reads straight from the frame into the message (no
//! intermediate value tree), compares map keys as bytes, and returns every `bin` field as a
//! zero-copy slice of the frame.

use bytes::Bytes;
use rmp::Marker;

use crate::counts::PackageCounts;
use crate::error::ProtoError;
use crate::kind;
use crate::limits::{
    FN_HASH_BYTES, KEPT_KEY_BYTES, MAX_FUNCTION_NAME_BYTES, MAX_FUNCTION_VERSION_BYTES,
    MAX_INTERFACE_BYTES, MAX_NAME_BYTES, MAX_RELEASE_KEYS, MAX_SERVE_FUNCTIONS, MAX_TOKEN_BYTES,
};
use crate::message::{
    Assignment, Call, CallAssignment, FunctionInfo, Msg, Role, ServedFunction, TaskResult,
    WorkerResult,
};
use crate::msgpack::{describe, Int, Reader};
use crate::options::{quote, PackageOpts, CALL_OPTS, SUBMIT_OPTS};

/// Decodes one frame body (without its length prefix). `bin` fields of the result share
/// `body`'s memory.
///
/// # Errors
///
/// - [`ProtoError::Malformed`]: not msgpack, not an array, trailing bytes after it, a wrong
///   field count, a wrong type, a negative or too-large integer, an over-long `name`, `token`
///   or `identity`, a `role` other than `"client"`/`"worker"`, a `SUBMIT.fn_hash` that is not
///   32 bytes; a function name that is empty or over 128 bytes, a version over 64 bytes, an
///   interface over 64 KiB, a `SERVE` of more than 4096 functions.
/// - [`ProtoError::UnknownKind`]: the first element is not a kind of protocol version 1.
/// - [`ProtoError::BadOption`]: a `SUBMIT` or `CALL` with an unknown, duplicate or wrong-typed
///   option, an `on_miss` other than `"run"`/`"drop"` or a `key` over 128 bytes, when all the
///   rest of it is well formed.
pub fn decode_body(body: Bytes) -> Result<Msg, ProtoError> {
    decode_reader(Reader::new(body))
}

/// Decodes the head of a segmented frame, whose `bin` fields may reference `segments`.
///
/// # Errors
///
/// As [`decode_body`], and [`ProtoError::Malformed`] for a segment referenced twice, never, or
/// out of range, or an ext of another type where a `bin` belongs.
pub fn decode_segmented(head: Bytes, segments: Vec<Bytes>) -> Result<Msg, ProtoError> {
    let mut r = Reader::with_segments(head, segments);
    let msg = decode_reader_ref(&mut r)?;
    r.expect_segments_used()?;
    Ok(msg)
}

fn decode_reader(mut r: Reader) -> Result<Msg, ProtoError> {
    decode_reader_ref(&mut r)
}

fn decode_reader_ref(r: &mut Reader) -> Result<Msg, ProtoError> {
    let elems = match r.peek_marker() {
        Some(Marker::FixArray(_) | Marker::Array16 | Marker::Array32) => r.array_len("body", 1)?,
        Some(other) => {
            return Err(r.malformed(format!("body is {}, expected an array", describe(other))))
        }
        None => return Err(r.malformed("body is empty".to_owned())),
    };
    if elems == 0 {
        return Err(r.malformed("empty array, expected a message kind first".to_owned()));
    }
    let kind = match r.int("message kind")? {
        Int::Uint(k) => u8::try_from(k)
            .ok()
            .filter(|k| kind::name(*k).is_some())
            .ok_or(ProtoError::UnknownKind { kind: k })?,
        Int::Neg(k) => return Err(r.malformed(format!("negative message kind {k}"))),
    };
    r.set_kind(kind);
    let name = kind::name(kind).unwrap_or("?");
    let expected = field_count(kind);
    // `ACCEPTED` may carry one optional trailing field, its notice, and `HELLO` one, the
    // worker's identity (see `docs/protocol.md`).
    let trailing = matches!(kind, kind::ACCEPTED | kind::HELLO) && elems - 1 == expected + 1;
    if elems - 1 != expected && !trailing {
        return Err(r.malformed(format!(
            "{name} has {} fields, expected {expected}",
            elems - 1
        )));
    }
    let mut msg = decode_fields(r, kind)?;
    match (trailing, &mut msg) {
        (true, Msg::Accepted { notice: n, .. }) => {
            *n = Some(r.string("ACCEPTED.notice", MAX_NOTICE_BYTES)?);
        }
        (true, Msg::Hello { identity: i, .. }) => {
            *i = Some(r.string("HELLO.identity", MAX_NAME_BYTES)?);
        }
        _ => {}
    }
    r.expect_end()?;
    Ok(msg)
}

/// Longest `ACCEPTED.notice`, in UTF-8 bytes.
pub const MAX_NOTICE_BYTES: usize = 4096;

/// Number of fields after the kind, from the tables in `docs/protocol.md` (`ACCEPTED` and
/// `HELLO` may have one more: the notice, the worker's identity).
pub(super) fn field_count(k: u8) -> usize {
    match k {
        kind::HELLO | kind::SUBMIT => 5,
        kind::WELCOME => 6,
        kind::ERROR | kind::CALL => 3,
        kind::ACCEPTED
        | kind::RESULTS
        | kind::CANCEL
        | kind::STATUS
        | kind::ATTACH
        | kind::ACK
        | kind::FUNCTIONS
        | kind::FUNCTIONS_REPLY
        | kind::CLUSTER_STATUS_REPLY => 2,
        kind::STATUS_REPLY => 3 + PackageCounts::LEN,
        kind::PULL
        | kind::ASSIGN
        | kind::RESULT
        | kind::RETURN
        | kind::ABORT
        | kind::SERVE
        | kind::ASSIGN_CALLS
        | kind::CLUSTER_STATUS
        | kind::RELEASE
        | kind::DROP => 1,
        _ => 0, // HEARTBEAT, DRAIN
    }
}

fn decode_fields(r: &mut Reader, k: u8) -> Result<Msg, ProtoError> {
    Ok(match k {
        kind::HELLO => decode_hello(r)?,
        kind::WELCOME => Msg::Welcome {
            version: r.u32("WELCOME.version")?,
            session: r.u64("WELCOME.session")?,
            max_frame_bytes: r.u32("WELCOME.max_frame_bytes")?,
            heartbeat_ms: r.u32("WELCOME.heartbeat_ms")?,
            lease_ms: r.u32("WELCOME.lease_ms")?,
            instance: r.u64("WELCOME.instance")?,
        },
        kind::ERROR => Msg::Error {
            code: r.string("ERROR.code", usize::MAX)?,
            message: r.string("ERROR.message", usize::MAX)?,
            reference: r.u64("ERROR.ref")?,
        },
        kind::SUBMIT => decode_submit(r)?,
        kind::ACCEPTED => Msg::Accepted {
            req_id: r.u64("ACCEPTED.req_id")?,
            package: r.u64("ACCEPTED.package")?,
            notice: None,
        },
        kind::RESULTS => decode_results(r)?,
        kind::CANCEL => {
            let package = r.u64("CANCEL.package")?;
            let n = r.array_len("CANCEL.indices", 1)?;
            let mut indices = Vec::with_capacity(n);
            for _ in 0..n {
                indices.push(r.u32("CANCEL.indices[]")?);
            }
            Msg::Cancel { package, indices }
        }
        kind::STATUS => Msg::Status {
            req_id: r.u64("STATUS.req_id")?,
            package: r.u64("STATUS.package")?,
        },
        kind::STATUS_REPLY => Msg::StatusReply {
            req_id: r.u64("STATUS_REPLY.req_id")?,
            package: r.u64("STATUS_REPLY.package")?,
            counts: PackageCounts::read(r)?,
            workers: r.u32("STATUS_REPLY.workers")?,
        },
        kind::ATTACH => Msg::Attach {
            req_id: r.u64("ATTACH.req_id")?,
            package: r.u64("ATTACH.package")?,
        },
        kind::ACK => Msg::Ack {
            package: r.u64("ACK.package")?,
            count: r.u64("ACK.count")?,
        },
        kind::PULL => Msg::Pull {
            credits: r.u32("PULL.credits")?,
        },
        kind::ASSIGN => decode_assign(r)?,
        kind::RESULT => decode_result(r)?,
        kind::RETURN => Msg::Return {
            tasks: decode_task_refs(r, "RETURN.tasks")?,
        },
        kind::ABORT => Msg::Abort {
            tasks: decode_task_refs(r, "ABORT.tasks")?,
        },
        kind::CALL => decode_call(r)?,
        kind::FUNCTIONS => Msg::Functions {
            req_id: r.u64("FUNCTIONS.req_id")?,
            // Empty asks for every function.
            name: r.string("FUNCTIONS.name", MAX_FUNCTION_NAME_BYTES)?,
        },
        kind::SERVE => decode_serve(r)?,
        kind::ASSIGN_CALLS => decode_assign_calls(r)?,
        kind::FUNCTIONS_REPLY => decode_functions_reply(r)?,
        kind::CLUSTER_STATUS => Msg::ClusterStatus {
            req_id: r.u64("CLUSTER_STATUS.req_id")?,
        },
        kind::CLUSTER_STATUS_REPLY => Msg::ClusterStatusReply {
            req_id: r.u64("CLUSTER_STATUS_REPLY.req_id")?,
            status: r.map_value("CLUSTER_STATUS_REPLY.status")?,
        },
        kind::RELEASE => decode_release(r)?,
        kind::DROP => {
            // A bin of 16 bytes: 17 bytes each.
            let n = r.array_len("DROP.keys", 1 + KEPT_KEY_BYTES)?;
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(kept_key(r, "DROP.keys[]")?);
            }
            Msg::Drop { keys }
        }
        kind::HEARTBEAT => Msg::Heartbeat,
        _ => Msg::Drain,
    })
}

/// `RELEASE`: `[[session: u64, key: bin]]`, at most [`MAX_RELEASE_KEYS`].
fn decode_release(r: &mut Reader) -> Result<Msg, ProtoError> {
    // [session, key]: 1 + 1 + 18 bytes at least each.
    let n = r.array_len("RELEASE.keys", 2 + 1 + KEPT_KEY_BYTES)?;
    if n > MAX_RELEASE_KEYS {
        return Err(r.malformed(format!(
            "RELEASE.keys has {n} entries, at most {MAX_RELEASE_KEYS} allowed"
        )));
    }
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("RELEASE.keys[]", 2)?;
        let session = r.u64("RELEASE.keys[].session")?;
        keys.push((session, kept_key(r, "RELEASE.keys[].key")?));
    }
    Ok(Msg::Release { keys })
}

/// A kept result's key: a `bin` of exactly [`KEPT_KEY_BYTES`].
fn kept_key(r: &mut Reader, field: &str) -> Result<Bytes, ProtoError> {
    let key = r.bin(field)?;
    if key.len() != KEPT_KEY_BYTES {
        return Err(r.malformed(format!(
            "{field} is {} bytes, expected {KEPT_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(key)
}

/// `[[task: u64, attempt: u32]]`, as in `RETURN` and `ABORT`.
fn decode_task_refs(r: &mut Reader, field: &str) -> Result<Vec<(u64, u32)>, ProtoError> {
    // [[task, attempt]]: 3 bytes at least each.
    let n = r.array_len(field, 3)?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        r.record(field, 2)?;
        tasks.push((r.u64(field)?, r.u32(field)?));
    }
    Ok(tasks)
}

fn decode_hello(r: &mut Reader) -> Result<Msg, ProtoError> {
    let version = r.u32("HELLO.version")?;
    let role_range = r.str_range("HELLO.role", usize::MAX)?;
    let role_bytes = r.bytes_of(role_range);
    let Some(role) = Role::from_wire(role_bytes) else {
        let found = quote(role_bytes);
        return Err(r.malformed(format!(
            "HELLO.role: expected \"client\" or \"worker\", found {found:?}"
        )));
    };
    Ok(Msg::Hello {
        version,
        role,
        token: r.string("HELLO.token", MAX_TOKEN_BYTES)?,
        name: r.string("HELLO.name", MAX_NAME_BYTES)?,
        slots: r.u32("HELLO.slots")?,
        identity: None,
    })
}

fn decode_submit(r: &mut Reader) -> Result<Msg, ProtoError> {
    let req_id = r.u64("SUBMIT.req_id")?;
    let fn_hash = r.bin("SUBMIT.fn_hash")?;
    if fn_hash.len() != FN_HASH_BYTES {
        return Err(r.malformed(format!(
            "SUBMIT.fn_hash: {} bytes, expected {FN_HASH_BYTES}",
            fn_hash.len()
        )));
    }
    let fn_code = r.bin("SUBMIT.fn_code")?;
    let (opts, bad_option) = PackageOpts::read_map(r, &SUBMIT_OPTS)?;
    // The smallest task is an empty bin: 2 bytes.
    let n = r.array_len("SUBMIT.tasks", 2)?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        tasks.push(r.bin("SUBMIT.tasks[]")?);
    }
    if let Some((key, reason)) = bad_option {
        // Only a frame that is well formed to its end earns the non-fatal error.
        r.expect_end()?;
        return Err(ProtoError::BadOption {
            kind: kind::SUBMIT,
            req_id,
            key,
            reason,
        });
    }
    Ok(Msg::Submit {
        req_id,
        fn_hash,
        fn_code,
        opts,
        tasks,
    })
}

fn decode_results(r: &mut Reader) -> Result<Msg, ProtoError> {
    let package = r.u64("RESULTS.package")?;
    // fixarray, 8 one-byte fields and an empty bin: 11 bytes at least.
    let n = r.array_len("RESULTS.results", 11)?;
    let mut results = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("RESULTS.results[]", 9)?;
        results.push(TaskResult {
            index: r.u32("RESULTS.results[].index")?,
            status: r.u8("RESULTS.results[].status")?,
            data: r.bin("RESULTS.results[].data")?,
            queue_us: r.u64("RESULTS.results[].queue_us")?,
            worker_us: r.u64("RESULTS.results[].worker_us")?,
            exec_us: r.u64("RESULTS.results[].exec_us")?,
            wait_us: r.u64("RESULTS.results[].wait_us")?,
            flush_us: r.u64("RESULTS.results[].flush_us")?,
            late_us: r.u64("RESULTS.results[].late_us")?,
        });
    }
    Ok(Msg::Results { package, results })
}

fn decode_assign(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, task, attempt, two empty bins, a nil and timeout_ms: 9 bytes at least.
    let n = r.array_len("ASSIGN.tasks", 9)?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        // Six fields, or seven: the inputs of a task whose dependency the master held.
        let fields = r.array_len("ASSIGN.tasks[]", 1)?;
        if fields != 6 && fields != 7 {
            let reason = format!("ASSIGN.tasks[] has {fields} fields, expected 6 or 7");
            return Err(r.malformed(reason));
        }
        let mut a = Assignment {
            task: r.u64("ASSIGN.tasks[].task")?,
            attempt: r.u32("ASSIGN.tasks[].attempt")?,
            fn_hash: r.bin("ASSIGN.tasks[].fn_hash")?,
            fn_code: r.bin_or_nil("ASSIGN.tasks[].fn_code")?,
            args: r.bin("ASSIGN.tasks[].args")?,
            timeout_ms: r.u32("ASSIGN.tasks[].timeout_ms")?,
            inputs: Vec::new(),
        };
        if fields == 7 {
            let m = r.array_len("ASSIGN.tasks[].inputs", 1)?;
            for _ in 0..m {
                a.inputs.push(r.bin("ASSIGN.tasks[].inputs[]")?);
            }
        }
        tasks.push(a);
    }
    Ok(Msg::Assign { tasks })
}

fn decode_result(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, 6 one-byte fields and an empty bin: 9 bytes at least.
    let n = r.array_len("RESULT.results", 9)?;
    let mut results = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("RESULT.results[]", 7)?;
        results.push(WorkerResult {
            task: r.u64("RESULT.results[].task")?,
            attempt: r.u32("RESULT.results[].attempt")?,
            status: r.u8("RESULT.results[].status")?,
            data: r.bin("RESULT.results[].data")?,
            exec_us: r.u64("RESULT.results[].exec_us")?,
            wait_us: r.u64("RESULT.results[].wait_us")?,
            flush_us: r.u64("RESULT.results[].flush_us")?,
        });
    }
    Ok(Msg::Result { results })
}

/// The name of a named function: 1 to [`MAX_FUNCTION_NAME_BYTES`] bytes.
fn function_name(r: &mut Reader, field: &str) -> Result<String, ProtoError> {
    let name = r.string(field, MAX_FUNCTION_NAME_BYTES)?;
    if name.is_empty() {
        return Err(r.malformed(format!(
            "{field}: empty, a function name has 1 to {MAX_FUNCTION_NAME_BYTES} bytes"
        )));
    }
    Ok(name)
}

/// An interface blob: at most [`MAX_INTERFACE_BYTES`].
fn interface(r: &mut Reader, field: &str) -> Result<Bytes, ProtoError> {
    let blob = r.bin(field)?;
    if blob.len() > MAX_INTERFACE_BYTES {
        return Err(r.malformed(format!(
            "{field}: {} bytes is longer than the limit of {MAX_INTERFACE_BYTES}",
            blob.len()
        )));
    }
    Ok(blob)
}

fn decode_serve(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, a one-byte name, an empty version, an empty bin: 6 bytes at least.
    let n = r.array_len("SERVE.functions", 6)?;
    if n > MAX_SERVE_FUNCTIONS {
        return Err(r.malformed(format!(
            "SERVE.functions: {n} functions, more than the limit of {MAX_SERVE_FUNCTIONS}"
        )));
    }
    let mut functions = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("SERVE.functions[]", 3)?;
        functions.push(ServedFunction {
            name: function_name(r, "SERVE.functions[].name")?,
            version: r.string("SERVE.functions[].version", MAX_FUNCTION_VERSION_BYTES)?,
            interface: interface(r, "SERVE.functions[].interface")?,
        });
    }
    Ok(Msg::Serve { functions })
}

fn decode_call(r: &mut Reader) -> Result<Msg, ProtoError> {
    let req_id = r.u64("CALL.req_id")?;
    let (opts, bad_option) = PackageOpts::read_map(r, &CALL_OPTS)?;
    // fixarray, a one-byte name, an empty version, an empty bin, an empty array and a bool:
    // 8 bytes at least.
    let n = r.array_len("CALL.calls", 8)?;
    let mut calls = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("CALL.calls[]", 5)?;
        let name = function_name(r, "CALL.calls[].name")?;
        let version = r.string("CALL.calls[].version", MAX_FUNCTION_VERSION_BYTES)?;
        let args = r.bin("CALL.calls[].args")?;
        let m = r.array_len("CALL.calls[].deps", 1)?;
        let mut deps = Vec::with_capacity(m);
        for _ in 0..m {
            deps.push(r.u32("CALL.calls[].deps[]")?);
        }
        calls.push(Call {
            name,
            version,
            args,
            deps,
            fetch: r.bool("CALL.calls[].fetch")?,
        });
    }
    if let Some((key, reason)) = bad_option {
        // As for SUBMIT: only a frame well formed to its end earns the non-fatal error.
        r.expect_end()?;
        return Err(ProtoError::BadOption {
            kind: kind::CALL,
            req_id,
            key,
            reason,
        });
    }
    Ok(Msg::Call {
        req_id,
        opts,
        calls,
    })
}

fn decode_assign_calls(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, task, attempt, a one-byte name, an empty version, an empty bin, an empty array
    // and timeout_ms: 10 bytes at least.
    let n = r.array_len("ASSIGN_CALLS.calls", 10)?;
    let mut calls = Vec::with_capacity(n);
    for _ in 0..n {
        // Seven fields, or eight: `keep`, sent only when true.
        let fields = r.array_len("ASSIGN_CALLS.calls[]", 1)?;
        if fields != 7 && fields != 8 {
            let reason = format!("ASSIGN_CALLS.calls[] has {fields} fields, expected 7 or 8");
            return Err(r.malformed(reason));
        }
        let task = r.u64("ASSIGN_CALLS.calls[].task")?;
        let attempt = r.u32("ASSIGN_CALLS.calls[].attempt")?;
        let name = function_name(r, "ASSIGN_CALLS.calls[].name")?;
        let version = r.string("ASSIGN_CALLS.calls[].version", MAX_FUNCTION_VERSION_BYTES)?;
        let args = r.bin("ASSIGN_CALLS.calls[].args")?;
        // The smallest input is an empty bin: 2 bytes.
        let m = r.array_len("ASSIGN_CALLS.calls[].inputs", 2)?;
        let mut inputs = Vec::with_capacity(m);
        for _ in 0..m {
            inputs.push(r.bin("ASSIGN_CALLS.calls[].inputs[]")?);
        }
        calls.push(CallAssignment {
            task,
            attempt,
            name,
            version,
            args,
            inputs,
            timeout_ms: r.u32("ASSIGN_CALLS.calls[].timeout_ms")?,
            keep: fields == 8 && r.bool("ASSIGN_CALLS.calls[].keep")?,
        });
    }
    Ok(Msg::AssignCalls { calls })
}

fn decode_functions_reply(r: &mut Reader) -> Result<Msg, ProtoError> {
    let req_id = r.u64("FUNCTIONS_REPLY.req_id")?;
    // fixarray, a one-byte name, an empty version, servers, an empty bin: 7 bytes at least.
    let n = r.array_len("FUNCTIONS_REPLY.functions", 7)?;
    let mut functions = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("FUNCTIONS_REPLY.functions[]", 4)?;
        functions.push(FunctionInfo {
            name: function_name(r, "FUNCTIONS_REPLY.functions[].name")?,
            version: r.string(
                "FUNCTIONS_REPLY.functions[].version",
                MAX_FUNCTION_VERSION_BYTES,
            )?,
            servers: r.u32("FUNCTIONS_REPLY.functions[].servers")?,
            interface: interface(r, "FUNCTIONS_REPLY.functions[].interface")?,
        });
    }
    Ok(Msg::FunctionsReply { req_id, functions })
}
