//! The ready queues' self-checks: a queue's entries listed and its structure (lists, counts,
//! turns, classes) checked from its own classes down, and its store checked to hold exactly the
//! entries of the queues that use it, for the core's invariant walk. O(queue): never on the hot
//! path.

use super::{PackageQueue, Queue, QueueKey, QueueStore};
use crate::ids::TaskId;

/// What a queue's walk found in its store: the sums [`QueueStore::check`] compares with the
/// store's own counts once every queue that uses it was walked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Linked {
    /// Packages listed by the queue's users.
    pub(crate) packages: usize,
    /// List nodes linked from those packages.
    pub(crate) nodes: usize,
    /// Order nodes of the queue's users' trees.
    pub(crate) orders: usize,
}

impl std::ops::AddAssign for Linked {
    fn add_assign(&mut self, o: Self) {
        self.packages += o.packages;
        self.nodes += o.nodes;
        self.orders += o.orders;
    }
}

impl QueueStore {
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

    /// Checks that the store holds what the walks of every queue that uses it found
    /// (`linked`, summed), and nothing else. For invariant checks.
    pub(crate) fn check(&self, linked: Linked) {
        self.nodes.check();
        assert_eq!(linked.nodes, self.nodes.len(), "nodes outside every list");
        assert_eq!(
            linked.packages,
            self.packages.len(),
            "packages outside every queue's users"
        );
        self.orders.check_slab(linked.orders);
    }
}

impl Queue {
    /// The slots of the packages its users list, class by class.
    fn slots<'a>(&'a self, s: &'a QueueStore) -> impl Iterator<Item = u64> + 'a {
        self.classes.iter().flat_map(move |(_, class)| {
            class
                .users
                .values()
                .flat_map(move |uq| s.orders.entries(&uq.packages).into_iter())
                .map(|(_, slot)| slot)
        })
    }

    /// Every entry as `(package slot, key, position, task)`, each package front first, walked
    /// from its classes down (its store may hold other queues' entries). O(queue): for
    /// invariant checks and a class's orphan timer.
    pub(crate) fn iter<'a>(
        &'a self,
        s: &'a QueueStore,
    ) -> impl Iterator<Item = (u64, QueueKey, u64, TaskId)> + 'a {
        self.slots(s).flat_map(move |slot| {
            let pq = s.packages.get(slot).expect("listed package is queued");
            s.list(pq).map(move |(pos, t)| (slot, pq.key, pos, t))
        })
    }

    /// Checks the queue's own structure (lists, counts, turns, classes) in store `s`; returns
    /// what it links there, for [`QueueStore::check`]. For invariant checks.
    pub(crate) fn check(&self, s: &QueueStore) -> Linked {
        let mut linked = Linked::default();
        let mut live = 0;
        for (prio, class) in self.classes.iter() {
            assert!(!class.users.is_empty(), "empty class {}", prio.0);
            assert_eq!(
                class.turns.len(),
                class.users.len(),
                "class {} turns",
                prio.0
            );
            let mut work = 0;
            for (user, uq) in &class.users {
                let turns = class.turns.iter().filter(|u| *u == user).count();
                assert_eq!(turns, 1, "{user} has {turns} turns");
                linked.orders += s.orders.check(&uq.packages);
                for (order, slot) in s.orders.entries(&uq.packages) {
                    let pq = s.packages.get(slot).expect("listed package is queued");
                    assert!(!pq.is_empty(), "slot {slot} queued with no task");
                    assert_eq!(pq.key.order(), order);
                    assert_eq!(pq.key.user, *user);
                    assert_eq!(pq.key.priority, prio.0);
                    linked.packages += 1;
                    linked.nodes += check_list(s, slot, pq);
                    live += pq.len;
                    work += pq.est_us * pq.len as u64;
                }
            }
            assert_eq!(work, class.work_us, "class {} work sum", prio.0);
        }
        assert_eq!(live, self.live, "queue live count");
        linked
    }
}

/// Checks package `slot`'s list (links both ways, tail, length); returns its length.
fn check_list(s: &QueueStore, slot: u64, pq: &PackageQueue) -> usize {
    let mut prev = None;
    let mut pos = pq.head;
    let mut n = 0;
    while let Some(p) = pos {
        let node = s
            .nodes
            .get(p)
            .unwrap_or_else(|| panic!("slot {slot} links freed node {p}"));
        assert_eq!(node.prev, prev, "slot {slot}: node {p} links back wrong");
        prev = Some(p);
        pos = node.next;
        n += 1;
        assert!(n <= s.nodes.len(), "slot {slot}: its list loops");
    }
    assert_eq!(pq.tail, prev, "slot {slot}: tail is not the last node");
    assert_eq!(pq.len, n, "slot {slot}: length of its list");
    n
}
