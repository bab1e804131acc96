//! Class dispatch: queued class tasks meet the workers of the kinds that serve their class.
//!
//! Two ways in, both without looking at every class:
//!
//! * **a worker can take more** (a credit, freed resources: [`Core::offer_classes`]): it takes
//!   the best task of its kind's ready classes, the front of [`Kind::ready`] (head priority,
//!   then the class served longest ago, so classes of equal priority take turns), again while
//!   it has a credit. A class whose request it cannot fit now, whose head has a copy on it, or
//!   whose head's input is on another worker that can take it (`near`) is passed over for the
//!   next. A worker left with a credit and nothing to take is offered to each class of its
//!   kind (once: `Worker::offered_all`) and waits there.
//! * **a class's head task changes** (a task queued, taken or cancelled) while servers wait in
//!   its offers: the class is placed on the first offered server that can start its head (the
//!   worker holding the head's input first, `near`), which then takes its best task as above.
//!
//! Cost per assignment: O(log classes) in the kind's ready set, plus the classes passed over
//! (none unless the worker's free resources do not fit the best one), plus one re-keying of the
//! served class in the ready set of each kind that serves it (its turn and head priority
//! changed). A worker going idle offers itself to its kind's classes, O(classes of the kind),
//! once per idle spell; stale offers are dropped when reached, each made by an earlier event.
//!
//! [`Kind::ready`]: crate::kind::Kind::ready

use std::cmp::Reverse;

use super::timers::Results;
use super::Core;
use crate::event::AssignTask;
use crate::ids::{Instant, TaskId, WorkerId};

/// Offered servers holding a copy of a class's head task (or passed over for its `near`
/// worker) that a placement passes over before it gives up for this round (copies of one task
/// are at most 16).
const MAX_CANDIDATES: usize = 32;

impl Core {
    /// Queues a new task at the back of its class's queue or the core's.
    pub(super) fn push_new(
        &mut self,
        class: Option<u64>,
        slot: u64,
        key: crate::queue::QueueKey,
        est_us: u64,
        id: TaskId,
    ) -> u64 {
        match class.and_then(|c| self.classes.get_mut(c).map(|q| (c, q))) {
            Some((c, q)) => {
                let pos = q
                    .queue
                    .push_back(&mut self.queue_store, slot, key, est_us, id);
                self.class_queue_changed(c);
                pos
            }
            None => self
                .queue
                .push_back(&mut self.queue_store, slot, key, est_us, id),
        }
    }

    /// A task was queued in or taken out of the class's queue: its entry in its kinds' ready
    /// sets follows its head priority, and a server waiting in its offers gets a look at its
    /// head. O(kinds of the class x log classes).
    pub(super) fn class_queue_changed(&mut self, slot: u64) {
        self.rekey_class(slot);
        let Some(c) = self.classes.get_mut(slot) else {
            return;
        };
        if c.has_offers() && !c.queue.is_empty() {
            self.want_pass(slot);
        }
    }

    /// Places the class on a waiting server after the workers of this event are served.
    fn want_pass(&mut self, slot: u64) {
        if let Some(c) = self.classes.get_mut(slot).filter(|c| !c.in_pass) {
            c.in_pass = true;
            self.class_pass.push(slot);
        }
    }

    /// Puts the class's entry in each of its kinds' ready sets at its current head priority
    /// and turn (or takes it out when nothing is queued).
    fn rekey_class(&mut self, slot: u64) {
        let Some(c) = self.classes.get_mut(slot) else {
            return;
        };
        let key = c.queue.top_priority().map(|p| (p, c.turn));
        if key == c.ready_key {
            return;
        }
        let old = std::mem::replace(&mut c.ready_key, key);
        for &kind in &c.kinds {
            let k = self.kinds.get_mut(kind).expect("a class's kind is live");
            if let Some((p, turn)) = old {
                k.ready.remove(&(Reverse(p), turn, slot));
            }
            if let Some((p, turn)) = key {
                k.ready.insert((Reverse(p), turn, slot));
            }
        }
    }

    /// Places queued class tasks on the workers that got a credit or freed resources this
    /// event, then on the servers waiting for the classes whose head changed. Returns the
    /// assignments per worker.
    pub(super) fn dispatch_classes(
        &mut self,
        now: Instant,
        dropped: &mut Results,
        batches: &mut Vec<(WorkerId, Vec<AssignTask>)>,
    ) {
        while !self.class_workers.is_empty() || !self.class_pass.is_empty() {
            let mut workers = std::mem::take(&mut self.class_workers);
            for &worker in &workers {
                self.serve_worker(worker, now, dropped, batches);
            }
            workers.clear();
            if self.class_workers.is_empty() {
                // Keeps the buffer: no allocation per event.
                self.class_workers = workers;
            }
            while let Some(slot) = self.class_pass.pop() {
                let Some(c) = self.classes.get_mut(slot) else {
                    continue;
                };
                c.in_pass = false;
                while let Some(worker) = self.place_in_class(slot) {
                    self.serve_worker(worker, now, dropped, batches);
                }
            }
        }
    }

    /// The worker takes the best task of its kind's ready classes that it can start, while it
    /// has a credit; left with a credit and nothing to take, it waits in its classes' offers.
    fn serve_worker(
        &mut self,
        worker: WorkerId,
        now: Instant,
        dropped: &mut Results,
        batches: &mut Vec<(WorkerId, Vec<AssignTask>)>,
    ) {
        loop {
            let Some(w) = self.workers.get(&worker).filter(|w| w.is_hungry()) else {
                return;
            };
            let Some(k) = w.kind.and_then(|kind| self.kinds.get(kind)) else {
                return;
            };
            let mut chosen = None;
            let mut passed_for_near = Vec::new();
            for &(_, _, slot) in &k.ready {
                let Some(c) = self.classes.get(slot) else {
                    continue;
                };
                if !w.has_free(&c.resources) {
                    continue;
                }
                let Some(head) = c.queue.peek(&self.queue_store) else {
                    continue;
                };
                if self.conflicts(head, worker) {
                    continue;
                }
                if self.class_prefers_other(slot, head, worker).is_some() {
                    passed_for_near.push(slot);
                    continue;
                }
                chosen = Some(slot);
                break;
            }
            for slot in passed_for_near {
                // The worker holding its input takes it, or, if that one gets busy with another
                // class first, the pass finds this worker waiting in the offers.
                self.want_pass(slot);
            }
            let Some(slot) = chosen else {
                self.offer_idle(worker);
                return;
            };
            self.start_in_class(slot, worker, now, dropped, batches);
        }
    }

    /// Starts the head task of the class on the worker (or drops it, late), its turn taken.
    fn start_in_class(
        &mut self,
        slot: u64,
        worker: WorkerId,
        now: Instant,
        dropped: &mut Results,
        batches: &mut Vec<(WorkerId, Vec<AssignTask>)>,
    ) {
        let c = self.classes.get_mut(slot).expect("a ready class is live");
        let (id, pkg) = c
            .queue
            .pop(&mut self.queue_store)
            .expect("a ready class has a task");
        if self.cannot_make_it(id, pkg, now) {
            // Queued back and finished: the class's key follows.
            self.drop_late(id, pkg, now, dropped);
            return;
        }
        let mut assignment = self.assign(id, worker, now);
        let c = self.classes.get_mut(slot).expect("chosen");
        c.running += 1;
        c.turn = self.next_turn;
        self.next_turn += 1;
        assignment.res = c.resources.clone();
        let w = self.workers.get_mut(&worker).expect("placed on");
        w.account(&assignment.res, true);
        w.holding.insert(id, slot);
        self.class_queue_changed(slot);
        match batches.iter_mut().find(|(b, _)| *b == worker) {
            Some((_, tasks)) => tasks.push(assignment),
            None => batches.push((worker, vec![assignment])),
        }
    }

    /// The worker (hungry, nothing it can take) waits in the offers of every class of its
    /// kind; O(classes of the kind), once until a placement pops it from one.
    fn offer_idle(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.offered_all {
            return;
        }
        w.offered_all = true;
        let Some(k) = w.kind.and_then(|kind| self.kinds.get(kind)) else {
            return;
        };
        let bound = 2 * self.workers.len() + 16;
        for &slot in &k.classes {
            let c = self.classes.get_mut(slot).expect("a kind's class is live");
            c.offer(worker);
            if c.offer_entries() > bound {
                // Offers of lost workers pile up in a class nobody placed for a while.
                let (workers, kinds) = (&self.workers, c.kinds.clone());
                c.retain_offers(|id| {
                    workers
                        .get(&id)
                        .and_then(|w| w.kind)
                        .is_some_and(|k| kinds.contains(&k))
                });
            }
        }
    }

    /// The `near` worker of the class's head task, when it is another worker that serves the
    /// class and can start the task now (a credit, the request free, no copy of it): the task
    /// waits for it instead of moving its input (`locality.rs`). O(kinds of the class).
    fn class_prefers_other(&self, slot: u64, head: TaskId, worker: WorkerId) -> Option<WorkerId> {
        let near = self
            .tasks
            .get(head.0)
            .and_then(|t| self.packages.get(t.package))
            .map(|p| p.opts.near)
            .filter(|&near| near != 0 && near != worker.0)?;
        let near = WorkerId(near);
        self.can_start_in_class(slot, head, near).then_some(near)
    }

    /// The worker serves the class, has a credit and the request free, and holds no copy of
    /// `head`.
    fn can_start_in_class(&self, slot: u64, head: TaskId, worker: WorkerId) -> bool {
        let (Some(c), Some(w)) = (self.classes.get(slot), self.workers.get(&worker)) else {
            return false;
        };
        w.is_hungry()
            && w.kind.is_some_and(|k| c.kinds.contains(&k))
            && w.has_free(&c.resources)
            && !self.conflicts(head, worker)
    }

    /// A server waiting for the class that can start its head task now: the head's `near`
    /// worker if it can, else an offered server with a credit, the request free and no copy
    /// of the head, taken off the class's offers. Offered servers that cannot take a task are
    /// dropped; those holding a copy of the head (or passed over for its `near` worker) are
    /// put back in front, at most [`MAX_CANDIDATES`] of them. Amortised O(1): each dropped
    /// offer was made by an earlier event.
    fn place_in_class(&mut self, slot: u64) -> Option<WorkerId> {
        let head = self.classes.get(slot)?.queue.peek(&self.queue_store)?;
        if let Some(near) = self.tasks.get(head.0).and_then(|t| {
            let near = self.packages.get(t.package)?.opts.near;
            (near != 0).then_some(WorkerId(near))
        }) {
            if self.can_start_in_class(slot, head, near) {
                return Some(near);
            }
        }
        let mut aside = Vec::new();
        let mut found = None;
        while aside.len() < MAX_CANDIDATES {
            let Some(id) = self.classes.get_mut(slot)?.pop_offered() else {
                break;
            };
            if let Some(w) = self.workers.get_mut(&id) {
                w.offered_all = false;
            }
            if !self.can_start_in_class(slot, head, id) {
                let c = self.classes.get(slot)?;
                let serves_with_room = self.workers.get(&id).is_some_and(|w| {
                    w.is_hungry()
                        && w.kind.is_some_and(|k| c.kinds.contains(&k))
                        && w.has_free(&c.resources)
                });
                if serves_with_room {
                    // It holds a copy of the head: another task of the class may suit it.
                    aside.push(id);
                }
                continue;
            }
            found = Some(id);
            break;
        }
        let c = self.classes.get_mut(slot)?;
        for id in aside.into_iter().rev() {
            c.offer_front(id);
        }
        found
    }

    /// A worker got a credit (or freed resources): class dispatch gives it the best task of
    /// its kind's ready classes. O(1) here.
    pub(super) fn offer_classes(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        if w.kind.is_none() || !w.is_hungry() {
            return;
        }
        self.class_workers.push(worker);
    }

    /// A task leaves its worker (answered, returned, requeued): what it held is free again.
    pub(super) fn free_resources(&mut self, worker: WorkerId, id: TaskId) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let Some(slot) = w.holding.remove(&id) else {
            return;
        };
        let Some(c) = self.classes.get_mut(slot) else {
            return;
        };
        c.running = c.running.saturating_sub(1);
        w.account(&c.resources, false);
        self.offer_classes(worker);
    }

    /// Takes a queued task of the package in `slot` off its queue (its class's or the core's).
    pub(super) fn unqueue(&mut self, slot: u64, pos: u64) {
        match self.packages.get(slot).and_then(|p| p.class) {
            Some(class) => {
                if let Some(c) = self.classes.get_mut(class) {
                    c.queue.remove(&mut self.queue_store, slot, pos);
                    self.class_queue_changed(class);
                }
            }
            None => self.queue.remove(&mut self.queue_store, slot, pos),
        }
    }
}
