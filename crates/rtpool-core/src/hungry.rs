//! [`HungryRing`]: the workers that have credits and are not draining, in round-robin order.
//!
//! Dispatch takes the worker at the front, gives it one task and puts it at the back if it has
//! credits left, so a batch of tasks is spread over the idle workers instead of filling the first
//! one. Entries are `(worker, epoch)`: an entry whose worker left (or left and came back with the
//! same id, and so a new epoch) is skipped when popped, which keeps worker loss O(1) here; the
//! ring is compacted once such dead entries could outnumber the workers.

use std::collections::VecDeque;

use crate::ids::WorkerId;

/// Round-robin ring of `(worker, epoch)`.
#[derive(Debug, Default)]
pub(crate) struct HungryRing {
    ring: VecDeque<(WorkerId, u64)>,
}

impl HungryRing {
    /// Entries, dead ones included.
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Appends a worker at the back.
    pub(crate) fn push_back(&mut self, worker: WorkerId, epoch: u64) {
        self.ring.push_back((worker, epoch));
    }

    /// Takes the front entry, live or dead.
    pub(crate) fn pop_front(&mut self) -> Option<(WorkerId, u64)> {
        self.ring.pop_front()
    }

    /// The front entry, live or dead.
    pub(crate) fn front(&self) -> Option<(WorkerId, u64)> {
        self.ring.front().copied()
    }

    /// Keeps only the entries `keep` accepts, in order.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&(WorkerId, u64)) -> bool) {
        self.ring.retain(keep);
    }

    /// Every entry, front first. For invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(WorkerId, u64)> {
        self.ring.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_retain() {
        let mut r = HungryRing::default();
        r.push_back(WorkerId(1), 0);
        r.push_back(WorkerId(2), 1);
        r.push_back(WorkerId(3), 2);
        r.retain(|&(w, _)| w != WorkerId(2));
        assert_eq!(r.len(), 2);
        assert_eq!(r.pop_front(), Some((WorkerId(1), 0)));
        assert_eq!(
            r.iter().copied().collect::<Vec<_>>(),
            vec![(WorkerId(3), 2)]
        );
    }
}
