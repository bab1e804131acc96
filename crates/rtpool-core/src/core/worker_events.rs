//! Worker events: join, credit, results, return, drain. A lost worker and its crash reports
//! are in `worker_loss.rs`.

use super::timers::Results;
use super::Core;
use crate::event::{Action, Labels, Resources, TaskOutcome, TaskStatus, WorkerOutcome};
use crate::ids::{Instant, PackageId, TaskId, UserId, WorkerId, WorkerKey};
use crate::task::TaskState;
use crate::worker::Worker;

impl Core {
    /// The package of a live task (for the master's log lines), or `None` for a stale id.
    pub fn package_of(&self, task: TaskId) -> Option<PackageId> {
        let slot = self.tasks.get(task.0)?.package;
        Some(self.packages.get(slot)?.id)
    }

    /// Workers that can run `package`'s tasks now: the connected workers that are not
    /// draining for a package of code; for a package of calls, the fewest servers among the
    /// functions of its first (at most 64) calls still held. 0 for an unknown package.
    pub fn workers_for(&self, package: PackageId) -> usize {
        let Some(p) = self
            .package_slots
            .get(&package)
            .and_then(|&slot| self.packages.get(slot))
        else {
            return 0;
        };
        if !p.calls {
            return self.workers.values().filter(|w| !w.draining).count();
        }
        p.tasks
            .iter()
            .filter_map(|id| self.tasks.get(id.0)?.call.as_ref())
            .take(64)
            .map(|c| self.services.get(c.service).map_or(0, |s| s.servers.len()))
            .min()
            .unwrap_or(0)
    }

    /// Registers a worker with no credits. A second join under a connected id is ignored: ids
    /// are the shell's sessions, so that would be a shell bug, and replacing the worker would
    /// strand its tasks.
    pub(super) fn on_worker_joined(
        &mut self,
        worker: WorkerId,
        slots: u32,
        key: WorkerKey,
        resources: Resources,
        labels: Labels,
    ) {
        if self.workers.contains_key(&worker) {
            return;
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.total_slots += u64::from(slots);
        let mut w = Worker::new(slots, epoch, key);
        w.in_use = vec![0; resources.len()];
        w.resources = resources;
        w.labels = labels;
        self.workers.insert(worker, w);
        *self.worker_keys.entry(key).or_insert(0) += 1;
        self.join_classes(worker);
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
        let before = w.credits;
        w.credits = w.credits.saturating_add(credits);
        self.free_credits += u64::from(w.credits - before);
        self.ring_if_hungry(worker);
        self.offer_classes(worker);
        self.dispatch(now, out);
    }

    /// Accepts each result that matches the worker's current assignment, charges its execution
    /// time to the package's user, and sends the accepted ones as one `SendResults` per
    /// package, in completion order.
    pub(super) fn on_results(
        &mut self,
        worker: WorkerId,
        results: Vec<WorkerOutcome>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let mut batch = Results::default();
        let mut exhausted: Vec<UserId> = Vec::new();
        for mut result in results {
            self.bound_reported(worker, &mut result, now, out);
            let accepted = self.accept_result(worker, result, now, &mut exhausted, &mut batch);
            if let Some((slot, outcome)) = accepted {
                batch.add(self, slot, outcome);
            }
        }
        self.push_results(batch, out);
        for user in exhausted {
            self.fail_for_quota(user, now, out);
        }
        // A disagreement may have queued another copy.
        self.dispatch(now, out);
    }

    /// Turns one result into the task's outcome and returns it with the package's slab key, or
    /// `None` if the result is stale (counted) or answers a task the master already answered
    /// (cancelled, timed out: the task is released).
    fn accept_result(
        &mut self,
        worker: WorkerId,
        r: WorkerOutcome,
        now: Instant,
        exhausted: &mut Vec<UserId>,
        batch: &mut Results,
    ) -> Option<(u64, TaskOutcome)> {
        let Some(task) = self
            .tasks
            .get(r.task.0)
            .filter(|t| t.is_held_by(worker, r.attempt))
        else {
            self.counters.stale_results += 1;
            if r.status == TaskStatus::Lost {
                return self.note_crash_report(worker, &r, now);
            }
            return None;
        };
        let slot = task.package;
        let state = task.state;
        let inputs: usize = task
            .call
            .as_ref()
            .map_or(0, |c| c.inputs.iter().map(bytes::Bytes::len).sum());
        let bytes = (task.args.len() + inputs + r.data.len()) as u64;
        let is_call = task.call.is_some();
        let fn_hash = match task.call.as_ref() {
            Some(c) => self.services.get(c.service).map(|s| s.fn_hash),
            None => self.packages.get(slot).map(|p| p.fn_hash),
        };
        let (mut hedged_fn, mut key, mut held) = (None, None, false);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.in_flight.remove(&r.task);
            hedged_fn = w.take_hedged(r.task, r.attempt);
            key = Some(w.key);
            held = !w.holding.is_empty();
        }
        if held {
            self.free_resources(worker, r.task);
        }
        // The worker's pace learns from every run it finished, a lost race included (then its
        // package may be gone: the function was noted when the hedge started).
        let live_fn = fn_hash.filter(|_| self.packages.get(slot).is_some());
        if let (Some(h), Some(key)) = (hedged_fn.or(live_fn), key) {
            if r.status == TaskStatus::Ok {
                self.estimates
                    .entry(h)
                    .or_default()
                    .add_pace(key, r.exec_us);
            }
        }
        if let TaskState::Running { assigned_at, .. } = state {
            let mean = fn_hash
                .and_then(|h| self.estimates.get(&h))
                .map(|e| e.mean_hint())
                .filter(|_| r.status == TaskStatus::Ok);
            self.learn_worker(worker, bytes, now.micros_since(assigned_at), &r, mean);
        }
        // The worker spent the time whatever became of the result.
        if let Some(fn_hash) = fn_hash.filter(|_| self.packages.get(slot).is_some()) {
            // The estimate learns from answers that count: not from a copy that lost a race
            // (cancelled), which is often the straggler the estimate should not describe.
            if r.status == TaskStatus::Ok && matches!(state, TaskState::Running { .. }) {
                self.estimates.entry(fn_hash).or_default().add(r.exec_us);
            }
            if let Some(user) = self.charge(slot, r.exec_us) {
                exhausted.push(user);
            }
        }
        match state {
            TaskState::Running { assigned_at, .. } => {
                self.disarm_task_timer(r.task);
                let task = self.tasks.get(r.task.0).expect("checked above");
                let outcome = TaskOutcome {
                    index: task.index,
                    status: r.status,
                    data: r.data,
                    queue_us: assigned_at.micros_since(task.submitted_at),
                    worker_us: now.micros_since(assigned_at),
                    exec_us: r.exec_us,
                    wait_us: r.wait_us,
                    flush_us: r.flush_us,
                    late_us: 0,
                };
                if task.group.is_some() {
                    // One vote of several: the group decides whether there is a result.
                    self.copy_answered(r.task, worker, outcome, false, now, batch);
                    return None;
                }
                if outcome.status == TaskStatus::Lost {
                    // The worker survived the process that ran the task: blame the task.
                    return self.on_crash_report(worker, r.task, r.attempt, &outcome.data, now);
                }
                // Lineage takes a call's answer when it is a copy's or says "input lost".
                let outcome = if is_call || outcome.status == TaskStatus::InputLost {
                    match self.lineage_answer(r.task, worker, outcome, now) {
                        Ok(()) => return None,
                        Err(outcome) => outcome,
                    }
                } else {
                    outcome
                };
                // Now `Done` with no holder: the in-flight entry is already gone.
                let outcome = self.finish_task(r.task, outcome, now);
                let task = self.tasks.get_mut(r.task.0).expect("just finished");
                task.state = TaskState::Done {
                    holder: None,
                    acked: false,
                };
                task.made_on = worker.0;
                Some((slot, outcome))
            }
            TaskState::Cancelled { .. } => {
                self.tasks.remove(r.task.0);
                self.cancelling -= 1;
                None
            }
            TaskState::Done { .. } => {
                self.release_done(r.task);
                None
            }
            TaskState::Queued | TaskState::Waiting => unreachable!("a held task is not queued"),
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
            self.free_credits -= u64::from(w.credits);
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
    pub(super) fn on_drain(&mut self, worker: WorkerId, now: Instant) {
        // Its classes' admission control stops counting its slots too.
        self.drain_classes(worker, now);
        if let Some(w) = self.workers.get_mut(&worker) {
            self.free_credits -= u64::from(w.credits);
            if !w.draining {
                self.total_slots -= u64::from(w.slots);
            }
            w.credits = 0;
            w.draining = true;
            let serves = std::mem::take(&mut w.serves);
            self.unserve(worker, &serves, now);
        }
    }

    /// How many losses make a task poison: its package's `max_attempts`, else the master's.
    pub(super) fn allowed_attempts(&self, slot: u64) -> usize {
        let allowed = match self.packages.get(slot) {
            Some(p) if p.opts.max_attempts > 0 => p.opts.max_attempts,
            _ => self.config.max_attempts,
        };
        allowed.max(1) as usize
    }
}
