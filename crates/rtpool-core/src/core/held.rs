//! Dependencies held by the master (package option `after`, `docs/data.md`): the tasks of a
//! package take the result of one task of another package of the same user as their input.
//!
//! `client.submit(g, client.submit(f, x))` sends `g` at once, naming `f`'s package and index;
//! `g`'s tasks wait here (state `Waiting`, in no queue) until `f` is decided, with no client
//! round trip in between:
//! * `f` succeeded: its result data (for a kept result, the ~100-byte reference to the value on
//!   `f`'s worker) becomes `g`'s input (`Assignment.inputs`), and `g` is queued with `near` set
//!   to `f`'s worker (unless the client set one), so it runs where the value is when that
//!   worker has a free credit (`locality.rs`);
//! * `f` failed, was cancelled, or is gone: `g`'s tasks fail (status 3) with a message naming
//!   `f`, and so do their own dependents, transitively (a work list, never recursion).
//!
//! The core keeps two maps: each held package's producer and input (`held`, by package slot),
//! and each producer's waiting packages (`waiters`, by task id, at most
//! [`MAX_DEPENDENTS`] each, of at most [`MAX_HELD_TASKS`] tasks). Every operation is O(1) in
//! the number of tasks, plus the tasks of the packages it releases or fails: at most 4,096
//! per producer (what submitting that many tasks costs).
//!
//! What the master does not do: re-run `f` when the worker holding its kept value is lost (the
//! client does, from its lineage, when `g` fails reading it: `_deps.py`).

use bytes::Bytes;

use super::Core;
use crate::event::{RejectReason, TaskOutcome, TaskStatus};
use crate::ids::{Instant, PackageId, TaskId, UserId, WorkerId};
use crate::package::Package;
use crate::task::TaskState;

/// Most packages that may wait for one producer: a producer's completion touches each.
pub(crate) const MAX_DEPENDENTS: usize = 256;

/// Most tasks of a held package. With [`MAX_DEPENDENTS`], a producer's completion queues at
/// most 4,096 tasks in one event (what a submitted package of 4,096 tasks costs); the SDK
/// holds one-task packages.
pub(crate) const MAX_HELD_TASKS: usize = 16;

/// The dependency of a held package.
#[derive(Debug)]
pub(crate) struct Held {
    /// The producing task.
    pub(crate) producer: TaskId,
    /// Its package and index, for messages.
    pub(crate) package: PackageId,
    pub(crate) index: u32,
    /// Its result data once it succeeded (then the package's tasks are no longer waiting).
    pub(crate) input: Option<Bytes>,
}

/// Where a producer named by `after` stands at submission.
pub(super) enum Producer {
    /// Not decided yet: the package waits for it.
    Pending(TaskId),
    /// Succeeded: its result is the input.
    Ready(TaskId, Bytes, Option<WorkerId>),
    /// Will never succeed: the package's tasks fail with this reason.
    Failed(TaskId, String),
}

impl Core {
    /// The producer named by `opts.after`/`after_index` of a package of `user`.
    ///
    /// # Errors
    ///
    /// [`RejectReason::UnknownDependency`] when it names no live task of the user's (its
    /// result was delivered and acknowledged, or it never existed), a call of a named
    /// function, or a producer that already has [`MAX_DEPENDENTS`] waiting packages.
    pub(super) fn check_after(
        &self,
        user: UserId,
        after: u64,
        index: u32,
    ) -> Result<Producer, RejectReason> {
        let unknown = |why: &'static str| RejectReason::UnknownDependency {
            package: after,
            index,
            why,
        };
        let slot = *self
            .package_slots
            .get(&PackageId(after))
            .ok_or(unknown("no such package (finished and acknowledged?)"))?;
        let p = self.packages.get(slot).expect("indexed package is live");
        if p.user != user {
            return Err(unknown("no such package (finished and acknowledged?)"));
        }
        if p.calls {
            return Err(unknown("it is a call of a named function"));
        }
        let id = *p
            .tasks
            .get(index as usize)
            .ok_or(unknown("the package has no task at that index"))?;
        let task = self
            .tasks
            .get(id.0)
            .ok_or(unknown("its result was already acknowledged"))?;
        if self.waiters.get(&id).map_or(0, Vec::len) >= MAX_DEPENDENTS {
            return Err(unknown(
                "it already has the most dependents one task may have",
            ));
        }
        Ok(match (&task.state, task.outcome.as_deref()) {
            (TaskState::Done { .. }, Some(o)) if o.status == TaskStatus::Ok => {
                let made_on = Some(WorkerId(task.made_on)).filter(|w| w.0 != 0);
                Producer::Ready(id, o.data.clone(), made_on)
            }
            (TaskState::Done { .. }, Some(o)) => {
                Producer::Failed(id, failure_reason(PackageId(after), index, o))
            }
            (TaskState::Done { .. }, None) | (TaskState::Cancelled { .. }, _) => {
                Producer::Failed(id, cancelled_reason(PackageId(after), index))
            }
            _ => Producer::Pending(id),
        })
    }

    /// The producer of a submitted package with `after`, if it has one.
    ///
    /// # Errors
    ///
    /// As [`Core::check_after`]; and `after` with `replicas` (the copies would start before
    /// the input exists) or more than [`MAX_HELD_TASKS`] tasks.
    pub(super) fn check_held_submit(
        &self,
        user: UserId,
        opts: &crate::event::PackageOpts,
        tasks: usize,
    ) -> Result<Option<Producer>, RejectReason> {
        if opts.after == 0 {
            return Ok(None);
        }
        if tasks > MAX_HELD_TASKS {
            return Err(RejectReason::InvalidOptions(format!(
                "a package with after has at most {MAX_HELD_TASKS} tasks ({tasks} given)"
            )));
        }
        if opts.replicas() > 1 {
            return Err(RejectReason::InvalidOptions(
                "after does not combine with replicas".to_owned(),
            ));
        }
        self.check_after(user, opts.after, opts.after_index)
            .map(Some)
    }

    /// A held package restored from the journal: its producer, if restored too and not yet
    /// decided, is waited for; a producer whose result was delivered before the restart is
    /// gone with it (the master kept no copy), so the package's tasks fail, saying so.
    pub(super) fn hold_restored(&mut self, slot: u64, user: UserId) {
        let p = self.packages.get(slot).expect("just restored");
        let (after, index) = (p.opts.after, p.opts.after_index);
        let producer = self.check_after(user, after, index).unwrap_or_else(|_| {
            Producer::Failed(
                TaskId(u64::MAX),
                format!(
                    "not run: its input, task {index} of {}, is no longer at the master (the \
                     master restarted after delivering it); submit it again",
                    PackageId(after)
                ),
            )
        });
        self.hold(slot, producer);
    }

    /// Makes the new package in `slot` (its tasks just created, `Queued`) depend on
    /// `producer`: waiting for it, released at once, or failed (at the end of the event).
    pub(super) fn hold(&mut self, slot: u64, producer: Producer) {
        let p = self.packages.get(slot).expect("just made");
        let (package, index) = (PackageId(p.opts.after), p.opts.after_index);
        let (id, input) = match producer {
            Producer::Pending(id) => {
                self.unqueue_all_waiting(slot);
                self.waiters.entry(id).or_default().push(slot);
                (id, None)
            }
            Producer::Ready(id, data, made_on) => {
                // Done before this package came: still placed near the worker that made the
                // input (its kept value is there), as when released by the result itself.
                let p = self.packages.get_mut(slot).expect("just made");
                if p.opts.near == 0 {
                    if let Some(w) = made_on {
                        p.opts.near = w.0;
                    }
                }
                (id, Some(data))
            }
            Producer::Failed(id, reason) => {
                self.unqueue_all_waiting(slot);
                self.doomed_held.push((slot, reason));
                (id, None)
            }
        };
        self.held.insert(
            slot,
            Held {
                producer: id,
                package,
                index,
                input,
            },
        );
    }

    /// The `i`-th task of the package in `slot`, while it lives.
    fn package_task(&self, slot: u64, i: usize) -> Option<TaskId> {
        self.packages.get(slot)?.tasks.get(i).copied()
    }

    /// Every queued task of the held package in `slot` goes to `Waiting`.
    fn unqueue_all_waiting(&mut self, slot: u64) {
        for i in 0.. {
            let Some(id) = self.package_task(slot, i) else {
                break;
            };
            self.unqueue_waiting(id);
        }
    }

    /// A queued task of a held package goes to `Waiting` (out of the ready queue).
    fn unqueue_waiting(&mut self, id: TaskId) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        if task.state != TaskState::Queued {
            return;
        }
        let (slot, pos) = (task.package, task.queue_pos);
        task.state = TaskState::Waiting;
        self.unqueue(slot, pos);
    }

    /// Task `id` was decided with `outcome` (its worker `on`, if it ran): the packages that
    /// wait for it are released, or doomed if it did not succeed.
    pub(super) fn producer_finished(
        &mut self,
        id: TaskId,
        outcome: &TaskOutcome,
        on: Option<WorkerId>,
    ) {
        let Some(slots) = self.waiters.remove(&id) else {
            return;
        };
        for slot in slots {
            let Some(h) = self.held.get_mut(&slot).filter(|h| h.producer == id) else {
                continue;
            };
            if outcome.status != TaskStatus::Ok {
                let reason = failure_reason(h.package, h.index, outcome);
                self.doomed_held.push((slot, reason));
                continue;
            }
            h.input = Some(outcome.data.clone());
            self.release_held(slot, on);
            self.held_released = true;
        }
    }

    /// Task `id` was cancelled (by its client): the packages that wait for it are doomed.
    pub(super) fn producer_cancelled(&mut self, id: TaskId) {
        let Some(slots) = self.waiters.remove(&id) else {
            return;
        };
        for slot in slots {
            if let Some(h) = self.held.get(&slot).filter(|h| h.producer == id) {
                let reason = cancelled_reason(h.package, h.index);
                self.doomed_held.push((slot, reason));
            }
        }
    }

    /// Queues the waiting tasks of a package whose input arrived, preferring worker `on`.
    fn release_held(&mut self, slot: u64, on: Option<WorkerId>) {
        let p = self.packages.get_mut(slot).expect("a held package is live");
        if p.opts.near == 0 {
            if let Some(w) = on {
                p.opts.near = w.0;
            }
        }
        // By index, not over a copy of the list: no allocation on the scheduler's path.
        for i in 0.. {
            let Some(id) = self.package_task(slot, i) else {
                break;
            };
            let Some(task) = self.tasks.get_mut(id.0).filter(|t| t.package == slot) else {
                continue;
            };
            if task.state == TaskState::Waiting {
                task.state = TaskState::Queued;
                self.enqueue(id, false);
            }
        }
    }

    /// Fails the waiting tasks of every doomed package (status 3, its reason), and then of
    /// theirs, until none is left. Called at the end of each event.
    pub(super) fn fail_doomed_held(&mut self, now: Instant) {
        while let Some((slot, reason)) = self.doomed_held.pop() {
            // By index: finishing the last task frees the package, which ends the loop.
            for i in 0.. {
                let Some(id) = self.package_task(slot, i) else {
                    break;
                };
                let Some(task) = self.tasks.get(id.0).filter(|t| t.package == slot) else {
                    continue;
                };
                if task.state != TaskState::Waiting {
                    continue;
                }
                let o = Self::system_outcome(task, TaskStatus::Failed, reason.clone(), now);
                let o = self.finish_task(id, o, now);
                self.cascade.push((slot, o));
            }
        }
    }

    /// The input of a task of the package in `slot`, if it is held (empty otherwise).
    pub(super) fn held_inputs(&self, slot: u64) -> Vec<Bytes> {
        self.held
            .get(&slot)
            .and_then(|h| h.input.clone())
            .map_or_else(Vec::new, |i| vec![i])
    }

    /// The package in `slot` is freed: forget its dependency.
    pub(super) fn forget_held(&mut self, slot: u64, p: &Package) {
        let Some(h) = self.held.remove(&slot) else {
            return;
        };
        debug_assert_eq!(p.opts.after, h.package.0);
        if let Some(list) = self.waiters.get_mut(&h.producer) {
            list.retain(|&s| s != slot);
            if list.is_empty() {
                self.waiters.remove(&h.producer);
            }
        }
    }
}

fn failure_reason(package: PackageId, index: u32, o: &TaskOutcome) -> String {
    let what = match o.status {
        TaskStatus::Error => "raised an error (see that task's result)".to_owned(),
        status => {
            let text = String::from_utf8_lossy(&o.data);
            let text: String = text.chars().take(300).collect();
            format!("failed ({status:?}: {text})")
        }
    };
    format!("not run: its input, task {index} of {package}, {what}")
}

fn cancelled_reason(package: PackageId, index: u32) -> String {
    format!("not run: its input, task {index} of {package}, was cancelled")
}
