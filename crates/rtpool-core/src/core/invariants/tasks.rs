//! The task table's invariants: each task's state agrees with its package, its worker, the
//! ready queue and its copies, counted into the [`Tally`] the other checks compare with.

use crate::core::lineage::NO_SOURCE;
use crate::core::Core;
use crate::ids::TaskId;
use crate::task::{Task, TaskState};

use super::Tally;

impl Core {
    /// Every task points at a live package (unless cancelled) and at a worker that holds it.
    pub(super) fn check_tasks(&self) -> Tally {
        let mut tally = Tally::default();
        for (raw, task) in self.tasks.iter() {
            let id = TaskId(raw);
            if let Some(worker) = task.holder() {
                let w = self
                    .workers
                    .get(&worker)
                    .unwrap_or_else(|| panic!("{id} is held by {worker}, which is not connected"));
                assert!(
                    w.in_flight.contains(&id),
                    "{id} is held by {worker} but not in its in-flight set"
                );
                assert!(task.attempt >= 1, "{id} is held by {worker} with attempt 0");
            }
            if let Some(call) = &task.call {
                assert!(
                    !matches!(
                        task.state,
                        TaskState::Done { .. } | TaskState::Cancelled { .. }
                    ),
                    "{id} is {:?} but still has its call",
                    task.state
                );
                *tally.calls.entry(call.service).or_default() += 1;
                let received = call.inputs.iter().filter(|i| !i.is_empty()).count();
                assert!(
                    received <= call.deps.len() - call.waiting as usize,
                    "{id} has more inputs than received"
                );
                assert_eq!(
                    call.waiting == 0,
                    task.state != TaskState::Waiting,
                    "{id} waits for {} inputs but is {:?}",
                    call.waiting,
                    task.state
                );
            } else {
                // A task that is no call waits only for the producer of its held package.
                let held = self.held.get(&task.package);
                assert!(
                    task.state != TaskState::Waiting || held.is_some_and(|h| h.input.is_none()),
                    "{id} waits, but its package's input is {:?}",
                    held.map(|h| h.input.is_some())
                );
            }
            match task.state {
                TaskState::Queued => tally.queued += 1,
                TaskState::Waiting => {}
                TaskState::Running { .. } => tally.running += 1,
                TaskState::Cancelled { .. } => {
                    tally.cancelling += 1;
                    continue;
                }
                TaskState::Done { holder, acked } => {
                    tally.retained += 1;
                    tally.done_held += usize::from(holder.is_some());
                    assert!(
                        acked || task.outcome.is_some(),
                        "unacknowledged done {id} has no outcome"
                    );
                    if !acked {
                        let p = self
                            .packages
                            .get(task.package)
                            .unwrap_or_else(|| panic!("unacked {id} without package"));
                        assert!(
                            p.unacked.contains(&id),
                            "done {id} is not in its unacked list"
                        );
                    } else {
                        assert!(holder.is_some(), "acked {id} with no holder was not freed");
                    }
                    continue;
                }
            }
            if let Some(g) = task.group {
                let group = self
                    .groups
                    .get(g)
                    .unwrap_or_else(|| panic!("{id} is in freed group {g}"));
                assert!(
                    group.copies.contains(&id),
                    "{id} is not in its group's copies"
                );
                assert_eq!(
                    group.package, task.package,
                    "{id}'s group is of another package"
                );
                assert_eq!(group.index, task.index, "{id}'s group is of another index");
            } else {
                let remake = task.call.as_ref().is_some_and(|c| c.remakes != NO_SOURCE);
                assert!(!task.shadow || remake, "shadow {id} is in no group");
            }
            if let TaskState::Running { .. } = task.state {
                tally.running_work_us += self.packages.get(task.package).map_or(0, |p| p.est_us);
            }
            if task.shadow {
                continue;
            }
            self.check_task_in_package(id, task);
            let entry = tally.per_package.entry(task.package).or_default();
            match task.state {
                TaskState::Queued | TaskState::Waiting => entry.0 += 1,
                _ => entry.1 += 1,
            }
        }
        tally
    }

    /// A live task's package exists and lists it at its index.
    pub(super) fn check_task_in_package(&self, id: TaskId, task: &Task) {
        let package = self.packages.get(task.package).unwrap_or_else(|| {
            panic!(
                "{id} belongs to slot {}, which does not exist",
                task.package
            )
        });
        let listed = package.tasks.get(task.index as usize);
        assert_eq!(
            listed,
            Some(&id),
            "{id} has index {} in {} but the package lists {listed:?}",
            task.index,
            package.id
        );
    }
}
