//! [`ReadyQueue`]: the tasks waiting for a worker, by priority, FIFO within a priority.
//!
//! It holds task ids only; the task table says whether an entry is still live. Cancelling a
//! queued task does not search the queue: the core frees the task and calls
//! [`ReadyQueue::forget_one`], which leaves a tombstone (the id, now stale) that [`ReadyQueue::pop`]
//! skips later. So cancel is O(1) per task, and the count of live entries stays exact. Tombstones
//! are purged by [`ReadyQueue::compact`] once they outnumber the live entries, which keeps memory
//! bounded by O(live) at an amortised O(1) per cancel.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use crate::ids::TaskId;

/// Priority buckets (highest first), each a FIFO of task ids.
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    buckets: BTreeMap<Reverse<i32>, VecDeque<TaskId>>,
    /// Entries that are still queued tasks (exact).
    live: usize,
    /// Entries that are tombstones of cancelled tasks.
    tombstones: usize,
}

impl ReadyQueue {
    /// Live (not cancelled) queued tasks.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// No live task is queued (tombstones may remain).
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Tombstones not yet skipped or purged.
    pub(crate) fn tombstones(&self) -> usize {
        self.tombstones
    }

    /// Queues a new task behind the others of its priority.
    pub(crate) fn push_back(&mut self, priority: i32, task: TaskId) {
        self.buckets
            .entry(Reverse(priority))
            .or_default()
            .push_back(task);
        self.live += 1;
    }

    /// Queues a task ahead of the others of its priority (returned or requeued work, which has
    /// waited longest).
    pub(crate) fn push_front(&mut self, priority: i32, task: TaskId) {
        self.buckets
            .entry(Reverse(priority))
            .or_default()
            .push_front(task);
        self.live += 1;
    }

    /// Records that one queued task left the queue without being popped (it was cancelled and
    /// freed, so its entry is now a tombstone).
    ///
    /// # Panics
    ///
    /// If no live task is queued: the caller's bookkeeping is broken.
    pub(crate) fn forget_one(&mut self) {
        assert!(self.live > 0, "ready queue: forget_one with no live entry");
        self.live -= 1;
        self.tombstones += 1;
    }

    /// Takes the first live task: highest priority, oldest first. `is_live` tells a queued task
    /// from a tombstone. Cost: O(log priorities + tombstones skipped).
    pub(crate) fn pop(&mut self, mut is_live: impl FnMut(TaskId) -> bool) -> Option<TaskId> {
        while self.live > 0 {
            let mut bucket = self.buckets.first_entry()?;
            let Some(task) = bucket.get_mut().pop_front() else {
                bucket.remove();
                continue;
            };
            if bucket.get().is_empty() {
                bucket.remove();
            }
            if is_live(task) {
                self.live -= 1;
                return Some(task);
            }
            self.tombstones -= 1;
        }
        None
    }

    /// Drops every tombstone. O(entries): call it when tombstones outnumber live entries, so its
    /// cost is paid for by the cancels that made them.
    pub(crate) fn compact(&mut self, mut is_live: impl FnMut(TaskId) -> bool) {
        self.buckets.retain(|_, bucket| {
            bucket.retain(|&t| is_live(t));
            !bucket.is_empty()
        });
        self.tombstones = 0;
    }

    /// Every entry, tombstones included, as `(priority, task)` in pop order. For invariant
    /// checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i32, TaskId)> + '_ {
        self.buckets
            .iter()
            .flat_map(|(p, bucket)| bucket.iter().map(move |&t| (p.0, t)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn drain(q: &mut ReadyQueue, dead: &HashSet<u64>) -> Vec<u64> {
        std::iter::from_fn(|| q.pop(|t| !dead.contains(&t.0)))
            .map(|t| t.0)
            .collect()
    }

    #[test]
    fn higher_priority_first_fifo_within() {
        let mut q = ReadyQueue::default();
        q.push_back(0, TaskId(1));
        q.push_back(5, TaskId(2));
        q.push_back(0, TaskId(3));
        q.push_back(-3, TaskId(4));
        q.push_back(5, TaskId(5));
        assert_eq!(q.len(), 5);
        assert_eq!(drain(&mut q, &HashSet::new()), vec![2, 5, 1, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.iter().count(), 0, "empty buckets are removed");
    }

    #[test]
    fn push_front_goes_ahead_of_its_priority_only() {
        let mut q = ReadyQueue::default();
        q.push_back(1, TaskId(1));
        q.push_back(0, TaskId(2));
        q.push_front(0, TaskId(3));
        assert_eq!(drain(&mut q, &HashSet::new()), vec![1, 3, 2]);
    }

    #[test]
    fn tombstones_are_skipped_and_count_stays_exact() {
        let mut q = ReadyQueue::default();
        for t in 1..=4 {
            q.push_back(0, TaskId(t));
        }
        let dead: HashSet<u64> = [1, 3].into();
        q.forget_one();
        q.forget_one();
        assert_eq!(q.len(), 2);
        assert_eq!(q.tombstones(), 2);
        assert_eq!(drain(&mut q, &dead), vec![2, 4]);
        assert_eq!(q.tombstones(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn pop_stops_at_last_live_entry_leaving_trailing_tombstones() {
        let mut q = ReadyQueue::default();
        q.push_back(0, TaskId(1));
        q.push_back(0, TaskId(2));
        q.forget_one();
        let dead: HashSet<u64> = [2].into();
        assert_eq!(q.pop(|t| !dead.contains(&t.0)), Some(TaskId(1)));
        assert_eq!(q.pop(|t| !dead.contains(&t.0)), None);
        assert_eq!(q.tombstones(), 1, "not walked: nothing live to find");
    }

    #[test]
    fn compact_drops_tombstones_and_keeps_order() {
        let mut q = ReadyQueue::default();
        for t in 1u32..=6 {
            q.push_back(i32::from(t % 2 == 0), TaskId(u64::from(t)));
        }
        let dead: HashSet<u64> = [2, 3, 6].into();
        for _ in 0..3 {
            q.forget_one();
        }
        q.compact(|t| !dead.contains(&t.0));
        assert_eq!(q.tombstones(), 0);
        assert_eq!(q.iter().count(), 3);
        assert_eq!(drain(&mut q, &dead), vec![4, 1, 5]);
    }

    #[test]
    #[should_panic(expected = "forget_one with no live entry")]
    fn forget_on_empty_queue_panics() {
        ReadyQueue::default().forget_one();
    }
}
