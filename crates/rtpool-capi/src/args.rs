//! From a C argument array to call values, and from result values back into the caller's
//! memory.
//!
//! `argv[i]` points at the `i`-th C argument (`signature.rs` says what each is): an `int64_t`,
//! a `double`, an `int32_t` bool, a `const char *` string, an array's data or its
//! `rtpool_array_t`. Reading copies every input before the call is sent, so the caller may
//! reuse its `In` buffers at once; the output pointers are kept (as addresses) until the result
//! arrives, and the caller must keep those buffers alive until it has waited for the call, as
//! with any asynchronous GridRPC call.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};

use rtpool_client::{NdArray, Value};

use crate::error::CapiError;
use crate::shape::{self, Dim};
use crate::signature::{kind_name, Kind, Mode, Signature};

/// An array argument whose shape the caller gives (an interface shape of `*` or none).
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct rtpool_array_t {
    /// numpy's name of the element type: `"float64"`, `"float32"`, `"int64"`, `"int32"`.
    pub dtype: *const c_char,
    /// The number of dimensions (0 to 32).
    pub ndim: i32,
    /// `ndim` dimensions.
    pub dims: *const i64,
    /// The elements, C order (row major).
    pub data: *mut c_void,
}

/// Where one output goes: the address of the caller's memory and what it holds.
#[derive(Debug, Clone)]
pub struct OutSlot {
    /// The parameter's name (`"return value"` for it), for messages.
    pub name: String,
    /// The caller's memory, as an address (so a pending call may move across threads).
    pub addr: usize,
    /// What to write there.
    pub kind: Kind,
    /// For arrays: the dimensions the caller's buffer has.
    pub dims: Vec<usize>,
}

/// A call read from C: the values to send and where the outputs go (return value first, then
/// `Out`/`InOut` parameters in order, as the result lists them).
#[derive(Debug)]
pub struct Prepared {
    /// The `In` and `InOut` values, in order.
    pub values: Vec<Value>,
    /// The outputs' destinations.
    pub outputs: Vec<OutSlot>,
}

/// Read a call's arguments.
///
/// # Errors
///
/// `RTPOOL_INVALID_ARGUMENTS` naming the argument: the count differs from the interface, a
/// pointer is null, a shape expression has no value or is negative, an array's dtype differs.
///
/// # Safety
///
/// `argv` points at `argc` pointers, each valid for what the signature says it is.
pub unsafe fn read(
    sig: &Signature,
    argv: *const *mut c_void,
    argc: usize,
) -> Result<Prepared, CapiError> {
    let bad = |problem: String| CapiError::arguments(&sig.function, problem);
    if argc != sig.arg_count() {
        return Err(bad(format!(
            "{argc} arguments given, the interface takes {}: {}",
            sig.arg_count(),
            sig.describe()
        )));
    }
    if argv.is_null() {
        return Err(bad("the argument array is null".into()));
    }
    // SAFETY: the caller promises argc pointers at argv.
    let args = unsafe { std::slice::from_raw_parts(argv, argc) };
    let mut ints = HashMap::new();
    for (param, &ptr) in sig.params.iter().zip(args) {
        if ptr.is_null() {
            return Err(bad(format!("argument {} is a null pointer", param.name)));
        }
        if param.kind == Kind::Int {
            // SAFETY: an int argument points at an int64_t.
            ints.insert(param.name.clone(), unsafe { *(ptr as *const i64) });
        }
    }
    let mut prepared = Prepared {
        values: Vec::new(),
        outputs: Vec::new(),
    };
    if let Some(kind) = &sig.returns {
        let ptr = args[sig.params.len()];
        if ptr.is_null() {
            return Err(bad("the return value's pointer is null".into()));
        }
        let (addr, dims) =
            destination(kind, ptr, &ints).map_err(|e| bad(format!("return value: {e}")))?;
        let name = "return value".to_owned();
        prepared.outputs.push(OutSlot {
            name,
            addr,
            kind: kind.clone(),
            dims,
        });
    }
    for (param, &ptr) in sig.params.iter().zip(args) {
        let at = |e: String| bad(format!("argument {}: {e}", param.name));
        if let Kind::Unsupported(ty) = &param.kind {
            return Err(at(format!(
                "type {ty} cannot be passed from C; call this function from Python"
            )));
        }
        if param.mode != Mode::Out {
            // SAFETY: ptr is valid for the parameter's kind (the caller's promise).
            prepared
                .values
                .push(unsafe { value(&param.kind, ptr, &ints) }.map_err(at)?);
        }
        if param.mode != Mode::In {
            let (addr, dims) = destination(&param.kind, ptr, &ints).map_err(at)?;
            let name = param.name.clone();
            prepared.outputs.push(OutSlot {
                name,
                addr,
                kind: param.kind.clone(),
                dims,
            });
        }
    }
    Ok(prepared)
}

/// Write a call's outputs into the caller's memory.
///
/// # Errors
///
/// `GRPC_SESSION_FAILED` when the worker sent a different number of outputs, or one of another
/// type, dtype or size than the caller's buffer: nothing past that output is written.
///
/// # Safety
///
/// Every slot's address is still valid for what it describes (the caller kept its buffers).
pub unsafe fn write(
    function: &str,
    outputs: &[OutSlot],
    values: Vec<Value>,
) -> Result<(), CapiError> {
    let bad = |problem: String| {
        CapiError::new(
            crate::error::GRPC_SESSION_FAILED,
            format!("{function}: {problem}"),
        )
    };
    if values.len() != outputs.len() {
        return Err(bad(format!(
            "the worker sent {} outputs, expected {}",
            values.len(),
            outputs.len()
        )));
    }
    for (slot, value) in outputs.iter().zip(values) {
        let ptr = slot.addr as *mut c_void;
        match (&slot.kind, value) {
            // SAFETY (each arm): the slot points at memory of the kind it records.
            (Kind::Int, Value::Int(v)) => unsafe { *(ptr as *mut i64) = v },
            (Kind::Float, Value::Float(v)) => unsafe { *(ptr as *mut f64) = v },
            (Kind::Float, Value::Int(v)) => unsafe { *(ptr as *mut f64) = v as f64 },
            (Kind::Bool, Value::Bool(v)) => unsafe { *(ptr as *mut i32) = i32::from(v) },
            (Kind::Array { dtype, .. }, Value::Array(array)) => {
                let shape: Vec<usize> = array.shape().to_vec();
                if array.dtype() != dtype || shape != slot.dims {
                    return Err(bad(format!(
                        "output {} came back as {} of shape {shape:?}, the caller's buffer is {} of shape {:?}",
                        slot.name,
                        array.dtype().to_wire(),
                        dtype.to_wire(),
                        slot.dims
                    )));
                }
                let bytes = array.as_bytes();
                // SAFETY: the buffer holds prod(dims) elements of dtype, as many bytes as these.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len())
                };
            }
            (kind, other) => {
                return Err(bad(format!(
                    "output {} came back as {}, expected {}",
                    slot.name,
                    other.describe(),
                    kind_name(kind)
                )))
            }
        }
    }
    Ok(())
}

/// The value of one input argument.
///
/// # Safety
///
/// `ptr` is non-null and valid for `kind`.
unsafe fn value(
    kind: &Kind,
    ptr: *mut c_void,
    ints: &HashMap<String, i64>,
) -> Result<Value, String> {
    // SAFETY (each arm): the caller's promise for the parameter's kind.
    Ok(match kind {
        Kind::Int => Value::Int(unsafe { *(ptr as *const i64) }),
        Kind::Float => Value::Float(unsafe { *(ptr as *const f64) }),
        Kind::Bool => Value::Bool(unsafe { *(ptr as *const i32) } != 0),
        Kind::Str => {
            let text = unsafe { CStr::from_ptr(ptr as *const c_char) };
            Value::Str(
                text.to_str()
                    .map_err(|_| "the string is not UTF-8".to_owned())?
                    .to_owned(),
            )
        }
        Kind::Array { dtype, .. } => {
            let (data, dims) = array_memory(kind, ptr, ints)?;
            let len = dims.iter().product::<usize>() * dtype.size_bytes().expect("a known dtype");
            // SAFETY: the caller's array holds prod(dims) elements of dtype.
            let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec();
            Value::Array(NdArray::from_raw(dtype.clone(), dims, bytes).map_err(|e| e.to_string())?)
        }
        Kind::Unsupported(ty) => return Err(format!("type {ty} cannot be passed from C")),
    })
}

/// Where an output goes and, for an array, its dimensions.
fn destination(
    kind: &Kind,
    ptr: *mut c_void,
    ints: &HashMap<String, i64>,
) -> Result<(usize, Vec<usize>), String> {
    match kind {
        Kind::Array { .. } => {
            let (data, dims) = array_memory(kind, ptr, ints)?;
            Ok((data as usize, dims))
        }
        Kind::Int | Kind::Float | Kind::Bool => Ok((ptr as usize, Vec::new())),
        other => Err(format!(
            "an output of type {} cannot be received in C",
            kind_name(other)
        )),
    }
}

/// An array argument's data pointer and dimensions: from the interface's shape evaluated over
/// the integer arguments, or from the caller's `rtpool_array_t` when the shape is open.
fn array_memory(
    kind: &Kind,
    ptr: *mut c_void,
    ints: &HashMap<String, i64>,
) -> Result<(*mut c_void, Vec<usize>), String> {
    let Kind::Array { dtype, shape } = kind else {
        unreachable!("array_memory of an array kind only")
    };
    if !kind.needs_described_array() {
        let dims = shape.as_deref().unwrap_or_default();
        let dims = dims.iter().map(|d| match d {
            Dim::Expr(e) => shape::eval(e, ints)
                .and_then(|v| usize::try_from(v).map_err(|_| format!("dimension {v} is negative"))),
            Dim::Any => unreachable!("no open dimension here"),
        });
        return Ok((ptr, dims.collect::<Result<_, _>>()?));
    }
    // SAFETY: for an open shape the caller passes an rtpool_array_t (documented in the header).
    let desc = unsafe { &*(ptr as *const rtpool_array_t) };
    if desc.dtype.is_null() || desc.data.is_null() || (desc.ndim > 0 && desc.dims.is_null()) {
        return Err("rtpool_array_t with a null dtype, data or dims".into());
    }
    // SAFETY: a non-null NUL-terminated string (the caller's promise).
    let given = unsafe { CStr::from_ptr(desc.dtype) }.to_string_lossy();
    if Some(&*given) != dtype.name() {
        return Err(format!(
            "dtype {given}, expected {}",
            dtype.name().unwrap_or("?")
        ));
    }
    if !(0..=32).contains(&desc.ndim) {
        return Err(format!("ndim {} is not 0 to 32", desc.ndim));
    }
    // SAFETY: ndim dimensions at dims.
    let given_dims = unsafe { std::slice::from_raw_parts(desc.dims, desc.ndim as usize) };
    let dims: Vec<usize> = given_dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is negative")))
        .collect::<Result<_, _>>()?;
    if let Some(expected) = shape {
        if expected.len() != dims.len() {
            return Err(format!(
                "{} dimensions, expected {}",
                dims.len(),
                expected.len()
            ));
        }
        for (i, (want, &got)) in expected.iter().zip(&dims).enumerate() {
            if let Dim::Expr(e) = want {
                let want = shape::eval(e, ints)?;
                if want != got as i64 {
                    return Err(format!("dimension {i} is {got}, expected {want}"));
                }
            }
        }
    }
    Ok((desc.data, dims))
}
