//! The ready queue's invariants: its own structure, and each entry a queued task of a live
//! package at its recorded position.

use std::collections::HashSet;

use crate::core::Core;
use crate::ids::TaskId;
use crate::task::TaskState;

impl Core {
    /// Each queued task has exactly one queue entry, at its position, in its package's queue
    /// with its package's key, and the queue holds nothing else.
    pub(super) fn check_queue(&self, queued_tasks: usize) {
        self.queue.check();
        let mut seen = HashSet::new();
        let mut entries: Vec<(u64, crate::queue::QueueKey, u64, TaskId, Option<u64>)> = self
            .queue
            .iter()
            .map(|(slot, key, pos, id)| (slot, key, pos, id, None))
            .collect();
        let mut in_services = 0;
        for (svc, s) in self.services.iter() {
            s.queue.check();
            in_services += s.queue.len();
            if !s.queue.is_empty() {
                assert!(
                    self.waiting_services.contains(&svc),
                    "service {} has queued calls but is not waiting",
                    s.name
                );
            }
            entries.extend(
                s.queue
                    .iter()
                    .map(|(slot, key, pos, id)| (slot, key, pos, id, Some(svc))),
            );
        }
        for (slot, key, pos, id, svc) in entries {
            let task = self
                .tasks
                .get(id.0)
                .unwrap_or_else(|| panic!("the queue holds freed {id}"));
            assert_eq!(
                task.state,
                TaskState::Queued,
                "the queue holds {id}, which is {:?}",
                task.state
            );
            assert!(seen.insert(id), "{id} is queued twice");
            assert_eq!(
                task.call.as_ref().map(|c| c.service),
                svc,
                "{id} is queued in the wrong queue"
            );
            assert_eq!(task.package, slot, "{id} is queued under another package");
            assert_eq!(task.queue_pos, pos, "{id} is queued at another position");
            assert_eq!(key, self.queue_key(slot), "{id} is queued with a stale key");
        }
        assert_eq!(
            seen.len(),
            queued_tasks,
            "{queued_tasks} queued tasks, {} queue entries",
            seen.len()
        );
        assert_eq!(self.queue.len() + in_services, queued_tasks, "queue count");
    }
}
