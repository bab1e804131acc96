//! [`Worker`]: one worker connection's credits, in-flight tasks and code cache.

use std::collections::HashSet;

use crate::ids::{FnHash, TaskId};

/// One worker.
#[derive(Debug)]
pub(crate) struct Worker {
    /// Tasks it runs at once (informational: credits are what limit assignment).
    pub(crate) slots: u32,
    /// Tasks it may still be sent. Always 0 once draining.
    pub(crate) credits: u32,
    /// Asked for no more work (graceful shutdown).
    pub(crate) draining: bool,
    /// Tasks it holds: `Running` or `Cancelled` on this worker.
    pub(crate) in_flight: HashSet<TaskId>,
    /// Hashes whose code it was sent (the protocol's per-connection code cache).
    pub(crate) fn_sent: HashSet<FnHash>,
    /// Distinguishes this worker from an earlier one with the same id in the hungry ring.
    pub(crate) epoch: u64,
    /// It has an entry in the hungry ring.
    pub(crate) in_ring: bool,
}

impl Worker {
    /// A new worker with no credits.
    pub(crate) fn new(slots: u32, epoch: u64) -> Self {
        Self {
            slots,
            credits: 0,
            draining: false,
            in_flight: HashSet::new(),
            fn_sent: HashSet::new(),
            epoch,
            in_ring: false,
        }
    }

    /// It may be sent a task now.
    pub(crate) fn is_hungry(&self) -> bool {
        self.credits > 0 && !self.draining
    }
}
