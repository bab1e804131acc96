//! The worker and service tables' invariants: in-flight sets, credits and keys of each worker;
//! each service's servers and live calls.

use std::collections::HashMap;

use crate::core::Core;
use crate::ids::{WorkerId, WorkerKey};
use crate::task::Task;

impl Core {
    /// In-flight sets hold exactly the tasks held by their worker; credits, draining and the
    /// hungry ring agree.
    pub(super) fn check_workers(&self, held_tasks: usize) {
        let mut ring: HashMap<WorkerId, usize> = HashMap::new();
        for &(id, epoch) in self.hungry.iter() {
            if self.workers.get(&id).is_some_and(|w| w.epoch == epoch) {
                *ring.entry(id).or_default() += 1;
            }
        }
        let mut in_flight = 0;
        let (mut credits, mut slots) = (0u64, 0u64);
        for (&id, w) in &self.workers {
            in_flight += w.in_flight.len();
            credits += u64::from(w.credits);
            if !w.draining {
                slots += u64::from(w.slots);
            }
            for task in &w.in_flight {
                let holder = self.tasks.get(task.0).and_then(Task::holder);
                assert_eq!(
                    holder,
                    Some(id),
                    "{task} is in {id}'s in-flight set but is held by {holder:?}"
                );
            }
            assert!(
                !w.draining || w.credits == 0,
                "draining {id} has {} credits",
                w.credits
            );
            assert!(
                !w.is_hungry() || w.in_ring,
                "{id} has {} credits but is not in the hungry ring",
                w.credits
            );
            let entries = ring.get(&id).copied().unwrap_or(0);
            assert_eq!(
                entries,
                usize::from(w.in_ring),
                "{id} has {entries} live ring entries, in_ring = {}",
                w.in_ring
            );
        }
        assert_eq!(
            in_flight, held_tasks,
            "in-flight sets hold {in_flight} tasks, {held_tasks} tasks are held"
        );
        assert_eq!(credits, self.free_credits, "free credits sum");
        assert_eq!(slots, self.total_slots, "worker slots sum");
        let mut keys: HashMap<WorkerKey, u32> = HashMap::new();
        for w in self.workers.values() {
            *keys.entry(w.key).or_default() += 1;
        }
        let counted: HashMap<WorkerKey, u32> =
            self.worker_keys.iter().map(|(&k, &n)| (k, n)).collect();
        assert_eq!(keys, counted, "connected workers per key");
    }

    /// Services count their live calls, are served by the workers that list them, and are
    /// freed when nothing refers to them.
    pub(super) fn check_services(&self, calls: &HashMap<u64, u64>) {
        for (slot, s) in self.services.iter() {
            assert_eq!(
                s.calls,
                calls.get(&slot).copied().unwrap_or(0),
                "service {} counts {} live calls",
                s.name,
                s.calls
            );
            assert!(!s.is_unused(), "service {} is unused but not freed", s.name);
            for w in &s.servers {
                let worker = self
                    .workers
                    .get(w)
                    .unwrap_or_else(|| panic!("{} is served by {w}, not connected", s.name));
                assert!(!worker.draining, "{} is served by draining {w}", s.name);
                assert!(
                    worker.serves.contains(&slot),
                    "{w} does not list {}",
                    s.name
                );
            }
        }
        for (id, w) in &self.workers {
            for slot in &w.serves {
                if w.draining {
                    continue;
                }
                let s = self
                    .services
                    .get(*slot)
                    .unwrap_or_else(|| panic!("{id} serves freed service {slot}"));
                assert!(s.servers.contains(id), "{} does not list {id}", s.name);
            }
        }
    }
}
