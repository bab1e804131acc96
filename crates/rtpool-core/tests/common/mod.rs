//! `TestEnv`: a core, a synthetic clock and builders for the scenario tests.
//!
//! * [`env`]: the core and clock, peers joining and leaving, [`TestEnv::step`];
//! * [`submit`], [`answer`]: what clients and workers send;
//! * [`builders`]: the setups many tests share (`env.new_worker_taking(4)`, `env.tick_after(20)`);
//! * [`spec`]: a package's options, built one by one;
//! * [`actions`], [`expect`]: reading a step's actions, and the assertions made on them.
//!
//! Every step goes through [`TestEnv::step`], which checks the core's invariants afterwards and
//! remembers the current assignment of each task, so tests can say "complete this task" without
//! tracking attempts themselves.

// Each test binary uses a different subset of the helpers.
#![allow(dead_code)]

mod actions;
mod answer;
mod builders;
mod env;
mod expect;
mod spec;
mod submit;

use bytes::Bytes;
use rtpool_core::FnHash;

pub use actions::*;
pub use env::TestEnv;
// Not every test binary uses each of these.
#[allow(unused_imports)]
pub use expect::*;
#[allow(unused_imports)]
pub use spec::{call, calls, Spec};

/// The hash of test function `n`.
pub fn fn_hash(n: u8) -> FnHash {
    FnHash([n; 32])
}

/// The code of test function `n`.
pub fn fn_code(n: u8) -> Bytes {
    Bytes::from(format!("code of function {n}"))
}
