//! rtpool-proto: the wire protocol's messages and its length-prefixed msgpack codec.
//!
//! Pure: it works on byte buffers and knows nothing of sockets. `docs/protocol.md` is the
//! specification; the vectors in `tests/vectors/` pin the bytes.

mod codec;
mod counts;
mod error;
pub mod kind;
mod limits;
mod message;
pub mod msgpack;
mod options;

pub use codec::{
    decode_body, decode_frame, decode_segmented, encode, encode_segmented, encode_to_vec,
    frame_len, MAX_SEGMENTS, SEGMENTED_FLAG, SEGMENT_MIN_BYTES,
};
pub use counts::PackageCounts;
pub use error::ProtoError;
pub use limits::*;
pub use message::*;
pub use options::{
    check_name, Labels, MissPolicy, OptFields, PackageOpts, Resources, Unschedulable, CALL_OPTS,
    MAX_ENTRIES, MAX_LABEL_VALUE_BYTES, MAX_RESOURCE_NAME_BYTES, OPTION_KEYS, OPTS, SUBMIT_OPTS,
};
