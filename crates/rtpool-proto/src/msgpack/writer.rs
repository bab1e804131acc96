//! [`Writer`]: msgpack values appended to an in-memory buffer through rmp's encoder.
//!
//! Every writer of msgpack in the workspace goes through here: the wire encoder
//! (`codec/encoder.rs`), the master's journal records and the core's disagreement reports. It
//! writes the most compact form of every value, as msgpack-python does, so that bytes written
//! here match the Python encoder's. Writing to memory cannot fail, so nothing returns an error.

use std::io;

use bytes::BufMut;

/// Appends msgpack values to a buffer (`BytesMut` or `Vec<u8>`).
pub struct Writer<'a, B: BufMut>(pub &'a mut B);

/// Writing to memory cannot fail: the buffer grows (or aborts on out-of-memory).
const INFALLIBLE: &str = "writing msgpack to memory cannot fail";

impl<B: BufMut> io::Write for Writer<'_, B> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.put_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<B: BufMut> Writer<'_, B> {
    /// A non-negative integer in its most compact form.
    pub fn uint(&mut self, value: impl Into<u64>) {
        rmp::encode::write_uint(self, value.into()).expect(INFALLIBLE);
    }

    /// A signed integer in its most compact form.
    pub fn sint(&mut self, value: impl Into<i64>) {
        rmp::encode::write_sint(self, value.into()).expect(INFALLIBLE);
    }

    /// `nil`.
    pub fn nil(&mut self) {
        rmp::encode::write_nil(self).expect(INFALLIBLE);
    }

    /// A bool.
    pub fn bool(&mut self, value: bool) {
        rmp::encode::write_bool(self, value).expect(INFALLIBLE);
    }

    /// A float, as a msgpack `float 64`.
    pub fn f64(&mut self, value: f64) {
        rmp::encode::write_f64(self, value).expect(INFALLIBLE);
    }

    /// Bytes that are already one encoded msgpack value, as they are.
    pub fn raw(&mut self, value: &[u8]) {
        self.0.put_slice(value);
    }

    /// A `str`.
    ///
    /// # Panics
    ///
    /// If `value` is longer than msgpack's 2^32-1 bytes.
    pub fn str(&mut self, value: &str) {
        rmp::encode::write_str_len(self, len32(value.len())).expect(INFALLIBLE);
        self.0.put_slice(value.as_bytes());
    }

    /// A `bin`.
    ///
    /// # Panics
    ///
    /// If `value` is longer than msgpack's 2^32-1 bytes.
    pub fn bin(&mut self, value: &[u8]) {
        rmp::encode::write_bin_len(self, len32(value.len())).expect(INFALLIBLE);
        self.0.put_slice(value);
    }

    /// An array header of `len` elements.
    ///
    /// # Panics
    ///
    /// If `len` is above 2^32-1.
    pub fn array(&mut self, len: usize) {
        rmp::encode::write_array_len(self, len32(len)).expect(INFALLIBLE);
    }

    /// A map header of `len` entries.
    ///
    /// # Panics
    ///
    /// If `len` is above 2^32-1.
    pub fn map(&mut self, len: usize) {
        rmp::encode::write_map_len(self, len32(len)).expect(INFALLIBLE);
    }
}

/// A msgpack length. rmp's own writers would cut a longer one silently; refuse it instead.
///
/// # Panics
///
/// If `len` is above 2^32-1: callers keep frames and records far below that.
fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("msgpack cannot hold a str, bin, array or map above 2^32-1")
}
