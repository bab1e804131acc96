//! The [`Core`]: tables, ready queue, credits, and the one entry point [`Core::handle`].

use bytes::Bytes;

use crate::event::{Action, Event};
use crate::ids::{FnHash, Instant};

/// Tunables of the core; every field has a sane default.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Largest number of tasks in one package (default 16,777,216).
    pub max_tasks_per_package: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self { max_tasks_per_package: 1 << 24 }
    }
}

/// Gauges and counters for logs, status and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Tasks held (queued, running or waiting for delivery).
    pub tasks: usize,
    /// Packages held.
    pub packages: usize,
    /// Tasks in the ready queue.
    pub queued: usize,
    /// Tasks assigned to workers.
    pub running: usize,
    /// Connected workers.
    pub workers: usize,
    /// Connected clients.
    pub clients: usize,
    /// Function codes held.
    pub functions: usize,
    /// Results delivered since start.
    pub delivered: u64,
    /// Worker results ignored because their task or attempt was no longer assigned there.
    pub stale_results: u64,
}

/// The scheduler state machine.
pub struct Core {
    // implementation: see the module docs
}

impl Core {
    /// An empty core.
    pub fn new(config: CoreConfig) -> Self {
        let _ = config;
        todo!()
    }

    /// Apply one event at time `now`, appending the resulting actions to `out`.
    ///
    /// Bad input from a peer (an unknown task id, a result for a task that is not assigned to
    /// that worker, a package of another client) never panics: it is ignored and counted, or
    /// answered with an action such as [`Action::UnknownPackage`].
    pub fn handle(&mut self, event: Event, now: Instant, out: &mut Vec<Action>) {
        let _ = (event, now, out);
        todo!()
    }

    /// Current gauges and counters.
    pub fn stats(&self) -> CoreStats {
        todo!()
    }

    /// The code stored for `hash`, if a live package uses it.
    pub fn function_code(&self, hash: &FnHash) -> Option<&Bytes> {
        let _ = hash;
        todo!()
    }

    /// Check every internal invariant, panicking with a description of the first broken one.
    /// O(size of the state): for tests only.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        todo!()
    }
}
