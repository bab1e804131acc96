//! [`Core::check_invariants`]: a walk over the whole state that panics on the first
//! inconsistency. O(size of the state), for tests only.
//!
//! This file holds the walk's order and the [`Tally`] of the task walk; the checks of each
//! table are in their modules: [`tasks`], [`queue`], [`workers`] (and services), [`packages`]
//! (and groups, held packages, clients), [`timers`], [`kept`] (kept calls).

mod kept;
mod packages;
mod queue;
mod tasks;
mod timers;
mod workers;

use std::collections::HashMap;

use super::Core;

/// What the task walk counted, to compare with the counters kept elsewhere.
#[derive(Default)]
struct Tally {
    queued: usize,
    running: usize,
    cancelling: usize,
    /// `Done` tasks; of them, those a worker still holds.
    retained: usize,
    done_held: usize,
    /// `(queued, running)` per package slab key.
    per_package: HashMap<u64, (u32, u32)>,
    /// Estimated work of the running tasks.
    running_work_us: u64,
    /// Live calls per service.
    calls: HashMap<u64, u64>,
}

impl Core {
    /// Check every internal invariant, panicking with a description of the first broken one.
    /// O(size of the state): for tests only.
    ///
    /// # Panics
    ///
    /// On the first broken invariant, naming it and the ids involved.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.tasks.check();
        self.packages.check();
        let tally = self.check_tasks();
        assert_eq!(
            tally.running, self.running,
            "running counter {} but {} running tasks",
            self.running, tally.running
        );
        assert_eq!(
            tally.cancelling, self.cancelling,
            "cancelling counter {} but {} cancelled held tasks",
            self.cancelling, tally.cancelling
        );
        assert_eq!(
            tally.retained, self.retained,
            "retained counter {} but {} done tasks",
            self.retained, tally.retained
        );
        assert_eq!(
            tally.running_work_us, self.running_work_us,
            "running work sum"
        );
        self.check_queue(tally.queued);
        self.check_groups();
        self.check_workers(tally.running + tally.cancelling + tally.done_held);
        self.check_packages(&tally.per_package);
        let mut calls = tally.calls.clone();
        for (_, record) in self.kept_calls.iter() {
            *calls.entry(record.service).or_default() += 1; // a record holds its service
        }
        self.check_services(&calls);
        self.check_clients();
        self.check_bounds();
        self.check_timers();
        self.check_held();
        self.check_kept_calls();
    }
}
