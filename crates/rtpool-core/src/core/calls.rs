//! Named functions (grid RPC): the registry of who serves what, packages of calls, their data
//! dependencies, and placement of calls on the workers that serve them.
//!
//! A call is a task of a package submitted with `SubmitCalls`: it names a service instead of
//! carrying code. A call whose inputs (results of earlier calls of its package) do not all
//! exist yet is `Waiting`, in no queue; it is queued in its service's queue when the last one
//! arrives, and fails (status 3, naming the call that failed) when one of them fails. Queued
//! calls are placed on the serving worker with a free credit that has the lowest estimated
//! completion time (`crate::placement`), before shipped-code tasks are dispatched.

use bytes::Bytes;

use super::lineage::NO_SOURCE;
use super::timers::Results;
use super::{Core, Timer};
use crate::event::{
    Action, AssignCall, CallSpec, PackageOpts, RejectReason, ServiceDecl, ServiceInfo, TaskOutcome,
    TaskStatus,
};
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, WorkerId};
use crate::placement::{self, Candidate};
use crate::service::Registered;
use crate::task::{Call, Task, TaskState};

/// The function hash of every call package: calls carry no code. (The shell verifies every
/// code hash as the SHA-256 of its code, so no code can claim it.) The journal records a call
/// package under it.
pub const CALLS_HASH: FnHash = FnHash(*b"rtpool calls: no code, no hash!!");

/// Servers looked at per placement, from a rotating start: placement stays O(1) however many
/// workers serve a function.
const MAX_CANDIDATES: usize = 64;

/// A function's mean execution time must be at least this long for its results to teach a
/// worker's speed, microseconds.
const MIN_SPEED_SAMPLE_US: u64 = 1_000;

/// Most inputs one call may take.
const MAX_DEPS: usize = 1024;

impl Core {
    /// Registers the functions a worker serves; each one another worker serves with a different
    /// interface is refused. Then dispatches (calls may have waited for this worker).
    pub(super) fn on_serve(
        &mut self,
        worker: WorkerId,
        functions: Vec<ServiceDecl>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        match self.workers.get(&worker) {
            Some(w) if !w.draining => {}
            _ => return,
        }
        for f in functions {
            match self
                .services
                .register(worker, &f.name, &f.version, &f.interface)
            {
                Registered::Served(slot) => {
                    let w = self.workers.get_mut(&worker).expect("checked above");
                    if !w.serves.contains(&slot) {
                        w.serves.push(slot);
                    }
                    let s = self.services.get_mut(slot).expect("just registered");
                    if let Some(at) = s.orphan_at.take() {
                        self.timers.remove(&(at, Timer::Service(slot)));
                    }
                }
                Registered::Conflict => out.push(Action::ServeRefused {
                    worker,
                    name: f.name,
                    version: f.version,
                }),
            }
        }
        self.dispatch(now, out);
    }

    /// The worker serves nothing any more (lost, or draining). Services left without a server
    /// keep their queued calls for the grace period (armed by the next dispatch).
    pub(super) fn unserve(&mut self, worker: WorkerId, serves: &[u64]) {
        for &slot in serves {
            if let Some(s) = self.services.get_mut(slot) {
                s.remove_server(worker);
            }
            self.free_service_if_unused(slot);
        }
    }

    /// Frees a service nothing refers to any more, with its grace timer.
    fn free_service_if_unused(&mut self, slot: u64) {
        let Some(s) = self.services.get(slot).filter(|s| s.is_unused()) else {
            return;
        };
        if let Some(at) = s.orphan_at {
            self.timers.remove(&(at, Timer::Service(slot)));
        }
        self.services.free_if_unused(slot);
    }

    /// Creates a package of calls, resolving each call's function and version, then
    /// dispatches. Refused: options calls do not support, a function (or version) no worker
    /// serves, a dependency that is not an earlier call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_submit_calls(
        &mut self,
        client: ClientId,
        req_id: u64,
        package: PackageId,
        opts: PackageOpts,
        calls: Vec<CallSpec>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let user = self.clients.entry(client).or_default().user;
        if !opts.key.is_empty() {
            if let Some(&existing) = self.keys.get(&(user, opts.key.clone())) {
                let slot = self.package_slots[&existing];
                out.push(Action::Accepted {
                    client,
                    req_id,
                    package: existing,
                });
                self.attach(client, slot, out);
                return;
            }
        }
        let bytes: u64 = calls.iter().map(|c| c.args.len() as u64).sum();
        let checked = self.check_size(calls.len()).and_then(|total| {
            Self::check_call_options(&opts)?;
            self.check_quota(user)?;
            self.check_user_bounds(user, u64::from(total), bytes)?;
            let services = self.resolve_calls(&calls)?;
            Ok((total, services))
        });
        let (total, services) = match checked {
            Ok(ok) => ok,
            Err(reason) => {
                out.push(Action::Rejected {
                    client,
                    req_id,
                    reason,
                });
                return;
            }
        };
        let slot = self.create_package(
            package,
            user,
            Some(client),
            CALLS_HASH,
            Bytes::new(),
            opts,
            total,
            now,
        );
        self.user_takes(user, u64::from(total), bytes);
        self.create_calls(slot, calls, &services, now);
        out.push(Action::Accepted {
            client,
            req_id,
            package,
        });
        self.dispatch(now, out);
    }

    /// Refuses the options that make no sense for calls (copies, admission, dropping).
    fn check_call_options(opts: &PackageOpts) -> Result<(), RejectReason> {
        let refused = [
            (opts.replicas > 1, "replicas"),
            (opts.quorum > 1, "quorum"),
            (opts.max_copies > 0, "max_copies"),
            (opts.hedge, "hedge"),
            (opts.admit, "admit"),
            (opts.on_miss == crate::MissPolicy::Drop, "on_miss = drop"),
        ];
        if let Some((_, name)) = refused.iter().find(|(set, _)| *set) {
            return Err(RejectReason::InvalidOptions(format!(
                "{name} is for shipped-code tasks; calls of named functions do not support it"
            )));
        }
        Self::check_options(opts)
    }

    /// The service of each call, and the check of its dependencies.
    fn resolve_calls(&self, calls: &[CallSpec]) -> Result<Vec<u64>, RejectReason> {
        let mut services = Vec::with_capacity(calls.len());
        for (index, call) in (0u32..).zip(calls) {
            let Some(slot) = self.services.resolve(&call.name, &call.version) else {
                let what = if call.version.is_empty() {
                    format!("'{}'", call.name)
                } else {
                    format!("'{}' version {}", call.name, call.version)
                };
                return Err(RejectReason::UnknownFunction {
                    what,
                    served: self.services.describe_served(),
                });
            };
            if call.deps.len() > MAX_DEPS {
                return Err(RejectReason::InvalidCall {
                    index,
                    reason: format!("{} inputs, at most {MAX_DEPS}", call.deps.len()),
                });
            }
            if let Some(&d) = call.deps.iter().find(|&&d| d >= index) {
                return Err(RejectReason::InvalidCall {
                    index,
                    reason: format!(
                        "it depends on call #{d}, which is not an earlier call of the package"
                    ),
                });
            }
            services.push(slot);
        }
        Ok(services)
    }

    /// Inserts the calls of the package in `slot`: those without inputs are queued, the others
    /// wait for them.
    fn create_calls(&mut self, slot: u64, calls: Vec<CallSpec>, services: &[u64], now: Instant) {
        let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); calls.len()];
        for (index, call) in (0u32..).zip(&calls) {
            for &d in &call.deps {
                let list = &mut dependents[d as usize];
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        let mut ids = Vec::with_capacity(calls.len());
        for ((index, spec), (&service, dependents)) in
            (0u32..).zip(calls).zip(services.iter().zip(dependents))
        {
            let waiting = spec.deps.len() as u32;
            let mut task = Task::new(slot, index, spec.args, now);
            task.call = Some(Box::new(Call {
                service,
                inputs: vec![Bytes::new(); spec.deps.len()],
                deps: spec.deps,
                waiting,
                fetch: spec.fetch || dependents.is_empty(),
                dependents,
                sources: Vec::new(),
                remakes: super::lineage::NO_SOURCE,
            }));
            if waiting > 0 {
                task.state = TaskState::Waiting;
            }
            self.services.get_mut(service).expect("resolved").calls += 1;
            let id = TaskId(self.tasks.insert(task));
            if waiting == 0 {
                self.enqueue(id, false);
            }
            ids.push(id);
        }
        self.packages.get_mut(slot).expect("just made").tasks = ids;
    }

    /// Answers a registry request.
    pub(super) fn on_functions(
        &mut self,
        client: ClientId,
        req_id: u64,
        name: &str,
        out: &mut Vec<Action>,
    ) {
        let functions = self
            .services
            .listed(name)
            .into_iter()
            .map(|slot| {
                let s = self.services.get(slot).expect("listed");
                ServiceInfo {
                    name: s.name.clone(),
                    version: s.version.clone(),
                    servers: s.servers.len().min(u32::MAX as usize) as u32,
                    interface: s.interface.clone(),
                }
            })
            .collect();
        out.push(Action::FunctionsReply {
            client,
            req_id,
            functions,
        });
    }

    /// Places queued calls while a server of theirs has a credit: each time the service whose
    /// head call has the highest priority, then the shortest estimated execution (unknown
    /// counts as 0, so it is learned), then was submitted first. Arms the grace timer of
    /// services whose calls wait with no server at all.
    pub(super) fn dispatch_calls(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.waiting_services.is_empty() {
            return;
        }
        let mut batches: Vec<(WorkerId, Vec<AssignCall>)> = Vec::new();
        loop {
            let mut best: Option<((std::cmp::Reverse<i32>, u64), u64, usize)> = None;
            let mut drained = Vec::new();
            for &slot in &self.waiting_services {
                let Some(s) = self.services.get(slot) else {
                    drained.push(slot);
                    continue;
                };
                let Some(priority) = s.queue.top_priority() else {
                    drained.push(slot);
                    continue;
                };
                let est = self.estimates.get(&s.fn_hash).map_or(0, |e| e.mean_hint());
                let key = (std::cmp::Reverse(priority), est);
                if best.as_ref().is_some_and(|(k, _, _)| *k <= key) {
                    continue;
                }
                if let Some(server) = self.place(slot) {
                    best = Some((key, slot, server));
                }
            }
            for slot in drained {
                self.waiting_services.remove(&slot);
            }
            let Some((_, slot, server)) = best else {
                break;
            };
            let s = self.services.get_mut(slot).expect("chosen");
            let worker = s.servers[server];
            s.cursor = server + 1;
            let (id, _) = s.queue.pop().expect("a waiting service has a call");
            let call = self.assign_call(id, worker, now);
            match batches.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, calls)) => calls.push(call),
                None => batches.push((worker, vec![call])),
            }
        }
        self.arm_orphans(now);
        out.extend(
            batches
                .into_iter()
                .map(|(worker, calls)| Action::AssignCalls { worker, calls }),
        );
    }

    /// The index in the service's server list of the best server with a free credit for its
    /// head call, looking at no more than [`MAX_CANDIDATES`] servers from its cursor.
    fn place(&self, slot: u64) -> Option<usize> {
        let s = self.services.get(slot)?;
        let n = s.servers.len();
        if n == 0 {
            return None;
        }
        let bytes = s
            .queue
            .peek()
            .and_then(|id| self.tasks.get(id.0))
            .map_or(0, |t| {
                let inputs: usize = t
                    .call
                    .as_ref()
                    .map_or(0, |c| c.inputs.iter().map(Bytes::len).sum::<usize>());
                (t.args.len() + inputs) as u64
            });
        let exec_us = self.estimates.get(&s.fn_hash).map_or(0, |e| e.mean_hint()) as f64;
        let mut cands = Vec::new();
        let mut index = Vec::new();
        for k in 0..n.min(MAX_CANDIDATES) {
            let i = (s.cursor + k) % n;
            let Some(w) = self.workers.get(&s.servers[i]) else {
                continue;
            };
            if !w.is_hungry() {
                continue;
            }
            cands.push(Candidate {
                slots: w.slots,
                in_flight: w.in_flight.len().min(u32::MAX as usize) as u32,
                link: w.link,
                slowness: w.slowness,
            });
            index.push(i);
        }
        placement::choose(&cands, bytes, exec_us, &self.pool_link).map(|c| index[c])
    }

    /// Arms the grace timer of every waiting service that has no server.
    fn arm_orphans(&mut self, now: Instant) {
        let grace = self.config.service_grace_ns;
        for &slot in &self.waiting_services {
            let Some(s) = self.services.get_mut(slot) else {
                continue;
            };
            if s.servers.is_empty() && s.orphan_at.is_none() && !s.queue.is_empty() {
                let at = Instant(now.0.saturating_add(grace));
                s.orphan_at = Some(at);
                self.timers.insert((at, Timer::Service(slot)), ());
            }
        }
    }

    /// The grace period of a service without servers passed: its queued calls fail.
    pub(super) fn on_orphan_timer(&mut self, slot: u64, now: Instant, results: &mut Results) {
        let Some(s) = self.services.get_mut(slot) else {
            return;
        };
        s.orphan_at = None;
        if !s.servers.is_empty() {
            return;
        }
        let ids: Vec<TaskId> = s.queue.iter().map(|(_, _, _, id)| id).collect();
        let message = format!(
            "no worker serves '{}' version {} any more: its last server left and none came \
             back within {:.0} s",
            s.name,
            s.version,
            self.config.service_grace_ns as f64 / 1e9
        );
        for id in ids {
            if self.is_remake(id) {
                let data = Bytes::from(message.clone());
                self.remake_answered(id, WorkerId(0), TaskStatus::Failed, data, now);
                continue;
            }
            let task = self.tasks.get(id.0).expect("queued call is live");
            let pkg = task.package;
            let outcome = Self::system_outcome(task, TaskStatus::Failed, message.clone(), now);
            let outcome = self.finish_task(id, outcome, now);
            results.add(self, pkg, outcome);
        }
        self.free_service_if_unused(slot);
    }

    /// Moves a queued call to the worker: next attempt, one credit, in-flight.
    fn assign_call(&mut self, id: TaskId, worker: WorkerId, now: Instant) -> AssignCall {
        let timeout_ms = self.start(id, worker, now);
        let task = self.tasks.get(id.0).expect("just started");
        let call = task.call.as_ref().expect("a call");
        let s = self
            .services
            .get(call.service)
            .expect("a live call's service");
        AssignCall {
            task: id,
            attempt: task.attempt,
            name: s.name.clone(),
            version: s.version.clone(),
            args: task.args.clone(),
            inputs: call.inputs.clone(),
            timeout_ms,
            // Not fetched means other calls depend on it and the client does not want it.
            keep: !call.fetch,
        }
    }

    /// A call is decided (`outcome`, before its data is withheld from the client): its
    /// dependents receive its result and the ready ones are queued, or, if it failed, they
    /// fail in turn (transitively). Returns whether the client gets the data (always for a
    /// failure).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn call_finished(
        &mut self,
        slot: u64,
        index: u32,
        call: &Call,
        outcome: &TaskOutcome,
        made_on: Option<WorkerId>,
        args: Bytes,
        now: Instant,
    ) -> bool {
        self.service_call_ended(call.service);
        // A kept intermediate: recorded, so that it is dropped once its readers are done and
        // made again if its worker is lost before (lineage.rs).
        let kept = match made_on {
            Some(worker) if !call.fetch && outcome.status == TaskStatus::Ok => {
                Some(self.record_kept(slot, index, worker, outcome.data.clone(), call, args))
            }
            _ => None,
        };
        for &j in &call.dependents {
            let Some(id) = self.call_id(slot, j) else {
                continue;
            };
            let task = self.tasks.get_mut(id.0).expect("checked by call_id");
            if task.state != TaskState::Waiting {
                continue;
            }
            if outcome.status == TaskStatus::Ok {
                let dependent = task.call.as_mut().expect("a call");
                for (p, &d) in dependent.deps.iter().enumerate() {
                    if d == index {
                        dependent.inputs[p] = outcome.data.clone();
                        dependent.waiting -= 1;
                        if let Some(record) = kept {
                            if dependent.sources.is_empty() {
                                dependent.sources = vec![NO_SOURCE; dependent.deps.len()];
                            }
                            dependent.sources[p] = record;
                        }
                    }
                }
                if let Some(record) = kept.and_then(|k| self.kept_calls.get_mut(k)) {
                    record.readers += 1;
                }
                let task = self.tasks.get_mut(id.0).expect("checked by call_id");
                let dependent = task.call.as_mut().expect("a call");
                if dependent.waiting == 0 {
                    task.state = TaskState::Queued;
                    self.enqueue(id, false);
                }
            } else {
                let reason = self.failure_reason(slot, index, call.service, j, outcome);
                self.doomed.push((id, reason));
            }
        }
        self.fail_doomed(now);
        if let Some(record) = kept {
            self.settle(record); // dropped now if every dependent was cancelled or failed
        }
        call.fetch || outcome.status != TaskStatus::Ok
    }

    /// Fails the waiting calls of `doomed` (their results go out at the end of the event),
    /// unless an outer call is already working the list off (a long chain does not recurse).
    pub(super) fn fail_doomed(&mut self, now: Instant) {
        if self.failing_dependents {
            return;
        }
        self.failing_dependents = true;
        while let Some((id, reason)) = self.doomed.pop() {
            let Some(task) = self.tasks.get(id.0) else {
                continue;
            };
            if task.state != TaskState::Waiting {
                continue;
            }
            let pkg = task.package;
            let o = Self::system_outcome(task, TaskStatus::Failed, reason, now);
            let o = self.finish_task(id, o, now);
            self.cascade.push((pkg, o));
        }
        self.failing_dependents = false;
    }

    /// A call of `service` is gone: the service is freed if nothing else uses it.
    pub(super) fn service_call_ended(&mut self, service: u64) {
        if let Some(s) = self.services.get_mut(service) {
            s.calls -= 1;
        }
        self.free_service_if_unused(service);
    }

    /// The live task of call `index` of the package, if any.
    pub(super) fn call_id(&self, slot: u64, index: u32) -> Option<TaskId> {
        let id = *self.packages.get(slot)?.tasks.get(index as usize)?;
        self.tasks.get(id.0).map(|_| id)
    }

    /// Why call `dependent` will not run: its input from call `index` failed.
    fn failure_reason(
        &self,
        slot: u64,
        index: u32,
        service: u64,
        dependent: u32,
        outcome: &TaskOutcome,
    ) -> String {
        let name = |svc: u64| {
            self.services
                .get(svc)
                .map_or_else(|| "?".to_owned(), |s| s.name.clone())
        };
        let dep_service = self
            .call_id(slot, dependent)
            .and_then(|id| self.tasks.get(id.0))
            .and_then(|t| t.call.as_ref())
            .map_or(service, |c| c.service);
        let what = match outcome.status {
            TaskStatus::Error => "raised an error (see that call's result)".to_owned(),
            status => {
                let text = String::from_utf8_lossy(&outcome.data);
                let text: String = text.chars().take(300).collect();
                format!("failed ({status:?}: {text})")
            }
        };
        format!(
            "call #{dependent} {} not run: its input from call #{index} {} {what}",
            name(dep_service),
            name(service)
        )
    }

    /// A cancelled call's dependents are cancelled too (no results: the client cancelled
    /// their input). Transitive, O(calls cancelled).
    pub(super) fn cancel_dependents(
        &mut self,
        slot: u64,
        call: &Call,
        aborts: &mut Vec<(WorkerId, TaskId, u32)>,
    ) {
        if let Some(s) = self.services.get_mut(call.service) {
            s.calls -= 1;
        }
        self.free_service_if_unused(call.service);
        for &j in &call.dependents {
            if let Some(id) = self.call_id(slot, j) {
                self.cancel_task(id, aborts);
            }
        }
    }

    /// Learns, from one result, the link to the worker and its speed (placement).
    pub(super) fn learn_worker(
        &mut self,
        worker: WorkerId,
        bytes: u64,
        worker_us: u64,
        r: &crate::event::WorkerOutcome,
        fn_mean_us: Option<u64>,
    ) {
        let overhead = worker_us
            .saturating_sub(r.exec_us)
            .saturating_sub(r.wait_us)
            .saturating_sub(r.flush_us);
        self.pool_link.learn(bytes, overhead);
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.link.learn(bytes, overhead);
        // Speed is learned from calls long enough to measure (scheduling noise dominates
        // microsecond runs), and one sample moves it at most 4x either way.
        if let Some(mean) = fn_mean_us.filter(|&m| m >= MIN_SPEED_SAMPLE_US) {
            let sample = (r.exec_us as f64 / mean as f64).clamp(0.25, 4.0);
            w.slowness = Some(w.slowness.map_or(sample, |s| s + 0.2 * (sample - s)));
        }
    }
}
