//! Segmented frames (protocol version 2): the msgpack head of a message, then its large
//! payloads as raw segments beside it, so that nobody copies a payload into or out of msgpack.
//!
//! This module is the one place that knows the layout (`docs/protocol.md`, "Segmented
//! frames"): the prefix flag, the segment table, the limits, and the encoder's choice of which
//! `bin` becomes a segment ([`SEGMENT_MIN_BYTES`]). The segment references inside the head are
//! read by `msgpack::Reader::bin` and written by [`Segs::bin`]. Writing the segments to a socket
//! (scatter/gather) is the caller's.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::ProtoError;
use crate::msgpack::{Writer, SEGMENT_EXT_TYPE};

/// Top bit of the 4-byte prefix: set for a segmented frame (the low 31 bits are the head
/// length), clear for a plain frame (the prefix is the body length).
pub const SEGMENTED_FLAG: u32 = 0x8000_0000;

/// Smallest `bin` the encoder sends as a segment; smaller ones stay inline in the head.
pub const SEGMENT_MIN_BYTES: usize = 128 * 1024;

/// Most segments one frame may carry.
pub const MAX_SEGMENTS: usize = 65_535;

/// Where the encoder puts payloads: `None` writes every `bin` inline (a plain frame),
/// `Some` moves each one of at least [`SEGMENT_MIN_BYTES`] into the list (no copy: a
/// [`Bytes`] clone) and writes a reference to it.
pub(super) struct Segs<'a>(pub(super) Option<&'a mut Vec<Bytes>>);

impl Segs<'_> {
    /// Writes `value` inline or as a segment reference.
    pub(super) fn bin(&mut self, w: &mut Writer<'_, BytesMut>, value: &Bytes) {
        match &mut self.0 {
            Some(segs) if value.len() >= SEGMENT_MIN_BYTES => {
                let index = u32::try_from(segs.len()).expect("segment count fits a u32");
                w.0.put_slice(&[0xd6, SEGMENT_EXT_TYPE as u8]);
                w.0.put_u32(index);
                segs.push(value.clone());
            }
            _ => w.bin(value),
        }
    }
}

/// What the front of a buffer says about the frame starting there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// Not enough bytes to tell the frame's size yet.
    Unknown,
    /// A plain frame with a body of this many bytes.
    Plain(usize),
    /// A segmented frame: its head length, segment count and whole size after the prefix.
    Segmented {
        head: usize,
        count: usize,
        total: usize,
    },
}

/// Reads the prefix (and for a segmented frame the segment table) at the front of `buf`.
///
/// # Errors
///
/// [`ProtoError::FrameTooLarge`] when the frame after its prefix exceeds `max_frame`;
/// [`ProtoError::Malformed`] for a segmented frame with 0 or too many segments or an empty
/// head. Nothing is consumed.
pub(super) fn layout(buf: &[u8], max_frame: usize) -> Result<Layout, ProtoError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(Layout::Unknown);
    };
    let prefix = u32::from_be_bytes(prefix.try_into().expect("4 bytes"));
    if prefix & SEGMENTED_FLAG == 0 {
        let len = prefix as usize;
        if len > max_frame {
            return Err(ProtoError::FrameTooLarge {
                len,
                limit: max_frame,
            });
        }
        return Ok(Layout::Plain(len));
    }
    let head = (prefix & !SEGMENTED_FLAG) as usize;
    if head > max_frame {
        return Err(ProtoError::FrameTooLarge {
            len: head,
            limit: max_frame,
        });
    }
    let Some(count) = buf.get(4..8) else {
        return Ok(Layout::Unknown);
    };
    let count = u32::from_be_bytes(count.try_into().expect("4 bytes")) as usize;
    let malformed = |reason: String| ProtoError::Malformed { kind: None, reason };
    if head == 0 {
        return Err(malformed("segmented frame with an empty head".into()));
    }
    if count == 0 || count > MAX_SEGMENTS {
        return Err(malformed(format!(
            "segmented frame with {count} segments (1 to {MAX_SEGMENTS} allowed)"
        )));
    }
    let table_end = 8 + 4 * count;
    if 4 + 4 * count > max_frame {
        return Err(ProtoError::FrameTooLarge {
            len: 4 + 4 * count,
            limit: max_frame,
        });
    }
    let Some(table) = buf.get(8..table_end) else {
        return Ok(Layout::Unknown);
    };
    let segs: usize = table
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")) as usize)
        .sum();
    let total = 4 + 4 * count + head + segs;
    if total > max_frame {
        return Err(ProtoError::FrameTooLarge {
            len: total,
            limit: max_frame,
        });
    }
    Ok(Layout::Segmented { head, count, total })
}

/// Bytes the frame at the front of `buf` takes in all, prefix included, once its prefix (and
/// segment table) arrived; for a caller that sizes its read buffer. `None` when not known yet
/// or not valid (decoding reports why).
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    match layout(buf, usize::MAX) {
        Ok(Layout::Plain(len)) => Some(4 + len),
        Ok(Layout::Segmented { total, .. }) => Some(4 + total),
        _ => None,
    }
}

/// Splits one whole segmented frame (prefix included) into its head and its segments, all
/// zero-copy slices of `frame`.
pub(super) fn split(mut frame: Bytes, head: usize, count: usize) -> (Bytes, Vec<Bytes>) {
    frame.advance(8);
    let table = frame.split_to(4 * count);
    let head = frame.split_to(head);
    let segments = table
        .chunks_exact(4)
        .map(|c| frame.split_to(u32::from_be_bytes(c.try_into().expect("4 bytes")) as usize))
        .collect();
    (head, segments)
}

/// Rewrites the plain frame at `out[start..]` (prefix and body, whose payloads at `segs` were
/// written as references) as the prefix, segment table and head of a segmented frame.
///
/// # Panics
///
/// If the head or a segment is above the 2 GiB and 4 GiB its length fields can hold; callers
/// keep frames under their frame limit, which rules both out.
pub(super) fn to_segmented(out: &mut BytesMut, start: usize, segs: &[Bytes]) {
    let body = out.split_off(start + 4);
    out.truncate(start);
    let head = u32::try_from(body.len())
        .ok()
        .filter(|len| len & SEGMENTED_FLAG == 0)
        .expect("segmented frame head above 2 GiB");
    out.reserve(8 + 4 * segs.len() + body.len());
    out.put_u32(SEGMENTED_FLAG | head);
    out.put_u32(u32::try_from(segs.len()).expect("segment count fits a u32"));
    for seg in segs {
        out.put_u32(u32::try_from(seg.len()).expect("segment above 4 GiB"));
    }
    out.extend_from_slice(&body);
}
