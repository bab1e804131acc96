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
//! Within a package, entries are keyed by a position: a push to the back takes the next higher
//! one, a push to the front the next lower one. The task remembers its position, so taking a
//! cancelled (or master-finished) task out is an exact O(log n) removal: the queue holds only
//! queued tasks, and no operation ever walks past dead entries or compacts.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use crate::ids::{TaskId, UserId};
use crate::table::IdMap;

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

/// One package's queued tasks, by position.
#[derive(Debug)]
struct PackageQueue {
    key: QueueKey,
    tasks: BTreeMap<i64, TaskId>,
    /// Position of the next push to the back.
    next_back: i64,
    /// Position of the last push to the front.
    next_front: i64,
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
    users: IdMap<UserId, UserQueue>,
    /// Users with queued tasks, in turn order (each appears once).
    turns: VecDeque<UserId>,
    /// Estimated work of the class's queued tasks, microseconds of one slot.
    work_us: u64,
}

/// Priority classes (highest first) of users (round robin) of packages (EDF) of tasks (FIFO).
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    classes: BTreeMap<Reverse<i32>, Class>,
    /// Package slab key to its queued tasks.
    packages: IdMap<u64, PackageQueue>,
    /// Queued tasks.
    live: usize,
}

impl ReadyQueue {
    /// Queued tasks.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// No task is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The highest priority with a task queued (approximately: a class whose packages all
    /// went since its users' last turns is dropped only at the next pop). O(1).
    pub(crate) fn top_priority(&self) -> Option<i32> {
        if self.live == 0 {
            return None;
        }
        self.classes.first_key_value().map(|(p, _)| p.0)
    }

    /// Estimated work queued at priority `priority` or higher, microseconds of one slot.
    /// O(priority classes).
    pub(crate) fn work_at_or_above(&self, priority: i32) -> u64 {
        self.classes
            .range(..=Reverse(priority))
            .map(|(_, c)| c.work_us)
            .sum()
    }

    /// Queues a task of package `slot` behind the others of its package; returns its position.
    pub(crate) fn push_back(&mut self, slot: u64, key: QueueKey, est_us: u64, task: TaskId) -> i64 {
        let pq = self.package_entry(slot, key, est_us);
        let pos = pq.next_back;
        pq.next_back += 1;
        pq.tasks.insert(pos, task);
        pos
    }

    /// Queues a task of package `slot` ahead of the others of its package (returned or
    /// requeued work, which has waited longest); returns its position.
    pub(crate) fn push_front(
        &mut self,
        slot: u64,
        key: QueueKey,
        est_us: u64,
        task: TaskId,
    ) -> i64 {
        let pq = self.package_entry(slot, key, est_us);
        pq.next_front -= 1;
        let pos = pq.next_front;
        pq.tasks.insert(pos, task);
        pos
    }

    /// The package's queue, entered in its user and class if it had no task queued; counts one
    /// more queued task.
    fn package_entry(&mut self, slot: u64, key: QueueKey, est_us: u64) -> &mut PackageQueue {
        let class = self.classes.entry(Reverse(key.priority)).or_default();
        class.work_us = class.work_us.saturating_add(est_us);
        self.live += 1;
        let pq = self.packages.entry(slot).or_insert_with(|| PackageQueue {
            key,
            tasks: BTreeMap::new(),
            next_back: 0,
            next_front: 0,
            est_us,
        });
        if pq.tasks.is_empty() {
            let user = class.users.entry(key.user).or_insert_with(|| {
                class.turns.push_back(key.user);
                UserQueue::default()
            });
            user.packages.insert(key.order(), slot);
        }
        pq
    }

    /// Takes the task at `pos` of package `slot` out of the queue (it was cancelled or
    /// finished by the master). O(log n).
    ///
    /// # Panics
    ///
    /// If no task is queued there: the caller's bookkeeping is broken.
    pub(crate) fn remove(&mut self, slot: u64, pos: i64) {
        let pq = self
            .packages
            .get_mut(&slot)
            .unwrap_or_else(|| panic!("ready queue: remove from slot {slot}, which is not queued"));
        pq.tasks
            .remove(&pos)
            .unwrap_or_else(|| panic!("ready queue: nothing at {pos} of slot {slot}"));
        self.live -= 1;
        let (key, est_us, now_empty) = (pq.key, pq.est_us, pq.tasks.is_empty());
        let class = self
            .classes
            .get_mut(&Reverse(key.priority))
            .expect("class of a queued package");
        class.work_us = class.work_us.saturating_sub(est_us);
        if now_empty {
            self.drop_package(slot);
        }
    }

    /// Removes a package with no task queued. Its user keeps its turn (and its entry, even
    /// with no package left) until the turn comes up in [`Self::pop`], so a user never holds two
    /// turns however often its packages come and go.
    fn drop_package(&mut self, slot: u64) {
        let pq = self
            .packages
            .remove(&slot)
            .expect("drop of an unqueued package");
        debug_assert!(pq.tasks.is_empty());
        let user = self
            .classes
            .get_mut(&Reverse(pq.key.priority))
            .and_then(|c| c.users.get_mut(&pq.key.user))
            .expect("user of a queued package");
        user.packages.remove(&pq.key.order());
    }

    /// Takes the next task: highest class; in it, the user whose turn it is; of that user, the
    /// package with the earliest deadline; of that package, the front task. Returns the task
    /// and its package's slab key. Cost: O(log classes + log packages of the user + log tasks of
    /// the package), plus the turns of users whose packages all went since their last turn.
    pub(crate) fn pop(&mut self) -> Option<(TaskId, u64)> {
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
            let (_, task) = pq.tasks.pop_first().expect("a queued package has a task");
            self.live -= 1;
            class.work_us = class.work_us.saturating_sub(pq.est_us);
            let package_done = pq.tasks.is_empty();
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

    /// The task [`Self::pop`] would take, without taking it. O(log n); may skip users whose
    /// packages all went (as `pop` would).
    pub(crate) fn peek(&self) -> Option<TaskId> {
        let class = self.classes.values().find(|c| {
            c.turns
                .iter()
                .any(|u| c.users.get(u).is_some_and(|q| !q.packages.is_empty()))
        })?;
        let user = class
            .turns
            .iter()
            .filter_map(|u| class.users.get(u))
            .find(|q| !q.packages.is_empty())?;
        let (_, slot) = user.packages.first_key_value()?;
        let pq = self.packages.get(slot)?;
        pq.tasks.first_key_value().map(|(_, &t)| t)
    }

    /// Every entry as `(package slot, key, position, task)`. For invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, QueueKey, i64, TaskId)> + '_ {
        self.packages.iter().flat_map(|(&slot, pq)| {
            pq.tasks
                .iter()
                .map(move |(&pos, &t)| (slot, pq.key, pos, t))
        })
    }

    /// Checks the queue's own structure (counts, turns, classes). For invariant checks.
    pub(crate) fn check(&self) {
        let live: usize = self.packages.values().map(|pq| pq.tasks.len()).sum();
        assert_eq!(live, self.live, "queue live count");
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
                    assert!(!pq.tasks.is_empty(), "slot {slot} queued with no task");
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
                .map(|pq| pq.est_us * pq.tasks.len() as u64)
                .sum();
            assert_eq!(work, class.work_us, "class {} work sum", prio.0);
        }
        assert_eq!(listed, self.packages.len(), "packages outside their user");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(priority: i32, user: u64, deadline: u64, seq: u64) -> QueueKey {
        QueueKey {
            priority,
            user: UserId(user),
            deadline,
            seq,
        }
    }

    fn drain(q: &mut ReadyQueue) -> Vec<u64> {
        let out = std::iter::from_fn(|| q.pop()).map(|(t, _)| t.0).collect();
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
        assert_eq!(drain(&mut q), vec![2, 5, 1, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.iter().count(), 0);
        assert!(q.classes.is_empty(), "empty classes are removed");
    }

    #[test]
    fn submit_and_cancel_churn_does_not_grow_the_turns() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(0, 2, u64::MAX, 1), 0, TaskId(1));
        for slot in 10..1000 {
            let pos = q.push_back(slot, key(0, 1, u64::MAX, slot), 0, TaskId(slot));
            q.remove(slot, pos);
        }
        q.check();
        assert!(q.classes[&Reverse(0)].turns.len() <= 2);
        assert_eq!(drain(&mut q), vec![1]);
        assert!(q.is_empty());
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
            drain(&mut q),
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
        assert_eq!(drain(&mut q), vec![100, 200, 300, 101, 301, 102, 103, 104]);
    }

    #[test]
    fn push_front_goes_ahead_within_its_package_only() {
        let mut q = ReadyQueue::default();
        q.push_back(1, key(1, 1, u64::MAX, 1), 0, TaskId(1));
        q.push_back(2, key(0, 1, u64::MAX, 2), 0, TaskId(2));
        q.push_front(2, key(0, 1, u64::MAX, 2), 0, TaskId(3));
        q.push_front(2, key(0, 1, u64::MAX, 2), 0, TaskId(4));
        assert_eq!(drain(&mut q), vec![1, 4, 3, 2]);
    }

    #[test]
    fn removal_is_exact_and_keeps_the_order() {
        let mut q = ReadyQueue::default();
        let pos: Vec<i64> = (1..=4)
            .map(|t| q.push_back(7, key(0, 1, u64::MAX, 1), 0, TaskId(t)))
            .collect();
        q.remove(7, pos[0]);
        q.remove(7, pos[2]);
        assert_eq!(q.len(), 2);
        q.check();
        assert_eq!(drain(&mut q), vec![2, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn removing_a_whole_package_drops_it() {
        let mut q = ReadyQueue::default();
        let a = q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
        let b = q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(2));
        q.push_back(2, key(0, 2, u64::MAX, 2), 0, TaskId(3));
        q.remove(1, a);
        q.remove(1, b);
        q.check();
        assert_eq!(q.iter().count(), 1);
        assert_eq!(drain(&mut q), vec![3]);
    }

    #[test]
    fn work_sums_follow_the_queued_tasks() {
        let mut q = ReadyQueue::default();
        let a = q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(1));
        q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(2));
        q.push_back(2, key(5, 1, u64::MAX, 2), 7, TaskId(3));
        assert_eq!(q.work_at_or_above(0), 207);
        assert_eq!(q.work_at_or_above(5), 7);
        assert_eq!(q.work_at_or_above(6), 0);
        q.remove(1, a);
        q.check();
        assert_eq!(q.work_at_or_above(0), 107);
        q.pop();
        assert_eq!(q.work_at_or_above(0), 100);
        q.check();
    }

    #[test]
    #[should_panic(expected = "not queued")]
    fn removing_from_an_unqueued_package_panics() {
        ReadyQueue::default().remove(9, 0);
    }
}
