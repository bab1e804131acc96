//! Length-prefixed msgpack frames: [`decode_frame`], [`decode_body`], [`encode`].
//!
//! This module owns the frame layout (a 4-byte big-endian body length, then one msgpack array);
//! `decoder.rs` and `encoder.rs` own the mapping between each [`Msg`] and its array, field by field,
//! as `docs/protocol.md` lists them. Reading and writing msgpack values is `msgpack/`'s job; reading
//! from and writing to sockets, and deciding which frame limit is in force, are the master's and
//! the SDK's.

mod decoder;
mod encoder;
mod segment;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use self::decoder::{decode_body, decode_segmented};
use self::segment::Layout;
pub use self::segment::{frame_len, MAX_SEGMENTS, SEGMENTED_FLAG, SEGMENT_MIN_BYTES};
use crate::error::ProtoError;
use crate::message::Msg;

/// Bytes of the length prefix.
const PREFIX_BYTES: usize = 4;

/// Takes one frame off the front of `buf` and decodes it.
///
/// Returns `Ok(None)` when `buf` does not hold a whole frame yet; nothing is consumed then, and
/// nothing is reserved either: growing the buffer is the caller's business.
///
/// # Errors
///
/// - [`ProtoError::FrameTooLarge`] as soon as the 4 prefix bytes announce a body longer than
///   `max_frame`, before the body arrived; nothing is consumed.
/// - [`ProtoError::EmptyFrame`] for a prefix of 0; the prefix is consumed.
/// - [`ProtoError::Malformed`], [`ProtoError::UnknownKind`], [`ProtoError::BadOption`] when the
///   body does not decode (see [`decode_body`]). The frame is consumed, so the stream stays in
///   step and the connection can go on after the non-fatal [`ProtoError::BadOption`].
pub fn decode_frame(buf: &mut BytesMut, max_frame: usize) -> Result<Option<Msg>, ProtoError> {
    match segment::layout(buf, max_frame)? {
        Layout::Unknown => Ok(None),
        Layout::Plain(0) => {
            buf.advance(PREFIX_BYTES);
            Err(ProtoError::EmptyFrame)
        }
        Layout::Plain(len) => {
            if buf.len() - PREFIX_BYTES < len {
                return Ok(None);
            }
            let mut frame = buf.split_to(PREFIX_BYTES + len).freeze();
            frame.advance(PREFIX_BYTES);
            decode_body(frame).map(Some)
        }
        Layout::Segmented { head, count, total } => {
            if buf.len() - PREFIX_BYTES < total {
                return Ok(None);
            }
            let frame = buf.split_to(PREFIX_BYTES + total).freeze();
            let (head, segments) = segment::split(frame, head, count);
            decode_segmented(head, segments).map(Some)
        }
    }
}

/// Appends `msg` to `out` as one frame: the 4-byte length prefix, then the msgpack body.
///
/// # Panics
///
/// If a string, byte string or list in `msg` is longer than msgpack's 2^32-1 limit, or the
/// whole body is longer than the 4 GiB a length prefix can announce. Callers keep frames under
/// their frame limit (at most 4 GiB - 1 by the `u32` in `WELCOME`), which rules both out.
pub fn encode(msg: &Msg, out: &mut BytesMut) {
    let start = out.len();
    out.reserve(PREFIX_BYTES + encoder::size_hint(msg));
    out.put_u32(0); // patched below, once the body length is known
    encoder::write_body(msg, out, segment::Segs(None));
    let body_len = out.len() - start - PREFIX_BYTES;
    let prefix = u32::try_from(body_len).expect("frame body above the 4 GiB a prefix can announce");
    out[start..start + PREFIX_BYTES].copy_from_slice(&prefix.to_be_bytes());
}

/// Appends `msg` to `out` as one frame of protocol version 2: a plain frame as [`encode`]
/// writes it when no payload reaches [`SEGMENT_MIN_BYTES`], else the prefix, segment table and
/// head of a segmented frame, whose segments (zero-copy clones of the message's payloads) are
/// appended to `segments`, for the caller to write after `out`, in order.
///
/// # Panics
///
/// As [`encode`].
pub fn encode_segmented(msg: &Msg, out: &mut BytesMut, segments: &mut Vec<Bytes>) {
    let start = out.len();
    let first = segments.len();
    out.reserve(PREFIX_BYTES + encoder::size_hint(msg).min(64 * 1024));
    out.put_u32(0);
    encoder::write_body(msg, out, segment::Segs(Some(segments)));
    if segments.len() == first {
        let body_len = out.len() - start - PREFIX_BYTES;
        let prefix = u32::try_from(body_len)
            .ok()
            .filter(|len| len & SEGMENTED_FLAG == 0)
            .expect("plain frame body above 2 GiB");
        out[start..start + PREFIX_BYTES].copy_from_slice(&prefix.to_be_bytes());
    } else {
        segment::to_segmented(out, start, &segments[first..]);
    }
}

/// [`encode`] into a new vector.
///
/// # Panics
///
/// As [`encode`].
pub fn encode_to_vec(msg: &Msg) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(msg, &mut out);
    Vec::from(out)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::decoder::field_count;
    use super::*;
    use crate::options::quote;
    use crate::PackageOpts;

    fn frame(body: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        buf.put_u32(body.len() as u32);
        buf.extend_from_slice(body);
        buf
    }

    #[test]
    fn accepted_takes_an_optional_notice_and_nothing_more() {
        let with = Msg::Accepted {
            req_id: 3,
            package: 9,
            notice: Some("overloaded".to_owned()),
        };
        let bytes = encode_to_vec(&with);
        // [11, 3, 9, "overloaded"]
        assert_eq!(bytes[4], 0x94);
        let mut buf = BytesMut::from(&bytes[..]);
        assert_eq!(decode_frame(&mut buf, 1 << 20).unwrap(), Some(with));
        let plain = Msg::Accepted {
            req_id: 3,
            package: 9,
            notice: None,
        };
        let bytes = encode_to_vec(&plain);
        assert_eq!(bytes[4], 0x93, "the usual form has no third field");
        let mut buf = BytesMut::from(&bytes[..]);
        assert_eq!(decode_frame(&mut buf, 1 << 20).unwrap(), Some(plain));
        // [11, 3, 9, "x", 1]: one field too many.
        let mut buf = frame(&[0x95, 11, 3, 9, 0xa1, b'x', 1]);
        assert!(decode_frame(&mut buf, 1 << 20).is_err());
        // [11, 3, 9, 5]: a notice that is not a string.
        let mut buf = frame(&[0x94, 11, 3, 9, 5]);
        assert!(decode_frame(&mut buf, 1 << 20).is_err());
    }

    fn submit() -> Msg {
        Msg::Submit {
            req_id: 7,
            fn_hash: Bytes::from(vec![0xab; 32]),
            fn_code: Bytes::from_static(b"code"),
            opts: PackageOpts {
                priority: 5,
                ..PackageOpts::default()
            },
            tasks: vec![Bytes::from_static(b"t0"), Bytes::from_static(b"")],
        }
    }

    #[test]
    fn partial_frame_needs_more_and_consumes_nothing() {
        let bytes = encode_to_vec(&submit());
        let mut buf = BytesMut::new();
        for (i, byte) in bytes.iter().enumerate() {
            buf.put_u8(*byte);
            if i + 1 < bytes.len() {
                assert_eq!(
                    decode_frame(&mut buf, 1 << 20),
                    Ok(None),
                    "after {} bytes",
                    i + 1
                );
                assert_eq!(buf.len(), i + 1, "nothing consumed after {} bytes", i + 1);
            }
        }
        assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(Some(submit())));
        assert!(buf.is_empty());
    }

    #[test]
    fn two_frames_in_one_buffer() {
        let mut buf = BytesMut::new();
        encode(&submit(), &mut buf);
        encode(&Msg::Heartbeat, &mut buf);
        buf.extend_from_slice(&[0, 0]); // start of a third frame
        assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(Some(submit())));
        assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(Some(Msg::Heartbeat)));
        assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(None));
        assert_eq!(&buf[..], &[0, 0]);
    }

    #[test]
    fn too_large_prefix_rejected_before_the_body() {
        let mut buf = BytesMut::new();
        buf.put_u32(8193);
        let err = decode_frame(&mut buf, 8192).unwrap_err();
        assert_eq!(
            err,
            ProtoError::FrameTooLarge {
                len: 8193,
                limit: 8192
            }
        );
        assert_eq!(err.code(), "too_large");
        assert!(err.is_fatal());
        assert_eq!(buf.len(), 4, "nothing consumed");
        assert!(buf.capacity() < 8192, "nothing reserved for the body");
        // Exactly at the limit is fine (and waits for the body).
        let mut buf = BytesMut::new();
        buf.put_u32(8192);
        assert_eq!(decode_frame(&mut buf, 8192), Ok(None));
    }

    #[test]
    fn max_prefix_with_tiny_limit() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            decode_frame(&mut buf, 0),
            Err(ProtoError::FrameTooLarge {
                len: 0x7fff_ffff,
                limit: 0
            })
        ));
    }

    #[test]
    fn zero_length_is_an_empty_frame_and_consumed() {
        let mut buf = frame(&[]);
        encode(&Msg::Drain, &mut buf);
        let err = decode_frame(&mut buf, 100).unwrap_err();
        assert_eq!(err, ProtoError::EmptyFrame);
        assert_eq!(err.code(), "malformed");
        assert_eq!(decode_frame(&mut buf, 100), Ok(Some(Msg::Drain)));
    }

    #[test]
    fn body_error_consumes_the_frame() {
        let mut buf = frame(&[0x91, 0x63]); // [99]
        encode(&Msg::Heartbeat, &mut buf);
        assert_eq!(
            decode_frame(&mut buf, 100),
            Err(ProtoError::UnknownKind { kind: 99 })
        );
        assert_eq!(decode_frame(&mut buf, 100), Ok(Some(Msg::Heartbeat)));
    }

    #[test]
    fn bins_are_slices_of_the_frame() {
        let mut buf = BytesMut::new();
        encode(&submit(), &mut buf);
        let frame_start = buf.as_ptr() as usize;
        let frame_end = frame_start + buf.len();
        let Some(Msg::Submit { fn_hash, tasks, .. }) = decode_frame(&mut buf, 1 << 20).unwrap()
        else {
            panic!("not a SUBMIT");
        };
        for bytes in [&fn_hash, &tasks[0]] {
            let p = bytes.as_ptr() as usize;
            assert!(
                (frame_start..frame_end).contains(&p),
                "bin was copied out of the frame"
            );
        }
    }

    #[test]
    fn prefix_is_big_endian_body_length() {
        let bytes = encode_to_vec(&Msg::Pull { credits: 300 });
        // [20, 300] = 0x92 0x14 0xcd 0x01 0x2c
        assert_eq!(bytes, [0, 0, 0, 5, 0x92, 0x14, 0xcd, 0x01, 0x2c]);
    }

    #[test]
    fn encode_appends_after_existing_bytes() {
        let mut buf = BytesMut::from(&b"xyz"[..]);
        encode(&Msg::Pull { credits: 1 }, &mut buf);
        assert_eq!(&buf[..], &[b'x', b'y', b'z', 0, 0, 0, 3, 0x92, 0x14, 0x01]);
    }

    #[test]
    fn default_opts_are_an_empty_map() {
        let mut msg = submit();
        if let Msg::Submit { opts, .. } = &mut msg {
            *opts = PackageOpts::default();
        }
        let bytes = encode_to_vec(&msg);
        // ... fn_code "code" (c4 04 63 6f 64 65), then opts 0x80, then the tasks array.
        let code_at = bytes.windows(6).position(|w| w == b"\xc4\x04code").unwrap();
        assert_eq!(bytes[code_at + 6], 0x80);
    }

    #[test]
    fn field_counts_match_the_encoder() {
        for msg in [
            Msg::Heartbeat,
            Msg::Drain,
            Msg::Pull { credits: 0 },
            submit(),
            Msg::Serve { functions: vec![] },
            Msg::AssignCalls { calls: vec![] },
            Msg::Call {
                req_id: 1,
                opts: PackageOpts::default(),
                calls: vec![],
            },
            Msg::Functions {
                req_id: 1,
                name: String::new(),
            },
            Msg::FunctionsReply {
                req_id: 1,
                functions: vec![],
            },
        ] {
            let bytes = encode_to_vec(&msg);
            let elems = usize::from(bytes[4] & 0x0f);
            assert_eq!(elems - 1, field_count(msg.kind()), "{}", msg.name());
        }
    }

    fn big_submit(sizes: &[usize]) -> Msg {
        Msg::Submit {
            req_id: 9,
            fn_hash: Bytes::from(vec![1; 32]),
            fn_code: Bytes::from_static(b"code"),
            opts: PackageOpts::default(),
            tasks: sizes
                .iter()
                .enumerate()
                .map(|(i, n)| Bytes::from(vec![i as u8; *n]))
                .collect(),
        }
    }

    /// The segmented frame `encode_segmented` makes, joined as a peer would receive it.
    fn wire(msg: &Msg) -> (BytesMut, usize) {
        let mut head = BytesMut::new();
        let mut segs = Vec::new();
        encode_segmented(msg, &mut head, &mut segs);
        let n = segs.len();
        for seg in segs {
            head.extend_from_slice(&seg);
        }
        (head, n)
    }

    #[test]
    fn small_payloads_stay_a_plain_frame_byte_for_byte() {
        let msg = big_submit(&[1024, SEGMENT_MIN_BYTES - 1]);
        let (bytes, segs) = wire(&msg);
        assert_eq!(segs, 0);
        assert_eq!(&bytes[..], &encode_to_vec(&msg)[..]);
    }

    #[test]
    fn large_payloads_round_trip_as_segments_without_copies() {
        let msg = big_submit(&[10, SEGMENT_MIN_BYTES, 3 << 20]);
        let (mut buf, segs) = wire(&msg);
        assert_eq!(segs, 2);
        assert_ne!(buf[0] & 0x80, 0, "segmented flag set");
        assert_eq!(frame_len(&buf), Some(buf.len()));
        let start = buf.as_ptr() as usize;
        let end = start + buf.len();
        let decoded = decode_frame(&mut buf, 8 << 20).unwrap().unwrap();
        assert_eq!(decoded, msg);
        let Msg::Submit { tasks, .. } = decoded else {
            panic!("not a SUBMIT")
        };
        let p = tasks[2].as_ptr() as usize;
        assert!(
            (start..end).contains(&p),
            "segment was copied out of the frame"
        );
    }

    #[test]
    fn segmented_frame_arrives_byte_by_byte() {
        let msg = big_submit(&[SEGMENT_MIN_BYTES + 3]);
        let (bytes, _) = wire(&msg);
        let mut buf = BytesMut::new();
        for (i, chunk) in bytes.chunks(4093).enumerate() {
            assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(None), "chunk {i}");
            buf.extend_from_slice(chunk);
        }
        assert_eq!(decode_frame(&mut buf, 1 << 20), Ok(Some(msg)));
        assert!(buf.is_empty());
    }

    #[test]
    fn segmented_frame_over_the_limit_is_refused_from_its_table() {
        let msg = big_submit(&[1 << 20]);
        let (bytes, _) = wire(&msg);
        let table_end = 8 + 4; // prefix, count, one length
        let mut buf = BytesMut::from(&bytes[..table_end]);
        let err = decode_frame(&mut buf, 1 << 19).unwrap_err();
        assert!(matches!(err, ProtoError::FrameTooLarge { .. }), "{err}");
    }

    fn segmented(head: &[u8], segs: &[&[u8]]) -> BytesMut {
        let mut buf = BytesMut::new();
        buf.put_u32(SEGMENTED_FLAG | head.len() as u32);
        buf.put_u32(segs.len() as u32);
        for s in segs {
            buf.put_u32(s.len() as u32);
        }
        buf.extend_from_slice(head);
        for s in segs {
            buf.extend_from_slice(s);
        }
        buf
    }

    #[test]
    fn bad_segment_references_are_malformed() {
        // [22, [[1, 1, 0, <ref>, 0, 0, 0]]]: a RESULT whose data is a segment reference.
        let result = |reference: &[u8]| {
            let mut h = vec![0x92, 22, 0x91, 0x97, 1, 1, 0];
            h.extend_from_slice(reference);
            h.extend_from_slice(&[0, 0, 0]);
            h
        };
        let ok = result(&[0xd6, 1, 0, 0, 0, 0]);
        let mut buf = segmented(&ok, &[b"payload"]);
        assert!(decode_frame(&mut buf, 1 << 20).unwrap().is_some());
        for (head, segs, what) in [
            (
                result(&[0xd6, 1, 0, 0, 0, 1]),
                &[&b"x"[..]][..],
                "out of range",
            ),
            (result(&[0xd6, 2, 0, 0, 0, 0]), &[&b"x"[..]][..], "ext type"),
            (ok.clone(), &[&b"x"[..], &b"y"[..]][..], "never referenced"),
        ] {
            let mut buf = segmented(&head, segs);
            let err = decode_frame(&mut buf, 1 << 20).unwrap_err();
            assert_eq!(err.code(), "malformed", "{what}: {err}");
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
        let mut plain = frame(&ok);
        let err = decode_frame(&mut plain, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("the frame has 0"), "{err}");
        let mut none = segmented(&ok, &[]);
        let err = decode_frame(&mut none, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("0 segments"), "{err}");
    }

    #[test]
    fn quote_cuts_on_a_char_boundary() {
        let long = "é".repeat(40); // 80 bytes
        let quoted = quote(long.as_bytes());
        assert_eq!(quoted.len(), 64);
        assert_eq!(quote(b"short"), "short");
    }
}
