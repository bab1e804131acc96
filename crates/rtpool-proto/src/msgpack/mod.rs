//! The one msgpack layer of the workspace: [`Reader`], a bounded cursor for hostile input, and
//! [`Writer`], the compact encoder.
//!
//! The wire codec, the master's journal and the core's reports all read and write msgpack
//! through these two types (built on `rmp`), so that there is one implementation of each
//! value's encoding and of the checks on untrusted lengths.

mod reader;
mod writer;

pub use self::reader::{describe, Int, Reader, MAX_SKIP_DEPTH, SEGMENT_EXT_TYPE};
pub use self::writer::Writer;
