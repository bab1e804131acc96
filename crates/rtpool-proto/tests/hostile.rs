//! Random and mutated input: `decode_frame` never panics and consumes exactly what it says.
//!
//! (The workspace forbids `unsafe`, so allocations are not counted here; a declared length that
//! slipped past the checks would show as an abort on a multi-gigabyte allocation in
//! `hostile_lengths_allocate_little`.)

mod common;

use bytes::BytesMut;
use common::{frame_of, V};
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_proto::{decode_frame, encode_to_vec, Msg, ProtoError};

/// Decodes `input` with `limit` and checks what was consumed against the outcome.
fn check(input: &[u8], limit: usize) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::from(input);
    let result = decode_frame(&mut buf, limit);
    let consumed = input.len() - buf.len();
    let frame_len = input
        .get(..4)
        .map(|p| 4 + u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize);
    match &result {
        Ok(None) => prop_assert_eq!(consumed, 0),
        Err(ProtoError::FrameTooLarge { .. }) => prop_assert_eq!(consumed, 0),
        Err(ProtoError::EmptyFrame) => prop_assert_eq!(consumed, 4),
        Ok(Some(msg)) => {
            prop_assert_eq!(Some(consumed), frame_len);
            // Whatever decoded is a message the encoder can write and read back.
            let again = decode_frame(&mut BytesMut::from(&encode_to_vec(msg)[..]), usize::MAX);
            prop_assert_eq!(again, Ok(Some(msg.clone())));
        }
        Err(_) => prop_assert_eq!(Some(consumed), frame_len),
    }
    Ok(())
}

fn with_prefix(body: &[u8]) -> Vec<u8> {
    frame_of(body).to_vec()
}

/// Random msgpack values, biased to the names and kinds the decoder looks for.
fn arb_value() -> impl Strategy<Value = V> {
    let leaf = prop_oneof![
        any::<u64>().prop_map(V::U),
        (0u64..300).prop_map(V::U),
        any::<i64>().prop_map(V::I),
        "\\PC{0,12}".prop_map(V::S),
        prop_oneof![Just("priority"), Just("client"), Just("worker")].prop_map(V::s),
        vec(any::<u8>(), 0..40).prop_map(V::B),
        vec(any::<u8>(), 32).prop_map(V::B),
        Just(V::Nil),
        any::<bool>().prop_map(V::Bool),
        any::<f64>().prop_map(V::F),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..9).prop_map(V::A),
            vec((inner.clone(), inner), 0..4).prop_map(V::M),
        ]
    })
}

/// Arrays that start like a message: a kind (mostly a real one), then random fields.
fn arb_message_like() -> impl Strategy<Value = V> {
    (0u64..30, vec(arb_value(), 0..8)).prop_map(|(kind, mut fields)| {
        fields.insert(0, V::U(kind));
        V::A(fields)
    })
}

/// A valid frame with a few bytes overwritten, inserted or cut off.
fn arb_mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        common::arb_msg(),
        vec((any::<usize>(), any::<u8>(), 0u8..3), 1..4),
        any::<bool>(),
    )
        .prop_map(|(msg, edits, fix_prefix): (Msg, _, bool)| {
            let mut bytes = encode_to_vec(&msg);
            for (at, byte, op) in edits {
                let at = at % bytes.len();
                match op {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ => bytes.truncate(at.max(1)),
                }
            }
            if fix_prefix && bytes.len() >= 4 {
                let body_len = (bytes.len() - 4) as u32;
                bytes[..4].copy_from_slice(&body_len.to_be_bytes());
            }
            bytes
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn random_bytes_never_panic(input in vec(any::<u8>(), 0..80), limit in 0usize..100) {
        check(&input, limit)?;
    }

    #[test]
    fn random_bodies_never_panic(body in vec(any::<u8>(), 0..200)) {
        check(&with_prefix(&body), 1 << 20)?;
    }

    #[test]
    fn random_msgpack_never_panics(value in arb_message_like()) {
        check(&with_prefix(&value.to_bytes()), 1 << 20)?;
    }

    #[test]
    fn mutated_frames_never_panic(input in arb_mutated_frame()) {
        check(&input, 1 << 20)?;
    }
}

#[test]
fn hostile_lengths_allocate_little() {
    // Declared sizes far beyond the frame, in every place a length can hide.
    let bodies: [&[u8]; 5] = [
        &[0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x92, 0x0d, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x92, 0x15, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x95],
        &[0x92, 0x03, 0xdb, 0xff, 0xff, 0xff, 0xff],
        &[
            0x92, 0x16, 0x91, 0x97, 0x01, 0x01, 0x00, 0xc6, 0xff, 0xff, 0xff, 0xff,
        ],
    ];
    for body in bodies {
        check(&with_prefix(body), 1 << 20).unwrap();
    }
}
