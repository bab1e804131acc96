//! Reading call values from a worker's result payload (`docs/rpc.md`, "Values"): a bounded
//! cursor over msgpack that never reads past its end nor trusts a declared length, so a
//! broken payload is an error, never a panic or a huge allocation.
//!
//! It reads what results and interfaces hold (nil, bool, integers, floats, str, bin, arrays,
//! maps, ext 1 arrays); the frames around them are `rtpool-proto`'s.

use rmp::Marker;

use crate::error::ClientError;
use crate::value::{Dtype, NdArray, Value, EXT_ARRAY};

/// Deepest nesting of lists and maps read.
const MAX_DEPTH: usize = 64;

/// A bounded cursor over one msgpack payload.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

type R<T> = Result<T, String>;

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.buf.len() - self.pos {
            return Err(format!(
                "payload ends {} bytes short",
                n - (self.buf.len() - self.pos)
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> R<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn len(&mut self, bytes: usize) -> R<usize> {
        Ok(match bytes {
            1 => self.be::<1>()?[0] as usize,
            2 => u16::from_be_bytes(self.be()?) as usize,
            _ => u32::from_be_bytes(self.be()?) as usize,
        })
    }

    /// Reads one value.
    pub(crate) fn value(&mut self, depth: usize) -> R<Value> {
        if depth > MAX_DEPTH {
            return Err(format!("values nested deeper than {MAX_DEPTH} levels"));
        }
        let marker = Marker::from_u8(self.be::<1>()?[0]);
        Ok(match marker {
            Marker::Null => Value::Nil,
            Marker::True => Value::Bool(true),
            Marker::False => Value::Bool(false),
            Marker::FixPos(v) => Value::Int(v.into()),
            Marker::FixNeg(v) => Value::Int(v.into()),
            Marker::U8 => Value::Int(self.be::<1>()?[0].into()),
            Marker::U16 => Value::Int(u16::from_be_bytes(self.be()?).into()),
            Marker::U32 => Value::Int(u32::from_be_bytes(self.be()?).into()),
            Marker::U64 => {
                let v = u64::from_be_bytes(self.be()?);
                Value::Int(i64::try_from(v).map_err(|_| format!("integer {v} above i64"))?)
            }
            Marker::I8 => Value::Int(i8::from_be_bytes(self.be()?).into()),
            Marker::I16 => Value::Int(i16::from_be_bytes(self.be()?).into()),
            Marker::I32 => Value::Int(i32::from_be_bytes(self.be()?).into()),
            Marker::I64 => Value::Int(i64::from_be_bytes(self.be()?)),
            Marker::F32 => Value::Float(f32::from_be_bytes(self.be()?).into()),
            Marker::F64 => Value::Float(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => self.string(n as usize)?,
            Marker::Str8 | Marker::Bin8 | Marker::Array16 | Marker::Map16 => {
                self.sized(marker, 0, depth)?
            }
            Marker::Str16 | Marker::Str32 | Marker::Bin16 | Marker::Bin32 => {
                self.sized(marker, 0, depth)?
            }
            Marker::Array32 | Marker::Map32 => self.sized(marker, 0, depth)?,
            Marker::FixArray(n) => self.list(n as usize, depth)?,
            Marker::FixMap(n) => self.map(n as usize, depth)?,
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => self.ext_len(1)?,
            Marker::Ext16 => self.ext_len(2)?,
            Marker::Ext32 => self.ext_len(4)?,
            Marker::Reserved => return Err("reserved msgpack byte 0xc1".into()),
        })
    }

    fn sized(&mut self, marker: Marker, _: usize, depth: usize) -> R<Value> {
        let width = match marker {
            Marker::Str8 | Marker::Bin8 => 1,
            Marker::Str16 | Marker::Bin16 | Marker::Array16 | Marker::Map16 => 2,
            _ => 4,
        };
        let n = self.len(width)?;
        match marker {
            Marker::Str8 | Marker::Str16 | Marker::Str32 => self.string(n),
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                Ok(Value::Bytes(self.take(n)?.to_vec()))
            }
            Marker::Array16 | Marker::Array32 => self.list(n, depth),
            _ => self.map(n, depth),
        }
    }

    fn string(&mut self, n: usize) -> R<Value> {
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes).map_err(|e| format!("a str is not UTF-8: {e}"))?;
        Ok(Value::Str(s.to_owned()))
    }

    fn list(&mut self, n: usize, depth: usize) -> R<Value> {
        // Each element takes at least a byte: a declared count beyond the bytes left is broken.
        if n > self.buf.len() - self.pos {
            return Err(format!(
                "a list of {n} elements in {} bytes",
                self.buf.len() - self.pos
            ));
        }
        (0..n)
            .map(|_| self.value(depth + 1))
            .collect::<R<_>>()
            .map(Value::List)
    }

    fn map(&mut self, n: usize, depth: usize) -> R<Value> {
        if n > (self.buf.len() - self.pos) / 2 {
            return Err(format!(
                "a map of {n} entries in {} bytes",
                self.buf.len() - self.pos
            ));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push((self.value(depth + 1)?, self.value(depth + 1)?));
        }
        Ok(Value::Map(entries))
    }

    fn ext_len(&mut self, width: usize) -> R<Value> {
        let n = self.len(width)?;
        self.ext(n)
    }

    fn ext(&mut self, n: usize) -> R<Value> {
        let code = i8::from_be_bytes(self.be()?);
        let data = self.take(n)?;
        if code != EXT_ARRAY {
            return Err(format!(
                "msgpack ext type {code} in a result (only arrays, ext 1)"
            ));
        }
        array(data).map(Value::Array)
    }

    /// Fails unless the whole payload was read.
    pub(crate) fn end(&self) -> R<()> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(format!("{n} trailing bytes after the value")),
        }
    }
}

/// The array of an ext 1 payload.
fn array(data: &[u8]) -> R<NdArray> {
    let mut c = Cursor::new(data);
    let dlen = c.be::<1>()?[0] as usize;
    let dtype = std::str::from_utf8(c.take(dlen)?).map_err(|_| "dtype is not ASCII")?;
    let ndim = c.be::<1>()?[0] as usize;
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        let d = u64::from_le_bytes(c.be()?);
        shape.push(usize::try_from(d).map_err(|_| format!("dimension {d} too large"))?);
    }
    let rest = c.take(data.len() - c.pos)?.to_vec();
    NdArray::from_raw(Dtype::from_wire(dtype), shape, rest).map_err(|e| e.to_string())
}

/// Decodes a msgpack list of values: a result payload (status 0), or any argument payload
/// [`encode_args`](crate::encode_args) wrote.
///
/// ```
/// use rtpool_client::{decode_values, Value};
/// assert_eq!(decode_values(&[0x92, 0x01, 0xc0]).unwrap(), vec![Value::Int(1), Value::Nil]);
/// ```
///
/// # Errors
///
/// [`ClientError::ConnectionLost`] (a peer sent bytes this client cannot read) when the
/// payload is not one msgpack list of values.
pub fn decode_values(payload: &[u8]) -> Result<Vec<Value>, ClientError> {
    let mut c = Cursor::new(payload);
    let broken = |reason: String| ClientError::ConnectionLost {
        address: "the worker".into(),
        reason: format!("a result payload does not decode: {reason}"),
    };
    match c.value(0).map_err(broken)? {
        Value::List(items) => {
            c.end().map_err(broken)?;
            Ok(items)
        }
        other => Err(broken(format!("expected a list, got {}", other.describe()))),
    }
}

/// The error of a task result with a failing `status` of `function`'s call; `data` is its
/// result data (a UTF-8 message, or the msgpack error map of status 1).
pub(crate) fn error_of_status(function: &str, status: u8, data: &[u8]) -> ClientError {
    use rtpool_proto::status as s;
    let function = function.to_owned();
    let message = String::from_utf8_lossy(data).into_owned();
    match status {
        s::ERROR => decode_error(&function, data),
        s::CANCELLED => ClientError::Cancelled { function },
        s::TIMEOUT => ClientError::TimeLimit { function, message },
        s::LOST => ClientError::WorkerLost { function, message },
        s::MISSED => ClientError::DeadlineMissed { function, message },
        _ => ClientError::Failed { function, message },
    }
}

/// The error of an error payload (status 1): msgpack `{"type", "message", "traceback"}`.
pub fn decode_error(function: &str, payload: &[u8]) -> ClientError {
    let mut fields = [String::new(), String::new(), String::new()];
    if let Ok(Value::Map(entries)) = Cursor::new(payload).value(0) {
        for (k, v) in entries {
            let slot = match k.as_str() {
                Some("type") => 0,
                Some("message") => 1,
                Some("traceback") => 2,
                _ => continue,
            };
            if let Value::Str(s) = v {
                fields[slot] = s;
            }
        }
    } else {
        fields[0] = "an error".into();
        fields[1] = String::from_utf8_lossy(payload).into_owned();
    }
    let [type_name, message, traceback] = fields;
    ClientError::Remote {
        function: function.to_owned(),
        type_name,
        message,
        traceback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_lengths_are_errors_not_allocations() {
        // a list claiming 2^32-1 elements in 5 bytes, a str longer than the payload
        assert!(decode_values(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_values(&[0x91, 0xd9, 0x10, b'a']).is_err());
        assert!(decode_values(&[0x91, 0xc1]).is_err());
    }

    #[test]
    fn statuses_map_to_their_variants() {
        let lost = error_of_status("dmmul", rtpool_proto::status::LOST, b"3 attempts");
        assert_eq!(
            lost,
            ClientError::WorkerLost {
                function: "dmmul".into(),
                message: "3 attempts".into()
            }
        );
        let missed = error_of_status("f", rtpool_proto::status::MISSED, b"late");
        assert!(matches!(missed, ClientError::DeadlineMissed { .. }));
        let failed = error_of_status("f", rtpool_proto::status::FAILED, b"dep");
        assert_eq!(failed.to_string(), "f failed: dep");
    }

    #[test]
    fn an_error_payload_names_type_and_message() {
        let mut buf = Vec::new();
        let mut w = rtpool_proto::msgpack::Writer(&mut buf);
        w.map(3);
        for (k, v) in [
            ("type", "ValueError"),
            ("message", "bad n"),
            ("traceback", "tb"),
        ] {
            w.str(k);
            w.str(v);
        }
        let err = decode_error("dmmul", &buf);
        assert_eq!(err.to_string(), "dmmul raised ValueError: bad n");
    }

    #[test]
    fn values_round_trip_through_the_decoder() {
        let a = NdArray::from_f64(&[1, 2], &[0.5, 2.0]).unwrap();
        let values = vec![
            Value::Int(-5),
            Value::Int(300),
            Value::Float(1.5),
            Value::Str("s".into()),
            Value::Bytes(vec![1, 2]),
            Value::Bool(true),
            Value::Nil,
            Value::Array(a),
            Value::List(vec![Value::Int(1)]),
        ];
        let bytes = crate::value::encode_args(&values, &[]);
        assert_eq!(decode_values(&bytes).unwrap(), values);
    }
}
