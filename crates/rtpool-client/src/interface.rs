//! [`Interface`]: a served function's parameters and outputs as its worker declared them
//! (`docs/rpc.md`, "Interface"), read from the msgpack blob `FUNCTIONS_REPLY` hands out, and
//! the check of a call's arguments against it before anything is sent (the same checks and
//! messages as the Python client's `rpc/binding.py`).
//!
//! Encoding the checked values is `value.rs`'s; fetching interfaces is the client's.

use std::collections::HashMap;
use std::fmt;

use crate::decode::Cursor;
use crate::error::ClientError;
use crate::shape::eval_shape;
use crate::value::{shape_text, Value};

/// How a parameter travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sent to the worker.
    In,
    /// Allocated by the worker, filled by the function, sent back.
    Out,
    /// Sent, modified by the function, sent back.
    InOut,
}

/// One parameter (or the return value) of an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name (`"return"` for the return value).
    pub name: String,
    /// In, out or inout.
    pub mode: Mode,
    /// `int`, `float`, `complex`, `bool`, `str`, `bytes`, `any` or `array`.
    pub type_name: String,
    /// numpy's dtype name (`float64`) of an array; `None` otherwise.
    pub dtype: Option<String>,
    /// The shape expression of an array (`"n, n"`); `None`: any shape.
    pub shape: Option<String>,
}

/// A served function's interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its registered name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Its docstring.
    pub doc: String,
    /// Every parameter, in order.
    pub params: Vec<Param>,
    /// The return value, if the function returns one.
    pub returns: Option<Param>,
    /// Connected workers serving it when it was fetched.
    pub servers: u32,
}

impl fmt::Display for Interface {
    /// `dmmul(n: int, A: In[float64[n, n]], ...) -> C: Out[float64[n, n]]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = |p: &Param| match (&p.dtype, &p.shape) {
            (Some(d), Some(s)) => format!("{d}[{s}]"),
            (Some(d), None) => d.clone(),
            _ => p.type_name.clone(),
        };
        let ins: Vec<String> = self
            .params
            .iter()
            .filter(|p| p.mode != Mode::Out)
            .map(|p| match (p.mode, p.type_name.as_str()) {
                (Mode::In, "array") => format!("{}: In[{}]", p.name, text(p)),
                (Mode::In, _) => format!("{}: {}", p.name, text(p)),
                _ => format!("{}: InOut[{}]", p.name, text(p)),
            })
            .collect();
        let outs: Vec<String> = self
            .outputs()
            .map(|p| match p.mode {
                Mode::Out if p.name == "return" => text(p),
                Mode::Out => format!("{}: Out[{}]", p.name, text(p)),
                _ => format!("{}: InOut[{}]", p.name, text(p)),
            })
            .collect();
        write!(f, "{}({})", self.name, ins.join(", "))?;
        match outs.len() {
            0 => write!(f, " -> None"),
            1 => write!(f, " -> {}", outs[0]),
            _ => write!(f, " -> ({})", outs.join(", ")),
        }
    }
}

impl Interface {
    /// Reads an interface blob (a msgpack map, `docs/rpc.md`).
    ///
    /// # Errors
    ///
    /// [`ClientError::ConnectionLost`] when the blob is not an interface map.
    pub fn from_blob(blob: &[u8], servers: u32) -> Result<Interface, ClientError> {
        let bad = |reason: String| ClientError::ConnectionLost {
            address: "the master".into(),
            reason: format!("a function's interface does not decode: {reason}"),
        };
        let entries = match Cursor::new(blob).value(0).map_err(bad)? {
            Value::Map(entries) => entries,
            other => return Err(bad(format!("expected a map, got {}", other.describe()))),
        };
        let mut iface = Interface {
            name: String::new(),
            version: String::new(),
            doc: String::new(),
            params: Vec::new(),
            returns: None,
            servers,
        };
        for (k, v) in entries {
            match (k.as_str(), v) {
                (Some("name"), Value::Str(s)) => iface.name = s,
                (Some("version"), Value::Str(s)) => iface.version = s,
                (Some("doc"), Value::Str(s)) => iface.doc = s,
                (Some("params"), Value::List(items)) => {
                    iface.params = items
                        .into_iter()
                        .map(param)
                        .collect::<Result<_, _>>()
                        .map_err(bad)?;
                }
                (Some("returns"), Value::Nil) => {}
                (Some("returns"), v) => iface.returns = Some(param(v).map_err(bad)?),
                _ => {}
            }
        }
        if let Some(r) = &mut iface.returns {
            r.name = "return".into();
            r.mode = Mode::Out;
        }
        Ok(iface)
    }

    /// The outputs in the order a call returns them: the return value, then the `Out` and
    /// `InOut` parameters.
    pub fn outputs(&self) -> impl Iterator<Item = &Param> {
        self.returns
            .iter()
            .chain(self.params.iter().filter(|p| p.mode != Mode::In))
    }

    /// The parameters a call passes (`In` and `InOut`), in order.
    pub fn inputs(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| p.mode != Mode::Out)
    }

    /// Checks a call's arguments and returns the values the argument payload carries.
    ///
    /// `args` are the `In` and `InOut` arguments in order, or every parameter in order (the
    /// `Out` ones arrays of the declared dtype and shape, Ninf style; they are checked and not
    /// sent). A [`Value::Output`] stands for an `In`/`InOut` value made by another call of
    /// the same transaction (`in_transaction`).
    ///
    /// # Errors
    ///
    /// [`ClientError::WrongArguments`] naming the argument, what was expected and what was
    /// given.
    pub fn check(&self, args: Vec<Value>, in_transaction: bool) -> Result<Vec<Value>, ClientError> {
        let wrong = |problem: String| ClientError::WrongArguments {
            function: self.name.clone(),
            problem,
        };
        let inputs: Vec<&Param> = self.inputs().collect();
        let full = args.len() == self.params.len() && args.len() != inputs.len();
        let slots: Vec<&Param> = if full {
            self.params.iter().collect()
        } else {
            inputs
        };
        if args.len() != slots.len() {
            return Err(wrong(self.count_message(args.len())));
        }
        let mut ints: HashMap<&str, i64> = HashMap::new();
        for (p, v) in slots.iter().zip(&args) {
            if let Value::Output(_) = v {
                if !in_transaction {
                    return Err(wrong(format!("argument {} is another call's output; that only works within a transaction (pass its result)", p.name)));
                }
                if p.mode == Mode::Out {
                    return Err(wrong(format!(
                        "argument {} is an output buffer; a call's result cannot stand for it",
                        p.name
                    )));
                }
                continue;
            }
            if p.type_name != "array" {
                if let Some(problem) = scalar_problem(&p.type_name, v) {
                    return Err(wrong(format!("argument {} {problem}", p.name)));
                }
                if let (Value::Int(i), "int") = (v, p.type_name.as_str()) {
                    ints.insert(&p.name, *i);
                }
            }
        }
        for (p, v) in slots.iter().zip(&args) {
            if p.type_name == "array" && !matches!(v, Value::Output(_)) {
                self.check_array(p, v, &ints).map_err(wrong)?;
            }
        }
        Ok(slots
            .iter()
            .zip(args)
            .filter(|(p, _)| p.mode != Mode::Out)
            .map(|(_, v)| v)
            .collect())
    }

    fn count_message(&self, n: usize) -> String {
        let names = |ps: &[&Param]| {
            ps.iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let inputs: Vec<&Param> = self.inputs().collect();
        let all: Vec<&Param> = self.params.iter().collect();
        let word = |k: usize| if k == 1 { "argument" } else { "arguments" };
        if inputs.len() == all.len() {
            format!(
                "takes {} {} ({}), got {n}",
                all.len(),
                word(all.len()),
                names(&all)
            )
        } else {
            format!(
                "takes {} {} ({}) or {} with the outputs ({}), got {n}",
                inputs.len(),
                word(inputs.len()),
                names(&inputs),
                all.len(),
                names(&all)
            )
        }
    }

    fn check_array(&self, p: &Param, v: &Value, ints: &HashMap<&str, i64>) -> Result<(), String> {
        let want = p.dtype.as_deref().unwrap_or("any");
        let Value::Array(a) = v else {
            return Err(format!(
                "argument {} is {}, expected an array of {want}",
                p.name,
                v.describe()
            ));
        };
        if p.dtype.is_some() && a.dtype().name() != Some(want) {
            let got = a.dtype().name().unwrap_or(a.dtype().to_wire());
            return Err(format!(
                "argument {} has dtype {got}, expected {want}",
                p.name
            ));
        }
        let Some(shape) = &p.shape else { return Ok(()) };
        let dims = eval_shape(shape, ints)
            .map_err(|e| format!("the shape of {} ({shape}): {e}", p.name))?;
        if dims.iter().any(|d| d.is_some_and(|d| d < 0)) {
            return Err(format!(
                "the shape of {} ({shape}) gives a negative size",
                p.name
            ));
        }
        let fits = dims.len() == a.shape().len()
            && dims
                .iter()
                .zip(a.shape())
                .all(|(e, &s)| e.is_none_or(|e| e as usize == s));
        if fits {
            return Ok(());
        }
        let values: Vec<String> = dims
            .iter()
            .map(|d| d.map_or("*".into(), |d| d.to_string()))
            .collect();
        Err(format!(
            "argument {} has shape {}, expected ({shape}) = ({})",
            p.name,
            shape_text(a.shape()),
            values.join(", ")
        ))
    }
}

/// Why `v` is not an acceptable scalar of `type_name`, as the Python client says it.
fn scalar_problem(type_name: &str, v: &Value) -> Option<String> {
    let ok = match type_name {
        "int" => matches!(v, Value::Int(_)),
        "float" | "complex" => matches!(v, Value::Int(_) | Value::Float(_)),
        "bool" => matches!(v, Value::Bool(_)),
        "str" => matches!(v, Value::Str(_)),
        "bytes" => matches!(v, Value::Bytes(_)),
        "any" => true,
        other => return Some(format!("has the interface's unknown type {other:?}")),
    };
    (!ok).then(|| format!("has type {}, expected {type_name}", v.describe()))
}

fn param(v: Value) -> Result<Param, String> {
    let Value::Map(entries) = v else {
        return Err(format!("a parameter is {}, expected a map", v.describe()));
    };
    let mut p = Param {
        name: String::new(),
        mode: Mode::In,
        type_name: "any".into(),
        dtype: None,
        shape: None,
    };
    for (k, v) in entries {
        match (k.as_str(), v) {
            (Some("name"), Value::Str(s)) => p.name = s,
            (Some("mode"), Value::Str(s)) => {
                p.mode = match s.as_str() {
                    "in" => Mode::In,
                    "out" => Mode::Out,
                    "inout" => Mode::InOut,
                    other => return Err(format!("unknown mode {other:?}")),
                }
            }
            (Some("type"), Value::Str(s)) => p.type_name = s,
            (Some("dtype"), Value::Str(s)) => p.dtype = Some(s),
            (Some("shape"), Value::Str(s)) => p.shape = Some(s),
            _ => {}
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::NdArray;

    pub(crate) fn dmmul() -> Interface {
        let arr = |name: &str, mode| Param {
            name: name.into(),
            mode,
            type_name: "array".into(),
            dtype: Some("float64".into()),
            shape: Some("n, n".into()),
        };
        Interface {
            name: "dmmul".into(),
            version: "1".into(),
            doc: String::new(),
            params: vec![
                Param {
                    name: "n".into(),
                    mode: Mode::In,
                    type_name: "int".into(),
                    dtype: None,
                    shape: None,
                },
                arr("A", Mode::In),
                arr("B", Mode::In),
                arr("C", Mode::Out),
            ],
            returns: None,
            servers: 1,
        }
    }

    #[test]
    fn a_wrong_shape_names_the_argument_and_the_expected_shape() {
        let a = NdArray::from_f64(&[2, 2], &[0.0; 4]).unwrap();
        let b = NdArray::from_f64(&[2, 3], &[0.0; 6]).unwrap();
        let err = dmmul()
            .check(vec![2i64.into(), a.into(), b.into()], false)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "dmmul: argument B has shape (2, 3), expected (n, n) = (2, 2)"
        );
    }

    #[test]
    fn count_and_type_mistakes_are_named() {
        let err = dmmul().check(vec![2i64.into()], false).unwrap_err();
        assert!(
            err.to_string()
                .contains("takes 3 arguments (n, A, B) or 4 with the outputs"),
            "{err}"
        );
        let a = NdArray::from_f32(&[2, 2], &[0.0; 4]).unwrap();
        let err = dmmul()
            .check(vec![2.5f64.into(), a.clone().into(), a.into()], false)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "dmmul: argument n has type float, expected int"
        );
    }

    #[test]
    fn out_buffers_passed_ninf_style_are_checked_and_not_sent() {
        let a = NdArray::from_f64(&[2, 2], &[0.0; 4]).unwrap();
        let sent = dmmul()
            .check(
                vec![2i64.into(), a.clone().into(), a.clone().into(), a.into()],
                false,
            )
            .unwrap();
        assert_eq!(sent.len(), 3);
        assert_eq!(
            dmmul().to_string(),
            "dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]"
        );
    }
}
