//! The on-disk frame around each payload: `[magic][len][crc32c][lsn][payload]`, little-endian.
//!
//! This module owns writing a frame, checking one at an offset, and the forward scan that tells
//! a torn tail from corruption. It knows nothing of what payloads mean.

/// The four bytes every frame starts with: `RTJ1` on disk.
pub(crate) const MAGIC: [u8; 4] = *b"RTJ1";

/// Bytes before the payload: magic (4), payload length (4), CRC (4), LSN (8).
pub(crate) const HEADER_BYTES: usize = 20;

/// Largest payload a frame may declare. Anything above is an "impossible length": no package
/// or result the master accepts comes near it, so such a length is a torn or corrupt header.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 1 << 30;

/// Appends a frame for `lsn` to `out`, its payload written in place by `payload`, and returns
/// the frame's length.
///
/// # Errors
///
/// The payload's length when it is above [`MAX_PAYLOAD_BYTES`]; `out` is then left as it was.
pub(crate) fn put_with(
    out: &mut Vec<u8>,
    lsn: u64,
    payload: impl FnOnce(&mut Vec<u8>),
) -> Result<usize, usize> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    payload(out);
    let len = out.len() - start - HEADER_BYTES;
    if len > MAX_PAYLOAD_BYTES {
        out.truncate(start);
        return Err(len);
    }
    let lsn_bytes = lsn.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&lsn_bytes), &out[start + HEADER_BYTES..]);
    let header = &mut out[start..start + HEADER_BYTES];
    header[..4].copy_from_slice(&MAGIC);
    header[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    header[8..12].copy_from_slice(&crc.to_le_bytes());
    header[12..].copy_from_slice(&lsn_bytes);
    Ok(HEADER_BYTES + len)
}

/// Appends the frame for (`lsn`, `payload`) to `out`.
#[cfg(test)]
pub(crate) fn put(out: &mut Vec<u8>, lsn: u64, payload: &[u8]) -> usize {
    put_with(out, lsn, |out| out.extend_from_slice(payload)).expect("small test payload")
}

/// A frame that passed every check.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    /// The record's sequence number.
    pub(crate) lsn: u64,
    /// The payload bytes (CRC-checked, not yet decoded).
    pub(crate) payload: &'a [u8],
    /// Offset just past this frame: where the next one starts.
    pub(crate) end: usize,
}

/// Checks the frame starting at `off` in `buf`; the error says which check failed.
pub(crate) fn check(buf: &[u8], off: usize) -> Result<Frame<'_>, String> {
    let rest = &buf[off.min(buf.len())..];
    if rest.len() < HEADER_BYTES {
        return Err(format!(
            "header cut short: {} of {HEADER_BYTES} bytes",
            rest.len()
        ));
    }
    let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().expect("4 bytes"));
    if rest[..4] != MAGIC {
        return Err(format!("bad magic {:#010x}", word(0)));
    }
    let len = word(4) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return Err(format!("impossible record length {len}"));
    }
    if len > rest.len() - HEADER_BYTES {
        return Err(format!(
            "record length {len} runs past the end of the file ({} bytes left)",
            rest.len() - HEADER_BYTES
        ));
    }
    let stored = word(8);
    let lsn_bytes: [u8; 8] = rest[12..20].try_into().expect("8 bytes");
    let payload = &rest[HEADER_BYTES..HEADER_BYTES + len];
    let computed = crc32c::crc32c_append(crc32c::crc32c(&lsn_bytes), payload);
    if stored != computed {
        return Err(format!(
            "crc mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    Ok(Frame {
        lsn: u64::from_le_bytes(lsn_bytes),
        payload,
        end: off + HEADER_BYTES + len,
    })
}

/// The first offset at or after `from` where a whole valid frame starts, if any.
///
/// Used after a bad frame: a valid one later in the file means the bad one is not a torn tail
/// but damage in the middle. The loop visits each offset once and fully checks only those that
/// start with the magic.
pub(crate) fn find_valid(buf: &[u8], from: usize) -> Option<usize> {
    let last_start = buf.len().checked_sub(HEADER_BYTES)?;
    (from..=last_start).find(|&pos| buf[pos..pos + 4] == MAGIC && check(buf, pos).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_checks_and_any_flipped_bit_is_caught() {
        let mut buf = Vec::new();
        let len = put(&mut buf, 0x0102_0304_0506_0708, b"hello");
        assert_eq!(buf.len(), HEADER_BYTES + 5);
        assert_eq!(len, buf.len());
        assert_eq!(&buf[..4], b"RTJ1");
        assert_eq!(&buf[4..8], &5u32.to_le_bytes());
        assert_eq!(&buf[12..20], &0x0102_0304_0506_0708u64.to_le_bytes());
        let frame = check(&buf, 0).unwrap();
        assert_eq!(
            (frame.lsn, frame.payload, frame.end),
            (0x0102_0304_0506_0708, &b"hello"[..], buf.len())
        );
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[byte] ^= 1 << bit;
                assert!(check(&bad, 0).is_err(), "flip at {byte}.{bit} passed");
            }
        }
    }

    #[test]
    fn find_valid_skips_garbage_and_partial_frames() {
        let mut buf = vec![0u8; 7];
        buf.extend_from_slice(&MAGIC); // a magic with nothing valid behind it
        let start = buf.len();
        put(&mut buf, 9, b"payload");
        assert_eq!(find_valid(&buf, 0), Some(start));
        assert_eq!(find_valid(&buf, start + 1), None);
        assert_eq!(find_valid(&buf[..buf.len() - 1], 0), None);
        assert_eq!(find_valid(&[], 0), None);
    }
}
