//! Identifier newtypes and the core's notion of time.

use std::fmt;

/// A point on the master's monotonic clock, in nanoseconds since an arbitrary origin.
///
/// The core never reads a clock: the shell passes `now` into every call, and tests pass
/// synthetic values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// Microseconds from `earlier` to `self`, saturating at 0.
    pub fn micros_since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000
    }
}

/// A client connection, as numbered by the shell (its session id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// A worker connection, as numbered by the shell (its session id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

/// What a worker connection runs on, stable across its reconnects and its process's restarts:
/// the shell's keyed hash of `HELLO.identity` (or of the session, for a peer that sends none).
/// What the core learns of a worker's speed (its pace, for hedging) is kept under it, so a
/// supervised worker whose process was replaced (after an abort killed its task) is still
/// known as slow or fast when it reconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey(pub u64);

/// A user (interned by the shell from the token's user name); quotas and idempotency keys are
/// per user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct UserId(pub u64);

/// A task: slab index in the low 32 bits, slot generation in the high 32 bits, so an id from a
/// freed and reused slot is recognised as stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

/// A package, numbered by the shell (from 1, never reused: the journal keeps the counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackageId(pub u64);

/// SHA-256 of a function's code (verified by the shell before it reaches the core).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FnHash(pub [u8; 32]);

impl fmt::Debug for FnHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

macro_rules! display_id {
    ($($t:ident => $p:literal),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($p, "{}"), self.0)
            }
        }
    )*};
}
display_id!(ClientId => "client-", WorkerId => "worker-", TaskId => "task-", PackageId => "package-", UserId => "user-");
