//! [`ClassTable`]: resource classes, the requests packages make of their workers.
//!
//! A package that asks for resources (`gpu=1`) or labels (`zone=a`) queues its tasks in the
//! class of that exact request, not in the core's ready queue: each class has its own
//! [`Queue`] (so priorities, fair share and EDF hold within it; its packages' entries and task
//! nodes are in the store it shares with the core's queue, `Core::queue_store`) and the list of worker
//! kinds (`kind.rs`: workers with the same totals and labels) that can serve it. Which kinds
//! can serve a class is decided when the class is made (one pass over the kinds) and when a
//! kind is made (one check per class), never while dispatching or when a worker of a known
//! kind joins. Packages without a request use the core's queue and none of this.

use std::collections::VecDeque;

use rtpool_proto::{Labels, Resources};

use crate::ids::{Instant, WorkerId};
use crate::queue::Queue;
use crate::table::{IdSet, Map, Table};

/// One request: the resources each task holds while it runs and the labels its worker needs.
///
/// `repr(C)`, the fields a requeued or queued task touches first (its queue, then the class's
/// ready key, turn and counts): a lost worker's tasks go back to as many classes as it held
/// tasks, each cold in cache, so each class costs as few cache lines as its fields allow.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ResClass {
    /// Its queued tasks.
    pub(crate) queue: Queue,
    /// The priority and turn of its entry in its kinds' ready sets (`None`: not in them; it is in
    /// them exactly while a task is queued).
    pub(crate) ready_key: Option<(i32, u64)>,
    /// Its turn among classes of equal priority: the sequence number of its last service.
    pub(crate) turn: u64,
    /// Its tasks running now (each holds the request on its worker).
    pub(crate) running: u64,
    /// It is in the core's list of classes to place this event (`class_pass`).
    pub(crate) in_pass: bool,
    /// Servers that may take one of its tasks now, for a task queued while they wait: a
    /// worker left with a credit and nothing it could take is offered to each class it serves,
    /// each at most once (`offered`); placement pops them front to back and drops those that
    /// cannot (no credit, the request not free, gone: they are offered again when they are left
    /// idle again), so it never looks at a busy server twice and never misses an idle one,
    /// however many servers the class has. Lazily cleaned, like the core's hungry ring. A
    /// worker busy with the tasks of its kind's ready classes is never offered.
    offered: IdSet<WorkerId>,
    ready: VecDeque<WorkerId>,
    /// Live packages of this class.
    pub(crate) packages: u64,
    /// When its queued tasks fail if no server returns (armed while it has none).
    pub(crate) orphan_at: Option<Instant>,
    /// Slab keys of the worker kinds that can serve it (`kind.rs`): its servers are their
    /// workers.
    pub(crate) kinds: Vec<u64>,
    pub(crate) resources: Resources,
    pub(crate) labels: Labels,
}

impl ResClass {
    /// A worker of this kind (`Worker::kind`) serves it. O(kinds that serve it).
    pub(crate) fn is_served_by_kind(&self, kind: Option<u64>) -> bool {
        kind.is_some_and(|k| self.kinds.contains(&k))
    }

    /// A worker with these totals and labels can serve it.
    pub(crate) fn is_served_by(&self, totals: &Resources, labels: &Labels) -> bool {
        self.resources.shortfall(totals).is_none() && self.labels.mismatch(labels).is_none()
    }

    /// Offers a server for the next placement (at the back; ignored if it is offered
    /// already). The caller checked that it serves this.
    pub(crate) fn offer(&mut self, worker: WorkerId) {
        if self.offered.insert(worker) {
            self.ready.push_back(worker);
        }
    }

    /// Offers a server again at the front (it was popped and not used).
    pub(crate) fn offer_front(&mut self, worker: WorkerId) {
        if self.offered.insert(worker) {
            self.ready.push_front(worker);
        }
    }

    /// Some server may be offered (lazily: it may be gone or busy).
    pub(crate) fn has_offers(&self) -> bool {
        !self.offered.is_empty()
    }

    /// Offer entries, stale ones included (to bound them).
    pub(crate) fn offer_entries(&self) -> usize {
        self.ready.len()
    }

    /// Keeps only the offers `keep` accepts (the caller's compaction of stale entries).
    pub(crate) fn retain_offers(&mut self, mut keep: impl FnMut(WorkerId) -> bool) {
        let offered = &mut self.offered;
        self.ready.retain(|&w| {
            let live = offered.contains(&w) && keep(w);
            if !live {
                offered.remove(&w);
            }
            live
        });
    }

    /// The next offered server that still serves this (it is no longer offered).
    pub(crate) fn pop_offered(&mut self) -> Option<WorkerId> {
        while let Some(worker) = self.ready.pop_front() {
            if self.offered.remove(&worker) {
                return Some(worker);
            }
        }
        None
    }

    /// `gpu=1,zone=a`: the request, resources first, as status and metrics name the class.
    pub(crate) fn describe(&self) -> String {
        let (r, l) = (self.resources.describe(), self.labels.describe());
        match (r.is_empty(), l.is_empty()) {
            (_, true) => r,
            (true, false) => l,
            (false, false) => format!("{r},{l}"),
        }
    }

    /// Nothing refers to it: no live package, no running task, nothing queued.
    pub(crate) fn is_unused(&self) -> bool {
        self.packages == 0 && self.running == 0 && self.queue.is_empty()
    }
}

/// Every resource class, by slab key, and the index from request to class.
#[derive(Debug, Default)]
pub(crate) struct ClassTable {
    classes: Table<ResClass>,
    by_request: Map<(Resources, Labels), u64>,
}

impl ClassTable {
    /// Classes now.
    pub(crate) fn len(&self) -> usize {
        self.classes.len()
    }

    pub(crate) fn get(&self, slot: u64) -> Option<&ResClass> {
        self.classes.get(slot)
    }

    pub(crate) fn get_mut(&mut self, slot: u64) -> Option<&mut ResClass> {
        self.classes.get_mut(slot)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &ResClass)> {
        self.classes.iter()
    }

    /// The class of a request, if it exists.
    pub(crate) fn find(&self, resources: &Resources, labels: &Labels) -> Option<u64> {
        self.by_request
            .get(&(resources.clone(), labels.clone()))
            .copied()
    }

    /// Makes the class of a request (the caller checked it does not exist) with no server.
    pub(crate) fn insert(&mut self, resources: Resources, labels: Labels) -> u64 {
        let slot = self.classes.insert(ResClass {
            resources: resources.clone(),
            labels: labels.clone(),
            kinds: Vec::new(),
            ready: VecDeque::new(),
            offered: IdSet::default(),
            ready_key: None,
            turn: 0,
            in_pass: false,
            queue: Queue::default(),
            packages: 0,
            running: 0,
            orphan_at: None,
        });
        self.by_request.insert((resources, labels), slot);
        slot
    }

    /// Forgets an unused class (the caller took it off its kinds).
    pub(crate) fn remove(&mut self, slot: u64) -> Option<ResClass> {
        let c = self.classes.remove(slot)?;
        self.by_request
            .remove(&(c.resources.clone(), c.labels.clone()));
        Some(c)
    }
}
