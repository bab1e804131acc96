//! [`IdBuffers`]: recycled buffers of task ids, made and touched ahead of need.
//!
//! Every package holds two lists of task ids as long as it has tasks: its tasks by index and
//! its unacknowledged results (reserved at the package's size, so a result never pays for
//! copying the ones before it). Allocated fresh for each submission, they were the largest
//! share left of the page faults of a growing submission: new heap memory is touched for the
//! first time by the operation that needs it, a page fault every 4 KiB, tens of microseconds
//! each on a busy VM.
//!
//! So the core keeps them: a buffer's capacity is a power of two (its class); a freed package
//! gives its buffers back; [`IdBuffers::prepare`], called by the shell when it has nothing
//! else to do, makes buffers of the classes in use ahead of need and writes every element
//! (the first touch happens there), a bounded number of ids per call. A submission then takes
//! warm buffers; it allocates only when the spares of its class ran out (a burst larger than
//! the headroom, or the first package of its size).

use crate::ids::TaskId;

/// Classes: capacities 2^0 to 2^32 ids.
const CLASSES: usize = 33;

/// Spare bytes kept ready per class in use: 32 KiB, the lists of 2,048 tasks (two per task),
/// twice what one chunk of the task table holds; at least [`MIN_SPARES`] buffers.
const SPARE_BYTES: usize = 32 << 10;

/// Spare buffers kept ready per class in use, however large.
const MIN_SPARES: usize = 2;

/// Recycled `Vec<TaskId>` buffers by class (see the module doc).
#[derive(Debug)]
pub(crate) struct IdBuffers {
    /// Empty buffers of capacity exactly 2^c, by class c.
    spare: Vec<Vec<Vec<TaskId>>>,
    /// Classes ever taken: the ones [`IdBuffers::prepare`] keeps spares of.
    used: [bool; CLASSES],
    /// The buffer being touched, a bounded share per [`IdBuffers::prepare`] call: its class,
    /// and the buffer filled with placeholder ids up to what was touched so far.
    filling: Option<(usize, Vec<TaskId>)>,
}

impl Default for IdBuffers {
    fn default() -> Self {
        Self {
            spare: (0..CLASSES).map(|_| Vec::new()).collect(),
            used: [false; CLASSES],
            filling: None,
        }
    }
}

/// The class of a buffer for `n` ids: the smallest c with 2^c >= n.
fn class_of(n: usize) -> usize {
    n.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Spare buffers kept ready in class `c`.
fn target(c: usize) -> usize {
    (SPARE_BYTES / (std::mem::size_of::<TaskId>() << c)).max(MIN_SPARES)
}

impl IdBuffers {
    /// An empty buffer with room for at least `n` ids: a spare one if its class has one, else
    /// a fresh allocation. O(1) besides that allocation.
    pub(crate) fn take(&mut self, n: usize) -> Vec<TaskId> {
        let c = class_of(n);
        if c >= CLASSES {
            return Vec::with_capacity(n);
        }
        self.used[c] = true;
        self.spare[c]
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1 << c))
    }

    /// Gives a buffer back: kept (emptied) if its capacity is a class's and that class is
    /// short of spares (up to four times its target), dropped otherwise. O(1) (the ids are
    /// plain numbers: emptying drops nothing).
    pub(crate) fn give(&mut self, mut buffer: Vec<TaskId>) {
        let cap = buffer.capacity();
        if !cap.is_power_of_two() {
            return;
        }
        let c = cap.trailing_zeros() as usize;
        if c < CLASSES && self.spare[c].len() < 4 * target(c) {
            buffer.clear();
            self.spare[c].push(buffer);
        }
    }

    /// Makes spare buffers of the classes in use until each has its target, touching at most
    /// `max_ids` ids (8 bytes each) per call; a large buffer is touched over several calls.
    /// Returns whether more is left to prepare. O(`max_ids`) plus one pass over the classes.
    pub(crate) fn prepare(&mut self, max_ids: usize) -> bool {
        let mut budget = max_ids;
        while budget > 0 {
            let (c, mut buffer) = match self.filling.take() {
                Some(filling) => filling,
                None => match (0..CLASSES).find(|&c| self.is_short(c)) {
                    Some(c) => (c, Vec::with_capacity(1 << c)),
                    None => return false,
                },
            };
            let n = budget.min(buffer.capacity() - buffer.len());
            buffer.extend(std::iter::repeat_n(TaskId(0), n));
            budget -= n;
            if buffer.len() == buffer.capacity() {
                buffer.clear();
                self.spare[c].push(buffer);
            } else {
                self.filling = Some((c, buffer));
            }
        }
        self.filling.is_some() || (0..CLASSES).any(|c| self.is_short(c))
    }

    /// Class `c` is in use and has fewer spares than its target.
    fn is_short(&self, c: usize) -> bool {
        self.used[c] && self.spare[c].len() < target(c)
    }

    /// Spare buffers of the class that holds `n` ids. For tests.
    #[cfg(test)]
    fn spares(&self, n: usize) -> usize {
        self.spare[class_of(n)].len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_are_powers_of_two() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(2), 1);
        assert_eq!(class_of(3), 2);
        assert_eq!(class_of(100), 7);
        assert_eq!(class_of(128), 7);
        assert_eq!(class_of(129), 8);
        assert_eq!(target(7), 32, "32 KiB of 1 KiB buffers");
        assert_eq!(target(20), MIN_SPARES);
    }

    #[test]
    fn prepare_makes_touched_spares_of_the_classes_in_use_only() {
        let mut b = IdBuffers::default();
        assert!(!b.prepare(1 << 20), "nothing in use, nothing to make");
        let first = b.take(100);
        assert!(first.capacity() >= 100 && first.is_empty());
        // 32 buffers of 128 ids, at most 1,000 ids per call: 4,096 ids in 5 calls.
        let mut calls = 1;
        while b.prepare(1_000) {
            calls += 1;
            assert!(calls <= 5, "prepare exceeds its budget or never ends");
        }
        assert_eq!(calls, 5);
        assert_eq!(b.spares(100), 32);
        assert_eq!(b.spares(1_000), 0, "a class never taken gets no spares");
        // A spare is what the next take of its class gets, with no allocation.
        let ptr = b.spare[7].last().map(|v| v.as_ptr());
        let next = b.take(128);
        assert_eq!(Some(next.as_ptr()), ptr);
        assert_eq!(next.capacity(), 128);
        assert!(next.is_empty(), "placeholders never show");
    }

    #[test]
    fn a_large_buffer_is_touched_over_several_calls() {
        let mut b = IdBuffers::default();
        b.take(1 << 20);
        assert!(b.prepare(1 << 16));
        assert_eq!(
            b.spares(1 << 20),
            0,
            "a 2^20-id buffer takes 16 calls of 2^16"
        );
        let mut calls = 2; // the one above, and the last one, which returns false
        while b.prepare(1 << 16) {
            calls += 1;
        }
        assert_eq!(calls, 2 * 16, "two spares of 2^20 ids, 2^16 per call");
        assert_eq!(b.spares(1 << 20), MIN_SPARES);
    }

    #[test]
    fn given_back_buffers_are_reused_and_bounded() {
        let mut b = IdBuffers::default();
        let v: Vec<Vec<TaskId>> = (0..200).map(|_| b.take(100)).collect();
        for mut x in v {
            x.push(TaskId(7));
            b.give(x);
        }
        assert_eq!(b.spares(100), 4 * target(7), "kept up to 4x the target");
        assert!(b.take(100).is_empty(), "given back emptied");
        b.give(Vec::with_capacity(100));
        assert_eq!(
            b.spares(100),
            4 * target(7) - 1,
            "an odd capacity is dropped"
        );
    }

    proptest! {
        /// Whatever the sequence of takes, gives and prepares: every buffer taken holds what
        /// was asked, is empty, and is never handed out twice while held.
        #[test]
        fn takes_gives_and_prepares(ops in proptest::collection::vec((0u8..3, 0usize..3000), 1..200)) {
            let mut b = IdBuffers::default();
            let mut held: Vec<Vec<TaskId>> = Vec::new();
            for (op, n) in ops {
                match op {
                    0 => {
                        let v = b.take(n);
                        prop_assert!(v.capacity() >= n);
                        prop_assert!(v.is_empty());
                        prop_assert!(v.capacity() == 0
                            || held.iter().all(|h| h.capacity() == 0 || h.as_ptr() != v.as_ptr()));
                        held.push(v);
                    }
                    1 if !held.is_empty() => {
                        let mut v = held.swap_remove(n % held.len());
                        v.extend((0..v.capacity().min(5)).map(|i| TaskId(i as u64)));
                        b.give(v);
                    }
                    _ => {
                        b.prepare(n);
                    }
                }
            }
            for c in 0..CLASSES {
                prop_assert!(b.spare[c].iter().all(|v| v.is_empty() && v.capacity() == 1 << c));
                prop_assert!(b.spare[c].len() <= 4 * target(c));
            }
        }
    }
}
