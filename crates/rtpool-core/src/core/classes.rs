//! Resource classes in the core: a package's request interned at submission, the worker kinds
//! that can serve each class, and workers joining, draining and leaving them
//! (`class_dispatch.rs` places queued class tasks; `class.rs` and `kind.rs` have the tables).
//!
//! Cost: a submission looks its request up in a hash map (and makes a new class with one pass
//! over the kinds and over the workers of the kinds that serve it, to offer the idle ones,
//! rarely). A joining worker
//! looks its totals and labels up in a hash map and joins that kind, O(1) whatever the number
//! of classes; only the first worker of a new kind is checked against each class, O(classes).
//! A leaving (lost) worker is swap-removed from its kind, O(1) besides the tasks it held; the
//! last worker of a kind to go takes the kind off its classes, O(classes of the kind). Each
//! task it held goes back to the front of its package in its class's queue, which is O(1) and
//! touches a few cache lines of that class (the queue's hot fields first, its top priority
//! level and its front package held in front of their trees: `class.rs`, `queue/levels.rs`,
//! `order.rs`), however many classes there are; its class's ready key changes only when the
//! class had nothing queued (`class_dispatch.rs`). Whether
//! a class has a server, and its slots for admission control, are sums over its kinds
//! (`O(kinds that serve it)`, a handful unless every worker announces other totals).

use std::cmp::Reverse;

use super::timers::Results;
use super::{Core, Timer};
use crate::event::{PackageOpts, RejectReason, TaskStatus, Unschedulable};
use crate::ids::{Instant, TaskId, WorkerId};

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
        if !self.class_has_server(slot) && opts.unschedulable == Unschedulable::Error {
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
        let kinds: Vec<u64> = self
            .kinds
            .iter()
            .filter(|(_, k)| opts.resources.shortfall(&k.resources).is_none())
            .filter(|(_, k)| opts.labels.mismatch(&k.labels).is_none())
            .map(|(kind, _)| kind)
            .collect();
        for &kind in &kinds {
            let k = self.kinds.get_mut(kind).expect("listed");
            k.classes.push(slot);
            let class = self.classes.get_mut(slot).expect("just made");
            class.kinds.push(kind);
            // Its idle workers wait for this class's tasks too; the others are not offered to
            // every class of their kind any more, so they offer themselves when idle again.
            for id in &k.workers {
                let w = self
                    .workers
                    .get_mut(id)
                    .expect("a kind's worker is connected");
                if w.is_hungry() {
                    class.offer(*id);
                } else {
                    w.offered_all = false;
                }
            }
        }
        Ok(slot)
    }

    /// Whether a connected worker that is not draining can serve the class. O(its kinds).
    pub(super) fn class_has_server(&self, slot: u64) -> bool {
        self.classes.get(slot).is_some_and(|c| {
            c.kinds
                .iter()
                .any(|&k| self.kinds.get(k).is_some_and(|k| k.active > 0))
        })
    }

    /// Connected workers (draining ones included) that can serve the class. O(its kinds).
    pub(super) fn class_servers(&self, slot: u64) -> usize {
        self.classes.get(slot).map_or(0, |c| {
            c.kinds
                .iter()
                .filter_map(|&k| self.kinds.get(k))
                .map(|k| k.workers.len())
                .sum()
        })
    }

    /// Slots of the workers that can serve the class and are not draining (admission
    /// control counts only these). O(its kinds).
    pub(super) fn class_slots(&self, slot: u64) -> u64 {
        self.classes.get(slot).map_or(0, |c| {
            c.kinds
                .iter()
                .filter_map(|&k| self.kinds.get(k))
                .map(|k| k.slots)
                .sum()
        })
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
        let kinds: Vec<u64> = self.kinds.iter().map(|(kind, _)| kind).collect();
        for kind in kinds {
            let k = self.kinds.get_mut(kind).expect("listed");
            k.classes.retain(|c| !unused.contains(c));
        }
        for slot in unused {
            self.forget_class_calls(slot);
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
        for &kind in &class.kinds {
            if let Some(k) = self.kinds.get_mut(kind) {
                k.classes.retain(|&c| c != slot);
            }
        }
        self.forget_class_calls(slot);
        self.classes.remove(slot);
    }

    /// Why no connected worker can serve the class: the first resource or label that none
    /// has, and the most any has of it.
    pub(super) fn unschedulable_message(&self, slot: u64) -> String {
        let class = self.classes.get(slot).expect("live class");
        let asks = class.describe();
        let n = self.workers.values().filter(|w| !w.draining).count();
        let draining = self.workers.len() - n;
        let mut why = String::new();
        if self.class_servers(slot) > 0 {
            why = format!(
                "every worker that has it is draining ({draining} draining, {n} other workers \
                 connected)"
            );
        } else if n == 0 {
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
        self.classes.get(class)?;
        (!self.class_has_server(class)).then(|| {
            format!(
                "queued until a worker that can run it joins: {}",
                self.unschedulable_message(class)
            )
        })
    }

    /// A joining worker joins the kind of its totals and labels (made if new: one check per
    /// class), and so becomes a server of each class the kind serves. O(1) for a known kind.
    pub(super) fn join_classes(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.resources.is_empty() && w.labels.is_empty() {
            return;
        }
        // Looked up by the worker's own signature, moved out and back: no clone on the way.
        let signature = (
            std::mem::take(&mut w.resources),
            std::mem::take(&mut w.labels),
        );
        let found = self.kinds.find(&signature);
        let w = self.workers.get_mut(&worker).expect("checked");
        (w.resources, w.labels) = signature;
        let kind = match found {
            Some(kind) => kind,
            None => self.make_kind(worker),
        };
        let w = self.workers.get_mut(&worker).expect("checked");
        let k = self.kinds.get_mut(kind).expect("just found");
        w.kind = Some(kind);
        w.kind_pos = k.workers.len();
        k.workers.push(worker);
        if !w.draining {
            k.active += 1;
            k.slots += u64::from(w.slots);
            if k.active == 1 {
                self.kind_activated(kind);
            }
        }
    }

    /// Makes the kind of a worker's totals and labels, a server of each class it can serve
    /// (one check per class), with those that have tasks queued in its ready set.
    fn make_kind(&mut self, worker: WorkerId) -> u64 {
        let w = self.workers.get(&worker).expect("joining");
        let kind = self.kinds.insert(w.resources.clone(), w.labels.clone());
        let k = self.kinds.get_mut(kind).expect("just made");
        for (slot, c) in self.classes.iter() {
            if c.is_served_by(&k.resources, &k.labels) {
                k.classes.push(slot);
                if let Some((priority, turn)) = c.ready_key {
                    k.ready.insert((Reverse(priority), turn, slot));
                }
            }
        }
        let classes = k.classes.clone();
        for slot in classes {
            self.classes.get_mut(slot).expect("listed").kinds.push(kind);
        }
        kind
    }

    /// The first worker of a kind that is not draining: its classes have a server again.
    fn kind_activated(&mut self, kind: u64) {
        let k = self.kinds.get(kind).expect("live kind");
        for &slot in &k.classes {
            if let Some(at) = self.classes.get_mut(slot).and_then(|c| c.orphan_at.take()) {
                self.timers.remove(&(at, Timer::Class(slot)));
            }
        }
    }

    /// The last worker of a kind that is not draining left or drains: arms the grace timer of
    /// its classes left without a server.
    fn kind_deactivated(&mut self, kind: u64, now: Instant) {
        let Some(k) = self.kinds.get(kind) else {
            return;
        };
        let at = Instant(now.0.saturating_add(self.config.service_grace_ns));
        for &slot in &k.classes {
            if self.class_has_server(slot) {
                continue;
            }
            let c = self.classes.get_mut(slot).expect("a kind's class is live");
            if c.orphan_at.is_none() {
                c.orphan_at = Some(at);
                self.timers.insert((at, Timer::Class(slot)), ());
            }
        }
    }

    /// A worker drains: its slots stop counting for its classes, and a class whose servers
    /// all drain has none (its queued tasks wait out the grace period, then fail as when the
    /// last server leaves). The caller has not marked it draining yet.
    pub(super) fn drain_classes(&mut self, worker: WorkerId, now: Instant) {
        let Some(w) = self.workers.get(&worker).filter(|w| !w.draining) else {
            return;
        };
        let Some(kind) = w.kind else {
            return;
        };
        let slots = u64::from(w.slots);
        let k = self.kinds.get_mut(kind).expect("a worker's kind is live");
        k.active -= 1;
        k.slots -= slots;
        if k.active == 0 {
            self.kind_deactivated(kind, now);
        }
    }

    /// A worker leaving (lost) stops serving its classes; the tasks it ran hold nothing any
    /// more. Arms the grace timer of classes left without a server; the last worker of a kind
    /// takes the kind off its classes. O(1) besides the tasks it held, unless it was the last.
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
        let Some(kind) = w.kind else {
            return;
        };
        let k = self.kinds.get_mut(kind).expect("a worker's kind is live");
        debug_assert_eq!(k.workers.get(w.kind_pos), Some(&worker));
        k.workers.swap_remove(w.kind_pos);
        if let Some(&moved) = k.workers.get(w.kind_pos) {
            self.workers
                .get_mut(&moved)
                .expect("a kind's worker")
                .kind_pos = w.kind_pos;
        }
        if !w.draining {
            k.active -= 1;
            k.slots -= u64::from(w.slots);
            if k.active == 0 {
                self.kind_deactivated(kind, now);
            }
        }
        let k = self.kinds.get(kind).expect("live kind");
        if k.workers.is_empty() {
            for &slot in &k.classes {
                if let Some(c) = self.classes.get_mut(slot) {
                    c.kinds.retain(|&x| x != kind);
                }
            }
            self.kinds.remove(kind);
        }
    }

    /// The grace period of a class without servers passed: its queued tasks of packages whose
    /// policy is `error` fail (status 3); those that wait stay queued.
    pub(super) fn on_class_timer(&mut self, slot: u64, now: Instant, results: &mut Results) {
        let Some(c) = self.classes.get_mut(slot) else {
            return;
        };
        c.orphan_at = None;
        if self.class_has_server(slot) {
            return;
        }
        let c = self.classes.get(slot).expect("checked");
        let ids: Vec<(u64, TaskId)> = c
            .queue
            .iter(&self.queue_store)
            .map(|(slot, _, _, id)| (slot, id))
            .collect();
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
