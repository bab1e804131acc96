//! Random and mutated input: `decode_frame` never panics, consumes exactly what it says, and
//! never makes an allocation larger than the frame limit allows.
//!
//! Allocations are measured by a counting global allocator: each decode runs between a reset
//! and a read of the largest single allocation this thread made (the test harness's own
//! threads do not disturb it).

// The one exception to the workspace's `unsafe_code = "deny"`: implementing `GlobalAlloc` is
// unsafe by definition. The impl only forwards to the system allocator and records sizes.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;
use common::{frame_of, V};
use proptest::collection::vec;
use proptest::prelude::*;
use rtpool_proto::{decode_frame, encode_to_vec, Msg, ProtoError};

/// Forwards to [`System`] and records, per thread, the largest single allocation.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown find the slot gone; they are not ours.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; recording a size touches a const-initialized thread local, which
// never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `decode_frame`, and the largest single allocation it made.
fn decode_measured(buf: &mut BytesMut, limit: usize) -> (Result<Option<Msg>, ProtoError>, usize) {
    LARGEST.with(|l| l.set(0));
    let result = decode_frame(buf, limit);
    (result, LARGEST.with(Cell::get))
}

/// Decoding never allocates more than the frame it was given plus this much (error messages,
/// small vectors, the rounding of `Vec` growth).
const ALLOC_SLACK: usize = 4096;

/// Decodes `input` with `limit` and checks what was consumed against the outcome, and that no
/// single allocation exceeded the frame limit (nor twice the input, for small frames).
fn check(input: &[u8], limit: usize) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::from(input);
    let (result, largest) = decode_measured(&mut buf, limit);
    prop_assert!(
        largest <= limit.min(2 * input.len()) + ALLOC_SLACK,
        "a {}-byte input with limit {limit} made a {largest}-byte allocation",
        input.len()
    );
    let consumed = input.len() - buf.len();
    // Plain or segmented (protocol version 2): the frame's whole length once its prefix (and
    // segment table) is there.
    let frame_len = rtpool_proto::frame_len(input);
    let segmented = input.first().is_some_and(|b| b & 0x80 != 0);
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
        // A segmented frame's bad segment table is refused before anything is consumed.
        Err(_) if segmented && consumed == 0 => {}
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
        prop_oneof![
            Just("priority"),
            Just("client"),
            Just("worker"),
            Just("add")
        ]
        .prop_map(V::s),
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

/// The frames of `tests/vectors/vectors.json`: valid input of every message kind.
fn vector_frames() -> Vec<Vec<u8>> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/vectors.json");
    let text = std::fs::read_to_string(path).expect("tests/vectors/vectors.json");
    let vectors: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    vectors
        .iter()
        .map(|v| hex::decode(v["hex"].as_str().expect("hex")).expect("valid hex"))
        .collect()
}

/// A vector with a few bytes overwritten, inserted or cut off, its length prefix fixed or not.
fn arb_mutated_vector() -> impl Strategy<Value = Vec<u8>> {
    let frames = vector_frames();
    (
        0..frames.len(),
        vec((any::<usize>(), any::<u8>(), 0u8..4), 1..6),
        any::<bool>(),
    )
        .prop_map(move |(i, edits, fix_prefix)| {
            let mut bytes = frames[i].clone();
            for (at, byte, op) in edits {
                let at = at % bytes.len();
                match op {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    2 => bytes[at] ^= 1 << (byte % 8),
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
    fn mutated_vectors_never_panic(input in arb_mutated_vector()) {
        check(&input, 1 << 20)?;
        check(&input, rtpool_proto::PRE_AUTH_MAX_FRAME)?;
    }

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
    let bodies: [&[u8]; 11] = [
        &[0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x92, 0x0d, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x92, 0x15, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x95],
        &[0x92, 0x03, 0xdb, 0xff, 0xff, 0xff, 0xff],
        &[
            0x92, 0x16, 0x91, 0x97, 0x01, 0x01, 0x00, 0xc6, 0xff, 0xff, 0xff, 0xff,
        ],
        // SERVE of 2^31 functions; of one with a 4 GiB interface.
        &[0x92, 0x1b, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x93],
        &[
            0x92, 0x1b, 0x91, 0x93, 0xa1, b'f', 0xa0, 0xc6, 0xff, 0xff, 0xff, 0xff,
        ],
        // CALL of 2^31 calls; of one with 2^32-1 deps.
        &[0x94, 0x12, 0x01, 0x80, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x95],
        &[
            0x94, 0x12, 0x01, 0x80, 0x91, 0x95, 0xa1, b'f', 0xa0, 0xc4, 0x00, 0xdd, 0xff, 0xff,
            0xff, 0xff,
        ],
        // ASSIGN_CALLS of one call with 2^32-1 inputs; FUNCTIONS_REPLY of 2^31 entries.
        &[
            0x92, 0x1c, 0x91, 0x97, 0x01, 0x01, 0xa1, b'f', 0xa0, 0xc4, 0x00, 0xdd, 0xff, 0xff,
            0xff, 0xff,
        ],
        &[0x93, 0x1d, 0x01, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x94],
    ];
    for body in bodies {
        check(&with_prefix(body), 1 << 20).unwrap();
    }
}

#[test]
fn the_allocation_counter_sees_allocations() {
    // Guards the guard: a counter that saw nothing would pass every check above.
    LARGEST.with(|l| l.set(0));
    let v: Vec<u8> = Vec::with_capacity(12_345);
    assert!(LARGEST.with(Cell::get) >= 12_345);
    drop(v);
}

#[test]
fn a_prefix_far_above_the_limit_allocates_nothing_for_the_body() {
    // A 4 GiB declared body against every limit a master uses: refused on the prefix.
    for limit in [
        rtpool_proto::PRE_AUTH_MAX_FRAME,
        1 << 20,
        rtpool_proto::DEFAULT_MAX_FRAME,
    ] {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0x92][..]);
        let (result, largest) = decode_measured(&mut buf, limit);
        assert!(
            matches!(result, Err(ProtoError::FrameTooLarge { .. })),
            "{result:?}"
        );
        assert!(largest < ALLOC_SLACK, "allocated {largest} bytes");
    }
}
