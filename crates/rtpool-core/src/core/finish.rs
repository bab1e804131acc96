//! The end of a task and of its package: a task finished with its outcome (scored against the
//! deadline), a done task released by its worker, and a package freed once every task is
//! done and every result acknowledged.

use bytes::Bytes;

use crate::event::{Action, TaskOutcome, TaskStatus};
use crate::ids::{Instant, TaskId};
use crate::package::Package;
use crate::task::TaskState;

use super::{Core, Timer};

impl Core {
    /// A worker no longer holds a `Done` task: free it if the client acknowledged it.
    pub(super) fn release_done(&mut self, id: TaskId) {
        let task = self.tasks.get_mut(id.0).expect("release of a freed task");
        if let TaskState::Done { acked, .. } = task.state {
            if acked {
                self.tasks.remove(id.0);
                self.retained -= 1;
            } else {
                task.state = TaskState::Done {
                    holder: None,
                    acked: false,
                };
            }
        }
    }

    /// Turns a queued or running task into `Done` with `outcome`, appending the result to its
    /// package's unacknowledged list and scoring it against the package's deadline. A running
    /// task stays held by its worker (which the caller tells to abort). Returns the outcome to
    /// send.
    pub(super) fn finish_task(
        &mut self,
        id: TaskId,
        mut outcome: TaskOutcome,
        now: Instant,
    ) -> TaskOutcome {
        let task = self.tasks.get_mut(id.0).expect("finish of a freed task");
        let slot = task.package;
        let package = self
            .packages
            .get_mut(slot)
            .expect("live task without package");
        let mut unqueued_from = None;
        let holder = match task.state {
            TaskState::Queued => {
                package.counts.queued -= 1;
                match task.call.as_ref().map(|c| c.service) {
                    Some(service) => self
                        .services
                        .get_mut(service)
                        .expect("a live call's service")
                        .queue_of(package.class)
                        .expect("a class call's sub-queue lives with its class")
                        .remove(slot, task.queue_pos),
                    None => match package.class {
                        Some(class) => {
                            self.classes
                                .get_mut(class)
                                .expect("a live package's class")
                                .queue
                                .remove(&mut self.queue_store, slot, task.queue_pos);
                            unqueued_from = Some(class);
                        }
                        None => self
                            .queue
                            .remove(&mut self.queue_store, slot, task.queue_pos),
                    },
                }
                None
            }
            TaskState::Waiting => {
                package.counts.queued -= 1;
                None
            }
            TaskState::Running { worker, seq, .. } => {
                package.counts.running -= 1;
                self.running_work_us = self.running_work_us.saturating_sub(package.est_us);
                self.running -= 1;
                Some((worker, seq))
            }
            other => panic!("finish of {id} in state {other:?}"),
        };
        if let Some(deadline) = package.deadline {
            outcome.late_us = now.micros_since(deadline);
            if outcome.status == TaskStatus::Missed {
                package.counts.missed += 1;
                self.counters.deadline_dropped += 1;
            } else if now <= deadline {
                package.counts.met += 1;
                self.counters.deadlines_met += 1;
            } else {
                package.counts.missed += 1;
                self.counters.deadlines_missed += 1;
            }
            let missed = outcome.status == TaskStatus::Missed || now > deadline;
            if self.overload.record(now, missed, self.queue.len()) {
                self.counters.overloads += 1;
            }
        }
        package.counts.done += 1;
        package.unacked.push_back(id);
        let (user, bytes) = (package.user, task.args.len());
        debug_assert!(!task.shadow, "finish of a shadow copy");
        task.state = TaskState::Done {
            holder,
            acked: false,
        };
        let args = std::mem::take(&mut task.args);
        let (index, call) = (task.index, task.call.take());
        let group = task.group.take();
        self.retained += 1;
        if let Some(class) = unqueued_from {
            self.class_queue_changed(class);
        }
        self.user_releases(user, bytes);
        self.disarm_task_timer(id);
        if let Some(call) = call {
            // Its dependents get the data; the client only if it asked (or nothing else will).
            let made_on = holder.map(|(w, _)| w);
            if !self.call_finished(slot, index, &call, &outcome, made_on, args, now) {
                outcome.data = Bytes::new();
            }
            self.release_sources(&call);
        }
        self.producer_finished(id, &outcome, holder.map(|(w, _)| w));
        let task = self.tasks.get_mut(id.0).expect("finished above");
        task.outcome = Some(Box::new(outcome.clone()));
        if let Some(g) = group {
            // The task is decided: its other copies stop.
            let group = self.groups.remove(g).expect("live group");
            for copy in group.copies {
                if copy != id {
                    self.cancel_copy(copy);
                }
            }
        }
        outcome
    }

    /// Frees the package if none of its tasks is queued or running and every result was
    /// acknowledged, releasing its function, key and timer.
    pub(super) fn free_package_if_finished(&mut self, slot: u64, out: &mut Vec<Action>) {
        if !self.packages.get(slot).is_some_and(Package::is_finished) {
            return;
        }
        self.free_package(slot, false, out);
    }

    /// Frees the package now; its remaining tasks must already be done, cancelled or freed.
    pub(super) fn free_package(&mut self, slot: u64, expired: bool, out: &mut Vec<Action>) {
        self.results_unattached(slot);
        let p = self.packages.remove(slot).expect("free of a freed package");
        if let Some(client) = p.client.and_then(|c| self.clients.get_mut(&c)) {
            client.packages.remove(&slot);
        }
        if let Some(user) = self.users.get_mut(&p.user) {
            user.packages.remove(&slot);
        }
        if !p.opts.key.is_empty() {
            self.keys.remove(&(p.user, p.opts.key.clone()));
        }
        if let Some(at) = p.expires {
            self.timers.remove(&(at, Timer::ResultTtl(slot)));
        }
        if p.deadline_armed {
            let at = p.deadline.expect("an armed deadline exists");
            self.timers.remove(&(at, Timer::Deadline(slot)));
        }
        self.package_slots.remove(&p.id);
        self.forget_held(slot, &p);
        if let Some(class) = p.class {
            self.class_package_freed(class);
        }
        if !p.calls {
            self.functions.release(&p.fn_hash);
        }
        out.push(Action::PackageFreed {
            package: p.id,
            expired,
            journaled: true,
        });
        p.into_buffers(&mut self.buffers);
    }
}
