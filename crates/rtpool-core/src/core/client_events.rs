//! Client events: join, submit, attach, acknowledge, cancel, status, loss, and packages
//! restored from the journal.

use bytes::Bytes;

use super::{Core, Timer};
use crate::event::{Action, MissPolicy, PackageOpts, RejectReason, RestoredPackage, TaskOutcome};
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, UserId};
use crate::package::Package;
use crate::task::{Task, TaskState};

/// The fields of [`crate::Event::Submit`], moved out of the event.
pub(super) struct Submit {
    pub(super) client: ClientId,
    pub(super) req_id: u64,
    pub(super) package: PackageId,
    pub(super) fn_hash: FnHash,
    pub(super) fn_code: Bytes,
    pub(super) opts: PackageOpts,
    pub(super) tasks: Vec<Bytes>,
}

/// A task id that names no task (an index whose result was delivered before a restart).
pub(super) const NO_TASK: TaskId = TaskId(u64::MAX);

impl Core {
    /// Registers a client of `user` (again: idempotent).
    pub(super) fn on_client_joined(&mut self, client: ClientId, user: UserId) {
        self.clients.entry(client).or_default().user = user;
        self.users.entry(user).or_default();
    }

    /// Detaches every package of the client and forgets it. The packages keep running; each
    /// is freed when no client attached within the result TTL. O(its packages).
    pub(super) fn on_client_lost(&mut self, client: ClientId, now: Instant) {
        let Some(c) = self.clients.remove(&client) else {
            return;
        };
        let mut slots: Vec<u64> = c.packages.into_iter().collect();
        // Sorted so the order never depends on hashing.
        slots.sort_unstable();
        for slot in slots {
            self.detach(slot, now);
        }
    }

    /// Detaches a package and arms its TTL timer.
    pub(super) fn detach(&mut self, slot: u64, now: Instant) {
        let at = Instant(now.0.saturating_add(self.config.result_ttl_ns));
        self.results_unattached(slot);
        let p = self
            .packages
            .get_mut(slot)
            .expect("detach of a freed package");
        p.client = None;
        if let Some(old) = p.expires.replace(at) {
            self.timers.remove(&(old, Timer::ResultTtl(slot)));
        }
        self.timers.insert((at, Timer::ResultTtl(slot)), ());
    }

    /// Attaches a package to `client`: disarms its TTL, restarts the acknowledgement count,
    /// and resends every unacknowledged result.
    pub(super) fn attach(&mut self, client: ClientId, slot: u64, out: &mut Vec<Action>) {
        self.results_unattached(slot);
        let p = self
            .packages
            .get_mut(slot)
            .expect("attach of a freed package");
        if let Some(old) = p.client.replace(client) {
            if old != client {
                if let Some(c) = self.clients.get_mut(&old) {
                    c.packages.remove(&slot);
                }
            }
        }
        if let Some(at) = p.expires.take() {
            self.timers.remove(&(at, Timer::ResultTtl(slot)));
        }
        p.acked = 0;
        p.sent = p.unacked.len() as u64;
        let package = p.id;
        let results: Vec<TaskOutcome> = p
            .unacked
            .iter()
            .map(|id| {
                let task = self.tasks.get(id.0).expect("unacked task is live");
                (**task.outcome.as_ref().expect("done task has an outcome")).clone()
            })
            .collect();
        self.clients
            .entry(client)
            .or_default()
            .packages
            .insert(slot);
        if !results.is_empty() {
            self.results_resent(slot);
            out.push(Action::Resend {
                client,
                package,
                results,
            });
        }
    }

    /// Creates the package and its tasks, answers `Accepted`, then dispatches. A submission
    /// whose idempotency key names a live package of the same user attaches to that package
    /// instead (answered with its id).
    pub(super) fn on_submit(&mut self, s: Submit, now: Instant, out: &mut Vec<Action>) {
        let (client, req_id) = (s.client, s.req_id);
        let user = self.clients.entry(client).or_default().user;
        if !s.opts.key.is_empty() {
            if let Some(&existing) = self.keys.get(&(user, s.opts.key.clone())) {
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
        let bytes: u64 = s.tasks.iter().map(|t| t.len() as u64).sum();
        let checked = self.check_size(s.tasks.len()).and_then(|total| {
            Self::check_options(&s.opts)?;
            self.check_quota(user)?;
            self.check_user_bounds(user, u64::from(total), bytes)?;
            self.check_admission(&s.fn_hash, &s.opts, total)?;
            let producer = self.check_held_submit(user, &s.opts, s.tasks.len())?;
            Ok((total, producer))
        });
        let (total, producer) = match checked {
            Ok(ok) => ok,
            Err(reason) => {
                if matches!(
                    reason,
                    RejectReason::Admission { .. } | RejectReason::NoWorkerSlots { .. }
                ) {
                    self.counters.admission_refused += 1;
                }
                out.push(Action::Rejected {
                    client,
                    req_id,
                    reason,
                });
                return;
            }
        };
        let slot = self.create_package(
            s.package,
            user,
            Some(client),
            s.fn_hash,
            s.fn_code,
            s.opts,
            total,
            now,
        );
        self.user_takes(user, u64::from(total), bytes);
        let ids = self.create_tasks(slot, s.tasks, now);
        self.packages.get_mut(slot).expect("just made").tasks = ids;
        if let Some(producer) = producer {
            self.hold(slot, producer);
        }
        out.push(Action::Accepted {
            client,
            req_id,
            package: s.package,
        });
        self.dispatch(now, out);
    }

    /// Inserts a package (no tasks yet) and indexes it by id, user, key and client.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_package(
        &mut self,
        id: PackageId,
        user: UserId,
        client: Option<ClientId>,
        fn_hash: FnHash,
        fn_code: Bytes,
        opts: PackageOpts,
        total: u32,
        now: Instant,
    ) -> u64 {
        let key = opts.key.clone();
        let mut package = Package::new(id, user, client, fn_hash, opts, total, &mut self.buffers);
        package.calls = fn_hash == super::calls::CALLS_HASH;
        package.seq = self.next_package_seq;
        self.next_package_seq += 1;
        package.est_us = self.estimate(&fn_hash).map_or(0, |e| e.mean_us);
        let deadline_ms = package.opts.deadline_ms;
        if deadline_ms > 0 {
            package.deadline = Some(Instant(
                now.0.saturating_add(u64::from(deadline_ms) * 1_000_000),
            ));
        }
        let drop_at = package
            .deadline
            .filter(|_| package.opts.on_miss == MissPolicy::Drop);
        package.deadline_armed = drop_at.is_some();
        let slot = self.packages.insert(package);
        if let Some(at) = drop_at {
            self.timers.insert((at, Timer::Deadline(slot)), ());
        }
        self.package_slots.insert(id, slot);
        if !key.is_empty() {
            self.keys.insert((user, key), id);
        }
        if !package_calls(&self.packages, slot) {
            self.functions.acquire(fn_hash, fn_code);
        }
        self.users.entry(user).or_default().packages.insert(slot);
        self.latest_owner = Some((user, client));
        if let Some(client) = client {
            self.clients
                .entry(client)
                .or_default()
                .packages
                .insert(slot);
        }
        slot
    }

    /// Inserts one queued task per payload and returns their ids in index order.
    fn create_tasks(&mut self, slot: u64, payloads: Vec<Bytes>, now: Instant) -> Vec<TaskId> {
        let key = self.queue_key(slot);
        let p = self.packages.get_mut(slot).expect("live package");
        let (est, replicas) = (p.est_us, p.opts.replicas());
        // The package's own buffer (room for every task, touched ahead: see `IdBuffers`).
        let mut ids = std::mem::take(&mut p.tasks);
        ids.reserve(payloads.len());
        for (index, args) in (0u32..).zip(payloads) {
            let id = TaskId(self.tasks.insert(Task::new(slot, index, args, now)));
            let pos = self.queue.push_back(slot, key, est, id);
            self.tasks.get_mut(id.0).expect("just made").queue_pos = pos;
            for _ in 1..replicas {
                self.new_copy(id, now, false);
            }
            ids.push(id);
        }
        ids
    }

    /// Recreates a package from the journal, detached, with its TTL armed: delivered indices
    /// are gone, done ones wait for an attach, the rest is queued.
    pub(super) fn on_restore(&mut self, r: RestoredPackage, now: Instant, out: &mut Vec<Action>) {
        if self.package_slots.contains_key(&r.package) {
            return;
        }
        if !r.calls.is_empty() {
            return self.on_restore_calls(r, now, out);
        }
        if r.tasks.is_empty() {
            return;
        }
        let total = r.tasks.len().min(u32::MAX as usize) as u32;
        let slot = self.create_package(
            r.package, r.user, None, r.fn_hash, r.fn_code, r.opts, total, now,
        );
        let key = self.queue_key(slot);
        let p = self.packages.get(slot).expect("just made");
        let (est, replicas) = (p.est_us, p.opts.replicas());
        let mut done: Vec<Option<TaskOutcome>> = vec![None; r.tasks.len()];
        let mut order = Vec::with_capacity(r.done.len());
        for outcome in r.done {
            let i = outcome.index as usize;
            if i < done.len() && done[i].is_none() {
                order.push(outcome.index);
                done[i] = Some(outcome);
            }
        }
        let mut delivered = vec![false; r.tasks.len()];
        for &i in &r.delivered {
            if let Some(d) = delivered.get_mut(i as usize) {
                *d = true;
            }
        }
        let mut ids = Vec::with_capacity(r.tasks.len());
        let mut counts = (0u32, 0u32, 0u64, 0u64);
        for (index, args) in (0u32..).zip(r.tasks) {
            let i = index as usize;
            if delivered[i] {
                ids.push(NO_TASK);
                counts.0 += 1;
                continue;
            }
            let mut task = Task::new(slot, index, args, now);
            if done[i].is_none() {
                counts.2 += 1;
                counts.3 += task.args.len() as u64;
            }
            if let Some(outcome) = done[i].take() {
                task.args = Bytes::new();
                task.state = TaskState::Done {
                    holder: None,
                    acked: false,
                };
                task.outcome = Some(Box::new(outcome));
                self.retained += 1;
                counts.1 += 1;
                ids.push(TaskId(self.tasks.insert(task)));
            } else {
                let id = TaskId(self.tasks.insert(task));
                let pos = self.queue.push_back(slot, key, est, id);
                self.tasks.get_mut(id.0).expect("just made").queue_pos = pos;
                for _ in 1..replicas {
                    self.new_copy(id, now, false);
                }
                ids.push(id);
            }
        }
        let p = self.packages.get_mut(slot).expect("just made");
        // Delivered ones count as done; so do the retained ones.
        p.counts.done = counts.0 + counts.1;
        p.counts.queued = total - p.counts.done;
        for index in order {
            let id = ids[index as usize];
            if id != NO_TASK {
                p.unacked.push_back(id);
            }
        }
        p.tasks = ids;
        if p.opts.after != 0 {
            self.hold_restored(slot, r.user);
        }
        // Restored tasks count against their user's bounds but are never refused by them.
        self.user_takes(r.user, counts.2, counts.3);
        self.detach(slot, now);
        self.free_package_if_finished(slot, out);
        self.dispatch(now, out);
    }

    /// Attaches the client to a live package of its user.
    pub(super) fn on_attach(
        &mut self,
        client: ClientId,
        req_id: u64,
        package: PackageId,
        out: &mut Vec<Action>,
    ) {
        let Some(slot) = self.users_package(client, package) else {
            out.push(Action::UnknownPackage { client, package });
            return;
        };
        out.push(Action::Accepted {
            client,
            req_id,
            package,
        });
        self.attach(client, slot, out);
    }

    /// Frees the results the client acknowledged, then the package if it is finished.
    pub(super) fn on_ack(
        &mut self,
        client: ClientId,
        package: PackageId,
        count: u64,
        out: &mut Vec<Action>,
    ) {
        let Some(slot) = self.attached_package(client, package) else {
            return;
        };
        let p = self
            .packages
            .get_mut(slot)
            .expect("attached package is live");
        let count = count.min(p.sent);
        // A call package's deliveries are journaled too (its restore skips delivered calls);
        // its results are not (a restored call package runs its undelivered calls again).
        let journaled = true;
        let n = count.saturating_sub(p.acked) as usize;
        p.acked = p.acked.max(count);
        let acked: Vec<TaskId> = p.unacked.drain(..n.min(p.unacked.len())).collect();
        self.results_acked(slot, &acked);
        let mut indices = Vec::new();
        for id in acked {
            let index = self.let_go_of_result(id);
            if self.config.report_deliveries {
                indices.push(index);
            }
        }
        if !indices.is_empty() {
            out.push(Action::Delivered {
                package,
                indices,
                journaled,
            });
        }
        self.free_package_if_finished(slot, out);
    }

    /// Cancels the named tasks (all if `indices` is empty) of a package of the client's user.
    /// Cancelling the whole package also drops its unacknowledged results: the client gave up
    /// on it.
    pub(super) fn on_cancel(
        &mut self,
        client: ClientId,
        package: PackageId,
        indices: &[u32],
        out: &mut Vec<Action>,
    ) {
        let Some(slot) = self.users_package(client, package) else {
            out.push(Action::UnknownPackage { client, package });
            return;
        };
        self.cancel_indices(slot, indices, out);
        if indices.is_empty() {
            self.drop_unacked(slot);
        }
        self.free_package_if_finished(slot, out);
    }

    /// Drops every unacknowledged result of the package (returns how many).
    pub(super) fn drop_unacked(&mut self, slot: u64) -> usize {
        let p = self.packages.get_mut(slot).expect("live package");
        let ids: Vec<TaskId> = p.unacked.drain(..).collect();
        let n = ids.len();
        self.results_acked(slot, &ids);
        for id in ids {
            self.let_go_of_result(id);
        }
        n
    }

    /// The client has (or gave up on) the result of a `Done` task taken off its package's
    /// unacknowledged list: free the task, or, if a worker still holds it, mark it
    /// acknowledged so that worker's answer frees it. Returns the task's index.
    fn let_go_of_result(&mut self, id: TaskId) -> u32 {
        let task = self.tasks.get_mut(id.0).expect("unacked task is live");
        let index = task.index;
        match task.state {
            TaskState::Done { holder: None, .. } => {
                self.tasks.remove(id.0);
                self.retained -= 1;
            }
            TaskState::Done { holder, .. } => {
                task.state = TaskState::Done {
                    holder,
                    acked: true,
                };
                task.outcome = None;
            }
            other => panic!("unacked {id} is {other:?}"),
        }
        index
    }

    /// Answers with the package's counters.
    pub(super) fn on_status(
        &mut self,
        client: ClientId,
        req_id: u64,
        package: PackageId,
        out: &mut Vec<Action>,
    ) {
        out.push(match self.users_package(client, package) {
            Some(slot) => Action::StatusReply {
                client,
                req_id,
                package,
                counts: self.packages.get(slot).expect("live").counts,
            },
            None => Action::UnknownPackage { client, package },
        });
    }

    /// The slab key of the package, if it is live and belongs to the client's user.
    fn users_package(&self, client: ClientId, package: PackageId) -> Option<u64> {
        let user = self.clients.get(&client)?.user;
        let slot = *self.package_slots.get(&package)?;
        (self.packages.get(slot)?.user == user).then_some(slot)
    }

    /// The slab key of the package, if it is live and attached to this client.
    fn attached_package(&self, client: ClientId, package: PackageId) -> Option<u64> {
        let slot = *self.package_slots.get(&package)?;
        (self.packages.get(slot)?.client == Some(client)).then_some(slot)
    }

    /// Cancels tasks of a live package by index (all if `indices` is empty). Indices out of
    /// range, and tasks already done or cancelled, are skipped. Does not free the package.
    pub(super) fn cancel_indices(&mut self, slot: u64, indices: &[u32], out: &mut Vec<Action>) {
        let mut aborts = Vec::new();
        if indices.is_empty() {
            let total = self.packages.get(slot).map_or(0, |p| p.tasks.len());
            (0..total).for_each(|index| self.cancel_index(slot, index, &mut aborts));
        } else {
            indices
                .iter()
                .for_each(|&index| self.cancel_index(slot, index as usize, &mut aborts));
        }
        self.push_aborts(aborts, out);
    }

    /// Cancels the task at `index` of the package, if the index is in range.
    fn cancel_index(
        &mut self,
        slot: u64,
        index: usize,
        aborts: &mut Vec<(crate::WorkerId, TaskId, u32)>,
    ) {
        if let Some(&id) = self.packages.get(slot).and_then(|p| p.tasks.get(index)) {
            self.cancel_task(id, aborts);
        }
    }

    /// Cancels one task if it is queued (freed now) or running (marked, freed when its worker
    /// answers, and the worker is told to abort it); a stale id (done or cancelled) is left
    /// alone.
    pub(super) fn cancel_task(
        &mut self,
        id: TaskId,
        aborts: &mut Vec<(crate::WorkerId, TaskId, u32)>,
    ) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        if matches!(
            task.state,
            TaskState::Cancelled { .. } | TaskState::Done { .. }
        ) {
            return;
        }
        let call = task.call.take();
        self.producer_cancelled(id);
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        if let Some(g) = task.group.take() {
            // The other copies go with it.
            let group = self.groups.remove(g).expect("live group");
            for copy in group.copies {
                if copy != id {
                    self.cancel_copy(copy);
                }
            }
        }
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        let slot = task.package;
        let package = self
            .packages
            .get_mut(slot)
            .expect("live task without package");
        let (user, bytes) = (package.user, task.args.len());
        package.counts.cancelled += 1;
        match task.state {
            TaskState::Queued => {
                package.counts.queued -= 1;
                match &call {
                    Some(c) => {
                        if let Some(s) = self.services.get_mut(c.service) {
                            s.queue.remove(slot, task.queue_pos);
                        }
                    }
                    None => self.queue.remove(slot, task.queue_pos),
                }
                self.tasks.remove(id.0);
            }
            TaskState::Waiting => {
                package.counts.queued -= 1;
                self.tasks.remove(id.0);
            }
            TaskState::Running { worker, seq, .. } => {
                package.counts.running -= 1;
                task.state = TaskState::Cancelled { worker, seq };
                aborts.push((worker, id, task.attempt));
                self.disarm_task_timer(id);
                self.leave_running(slot);
                self.cancelling += 1;
            }
            _ => unreachable!("filtered above"),
        }
        self.user_releases(user, bytes);
        if let Some(call) = call {
            self.release_sources(&call);
            self.cancel_dependents(slot, &call, aborts);
        }
    }
}

/// The package in `slot` is a package of calls.
fn package_calls(packages: &crate::table::Table<crate::package::Package>, slot: u64) -> bool {
    packages.get(slot).is_some_and(|p| p.calls)
}
