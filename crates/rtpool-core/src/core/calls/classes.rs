//! Calls of packages that ask for resources or labels: each service queues them apart, one
//! [`ClassCalls`] per resource class, for the servers of the function that can also serve the
//! class; a call placed holds its request on its worker exactly as a task does (`w.account`,
//! `w.holding`, the class's `running`), so `free_resources` gives it back on every way out
//! (answer, return, requeue, loss).
//!
//! Cost: a sub-queue is made once per (function, class), with one pass over the function's
//! servers, and lives as long as its class; serving or unserving a function updates its
//! sub-queues, O(sub-queues of the function); placement looks at a bounded window of the
//! sub-queue's servers, as for calls without a request. Calls without a request never come
//! here: their functions have no sub-queue and their path is unchanged.
//!
//! What `classes.rs` decides stays there: the class of a request (`class_for`, the same
//! interning and the same `unschedulable` policy), which workers serve a class. A call whose
//! class some worker serves but no server of its function does is refused by name (policy
//! `error`) or waits with the notice (`wait`); when a sub-queue loses its last server, its
//! grace timer fails the calls of packages whose policy is `error`.

use bytes::Bytes;
use rtpool_proto::Resources;

use crate::core::timers::Results;
use crate::core::{Core, Timer};
use crate::event::{RejectReason, TaskStatus, Unschedulable};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::service::ClassCalls;
use crate::task::TaskState;

impl Core {
    /// The resource class of the package in `slot` (`None`: it asks for nothing).
    pub(in crate::core) fn class_of(&self, slot: u64) -> Option<u64> {
        self.packages.get(slot).and_then(|p| p.class)
    }

    /// The sub-queue of `service` for `class`, made if new: its servers are the service's
    /// that can serve the class. O(servers of the service), once per function and class.
    pub(in crate::core) fn class_calls(&mut self, service: u64, class: u64) -> &mut ClassCalls {
        let s = self
            .services
            .get_mut(service)
            .expect("a live call's service");
        let workers = &self.workers;
        let c = self.classes.get(class);
        s.classes.entry(class).or_insert_with(|| {
            let mut cc = ClassCalls::default();
            for &w in &s.servers {
                let serves = workers
                    .get(&w)
                    .is_some_and(|w| c.is_some_and(|c| c.is_served_by_kind(w.kind)));
                if serves {
                    cc.add_server(w);
                }
            }
            cc
        })
    }

    /// Checks, at submission, that each function the calls name has a server of `class`;
    /// one that has none refuses the package (policy `error`) or lets it wait (`wait`).
    pub(in crate::core) fn check_call_class(
        &mut self,
        class: u64,
        services: &[u64],
        policy: Unschedulable,
    ) -> Result<(), RejectReason> {
        let mut seen: Vec<u64> = Vec::new();
        for &service in services {
            if seen.contains(&service) {
                continue;
            }
            seen.push(service);
            if self.class_calls(service, class).servers.is_empty() && policy == Unschedulable::Error
            {
                return Err(RejectReason::Unschedulable(
                    self.call_unschedulable_message(service, class),
                ));
            }
        }
        Ok(())
    }

    /// Why no connected worker can run calls of `service` of `class`: which workers have the
    /// request and which serve the function, and what to do.
    fn call_unschedulable_message(&self, service: u64, class: u64) -> String {
        let c = self.classes.get(class).expect("live class");
        if !self.class_has_server(class) {
            return self.unschedulable_message(class);
        }
        let s = self.services.get(service).expect("live service");
        let version = if s.version.is_empty() {
            String::new()
        } else {
            format!(" version {}", s.version)
        };
        format!(
            "no connected worker can run this call: it asks {asks}; {have} worker(s) have it \
             but none of them serves '{name}'{version}, and the {serve} worker(s) that serve \
             it lack it; serve the function from a worker that has it (rtpool worker --serve \
             ... --resources / --label), or submit with unschedulable=\"wait\" to queue it \
             until one joins",
            asks = c.describe(),
            have = self.class_servers(class),
            name = s.name,
            serve = s.servers.len(),
        )
    }

    /// The notice for a package of calls (policy `wait`) one of whose functions has no
    /// server of its class, or `None`. O(calls of the package).
    pub(in crate::core) fn call_class_notice(&self, slot: u64, class: u64) -> Option<String> {
        let p = self.packages.get(slot)?;
        let service = p
            .tasks
            .iter()
            .filter_map(|id| self.tasks.get(id.0))
            .filter(|t| t.package == slot)
            .filter_map(|t| t.call.as_ref().map(|c| c.service))
            .find(|&svc| {
                self.services
                    .get(svc)
                    .and_then(|s| s.classes.get(&class))
                    .is_some_and(|cc| cc.servers.is_empty())
            })?;
        Some(format!(
            "queued until a worker that can run it joins: {}",
            self.call_unschedulable_message(service, class)
        ))
    }

    /// `worker` serves `service` now: it becomes a server of each sub-queue of the service
    /// whose class it can serve. O(sub-queues of the service).
    pub(in crate::core) fn serve_class_calls(&mut self, worker: WorkerId, service: u64) {
        let (Some(w), Some(s)) = (self.workers.get(&worker), self.services.get_mut(service)) else {
            return;
        };
        let classes = &self.classes;
        for (&class, cc) in &mut s.classes {
            let serves = classes
                .get(class)
                .is_some_and(|c| c.is_served_by_kind(w.kind));
            if serves && cc.add_server(worker) {
                if let Some(at) = cc.orphan_at.take() {
                    self.timers.remove(&(at, Timer::Calls(service, class)));
                }
            }
        }
    }

    /// `worker` no longer serves `service` (lost, draining): it leaves the service's
    /// sub-queues; one left without a server arms its grace timer.
    pub(in crate::core) fn unserve_class_calls(
        &mut self,
        worker: WorkerId,
        service: u64,
        now: Instant,
    ) {
        let Some(s) = self.services.get_mut(service) else {
            return;
        };
        let at = Instant(now.0.saturating_add(self.config.service_grace_ns));
        for (&class, cc) in &mut s.classes {
            if cc.remove_server(worker) && cc.servers.is_empty() && cc.orphan_at.is_none() {
                cc.orphan_at = Some(at);
                self.timers.insert((at, Timer::Calls(service, class)), ());
            }
        }
    }

    /// The call `id`, just started on `worker`, holds its class's request there; returns the
    /// request, for its `ASSIGN_CALLS` entry.
    pub(in crate::core) fn hold_for_call(
        &mut self,
        id: TaskId,
        worker: WorkerId,
        class: u64,
    ) -> Resources {
        let Some(c) = self.classes.get_mut(class) else {
            return Resources::default();
        };
        c.running += 1;
        let w = self.workers.get_mut(&worker).expect("placed on");
        w.account(&c.resources, true);
        w.holding.insert(id, class);
        c.resources.clone()
    }

    /// The grace period of a sub-queue without a server passed: its queued calls of packages
    /// whose policy is `error` fail (status 3); those that wait stay queued.
    pub(in crate::core) fn on_class_calls_timer(
        &mut self,
        service: u64,
        class: u64,
        now: Instant,
        results: &mut Results,
    ) {
        let Some(s) = self.services.get_mut(service) else {
            return;
        };
        let name = s.name.clone();
        let Some(cc) = s.classes.get_mut(&class) else {
            return;
        };
        cc.orphan_at = None;
        if !cc.servers.is_empty() {
            return;
        }
        let ids: Vec<(u64, TaskId)> = cc.queue.iter().map(|(p, _, _, id)| (p, id)).collect();
        let asks = self
            .classes
            .get(class)
            .map(|c| c.describe())
            .unwrap_or_default();
        let message = format!(
            "no connected worker can run this call any more: the last worker that served \
             '{name}' with {asks} left and none came back within {:.0} s",
            self.config.service_grace_ns as f64 / 1e9
        );
        for (pkg, id) in ids {
            let waits = self
                .packages
                .get(pkg)
                .is_some_and(|p| p.opts.unschedulable == Unschedulable::Wait);
            // Failing one may have ended another already (a remake fails its readers).
            if waits || !self.is_queued(id) {
                continue;
            }
            if self.is_remake(id) {
                let data = Bytes::from(message.clone());
                self.remake_answered(id, WorkerId(0), TaskStatus::Failed, data, now);
                continue;
            }
            let task = self.tasks.get(id.0).expect("queued call is live");
            let outcome = Self::system_outcome(task, TaskStatus::Failed, message.clone(), now);
            let outcome = self.finish_task(id, outcome, now);
            results.add(self, pkg, outcome);
        }
        self.free_service_if_unused(service);
    }

    /// A class is forgotten: every service drops its sub-queue of it (empty: the class had no
    /// package left), with its grace timer. O(services); classes are forgotten rarely.
    pub(in crate::core) fn forget_class_calls(&mut self, class: u64) {
        let slots: Vec<u64> = self
            .services
            .iter()
            .filter(|(_, s)| s.classes.contains_key(&class))
            .map(|(slot, _)| slot)
            .collect();
        for slot in slots {
            let s = self.services.get_mut(slot).expect("listed");
            if let Some(at) = s.classes.remove(&class).and_then(|cc| cc.orphan_at) {
                self.timers.remove(&(at, Timer::Calls(slot, class)));
            }
        }
    }

    /// Task `id` is live and queued.
    pub(in crate::core) fn is_queued(&self, id: TaskId) -> bool {
        self.tasks
            .get(id.0)
            .is_some_and(|t| t.state == TaskState::Queued)
    }

    /// Takes a queued call of the package in `slot` off its service's queue (the one of its
    /// class if it asks for resources or labels).
    pub(in crate::core) fn unqueue_call(&mut self, service: u64, slot: u64, pos: u64) {
        let class = self.class_of(slot);
        if let Some(q) = self
            .services
            .get_mut(service)
            .and_then(|s| s.queue_of(class))
        {
            q.remove(slot, pos);
        }
    }
}
