//! Dispatch: meeting queued tasks with worker credits.
//!
//! Runs after every event that adds tasks or credits. Workers take turns one task at a time
//! (round robin over the hungry ring), so N tasks and N idle workers give one task each, and a
//! worker that asks again sooner (a fast one) gets more. Each worker gets one `Assign` per event
//! with all its new tasks. Cost: O(1) amortised per task assigned, plus the dead ring entries it
//! skips.

use std::collections::HashMap;

use super::Core;
use crate::event::{Action, AssignTask};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::TaskState;

impl Core {
    /// Assigns queued tasks while a non-draining worker has credits.
    pub(super) fn dispatch(&mut self, now: Instant, out: &mut Vec<Action>) {
        let mut batches: Vec<(WorkerId, Vec<AssignTask>)> = Vec::new();
        let mut slot_of: HashMap<WorkerId, usize> = HashMap::new();
        while !self.queue.is_empty() {
            let Some(worker) = self.next_hungry() else {
                break;
            };
            let tasks = &self.tasks;
            let id = self.queue.pop(|id| {
                tasks
                    .get(id.0)
                    .is_some_and(|t| t.state == TaskState::Queued)
            });
            let id = id.expect("ready queue counts a live task it cannot find");
            let assignment = self.assign(id, worker, now);
            let slot = *slot_of.entry(worker).or_insert_with(|| {
                batches.push((worker, Vec::new()));
                batches.len() - 1
            });
            batches[slot].1.push(assignment);
            self.ring_if_hungry(worker);
        }
        out.extend(
            batches
                .into_iter()
                .map(|(worker, tasks)| Action::Assign { worker, tasks }),
        );
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
    fn assign(&mut self, id: TaskId, worker: WorkerId, now: Instant) -> AssignTask {
        let seq = self.next_seq;
        self.next_seq += 1;
        let task = self.tasks.get_mut(id.0).expect("popped a freed task");
        task.attempt += 1;
        task.state = TaskState::Running {
            worker,
            assigned_at: now,
            seq,
        };
        let package = self
            .packages
            .get_mut(task.package)
            .expect("queued task without package");
        package.counts.queued -= 1;
        package.counts.running += 1;
        let w = self
            .workers
            .get_mut(&worker)
            .expect("hungry worker is connected");
        w.credits -= 1;
        w.in_flight.insert(id);
        let fn_hash = package.fn_hash;
        let fn_code = w.fn_sent.insert(fn_hash).then(|| {
            self.functions
                .code(&fn_hash)
                .expect("live package's function")
                .clone()
        });
        self.running += 1;
        let timeout_ms = package.opts.timeout_ms;
        let assignment = AssignTask {
            task: id,
            attempt: task.attempt,
            fn_hash,
            fn_code,
            args: task.args.clone(),
            timeout_ms,
        };
        self.arm_task_timer(id, timeout_ms, now);
        assignment
    }
}
