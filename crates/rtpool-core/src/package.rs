//! [`Package`]: the tasks one user submitted together, with one function and one priority.
//!
//! A package lives while any of its tasks is queued or running or has a result the client has
//! not acknowledged. Its counters always satisfy `queued + running + done + cancelled ==
//! total`. It is attached to at most one client connection; while detached (its client's
//! connection closed) it keeps running and keeps its results for the result TTL.

use std::collections::VecDeque;

use crate::buffers::IdBuffers;
use crate::event::{PackageCounts, PackageOpts};
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, UserId};

/// One package.
#[derive(Debug)]
pub(crate) struct Package {
    /// Its public id.
    pub(crate) id: PackageId,
    pub(crate) user: UserId,
    /// The attached client, if any.
    pub(crate) client: Option<ClientId>,
    pub(crate) fn_hash: FnHash,
    pub(crate) opts: PackageOpts,
    pub(crate) counts: PackageCounts,
    /// The task id of each index. An id whose task was freed is stale, so a cancel by index
    /// needs no other record of what finished. Taken from the core's [`IdBuffers`] (empty,
    /// with room for every task) and given back when the package is freed.
    pub(crate) tasks: Vec<TaskId>,
    /// Done tasks whose results were sent (or wait for an attach), not yet acknowledged, in
    /// completion order. Its capacity is the package's task count from the start, so it never
    /// grows.
    pub(crate) unacked: VecDeque<TaskId>,
    /// Results acknowledged since the current attachment began.
    pub(crate) acked: u64,
    /// Results sent since the current attachment began.
    pub(crate) sent: u64,
    /// Results sent to the attached client as they came and not yet acknowledged (its share
    /// of the client's `unacked_results`; the bound judges these).
    pub(crate) judged: u64,
    /// Their data bytes (its share of the client's `unacked_bytes`).
    pub(crate) sent_bytes: u64,
    /// Results resent when the client attached and not yet acknowledged: the front of
    /// `unacked`, not judged by the bound (`resent + judged == unacked.len()` while attached).
    pub(crate) resent: u64,
    /// When a detached package expires (its TTL timer), if detached.
    pub(crate) expires: Option<Instant>,
    /// Absolute deadline of its tasks, if it has one.
    pub(crate) deadline: Option<Instant>,
    /// Its deadline timer is armed (`on_miss = drop`, tasks still unfinished).
    pub(crate) deadline_armed: bool,
    /// Core-wide submission order: EDF tie-break, FIFO among packages without a deadline.
    pub(crate) seq: u64,
    /// Estimated execution time of one task when it was submitted, microseconds (0: unknown);
    /// the queue's work sums use it.
    pub(crate) est_us: u64,
    /// A package of calls of named functions (no code of its own).
    pub(crate) calls: bool,
    /// Its resource class (slab key), when it asks for resources or labels: its tasks queue
    /// there, not in the core's queue.
    pub(crate) class: Option<u64>,
}

impl Package {
    /// A package of `total` queued tasks; the caller fills in their ids. Its two lists of ids
    /// come from `buffers` (see [`Package::into_buffers`]).
    pub(crate) fn new(
        id: PackageId,
        user: UserId,
        client: Option<ClientId>,
        fn_hash: FnHash,
        opts: PackageOpts,
        total: u32,
        buffers: &mut IdBuffers,
    ) -> Self {
        let counts = PackageCounts {
            total,
            queued: total,
            ..PackageCounts::default()
        };
        Self {
            id,
            user,
            client,
            fn_hash,
            opts,
            counts,
            tasks: buffers.take(total as usize),
            // At most one entry per task: reserved now, so that a result never pays for copying
            // the results before it (a doubling VecDeque would, in one scheduler operation, at
            // a package's 2^k-th result). A Vec becomes a VecDeque in place.
            unacked: VecDeque::from(buffers.take(total as usize)),
            acked: 0,
            sent: 0,
            judged: 0,
            sent_bytes: 0,
            resent: 0,
            expires: None,
            deadline: None,
            deadline_armed: false,
            seq: 0,
            est_us: 0,
            calls: false,
            class: None,
        }
    }

    /// Gives the package's two lists of ids back to `buffers`, for the next package.
    pub(crate) fn into_buffers(self, buffers: &mut IdBuffers) {
        let mut unacked = self.unacked;
        unacked.clear();
        buffers.give(self.tasks);
        buffers.give(Vec::from(unacked));
    }

    /// No task is queued or running, and every result was acknowledged.
    pub(crate) fn is_finished(&self) -> bool {
        self.counts.queued == 0 && self.counts.running == 0 && self.unacked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unacked_results_never_reallocate() {
        let total = 100_000;
        let mut p = Package::new(
            PackageId(1),
            UserId(1),
            None,
            FnHash([0; 32]),
            PackageOpts::default(),
            total,
            &mut IdBuffers::default(),
        );
        let reserved = p.unacked.capacity();
        assert!(reserved >= total as usize);
        for i in 0..u64::from(total) {
            p.unacked.push_back(TaskId(i));
            if i % 3 == 0 {
                p.unacked.pop_front();
            }
        }
        assert_eq!(p.unacked.capacity(), reserved, "unacked grew (and copied)");
    }
}
