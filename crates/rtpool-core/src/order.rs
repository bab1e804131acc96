//! [`Orders`]: ordered sets of `(order key, package slot)`, one per user of the ready queue,
//! whose nodes all live in one slab ([`Table`]) prepared ahead of need.
//!
//! Each set is a treap: a binary search tree by key that is also a max-heap by a priority
//! drawn from the key (a hash of it, fixed per key), so its shape is that of a tree built by
//! inserting the keys in random order: expected depth about 2 ln n (28 at 10^6), whatever
//! order the keys come in. Insert, remove and first are O(log n) expected; none allocates
//! once the slab has room, and [`Orders::prepare`] makes that room ahead like the queue's
//! other slabs (a `BTreeMap` per user, before, allocated a fresh node every ~11 packages: the
//! last first-touch page fault of a growing submission).
//!
//! A tree's smallest entry may be held outside the treap, in the tree itself
//! ([`OrderTree::front`]): a key inserted below every key of the treap goes there, and leaves
//! it in O(1). That is the queue's front package, whose last queued task a worker takes and
//! gets back when it is lost or returns it: the package leaves its user's tree and comes back
//! to the front of it, which touched some 2 ln n nodes of the treap each way (cold in cache:
//! a lost worker holding the last task of 16 packages in 16 resource classes paid that 16
//! times, issue 26), and now touches none.

use crate::table::Table;

/// The order of a package within its user: `(deadline, submission sequence)`, unique.
pub(crate) type OrderKey = (u64, u64);

/// One node: a package in its user's tree.
#[derive(Debug, Clone, Copy)]
struct OrderNode {
    key: OrderKey,
    slot: u64,
    /// Heap priority: a parent's is at least its children's.
    priority: u64,
    left: Option<u64>,
    right: Option<u64>,
}

/// One tree: its treap's root slab key, size and smallest entry (kept, so the queue's pop
/// reads it in O(1) rather than walking the left spine), and the entry held in front of the
/// treap.
#[derive(Debug, Default)]
pub(crate) struct OrderTree {
    root: Option<u64>,
    /// Nodes in the treap (`front` not counted).
    len: usize,
    /// The treap's smallest entry.
    first: Option<(OrderKey, u64)>,
    /// An entry below every key of the treap, held outside it: the tree's smallest. Filled by
    /// an insert below the treap's first key when it is empty, emptied by the removal of its
    /// key (or moved into the treap by an insert below it), each O(1) but that move.
    front: Option<(OrderKey, u64)>,
}

impl OrderTree {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.front.is_some())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0 && self.front.is_none()
    }
}

/// The slab of every tree's nodes.
#[derive(Debug, Default)]
pub(crate) struct Orders {
    nodes: Table<OrderNode>,
}

/// A fixed pseudo-random priority for a key (splitmix64 of both halves): the treap's shape
/// depends only on the set of keys, not on the order of the operations.
fn priority_of(key: OrderKey) -> u64 {
    let mut z = key
        .0
        .rotate_left(32)
        .wrapping_add(key.1.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Orders {
    /// Nodes of every tree.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Makes up to `max_slots` nodes ahead of need (see [`Table::prepare`]). Returns whether
    /// more is left to prepare.
    pub(crate) fn prepare(&mut self, max_slots: usize) -> bool {
        self.nodes.prepare(max_slots)
    }

    fn node(&self, id: u64) -> &OrderNode {
        self.nodes
            .get(id)
            .unwrap_or_else(|| panic!("order tree: no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> &mut OrderNode {
        self.nodes
            .get_mut(id)
            .unwrap_or_else(|| panic!("order tree: no node {id}"))
    }

    /// Adds `key` (not in `tree` yet) for package `slot`. O(1) below every key when nothing
    /// is held in front, else O(log n) expected.
    pub(crate) fn insert(&mut self, tree: &mut OrderTree, key: OrderKey, slot: u64) {
        match tree.front {
            None if tree.first.is_none_or(|(k, _)| key < k) => {
                tree.front = Some((key, slot));
                return;
            }
            Some((k, s)) if key < k => {
                // The new smallest takes the front; the old one is the treap's smallest now.
                tree.front = Some((key, slot));
                self.insert_node(tree, k, s);
                return;
            }
            _ => {}
        }
        self.insert_node(tree, key, slot);
    }

    /// Adds `key` to the treap.
    fn insert_node(&mut self, tree: &mut OrderTree, key: OrderKey, slot: u64) {
        let id = self.nodes.insert(OrderNode {
            key,
            slot,
            priority: priority_of(key),
            left: None,
            right: None,
        });
        let (lo, hi) = self.split(tree.root, key);
        let lo = self.merge(lo, Some(id));
        tree.root = self.merge(lo, hi);
        tree.len += 1;
        if tree.first.is_none_or(|(k, _)| key < k) {
            tree.first = Some((key, slot));
        }
    }

    /// Removes `key` from `tree`; returns its package slot, `None` if it was not there.
    /// O(1) for the entry held in front, else O(log n) expected.
    pub(crate) fn remove(&mut self, tree: &mut OrderTree, key: OrderKey) -> Option<u64> {
        if let Some((k, slot)) = tree.front.filter(|&(k, _)| k == key) {
            debug_assert_eq!(k, key);
            tree.front = None;
            return Some(slot);
        }
        // Descend to the node, remembering the link that points at it.
        let mut parent: Option<(u64, bool)> = None; // (node, went left)
        let mut cursor = tree.root;
        while let Some(id) = cursor {
            let node = self.node(id);
            match key.cmp(&node.key) {
                std::cmp::Ordering::Equal => break,
                std::cmp::Ordering::Less => {
                    parent = Some((id, true));
                    cursor = node.left;
                }
                std::cmp::Ordering::Greater => {
                    parent = Some((id, false));
                    cursor = node.right;
                }
            }
        }
        let id = cursor?;
        let node = self.nodes.remove(id).expect("found above");
        let joined = self.merge(node.left, node.right);
        match parent {
            None => tree.root = joined,
            Some((p, true)) => self.node_mut(p).left = joined,
            Some((p, false)) => self.node_mut(p).right = joined,
        }
        tree.len -= 1;
        if tree.first.is_some_and(|(k, _)| k == key) {
            tree.first = self.leftmost(tree);
        }
        Some(node.slot)
    }

    /// The smallest key of `tree` and its package slot. O(1).
    pub(crate) fn first(&self, tree: &OrderTree) -> Option<(OrderKey, u64)> {
        tree.front.or(tree.first)
    }

    /// The smallest key of `tree` and its package slot, found by walking the left spine.
    /// O(log n) expected.
    fn leftmost(&self, tree: &OrderTree) -> Option<(OrderKey, u64)> {
        let mut id = tree.root?;
        loop {
            let node = self.node(id);
            match node.left {
                Some(l) => id = l,
                None => return Some((node.key, node.slot)),
            }
        }
    }

    /// Splits the subtree at `root` into keys below `key` and keys from `key` on.
    fn split(&mut self, root: Option<u64>, key: OrderKey) -> (Option<u64>, Option<u64>) {
        let Some(id) = root else {
            return (None, None);
        };
        let node = *self.node(id);
        if node.key < key {
            let (lo, hi) = self.split(node.right, key);
            self.node_mut(id).right = lo;
            (Some(id), hi)
        } else {
            let (lo, hi) = self.split(node.left, key);
            self.node_mut(id).left = hi;
            (lo, Some(id))
        }
    }

    /// Joins two subtrees, every key of `lo` below every key of `hi`.
    fn merge(&mut self, lo: Option<u64>, hi: Option<u64>) -> Option<u64> {
        let (Some(a), Some(b)) = (lo, hi) else {
            return lo.or(hi);
        };
        if self.node(a).priority >= self.node(b).priority {
            let right = self.node(a).right;
            let joined = self.merge(right, Some(b));
            self.node_mut(a).right = joined;
            Some(a)
        } else {
            let left = self.node(b).left;
            let joined = self.merge(Some(a), left);
            self.node_mut(b).left = joined;
            Some(b)
        }
    }

    /// Every `(key, slot)` of `tree`, smallest first. O(n): for invariant checks.
    pub(crate) fn entries(&self, tree: &OrderTree) -> Vec<(OrderKey, u64)> {
        let mut out = Vec::with_capacity(tree.len + 1);
        out.extend(tree.front);
        let mut stack = Vec::new();
        let mut cursor = tree.root;
        while cursor.is_some() || !stack.is_empty() {
            while let Some(id) = cursor {
                stack.push(id);
                cursor = self.node(id).left;
            }
            let id = stack.pop().expect("non-empty");
            let node = self.node(id);
            out.push((node.key, node.slot));
            cursor = node.right;
        }
        out
    }

    /// Checks `tree`'s order, heap property and size; returns its treap's node count. O(n):
    /// for invariant checks.
    pub(crate) fn check(&self, tree: &OrderTree) -> usize {
        let mut stack: Vec<u64> = tree.root.into_iter().collect();
        let mut n = 0;
        while let Some(id) = stack.pop() {
            let node = self.node(id);
            n += 1;
            assert!(n <= self.nodes.len(), "order tree loops");
            for child in [node.left, node.right].into_iter().flatten() {
                let c = self.node(child);
                assert!(
                    c.priority <= node.priority,
                    "order tree: heap order at {id}"
                );
                stack.push(child);
            }
            if let Some(l) = node.left {
                assert!(self.node(l).key < node.key, "order tree: left key at {id}");
            }
            if let Some(r) = node.right {
                assert!(self.node(r).key > node.key, "order tree: right key at {id}");
            }
        }
        assert_eq!(n, tree.len, "order tree size");
        let entries = self.entries(tree);
        let treap = &entries[usize::from(tree.front.is_some())..];
        assert_eq!(tree.first, treap.first().copied(), "order tree: kept first");
        assert!(
            entries.windows(2).all(|w| w[0].0 < w[1].0),
            "order tree: keys out of order"
        );
        n
    }

    /// Panics if the slab is inconsistent or holds nodes outside the trees whose sizes add up
    /// to `linked`.
    pub(crate) fn check_slab(&self, linked: usize) {
        self.nodes.check();
        assert_eq!(self.nodes.len(), linked, "order nodes outside every tree");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    proptest::proptest! {
        /// Several trees sharing one slab against one `BTreeMap` each: inserts, removals (of
        /// present and absent keys) and pops of the first, `check` after each step.
        #[test]
        fn trees_follow_a_model_of_btreemaps(
            ops in proptest::collection::vec(
                (0u8..4, 0usize..3, 0u64..8, 0u64..40, 0usize..64), 1..400)
        ) {
            let mut orders = Orders::default();
            let mut trees: Vec<OrderTree> = (0..3).map(|_| OrderTree::default()).collect();
            let mut models: Vec<BTreeMap<OrderKey, u64>> = vec![BTreeMap::new(); 3];
            let mut slot = 0;
            for (op, t, deadline, seq, pick) in ops {
                let (tree, model) = (&mut trees[t], &mut models[t]);
                let key = (deadline, seq);
                match op {
                    0 | 1 => {
                        if let std::collections::btree_map::Entry::Vacant(e) = model.entry(key) {
                            slot += 1;
                            e.insert(slot);
                            orders.insert(tree, key, slot);
                        }
                    }
                    2 => {
                        // A present key when there is one (by `pick`), else the absent `key`.
                        let key = model.keys().nth(pick % model.len().max(1)).copied().unwrap_or(key);
                        proptest::prop_assert_eq!(orders.remove(tree, key), model.remove(&key));
                    }
                    _ => {
                        let first = model.first_key_value().map(|(&k, &s)| (k, s));
                        proptest::prop_assert_eq!(orders.first(tree), first);
                        if let Some((k, s)) = first {
                            proptest::prop_assert_eq!(orders.remove(tree, k), Some(s));
                            model.remove(&k);
                        }
                    }
                }
                let mut linked = 0;
                for (tree, model) in trees.iter().zip(&models) {
                    linked += orders.check(tree);
                    proptest::prop_assert_eq!(tree.len(), model.len());
                    proptest::prop_assert_eq!(
                        orders.entries(tree),
                        model.iter().map(|(&k, &s)| (k, s)).collect::<Vec<_>>()
                    );
                }
                orders.check_slab(linked);
            }
        }
    }

    #[test]
    fn the_front_entry_leaves_and_comes_back_without_a_treap_node() {
        let mut orders = Orders::default();
        let mut tree = OrderTree::default();
        for seq in 1..=3 {
            orders.insert(&mut tree, (0, seq), seq);
        }
        assert_eq!(
            (orders.len(), tree.len()),
            (2, 3),
            "the smallest is held in front"
        );
        // The front package drains and is requeued: no node is made or freed either way.
        assert_eq!(orders.remove(&mut tree, (0, 1)), Some(1));
        assert_eq!(orders.first(&tree), Some(((0, 2), 2)));
        orders.insert(&mut tree, (0, 1), 1);
        assert_eq!((orders.len(), tree.len()), (2, 3));
        // A key below the front takes its place; the old front joins the treap.
        orders.insert(&mut tree, (0, 0), 0);
        assert_eq!((orders.len(), tree.len()), (3, 4));
        assert_eq!(orders.check(&tree), 3);
        let keys: Vec<u64> = orders.entries(&tree).iter().map(|e| e.1).collect();
        assert_eq!(keys, vec![0, 1, 2, 3]);
        // A treap key removed while a front is held leaves the front alone.
        assert_eq!(orders.remove(&mut tree, (0, 2)), Some(2));
        assert_eq!(orders.first(&tree), Some(((0, 0), 0)));
        orders.check(&tree);
    }

    #[test]
    fn sorted_inserts_keep_the_tree_shallow() {
        // Keys in increasing order, the worst case of an unbalanced tree: the treap's depth
        // stays logarithmic.
        let mut orders = Orders::default();
        let mut tree = OrderTree::default();
        let n = 100_000u64;
        for seq in 0..n {
            orders.insert(&mut tree, (u64::MAX, seq), seq);
        }
        let mut depth = 0;
        let mut stack = vec![(tree.root.unwrap(), 1)];
        while let Some((id, d)) = stack.pop() {
            depth = depth.max(d);
            let node = orders.node(id);
            stack.extend(
                [node.left, node.right]
                    .into_iter()
                    .flatten()
                    .map(|c| (c, d + 1)),
            );
        }
        // 2 ln(10^5) is 23; a sorted chain would be 10^5.
        assert!(depth <= 60, "depth {depth} for {n} sorted keys");
        assert_eq!(orders.first(&tree), Some(((u64::MAX, 0), 0)));
        // The first key, below an empty treap, is held in front.
        assert_eq!(orders.len(), n as usize - 1);
        assert_eq!(tree.len(), n as usize);
        for seq in 0..n {
            assert_eq!(orders.first(&tree), Some(((u64::MAX, seq), seq)));
            assert_eq!(orders.remove(&mut tree, (u64::MAX, seq)), Some(seq));
        }
        assert!(tree.is_empty());
        assert_eq!(orders.len(), 0);
    }
}
