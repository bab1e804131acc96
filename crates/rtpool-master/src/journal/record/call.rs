//! One call of a package of calls, as a `Package` record stores it: a package of calls is
//! journaled under the core's [`rtpool_core::CALLS_HASH`] with no code, one encoded call per
//! task (`[name, version, args, [deps...], fetch]`, msgpack), its version the one the call was
//! resolved to when the master accepted it.

use bytes::Bytes;
use rtpool_core::CallSpec;
use rtpool_proto::msgpack::{Reader, Writer};

use super::reason;

/// The task bytes of one call in a `Package` record.
pub fn encode_call(call: &CallSpec) -> Bytes {
    let mut out = Vec::with_capacity(32 + call.name.len() + call.args.len() + call.deps.len() * 5);
    let w = &mut Writer(&mut out);
    w.array(5);
    w.str(&call.name);
    w.str(&call.version);
    w.bin(&call.args);
    w.array(call.deps.len());
    for &d in &call.deps {
        w.uint(d);
    }
    w.bool(call.fetch);
    Bytes::from(out)
}

/// Decodes what [`encode_call`] wrote.
///
/// # Errors
///
/// The field that is not what `encode_call` writes.
pub fn decode_call(bytes: &Bytes) -> Result<CallSpec, String> {
    let r = &mut Reader::new(bytes.clone());
    let call = (|| {
        r.record("Call", 5)?;
        let name = r.string("Call.name", usize::MAX)?;
        let version = r.string("Call.version", usize::MAX)?;
        let args = r.bin("Call.args")?;
        let n = r.array_len("Call.deps", 1)?;
        let mut deps = Vec::with_capacity(n);
        for _ in 0..n {
            deps.push(r.u32("Call.deps[]")?);
        }
        let fetch = r.bool("Call.fetch")?;
        r.expect_end()?;
        Ok(CallSpec {
            name,
            version,
            args,
            deps,
            fetch,
        })
    })();
    call.map_err(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_round_trips_and_garbage_is_refused_naming_the_field() {
        let call = CallSpec {
            name: "dmmul".into(),
            version: "2".into(),
            args: Bytes::from_static(b"\x93\x01\x02\x03"),
            deps: vec![0, 3],
            fetch: true,
        };
        assert_eq!(decode_call(&encode_call(&call)), Ok(call));
        // The version is an integer where a string belongs.
        let err = decode_call(&Bytes::from_static(b"\x95\xa1x\x07\xc4\x00\x90\xc2"))
            .expect_err("refused");
        assert!(err.contains("Call.version"), "{err}");
    }
}
