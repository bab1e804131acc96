//! A task entering the ready queue: queued with its package's key, or requeued at the front
//! when its worker gives it back (returned, lost, hedged), and the running work it leaves.

use crate::ids::TaskId;
use crate::queue::QueueKey;
use crate::task::TaskState;

use super::Core;

impl Core {
    /// Where the tasks of the package in `slot` queue.
    pub(super) fn queue_key(&self, slot: u64) -> QueueKey {
        let p = self
            .packages
            .get(slot)
            .expect("queue key of a freed package");
        QueueKey {
            priority: p.opts.priority,
            user: p.user,
            deadline: p.deadline.map_or(u64::MAX, |d| d.0),
            seq: p.seq,
        }
    }

    /// Queues a task of a live package: at the back of its package, or at the front
    /// (returned, requeued or hedge work).
    pub(super) fn enqueue(&mut self, id: TaskId, front: bool) {
        let task = self.tasks.get(id.0).expect("enqueue of a freed task");
        let slot = task.package;
        let key = self.queue_key(slot);
        if let Some(service) = task.call.as_ref().map(|c| c.service) {
            // A call queues with its function, for the workers that serve it (in the
            // function's sub-queue of its class if it asks for resources or labels).
            let queue = match self.class_of(slot) {
                None => {
                    &mut self
                        .services
                        .get_mut(service)
                        .expect("a live call's service")
                        .queue
                }
                Some(class) => &mut self.class_calls(service, class).queue,
            };
            let pos = if front {
                queue.push_front(slot, key, 0, id)
            } else {
                queue.push_back(slot, key, 0, id)
            };
            self.waiting_services.insert(service);
            self.tasks.get_mut(id.0).expect("checked").queue_pos = pos;
            return;
        }
        let p = self.packages.get(slot).expect("checked by queue_key");
        let (est, class) = (p.est_us, p.class);
        if let Some((c, q)) = class.and_then(|c| self.classes.get_mut(c).map(|q| (c, q))) {
            let pos = if front {
                q.queue
                    .push_front(&mut self.queue_store, slot, key, est, id)
            } else {
                q.queue.push_back(&mut self.queue_store, slot, key, est, id)
            };
            self.tasks.get_mut(id.0).expect("checked").queue_pos = pos;
            self.class_queue_changed(c);
            return;
        }
        let pos = if front {
            self.queue
                .push_front(&mut self.queue_store, slot, key, est, id)
        } else {
            self.queue
                .push_back(&mut self.queue_store, slot, key, est, id)
        };
        self.tasks.get_mut(id.0).expect("checked").queue_pos = pos;
    }

    /// A task of the package in `slot` stops running: its estimated work leaves the sum.
    pub(super) fn leave_running(&mut self, slot: u64) {
        let est = self.packages.get(slot).map_or(0, |p| p.est_us);
        self.running_work_us = self.running_work_us.saturating_sub(est);
        self.running -= 1;
    }

    /// Takes a `Running` or `Cancelled` task out of its worker's in-flight set and requeues it at
    /// the front of its priority, or frees it if it was cancelled; a `Done` task is only
    /// released by its worker. The caller has checked that the task exists and is held; the
    /// worker may already be removed (worker lost).
    pub(super) fn requeue_front(&mut self, id: TaskId) {
        let holder = self
            .tasks
            .get(id.0)
            .expect("requeue of a freed task")
            .holder();
        if let Some(w) = holder.and_then(|w| self.workers.get_mut(&w)) {
            w.in_flight.remove(&id);
            if !w.holding.is_empty() {
                self.free_resources(holder.expect("a holder"), id);
            }
        }
        let task = self.tasks.get_mut(id.0).expect("checked");
        match task.state {
            TaskState::Running { .. } => {
                task.state = TaskState::Queued;
                let (slot, shadow) = (task.package, task.shadow);
                self.disarm_task_timer(id);
                let package = self
                    .packages
                    .get_mut(slot)
                    .expect("running task without package");
                if !shadow {
                    package.counts.running -= 1;
                    package.counts.queued += 1;
                }
                self.leave_running(slot);
                self.enqueue(id, true);
            }
            TaskState::Cancelled { .. } => {
                self.tasks.remove(id.0);
                self.cancelling -= 1;
            }
            TaskState::Done { .. } => self.release_done(id),
            TaskState::Queued | TaskState::Waiting => {
                panic!("requeue of {id}, which is not held")
            }
        }
    }
}
