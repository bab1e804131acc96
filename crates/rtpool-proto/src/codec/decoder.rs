//! Frame bodies to messages: [`decode_body`].
//!
//! This module owns the schema of every message as the decoder sees it: field order, types,
//! field counts, the limits on `name`, `token` and `fn_hash`, and the rules for `SUBMIT.opts`.
//! It is on the master's hot path: it reads straight from the frame into the message (no
//! intermediate value tree), compares map keys as bytes, and returns every `bin` field as a
//! zero-copy slice of the frame.

use bytes::Bytes;
use rmp::Marker;

use crate::error::ProtoError;
use crate::message::{
    kind, Assignment, Msg, Role, SubmitOpts, TaskResult, WorkerResult, FN_HASH_BYTES,
    MAX_KEY_BYTES, MAX_NAME_BYTES, MAX_TOKEN_BYTES,
};
use crate::reader::{describe, Int, Reader};

/// Longest option key or role value quoted back in an error, in bytes.
const QUOTE_BYTES: usize = 64;

/// Decodes one frame body (without its length prefix). `bin` fields of the result share
/// `body`'s memory.
///
/// # Errors
///
/// - [`ProtoError::Malformed`]: not msgpack, not an array, trailing bytes after it, a wrong
///   field count, a wrong type, a negative or too-large integer, an over-long `name` or `token`,
///   a `role` other than `"client"`/`"worker"`, a `SUBMIT.fn_hash` that is not 32 bytes.
/// - [`ProtoError::UnknownKind`]: the first element is not a kind of protocol version 1.
/// - [`ProtoError::BadOption`]: a `SUBMIT` with an unknown or wrong-typed option, when all the
///   rest of it is well formed.
pub fn decode_body(body: Bytes) -> Result<Msg, ProtoError> {
    let mut r = Reader::new(body);
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
    if elems - 1 != expected {
        return Err(r.malformed(format!(
            "{name} has {} fields, expected {expected}",
            elems - 1
        )));
    }
    let msg = decode_fields(&mut r, kind)?;
    r.expect_end()?;
    Ok(msg)
}

/// Number of fields after the kind, from the tables in `docs/protocol.md`.
pub(super) fn field_count(k: u8) -> usize {
    match k {
        kind::HELLO | kind::SUBMIT => 5,
        kind::WELCOME => 6,
        kind::ERROR => 3,
        kind::ACCEPTED | kind::RESULTS | kind::CANCEL | kind::STATUS | kind::ATTACH | kind::ACK => {
            2
        }
        kind::STATUS_REPLY => 7,
        kind::PULL | kind::ASSIGN | kind::RESULT | kind::RETURN | kind::ABORT => 1,
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
            total: r.u32("STATUS_REPLY.total")?,
            queued: r.u32("STATUS_REPLY.queued")?,
            running: r.u32("STATUS_REPLY.running")?,
            done: r.u32("STATUS_REPLY.done")?,
            cancelled: r.u32("STATUS_REPLY.cancelled")?,
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
        kind::HEARTBEAT => Msg::Heartbeat,
        _ => Msg::Drain,
    })
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
    let (opts, bad_option) = decode_opts(r)?;
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

/// Reads `SUBMIT.opts`. A bad option does not stop the decoding (the rest of the frame must
/// still be checked); the first one is returned as `(key, reason)` beside the options.
fn decode_opts(r: &mut Reader) -> Result<(SubmitOpts, Option<(String, String)>), ProtoError> {
    let n = r.map_len("SUBMIT.opts")?;
    let mut opts = SubmitOpts::default();
    let mut bad = None;
    let mut seen = [false; 3];
    for _ in 0..n {
        let key = r.str_range("SUBMIT.opts key", usize::MAX)?;
        let slot = match r.bytes_of(key.clone()) {
            b"priority" => Some(0),
            b"timeout_ms" => Some(1),
            b"key" => Some(2),
            _ => None,
        };
        let problem = match slot {
            Some(i) if seen[i] => {
                r.skip("SUBMIT.opts value", 0)?;
                Some("duplicate option".to_owned())
            }
            Some(0) => {
                seen[0] = true;
                match read_int_option(r, "SUBMIT.opts.priority", i32::MIN.into(), i32::MAX.into())?
                {
                    Ok(v) => {
                        opts.priority = v as i32;
                        None
                    }
                    Err(reason) => Some(reason),
                }
            }
            Some(1) => {
                seen[1] = true;
                match read_int_option(r, "SUBMIT.opts.timeout_ms", 0, u32::MAX.into())? {
                    Ok(v) => {
                        opts.timeout_ms = v as u32;
                        None
                    }
                    Err(reason) => Some(reason),
                }
            }
            Some(_) => {
                seen[2] = true;
                if matches!(
                    r.peek_marker(),
                    Some(Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32)
                ) {
                    let range = r.str_range("SUBMIT.opts.key", usize::MAX)?;
                    let value = r.bytes_of(range);
                    if value.len() > MAX_KEY_BYTES {
                        Some(format!(
                            "{} bytes is longer than the limit of {MAX_KEY_BYTES}",
                            value.len()
                        ))
                    } else {
                        opts.key = String::from_utf8_lossy(value).into_owned();
                        None
                    }
                } else {
                    let found = r.peek_marker().map(describe);
                    r.skip("SUBMIT.opts.key", 0)?;
                    Some(format!("expected a str, found {}", found.unwrap_or("?")))
                }
            }
            None => {
                r.skip("SUBMIT.opts value", 0)?;
                Some(
                    "unknown option (version 1 knows `priority`, `timeout_ms` and `key`)"
                        .to_owned(),
                )
            }
        };
        if let (Some(reason), None) = (problem, &bad) {
            bad = Some((quote(r.bytes_of(key)), reason));
        }
    }
    Ok((opts, bad))
}

/// Reads an integer option within `min..=max`: `Ok(Err(reason))` for a wrong type or range
/// (the value is consumed), `Err` when the body itself is broken.
fn read_int_option(
    r: &mut Reader,
    field: &str,
    min: i64,
    max: i64,
) -> Result<Result<i64, String>, ProtoError> {
    let is_int = matches!(
        r.peek_marker(),
        Some(
            Marker::FixPos(_)
                | Marker::FixNeg(_)
                | Marker::U8
                | Marker::U16
                | Marker::U32
                | Marker::U64
                | Marker::I8
                | Marker::I16
                | Marker::I32
                | Marker::I64
        )
    );
    if !is_int {
        let found = r.peek_marker().map(describe);
        r.skip(field, 0)?;
        return Ok(Err(format!(
            "expected an integer, found {}",
            found.unwrap_or("?")
        )));
    }
    let value: i128 = match r.int(field)? {
        Int::Uint(v) => v.into(),
        Int::Neg(v) => v.into(),
    };
    Ok(if value < min.into() || value > max.into() {
        Err(format!("{value} is out of range {min}..={max}"))
    } else {
        Ok(value as i64)
    })
}

fn decode_results(r: &mut Reader) -> Result<Msg, ProtoError> {
    let package = r.u64("RESULTS.package")?;
    // fixarray, 7 one-byte fields and an empty bin: 10 bytes at least.
    let n = r.array_len("RESULTS.results", 10)?;
    let mut results = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("RESULTS.results[]", 8)?;
        results.push(TaskResult {
            index: r.u32("RESULTS.results[].index")?,
            status: r.u8("RESULTS.results[].status")?,
            data: r.bin("RESULTS.results[].data")?,
            queue_us: r.u64("RESULTS.results[].queue_us")?,
            worker_us: r.u64("RESULTS.results[].worker_us")?,
            exec_us: r.u64("RESULTS.results[].exec_us")?,
            wait_us: r.u64("RESULTS.results[].wait_us")?,
            flush_us: r.u64("RESULTS.results[].flush_us")?,
        });
    }
    Ok(Msg::Results { package, results })
}

fn decode_assign(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, task, attempt, two empty bins, a nil and timeout_ms: 9 bytes at least.
    let n = r.array_len("ASSIGN.tasks", 9)?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        r.record("ASSIGN.tasks[]", 6)?;
        tasks.push(Assignment {
            task: r.u64("ASSIGN.tasks[].task")?,
            attempt: r.u32("ASSIGN.tasks[].attempt")?,
            fn_hash: r.bin("ASSIGN.tasks[].fn_hash")?,
            fn_code: r.bin_or_nil("ASSIGN.tasks[].fn_code")?,
            args: r.bin("ASSIGN.tasks[].args")?,
            timeout_ms: r.u32("ASSIGN.tasks[].timeout_ms")?,
        });
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

/// A peer-sent string for an error message: at most [`QUOTE_BYTES`], cut on a char boundary.
pub(super) fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(QUOTE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
