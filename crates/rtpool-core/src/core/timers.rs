//! Time limits, result TTLs and quotas: what the master decides on its own, without a peer
//! asking. Timers sit in an ordered map keyed by when they fire, removed eagerly when they no
//! longer apply, so a tick costs O(log n) per timer that fires and nothing for the others.

use std::collections::HashMap;

use bytes::Bytes;

use super::{Core, Timer};
use crate::event::{Action, TaskOutcome, TaskStatus};
use crate::ids::{ClientId, Instant, PackageId, TaskId, UserId, WorkerId};
use crate::task::{Task, TaskState};

/// Tasks to abort, as `(worker, task, attempt)`.
pub(super) type Aborts = Vec<(WorkerId, TaskId, u32)>;

impl Core {
    /// A result the master makes up for a task (timeout, poison, quota): a UTF-8 message.
    pub(super) fn system_outcome(
        task: &Task,
        status: TaskStatus,
        message: String,
        now: Instant,
    ) -> TaskOutcome {
        let (queue_us, worker_us) = match task.state {
            TaskState::Running { assigned_at, .. } => (
                assigned_at.micros_since(task.submitted_at),
                now.micros_since(assigned_at),
            ),
            _ => (now.micros_since(task.submitted_at), 0),
        };
        TaskOutcome {
            index: task.index,
            status,
            data: Bytes::from(message),
            queue_us,
            worker_us,
            exec_us: 0,
            wait_us: 0,
            flush_us: 0,
            late_us: 0,
        }
    }

    /// Arms the time limit of a task just assigned: its own limit plus the grace, capped by the
    /// master's maximum execution time.
    pub(super) fn arm_task_timer(&mut self, id: TaskId, timeout_ms: u32, now: Instant) {
        let own = (timeout_ms > 0)
            .then(|| u64::from(timeout_ms) * 1_000_000 + self.config.timeout_grace_ns);
        let cap = (self.config.max_exec_ns > 0).then_some(self.config.max_exec_ns);
        let limit = match (own, cap) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(limit) => limit,
                None => return,
            },
        };
        let at = Instant(now.0.saturating_add(limit));
        let task = self.tasks.get_mut(id.0).expect("armed a freed task");
        task.time_limit_at = Some(at);
        self.timers
            .insert((at, Timer::TimeLimit(id, task.attempt)), ());
    }

    /// Disarms a task's time limit and straggler check (its worker answered, returned it, or
    /// was lost; the master answered it).
    pub(super) fn disarm_task_timer(&mut self, id: TaskId) {
        if let Some(task) = self.tasks.get_mut(id.0) {
            if let Some(at) = task.time_limit_at.take() {
                self.timers
                    .remove(&(at, Timer::TimeLimit(id, task.attempt)));
            }
            if let Some(at) = task.hedge_at.take() {
                self.timers.remove(&(at, Timer::Hedge(id, task.attempt)));
            }
        }
    }

    /// Fires every timer due at `now`.
    pub(super) fn on_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let mut results = Results::default();
        let mut aborts = Aborts::new();
        while let Some((&(at, timer), _)) = self.timers.first_key_value() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, timer));
            match timer {
                Timer::TimeLimit(id, attempt) => {
                    self.time_out(id, attempt, now, &mut results, &mut aborts)
                }
                Timer::ResultTtl(slot) => {
                    // The results gathered so far go first: they may be of this package, and
                    // nothing of a package may follow its `PackageFreed`.
                    self.push_results(std::mem::take(&mut results), out);
                    self.expire(slot, out);
                }
                Timer::Deadline(slot) => {
                    self.drop_missed(slot, now, &mut results);
                    // Freed only after its results are out (below).
                    self.push_results(std::mem::take(&mut results), out);
                }
                Timer::Hedge(id, attempt) => self.on_hedge_timer(id, attempt, now),
                Timer::Service(slot) => self.on_orphan_timer(slot, now, &mut results),
                Timer::Class(slot) => self.on_class_timer(slot, now, &mut results),
                Timer::Calls(service, class) => {
                    self.on_class_calls_timer(service, class, now, &mut results);
                }
            }
        }
        self.push_results(results, out);
        self.push_aborts(aborts, out);
        // A hedge, or a copy that replaces one failed by its time limit, may wait.
        self.dispatch(now, out);
    }

    /// A package's deadline passed with `on_miss = drop`: each of its unfinished tasks fails
    /// with status 7 (running ones are aborted on their workers). O(tasks of the package).
    fn drop_missed(&mut self, slot: u64, now: Instant, results: &mut Results) {
        let Some(p) = self.packages.get_mut(slot) else {
            return;
        };
        p.deadline_armed = false;
        let message = "the task's deadline passed before it finished; its package's on_miss \
                       policy is drop, so it was dropped";
        self.fail_unfinished(slot, TaskStatus::Missed, message, now, results);
    }

    /// Fails every queued and running task of the package with `status` and `message`;
    /// running ones are aborted on their workers (at the end of the event). Returns how many.
    /// O(tasks of the package).
    fn fail_unfinished(
        &mut self,
        slot: u64,
        status: TaskStatus,
        message: &str,
        now: Instant,
        results: &mut Results,
    ) -> u64 {
        let ids = self
            .packages
            .get(slot)
            .map(|p| p.tasks.clone())
            .unwrap_or_default();
        let mut failed = 0;
        for id in ids {
            let Some(task) = self.tasks.get(id.0) else {
                continue;
            };
            let running = match task.state {
                TaskState::Queued | TaskState::Waiting => None,
                TaskState::Running { worker, .. } => Some((worker, task.attempt)),
                _ => continue,
            };
            let outcome = Self::system_outcome(task, status, message.to_owned(), now);
            let outcome = self.finish_task(id, outcome, now);
            if let Some((worker, attempt)) = running {
                self.pending_aborts.push((worker, id, attempt));
            }
            results.add(self, slot, outcome);
            failed += 1;
        }
        failed
    }

    /// Fails a running attempt that is past its limit: the client gets status 4, the worker an
    /// abort (it keeps holding the task until it answers).
    fn time_out(
        &mut self,
        id: TaskId,
        attempt: u32,
        now: Instant,
        results: &mut Results,
        aborts: &mut Aborts,
    ) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        let TaskState::Running {
            worker,
            assigned_at,
            ..
        } = task.state
        else {
            return;
        };
        if task.attempt != attempt {
            return;
        }
        task.time_limit_at = None;
        let slot = task.package;
        let limit_ms = self.packages.get(slot).map_or(0, |p| p.opts.timeout_ms);
        let ran = now.0.saturating_sub(assigned_at.0) as f64 / 1e9;
        let message = if limit_ms > 0 {
            format!(
                "task ran past its time limit of {:.3} s (no result {ran:.3} s after it was \
                 assigned to {worker}, attempt {attempt}); the master failed it and told the \
                 worker to kill it",
                f64::from(limit_ms) / 1e3
            )
        } else {
            format!(
                "task ran past the master's maximum execution time of {:.0} s (attempt \
                 {attempt} on {worker}); the master failed it and told the worker to kill it",
                self.config.max_exec_ns as f64 / 1e9
            )
        };
        let outcome = Self::system_outcome(task, TaskStatus::Timeout, message, now);
        self.counters.timed_out += 1;
        if self.is_remake(id) {
            // Its worker still holds it: told to abort, and its answer is stale.
            aborts.push((worker, id, attempt));
            self.remake_answered(id, worker, TaskStatus::Timeout, outcome.data, now);
            return;
        }
        let task = self.tasks.get(id.0).expect("checked above");
        if task.group.is_some() {
            self.copy_answered(id, worker, outcome, true, now, results);
            return;
        }
        let outcome = self.finish_task(id, outcome, now);
        aborts.push((worker, id, attempt));
        results.add(self, slot, outcome);
    }

    /// Drops a package whose client did not attach within the TTL: its queued tasks are
    /// cancelled, running ones aborted, unacknowledged results dropped (counted).
    fn expire(&mut self, slot: u64, out: &mut Vec<Action>) {
        let Some(p) = self.packages.get_mut(slot) else {
            return;
        };
        if p.client.is_some() {
            return;
        }
        p.expires = None;
        self.cancel_indices(slot, &[], out);
        let dropped = self.drop_unacked(slot);
        self.counters.results_dropped += dropped as u64;
        self.counters.packages_expired += 1;
        self.free_package(slot, true, out);
    }

    /// Sets a user's remaining compute time; a user now below zero has its packages failed.
    pub(super) fn on_set_quota(
        &mut self,
        user: UserId,
        remaining_us: Option<i64>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let u = self.users.entry(user).or_default();
        // The shell's figure does not include what was charged since it last took the usage.
        let pending = u.pending_us.min(i64::MAX as u64) as i64;
        let remaining_us = remaining_us.map(|left| left.saturating_sub(pending));
        u.remaining_us = remaining_us;
        if remaining_us.is_some_and(|left| left < 0) {
            self.fail_for_quota(user, now, out);
        }
    }

    /// Charges a worker-reported execution time to the package's user. Returns true if the
    /// user's quota just went below zero.
    pub(super) fn charge(&mut self, slot: u64, exec_us: u64) -> Option<UserId> {
        let user = self.packages.get(slot)?.user;
        let u = self.users.entry(user).or_default();
        u.pending_us = u.pending_us.saturating_add(exec_us);
        let left = u.remaining_us.as_mut()?;
        let was_positive = *left >= 0;
        *left = left.saturating_sub(exec_us.min(i64::MAX as u64) as i64);
        (was_positive && *left < 0).then_some(user)
    }

    /// Fails every queued and running task of the user's packages with status 6 (running ones
    /// are aborted on their workers). O(tasks of the user's packages), once per exhaustion.
    pub(super) fn fail_for_quota(&mut self, user: UserId, now: Instant, out: &mut Vec<Action>) {
        let Some(u) = self.users.get(&user) else {
            return;
        };
        let mut slots: Vec<u64> = u.packages.iter().copied().collect();
        slots.sort_unstable();
        let mut results = Results::default();
        let message = "the user's compute-time quota ran out before this task could finish (see \
                       `rtpool token list`; an admin raises it with `rtpool token quota`)";
        for slot in slots {
            self.counters.quota_failed +=
                self.fail_unfinished(slot, TaskStatus::Quota, message, now, &mut results);
        }
        self.push_results(results, out);
        let aborts = std::mem::take(&mut self.pending_aborts);
        self.push_aborts(aborts, out);
    }

    /// One `Abort` per worker, in the order the tasks were given.
    pub(super) fn push_aborts(&mut self, aborts: Aborts, out: &mut Vec<Action>) {
        let mut slot_of: HashMap<WorkerId, usize> = HashMap::new();
        let mut batches: Vec<(WorkerId, Vec<(TaskId, u32)>)> = Vec::new();
        for (worker, id, attempt) in aborts {
            if !self.workers.contains_key(&worker) {
                continue;
            }
            let i = *slot_of.entry(worker).or_insert_with(|| {
                batches.push((worker, Vec::new()));
                batches.len() - 1
            });
            batches[i].1.push((id, attempt));
        }
        out.extend(
            batches
                .into_iter()
                .map(|(worker, tasks)| Action::Abort { worker, tasks }),
        );
    }

    /// Emits gathered results, one `SendResults` per package, counting what each client was
    /// sent (a detached package's results wait for its attach).
    pub(super) fn push_results(&mut self, results: Results, out: &mut Vec<Action>) {
        for (slot, client, package, journaled, outcomes) in results.batches {
            self.counters.delivered += outcomes.len() as u64;
            let sent = (
                outcomes.len() as u64,
                outcomes.iter().map(|o| o.data.len() as u64).sum(),
            );
            if let (Some(_), Some(p)) = (client, self.packages.get_mut(slot)) {
                p.sent += outcomes.len() as u64;
            }
            out.push(Action::SendResults {
                client,
                package,
                results: outcomes,
                journaled,
            });
            if let Some(c) = client {
                // After the results: a client told to close gets them first.
                self.results_sent(slot, c, sent, out);
            }
        }
    }
}

/// `(slot, client, package, journaled, outcomes)`: one package's new results.
type Batch = (u64, Option<ClientId>, PackageId, bool, Vec<TaskOutcome>);

/// Results of one event, grouped by package in first-completion order.
#[derive(Default)]
pub(super) struct Results {
    /// One batch per package, in first-result order.
    batches: Vec<Batch>,
    slot_of: HashMap<u64, usize>,
}

impl Results {
    /// Adds one outcome of the package in `slot`.
    pub(super) fn add(&mut self, core: &Core, slot: u64, outcome: TaskOutcome) {
        let i = *self.slot_of.entry(slot).or_insert_with(|| {
            let p = core.packages.get(slot).expect("result of a live package");
            self.batches
                .push((slot, p.client, p.id, !p.calls, Vec::new()));
            self.batches.len() - 1
        });
        self.batches[i].4.push(outcome);
    }
}
