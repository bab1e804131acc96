//! [`Core::check_invariants`]: a walk over the whole state that panics on the first
//! inconsistency. O(size of the state), for tests only.

use std::collections::{HashMap, HashSet};

use super::lineage::{distinct_sources, NO_SOURCE};
use super::Core;
use super::Timer;
use crate::ids::{FnHash, TaskId, WorkerId, WorkerKey};
use crate::package::Package;
use crate::task::{Task, TaskState};

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

    /// Records of kept transaction intermediates (`lineage.rs`): each is needed (read, waited
    /// for by a copy, or its recipe held); its counts match the calls, copies and records
    /// that name it; its copy and its worker name it back.
    fn check_kept_calls(&self) {
        let mut readers: HashMap<u64, u32> = HashMap::new();
        let mut copies: HashMap<u64, Vec<TaskId>> = HashMap::new();
        for (key, task) in self.tasks.iter() {
            let Some(call) = &task.call else { continue };
            for s in distinct_sources(&call.sources) {
                if task.shadow {
                    copies.entry(s).or_default().push(TaskId(key));
                } else {
                    *readers.entry(s).or_default() += 1;
                }
            }
        }
        let mut recipe_refs: HashMap<u64, u32> = HashMap::new();
        for (_, r) in self.kept_calls.iter() {
            for s in distinct_sources(&r.sources) {
                *recipe_refs.entry(s).or_default() += 1;
            }
        }
        for (id, r) in self.kept_calls.iter() {
            assert!(
                r.readers > 0 || !r.remake_readers.is_empty() || r.recipe_refs > 0,
                "kept record {id} is needed by nothing but was not freed"
            );
            assert_eq!(
                r.readers,
                readers.get(&id).copied().unwrap_or(0),
                "readers of kept record {id}"
            );
            assert_eq!(
                r.recipe_refs,
                recipe_refs.get(&id).copied().unwrap_or(0),
                "recipe refs of kept record {id}"
            );
            let mut listed = r.remake_readers.clone();
            listed.sort_unstable();
            let mut found = copies.get(&id).cloned().unwrap_or_default();
            found.sort_unstable();
            assert_eq!(listed, found, "copies reading kept record {id}");
            if let Some(copy) = r.remake {
                let t = self
                    .tasks
                    .get(copy.0)
                    .unwrap_or_else(|| panic!("kept record {id}'s copy {copy} is freed"));
                assert!(
                    t.shadow && t.call.as_ref().is_some_and(|c| c.remakes == id),
                    "{copy} does not make kept record {id}"
                );
                assert!(
                    r.worker.is_none(),
                    "kept record {id} is kept and made again"
                );
            }
            if let Some(w) = r.worker.and_then(|w| self.workers.get(&w)) {
                assert!(
                    w.kept_calls.contains(&id),
                    "the worker of kept record {id} does not list it"
                );
            }
        }
        for (wid, w) in self.workers.iter() {
            for id in w.kept_calls.iter() {
                let r = self
                    .kept_calls
                    .get(*id)
                    .unwrap_or_else(|| panic!("{wid} lists freed kept record {id}"));
                assert_eq!(
                    r.worker,
                    Some(*wid),
                    "{wid} lists kept record {id} of another worker"
                );
            }
        }
    }

    /// Held packages (`held.rs`): each is a live package with `after`; one still without its
    /// input is in its producer's waiting list, and that producer is undecided; every waiting
    /// list names live held packages of that producer.
    fn check_held(&self) {
        assert!(
            self.doomed_held.is_empty(),
            "doomed packages left after an event"
        );
        for (&slot, h) in self.held.iter() {
            let p = self.packages.get(slot).expect("a held package is live");
            assert_eq!(
                p.opts.after, h.package.0,
                "held {slot} names another producer"
            );
            if h.input.is_none() && self.tasks.get(h.producer.0).is_some() {
                let waiting = p.tasks.iter().any(|id| {
                    self.tasks
                        .get(id.0)
                        .is_some_and(|t| t.package == slot && t.state == TaskState::Waiting)
                });
                if waiting {
                    assert!(
                        self.waiters
                            .get(&h.producer)
                            .is_some_and(|l| l.contains(&slot)),
                        "held {slot} waits but is not in {}'s waiting list",
                        h.producer
                    );
                }
            }
        }
        for (&producer, list) in self.waiters.iter() {
            assert!(!list.is_empty(), "{producer} has an empty waiting list");
            assert!(list.len() <= super::held::MAX_DEPENDENTS);
            let t = self
                .tasks
                .get(producer.0)
                .expect("a producer with waiters is live");
            assert!(
                !matches!(
                    t.state,
                    TaskState::Done { .. } | TaskState::Cancelled { .. }
                ),
                "{producer} is decided but still has waiters"
            );
            for slot in list {
                let h = self.held.get(slot).expect("a waiter is held");
                assert_eq!(h.producer, producer);
                assert!(
                    h.input.is_none(),
                    "held {slot} has its input but still waits"
                );
            }
        }
    }

    /// Every armed timer names a running attempt with that deadline or a detached package with
    /// that expiry, and every deadline and expiry is armed.
    fn check_timers(&self) {
        let mut armed = 0;
        for &(at, timer) in self.timers.keys() {
            match timer {
                Timer::TimeLimit(id, attempt) => {
                    let task = self
                        .tasks
                        .get(id.0)
                        .unwrap_or_else(|| panic!("timer of freed {id}"));
                    assert!(
                        matches!(task.state, TaskState::Running { .. }),
                        "timer of {id}, which is {:?}",
                        task.state
                    );
                    assert_eq!(task.attempt, attempt, "timer of an old attempt of {id}");
                    assert_eq!(
                        task.time_limit_at,
                        Some(at),
                        "{id}'s time limit is not its timer"
                    );
                }
                Timer::ResultTtl(slot) => {
                    let p = self.packages.get(slot).expect("timer of a freed package");
                    assert!(p.client.is_none(), "{} is attached but has a TTL", p.id);
                    assert_eq!(p.expires, Some(at), "{}'s expiry is not its timer", p.id);
                }
                Timer::Deadline(slot) => {
                    let p = self
                        .packages
                        .get(slot)
                        .expect("deadline of a freed package");
                    assert!(p.deadline_armed, "{}'s deadline timer is not marked", p.id);
                    assert_eq!(p.deadline, Some(at), "{}'s deadline is not its timer", p.id);
                }
                Timer::Hedge(id, attempt) => {
                    let task = self
                        .tasks
                        .get(id.0)
                        .unwrap_or_else(|| panic!("hedge timer of freed {id}"));
                    assert!(
                        matches!(task.state, TaskState::Running { .. }),
                        "hedge timer of {id}, which is {:?}",
                        task.state
                    );
                    assert_eq!(
                        task.attempt, attempt,
                        "hedge timer of an old attempt of {id}"
                    );
                    assert_eq!(task.hedge_at, Some(at), "{id}'s hedge_at is not its timer");
                }
                Timer::Service(slot) => {
                    let s = self
                        .services
                        .get(slot)
                        .unwrap_or_else(|| panic!("grace timer of freed service {slot}"));
                    assert_eq!(
                        s.orphan_at,
                        Some(at),
                        "{}'s orphan_at is not its timer",
                        s.name
                    );
                }
            }
            armed += 1;
        }
        let hedges = self
            .tasks
            .iter()
            .filter(|(_, t)| t.hedge_at.is_some())
            .count();
        let drops = self
            .packages
            .iter()
            .filter(|(_, p)| p.deadline_armed)
            .count();
        let deadlines = self
            .tasks
            .iter()
            .filter(|(_, t)| t.time_limit_at.is_some())
            .count();
        let expiries = self
            .packages
            .iter()
            .filter(|(_, p)| p.expires.is_some())
            .count();
        let orphans = self
            .services
            .iter()
            .filter(|(_, s)| s.orphan_at.is_some())
            .count();
        assert_eq!(
            armed,
            deadlines + expiries + hedges + drops + orphans,
            "timers and deadlines disagree"
        );
    }

    /// Every task points at a live package (unless cancelled) and at a worker that holds it.
    fn check_tasks(&self) -> Tally {
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
    fn check_task_in_package(&self, id: TaskId, task: &Task) {
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

    /// Each group has live copies of one task, exactly one of them the package's listed copy.
    fn check_groups(&self) {
        for (g, group) in self.groups.iter() {
            assert!(!group.copies.is_empty(), "group {g} has no live copy");
            let mut listed = 0;
            for c in &group.copies {
                let t = self
                    .tasks
                    .get(c.0)
                    .unwrap_or_else(|| panic!("group {g} lists freed {c}"));
                assert_eq!(
                    t.group,
                    Some(g),
                    "{c} is listed by group {g} but is not in it"
                );
                assert!(
                    matches!(t.state, TaskState::Queued | TaskState::Running { .. }),
                    "{c} of group {g} is {:?}",
                    t.state
                );
                listed += usize::from(!t.shadow);
            }
            assert_eq!(listed, 1, "group {g} has {listed} listed copies");
            assert!(
                usize::from(group.started) >= group.copies.len() + group.votes.len(),
                "group {g} counts fewer started copies than it has"
            );
        }
    }

    /// Each queued task has exactly one queue entry, at its position, in its package's queue
    /// with its package's key, and the queue holds nothing else.
    fn check_queue(&self, queued_tasks: usize) {
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

    /// In-flight sets hold exactly the tasks held by their worker; credits, draining and the
    /// hungry ring agree.
    fn check_workers(&self, held_tasks: usize) {
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
    fn check_services(&self, calls: &HashMap<u64, u64>) {
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

    /// Package counters match the tasks and add up; owners, ids, keys and functions agree.
    fn check_packages(&self, per_package: &HashMap<u64, (u32, u32)>) {
        let mut fn_refs: HashMap<FnHash, u32> = HashMap::new();
        for (slot, p) in self.packages.iter() {
            let id = p.id;
            assert_eq!(
                self.package_slots.get(&id),
                Some(&slot),
                "{id} is not indexed"
            );
            let held = per_package.get(&slot).copied().unwrap_or((0, 0));
            check_counts(p, held);
            if let Some(client) = p.client {
                let owner = self
                    .clients
                    .get(&client)
                    .unwrap_or_else(|| panic!("{id} is attached to {client}, not connected"));
                assert!(
                    owner.packages.contains(&slot),
                    "{id} is not in {client}'s set"
                );
                assert_eq!(
                    owner.user, p.user,
                    "{id} is attached to another user's client"
                );
            }
            let user = self.users.get(&p.user).expect("package of an unknown user");
            assert!(
                user.packages.contains(&slot),
                "{id} is not in its user's set"
            );
            if !p.opts.key.is_empty() {
                assert_eq!(self.keys.get(&(p.user, p.opts.key.clone())), Some(&id));
            }
            for tid in &p.unacked {
                let t = self.tasks.get(tid.0).expect("unacked task is live");
                assert!(matches!(t.state, TaskState::Done { acked: false, .. }));
            }
            if !p.calls {
                *fn_refs.entry(p.fn_hash).or_default() += 1;
            }
        }
        assert_eq!(
            self.package_slots.len(),
            self.packages.len(),
            "stale package ids"
        );
        assert!(
            self.keys.len() <= self.packages.len(),
            "stale idempotency keys"
        );
        for (hash, f) in self.functions.iter() {
            let refs = fn_refs.remove(hash).unwrap_or(0);
            assert_eq!(
                f.refs, refs,
                "function {hash:?} has refcount {}, used by {refs}",
                f.refs
            );
        }
        assert!(
            fn_refs.is_empty(),
            "functions in use but not stored: {:?}",
            fn_refs.keys()
        );
    }

    /// Each client's package set names live packages attached to it.
    fn check_clients(&self) {
        for (&id, c) in &self.clients {
            for &slot in &c.packages {
                let owner = self.packages.get(slot).and_then(|p| p.client);
                assert_eq!(
                    owner,
                    Some(id),
                    "{id} lists slot {slot}, attached to {owner:?}"
                );
            }
        }
    }
}

/// A package's counters match the `(queued, running)` tasks it holds, add up to its total, and
/// show it unfinished (a finished package must have been freed).
fn check_counts(p: &Package, held: (u32, u32)) {
    let id = p.id;
    let c = p.counts;
    assert_eq!(
        (c.queued, c.running),
        held,
        "{id} counts {c:?} but holds (queued, running) {held:?}"
    );
    let sum = [c.queued, c.running, c.done, c.cancelled]
        .map(u64::from)
        .iter()
        .sum::<u64>();
    assert_eq!(
        sum,
        u64::from(c.total),
        "{id} counters {c:?} do not add up to its total"
    );
    let listed = p.tasks.len();
    assert_eq!(
        listed, c.total as usize,
        "{id} lists {listed} tasks, total is {}",
        c.total
    );
    assert!(
        !p.is_finished(),
        "{id} has nothing queued, running or unacknowledged but was not freed: {c:?}"
    );
}
