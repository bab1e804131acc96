//! [`ProtoError`]: everything that can be wrong with a frame a peer sent.
//!
//! This module owns the mapping from a decoding failure to the protocol's `ERROR.code` and to
//! whether the connection must be closed. Building and sending the `ERROR` frame is the master's.

use crate::kind;

/// A frame that could not be decoded into a [`Msg`](crate::Msg).
///
/// Every variant but [`ProtoError::BadOption`] is fatal: the master answers `ERROR` with
/// [`code`](ProtoError::code) and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The length prefix is above the current frame limit; the body was not read.
    #[error("frame of {len} bytes is above the limit of {limit} bytes")]
    FrameTooLarge {
        /// Body length announced by the prefix.
        len: usize,
        /// The frame limit in force (`PRE_AUTH_MAX_FRAME` or `max_frame_bytes`).
        limit: usize,
    },

    /// The length prefix is 0.
    #[error("frame of length 0 (a body must hold at least the message kind)")]
    EmptyFrame,

    /// The body is not valid msgpack, not an array, has a wrong type, value or field count.
    #[error("malformed {}: {reason}", describe_kind(*.kind))]
    Malformed {
        /// The message kind, when the body got far enough to name a known one.
        kind: Option<u8>,
        /// What was wrong and where (message and field).
        reason: String,
    },

    /// The first array element is a message kind that does not exist in version 1.
    #[error("unknown message kind {kind}")]
    UnknownKind {
        /// The kind as sent (any non-negative integer).
        kind: u64,
    },

    /// A `SUBMIT` or `CALL` whose `opts` map has an unknown or duplicate key, a wrong-typed
    /// value or a value outside the option's set (`on_miss`, the length of `key`).
    ///
    /// The rest of the frame decoded fine and was consumed, so the connection stays usable:
    /// the master answers a non-fatal `ERROR rejected` with `ref = req_id`.
    #[error("{} {req_id} has a bad option `{key}`: {reason}", kind::name(*.kind).unwrap_or("request"))]
    BadOption {
        /// The refused message's kind: [`kind::SUBMIT`] or [`kind::CALL`].
        kind: u8,
        /// The `req_id` of the refused `SUBMIT` or `CALL`.
        req_id: u64,
        /// The offending key (cut to 64 bytes if longer).
        key: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl ProtoError {
    /// The protocol error code (`ERROR.code`) to answer with, from `docs/protocol.md`.
    pub fn code(&self) -> &'static str {
        match self {
            ProtoError::FrameTooLarge { .. } => "too_large",
            ProtoError::EmptyFrame | ProtoError::Malformed { .. } => "malformed",
            ProtoError::UnknownKind { .. } => "unknown_kind",
            ProtoError::BadOption { .. } => "rejected",
        }
    }

    /// Whether the master must close the connection after answering this error.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ProtoError::BadOption { .. })
    }

    /// The request the error refers to (`ERROR.ref`): the `req_id` of a refused `SUBMIT` or
    /// `CALL`, else 0.
    pub fn reference(&self) -> u64 {
        match self {
            ProtoError::BadOption { req_id, .. } => *req_id,
            _ => 0,
        }
    }
}

/// `"HELLO message"` for a known kind, `"frame"` when the kind is not known yet.
fn describe_kind(kind: Option<u8>) -> String {
    match kind.and_then(kind::name) {
        Some(name) => format!("{name} message"),
        None => "frame".to_owned(),
    }
}
