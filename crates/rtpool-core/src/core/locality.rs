//! Data locality: a task whose arguments are results kept on one worker runs there when that
//! worker can take it now (package option `near`, set by the client for kept arguments of
//! 64 KiB or more: `docs/data.md`).
//!
//! The rule is the cheap half of the Ninf metaserver's throughput-aware placement with data
//! sizes: moving the data costs its size over the network, waiting for the worker that holds
//! it costs an unknown queue; so the holder is preferred only while it has a free credit (it
//! will be offered the task in this same dispatch round), and any worker takes the task
//! otherwise. The client measures the sizes; the core only knows which worker to prefer.

use super::Core;
use crate::ids::{TaskId, WorkerId};

impl Core {
    /// Whether `worker` should pass over queued task `id`: its package prefers another
    /// worker that is connected and can take a task now.
    pub(super) fn prefers_other(&self, id: TaskId, worker: WorkerId) -> bool {
        let Some((slot, near)) = self
            .tasks
            .get(id.0)
            .and_then(|t| Some((t.package, self.packages.get(t.package)?.opts.near)))
            .filter(|&(_, near)| near != 0 && near != worker.0)
        else {
            return false;
        };
        // A package the master held for its input (held.rs) was released by the result of the
        // worker that keeps the input, a moment before that worker's PULL: it waits for that
        // PULL rather than move the value.
        let held = self.held.contains_key(&slot);
        self.workers
            .get(&WorkerId(near))
            .is_some_and(|w| w.is_hungry() || (held && w.is_about_to_pull()))
    }
}
