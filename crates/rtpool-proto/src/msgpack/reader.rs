//! [`Reader`]: a bounded msgpack cursor over one frame's body (or one journal record).
//!
//! This module owns the low-level reading of msgpack values for the decoder in
//! `codec/decoder.rs` and for the master's journal:
//! markers, integers of any width, `str`, `bin`, array and map headers, and skipping a value
//! nobody asked for. It knows nothing of messages beyond the field name each read is given, so
//! that an error says where it happened.
//!
//! The body comes from a peer and may be hostile. The cursor never panics, never reads past its
//! end, and checks every declared length against the bytes that remain before it slices or lets
//! the caller allocate anything, so a frame can make the decoder allocate only in proportion to
//! its own size.

use std::ops::Range;

use bytes::Bytes;
use rmp::Marker;

use crate::error::ProtoError;

/// Deepest array/map nesting [`Reader::skip`] follows. The messages themselves nest at most three
/// levels; only a value of an unknown option is skipped generically, and it gets this much.
pub const MAX_SKIP_DEPTH: usize = 32;

/// An integer as read from the wire: non-negative values (whatever their msgpack format) as
/// `Uint`, negative ones as `Neg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// A value >= 0.
    Uint(u64),
    /// A value < 0.
    Neg(i64),
}

/// Cursor over a frame body; bin values are returned as zero-copy slices of it.
pub struct Reader {
    buf: Bytes,
    pos: usize,
    /// Message kind reported in errors, once known.
    kind: Option<u8>,
    /// The payload segments of a segmented frame (empty for a plain frame), and whether each
    /// was referenced yet: a `bin` may be a reference to one of them (`docs/protocol.md`).
    segments: Vec<(Bytes, bool)>,
}

/// msgpack ext type of a segment reference (`fixext 4`, a big-endian `u32` segment index).
pub const SEGMENT_EXT_TYPE: i8 = 1;

impl Reader {
    /// A cursor at the start of `body`.
    pub fn new(body: Bytes) -> Reader {
        Reader {
            buf: body,
            pos: 0,
            kind: None,
            segments: Vec::new(),
        }
    }

    /// A cursor at the start of the head of a segmented frame, whose segment references
    /// resolve to `segments`.
    pub fn with_segments(head: Bytes, segments: Vec<Bytes>) -> Reader {
        let mut r = Reader::new(head);
        r.segments = segments.into_iter().map(|s| (s, false)).collect();
        r
    }

    /// Fails unless every segment was referenced (a segmented frame's rule).
    pub fn expect_segments_used(&self) -> Result<(), ProtoError> {
        match self.segments.iter().position(|(_, used)| !used) {
            None => Ok(()),
            Some(i) => Err(self.malformed(format!("segment {i} is never referenced"))),
        }
    }

    /// Records the message kind so that later errors name it.
    pub fn set_kind(&mut self, kind: u8) {
        self.kind = Some(kind);
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A [`ProtoError::Malformed`] for the current message with `reason`.
    pub fn malformed(&self, reason: String) -> ProtoError {
        ProtoError::Malformed {
            kind: self.kind,
            reason,
        }
    }

    /// Fails unless the whole body was read.
    pub fn expect_end(&self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.malformed(format!("{n} trailing bytes after the message"))),
        }
    }

    /// The marker of the next value, without consuming it.
    pub fn peek_marker(&self) -> Option<Marker> {
        self.buf.get(self.pos).map(|b| Marker::from_u8(*b))
    }

    /// Consumes `n` bytes and returns their range in the body.
    fn take(&mut self, n: usize, field: &str) -> Result<Range<usize>, ProtoError> {
        if n > self.remaining() {
            return Err(self.malformed(format!(
                "{field}: body ends {} bytes short",
                n - self.remaining()
            )));
        }
        let start = self.pos;
        self.pos += n;
        Ok(start..self.pos)
    }

    /// The bytes of a range returned by `Reader::take` or [`Reader::str_range`].
    pub fn bytes_of(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    fn marker(&mut self, field: &str) -> Result<Marker, ProtoError> {
        let range = self.take(1, field)?;
        Ok(Marker::from_u8(self.buf[range.start]))
    }

    fn be<const N: usize>(&mut self, field: &str) -> Result<[u8; N], ProtoError> {
        let range = self.take(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[range]);
        Ok(out)
    }

    fn be_u8(&mut self, field: &str) -> Result<u8, ProtoError> {
        Ok(self.be::<1>(field)?[0])
    }

    fn be_u16(&mut self, field: &str) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.be(field)?))
    }

    fn be_u32(&mut self, field: &str) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.be(field)?))
    }

    fn type_error(&self, field: &str, expected: &str, found: Marker) -> ProtoError {
        self.malformed(format!(
            "{field}: expected {expected}, found {}",
            describe(found)
        ))
    }

    /// Reads an integer of any msgpack width.
    pub fn int(&mut self, field: &str) -> Result<Int, ProtoError> {
        let marker = self.marker(field)?;
        let signed = |v: i64| {
            if v < 0 {
                Int::Neg(v)
            } else {
                Int::Uint(v as u64)
            }
        };
        Ok(match marker {
            Marker::FixPos(v) => Int::Uint(v.into()),
            Marker::FixNeg(v) => Int::Neg(v.into()),
            Marker::U8 => Int::Uint(self.be_u8(field)?.into()),
            Marker::U16 => Int::Uint(self.be_u16(field)?.into()),
            Marker::U32 => Int::Uint(self.be_u32(field)?.into()),
            Marker::U64 => Int::Uint(u64::from_be_bytes(self.be(field)?)),
            Marker::I8 => signed(i8::from_be_bytes(self.be(field)?).into()),
            Marker::I16 => signed(i16::from_be_bytes(self.be(field)?).into()),
            Marker::I32 => signed(i32::from_be_bytes(self.be(field)?).into()),
            Marker::I64 => signed(i64::from_be_bytes(self.be(field)?)),
            other => return Err(self.type_error(field, "an integer", other)),
        })
    }

    /// Reads an unsigned integer no larger than `max`; `ty` names the field's type in errors.
    pub fn uint(&mut self, field: &str, max: u64, ty: &str) -> Result<u64, ProtoError> {
        match self.int(field)? {
            Int::Uint(v) if v <= max => Ok(v),
            Int::Uint(v) => Err(self.malformed(format!("{field}: {v} is out of range for {ty}"))),
            Int::Neg(v) => Err(self.malformed(format!("{field}: negative value {v} for {ty}"))),
        }
    }

    /// Reads a `u8` field.
    pub fn u8(&mut self, field: &str) -> Result<u8, ProtoError> {
        // The range check in `uint` makes the cast lossless.
        Ok(self.uint(field, u8::MAX.into(), "u8")? as u8)
    }

    /// Reads a `u32` field.
    pub fn u32(&mut self, field: &str) -> Result<u32, ProtoError> {
        Ok(self.uint(field, u32::MAX.into(), "u32")? as u32)
    }

    /// Reads a `u64` field.
    pub fn u64(&mut self, field: &str) -> Result<u64, ProtoError> {
        self.uint(field, u64::MAX, "u64")
    }

    /// Reads a `bool` field.
    pub fn bool(&mut self, field: &str) -> Result<bool, ProtoError> {
        match self.marker(field)? {
            Marker::True => Ok(true),
            Marker::False => Ok(false),
            other => Err(self.type_error(field, "a bool", other)),
        }
    }

    /// Reads the length that follows a `str` or `bin` marker, checked against the bytes left.
    fn payload_len(&mut self, marker: Marker, field: &str) -> Result<usize, ProtoError> {
        let len = match marker {
            Marker::FixStr(n) => n.into(),
            Marker::Str8 | Marker::Bin8 => self.be_u8(field)?.into(),
            Marker::Str16 | Marker::Bin16 => self.be_u16(field)?.into(),
            Marker::Str32 | Marker::Bin32 => self.be_u32(field)? as usize,
            // Callers pass only str and bin markers; this arm keeps hostile input from panicking
            // even if one day they do not.
            other => return Err(self.type_error(field, "str or bin", other)),
        };
        if len > self.remaining() {
            return Err(self.malformed(format!(
                "{field}: declares {len} bytes, {} remain",
                self.remaining()
            )));
        }
        Ok(len)
    }

    /// Reads a `bin` value as a zero-copy slice of the body.
    pub fn bin(&mut self, field: &str) -> Result<Bytes, ProtoError> {
        match self.marker(field)? {
            m @ (Marker::Bin8 | Marker::Bin16 | Marker::Bin32) => {
                let len = self.payload_len(m, field)?;
                let range = self.take(len, field)?;
                Ok(self.buf.slice(range))
            }
            Marker::FixExt4 => self.segment_ref(field),
            other => Err(self.type_error(field, "bin", other)),
        }
    }

    /// The segment a `fixext 4` reference names (its marker already read).
    fn segment_ref(&mut self, field: &str) -> Result<Bytes, ProtoError> {
        let [ext_type] = self.be::<1>(field)?;
        let index = u32::from_be_bytes(self.be::<4>(field)?) as usize;
        if ext_type as i8 != SEGMENT_EXT_TYPE {
            return Err(self.malformed(format!(
                "{field}: ext type {} where a bin or segment reference (type 1) was expected",
                ext_type as i8
            )));
        }
        let count = self.segments.len();
        let kind = self.kind;
        match self.segments.get_mut(index) {
            Some((_, used)) if *used => Err(ProtoError::Malformed {
                kind,
                reason: format!("{field}: segment {index} is referenced twice"),
            }),
            Some((seg, used)) => {
                *used = true;
                Ok(seg.clone())
            }
            None => Err(ProtoError::Malformed {
                kind,
                reason: format!(
                    "{field}: reference to segment {index} out of range: the frame has {count}"
                ),
            }),
        }
    }

    /// Reads a `bin|nil` value.
    pub fn bin_or_nil(&mut self, field: &str) -> Result<Option<Bytes>, ProtoError> {
        match self.peek_marker() {
            Some(Marker::Null) => {
                self.pos += 1;
                Ok(None)
            }
            Some(Marker::Bin8 | Marker::Bin16 | Marker::Bin32 | Marker::FixExt4) | None => {
                self.bin(field).map(Some)
            }
            Some(other) => Err(self.type_error(field, "bin or nil", other)),
        }
    }

    /// Reads a `str` value no longer than `max_len` bytes and returns its (UTF-8) range.
    pub fn str_range(&mut self, field: &str, max_len: usize) -> Result<Range<usize>, ProtoError> {
        let marker = self.marker(field)?;
        if !matches!(
            marker,
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32
        ) {
            return Err(self.type_error(field, "str", marker));
        }
        let len = self.payload_len(marker, field)?;
        if len > max_len {
            return Err(self.malformed(format!(
                "{field}: {len} bytes is longer than the limit of {max_len}"
            )));
        }
        let range = self.take(len, field)?;
        if std::str::from_utf8(&self.buf[range.clone()]).is_err() {
            return Err(self.malformed(format!("{field}: str is not valid UTF-8")));
        }
        Ok(range)
    }

    /// Reads a `str` value no longer than `max_len` bytes into a `String`.
    pub fn string(&mut self, field: &str, max_len: usize) -> Result<String, ProtoError> {
        let range = self.str_range(field, max_len)?;
        // `str_range` checked the UTF-8 already; the lossy conversion never replaces anything.
        Ok(String::from_utf8_lossy(&self.buf[range]).into_owned())
    }

    /// Reads an array header whose elements each take at least `min_elem_bytes` on the wire,
    /// and fails unless that many bytes remain, so that the caller may allocate `len` elements.
    pub fn array_len(&mut self, field: &str, min_elem_bytes: usize) -> Result<usize, ProtoError> {
        let len = match self.marker(field)? {
            Marker::FixArray(n) => n.into(),
            Marker::Array16 => self.be_u16(field)?.into(),
            Marker::Array32 => self.be_u32(field)? as usize,
            other => return Err(self.type_error(field, "an array", other)),
        };
        self.check_elems(field, len, min_elem_bytes)?;
        Ok(len)
    }

    /// Reads an array header that must announce exactly `fields` elements (a nested record).
    pub fn record(&mut self, field: &str, fields: usize) -> Result<(), ProtoError> {
        let len = self.array_len(field, 1)?;
        if len != fields {
            return Err(self.malformed(format!("{field} has {len} fields, expected {fields}")));
        }
        Ok(())
    }

    /// Reads a map header; each entry takes at least 2 bytes.
    pub fn map_len(&mut self, field: &str) -> Result<usize, ProtoError> {
        let len = match self.marker(field)? {
            Marker::FixMap(n) => n.into(),
            Marker::Map16 => self.be_u16(field)?.into(),
            Marker::Map32 => self.be_u32(field)? as usize,
            other => return Err(self.type_error(field, "a map", other)),
        };
        self.check_elems(field, len, 2)?;
        Ok(len)
    }

    fn check_elems(&self, field: &str, len: usize, min_bytes: usize) -> Result<(), ProtoError> {
        let needed = len.saturating_mul(min_bytes);
        if needed > self.remaining() {
            return Err(self.malformed(format!(
                "{field}: declares {len} elements, needing at least {needed} bytes, {} remain",
                self.remaining()
            )));
        }
        Ok(())
    }

    /// One map (with everything nested in it, to [`MAX_SKIP_DEPTH`] levels) as its encoded
    /// bytes, a zero-copy slice of the body.
    pub fn map_value(&mut self, field: &str) -> Result<Bytes, ProtoError> {
        match self.peek_marker() {
            Some(Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {}
            Some(m) => {
                return Err(
                    self.malformed(format!("{field}: expected a map, found {}", describe(m)))
                )
            }
            None => return Err(self.malformed(format!("{field}: body ends before it"))),
        }
        let start = self.pos;
        self.skip(field, 0)?;
        Ok(self.buf.slice(start..self.pos))
    }

    /// Skips one value of any type, following nested arrays and maps to [`MAX_SKIP_DEPTH`].
    pub fn skip(&mut self, field: &str, depth: usize) -> Result<(), ProtoError> {
        let marker = self.marker(field)?;
        let len = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                0
            }
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                self.pos -= 1;
                self.str_range(field, usize::MAX)?;
                return Ok(());
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => self.payload_len(marker, field)?,
            // Ext: a type byte, then the data.
            Marker::FixExt1 => 2,
            Marker::FixExt2 => 3,
            Marker::FixExt4 => 5,
            Marker::FixExt8 => 9,
            Marker::FixExt16 => 17,
            Marker::Ext8 => 1 + usize::from(self.be_u8(field)?),
            Marker::Ext16 => 1 + usize::from(self.be_u16(field)?),
            Marker::Ext32 => (self.be_u32(field)? as usize).saturating_add(1),
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                self.pos -= 1;
                let n = self.array_len(field, 1)?;
                return self.skip_n(field, n, depth);
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                self.pos -= 1;
                let n = self.map_len(field)?;
                return self.skip_n(field, 2 * n, depth);
            }
            Marker::Reserved => {
                return Err(self.malformed(format!("{field}: invalid msgpack marker 0xc1")))
            }
        };
        self.take(len, field)?;
        Ok(())
    }

    fn skip_n(&mut self, field: &str, n: usize, depth: usize) -> Result<(), ProtoError> {
        if n > 0 && depth >= MAX_SKIP_DEPTH {
            return Err(self.malformed(format!(
                "{field}: nested deeper than {MAX_SKIP_DEPTH} levels"
            )));
        }
        for _ in 0..n {
            self.skip(field, depth + 1)?;
        }
        Ok(())
    }
}

/// What a marker starts, for "expected X, found Y" messages.
pub fn describe(marker: Marker) -> &'static str {
    match marker {
        Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => "an integer",
        Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
            "a signed integer"
        }
        Marker::Null => "nil",
        Marker::True | Marker::False => "a bool",
        Marker::F32 | Marker::F64 => "a float",
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => "a str",
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => "a bin",
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => "an array",
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => "a map",
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => "an ext",
        Marker::Reserved => "the invalid marker 0xc1",
    }
}
