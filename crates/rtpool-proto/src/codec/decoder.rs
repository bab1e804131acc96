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
    MAX_INTERFACE_BYTES, MAX_RELEASE_KEYS, MAX_SERVE_FUNCTIONS,
};
use crate::message::{
    Call, CallAssignment, FunctionInfo, Msg, ServedFunction, TaskResult, WorkerResult,
};
use crate::msgpack::{describe, Int, Reader};
use crate::options::{PackageOpts, Resources, CALL_OPTS, SUBMIT_OPTS};

/// A struct read field by field in wire order, each error naming its field
/// (`read_struct!(r, "WELCOME", Msg::Welcome { version: u32 })` reads `r.u32("WELCOME.version")`);
/// `name: string(MAX)` passes `MAX` after the field's name; fields after `;` are not on the wire.
macro_rules! read_struct {
    ($r:ident, $prefix:literal, $($ty:ident)::+ {
        $($field:ident: $read:ident $(($($arg:expr),*))?),* $(; $($rest:tt)*)?
    }) => {
        $($ty)::+ {
            $( $field: $r.$read(concat!($prefix, ".", stringify!($field)) $($(, $arg)*)?)?, )*
            $($($rest)*)?
        }
    };
}

/// An array at `field` whose items take at least `min_item_bytes` each, read by `item`.
#[inline]
fn list<T>(
    r: &mut Reader,
    field: &str,
    min_item_bytes: usize,
    mut item: impl FnMut(&mut Reader) -> Result<T, ProtoError>,
) -> Result<Vec<T>, ProtoError> {
    let n = r.array_len(field, min_item_bytes)?;
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        items.push(item(r)?);
    }
    Ok(items)
}

mod worker;

use self::worker::{decode_assign, decode_hello, read_hello_trailing};

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
    // `ACCEPTED` may carry one optional trailing field, its notice, `WELCOME` one, the idle
    // heartbeat, and `HELLO` up to four, a worker's identity, resources, labels and features
    // (see `docs/protocol.md`).
    let most = match kind {
        kind::ACCEPTED | kind::WELCOME => 1,
        kind::HELLO => 4,
        _ => 0,
    };
    let extra = (elems - 1).checked_sub(expected).filter(|e| *e <= most);
    let Some(extra) = extra else {
        let expected = match most {
            0 => expected.to_string(),
            _ => format!("{expected} to {}", expected + most),
        };
        return Err(r.malformed(format!(
            "{name} has {} fields, expected {expected}",
            elems - 1
        )));
    };
    let mut msg = decode_fields(r, kind)?;
    match (extra, &mut msg) {
        (0, _) => {}
        (_, Msg::Accepted { notice: n, .. }) => {
            *n = Some(r.string("ACCEPTED.notice", MAX_NOTICE_BYTES)?);
        }
        (_, hello @ Msg::Hello { .. }) => read_hello_trailing(r, hello, extra)?,
        (
            _,
            Msg::Welcome {
                idle_heartbeat_ms: idle,
                ..
            },
        ) => {
            *idle = r.u32("WELCOME.idle_heartbeat_ms")?;
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
        kind::WELCOME => read_struct!(
            r,
            "WELCOME",
            Msg::Welcome {
                version: u32,
                session: u64,
                max_frame_bytes: u32,
                heartbeat_ms: u32,
                lease_ms: u32,
                instance: u64;
                idle_heartbeat_ms: 0
            }
        ),
        kind::ERROR => Msg::Error {
            code: r.string("ERROR.code", usize::MAX)?,
            message: r.string("ERROR.message", usize::MAX)?,
            reference: r.u64("ERROR.ref")?,
        },
        kind::SUBMIT => decode_submit(r)?,
        kind::ACCEPTED => read_struct!(r, "ACCEPTED", Msg::Accepted {
            req_id: u64, package: u64; notice: None
        }),
        kind::RESULTS => decode_results(r)?,
        kind::CANCEL => Msg::Cancel {
            package: r.u64("CANCEL.package")?,
            indices: list(r, "CANCEL.indices", 1, |r| r.u32("CANCEL.indices[]"))?,
        },
        kind::STATUS => read_struct!(
            r,
            "STATUS",
            Msg::Status {
                req_id: u64,
                package: u64
            }
        ),
        kind::STATUS_REPLY => Msg::StatusReply {
            req_id: r.u64("STATUS_REPLY.req_id")?,
            package: r.u64("STATUS_REPLY.package")?,
            counts: PackageCounts::read(r)?,
            workers: r.u32("STATUS_REPLY.workers")?,
        },
        kind::ATTACH => read_struct!(
            r,
            "ATTACH",
            Msg::Attach {
                req_id: u64,
                package: u64
            }
        ),
        kind::ACK => read_struct!(
            r,
            "ACK",
            Msg::Ack {
                package: u64,
                count: u64
            }
        ),
        kind::PULL => read_struct!(r, "PULL", Msg::Pull { credits: u32 }),
        kind::ASSIGN => decode_assign(r)?,
        kind::RESULT => decode_result(r)?,
        kind::RETURN => Msg::Return {
            tasks: decode_task_refs(r, "RETURN.tasks")?,
        },
        kind::ABORT => Msg::Abort {
            tasks: decode_task_refs(r, "ABORT.tasks")?,
        },
        kind::CALL => decode_call(r)?,
        // An empty name asks for every function.
        kind::FUNCTIONS => read_struct!(
            r,
            "FUNCTIONS",
            Msg::Functions {
                req_id: u64,
                name: string(MAX_FUNCTION_NAME_BYTES)
            }
        ),
        kind::SERVE => decode_serve(r)?,
        kind::ASSIGN_CALLS => decode_assign_calls(r)?,
        kind::FUNCTIONS_REPLY => decode_functions_reply(r)?,
        kind::CLUSTER_STATUS => {
            read_struct!(r, "CLUSTER_STATUS", Msg::ClusterStatus { req_id: u64 })
        }
        kind::CLUSTER_STATUS_REPLY => read_struct!(
            r,
            "CLUSTER_STATUS_REPLY",
            Msg::ClusterStatusReply {
                req_id: u64,
                status: map_value
            }
        ),
        kind::RELEASE => decode_release(r)?,
        kind::DROP => Msg::Drop {
            // A bin of 16 bytes: 17 bytes each.
            keys: list(r, "DROP.keys", 1 + KEPT_KEY_BYTES, |r| {
                r.kept_key("DROP.keys[]")
            })?,
        },
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
        keys.push((session, r.kept_key("RELEASE.keys[].key")?));
    }
    Ok(Msg::Release { keys })
}

/// The checked fields the messages share, read as [`Reader`] reads its types (so that
/// [`read_struct!`] can name them).
trait ReadChecked {
    /// A kept result's key: a `bin` of exactly [`KEPT_KEY_BYTES`].
    fn kept_key(&mut self, field: &str) -> Result<Bytes, ProtoError>;
    /// The name of a named function: 1 to [`MAX_FUNCTION_NAME_BYTES`] bytes.
    fn function_name(&mut self, field: &str) -> Result<String, ProtoError>;
    /// An interface blob: at most [`MAX_INTERFACE_BYTES`].
    fn interface(&mut self, field: &str) -> Result<Bytes, ProtoError>;
    /// An array of `u32` at `field`, each named `item` in errors.
    fn u32_list(&mut self, field: &str, item: &str) -> Result<Vec<u32>, ProtoError>;
    /// An array of `bin` at `field`, each named `item` in errors.
    fn bin_list(&mut self, field: &str, item: &str) -> Result<Vec<Bytes>, ProtoError>;
}

impl ReadChecked for Reader {
    fn kept_key(&mut self, field: &str) -> Result<Bytes, ProtoError> {
        kept_key(self, field)
    }
    fn function_name(&mut self, field: &str) -> Result<String, ProtoError> {
        function_name(self, field)
    }
    fn interface(&mut self, field: &str) -> Result<Bytes, ProtoError> {
        interface(self, field)
    }
    fn u32_list(&mut self, field: &str, item: &str) -> Result<Vec<u32>, ProtoError> {
        list(self, field, 1, |r| r.u32(item))
    }
    fn bin_list(&mut self, field: &str, item: &str) -> Result<Vec<Bytes>, ProtoError> {
        // The smallest bin is an empty one: 2 bytes.
        list(self, field, 2, |r| r.bin(item))
    }
}

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
    list(r, field, 3, |r| {
        r.record(field, 2)?;
        Ok((r.u64(field)?, r.u32(field)?))
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
    let tasks = list(r, "SUBMIT.tasks", 2, |r| r.bin("SUBMIT.tasks[]"))?;
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
    let results = list(r, "RESULTS.results", 11, |r| {
        r.record("RESULTS.results[]", 9)?;
        Ok(read_struct!(
            r,
            "RESULTS.results[]",
            TaskResult {
                index: u32,
                status: u8,
                data: bin,
                queue_us: u64,
                worker_us: u64,
                exec_us: u64,
                wait_us: u64,
                flush_us: u64,
                late_us: u64
            }
        ))
    })?;
    Ok(Msg::Results { package, results })
}

fn decode_result(r: &mut Reader) -> Result<Msg, ProtoError> {
    // fixarray, 6 one-byte fields and an empty bin: 9 bytes at least.
    let results = list(r, "RESULT.results", 9, |r| {
        r.record("RESULT.results[]", 7)?;
        Ok(read_struct!(
            r,
            "RESULT.results[]",
            WorkerResult {
                task: u64,
                attempt: u32,
                status: u8,
                data: bin,
                exec_us: u64,
                wait_us: u64,
                flush_us: u64
            }
        ))
    })?;
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
        functions.push(read_struct!(
            r,
            "SERVE.functions[]",
            ServedFunction {
                name: function_name,
                version: string(MAX_FUNCTION_VERSION_BYTES),
                interface: interface
            }
        ));
    }
    Ok(Msg::Serve { functions })
}

fn decode_call(r: &mut Reader) -> Result<Msg, ProtoError> {
    let req_id = r.u64("CALL.req_id")?;
    let (opts, bad_option) = PackageOpts::read_map(r, &CALL_OPTS)?;
    // fixarray, a one-byte name, an empty version, an empty bin, an empty array and a bool:
    // 8 bytes at least.
    let calls = list(r, "CALL.calls", 8, |r| {
        r.record("CALL.calls[]", 5)?;
        Ok(read_struct!(
            r,
            "CALL.calls[]",
            Call {
                name: function_name,
                version: string(MAX_FUNCTION_VERSION_BYTES),
                args: bin,
                deps: u32_list("CALL.calls[].deps[]"),
                fetch: bool
            }
        ))
    })?;
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
    let calls = list(r, "ASSIGN_CALLS.calls", 10, |r| {
        // Seven fields, eight (`keep`, sent when true or when `res` follows) or nine (the
        // resources the call holds).
        let fields = r.array_len("ASSIGN_CALLS.calls[]", 1)?;
        if !(7..=9).contains(&fields) {
            let reason = format!("ASSIGN_CALLS.calls[] has {fields} fields, expected 7 to 9");
            return Err(r.malformed(reason));
        }
        let mut c = read_struct!(r, "ASSIGN_CALLS.calls[]", CallAssignment {
            task: u64, attempt: u32, name: function_name,
            version: string(MAX_FUNCTION_VERSION_BYTES), args: bin,
            inputs: bin_list("ASSIGN_CALLS.calls[].inputs[]"),
            timeout_ms: u32; keep: fields >= 8 && r.bool("ASSIGN_CALLS.calls[].keep")?,
            res: Resources::default()
        });
        if fields == 9 {
            c.res = Resources::read(r, "ASSIGN_CALLS.calls[].res")?
                .map_err(|reason| r.malformed(format!("ASSIGN_CALLS.calls[].res: {reason}")))?;
        }
        Ok(c)
    })?;
    Ok(Msg::AssignCalls { calls })
}

fn decode_functions_reply(r: &mut Reader) -> Result<Msg, ProtoError> {
    let req_id = r.u64("FUNCTIONS_REPLY.req_id")?;
    // fixarray, a one-byte name, an empty version, servers, an empty bin: 7 bytes at least.
    let functions = list(r, "FUNCTIONS_REPLY.functions", 7, |r| {
        r.record("FUNCTIONS_REPLY.functions[]", 4)?;
        Ok(read_struct!(
            r,
            "FUNCTIONS_REPLY.functions[]",
            FunctionInfo {
                name: function_name,
                version: string(MAX_FUNCTION_VERSION_BYTES),
                servers: u32,
                interface: interface
            }
        ))
    })?;
    Ok(Msg::FunctionsReply { req_id, functions })
}
