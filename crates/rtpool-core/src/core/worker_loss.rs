//! A worker lost: its tasks requeued or failed as poison, a late crash report matched to the
//! loss it explains, and the recent losses remembered for that.

use super::lineage::NO_SOURCE;
use super::timers::Results;
use super::Core;
use crate::event::{Action, LossCause, TaskOutcome, TaskStatus, WorkerOutcome};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::{Loss, Task, TaskState};
use bytes::Bytes;

impl Core {
    /// Forgets the worker: its running tasks go back to the front of the ready queue (in the
    /// order they were assigned) with their loss recorded, except those lost on every allowed
    /// attempt, which fail as poison tasks; its cancelled ones are freed; then dispatches. A
    /// silent or dismissed worker ([`LossCause`]) is blamed for nothing: its tasks are requeued.
    pub(super) fn on_worker_lost(
        &mut self,
        worker: WorkerId,
        cause: LossCause,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        match self.worker_keys.get_mut(&w.key) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.worker_keys.remove(&w.key);
            }
        }
        self.free_credits -= u64::from(w.credits);
        if !w.draining {
            self.total_slots -= u64::from(w.slots);
        }
        self.unserve(worker, &w.serves, now);
        self.leave_classes(worker, &w, now);
        let mut held = std::mem::take(&mut self.lost_held);
        held.clear();
        held.extend(w.in_flight.iter().map(|&id| (self.assignment_seq(id), id)));
        held.sort_unstable();
        // A worker runs its tasks in the order they were assigned, `slots` at a time: only its
        // `slots` oldest running tasks can have been executing when it was lost. The others
        // were waiting in its prefetch queue, and their loss is not held against them. A silent
        // worker may be alive (stopped, cut off, starved), a dismissed one was closed by the
        // master: none of their tasks is a suspect.
        let blame = match cause {
            LossCause::Closed => w.slots.max(1) as usize,
            LossCause::Silent | LossCause::Dismissed => 0,
        };
        let mut suspects = std::collections::HashSet::new();
        for &(_, id) in &held {
            if suspects.len() >= blame {
                break;
            }
            if self
                .tasks
                .get(id.0)
                .is_some_and(|t| matches!(t.state, TaskState::Running { .. }))
            {
                suspects.insert(id);
            }
        }
        self.remember_loss(worker, &held, &suspects);
        let mut poisoned = Results::default();
        for &(_, id) in held.iter().rev() {
            let package = self
                .tasks
                .get(id.0)
                .expect("in-flight task is live")
                .package;
            let allowed = self.allowed_attempts(package);
            let task = self.tasks.get_mut(id.0).expect("in-flight task is live");
            if matches!(task.state, TaskState::Running { .. }) && suspects.contains(&id) {
                let attempt = task.attempt;
                if !task.losses().iter().any(|(_, a, _, _)| *a == attempt) {
                    task.losses_mut().push((worker, attempt, None, None)); // (not reported already)
                }
                if task.losses().len() >= allowed {
                    let slot = task.package;
                    let data = poison_data(task.losses());
                    if self.is_remake(id) {
                        self.remake_answered(id, worker, TaskStatus::Lost, data, now);
                        continue;
                    }
                    let task = self.tasks.get_mut(id.0).expect("in-flight task is live");
                    let outcome = Self::poison_outcome(task, data, now);
                    self.counters.poisoned += 1;
                    if task.group.is_some() {
                        self.copy_answered(id, worker, outcome, false, now, &mut poisoned);
                        continue;
                    }
                    let outcome = self.finish_task(id, outcome, now);
                    // The lost worker holds nothing any more.
                    let task = self.tasks.get_mut(id.0).expect("just finished");
                    task.state = TaskState::Done {
                        holder: None,
                        acked: false,
                    };
                    poisoned.add(self, slot, outcome);
                    continue;
                }
            }
            if matches!(task.state, TaskState::Running { .. }) {
                self.counters.requeued += 1;
            }
            self.requeue_front(id);
        }
        self.lost_held = held;
        // The transaction intermediates it kept are made again elsewhere.
        let kept: Vec<u64> = w.kept_calls.iter().copied().collect();
        self.kept_lost(kept, now);
        self.push_results(poisoned, out);
        if self.hungry.len() > 2 * self.workers.len() + 16 {
            let workers = &self.workers;
            self.hungry
                .retain(|(id, epoch)| workers.get(id).is_some_and(|w| w.epoch == *epoch));
        }
        self.dispatch(now, out);
    }

    /// The worker reports that the process running `(task, attempt)` died (status `Lost`, its
    /// data saying how): the loss counts against the task as a lost worker does. It is retried
    /// until its package's `max_attempts`, then fails as a poison task naming each attempt.
    /// Returns the poison outcome, or `None` when the task was requeued.
    pub(super) fn on_crash_report(
        &mut self,
        worker: WorkerId,
        id: TaskId,
        attempt: u32,
        how: &[u8],
        now: Instant,
    ) -> Option<(u64, TaskOutcome)> {
        let slot = self.tasks.get(id.0).expect("checked by the caller").package;
        let allowed = self.allowed_attempts(slot);
        let task = self.tasks.get_mut(id.0).expect("checked by the caller");
        let (output, how) = split_output(how);
        task.losses_mut()
            .push((worker, attempt, Some(report_text(how)), output));
        if task.losses().len() < allowed {
            self.counters.requeued += 1;
            self.requeue_front(id);
            return None;
        }
        let data = poison_data(task.losses());
        if self.is_remake(id) {
            self.remake_answered(id, worker, TaskStatus::Lost, data, now);
            return None;
        }
        let task = self.tasks.get_mut(id.0).expect("checked by the caller");
        let outcome = Self::poison_outcome(task, data, now);
        self.counters.poisoned += 1;
        let outcome = self.finish_task(id, outcome, now);
        let task = self.tasks.get_mut(id.0).expect("just finished");
        task.state = TaskState::Done {
            holder: None,
            acked: false,
        };
        Some((slot, outcome))
    }

    /// A late report of how a lost worker died (sent by `reporter`, its replacement process,
    /// after the master saw the connection drop): it names the loss recorded for that attempt,
    /// so that the poison message says what happened. If the master had blamed another task
    /// of the dead session (its oldest running one, whose result was still waiting to be
    /// batched), the blame moves: that task's loss is withdrawn and the reported task's
    /// recorded. A task that reaches its cap this way while queued fails as poison now (the
    /// returned outcome). Reports of tasks that are gone or done are ignored.
    pub(super) fn note_crash_report(
        &mut self,
        reporter: WorkerId,
        r: &WorkerOutcome,
        now: Instant,
    ) -> Option<(u64, TaskOutcome)> {
        let task = self.tasks.get(r.task.0)?;
        if matches!(task.state, TaskState::Done { .. }) || r.attempt > task.attempt {
            return None;
        }
        let slot = task.package;
        let (output, how) = split_output(&r.data);
        let how = report_text(how);
        let loss = self
            .recent_losses
            .iter()
            .position(|l| l.held.contains(&(r.task, r.attempt)));
        let mut lost_by = reporter;
        if let Some(i) = loss {
            let loss = self.recent_losses.remove(i).expect("just found");
            lost_by = loss.worker;
            for &(id, attempt) in loss.blamed.iter().filter(|&&b| b != (r.task, r.attempt)) {
                if let Some(t) = self.tasks.get_mut(id.0) {
                    t.losses_mut()
                        .retain(|e| !(e.0 == loss.worker && e.1 == attempt && e.2.is_none()));
                }
            }
        }
        let allowed = self.allowed_attempts(slot);
        let task = self.tasks.get_mut(r.task.0).expect("checked above");
        match task
            .losses_mut()
            .iter_mut()
            .find(|(_, a, _, _)| *a == r.attempt)
        {
            Some(entry) if entry.2.is_none() => (entry.2, entry.3) = (Some(how), output),
            Some(_) => return None,
            None => task
                .losses_mut()
                .push((lost_by, r.attempt, Some(how), output)),
        }
        if task.losses().len() < allowed
            || task.group.is_some()
            || !matches!(task.state, TaskState::Queued)
            || task.call.as_ref().is_some_and(|c| c.remakes != NO_SOURCE)
        {
            return None; // a running task is judged by its next loss or result
        }
        let data = poison_data(task.losses());
        let outcome = Self::poison_outcome(task, data, now);
        self.counters.poisoned += 1;
        let outcome = self.finish_task(r.task, outcome, now);
        let task = self.tasks.get_mut(r.task.0).expect("just finished");
        task.state = TaskState::Done {
            holder: None,
            acked: false,
        };
        Some((slot, outcome))
    }

    /// A poison task's outcome: [`Core::system_outcome`] with [`poison_data`] for its data.
    fn poison_outcome(task: &Task, data: Bytes, now: Instant) -> TaskOutcome {
        let mut outcome = Self::system_outcome(task, TaskStatus::Lost, String::new(), now);
        outcome.data = data;
        outcome
    }

    /// Remembers a lost worker's running tasks and the ones blamed (the latest 64 losses).
    fn remember_loss(
        &mut self,
        worker: WorkerId,
        held: &[(u64, TaskId)],
        suspects: &std::collections::HashSet<TaskId>,
    ) {
        let running = held.iter().filter_map(|&(_, id)| {
            let t = self.tasks.get(id.0)?;
            matches!(t.state, TaskState::Running { .. }).then_some((id, t.attempt))
        });
        if running.clone().next().is_none() {
            return;
        }
        // The oldest loss's buffers are reused once 64 are kept: no allocation per loss.
        let mut loss = match self.recent_losses.len() >= RECENT_LOSSES {
            true => self.recent_losses.pop_front().expect("full"),
            false => RecentLoss {
                worker,
                held: Vec::new(),
                blamed: Vec::new(),
            },
        };
        loss.worker = worker;
        loss.held.clear();
        loss.held.extend(running);
        loss.blamed.clear();
        loss.blamed.extend(
            loss.held
                .iter()
                .copied()
                .filter(|(id, _)| suspects.contains(id)),
        );
        self.recent_losses.push_back(loss);
    }

    /// When a held task was assigned, in the core-wide assignment order.
    fn assignment_seq(&self, id: TaskId) -> u64 {
        match self.tasks.get(id.0).map(|t| t.state) {
            Some(
                TaskState::Running { seq, .. }
                | TaskState::Cancelled { seq, .. }
                | TaskState::Done {
                    holder: Some((_, seq)),
                    ..
                },
            ) => seq,
            other => panic!("in-flight {id} is not held but {other:?}"),
        }
    }
}

/// Lost workers remembered for late crash reports (each holds at most `1 + prefetch` tasks).
const RECENT_LOSSES: usize = 64;

/// A lost worker's running tasks at the time, and the ones the master blamed for the loss.
#[derive(Debug)]
pub(crate) struct RecentLoss {
    worker: WorkerId,
    held: Vec<(TaskId, u32)>,
    blamed: Vec<(TaskId, u32)>,
}

/// A worker's crash report as text: UTF-8 (lossy), at most 300 bytes (a peer's string).
fn report_text(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(&data[..data.len().min(300)]);
    text.trim().to_owned()
}

/// First byte of a report that starts with the task's output (`docs/protocol.md`, "Task
/// output"): `0xB8`, 3 zero bytes, the section's length (u32 BE), the section, zero padding
/// to a multiple of 64 bytes; then the report itself.
const OUTPUT_TAG: u8 = 0xB8;
const OUTPUT_ALIGN: usize = 64;

/// A crash report's task-output head (opaque, padding included) and the report's text. A
/// report whose head does not fit in it is all text (a peer's bytes: never trusted).
fn split_output(data: &[u8]) -> (Option<Bytes>, &[u8]) {
    if data.len() < 8 || data[0] != OUTPUT_TAG {
        return (None, data);
    }
    let size = u32::from_be_bytes([data[4], data[5], data[6], data[7]]) as usize;
    let start = (8 + size).div_ceil(OUTPUT_ALIGN) * OUTPUT_ALIGN;
    if start > data.len() {
        return (None, data);
    }
    (Some(Bytes::copy_from_slice(&data[..start])), &data[start..])
}

/// The outcome data of a poison task: the output of its last attempt that reported one (the
/// client shows it and keeps it with the error), then the message naming each attempt.
fn poison_data(lost_on: &[Loss]) -> Bytes {
    let message = poison_message(lost_on);
    match lost_on.iter().rev().find_map(|l| l.3.as_ref()) {
        Some(output) => {
            let mut data = Vec::with_capacity(output.len() + message.len());
            data.extend_from_slice(output);
            data.extend_from_slice(message.as_bytes());
            Bytes::from(data)
        }
        None => Bytes::from(message),
    }
}

/// The message of a poison task: each attempt, its worker and what happened to it.
fn poison_message(lost_on: &[Loss]) -> String {
    let names: Vec<String> = lost_on
        .iter()
        .map(|(w, attempt, how, _)| match how {
            Some(how) => format!("attempt {attempt} on {w}: {how}"),
            None => format!("attempt {attempt} on {w}: worker lost (crashed, killed or cut off)"),
        })
        .collect();
    format!(
        "poison task: its worker (or the process running it) was lost while running it {} \
         times ({}); it is not retried",
        names.len(),
        names.join("; ")
    )
}
