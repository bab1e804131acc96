//! Dispatch: meeting queued tasks with worker credits.
//!
//! Runs after every event that adds tasks or credits. Workers take turns one task at a time
//! (round robin over the hungry ring), so N tasks and N idle workers give one task each, and a
//! worker that asks again sooner (a fast one) gets more. Each worker gets one `Assign` per event
//! with all its new tasks. Cost: O(1) amortised per task assigned, plus the dead ring entries it
//! skips.

use std::collections::HashMap;

use super::timers::Results;
use super::Core;
use crate::event::{Action, AssignTask, MissPolicy, TaskStatus};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::TaskState;

/// Queued tasks a worker may pass over in one turn because it holds another copy of them,
/// before it is left without a task this round.
const MAX_SKIPS: usize = 32;

impl Core {
    /// Assigns queued tasks while a non-draining worker has credits. A worker never gets two
    /// copies of one task; a task of an `on_miss = drop` package that cannot finish by its
    /// deadline (by its function's p50) is dropped instead of started.
    pub(super) fn dispatch(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.dispatch_calls(now, out);
        let mut batches: Vec<(WorkerId, Vec<AssignTask>)> = Vec::new();
        let mut dropped = Results::default();
        self.dispatch_classes(now, &mut dropped, &mut batches);
        let mut slot_of: HashMap<WorkerId, usize> = batches
            .iter()
            .enumerate()
            .map(|(i, (w, _))| (*w, i))
            .collect();
        // Workers that found nothing they may run this round: back in the ring afterwards.
        let mut passed: Vec<WorkerId> = Vec::new();
        let mut skipped: Vec<TaskId> = Vec::new();
        while !self.queue.is_empty() {
            let Some(worker) = self.next_hungry() else {
                break;
            };
            let mut found = None;
            while let Some((id, slot)) = self.queue.pop(&mut self.queue_store) {
                // Another copy is on this worker, or the task's data is on a worker that
                // can take it now (locality.rs).
                if self.conflicts(id, worker) || self.prefers_other(id, worker) {
                    skipped.push(id);
                    if skipped.len() >= MAX_SKIPS {
                        break;
                    }
                    continue;
                }
                if self.cannot_make_it(id, slot, now) {
                    self.drop_late(id, slot, now, &mut dropped);
                    continue;
                }
                found = Some(id);
                break;
            }
            // Passed-over copies go back where they were, in order.
            for id in skipped.drain(..).rev() {
                self.enqueue(id, true);
            }
            let Some(id) = found else {
                passed.push(worker);
                continue;
            };
            let assignment = self.assign(id, worker, now);
            let slot = *slot_of.entry(worker).or_insert_with(|| {
                batches.push((worker, Vec::new()));
                batches.len() - 1
            });
            batches[slot].1.push(assignment);
            self.ring_if_hungry(worker);
        }
        for worker in passed {
            self.ring_if_hungry(worker);
        }
        self.trim_hungry();
        self.push_results(dropped, out);
        out.extend(
            batches
                .into_iter()
                .map(|(worker, tasks)| Action::Assign { worker, tasks }),
        );
    }

    /// A queued task of an `on_miss = drop` package whose deadline is nearer than its
    /// function's trusted p50 (extra copies are not judged: they go with their task).
    pub(super) fn cannot_make_it(&mut self, id: TaskId, slot: u64, now: Instant) -> bool {
        let p = self.packages.get(slot).expect("queued task's package");
        let Some(deadline) = p.deadline.filter(|_| p.opts.on_miss == MissPolicy::Drop) else {
            return false;
        };
        if self.tasks.get(id.0).is_some_and(|t| t.shadow) {
            return false;
        }
        let fn_hash = p.fn_hash;
        self.trusted_estimate(&fn_hash)
            .is_some_and(|e| now.0.saturating_add(e.p50_us * 1_000) > deadline.0)
    }

    /// Fails a popped task that cannot make its deadline with status 7.
    pub(super) fn drop_late(&mut self, id: TaskId, slot: u64, now: Instant, results: &mut Results) {
        // Put back as queued first: finishing a queued task takes it off the queue's count.
        self.enqueue(id, true);
        let task = self.tasks.get(id.0).expect("popped task is live");
        let left = self
            .packages
            .get(slot)
            .and_then(|p| p.deadline)
            .map_or(0, |d| d.micros_since(now));
        let outcome = Self::system_outcome(
            task,
            TaskStatus::Missed,
            format!(
                "the task could not finish by its deadline ({:.3} s left, its function takes \
                 about that long or longer); its package's on_miss policy is drop, so it was \
                 not started",
                left as f64 / 1e6
            ),
            now,
        );
        let outcome = self.finish_task(id, outcome, now);
        results.add(self, slot, outcome);
    }

    /// Puts the worker at the back of the hungry ring if it can take a task and is not there.
    pub(super) fn ring_if_hungry(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            if w.is_hungry() && !w.in_ring {
                w.in_ring = true;
                self.hungry.push_back(worker, w.epoch);
            }
        }
    }

    /// Drops the ring's front entries that cannot take a task. Class dispatch uses credits
    /// without popping the ring, so with only class tasks queued the entries of busy and lost
    /// workers would pile up until a lost worker's compaction walks them all (O(workers) in one
    /// event). Amortised O(1): each entry dropped was pushed by an earlier event.
    fn trim_hungry(&mut self) {
        while let Some((id, epoch)) = self.hungry.front() {
            match self.workers.get_mut(&id).filter(|w| w.epoch == epoch) {
                Some(w) if w.is_hungry() => break,
                Some(w) => w.in_ring = false,
                None => {}
            }
            self.hungry.pop_front();
        }
    }

    /// Pops ring entries until one names a connected worker that can take a task.
    fn next_hungry(&mut self) -> Option<WorkerId> {
        while let Some((id, epoch)) = self.hungry.pop_front() {
            let Some(w) = self.workers.get_mut(&id).filter(|w| w.epoch == epoch) else {
                continue;
            };
            w.in_ring = false;
            if w.is_hungry() {
                return Some(id);
            }
        }
        None
    }

    /// Moves a queued task to the worker: next attempt, one credit, in-flight, and the function
    /// code if this worker has not been sent it yet.
    pub(super) fn assign(&mut self, id: TaskId, worker: WorkerId, now: Instant) -> AssignTask {
        let timeout_ms = self.start(id, worker, now);
        let task = self.tasks.get(id.0).expect("just started");
        let fn_hash = self
            .packages
            .get(task.package)
            .expect("running task without package")
            .fn_hash;
        let inputs = self.held_inputs(task.package);
        let w = self.workers.get_mut(&worker).expect("just assigned to");
        let fn_code = w.fn_sent.insert(fn_hash).then(|| {
            self.functions
                .code(&fn_hash)
                .expect("live package's function")
                .clone()
        });
        let assignment = AssignTask {
            task: id,
            attempt: task.attempt,
            fn_hash,
            fn_code,
            args: task.args.clone(),
            timeout_ms,
            inputs,
            res: crate::event::Resources::default(),
        };
        self.arm_hedge(id, now);
        assignment
    }

    /// Starts a queued task (or call) on the worker: the next attempt, `Running` there, one
    /// credit spent, in its in-flight set, its time limit armed. Returns the package's time
    /// limit.
    pub(super) fn start(&mut self, id: TaskId, worker: WorkerId, now: Instant) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let task = self.tasks.get_mut(id.0).expect("started a freed task");
        task.attempt += 1;
        task.assigned_at = now;
        task.state = TaskState::Running {
            worker,
            assigned_at: now,
            seq,
        };
        let package = self
            .packages
            .get_mut(task.package)
            .expect("queued task without package");
        if !task.shadow {
            package.counts.queued -= 1;
            package.counts.running += 1;
        }
        self.running_work_us = self.running_work_us.saturating_add(package.est_us);
        let timeout_ms = package.opts.timeout_ms;
        let w = self
            .workers
            .get_mut(&worker)
            .expect("hungry worker is connected");
        w.credits -= 1;
        self.free_credits -= 1;
        w.in_flight.insert(id);
        self.running += 1;
        self.arm_task_timer(id, timeout_ms, now);
        timeout_ms
    }
}
