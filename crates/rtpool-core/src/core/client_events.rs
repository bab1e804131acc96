//! Client events: join, submit, cancel, status, loss.

use bytes::Bytes;

use super::Core;
use crate::event::{Action, PackageOpts, RejectReason};
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId};
use crate::package::Package;
use crate::task::{Task, TaskState};

/// The fields of [`crate::Event::Submit`], moved out of the event.
pub(super) struct Submit {
    pub(super) client: ClientId,
    pub(super) req_id: u64,
    pub(super) fn_hash: FnHash,
    pub(super) fn_code: Bytes,
    pub(super) opts: PackageOpts,
    pub(super) tasks: Vec<Bytes>,
}

impl Core {
    /// Registers a client (again: idempotent).
    pub(super) fn on_client_joined(&mut self, client: ClientId) {
        self.clients.entry(client).or_default();
    }

    /// Cancels and frees every package of the client, then forgets it. Tasks that workers hold
    /// become `Cancelled`, so their later results are dropped. O(tasks of its packages).
    pub(super) fn on_client_lost(&mut self, client: ClientId) {
        let Some(c) = self.clients.remove(&client) else {
            return;
        };
        let mut packages: Vec<PackageId> = c.packages.into_iter().collect();
        // Sorted so the order tables are freed in, and so later ids, never depend on hashing.
        packages.sort_unstable();
        for package in packages {
            self.cancel_indices(package, &[]);
            self.free_package_if_finished(package);
        }
        self.compact_queue_if_sparse();
    }

    /// Creates the package and its tasks, answers `Accepted`, then dispatches. A submission from
    /// a client that never joined registers it, so its loss still frees its packages.
    pub(super) fn on_submit(&mut self, s: Submit, now: Instant, out: &mut Vec<Action>) {
        let (client, req_id) = (s.client, s.req_id);
        let total = match self.check_size(s.tasks.len()) {
            Ok(total) => total,
            Err(reason) => {
                out.push(Action::Rejected {
                    client,
                    req_id,
                    reason,
                });
                return;
            }
        };
        let priority = s.opts.priority;
        let package = Package::new(client, s.fn_hash, s.opts, total);
        let package = PackageId(self.packages.insert(package));
        self.functions.acquire(s.fn_hash, s.fn_code);
        self.clients
            .entry(client)
            .or_default()
            .packages
            .insert(package);
        let ids = self.create_tasks(package, priority, s.tasks, now);
        self.packages
            .get_mut(package.0)
            .expect("just inserted")
            .tasks = ids;
        out.push(Action::Accepted {
            client,
            req_id,
            package,
        });
        self.dispatch(now, out);
    }

    /// The task count of a package, if it is within 1..=limit (and so fits a `u32`).
    fn check_size(&self, tasks: usize) -> Result<u32, RejectReason> {
        let limit = self.config.max_tasks_per_package.min(u32::MAX as usize);
        match tasks {
            0 => Err(RejectReason::Empty),
            n if n > limit => Err(RejectReason::TooManyTasks { tasks: n, limit }),
            n => Ok(n as u32),
        }
    }

    /// Inserts one queued task per payload and returns their ids in index order.
    fn create_tasks(
        &mut self,
        package: PackageId,
        priority: i32,
        payloads: Vec<Bytes>,
        now: Instant,
    ) -> Vec<TaskId> {
        let mut ids = Vec::with_capacity(payloads.len());
        for (index, args) in (0u32..).zip(payloads) {
            let task = Task {
                package,
                index,
                args,
                submitted_at: now,
                attempt: 0,
                state: TaskState::Queued,
            };
            let id = TaskId(self.tasks.insert(task));
            self.queue.push_back(priority, id);
            ids.push(id);
        }
        ids
    }

    /// Cancels the named tasks (all if `indices` is empty) of the client's own package.
    pub(super) fn on_cancel(
        &mut self,
        client: ClientId,
        package: PackageId,
        indices: &[u32],
        out: &mut Vec<Action>,
    ) {
        if self.owned_package(client, package).is_none() {
            out.push(Action::UnknownPackage { client, package });
            return;
        }
        self.cancel_indices(package, indices);
        self.free_package_if_finished(package);
        self.compact_queue_if_sparse();
    }

    /// Answers with the package's counters.
    pub(super) fn on_status(
        &mut self,
        client: ClientId,
        req_id: u64,
        package: PackageId,
        out: &mut Vec<Action>,
    ) {
        out.push(match self.owned_package(client, package) {
            Some(p) => Action::StatusReply {
                client,
                req_id,
                package,
                counts: p.counts,
            },
            None => Action::UnknownPackage { client, package },
        });
    }

    /// The package, if it is live and `client`'s.
    fn owned_package(&self, client: ClientId, package: PackageId) -> Option<&Package> {
        self.packages.get(package.0).filter(|p| p.client == client)
    }

    /// Cancels tasks of a live package by index (all if `indices` is empty). Indices out of
    /// range, and tasks already done or cancelled, are skipped. Does not free the package.
    fn cancel_indices(&mut self, package: PackageId, indices: &[u32]) {
        if indices.is_empty() {
            let total = self.packages.get(package.0).map_or(0, |p| p.tasks.len());
            (0..total).for_each(|index| self.cancel_index(package, index));
        } else {
            indices
                .iter()
                .for_each(|&index| self.cancel_index(package, index as usize));
        }
    }

    /// Cancels the task at `index` of `package`, if the index is in range.
    fn cancel_index(&mut self, package: PackageId, index: usize) {
        if let Some(&id) = self
            .packages
            .get(package.0)
            .and_then(|p| p.tasks.get(index))
        {
            self.cancel_task(id);
        }
    }

    /// Cancels one task if it is queued (freed now) or running (marked, freed when its worker
    /// answers); a stale id (done or cancelled) or an already cancelled task is left alone.
    fn cancel_task(&mut self, id: TaskId) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        if matches!(task.state, TaskState::Cancelled { .. }) {
            return;
        }
        let package = self
            .packages
            .get_mut(task.package.0)
            .expect("live task without package");
        package.counts.cancelled += 1;
        match task.state {
            TaskState::Queued => {
                package.counts.queued -= 1;
                self.tasks.remove(id.0);
                self.queue.forget_one();
            }
            TaskState::Running { worker, seq, .. } => {
                package.counts.running -= 1;
                task.state = TaskState::Cancelled { worker, seq };
                self.running -= 1;
                self.cancelling += 1;
            }
            TaskState::Cancelled { .. } => unreachable!("filtered above"),
        }
    }

    /// Purges the ready queue's tombstones once they outnumber its live entries (plus slack, so
    /// small queues are not compacted on every cancel). Amortised O(1) per cancelled task.
    fn compact_queue_if_sparse(&mut self) {
        if self.queue.tombstones() > self.queue.len() + 1024 {
            let tasks = &self.tasks;
            self.queue.compact(|id| {
                tasks
                    .get(id.0)
                    .is_some_and(|t| t.state == TaskState::Queued)
            });
        }
    }
}
