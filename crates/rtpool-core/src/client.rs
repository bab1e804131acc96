//! [`Client`]: one client connection, its user, and the packages attached to it.

use crate::ids::UserId;
use crate::table::{Ahead, IdSet};

/// One client.
#[derive(Debug, Default)]
pub(crate) struct Client {
    pub(crate) user: UserId,
    /// Slab keys of the packages attached to it, so losing the client detaches them without a
    /// scan of all packages.
    pub(crate) packages: IdSet<u64>,
    /// Grows `packages` ahead of need ([`crate::Core::prepare`]).
    pub(crate) ahead: Ahead,
    /// Results sent to it and not yet acknowledged, over its attached packages.
    pub(crate) unacked_results: u64,
    /// Data bytes of those results.
    pub(crate) unacked_bytes: u64,
    /// Told to close for holding too many unacknowledged results (once).
    pub(crate) closing: bool,
}

/// One user: quota and packages.
#[derive(Debug, Default)]
pub(crate) struct User {
    /// Microseconds of compute time left; `None` = unlimited.
    pub(crate) remaining_us: Option<i64>,
    /// Compute time charged since the shell last took it ([`crate::Core::take_usage`]).
    pub(crate) pending_us: u64,
    /// Slab keys of its live packages.
    pub(crate) packages: IdSet<u64>,
    /// Grows `packages` ahead of need ([`crate::Core::prepare`]).
    pub(crate) ahead: Ahead,
    /// Its tasks queued or running (listed tasks, not extra copies), over all its packages.
    pub(crate) queued_tasks: u64,
    /// Argument bytes of those tasks.
    pub(crate) queued_bytes: u64,
}
