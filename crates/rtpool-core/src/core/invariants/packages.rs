//! The package table's invariants and those of the tables that point at packages: each
//! package's counters against the tasks it holds, groups, held packages and clients.

use std::collections::HashMap;

use crate::core::Core;
use crate::ids::FnHash;
use crate::package::Package;
use crate::task::TaskState;

impl Core {
    /// Package counters match the tasks and add up; owners, ids, keys and functions agree.
    pub(super) fn check_packages(&self, per_package: &HashMap<u64, (u32, u32)>) {
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

    /// Each group has live copies of one task, exactly one of them the package's listed copy.
    pub(super) fn check_groups(&self) {
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

    /// Held packages (`held.rs`): each is a live package with `after`; one still without its
    /// input is in its producer's waiting list, and that producer is undecided; every waiting
    /// list names live held packages of that producer.
    pub(super) fn check_held(&self) {
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
            assert!(list.len() <= crate::core::held::MAX_DEPENDENTS);
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

    /// Each client's package set names live packages attached to it.
    pub(super) fn check_clients(&self) {
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
pub(super) fn check_counts(p: &Package, held: (u32, u32)) {
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
