//! [`KindTable`]: worker kinds, the connected workers that announced the same resources and
//! labels.
//!
//! Which resource classes a worker can serve depends only on its totals and labels, so every
//! worker of one kind serves the same classes: the core decides that once per kind (when the
//! kind is made, and when a class is made), not once per worker. A worker joining or leaving
//! a kind that exists is one hash lookup and one push or swap-remove, however many classes
//! there are; only the first worker of a new kind is checked against every class, and only
//! the last one to leave takes the kind off its classes. Each kind keeps its classes that have
//! a task queued in priority order ([`Kind::ready`]), so a worker of the kind with a credit
//! finds the best of them at the front instead of asking each class. Workers that announce
//! neither resources nor labels serve no class and belong to no kind. `class.rs` has the
//! classes; `core/classes.rs` and `core/class_dispatch.rs` what the core does with both.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rtpool_proto::{Labels, Resources};

use crate::ids::WorkerId;
use crate::table::{Map, Table};

/// Where a class stands among the ready classes of a kind: its head task's priority (highest
/// first), then its turn (the class served longest ago first, so classes of equal priority
/// take turns), then its slot (unique).
pub(crate) type ReadyKey = (Reverse<i32>, u64, u64);

/// The workers with one set of totals and labels.
#[derive(Debug)]
pub(crate) struct Kind {
    pub(crate) resources: Resources,
    pub(crate) labels: Labels,
    /// Its connected workers, draining ones included, in no order (swap-removed: each worker
    /// knows its index, `Worker::kind_pos`).
    pub(crate) workers: Vec<WorkerId>,
    /// Its workers that are not draining.
    pub(crate) active: u32,
    /// Slots of its workers that are not draining (admission control counts these).
    pub(crate) slots: u64,
    /// Slab keys of the classes it can serve.
    pub(crate) classes: Vec<u64>,
    /// Its classes with a task queued, best first ([`ReadyKey`]).
    pub(crate) ready: BTreeSet<ReadyKey>,
}

/// Every worker kind, by slab key, and the index from totals and labels to kind.
#[derive(Debug, Default)]
pub(crate) struct KindTable {
    kinds: Table<Kind>,
    by_signature: Map<(Resources, Labels), u64>,
}

impl KindTable {
    pub(crate) fn get(&self, slot: u64) -> Option<&Kind> {
        self.kinds.get(slot)
    }

    pub(crate) fn get_mut(&mut self, slot: u64) -> Option<&mut Kind> {
        self.kinds.get_mut(slot)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Kind)> {
        self.kinds.iter()
    }

    /// The kind of these totals and labels, if it exists.
    pub(crate) fn find(&self, signature: &(Resources, Labels)) -> Option<u64> {
        self.by_signature.get(signature).copied()
    }

    /// Makes the kind of a signature (the caller checked it does not exist), with no worker
    /// and no class.
    pub(crate) fn insert(&mut self, resources: Resources, labels: Labels) -> u64 {
        let slot = self.kinds.insert(Kind {
            resources: resources.clone(),
            labels: labels.clone(),
            workers: Vec::new(),
            active: 0,
            slots: 0,
            classes: Vec::new(),
            ready: BTreeSet::new(),
        });
        self.by_signature.insert((resources, labels), slot);
        slot
    }

    /// Forgets a kind (its last worker left; the caller took it off its classes).
    pub(crate) fn remove(&mut self, slot: u64) -> Option<Kind> {
        let k = self.kinds.remove(slot)?;
        self.by_signature
            .remove(&(k.resources.clone(), k.labels.clone()));
        Some(k)
    }
}
