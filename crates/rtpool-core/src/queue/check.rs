//! The ready queue's self-checks: its entries listed and its structure (lists, counts, turns,
//! classes) checked against itself, for the core's invariant walk. O(queue): never on the hot
//! path.

use super::{PackageQueue, QueueKey, ReadyQueue};
use crate::ids::TaskId;

impl ReadyQueue {
    /// A package's list, front first, as `(position, task)`.
    pub(super) fn list<'a>(
        &'a self,
        pq: &'a PackageQueue,
    ) -> impl Iterator<Item = (u64, TaskId)> + 'a {
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
        for (prio, class) in self.classes.iter() {
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
