//! Every message kind survives encode -> decode_frame -> encode unchanged, for the named samples
//! and for random well-formed messages.

mod common;

use bytes::BytesMut;
use proptest::prelude::*;
use rtpool_proto::{decode_frame, encode, encode_to_vec, kind, Msg, DEFAULT_MAX_FRAME};

fn round_trip(msg: &Msg) -> (Msg, Vec<u8>) {
    let bytes = encode_to_vec(msg);
    let mut buf = BytesMut::from(&bytes[..]);
    let decoded = decode_frame(&mut buf, DEFAULT_MAX_FRAME)
        .unwrap_or_else(|e| panic!("{} does not decode: {e}", msg.name()))
        .expect("a whole frame");
    assert!(buf.is_empty(), "{}: frame not fully consumed", msg.name());
    (decoded, bytes)
}

#[test]
fn every_sample_round_trips() {
    for (name, msg) in common::samples() {
        let (decoded, bytes) = round_trip(&msg);
        assert_eq!(decoded, msg, "{name}");
        assert_eq!(
            encode_to_vec(&decoded),
            bytes,
            "{name}: re-encoding differs"
        );
    }
}

#[test]
fn samples_cover_every_kind() {
    let kinds: std::collections::BTreeSet<u8> =
        common::samples().iter().map(|(_, m)| m.kind()).collect();
    let all: std::collections::BTreeSet<u8> =
        (0..=u8::MAX).filter(|k| kind::name(*k).is_some()).collect();
    assert_eq!(kinds, all);
    assert_eq!(all.len(), 27);
}

#[test]
fn kind_and_name_agree() {
    for (_, msg) in common::samples() {
        assert_eq!(kind::name(msg.kind()), Some(msg.name()));
        // The kind is the second byte of the body (after a fixarray marker).
        assert_eq!(encode_to_vec(&msg)[5], msg.kind());
    }
}

#[test]
fn many_frames_back_to_back() {
    let samples = common::samples();
    let mut buf = BytesMut::new();
    for (_, msg) in &samples {
        encode(msg, &mut buf);
    }
    for (name, msg) in &samples {
        let got = decode_frame(&mut buf, DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(got.as_ref(), Some(msg), "{name}");
    }
    assert_eq!(decode_frame(&mut buf, DEFAULT_MAX_FRAME), Ok(None));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_messages_round_trip(msg in common::arb_msg()) {
        let (decoded, bytes) = round_trip(&msg);
        prop_assert_eq!(&decoded, &msg);
        prop_assert_eq!(encode_to_vec(&decoded), bytes);
    }
}
