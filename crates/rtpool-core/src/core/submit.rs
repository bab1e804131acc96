//! Packages coming in: a client's submission (or an attach by idempotency key) and a package
//! restored from the journal, with their tasks.

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
            let class = self.class_for(&s.opts)?;
            let rest = self
                .check_admission(&s.fn_hash, &s.opts, total, class)
                .and_then(|()| self.check_held_submit(user, &s.opts, s.tasks.len()));
            match rest {
                Ok(producer) => Ok((total, producer, class)),
                Err(reason) => {
                    // A class made for this package alone goes with it.
                    if let Some(class) = class {
                        self.forget_class_if_unused(class);
                    }
                    Err(reason)
                }
            }
        });
        let (total, producer, class) = match checked {
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
        self.set_class(slot, class);
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
        let (est, replicas, class) = (p.est_us, p.opts.replicas(), p.class);
        // The package's own buffer (room for every task, touched ahead: see `IdBuffers`).
        let mut ids = std::mem::take(&mut p.tasks);
        ids.reserve(payloads.len());
        for (index, args) in (0u32..).zip(payloads) {
            let id = TaskId(self.tasks.insert(Task::new(slot, index, args, now)));
            let pos = self.push_new(class, slot, key, est, id);
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
        let class = self.restored_class(slot);
        self.set_class(slot, class);
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
                let pos = self.push_new(class, slot, key, est, id);
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
}

/// The package in `slot` is a package of calls.
fn package_calls(packages: &crate::table::Table<crate::package::Package>, slot: u64) -> bool {
    packages.get(slot).is_some_and(|p| p.calls)
}
