//! [`Package`]: the tasks one client submitted together, with one function and one priority.
//!
//! A package lives while any of its tasks is queued or running. Its counters always satisfy
//! `queued + running + done + cancelled == total`, and it is freed (releasing its function) the
//! moment `done + cancelled == total`.

use crate::event::{PackageCounts, PackageOpts};
use crate::ids::{ClientId, FnHash, TaskId};

/// One package.
#[derive(Debug)]
pub(crate) struct Package {
    pub(crate) client: ClientId,
    pub(crate) fn_hash: FnHash,
    pub(crate) opts: PackageOpts,
    pub(crate) counts: PackageCounts,
    /// The task id of each index. An id whose task was freed (done or cancelled) is stale, so
    /// a cancel by index needs no other record of what finished.
    pub(crate) tasks: Vec<TaskId>,
}

impl Package {
    /// A package of `total` queued tasks; the caller fills in their ids.
    pub(crate) fn new(client: ClientId, fn_hash: FnHash, opts: PackageOpts, total: u32) -> Self {
        let counts = PackageCounts {
            total,
            queued: total,
            ..PackageCounts::default()
        };
        Self {
            client,
            fn_hash,
            opts,
            counts,
            tasks: Vec::new(),
        }
    }

    /// No task is queued or running any more.
    pub(crate) fn is_finished(&self) -> bool {
        self.counts.queued == 0 && self.counts.running == 0
    }
}
