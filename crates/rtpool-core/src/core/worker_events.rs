//! Worker events: join, credit, results, return, drain, loss.

use std::collections::HashMap;

use super::Core;
use crate::event::{Action, TaskOutcome, WorkerOutcome};
use crate::ids::{ClientId, Instant, PackageId, TaskId, WorkerId};
use crate::task::{Task, TaskState};
use crate::worker::Worker;

/// Results of one event for one package, in completion order.
struct Delivery {
    client: ClientId,
    package: PackageId,
    results: Vec<TaskOutcome>,
}

impl Core {
    /// Registers a worker with no credits. A second join under a connected id is ignored: ids
    /// are the shell's sessions, so that would be a shell bug, and replacing the worker would
    /// strand its tasks.
    pub(super) fn on_worker_joined(&mut self, worker: WorkerId, slots: u32) {
        if self.workers.contains_key(&worker) {
            return;
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.workers.insert(worker, Worker::new(slots, epoch));
    }

    /// Adds credits (saturating) and dispatches. Ignored for unknown or draining workers.
    pub(super) fn on_credit(
        &mut self,
        worker: WorkerId,
        credits: u32,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.draining {
            return;
        }
        w.credits = w.credits.saturating_add(credits);
        self.ring_if_hungry(worker);
        self.dispatch(now, out);
    }

    /// Accepts each result that matches the worker's current assignment, and sends the accepted
    /// ones as one `SendResults` per package, in completion order.
    pub(super) fn on_results(
        &mut self,
        worker: WorkerId,
        results: Vec<WorkerOutcome>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let mut deliveries: Vec<Delivery> = Vec::new();
        let mut slot_of: HashMap<PackageId, usize> = HashMap::new();
        for result in results {
            let Some((client, package, outcome)) = self.accept_result(worker, result, now) else {
                continue;
            };
            let slot = *slot_of.entry(package).or_insert_with(|| {
                deliveries.push(Delivery {
                    client,
                    package,
                    results: Vec::new(),
                });
                deliveries.len() - 1
            });
            deliveries[slot].results.push(outcome);
        }
        for d in deliveries {
            self.delivered += d.results.len() as u64;
            out.push(Action::SendResults {
                client: d.client,
                package: d.package,
                results: d.results,
            });
        }
    }

    /// Frees the task of one result and returns what to send, or `None` if the result is stale
    /// (counted) or its task was cancelled by the client (dropped). Frees a finished package.
    fn accept_result(
        &mut self,
        worker: WorkerId,
        r: WorkerOutcome,
        now: Instant,
    ) -> Option<(ClientId, PackageId, TaskOutcome)> {
        let (task, assigned_at) = self.take_answered(worker, &r)?;
        let package = self
            .packages
            .get_mut(task.package.0)
            .expect("running task without package");
        package.counts.running -= 1;
        package.counts.done += 1;
        let client = package.client;
        let outcome = TaskOutcome {
            index: task.index,
            status: r.status,
            data: r.data,
            queue_us: assigned_at.micros_since(task.submitted_at),
            worker_us: now.micros_since(assigned_at),
            exec_us: r.exec_us,
            wait_us: r.wait_us,
            flush_us: r.flush_us,
        };
        self.free_package_if_finished(task.package);
        Some((client, task.package, outcome))
    }

    /// Takes the task a result answers out of the worker and the table, with the time it was
    /// assigned. `None` if the result is stale (counted: the task is not held by this worker at
    /// this attempt) or the task was cancelled (freed without a result).
    fn take_answered(&mut self, worker: WorkerId, r: &WorkerOutcome) -> Option<(Task, Instant)> {
        if !self
            .tasks
            .get(r.task.0)
            .is_some_and(|t| t.is_held_by(worker, r.attempt))
        {
            self.stale_results += 1;
            return None;
        }
        let task = self.tasks.remove(r.task.0).expect("checked above");
        let w = self.workers.get_mut(&worker).expect("holder is connected");
        w.in_flight.remove(&r.task);
        match task.state {
            TaskState::Running { assigned_at, .. } => {
                self.running -= 1;
                Some((task, assigned_at))
            }
            _ => {
                self.cancelling -= 1;
                None
            }
        }
    }

    /// Puts the returned tasks that this worker holds (with that attempt) back at the front of
    /// the ready queue, in the order given, then dispatches. Others are ignored.
    pub(super) fn on_returned(
        &mut self,
        worker: WorkerId,
        tasks: &[(TaskId, u32)],
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        // Returning withdraws the worker's unused credits: it gives work back because it holds
        // more than it can run soon, so tasks must not flow straight back to it. It asks again
        // with `Credit`. (Its ring entry, if any, is skipped when reached, as after a drain.)
        if let Some(w) = self.workers.get_mut(&worker) {
            w.credits = 0;
        }
        // Reversed, so that after the pushes to the front the first returned task is first.
        for &(id, attempt) in tasks.iter().rev() {
            if self
                .tasks
                .get(id.0)
                .is_some_and(|t| t.is_held_by(worker, attempt))
            {
                self.requeue_front(id);
            }
        }
        self.dispatch(now, out);
    }

    /// Takes the worker's credits and never assigns to it again. Its ring entry, if any, is
    /// skipped when reached.
    pub(super) fn on_drain(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.credits = 0;
            w.draining = true;
        }
    }

    /// Forgets the worker: its running tasks go back to the front of the ready queue (in the
    /// order they were assigned), its cancelled ones are freed; then dispatches.
    pub(super) fn on_worker_lost(&mut self, worker: WorkerId, now: Instant, out: &mut Vec<Action>) {
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        let mut held: Vec<(u64, TaskId)> = w
            .in_flight
            .iter()
            .map(|&id| (self.assignment_seq(id), id))
            .collect();
        held.sort_unstable();
        for &(_, id) in held.iter().rev() {
            self.requeue_front(id);
        }
        if self.hungry.len() > 2 * self.workers.len() + 16 {
            let workers = &self.workers;
            self.hungry
                .retain(|(id, epoch)| workers.get(id).is_some_and(|w| w.epoch == *epoch));
        }
        self.dispatch(now, out);
    }

    /// When a held task was assigned, in the core-wide assignment order.
    fn assignment_seq(&self, id: TaskId) -> u64 {
        match self.tasks.get(id.0).map(|t| t.state) {
            Some(TaskState::Running { seq, .. } | TaskState::Cancelled { seq, .. }) => seq,
            other => panic!("in-flight {id} is not held but {other:?}"),
        }
    }
}
