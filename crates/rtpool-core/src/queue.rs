//! [`ReadyQueue`]: the tasks waiting for a worker.
//!
//! Three levels, each O(1) or O(log n) per task:
//!
//! 1. **Priority classes**, highest first.
//! 2. Within a class, **users take turns** (round robin, one task per turn), so one user's flood
//!    of tasks delays another user's task by at most one task per other user with work queued:
//!    no user starves.
//! 3. Within a user, **packages by earliest deadline** (EDF), then packages without a deadline
//!    in submission order; within a package, tasks in index order (returned and requeued tasks
//!    go to the front of their package).
//!
//! It holds task ids only; the task table says whether an entry is still live. Cancelling a
//! queued task does not search the queue: the core frees the task and calls
//! [`ReadyQueue::forget_one`], which leaves a tombstone (the id, now stale) that
//! [`ReadyQueue::pop`] skips later. A package whose last live entry goes is dropped from the
//! queue with its tombstones, and a package whose tombstones outnumber its live entries is
//! compacted, so memory stays O(live entries) at an amortised O(1) per cancel.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::ids::{TaskId, UserId};

/// Where a package's tasks queue: the class, the user, and the EDF order within the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueKey {
    pub(crate) priority: i32,
    pub(crate) user: UserId,
    /// Absolute deadline in nanoseconds, `u64::MAX` without one.
    pub(crate) deadline: u64,
    /// Package submission order (breaks deadline ties, orders packages without a deadline).
    pub(crate) seq: u64,
}

impl QueueKey {
    fn order(&self) -> (u64, u64) {
        (self.deadline, self.seq)
    }
}

/// One package's queued tasks.
#[derive(Debug)]
struct PackageQueue {
    key: QueueKey,
    tasks: VecDeque<TaskId>,
    /// Entries of `tasks` that are live queued tasks.
    live: usize,
    /// Estimated execution time of each task, microseconds (for the class's work sum).
    est_us: u64,
}

/// One user's packages with queued tasks, in EDF order.
#[derive(Debug, Default)]
struct UserQueue {
    packages: BTreeMap<(u64, u64), u64>,
}

/// One priority class.
#[derive(Debug, Default)]
struct Class {
    users: HashMap<UserId, UserQueue>,
    /// Users with queued tasks, in turn order (each appears once).
    turns: VecDeque<UserId>,
    /// Estimated work of the class's live entries, microseconds of one slot.
    work_us: u64,
}

/// Priority classes (highest first) of users (round robin) of packages (EDF) of tasks (FIFO).
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    classes: BTreeMap<Reverse<i32>, Class>,
    /// Package slab key to its queued tasks.
    packages: HashMap<u64, PackageQueue>,
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

    /// Estimated work queued at priority `priority` or higher, microseconds of one slot.
    /// O(priority classes).
    pub(crate) fn work_at_or_above(&self, priority: i32) -> u64 {
        self.classes
            .range(..=Reverse(priority))
            .map(|(_, c)| c.work_us)
            .sum()
    }

    /// Queues a task of package `slot` behind the others of its package.
    pub(crate) fn push_back(&mut self, slot: u64, key: QueueKey, est_us: u64, task: TaskId) {
        self.package_entry(slot, key, est_us).push_back(task);
    }

    /// Queues a task of package `slot` ahead of the others of its package (returned or
    /// requeued work, which has waited longest).
    pub(crate) fn push_front(&mut self, slot: u64, key: QueueKey, est_us: u64, task: TaskId) {
        self.package_entry(slot, key, est_us).push_front(task);
    }

    /// The package's deque, entered in its user and class if it had no live entry; counts one
    /// more live entry.
    fn package_entry(&mut self, slot: u64, key: QueueKey, est_us: u64) -> &mut VecDeque<TaskId> {
        let class = self.classes.entry(Reverse(key.priority)).or_default();
        class.work_us = class.work_us.saturating_add(est_us);
        self.live += 1;
        let pq = self.packages.entry(slot).or_insert_with(|| PackageQueue {
            key,
            tasks: VecDeque::new(),
            live: 0,
            est_us,
        });
        pq.live += 1;
        if pq.live == 1 {
            let user = class.users.entry(key.user).or_insert_with(|| {
                class.turns.push_back(key.user);
                UserQueue::default()
            });
            user.packages.insert(key.order(), slot);
        }
        &mut pq.tasks
    }

    /// Records that one queued task of package `slot` left the queue without being popped (it
    /// was cancelled or finished by the master, and is no longer `Queued`), so its entry is now
    /// a tombstone.
    ///
    /// # Panics
    ///
    /// If the package has no live entry: the caller's bookkeeping is broken.
    pub(crate) fn forget_one(&mut self, slot: u64) {
        let pq = self
            .packages
            .get_mut(&slot)
            .filter(|pq| pq.live > 0)
            .unwrap_or_else(|| panic!("ready queue: forget_one of slot {slot} with no live entry"));
        pq.live -= 1;
        self.live -= 1;
        self.tombstones += 1;
        let (key, est_us, now_empty) = (pq.key, pq.est_us, pq.live == 0);
        let class = self
            .classes
            .get_mut(&Reverse(key.priority))
            .expect("class of a queued package");
        class.work_us = class.work_us.saturating_sub(est_us);
        if now_empty {
            self.drop_package(slot);
        }
    }

    /// Removes a package with no live entry, with its tombstones. Its user keeps its turn
    /// (and its entry, even with no package left) until the turn comes up in [`Self::pop`], so
    /// a user never holds two turns however often its packages come and go.
    fn drop_package(&mut self, slot: u64) {
        let pq = self
            .packages
            .remove(&slot)
            .expect("drop of an unqueued package");
        debug_assert_eq!(pq.live, 0);
        self.tombstones -= pq.tasks.len();
        let user = self
            .classes
            .get_mut(&Reverse(pq.key.priority))
            .and_then(|c| c.users.get_mut(&pq.key.user))
            .expect("user of a queued package");
        user.packages.remove(&pq.key.order());
    }

    /// Takes the next live task: highest class; in it, the user whose turn it is; of that
    /// user, the package with the earliest deadline; of that package, the front task. `is_live`
    /// tells a queued task from a tombstone. Returns the task and its package's slab key.
    /// Cost: O(log classes + log packages of the user + tombstones skipped + users whose
    /// packages all went since their last turn).
    pub(crate) fn pop(&mut self, mut is_live: impl FnMut(TaskId) -> bool) -> Option<(TaskId, u64)> {
        while self.live > 0 {
            let mut class_entry = self.classes.first_entry()?;
            let class = class_entry.get_mut();
            let Some(user_id) = class.turns.pop_front() else {
                class_entry.remove();
                continue;
            };
            let user = class.users.get(&user_id).expect("a turn names a user");
            let Some((_, &slot)) = user.packages.first_key_value() else {
                // Its packages all went (cancelled) since its last turn.
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    class_entry.remove();
                }
                continue;
            };
            let pq = self.packages.get_mut(&slot).expect("queued package");
            let task = loop {
                let task = pq
                    .tasks
                    .pop_front()
                    .expect("a queued package has a live entry");
                if is_live(task) {
                    break task;
                }
                self.tombstones -= 1;
            };
            pq.live -= 1;
            self.live -= 1;
            class.work_us = class.work_us.saturating_sub(pq.est_us);
            let package_done = pq.live == 0;
            let user_done = package_done && user.packages.len() == 1;
            if user_done {
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    class_entry.remove();
                }
            } else {
                class.turns.push_back(user_id);
            }
            if package_done {
                let pq = self.packages.remove(&slot).expect("just popped from it");
                self.tombstones -= pq.tasks.len();
                if !user_done {
                    self.classes
                        .get_mut(&Reverse(pq.key.priority))
                        .and_then(|c| c.users.get_mut(&user_id))
                        .expect("user keeps its entry")
                        .packages
                        .remove(&pq.key.order());
                }
            }
            return Some((task, slot));
        }
        None
    }

    /// Drops the tombstones of packages where they outnumber the live entries. O(entries of
    /// those packages): call it when tombstones outnumber live entries overall, so its cost is
    /// paid for by the cancels that made them.
    pub(crate) fn compact(&mut self, mut is_live: impl FnMut(TaskId) -> bool) {
        for pq in self.packages.values_mut() {
            if pq.tasks.len() > 2 * pq.live {
                pq.tasks.retain(|&t| is_live(t));
            }
        }
        self.tombstones = self
            .packages
            .values()
            .map(|pq| pq.tasks.len())
            .sum::<usize>()
            - self.live;
    }

    /// Every entry, tombstones included, as `(package slot, key, task)`. For invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, QueueKey, TaskId)> + '_ {
        self.packages
            .iter()
            .flat_map(|(&slot, pq)| pq.tasks.iter().map(move |&t| (slot, pq.key, t)))
    }

    /// Checks the queue's own structure (counts, turns, classes). For invariant checks.
    pub(crate) fn check(&self) {
        let live: usize = self.packages.values().map(|pq| pq.live).sum();
        assert_eq!(live, self.live, "queue live count");
        let entries: usize = self.packages.values().map(|pq| pq.tasks.len()).sum();
        assert_eq!(entries - live, self.tombstones, "queue tombstone count");
        let mut listed = 0;
        for (prio, class) in &self.classes {
            assert!(!class.users.is_empty(), "empty class {}", prio.0);
            assert_eq!(
                class.turns.len(),
                class.users.len(),
                "class {} turns",
                prio.0
            );
            for (user, uq) in &class.users {
                let turns = class.turns.iter().filter(|u| *u == user).count();
                assert_eq!(turns, 1, "{user} has {turns} turns");
                for (order, slot) in &uq.packages {
                    let pq = &self.packages[slot];
                    assert!(pq.live > 0, "slot {slot} queued with no live entry");
                    assert_eq!(pq.key.order(), *order);
                    assert_eq!(pq.key.user, *user);
                    assert_eq!(pq.key.priority, prio.0);
                    listed += 1;
                }
            }
            let work: u64 = self
                .packages
                .values()
                .filter(|pq| pq.key.priority == prio.0)
                .map(|pq| pq.est_us * pq.live as u64)
                .sum();
            assert_eq!(work, class.work_us, "class {} work sum", prio.0);
        }
        assert_eq!(listed, self.packages.len(), "packages outside their user");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn key(priority: i32, user: u64, deadline: u64, seq: u64) -> QueueKey {
        QueueKey {
            priority,
            user: UserId(user),
            deadline,
            seq,
        }
    }

    fn drain(q: &mut ReadyQueue, dead: &HashSet<u64>) -> Vec<u64> {
        let out = std::iter::from_fn(|| q.pop(|t| !dead.contains(&t.0)))
            .map(|(t, _)| t.0)
            .collect();
        q.check();
        out
    }

    #[test]
    fn higher_priority_first_fifo_within_a_package() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
        q.push_back(2, key(5, 1, u64::MAX, 2), 0, TaskId(2));
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(3));
        q.push_back(3, key(-3, 1, u64::MAX, 3), 0, TaskId(4));
        q.push_back(2, key(5, 1, u64::MAX, 2), 0, TaskId(5));
        q.check();
        assert_eq!(q.len(), 5);
        assert_eq!(drain(&mut q, &HashSet::new()), vec![2, 5, 1, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.iter().count(), 0);
        assert!(q.classes.is_empty(), "empty classes are removed");
    }

    #[test]
    fn submit_and_cancel_churn_does_not_grow_the_turns() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 2, u64::MAX, 1), 0, TaskId(1));
        for slot in 10..1000 {
            q.push_back(slot, key(0, 1, u64::MAX, slot), 0, TaskId(slot));
            q.forget_one(slot);
        }
        q.check();
        assert!(q.classes[&Reverse(0)].turns.len() <= 2);
        assert_eq!(drain(&mut q, &(10..1000).collect()), vec![1]);
        assert!(q.is_empty());
        assert_eq!(q.tombstones(), 0);
    }

    #[test]
    fn earliest_deadline_first_within_a_user() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(10));
        q.push_back(2, key(0, 1, 500, 2), 0, TaskId(20));
        q.push_back(3, key(0, 1, 100, 3), 0, TaskId(30));
        q.push_back(4, key(0, 1, 500, 4), 0, TaskId(40));
        q.push_back(3, key(0, 1, 100, 3), 0, TaskId(31));
        assert_eq!(
            drain(&mut q, &HashSet::new()),
            vec![30, 31, 20, 40, 10],
            "deadline 100, then 500 (submission order), then no deadline"
        );
    }

    #[test]
    fn users_take_turns_within_a_class() {
        let mut q = ReadyQueue::default();
        for t in 0..5 {
            q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(100 + t));
        }
        q.push_back(2, key(0, 2, u64::MAX, 2), 0, TaskId(200));
        q.push_back(3, key(0, 3, 10, 3), 0, TaskId(300));
        q.push_back(3, key(0, 3, 10, 3), 0, TaskId(301));
        assert_eq!(
            drain(&mut q, &HashSet::new()),
            vec![100, 200, 300, 101, 301, 102, 103, 104]
        );
    }

    #[test]
    fn push_front_goes_ahead_within_its_package_only() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(1, 1, u64::MAX, 1), 0, TaskId(1));
        q.push_back(2, key(0, 1, u64::MAX, 2), 0, TaskId(2));
        q.push_front(2, key(0, 1, u64::MAX, 2), 0, TaskId(3));
        assert_eq!(drain(&mut q, &HashSet::new()), vec![1, 3, 2]);
    }

    #[test]
    fn tombstones_are_skipped_and_count_stays_exact() {
        let mut q = ReadyQueue::default();
        for t in 1..=4 {
            q.push_back(7, key(0, 1, u64::MAX, 1), 0, TaskId(t));
        }
        let dead: HashSet<u64> = [1, 3].into();
        q.forget_one(7);
        q.forget_one(7);
        assert_eq!(q.len(), 2);
        assert_eq!(q.tombstones(), 2);
        q.check();
        assert_eq!(drain(&mut q, &dead), vec![2, 4]);
        assert_eq!(q.tombstones(), 0, "the package went with its tombstones");
        assert!(q.is_empty());
    }

    #[test]
    fn forgetting_a_whole_package_drops_it_and_its_user() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(2));
        q.push_back(2, key(0, 2, u64::MAX, 2), 0, TaskId(3));
        q.forget_one(1);
        q.forget_one(1);
        q.check();
        assert_eq!(q.tombstones(), 0);
        let dead: HashSet<u64> = [1, 2].into();
        assert_eq!(drain(&mut q, &dead), vec![3]);
    }

    #[test]
    fn compact_drops_tombstones_and_keeps_order() {
        let mut q = ReadyQueue::default();
        for t in 1u64..=6 {
            q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(t));
        }
        let dead: HashSet<u64> = [2, 3, 6, 5].into();
        for _ in 0..4 {
            q.forget_one(1);
        }
        q.compact(|t| !dead.contains(&t.0));
        q.check();
        assert_eq!(q.tombstones(), 0);
        assert_eq!(q.iter().count(), 2);
        assert_eq!(drain(&mut q, &dead), vec![1, 4]);
    }

    #[test]
    fn work_sums_follow_the_live_entries() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(1));
        q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(2));
        q.push_back(2, key(5, 1, u64::MAX, 2), 7, TaskId(3));
        assert_eq!(q.work_at_or_above(0), 207);
        assert_eq!(q.work_at_or_above(5), 7);
        assert_eq!(q.work_at_or_above(6), 0);
        q.forget_one(1);
        q.check();
        assert_eq!(q.work_at_or_above(0), 107);
        q.pop(|t| t.0 != 1);
        assert_eq!(q.work_at_or_above(0), 100);
        q.check();
    }

    #[test]
    #[should_panic(expected = "forget_one of slot 9 with no live entry")]
    fn forget_on_empty_queue_panics() {
        ReadyQueue::default().forget_one(9);
    }
}
