//! A function's interface as the C API sees it: for each parameter, its mode and what a C
//! caller passes for it (an integer, a double, a bool, a string, an array pointer), and the
//! return value's slot. Built once per handle from the interface the master hands out
//! (`backend.rs` maps the client crate's type to this one).
//!
//! The C argument list is the parameters in the interface's order, every one of them (`Out`
//! arrays too, filled in place, as Ninf's `Ninf_call`), then one more pointer when the function
//! returns a value.

use rtpool_client::Dtype;

use crate::shape::{self, Dim};

/// How a parameter travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sent to the worker.
    In,
    /// Made by the worker, written back into the caller's array.
    Out,
    /// Sent, modified by the worker and written back.
    InOut,
}

/// What a C caller passes for a parameter (or receives for the return value).
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `int64_t` (argument array) or `int` (varargs).
    Int,
    /// `double`.
    Float,
    /// `int32_t` (argument array) or `int` (varargs), 0 or not.
    Bool,
    /// A NUL-terminated UTF-8 `const char *`.
    Str,
    /// A data pointer when `shape` is fully determined, else an `rtpool_array_t *`.
    Array {
        /// The element type.
        dtype: Dtype,
        /// The dimensions; `None`: any shape.
        shape: Option<Vec<Dim>>,
    },
    /// A type the C API cannot pass (complex, bytes, any, another dtype), by its name.
    Unsupported(String),
}

impl Kind {
    /// The kind of an interface type (`"int"`, `"array"`, ...) with its dtype and shape.
    ///
    /// # Errors
    ///
    /// A message when the shape string does not parse.
    pub fn from_interface(
        ty: &str,
        dtype: Option<&str>,
        shape: Option<&str>,
    ) -> Result<Kind, String> {
        Ok(match ty {
            "int" => Kind::Int,
            "float" => Kind::Float,
            "bool" => Kind::Bool,
            "str" => Kind::Str,
            "array" => {
                let dtype = match dtype {
                    Some("float64") => Dtype::F64,
                    Some("float32") => Dtype::F32,
                    Some("int64") => Dtype::I64,
                    Some("int32") => Dtype::I32,
                    other => {
                        return Ok(Kind::Unsupported(format!(
                            "array of {}",
                            other.unwrap_or("any dtype")
                        )))
                    }
                };
                let shape = shape.map(shape::parse).transpose()?;
                Kind::Array { dtype, shape }
            }
            other => Kind::Unsupported(other.to_owned()),
        })
    }

    /// How the varargs shim reads this slot: `RTPOOL_VA_INT`, `_BOOL`, `_DOUBLE` or `_POINTER`.
    pub fn va_kind(&self) -> i32 {
        match self {
            Kind::Int => crate::RTPOOL_VA_INT,
            Kind::Bool => crate::RTPOOL_VA_BOOL,
            Kind::Float => crate::RTPOOL_VA_DOUBLE,
            _ => crate::RTPOOL_VA_POINTER,
        }
    }

    /// Whether the caller passes an `rtpool_array_t *` rather than a bare data pointer.
    pub fn needs_described_array(&self) -> bool {
        match self {
            Kind::Array { shape: None, .. } => true,
            Kind::Array {
                shape: Some(dims), ..
            } => dims.contains(&Dim::Any),
            _ => false,
        }
    }
}

/// One parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name in the interface.
    pub name: String,
    /// In, Out or InOut.
    pub mode: Mode,
    /// What the caller passes.
    pub kind: Kind,
}

/// A function's interface for C callers.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    /// The function's name.
    pub function: String,
    /// The parameters, in order.
    pub params: Vec<Param>,
    /// The return value's kind; `None` when the function returns nothing.
    pub returns: Option<Kind>,
}

impl Signature {
    /// The number of C arguments a call takes: every parameter, plus the return slot.
    pub fn arg_count(&self) -> usize {
        self.params.len() + usize::from(self.returns.is_some())
    }

    /// The varargs kind of each C argument, in order.
    pub fn va_kinds(&self) -> Vec<i32> {
        let params = self.params.iter().map(|p| p.kind.va_kind());
        params
            .chain(self.returns.iter().map(|_| crate::RTPOOL_VA_POINTER))
            .collect()
    }

    /// `dmmul(n: int, A: in float64[n, n], ...) -> ...`, for messages.
    pub fn describe(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("{}: {:?} {}", p.name, p.mode, kind_name(&p.kind)))
            .collect();
        let returns = self
            .returns
            .as_ref()
            .map_or(String::new(), |k| format!(" -> {}", kind_name(k)));
        format!("{}({}){}", self.function, params.join(", "), returns)
    }
}

/// A kind's name in messages: `int`, `float64 array`.
pub fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Int => "int".into(),
        Kind::Float => "float".into(),
        Kind::Bool => "bool".into(),
        Kind::Str => "str".into(),
        Kind::Array { dtype, .. } => format!("{} array", dtype.name().unwrap_or("?")),
        Kind::Unsupported(name) => name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_interface_types() {
        assert_eq!(Kind::from_interface("int", None, None).unwrap(), Kind::Int);
        let arr = Kind::from_interface("array", Some("float64"), Some("n, n")).unwrap();
        assert!(matches!(&arr, Kind::Array { dtype: Dtype::F64, shape: Some(d) } if d.len() == 2));
        assert!(!arr.needs_described_array());
        let any = Kind::from_interface("array", Some("int32"), None).unwrap();
        assert!(any.needs_described_array());
        assert_eq!(
            Kind::from_interface("array", Some("complex128"), None).unwrap(),
            Kind::Unsupported("array of complex128".into())
        );
        assert!(Kind::from_interface("array", Some("float64"), Some("n ** 2")).is_err());
    }

    #[test]
    fn the_return_value_takes_one_more_pointer() {
        let sig = Signature {
            function: "dgefa".into(),
            params: vec![
                Param {
                    name: "n".into(),
                    mode: Mode::In,
                    kind: Kind::Int,
                },
                Param {
                    name: "x".into(),
                    mode: Mode::In,
                    kind: Kind::Float,
                },
            ],
            returns: Some(Kind::Int),
        };
        assert_eq!(sig.arg_count(), 3);
        assert_eq!(
            sig.va_kinds(),
            vec![
                crate::RTPOOL_VA_INT,
                crate::RTPOOL_VA_DOUBLE,
                crate::RTPOOL_VA_POINTER
            ]
        );
        assert_eq!(sig.describe(), "dgefa(n: In int, x: In float) -> int");
    }
}
