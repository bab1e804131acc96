//! [`Worker`]: one worker connection's credits, in-flight tasks and code cache.

use crate::ids::{FnHash, TaskId};
use crate::placement::Link;
use crate::table::Set;

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
    pub(crate) in_flight: Set<TaskId>,
    /// Hashes whose code it was sent (the protocol's per-connection code cache).
    pub(crate) fn_sent: Set<FnHash>,
    /// Distinguishes this worker from an earlier one with the same id in the hungry ring.
    pub(crate) epoch: u64,
    /// It has an entry in the hungry ring.
    pub(crate) in_ring: bool,
    /// Slab keys of the services it serves (grid RPC).
    pub(crate) serves: Vec<u64>,
    /// What was learned of the link to it (placement).
    pub(crate) link: Link,
    /// Moving average of its execution times over each function's mean (`None`: unknown).
    pub(crate) slowness: Option<f64>,
}

impl Worker {
    /// A new worker with no credits.
    pub(crate) fn new(slots: u32, epoch: u64) -> Self {
        Self {
            slots,
            credits: 0,
            draining: false,
            in_flight: Set::default(),
            fn_sent: Set::default(),
            epoch,
            in_ring: false,
            serves: Vec::new(),
            link: Link::default(),
            slowness: None,
        }
    }

    /// It may be sent a task now.
    pub(crate) fn is_hungry(&self) -> bool {
        self.credits > 0 && !self.draining
    }
}
