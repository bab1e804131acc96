//! rtpool-client: call the functions rtpool workers serve by name (grid RPC, `docs/rpc.md`)
//! from Rust, with no stubs: each function's interface (argument modes, dtypes, shapes) is
//! fetched from the master at call time and the arguments are checked against it before
//! anything is sent.
//!
//! Built on `rtpool-proto` (its messages, frames and codec; no second codec). Arguments and
//! results travel in the same wire form the Python client uses, so a Python worker serving
//! `rtpool.lib.linalg` sees numpy arrays and no difference between the clients.
//!
//! * [`Client`] (async, tokio) and [`blocking::Client`] (no runtime needed): connect to an
//!   address list with a token from an argument, `$RTPOOL_TOKEN` or a file, optionally over
//!   TLS with a CA file ([`Config`]); reconnect and re-attach after a lost connection or a
//!   master restart.
//! * [`Client::call`], [`Client::call_async`] ([`CallHandle`], a future), [`wait_any`],
//!   [`wait_all`], [`CallHandle::cancel`], per-call [`CallOptions`] (deadline, priority, time
//!   limit), [`Transaction`]s (a dependency graph of calls in one frame).
//! * [`Value`] and [`NdArray`]: integers, floats, strings, bytes and n-dimensional arrays of
//!   f64/f32/i64/i32 (a slice plus a shape).
//! * [`ClientError`]: typed errors whose messages say what to do.
//!
//! ```
//! use rtpool_client::{encode_args, decode_values, NdArray, Value};
//! // The argument payload of dmmul(2, A, A), byte for byte what the Python client sends:
//! let a = NdArray::from_f64(&[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
//! let payload = encode_args(&[Value::Int(2), a.clone().into(), a.into()], &[]);
//! assert_eq!(payload[0], 0x93); // a msgpack list of 3
//! assert_eq!(decode_values(&payload).unwrap()[0], Value::Int(2));
//! ```

mod call;
mod calls;
mod client;
mod config;
mod decode;
mod driver;
mod error;
mod interface;
mod masters;
mod options;
mod session;
mod shape;
mod tls;
mod transaction;
mod value;

pub mod blocking;

pub use call::{wait_all, wait_any, CallHandle, Outputs};
pub use client::Client;
pub use config::Config;
pub use decode::{decode_error, decode_values};
pub use error::{ClientError, Result};
pub use interface::{Interface, Mode, Param};
pub use options::CallOptions;
pub use transaction::{Transaction, TxCall};
pub use value::{encode_args, Dtype, NdArray, OutputRef, Value};
