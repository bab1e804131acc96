//! Cancelling tasks: by index of a package, one task in whatever state it is, and what that
//! releases (its copies, its call's sources and dependents, the user's bytes).

use super::Core;
use crate::event::Action;
use crate::ids::TaskId;
use crate::task::TaskState;

impl Core {
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
                        let pos = task.queue_pos;
                        self.unqueue_call(c.service, slot, pos);
                    }
                    None => {
                        let pos = task.queue_pos;
                        self.unqueue(slot, pos);
                    }
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
