//! [`ClassTable`]: resource classes, the requests packages make of their workers.
//!
//! A package that asks for resources (`gpu=1`) or labels (`zone=a`) queues its tasks in the
//! class of that exact request, not in the core's ready queue: each class has its own
//! [`ReadyQueue`] (so priorities, fair share and EDF hold within it) and the list of connected
//! workers whose totals and labels can serve it. Which workers can serve a class is decided
//! when the class is made (one pass over the workers) and when a worker joins (one check per
//! class), never while dispatching, so placing a task looks at a bounded number of servers
//! from a rotating start, as the placement of calls does. Packages without a request use the
//! core's queue and none of this.

use std::collections::VecDeque;

use rtpool_proto::{Labels, Resources};

use crate::ids::{Instant, WorkerId};
use crate::queue::ReadyQueue;
use crate::table::{IdMap, IdSet, Map, Table};

/// One request: the resources each task holds while it runs and the labels its worker needs.
#[derive(Debug)]
pub(crate) struct ResClass {
    pub(crate) resources: Resources,
    pub(crate) labels: Labels,
    /// Connected workers that can serve it, in joining order.
    pub(crate) servers: Vec<WorkerId>,
    positions: IdMap<WorkerId, usize>,
    /// Servers that may take one of its tasks now: offered when they get a credit or free
    /// resources, each at most once (`offered`); placement pops them front to back and drops
    /// those that cannot (no credit, the request not free: they are offered again when that
    /// changes), so it never looks at a busy server twice and never misses an idle one, however
    /// many servers the class has. Lazily cleaned, like the core's hungry ring.
    ready: VecDeque<WorkerId>,
    offered: IdSet<WorkerId>,
    /// Slots of its servers (admission control counts only these).
    pub(crate) slots: u64,
    /// Its queued tasks.
    pub(crate) queue: ReadyQueue,
    /// Live packages of this class.
    pub(crate) packages: u64,
    /// Its tasks running now (each holds the request on its worker).
    pub(crate) running: u64,
    /// When its queued tasks fail if no server returns (armed while it has none).
    pub(crate) orphan_at: Option<Instant>,
}

impl ResClass {
    /// A worker with these totals and labels can serve it.
    pub(crate) fn is_served_by(&self, totals: &Resources, labels: &Labels) -> bool {
        self.resources.shortfall(totals).is_none() && self.labels.mismatch(labels).is_none()
    }

    /// Adds a server; false if it already serves this.
    pub(crate) fn add_server(&mut self, worker: WorkerId, slots: u32) -> bool {
        if self.positions.contains_key(&worker) {
            return false;
        }
        self.positions.insert(worker, self.servers.len());
        self.servers.push(worker);
        self.slots += u64::from(slots);
        true
    }

    /// Removes a server, O(1); false if it did not serve this.
    pub(crate) fn remove_server(&mut self, worker: WorkerId, slots: u32) -> bool {
        let Some(pos) = self.positions.remove(&worker) else {
            return false;
        };
        self.servers.swap_remove(pos);
        if let Some(&moved) = self.servers.get(pos) {
            self.positions.insert(moved, pos);
        }
        self.offered.remove(&worker);
        if self.ready.len() > 2 * self.servers.len() + 16 {
            let (positions, offered) = (&self.positions, &self.offered);
            self.ready
                .retain(|w| positions.contains_key(w) && offered.contains(w));
        }
        self.slots = self.slots.saturating_sub(u64::from(slots));
        true
    }

    /// Offers a server for the next placement (at the back; ignored if it is offered already
    /// or does not serve this).
    pub(crate) fn offer(&mut self, worker: WorkerId) {
        if self.positions.contains_key(&worker) && self.offered.insert(worker) {
            self.ready.push_back(worker);
        }
    }

    /// Offers a server again at the front (it was popped and not used).
    pub(crate) fn offer_front(&mut self, worker: WorkerId) {
        if self.positions.contains_key(&worker) && self.offered.insert(worker) {
            self.ready.push_front(worker);
        }
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

    /// Offered servers (for the invariant walk).
    pub(crate) fn offered(&self) -> impl Iterator<Item = &WorkerId> {
        self.offered.iter()
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
            servers: Vec::new(),
            positions: IdMap::default(),
            ready: VecDeque::new(),
            offered: IdSet::default(),
            slots: 0,
            queue: ReadyQueue::default(),
            packages: 0,
            running: 0,
            orphan_at: None,
        });
        self.by_request.insert((resources, labels), slot);
        slot
    }

    /// Forgets an unused class (the caller took it off its servers' lists).
    pub(crate) fn remove(&mut self, slot: u64) -> Option<ResClass> {
        let c = self.classes.remove(slot)?;
        self.by_request
            .remove(&(c.resources.clone(), c.labels.clone()));
        Some(c)
    }
}
