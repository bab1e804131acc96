//! Call values ([`Value`], [`NdArray`]) and their wire form, the same bytes the Python client
//! writes (`docs/rpc.md`, "Values"): msgpack, arrays as ext 1 (`u8 len` + numpy `dtype.str` +
//! `u8 ndim` + `ndim` x `u64` LE dimensions + the raw bytes in C order), a transaction's
//! reference to another call's output as ext 2 (`[input, output]`).
//!
//! Writing goes through `rtpool_proto::msgpack::Writer` (the workspace's one msgpack
//! encoder); reading results uses the bounded [`Cursor`] of `decode.rs`. Checking values
//! against an interface is `interface.rs`'s.

use rtpool_proto::msgpack::Writer;

use crate::error::ClientError;

/// msgpack ext type of an array.
pub(crate) const EXT_ARRAY: i8 = 1;
/// msgpack ext type of a reference to a transaction input.
pub(crate) const EXT_REF: i8 = 2;

/// The element type of an [`NdArray`], as numpy names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `float64` (`<f8`).
    F64,
    /// `float32` (`<f4`).
    F32,
    /// `int64` (`<i8`).
    I64,
    /// `int32` (`<i4`).
    I32,
    /// Any other numpy dtype a worker returned, by its `dtype.str` (`<c16`, `|b1`); its bytes
    /// are kept as they came.
    Other(String),
}

impl Dtype {
    /// numpy's `dtype.str` of this type (`"<f8"`).
    pub fn to_wire(&self) -> &str {
        match self {
            Dtype::F64 => "<f8",
            Dtype::F32 => "<f4",
            Dtype::I64 => "<i8",
            Dtype::I32 => "<i4",
            Dtype::Other(s) => s,
        }
    }

    /// The dtype of a numpy `dtype.str`.
    pub fn from_wire(s: &str) -> Dtype {
        match s {
            "<f8" => Dtype::F64,
            "<f4" => Dtype::F32,
            "<i8" => Dtype::I64,
            "<i4" => Dtype::I32,
            other => Dtype::Other(other.to_owned()),
        }
    }

    /// numpy's name of this type (`"float64"`), as interfaces write it; `None` for
    /// [`Dtype::Other`].
    pub fn name(&self) -> Option<&'static str> {
        Some(match self {
            Dtype::F64 => "float64",
            Dtype::F32 => "float32",
            Dtype::I64 => "int64",
            Dtype::I32 => "int32",
            Dtype::Other(_) => return None,
        })
    }

    /// Bytes per element, when known.
    pub fn size_bytes(&self) -> Option<usize> {
        match self {
            Dtype::F64 | Dtype::I64 => Some(8),
            Dtype::F32 | Dtype::I32 => Some(4),
            Dtype::Other(_) => None,
        }
    }
}

/// An n-dimensional array in C order: its dtype, shape and raw little-endian bytes.
///
/// ```
/// use rtpool_client::{Dtype, NdArray};
/// let a = NdArray::from_f64(&[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
/// assert_eq!(a.dtype(), &Dtype::F64);
/// assert_eq!(a.shape(), &[2, 2]);
/// assert_eq!(a.to_f64().unwrap()[3], 4.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

macro_rules! typed {
    ($from:ident, $to:ident, $ty:ty, $dtype:expr) => {
        #[doc = concat!("An array of `", stringify!($ty), "` of `shape` (C order) from `values`.")]
        ///
        /// # Errors
        ///
        /// [`ClientError::WrongArguments`] when the shape's element count is not `values.len()`.
        pub fn $from(shape: &[usize], values: &[$ty]) -> Result<NdArray, ClientError> {
            let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            NdArray::from_raw($dtype, shape.to_vec(), data)
        }

        #[doc = concat!("The elements as `", stringify!($ty), "`; `None` for another dtype.")]
        pub fn $to(&self) -> Option<Vec<$ty>> {
            const N: usize = std::mem::size_of::<$ty>();
            (self.dtype == $dtype).then(|| {
                self.data
                    .chunks_exact(N)
                    .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunks of N")))
                    .collect()
            })
        }
    };
}

impl NdArray {
    typed!(from_f64, to_f64, f64, Dtype::F64);
    typed!(from_f32, to_f32, f32, Dtype::F32);
    typed!(from_i64, to_i64, i64, Dtype::I64);
    typed!(from_i32, to_i32, i32, Dtype::I32);

    /// An array of `dtype` and `shape` over raw little-endian bytes in C order.
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] when `data` is not `shape`'s element count times the
    /// dtype's size (checked for the four known dtypes), or the shape has more than 255
    /// dimensions.
    pub fn from_raw(
        dtype: Dtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) -> Result<NdArray, ClientError> {
        let bad = |problem: String| ClientError::WrongArguments {
            function: "array".into(),
            problem,
        };
        if shape.len() > 255 {
            return Err(bad(format!("{} dimensions, at most 255", shape.len())));
        }
        if let Some(size) = dtype.size_bytes() {
            let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if count.and_then(|c| c.checked_mul(size)) != Some(data.len()) {
                return Err(bad(format!(
                    "shape {shape:?} of {} needs {} elements, got {}",
                    dtype.to_wire(),
                    count.map_or("too many".into(), |c| c.to_string()),
                    data.len() / size
                )));
            }
        }
        Ok(NdArray { dtype, shape, data })
    }

    /// The element type.
    pub fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw little-endian bytes, C order.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The raw bytes, taken out.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    fn write<B: bytes::BufMut>(&self, w: &mut Writer<'_, B>) {
        let dtype = self.dtype.to_wire().as_bytes();
        let header = 1 + dtype.len() + 1 + 8 * self.shape.len();
        let len = u32::try_from(header + self.data.len()).expect("array above 4 GiB");
        rmp::encode::write_ext_meta(w, len, EXT_ARRAY).expect("writing to memory");
        w.raw(&[u8::try_from(dtype.len()).expect("short dtype")]);
        w.raw(dtype);
        w.raw(&[u8::try_from(self.shape.len()).expect("checked: at most 255")]);
        for &d in &self.shape {
            w.raw(&(d as u64).to_le_bytes());
        }
        w.raw(&self.data);
    }
}

/// A reference to an output of an earlier call of the same transaction
/// ([`Transaction::call`](crate::Transaction::call)), made by
/// [`TxCall::output`](crate::TxCall::output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputRef {
    /// The producing call's index in its transaction.
    pub call: u32,
    /// Which of its outputs, from 0.
    pub output: u32,
}

/// One argument or result value of a call.
///
/// ```
/// use rtpool_client::Value;
/// let v: Vec<Value> = vec![3i64.into(), 2.5f64.into(), "x".into()];
/// assert_eq!(v[0].as_i64(), Some(3));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// msgpack nil (Python `None`).
    Nil,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (sent as msgpack float 64).
    Float(f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// An n-dimensional array (a numpy array on the worker).
    Array(NdArray),
    /// A list (Python list or tuple).
    List(Vec<Value>),
    /// A map, in its order on the wire.
    Map(Vec<(Value, Value)>),
    /// In a transaction only: another call's output, a data dependency.
    Output(OutputRef),
}

impl Value {
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The float (or an integer as a float), if this is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&NdArray> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The array, taken out, if this is one.
    pub fn into_array(self) -> Option<NdArray> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// What kind of value this is, for error messages (`int`, `array of float64 (2, 2)`).
    pub fn describe(&self) -> String {
        match self {
            Value::Nil => "nil".into(),
            Value::Bool(_) => "bool".into(),
            Value::Int(_) => "int".into(),
            Value::Float(_) => "float".into(),
            Value::Str(_) => "str".into(),
            Value::Bytes(_) => "bytes".into(),
            Value::Array(a) => format!(
                "array of {} {}",
                a.dtype.name().unwrap_or(a.dtype.to_wire()),
                shape_text(&a.shape)
            ),
            Value::List(_) => "list".into(),
            Value::Map(_) => "map".into(),
            Value::Output(r) => format!("output of call #{}", r.call),
        }
    }

    fn write<B: bytes::BufMut>(&self, w: &mut Writer<'_, B>) {
        match self {
            Value::Nil => w.nil(),
            Value::Bool(b) => w.bool(*b),
            Value::Int(i) if *i >= 0 => w.uint(*i as u64),
            Value::Int(i) => w.sint(*i),
            Value::Float(f) => w.f64(*f),
            Value::Str(s) => w.str(s),
            Value::Bytes(b) => w.bin(b),
            Value::Array(a) => a.write(w),
            Value::List(items) => {
                w.array(items.len());
                items.iter().for_each(|v| v.write(w));
            }
            Value::Map(entries) => {
                w.map(entries.len());
                for (k, v) in entries {
                    k.write(w);
                    v.write(w);
                }
            }
            Value::Output(r) => {
                // Written by the transaction as ext 2 with the input's position; a bare one
                // never reaches the encoder (the interface check refuses it outside one).
                unreachable!("an OutputRef to call #{} outside a transaction", r.call)
            }
        }
    }
}

/// `(8, 9)`, as numpy prints a shape.
pub(crate) fn shape_text(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Encodes a call's argument payload: the msgpack list of its `In` and `InOut` values, as the
/// Python client writes it. References to other calls of a transaction become ext 2 with
/// `input` = their position among the call's dependencies (`deps`).
///
/// ```
/// use rtpool_client::{encode_args, Value};
/// let bytes = encode_args(&[Value::Int(3), Value::Str("a".into())], &[]);
/// assert_eq!(bytes, [0x92, 0x03, 0xa1, b'a']);
/// ```
pub fn encode_args(values: &[Value], deps: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.iter().map(size_hint).sum::<usize>() + 8);
    let mut w = Writer(&mut out);
    w.array(values.len());
    for v in values {
        if let Value::Output(r) = v {
            let input = deps
                .iter()
                .position(|&d| d == r.call)
                .expect("dependency listed") as u32;
            let output = i64::from(r.output);
            let mut payload = Vec::new();
            let mut pw = Writer(&mut payload);
            pw.array(2);
            pw.uint(input);
            pw.sint(output);
            rmp::encode::write_ext_meta(&mut w, payload.len() as u32, EXT_REF).expect("memory");
            w.raw(&payload);
        } else {
            v.write(&mut w);
        }
    }
    out
}

fn size_hint(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.data.len() + 32,
        Value::Str(s) => s.len() + 5,
        Value::Bytes(b) => b.len() + 5,
        _ => 9,
    }
}

macro_rules! from_scalar {
    ($($ty:ty => $variant:ident as $as:ty),*) => {$(
        impl From<$ty> for Value {
            fn from(v: $ty) -> Value {
                Value::$variant(<$as>::from(v))
            }
        }
    )*};
}

from_scalar!(i64 => Int as i64, i32 => Int as i64, u32 => Int as i64, f64 => Float as f64,
    f32 => Float as f64, bool => Bool as bool, String => Str as String, &str => Str as String,
    Vec<u8> => Bytes as Vec<u8>, NdArray => Array as NdArray, OutputRef => Output as OutputRef);

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Int(i64::try_from(v).expect("a usize above i64::MAX is no call argument"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_is_ext1_with_dtype_ndim_dims_and_data() {
        let a = NdArray::from_i32(&[2], &[1, -1]).unwrap();
        let bytes = encode_args(&[Value::Array(a)], &[]);
        // list of 1, ext 8 of 21 bytes, type 1, "\x03<i4", ndim 1, dim 2 (u64 LE), data
        let mut want = vec![0x91, 0xc7, 21, 0x01, 3, b'<', b'i', b'4', 1];
        want.extend(2u64.to_le_bytes());
        want.extend(1i32.to_le_bytes());
        want.extend((-1i32).to_le_bytes());
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_shape_that_does_not_fit_the_data_is_refused() {
        let err = NdArray::from_f64(&[2, 2], &[1.0]).unwrap_err();
        assert!(err.to_string().contains("needs 4 elements, got 1"), "{err}");
    }
}
