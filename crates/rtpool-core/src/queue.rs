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
//! Within a package, the tasks form a doubly linked list whose nodes live in the queue's
//! slab ([`Table`] of [`Node`]): a push to the back or the front links one node, and the task
//! remembers its node (its position), so taking a cancelled (or master-finished) task out is an
//! exact O(1) unlink: the queue holds only queued tasks, and no operation ever walks past dead
//! entries or compacts. The nodes are why a growing queue allocates nothing per task: the slab
//! grows a chunk at a time, and [`QueueStore::prepare`] makes the next chunk ahead of need (a
//! B-tree per package, as before, allocated fresh nodes from the heap as the queue grew: most
//! of the page faults of a growing submission). Each user's packages are ordered by a treap
//! whose nodes live in one more slab of the queue's ([`Orders`]), prepared the same way (it was
//! a `BTreeMap` per user, the last allocation of a growing submission).
//!
//! The slabs and the package entries are a [`QueueStore`], which one queue ([`ReadyQueue`]: a
//! service's) or many ([`Queue`]s: the core's and every resource class's, issue 26) use.
//!
//! This file holds the queue and its operations; [`package`] a package's list and the store
//! of every package's list; `check` the queues' self-checks for the invariant walk.

mod check;
mod levels;
mod package;

use std::cmp::Reverse;
use std::collections::VecDeque;

use crate::ids::{TaskId, UserId};
use crate::order::{OrderKey, OrderTree, Orders};
use crate::table::{DenseMap, IdMap, Table};

use self::levels::Levels;
use self::package::{Node, PackageQueue, PackageQueues};

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

/// One user's packages with queued tasks, in EDF order: a tree whose nodes live in the
/// queue's [`Orders`] slab.
#[derive(Debug, Default)]
struct UserQueue {
    packages: OrderTree,
}

/// One priority class.
#[derive(Debug, Default)]
#[repr(C)]
struct Class {
    /// Estimated work of the class's queued tasks, microseconds of one slot (first: every
    /// push and pop writes it).
    work_us: u64,
    users: IdMap<UserId, UserQueue>,
    /// Users with queued tasks, in turn order (each appears once).
    turns: VecDeque<UserId>,
}

/// The storage of ready queues: every package's entry, every queued task's list node and
/// every user's package order nodes. One store serves many [`Queue`]s (the core's and every
/// resource class's, `class.rs`: a package queues in one of them only), so a lost worker's
/// tasks going back to 16 classes' queues write one store's entries, not 16 stores' (each a
/// hash map and two slabs of its own, cold in cache, issue 26).
#[derive(Debug, Default)]
pub(crate) struct QueueStore {
    /// Package slab key to its queued tasks.
    packages: PackageQueues,
    /// The list nodes of every queued task; a node's slab key is the task's position.
    nodes: Table<Node>,
    /// The nodes of every user's package order.
    orders: Orders,
}

impl QueueStore {
    /// A store whose packages are the ids of one package table, most of which it holds (the
    /// core's queues): their entries are stored densely, by slot index, and
    /// [`QueueStore::prepare`] makes their growth ahead of need too. `default()` keeps them in
    /// a hash map (a service's queue, which holds a few packages of the whole table).
    pub(crate) fn dense() -> Self {
        Self {
            packages: PackageQueues::Dense(DenseMap::default()),
            ..Self::default()
        }
    }

    /// Makes up to `max_slots` list nodes ahead of need (see [`Table::prepare`]), so a push
    /// that grows a queue does not pay the first touch of fresh memory. Returns whether more
    /// is left to prepare. O(`max_slots`).
    pub(crate) fn prepare(&mut self, max_slots: usize) -> bool {
        let nodes = self.nodes.prepare(max_slots);
        let packages = self.packages.prepare(max_slots);
        let orders = self.orders.prepare(max_slots);
        nodes || packages || orders
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
}

/// One ready queue: priority classes (highest first) of users (round robin) of packages (EDF)
/// of tasks (FIFO). Its packages' entries and tasks' nodes are in the [`QueueStore`] each call
/// names, always the same one for a queue (the caller's).
///
/// `repr(C)`, in the order a push reads its fields: a push to a cold queue (one of many
/// resource classes', `class.rs`) touches as few cache lines as the fields allow.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Queue {
    /// Queued tasks.
    live: usize,
    classes: Levels,
}

impl Queue {
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
        self.classes.first_key().map(|p| p.0)
    }

    /// Estimated work queued at priority `priority` or higher, microseconds of one slot.
    /// O(priority classes).
    pub(crate) fn work_at_or_above(&self, priority: i32) -> u64 {
        self.classes
            .up_to(Reverse(priority))
            .map(|c| c.work_us)
            .sum()
    }

    /// Queues a task of package `slot` behind the others of its package; returns its position.
    /// O(1) besides entering the package in its user's queue.
    pub(crate) fn push_back(
        &mut self,
        s: &mut QueueStore,
        slot: u64,
        key: QueueKey,
        est_us: u64,
        task: TaskId,
    ) -> u64 {
        let tail = self.package_entry(s, slot, key, est_us).tail;
        let pos = s.nodes.insert(Node {
            task,
            prev: tail,
            next: None,
        });
        match tail {
            Some(t) => s.node_mut(t).next = Some(pos),
            None => s.packages.get_mut(slot).expect("just entered").head = Some(pos),
        }
        let pq = s.packages.get_mut(slot).expect("just entered");
        pq.tail = Some(pos);
        pq.len += 1;
        pos
    }

    /// Queues a task of package `slot` ahead of the others of its package (returned or
    /// requeued work, which has waited longest); returns its position.
    pub(crate) fn push_front(
        &mut self,
        s: &mut QueueStore,
        slot: u64,
        key: QueueKey,
        est_us: u64,
        task: TaskId,
    ) -> u64 {
        let head = self.package_entry(s, slot, key, est_us).head;
        let pos = s.nodes.insert(Node {
            task,
            prev: None,
            next: head,
        });
        match head {
            Some(h) => s.node_mut(h).prev = Some(pos),
            None => s.packages.get_mut(slot).expect("just entered").tail = Some(pos),
        }
        let pq = s.packages.get_mut(slot).expect("just entered");
        pq.head = Some(pos);
        pq.len += 1;
        pos
    }

    /// The package's queue, entered in its user and class if it had no task queued; counts one
    /// more queued task.
    fn package_entry<'s>(
        &mut self,
        s: &'s mut QueueStore,
        slot: u64,
        key: QueueKey,
        est_us: u64,
    ) -> &'s mut PackageQueue {
        let class = self.classes.entry(Reverse(key.priority));
        class.work_us = class.work_us.saturating_add(est_us);
        self.live += 1;
        let pq = s.packages.get_or_insert_with(slot, || PackageQueue {
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
            s.orders.insert(&mut user.packages, key.order(), slot);
        }
        pq
    }

    /// Takes the task at `pos` of package `slot` out of the queue (it was cancelled or
    /// finished by the master). O(1) besides leaving its user's queue.
    ///
    /// # Panics
    ///
    /// If no task is queued there: the caller's bookkeeping is broken.
    pub(crate) fn remove(&mut self, s: &mut QueueStore, slot: u64, pos: u64) {
        if s.packages.get(slot).is_none() {
            panic!("ready queue: remove from slot {slot}, which is not queued");
        }
        s.unlink(slot, pos);
        self.live -= 1;
        let pq = s.packages.get(slot).expect("queued package");
        let (key, est_us, now_empty) = (pq.key, pq.est_us, pq.is_empty());
        let class = self
            .classes
            .get_mut(Reverse(key.priority))
            .expect("class of a queued package");
        class.work_us = class.work_us.saturating_sub(est_us);
        if now_empty {
            self.drop_package(s, slot);
        }
    }

    /// Removes a package with no task queued. Its user keeps its turn (and its entry, even
    /// with no package left) until the turn comes up in [`Self::pop`], so a user never holds two
    /// turns however often its packages come and go.
    fn drop_package(&mut self, s: &mut QueueStore, slot: u64) {
        let pq = s
            .packages
            .remove(slot)
            .expect("drop of an unqueued package");
        debug_assert!(pq.is_empty());
        let user = self
            .classes
            .get_mut(Reverse(pq.key.priority))
            .and_then(|c| c.users.get_mut(&pq.key.user))
            .expect("user of a queued package");
        s.orders.remove(&mut user.packages, pq.key.order());
    }

    /// Takes the next task: highest class; in it, the user whose turn it is; of that user, the
    /// package with the earliest deadline; of that package, the front task. Returns the task
    /// and its package's slab key. Cost: O(log classes + log packages of the user), plus the turns of users whose packages all went since their last turn.
    pub(crate) fn pop(&mut self, s: &mut QueueStore) -> Option<(TaskId, u64)> {
        while self.live > 0 {
            let class = self.classes.first_mut()?;
            let Some(user_id) = class.turns.pop_front() else {
                self.classes.remove_first();
                continue;
            };
            let user = class.users.get(&user_id).expect("a turn names a user");
            let Some((_, slot)) = s.orders.first(&user.packages) else {
                // Its packages all went (cancelled) since its last turn.
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    self.classes.remove_first();
                }
                continue;
            };
            let pq = s.packages.get(slot).expect("queued package");
            let (head, est_us) = (pq.head.expect("a queued package has a task"), pq.est_us);
            // The unlink, inlined: `class` borrows `self.classes`.
            let node = s.nodes.remove(head).expect("the head node is live");
            debug_assert!(node.prev.is_none(), "the head has nothing ahead");
            if let Some(n) = node.next {
                s.nodes.get_mut(n).expect("a linked node is live").prev = None;
            }
            let pq = s.packages.get_mut(slot).expect("queued package");
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
                let pq = s.packages.remove(slot).expect("just popped from it");
                let user = class.users.get_mut(&user_id).expect("a turn names a user");
                s.orders.remove(&mut user.packages, pq.key.order());
            }
            let user_done = package_done
                && class
                    .users
                    .get(&user_id)
                    .is_some_and(|u| u.packages.is_empty());
            if user_done {
                class.users.remove(&user_id);
                if class.users.is_empty() {
                    self.classes.remove_first();
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
    pub(crate) fn peek(&self, s: &QueueStore) -> Option<TaskId> {
        let (_, class) = self.classes.iter().find(|(_, c)| {
            c.turns
                .iter()
                .any(|u| c.users.get(u).is_some_and(|q| !q.packages.is_empty()))
        })?;
        let user = class
            .turns
            .iter()
            .filter_map(|u| class.users.get(u))
            .find(|q| !q.packages.is_empty())?;
        let (_, slot) = s.orders.first(&user.packages)?;
        let pq = s.packages.get(slot)?;
        pq.head.and_then(|h| s.nodes.get(h)).map(|node| node.task)
    }
}

/// A [`Queue`] with a store of its own (a service's queue, and a function's in a class).
#[derive(Debug, Default)]
pub(crate) struct ReadyQueue {
    queue: Queue,
    store: QueueStore,
}

impl ReadyQueue {
    /// A queue with a dense store (see [`QueueStore::dense`]).
    #[cfg(test)]
    pub(crate) fn dense() -> Self {
        Self {
            queue: Queue::default(),
            store: QueueStore::dense(),
        }
    }

    /// Queued tasks.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// No task is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// See [`Queue::top_priority`].
    pub(crate) fn top_priority(&self) -> Option<i32> {
        self.queue.top_priority()
    }

    /// See [`Queue::work_at_or_above`].
    #[cfg(test)]
    pub(crate) fn work_at_or_above(&self, priority: i32) -> u64 {
        self.queue.work_at_or_above(priority)
    }

    /// See [`Queue::push_back`].
    pub(crate) fn push_back(&mut self, slot: u64, key: QueueKey, est_us: u64, task: TaskId) -> u64 {
        self.queue
            .push_back(&mut self.store, slot, key, est_us, task)
    }

    /// See [`Queue::push_front`].
    pub(crate) fn push_front(
        &mut self,
        slot: u64,
        key: QueueKey,
        est_us: u64,
        task: TaskId,
    ) -> u64 {
        self.queue
            .push_front(&mut self.store, slot, key, est_us, task)
    }

    /// See [`Queue::remove`].
    pub(crate) fn remove(&mut self, slot: u64, pos: u64) {
        self.queue.remove(&mut self.store, slot, pos);
    }

    /// See [`Queue::pop`].
    pub(crate) fn pop(&mut self) -> Option<(TaskId, u64)> {
        self.queue.pop(&mut self.store)
    }

    /// See [`Queue::peek`].
    pub(crate) fn peek(&self) -> Option<TaskId> {
        self.queue.peek(&self.store)
    }

    /// Every entry as `(package slot, key, position, task)`. For invariant checks.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, QueueKey, u64, TaskId)> + '_ {
        self.queue.iter(&self.store)
    }

    /// Checks the queue and its store (every entry of the store is the queue's). For invariant
    /// checks.
    pub(crate) fn check(&self) {
        let linked = self.queue.check(&self.store);
        self.store.check(linked);
    }
}

#[cfg(test)]
mod tests;
