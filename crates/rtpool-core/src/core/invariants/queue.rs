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
        let mut linked = self.queue.check(&self.queue_store);
        let mut seen = HashSet::new();
        // (package slot, key, position, task, service, class)
        type Entry = (
            u64,
            crate::queue::QueueKey,
            u64,
            TaskId,
            Option<u64>,
            Option<u64>,
        );
        let mut entries: Vec<Entry> = self
            .queue
            .iter(&self.queue_store)
            .map(|(slot, key, pos, id)| (slot, key, pos, id, None, None))
            .collect();
        let mut in_classes = 0;
        for (class, c) in self.classes.iter() {
            linked += c.queue.check(&self.queue_store);
            in_classes += c.queue.len();
            // Dispatch left no server idle that could start the class's head task.
            if let Some(head) = c.queue.peek(&self.queue_store) {
                for id in c
                    .kinds
                    .iter()
                    .flat_map(|&k| &self.kinds.get(k).expect("live").workers)
                {
                    let w = self.workers.get(id).expect("servers are connected");
                    assert!(
                        !(w.is_hungry() && w.has_free(&c.resources) && !self.conflicts(head, *id)),
                        "class {} could start {head} on {id}, which has a credit and the \
                         request free, but did not",
                        c.describe()
                    );
                }
            }
            entries.extend(
                c.queue
                    .iter(&self.queue_store)
                    .map(|(slot, key, pos, id)| (slot, key, pos, id, None, Some(class))),
            );
        }
        // The shared store holds the core's and the classes' entries, and nothing else.
        self.queue_store.check(linked);
        let mut in_services = 0;
        for (svc, s) in self.services.iter() {
            s.queue.check();
            in_services += s.queued();
            if s.queued() > 0 {
                assert!(
                    self.waiting_services.contains(&svc),
                    "service {} has queued calls but is not waiting",
                    s.name
                );
            }
            entries.extend(
                s.queue
                    .iter()
                    .map(|(slot, key, pos, id)| (slot, key, pos, id, Some(svc), None)),
            );
            for (&class, cc) in &s.classes {
                cc.queue.check();
                self.check_class_calls(svc, class, cc);
                entries.extend(
                    cc.queue
                        .iter()
                        .map(|(slot, key, pos, id)| (slot, key, pos, id, Some(svc), Some(class))),
                );
            }
        }
        for (slot, key, pos, id, svc, class) in entries {
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
            assert_eq!(
                self.packages.get(slot).and_then(|p| p.class),
                class,
                "{id} is queued outside its package's resource class"
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
        assert_eq!(
            self.queue.len() + in_services + in_classes,
            queued_tasks,
            "queue count"
        );
        self.check_classes();
    }

    /// A service's sub-queue of a class: its servers are exactly the servers of the service
    /// that serve the class, and, while they are few enough for placement to see them all,
    /// none could start its head call now.
    fn check_class_calls(&self, svc: u64, class: u64, cc: &crate::service::ClassCalls) {
        let s = self.services.get(svc).expect("listed");
        let c = self
            .classes
            .get(class)
            .unwrap_or_else(|| panic!("service {} has calls of a forgotten class", s.name));
        let mut want: Vec<_> = s
            .servers
            .iter()
            .filter(|w| {
                self.workers
                    .get(w)
                    .is_some_and(|w| c.is_served_by_kind(w.kind))
            })
            .copied()
            .collect();
        let mut have = cc.servers.clone();
        want.sort_unstable();
        have.sort_unstable();
        assert_eq!(
            have,
            want,
            "servers of {}'s calls of {}",
            s.name,
            c.describe()
        );
        if cc.queue.is_empty() || cc.servers.len() > 64 {
            return;
        }
        for id in &cc.servers {
            let w = self.workers.get(id).expect("servers are connected");
            assert!(
                !(w.is_hungry() && w.has_free(&c.resources)),
                "{}'s calls of {} could start on {id}, which has a credit and the request \
                 free, but did not",
                s.name,
                c.describe()
            );
        }
    }

    /// Each worker's resources in use are the sum of its holding tasks' requests, never above
    /// its totals; each class's servers are exactly the connected workers that can serve it,
    /// and its running count is the number of tasks holding it.
    fn check_classes(&self) {
        let mut running: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        for (id, w) in self.workers.iter() {
            let mut want = vec![0u64; w.in_use.len()];
            for (task, class) in w.holding.iter() {
                assert!(
                    w.in_flight.contains(task),
                    "worker {id} holds resources for {task}, which it does not hold"
                );
                *running.entry(*class).or_default() += 1;
                let c = self.classes.get(*class).expect("a held class is live");
                for (name, amount) in c.resources.iter() {
                    let i = w
                        .resources
                        .iter()
                        .position(|(n, _)| n == name)
                        .expect("held on a worker that has it");
                    want[i] += amount;
                }
            }
            assert_eq!(w.in_use, want, "worker {id}'s resources in use");
            for ((name, total), used) in w.resources.iter().zip(&w.in_use) {
                assert!(*used <= total, "worker {id} uses {used} of {total} {name}");
            }
            match w.kind {
                None => assert!(
                    w.resources.is_empty() && w.labels.is_empty(),
                    "worker {id} has resources or labels and no kind"
                ),
                Some(kind) => {
                    let k = self.kinds.get(kind).expect("a worker's kind is live");
                    assert!(
                        k.resources == w.resources && k.labels == w.labels,
                        "worker {id} is in the kind of other totals or labels"
                    );
                    assert_eq!(
                        k.workers.get(w.kind_pos),
                        Some(id),
                        "worker {id}'s kind index"
                    );
                }
            }
            for (class, c) in self.classes.iter() {
                let serves = c.is_served_by(&w.resources, &w.labels);
                assert_eq!(
                    w.kind.is_some_and(|k| c.kinds.contains(&k)),
                    serves,
                    "worker {id} and class {}",
                    c.describe()
                );
                if let Some(kind) = w.kind {
                    assert_eq!(
                        self.kinds.get(kind).expect("live").classes.contains(&class),
                        serves,
                        "worker {id}'s kind and class {}",
                        c.describe()
                    );
                }
            }
        }
        self.check_kinds();
        for (class, c) in self.classes.iter() {
            assert_eq!(
                c.running,
                running.get(&class).copied().unwrap_or(0),
                "class {} running count",
                c.describe()
            );
            let key = c.queue.top_priority().map(|p| (p, c.turn));
            assert_eq!(c.ready_key, key, "class {}'s ready key", c.describe());
        }
    }

    /// Each kind: its workers connected and of its signature, its counts of active workers
    /// and slots, its classes exactly those it can serve (both ways), and its ready set
    /// exactly its classes with a task queued, at their keys.
    fn check_kinds(&self) {
        for (kind, k) in self.kinds.iter() {
            assert!(
                !k.workers.is_empty(),
                "kind {kind} has no worker and was kept"
            );
            let active: Vec<&crate::worker::Worker> = k
                .workers
                .iter()
                .map(|id| self.workers.get(id).expect("a kind's worker is connected"))
                .filter(|w| !w.draining)
                .collect();
            assert_eq!(
                k.active as usize,
                active.len(),
                "kind {kind}'s active workers"
            );
            let slots: u64 = active.iter().map(|w| u64::from(w.slots)).sum();
            assert_eq!(k.slots, slots, "kind {kind}'s slots");
            let mut ready = std::collections::BTreeSet::new();
            for (class, c) in self.classes.iter() {
                let serves = c.is_served_by(&k.resources, &k.labels);
                assert_eq!(
                    k.classes.contains(&class),
                    serves,
                    "kind {kind}, {}",
                    c.describe()
                );
                assert_eq!(c.kinds.contains(&kind), serves, "{}'s kinds", c.describe());
                if let (true, Some((p, turn))) = (serves, c.ready_key) {
                    ready.insert((std::cmp::Reverse(p), turn, class));
                }
            }
            assert_eq!(k.ready, ready, "kind {kind}'s ready classes");
        }
    }
}
