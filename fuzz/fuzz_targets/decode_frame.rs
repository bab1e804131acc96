//! Arbitrary bytes into `rtpool_proto::decode_frame`, as a master's reader would feed them:
//! frames are decoded from one buffer until it needs more bytes or a fatal error closes the
//! connection. Run with `cargo +nightly fuzz run decode_frame` from `fuzz/`.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rtpool_proto::{decode_frame, encode_to_vec, PRE_AUTH_MAX_FRAME};

/// The frame limit after the handshake, kept small so large declared lengths are exercised.
const MAX_FRAME: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // The first frame as before authentication, the rest under the larger limit.
    let mut buf = BytesMut::from(data);
    let mut limit = PRE_AUTH_MAX_FRAME;
    // Each successful decode consumes at least 5 bytes, so this bounds the loop.
    for _ in 0..=data.len() / 5 {
        let before = buf.len();
        match decode_frame(&mut buf, limit) {
            Ok(Some(msg)) => {
                assert!(buf.len() < before, "a decoded frame consumed nothing");
                // What decoded must encode and decode back to itself.
                let again = encode_to_vec(&msg);
                let back = decode_frame(&mut BytesMut::from(&again[..]), usize::MAX);
                assert_eq!(back, Ok(Some(msg)));
            }
            Ok(None) => break,
            Err(e) if e.is_fatal() => break,
            Err(_) => {}
        }
        limit = MAX_FRAME;
    }
});
