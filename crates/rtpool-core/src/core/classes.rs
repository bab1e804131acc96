//! Resource classes in the core: a package's request interned at submission, the workers that
//! can serve each class, placement of queued class tasks on a server with the resources free,
//! and what a task holds of its worker while it runs (`class.rs` has the table itself).
//!
//! Cost: a submission looks its request up in a hash map (and makes a new class with one pass
//! over the workers, rarely); a joining worker is checked against each class, O(classes);
//! dispatch looks at the classes with queued tasks and, per class, at its offered servers
//! (those that got a credit or freed resources since it last looked, lazily cleaned): O(classes)
//! per assignment plus the stale offers it drops (each made by an earlier event), independent
//! of the numbers of tasks and workers. A credit or a freed request offers its worker to each
//! class it serves: O(classes).

use std::cmp::Reverse;

use super::timers::Results;
use super::{Core, Timer};
use crate::event::{AssignTask, PackageOpts, RejectReason, TaskStatus, Unschedulable};
use crate::ids::{Instant, TaskId, WorkerId};

/// Offered servers holding a copy of a class's head task that a placement passes over before
/// it gives up for this round (copies of one task are at most 16).
const MAX_CANDIDATES: usize = 32;

/// Workers looked at to say what the best of them has, in an error message.
const MAX_DESCRIBED: usize = 4096;

impl Core {
    /// The class of a package's request (made if new): `Ok(None)` without a request. Refuses
    /// one that no connected worker can serve when its policy is `error`, and one past the
    /// class limit.
    pub(super) fn class_for(&mut self, opts: &PackageOpts) -> Result<Option<u64>, RejectReason> {
        if opts.resources.is_empty() && opts.labels.is_empty() {
            return Ok(None);
        }
        let slot = match self.classes.find(&opts.resources, &opts.labels) {
            Some(slot) => slot,
            None => self.make_class(opts)?,
        };
        let class = self.classes.get(slot).expect("just found");
        if class.servers.is_empty() && opts.unschedulable == Unschedulable::Error {
            let message = self.unschedulable_message(slot);
            self.forget_class_if_unused(slot);
            return Err(RejectReason::Unschedulable(message));
        }
        Ok(Some(slot))
    }

    /// The class of a package restored from the journal: it waits for a server whatever its
    /// policy (its workers may not have reconnected yet); `None` past the class limit (it
    /// then queues with the packages that ask for nothing, which is logged by the caller).
    pub(super) fn restored_class(&mut self, slot: u64) -> Option<u64> {
        let mut opts = self.packages.get(slot)?.opts.clone();
        opts.unschedulable = Unschedulable::Wait;
        self.class_for(&opts).ok().flatten()
    }

    /// Puts the package in `slot` in its class (`None`: the core's queue).
    pub(super) fn set_class(&mut self, slot: u64, class: Option<u64>) {
        let Some(class) = class else {
            return;
        };
        if let Some(p) = self.packages.get_mut(slot) {
            p.class = Some(class);
        }
        if let Some(c) = self.classes.get_mut(class) {
            c.packages += 1;
        }
    }

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
                self.waiting_classes.insert(c);
                q.queue.push_back(slot, key, est_us, id)
            }
            None => self.queue.push_back(slot, key, est_us, id),
        }
    }

    fn make_class(&mut self, opts: &PackageOpts) -> Result<u64, RejectReason> {
        if self.classes.len() >= self.config.max_resource_classes {
            self.sweep_classes();
        }
        if self.classes.len() >= self.config.max_resource_classes {
            return Err(RejectReason::InvalidOptions(format!(
                "{} different requests of resources and labels are in use, the master's limit; \
                 ask for one of the requests already in use, or wait for their packages to end",
                self.classes.len()
            )));
        }
        let slot = self
            .classes
            .insert(opts.resources.clone(), opts.labels.clone());
        let class = self.classes.get_mut(slot).expect("just made");
        for (&id, w) in self.workers.iter_mut() {
            if class.is_served_by(&w.resources, &w.labels) {
                class.add_server(id, if w.draining { 0 } else { w.slots });
                if w.is_hungry() {
                    class.offer(id);
                }
                w.classes.push(slot);
            }
        }
        Ok(slot)
    }

    /// Forgets every unused class (at the class limit: rare), taking each off its servers.
    fn sweep_classes(&mut self) {
        let unused: Vec<u64> = self
            .classes
            .iter()
            .filter(|(_, c)| c.is_unused())
            .map(|(slot, _)| slot)
            .collect();
        if unused.is_empty() {
            return;
        }
        for w in self.workers.values_mut() {
            w.classes.retain(|c| !unused.contains(c));
        }
        for slot in unused {
            self.forget_class_calls(slot);
            self.waiting_classes.remove(&slot);
            if let Some(at) = self.classes.remove(slot).and_then(|c| c.orphan_at) {
                self.timers.remove(&(at, Timer::Class(slot)));
            }
        }
    }

    /// Forgets a class made for a package that was then refused, if nothing else uses it.
    pub(super) fn forget_class_if_unused(&mut self, slot: u64) {
        let Some(class) = self.classes.get(slot) else {
            return;
        };
        if !class.is_unused() {
            return;
        }
        if let Some(at) = class.orphan_at {
            self.timers.remove(&(at, Timer::Class(slot)));
        }
        let servers = class.servers.clone();
        for id in servers {
            if let Some(w) = self.workers.get_mut(&id) {
                w.classes.retain(|&c| c != slot);
            }
        }
        self.forget_class_calls(slot);
        self.waiting_classes.remove(&slot);
        self.classes.remove(slot);
    }

    /// Why no connected worker can serve the class: the first resource or label that none
    /// has, and the most any has of it.
    pub(super) fn unschedulable_message(&self, slot: u64) -> String {
        let class = self.classes.get(slot).expect("live class");
        let asks = class.describe();
        let n = self.workers.len();
        let mut why = String::new();
        if n == 0 {
            why.push_str("no worker is connected");
        } else if let Some((name, asked)) = class.resources.iter().find(|(name, asked)| {
            !self
                .workers
                .values()
                .take(MAX_DESCRIBED)
                .any(|w| w.resources.get(name) >= *asked)
        }) {
            let most = self
                .workers
                .values()
                .take(MAX_DESCRIBED)
                .map(|w| w.resources.get(name))
                .max()
                .unwrap_or(0);
            why = format!(
                "it asks {name}={asked}, the most any worker has is {name}={most} ({n} workers \
                 connected)"
            );
        } else if let Some((key, value)) = class.labels.iter().find(|(k, v)| {
            !self
                .workers
                .values()
                .take(MAX_DESCRIBED)
                .any(|w| w.labels.get(k) == Some(*v))
        }) {
            why = format!("no worker has the label {key}={value} ({n} workers connected)");
        } else {
            why = format!("no single worker has all of it ({n} workers connected)");
        }
        format!(
            "no connected worker can run this package: it asks {asks}; {why}; start a worker \
             with what it asks (rtpool worker --resources / --label), or submit with \
             unschedulable=\"wait\" to queue it until one joins"
        )
    }

    /// The warning for the `ACCEPTED` of a package whose class no connected worker serves
    /// (it waits, policy `wait`), or `None`.
    pub fn unschedulable_notice(&self, package: crate::ids::PackageId) -> Option<String> {
        let slot = *self.package_slots.get(&package)?;
        let p = self.packages.get(slot)?;
        let class = p.class?;
        if p.calls {
            return self.call_class_notice(slot, class);
        }
        let c = self.classes.get(class)?;
        c.servers.is_empty().then(|| {
            format!(
                "queued until a worker that can run it joins: {}",
                self.unschedulable_message(class)
            )
        })
    }

    /// A joining worker becomes a server of each class it can serve.
    pub(super) fn join_classes(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let slots: Vec<u64> = self.classes.iter().map(|(slot, _)| slot).collect();
        for slot in slots {
            let class = self.classes.get_mut(slot).expect("listed");
            if class.is_served_by(&w.resources, &w.labels) && class.add_server(worker, w.slots) {
                if let Some(at) = class.orphan_at.take() {
                    self.timers.remove(&(at, Timer::Class(slot)));
                }
                w.classes.push(slot);
                if !class.queue.is_empty() {
                    self.waiting_classes.insert(slot);
                }
            }
        }
    }

    /// A worker leaving (lost or draining) stops serving its classes; the tasks it ran hold
    /// nothing any more. Arms the grace timer of classes left without a server.
    pub(super) fn leave_classes(
        &mut self,
        worker: WorkerId,
        w: &crate::worker::Worker,
        now: Instant,
    ) {
        for (_, &slot) in w.holding.iter() {
            if let Some(c) = self.classes.get_mut(slot) {
                c.running = c.running.saturating_sub(1);
            }
        }
        for &slot in &w.classes {
            let Some(c) = self.classes.get_mut(slot) else {
                continue;
            };
            c.remove_server(worker, if w.draining { 0 } else { w.slots });
            if c.servers.is_empty() && c.orphan_at.is_none() {
                let at = Instant(now.0.saturating_add(self.config.service_grace_ns));
                c.orphan_at = Some(at);
                self.timers.insert((at, Timer::Class(slot)), ());
            }
        }
    }

    /// The grace period of a class without servers passed: its queued tasks of packages whose
    /// policy is `error` fail (status 3); those that wait stay queued.
    pub(super) fn on_class_timer(&mut self, slot: u64, now: Instant, results: &mut Results) {
        let Some(c) = self.classes.get_mut(slot) else {
            return;
        };
        c.orphan_at = None;
        if !c.servers.is_empty() {
            return;
        }
        let ids: Vec<(u64, TaskId)> = c.queue.iter().map(|(slot, _, _, id)| (slot, id)).collect();
        let message = format!(
            "no connected worker can run this task any more: the last worker with {} left and \
             none came back within {:.0} s",
            c.describe(),
            self.config.service_grace_ns as f64 / 1e9
        );
        for (pkg, id) in ids {
            let waits = self
                .packages
                .get(pkg)
                .is_some_and(|p| p.opts.unschedulable == Unschedulable::Wait);
            if waits {
                continue;
            }
            let task = self.tasks.get(id.0).expect("queued task is live");
            let outcome = Self::system_outcome(task, TaskStatus::Failed, message.clone(), now);
            let outcome = self.finish_task(id, outcome, now);
            results.add(self, pkg, outcome);
        }
    }

    /// Places queued class tasks while a server of their class has a credit and the request
    /// free: each time the class whose head task has the highest priority, classes of equal
    /// priority in turn (round robin from the one after the last served). Returns the
    /// assignments per worker.
    pub(super) fn dispatch_classes(
        &mut self,
        now: Instant,
        dropped: &mut Results,
        batches: &mut Vec<(WorkerId, Vec<AssignTask>)>,
    ) {
        if self.waiting_classes.is_empty() {
            return;
        }
        loop {
            let mut best: Option<(Reverse<i32>, u64, WorkerId)> = None;
            // From the class after the last one served: at equal priority classes take turns.
            let turn = self.class_turn;
            let waiting: Vec<u64> = (self.waiting_classes.range(turn..))
                .chain(self.waiting_classes.range(..turn))
                .copied()
                .collect();
            for slot in waiting {
                let Some(priority) = self.classes.get(slot).and_then(|c| c.queue.top_priority())
                else {
                    self.waiting_classes.remove(&slot);
                    continue;
                };
                let key = Reverse(priority);
                if best.as_ref().is_some_and(|(k, _, _)| *k <= key) {
                    continue;
                }
                let Some(server) = self.place_in_class(slot) else {
                    // No server can take its head now: it waits for a credit or freed
                    // resources, which put it back (`offer_classes`, `free_resources`).
                    self.waiting_classes.remove(&slot);
                    continue;
                };
                if let Some((_, old, worker)) = best.replace((key, slot, server)) {
                    if let Some(c) = self.classes.get_mut(old) {
                        c.offer_front(worker);
                    }
                }
            }
            let Some((_, slot, worker)) = best else {
                break;
            };
            self.class_turn = slot + 1;
            let c = self.classes.get_mut(slot).expect("chosen");
            let (id, pkg) = c.queue.pop().expect("a waiting class has a task");
            if self.cannot_make_it(id, pkg, now) {
                if let Some(c) = self.classes.get_mut(slot) {
                    c.offer_front(worker);
                }
                self.drop_late(id, pkg, now, dropped);
                continue;
            }
            let mut assignment = self.assign(id, worker, now);
            let c = self.classes.get_mut(slot).expect("chosen");
            c.running += 1;
            assignment.res = c.resources.clone();
            let w = self.workers.get_mut(&worker).expect("placed on");
            w.account(&assignment.res, true);
            w.holding.insert(id, slot);
            if w.is_hungry() && w.has_free(&c.resources) {
                // At the back: servers with room take its tasks in turn.
                c.offer(worker);
            }
            match batches.iter_mut().find(|(b, _)| *b == worker) {
                Some((_, tasks)) => tasks.push(assignment),
                None => batches.push((worker, vec![assignment])),
            }
        }
    }

    /// An offered server of the class that has a credit, the request free and no other copy
    /// of the head task, taken off the class's offers (the caller uses it or offers it back).
    /// Offered servers that cannot take a task are dropped; those holding a copy of the head
    /// are put back in front, at most [`MAX_CANDIDATES`] of them. Amortised O(1): each
    /// dropped offer was made by an earlier event.
    fn place_in_class(&mut self, slot: u64) -> Option<WorkerId> {
        let head = self.classes.get(slot)?.queue.peek()?;
        let mut aside = Vec::new();
        let mut found = None;
        while aside.len() < MAX_CANDIDATES {
            let c = self.classes.get_mut(slot)?;
            let Some(id) = c.pop_offered() else {
                break;
            };
            let fits = self
                .workers
                .get(&id)
                .is_some_and(|w| w.is_hungry() && w.has_free(&c.resources));
            if !fits {
                continue;
            }
            if self.conflicts(head, id) {
                aside.push(id);
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

    /// A worker got a credit (or freed resources): offered to each class it serves; a class
    /// with queued tasks is looked at by the next dispatch. O(classes it serves).
    pub(super) fn offer_classes(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        if w.classes.is_empty() || !w.is_hungry() {
            return;
        }
        for &slot in &w.classes {
            if let Some(c) = self.classes.get_mut(slot) {
                c.offer(worker);
                if !c.queue.is_empty() {
                    self.waiting_classes.insert(slot);
                }
            }
        }
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
                    c.queue.remove(slot, pos);
                }
            }
            None => self.queue.remove(slot, pos),
        }
    }

    /// A package of a class is freed: the class may be forgotten later.
    pub(super) fn class_package_freed(&mut self, class: u64) {
        if let Some(c) = self.classes.get_mut(class) {
            c.packages = c.packages.saturating_sub(1);
        }
    }

    /// Tasks queued in classes.
    pub(super) fn class_queued(&self) -> usize {
        self.classes.iter().map(|(_, c)| c.queue.len()).sum()
    }
}
