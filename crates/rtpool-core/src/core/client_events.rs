//! Client events: join, attach, acknowledge, cancel, status and loss. A submission and a
//! package restored from the journal are in `submit.rs`; what cancelling a task does in
//! `cancel.rs`.

use super::{Core, Timer};
use crate::event::{Action, TaskOutcome};
use crate::ids::{ClientId, Instant, PackageId, TaskId, UserId};
use crate::task::TaskState;

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
}
