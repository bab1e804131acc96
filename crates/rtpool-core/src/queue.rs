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
//! Within a package, the tasks form a doubly linked list whose nodes live in the queue's own
//! slab ([`Table`] of [`Node`]): a push to the back or the front links one node, and the task
//! remembers its node (its position), so taking a cancelled (or master-finished) task out is an
//! exact O(1) unlink: the queue holds only queued tasks, and no operation ever walks past dead
//! entries or compacts. The nodes are why a growing queue allocates nothing per task: the slab
//! grows a chunk at a time, and [`ReadyQueue::prepare`] makes the next chunk ahead of need (a
//! B-tree per package, as before, allocated fresh nodes from the heap as the queue grew: most
//! of the page faults of a growing submission). Each user's packages are ordered by a treap
//! whose nodes live in one more slab of the queue ([`Orders`]), prepared the same way (it was
//! a `BTreeMap` per user, the last allocation of a growing submission).

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use crate::ids::{TaskId, UserId};
use crate::order::{OrderKey, OrderTree, Orders};
use crate::table::{DenseMap, IdMap, Table};

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
    fn order(&self) -> OrderKey {
        (self.deadline, self.seq)
    }
}

/// One queued task: a link of its package's list.
#[derive(Debug, Clone, Copy)]
struct Node {
    task: TaskId,
    /// Slab key of the node ahead of it in its package, if any.
    prev: Option<u64>,
    /// Slab key of the node behind it, if any.
    next: Option<u64>,
}

/// One package's queued tasks: the ends of its list of nodes, front first.
#[derive(Debug)]
struct PackageQueue {
    key: QueueKey,
    head: Option<u64>,
    tail: Option<u64>,
    /// Nodes in the list.
    len: usize,
    /// Estimated execution time of each task, microseconds (for the class's work sum).
    est_us: u64,
}

impl PackageQueue {
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One user's packages with queued tasks, in EDF order: a tree whose nodes live in the
/// queue's [`Orders`] slab.
#[derive(Debug, Default)]
struct UserQueue {
    packages: OrderTree,
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

/// Package slab key to its queued tasks: stored at the key's slot index for the core's ready
/// queue, which most packages enter (no hash map whose resize touches fresh memory in the
/// middle of a submission); a hash map for a service's queue, which holds the few packages
/// that call its function (a dense store would span every package slot).
#[derive(Debug)]
enum PackageQueues {
    Dense(DenseMap<PackageQueue>),
    Sparse(IdMap<u64, PackageQueue>),
}

impl Default for PackageQueues {
    fn default() -> Self {
        Self::Sparse(IdMap::default())
    }
}

impl PackageQueues {
    fn get(&self, slot: u64) -> Option<&PackageQueue> {
        match self {
            Self::Dense(m) => m.get(slot),
            Self::Sparse(m) => m.get(&slot),
        }
    }

    fn get_mut(&mut self, slot: u64) -> Option<&mut PackageQueue> {
        match self {
            Self::Dense(m) => m.get_mut(slot),
            Self::Sparse(m) => m.get_mut(&slot),
        }
    }

    fn get_or_insert_with(
        &mut self,
        slot: u64,
        make: impl FnOnce() -> PackageQueue,
    ) -> &mut PackageQueue {
        match self {
            Self::Dense(m) => m.get_or_insert_with(slot, make),
            Self::Sparse(m) => m.entry(slot).or_insert_with(make),
        }
    }

    fn remove(&mut self, slot: u64) -> Option<PackageQueue> {
        match self {
            Self::Dense(m) => m.remove(slot),
            Self::Sparse(m) => m.remove(&slot),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Dense(m) => m.len(),
            Self::Sparse(m) => m.len(),
        }
    }

    fn prepare(&mut self, max_slots: usize) -> bool {
        match self {
            Self::Dense(m) => m.prepare(max_slots),
            Self::Sparse(_) => false,
        }
    }

    /// Every `(slot, queue)`. O(slots) when dense: for invariant checks only.
    fn iter(&self) -> Box<dyn Iterator<Item = (u64, &PackageQueue)> + '_> {
        match self {
            Self::Dense(m) => Box::new(m.iter()),
            Self::Sparse(m) => Box::new(m.iter().map(|(&slot, pq)| (slot, pq))),
        }
    }
}

/// Priority classes (highest first) of users (round robin) of packages (EDF) of tasks (FIFO).
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    classes: BTreeMap<Reverse<i32>, Class>,
    /// Package slab key to its queued tasks.
    packages: PackageQueues,
    /// The list nodes of every queued task; a node's slab key is the task's position.
    nodes: Table<Node>,
    /// The nodes of every user's package order.
    orders: Orders,
    /// Queued tasks.
    live: usize,
}

impl ReadyQueue {
    /// A queue whose packages are the ids of one package table, most of which it holds (the
    /// core's ready queue): their entries are stored densely, by slot index, and
    /// [`ReadyQueue::prepare`] makes their growth ahead of need too. `default()` keeps them in
    /// a hash map (a service's queue, which holds a few packages of the whole table).
    pub(crate) fn dense() -> Self {
        Self {
            packages: PackageQueues::Dense(DenseMap::default()),
            ..Self::default()
        }
    }

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

    /// Makes up to `max_slots` list nodes ahead of need (see [`Table::prepare`]), so a push
    /// that grows the queue does not pay the first touch of fresh memory. Returns whether more
    /// is left to prepare. O(`max_slots`).
    pub(crate) fn prepare(&mut self, max_slots: usize) -> bool {
        let nodes = self.nodes.prepare(max_slots);
        let packages = self.packages.prepare(max_slots);
        let orders = self.orders.prepare(max_slots);
        nodes || packages || orders
    }

    /// Queues a task of package `slot` behind the others of its package; returns its position.
    /// O(1) besides entering the package in its user's queue.
    pub(crate) fn push_back(&mut self, slot: u64, key: QueueKey, est_us: u64, task: TaskId) -> u64 {
        let tail = self.package_entry(slot, key, est_us).tail;
        let pos = self.nodes.insert(Node {
            task,
            prev: tail,
            next: None,
        });
        match tail {
            Some(t) => self.node_mut(t).next = Some(pos),
            None => self.packages.get_mut(slot).expect("just entered").head = Some(pos),
        }
        let pq = self.packages.get_mut(slot).expect("just entered");
        pq.tail = Some(pos);
        pq.len += 1;
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
    ) -> u64 {
        let head = self.package_entry(slot, key, est_us).head;
        let pos = self.nodes.insert(Node {
            task,
            prev: None,
            next: head,
        });
        match head {
            Some(h) => self.node_mut(h).prev = Some(pos),
            None => self.packages.get_mut(slot).expect("just entered").tail = Some(pos),
        }
        let pq = self.packages.get_mut(slot).expect("just entered");
        pq.head = Some(pos);
        pq.len += 1;
        pos
    }

    fn node_mut(&mut self, pos: u64) -> &mut Node {
        self.nodes
            .get_mut(pos)
            .unwrap_or_else(|| panic!("ready queue: no node at {pos}"))
    }

    /// Unlinks the node at `pos` from package `slot`'s list and frees it; returns its task.
    fn unlink(&mut self, slot: u64, pos: u64) -> TaskId {
        let node = self
            .nodes
            .remove(pos)
            .unwrap_or_else(|| panic!("ready queue: nothing at {pos} of slot {slot}"));
        match node.prev {
            Some(p) => self.node_mut(p).next = node.next,
            None => self.packages.get_mut(slot).expect("queued package").head = node.next,
        }
        match node.next {
            Some(n) => self.node_mut(n).prev = node.prev,
            None => self.packages.get_mut(slot).expect("queued package").tail = node.prev,
        }
        self.packages.get_mut(slot).expect("queued package").len -= 1;
        node.task
    }

    /// The package's queue, entered in its user and class if it had no task queued; counts one
    /// more queued task.
    fn package_entry(&mut self, slot: u64, key: QueueKey, est_us: u64) -> &mut PackageQueue {
        let class = self.classes.entry(Reverse(key.priority)).or_default();
        class.work_us = class.work_us.saturating_add(est_us);
        self.live += 1;
        let pq = self.packages.get_or_insert_with(slot, || PackageQueue {
            key,
            head: None,
            tail: None,
            len: 0,
            est_us,
        });
        if pq.is_empty() {
            let user = class.users.entry(key.user).or_insert_with(|| {
                class.turns.push_back(key.user);
                UserQueue::default()
            });
            self.orders.insert(&mut user.packages, key.order(), slot);
        }
        pq
    }

    /// Takes the task at `pos` of package `slot` out of the queue (it was cancelled or
    /// finished by the master). O(1) besides leaving its user's queue.
    ///
    /// # Panics
    ///
    /// If no task is queued there: the caller's bookkeeping is broken.
    pub(crate) fn remove(&mut self, slot: u64, pos: u64) {
        if self.packages.get(slot).is_none() {
            panic!("ready queue: remove from slot {slot}, which is not queued");
        }
        self.unlink(slot, pos);
        self.live -= 1;
        let pq = self.packages.get(slot).expect("queued package");
        let (key, est_us, now_empty) = (pq.key, pq.est_us, pq.is_empty());
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
            .remove(slot)
            .expect("drop of an unqueued package");
        debug_assert!(pq.is_empty());
        let user = self
            .classes
            .get_mut(&Reverse(pq.key.priority))
            .and_then(|c| c.users.get_mut(&pq.key.user))
            .expect("user of a queued package");
        self.orders.remove(&mut user.packages, pq.key.order());
    }

    /// Takes the next task: highest class; in it, the user whose turn it is; of that user, the
    /// package with the earliest deadline; of that package, the front task. Returns the task
    /// and its package's slab key. Cost: O(log classes + log packages of the user), plus the turns of users whose packages all went since their last turn.
    pub(crate) fn pop(&mut self) -> Option<(TaskId, u64)> {
        while self.live > 0 {
            let mut class_entry = self.classes.first_entry()?;
            let class = class_entry.get_mut();
            let Some(user_id) = class.turns.pop_front() else {
                class_entry.remove();
                continue;
            };
            let user = class.users.get(&user_id).expect("a turn names a user");
            let Some((_, slot)) = self.orders.first(&user.packages) else {
                // Its packages all went (cancelled) since its last turn.
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    class_entry.remove();
                }
                continue;
            };
            let pq = self.packages.get(slot).expect("queued package");
            let (head, est_us) = (pq.head.expect("a queued package has a task"), pq.est_us);
            // The unlink, inlined: `class` borrows `self.classes` (disjoint fields).
            let node = self.nodes.remove(head).expect("the head node is live");
            debug_assert!(node.prev.is_none(), "the head has nothing ahead");
            if let Some(n) = node.next {
                self.nodes.get_mut(n).expect("a linked node is live").prev = None;
            }
            let pq = self.packages.get_mut(slot).expect("queued package");
            pq.head = node.next;
            if node.next.is_none() {
                pq.tail = None;
            }
            pq.len -= 1;
            let task = node.task;
            self.live -= 1;
            class.work_us = class.work_us.saturating_sub(est_us);
            let package_done = pq.is_empty();
            if package_done {
                let pq = self.packages.remove(slot).expect("just popped from it");
                let user = class.users.get_mut(&user_id).expect("a turn names a user");
                self.orders.remove(&mut user.packages, pq.key.order());
            }
            let user_done = package_done
                && class
                    .users
                    .get(&user_id)
                    .is_some_and(|u| u.packages.is_empty());
            if user_done {
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    class_entry.remove();
                }
            } else {
                class.turns.push_back(user_id);
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
        let (_, slot) = self.orders.first(&user.packages)?;
        let pq = self.packages.get(slot)?;
        pq.head
            .and_then(|h| self.nodes.get(h))
            .map(|node| node.task)
    }

    /// A package's list, front first, as `(position, task)`.
    fn list<'a>(&'a self, pq: &'a PackageQueue) -> impl Iterator<Item = (u64, TaskId)> + 'a {
        let mut cursor = pq.head;
        std::iter::from_fn(move || {
            let pos = cursor?;
            let node = self.nodes.get(pos).expect("a linked node is live");
            cursor = node.next;
            Some((pos, node.task))
        })
        .take(pq.len)
    }

    /// Every entry as `(package slot, key, position, task)`, each package front first. For
    /// invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, QueueKey, u64, TaskId)> + '_ {
        self.packages
            .iter()
            .flat_map(move |(slot, pq)| self.list(pq).map(move |(pos, t)| (slot, pq.key, pos, t)))
    }

    /// Checks the queue's own structure (lists, counts, turns, classes). For invariant checks.
    pub(crate) fn check(&self) {
        self.nodes.check();
        let mut linked = 0;
        for (slot, pq) in self.packages.iter() {
            let mut prev = None;
            let mut pos = pq.head;
            let mut n = 0;
            while let Some(p) = pos {
                let node = self
                    .nodes
                    .get(p)
                    .unwrap_or_else(|| panic!("slot {slot} links freed node {p}"));
                assert_eq!(node.prev, prev, "slot {slot}: node {p} links back wrong");
                prev = Some(p);
                pos = node.next;
                n += 1;
                assert!(n <= self.nodes.len(), "slot {slot}: its list loops");
            }
            assert_eq!(pq.tail, prev, "slot {slot}: tail is not the last node");
            assert_eq!(pq.len, n, "slot {slot}: length of its list");
            linked += n;
        }
        assert_eq!(linked, self.nodes.len(), "nodes outside every list");
        let live: usize = self.packages.iter().map(|(_, pq)| pq.len).sum();
        assert_eq!(live, self.live, "queue live count");
        let mut listed = 0;
        let mut ordered = 0;
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
                ordered += self.orders.check(&uq.packages);
                for (order, slot) in self.orders.entries(&uq.packages) {
                    let pq = self.packages.get(slot).expect("listed package is queued");
                    assert!(!pq.is_empty(), "slot {slot} queued with no task");
                    assert_eq!(pq.key.order(), order);
                    assert_eq!(pq.key.user, *user);
                    assert_eq!(pq.key.priority, prio.0);
                    listed += 1;
                }
            }
            let work: u64 = self
                .packages
                .iter()
                .map(|(_, pq)| pq)
                .filter(|pq| pq.key.priority == prio.0)
                .map(|pq| pq.est_us * pq.len as u64)
                .sum();
            assert_eq!(work, class.work_us, "class {} work sum", prio.0);
        }
        assert_eq!(listed, self.packages.len(), "packages outside their user");
        self.orders.check_slab(ordered);
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
        let pos: Vec<u64> = (1..=4)
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

    proptest::proptest! {
        /// The lists against a model: one user, packages in submission order, each a deque;
        /// pushes at both ends, exact removals and pops in any order, `check` after each; the
        /// packages' entries stored densely or in a hash map.
        #[test]
        fn lists_follow_a_model_of_deques(
            dense in proptest::bool::ANY,
            ops in proptest::collection::vec((0u8..4, 0u64..6, 0usize..64), 1..300)
        ) {
            let mut q = if dense { ReadyQueue::dense() } else { ReadyQueue::default() };
            let mut model: BTreeMap<u64, VecDeque<(u64, u64)>> = BTreeMap::new();
            let mut next = 0;
            for (op, slot, pick) in ops {
                let k = key(0, 1, u64::MAX, slot);
                match op {
                    0 | 1 => {
                        next += 1;
                        let t = TaskId(next);
                        let entries = model.entry(slot).or_default();
                        if op == 0 {
                            entries.push_back((q.push_back(slot, k, 1, t), next));
                        } else {
                            entries.push_front((q.push_front(slot, k, 1, t), next));
                        }
                    }
                    2 => {
                        let all: Vec<(u64, usize)> = model
                            .iter()
                            .flat_map(|(&s, d)| (0..d.len()).map(move |i| (s, i)))
                            .collect();
                        if let Some(&(s, i)) = all.get(pick % all.len().max(1)) {
                            let (pos, _) = model.get_mut(&s).unwrap().remove(i).unwrap();
                            q.remove(s, pos);
                        }
                    }
                    _ => {
                        let want = model
                            .iter_mut()
                            .find(|(_, d)| !d.is_empty())
                            .map(|(&s, d)| (d.pop_front().unwrap().1, s));
                        proptest::prop_assert_eq!(q.pop().map(|(t, s)| (t.0, s)), want);
                    }
                }
                model.retain(|_, d| !d.is_empty());
                q.check();
                let len: usize = model.values().map(VecDeque::len).sum();
                proptest::prop_assert_eq!(q.len(), len);
                let mut listed: Vec<(u64, u64)> =
                    q.iter().map(|(s, _, _, t)| (s, t.0)).collect();
                listed.sort_unstable();
                let mut expected: Vec<(u64, u64)> = model
                    .iter()
                    .flat_map(|(&s, d)| d.iter().map(move |&(_, t)| (s, t)))
                    .collect();
                expected.sort_unstable();
                proptest::prop_assert_eq!(listed, expected);
            }
        }
    }

    #[test]
    #[should_panic(expected = "not queued")]
    fn removing_from_an_unqueued_package_panics() {
        ReadyQueue::default().remove(9, 0);
    }
}
