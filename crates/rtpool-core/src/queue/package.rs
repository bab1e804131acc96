//! A package's queued tasks: the doubly linked list of [`Node`]s (in the queue's slab) that
//! holds them front first ([`PackageQueue`]), and the store of every package's list, dense or
//! hashed ([`PackageQueues`]).

use super::QueueKey;
use crate::ids::TaskId;
use crate::table::{DenseMap, IdMap};

/// One queued task: a link of its package's list.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub(super) task: TaskId,
    /// Slab key of the node ahead of it in its package, if any.
    pub(super) prev: Option<u64>,
    /// Slab key of the node behind it, if any.
    pub(super) next: Option<u64>,
}

/// One package's queued tasks: the ends of its list of nodes, front first.
#[derive(Debug)]
pub(super) struct PackageQueue {
    pub(super) key: QueueKey,
    pub(super) head: Option<u64>,
    pub(super) tail: Option<u64>,
    /// Nodes in the list.
    pub(super) len: usize,
    /// Estimated execution time of each task, microseconds (for the class's work sum).
    pub(super) est_us: u64,
}

impl PackageQueue {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Package slab key to its queued tasks: stored at the key's slot index for the core's ready
/// queue, which most packages enter (no hash map whose resize touches fresh memory in the
/// middle of a submission); a hash map for a service's queue, which holds the few packages
/// that call its function (a dense store would span every package slot).
#[derive(Debug)]
pub(super) enum PackageQueues {
    Dense(DenseMap<PackageQueue>),
    Sparse(IdMap<u64, PackageQueue>),
}

impl Default for PackageQueues {
    fn default() -> Self {
        Self::Sparse(IdMap::default())
    }
}

impl PackageQueues {
    pub(super) fn get(&self, slot: u64) -> Option<&PackageQueue> {
        match self {
            Self::Dense(m) => m.get(slot),
            Self::Sparse(m) => m.get(&slot),
        }
    }

    pub(super) fn get_mut(&mut self, slot: u64) -> Option<&mut PackageQueue> {
        match self {
            Self::Dense(m) => m.get_mut(slot),
            Self::Sparse(m) => m.get_mut(&slot),
        }
    }

    pub(super) fn get_or_insert_with(
        &mut self,
        slot: u64,
        make: impl FnOnce() -> PackageQueue,
    ) -> &mut PackageQueue {
        match self {
            Self::Dense(m) => m.get_or_insert_with(slot, make),
            Self::Sparse(m) => m.entry(slot).or_insert_with(make),
        }
    }

    pub(super) fn remove(&mut self, slot: u64) -> Option<PackageQueue> {
        match self {
            Self::Dense(m) => m.remove(slot),
            Self::Sparse(m) => m.remove(&slot),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::Dense(m) => m.len(),
            Self::Sparse(m) => m.len(),
        }
    }

    pub(super) fn prepare(&mut self, max_slots: usize) -> bool {
        match self {
            Self::Dense(m) => m.prepare(max_slots),
            Self::Sparse(_) => false,
        }
    }
}
