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

use rtpool_proto::{Labels, Resources};

use crate::ids::{Instant, WorkerId};
use crate::queue::ReadyQueue;
use crate::table::{IdMap, Map, Table};

/// One request: the resources each task holds while it runs and the labels its worker needs.
#[derive(Debug)]
pub(crate) struct ResClass {
    pub(crate) resources: Resources,
    pub(crate) labels: Labels,
    /// Connected workers that can serve it, in joining order.
    pub(crate) servers: Vec<WorkerId>,
    positions: IdMap<WorkerId, usize>,
    /// Where the next placement starts looking (rotates, so ties go round robin).
    pub(crate) cursor: usize,
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
        self.slots = self.slots.saturating_sub(u64::from(slots));
        true
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
            cursor: 0,
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
