//! Read-only views of the core's tables for status pages and metrics ([`PackageView`],
//! [`WorkerView`]).
//!
//! These are the only scans of whole tables in the core, and nothing on the scheduling path
//! calls them: the master's status snapshot does, about once a second or when a peer asks
//! (see `rtpool-master`'s `status` module). They cost O(packages) and O(workers).

use super::Core;
use crate::event::PackageCounts;
use crate::ids::{Instant, PackageId, UserId, WorkerId};
use crate::overload::OverloadStatus;

/// One live package, as a status page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackageView {
    /// Its public id.
    pub id: PackageId,
    /// Its user.
    pub user: UserId,
    /// Its priority (higher runs first).
    pub priority: i32,
    /// Its absolute deadline, if it has one.
    pub deadline: Option<Instant>,
    /// Its counters (total, queued, running, done, cancelled, met, missed).
    pub counts: PackageCounts,
    /// A package of calls of named functions (grid RPC).
    pub is_calls: bool,
}

/// One connected worker, as a status page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    /// Its id (the master's session id).
    pub id: WorkerId,
    /// Tasks it runs at once, as it announced on joining.
    pub slots: u32,
    /// Tasks it may still be sent.
    pub credits: u32,
    /// Tasks it holds (assigned, not answered).
    pub in_flight: usize,
    /// It asked for no more work.
    pub draining: bool,
    /// What it has for tasks that ask (`gpu=2`).
    pub resources: crate::event::Resources,
    /// How much of each its running tasks hold.
    pub in_use: crate::event::Resources,
    /// Its labels.
    pub labels: crate::event::Labels,
}

/// A read-only view of one resource class (packages asking for the same resources and labels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassView {
    /// `gpu=1,zone=a`.
    pub name: String,
    /// What each task holds.
    pub resources: crate::event::Resources,
    /// The labels its worker needs.
    pub labels: crate::event::Labels,
    /// Tasks queued.
    pub queued: usize,
    /// Tasks running.
    pub running: u64,
    /// Connected workers that can serve it, draining ones included.
    pub workers: usize,
    /// No connected worker that is not draining can serve it.
    pub unschedulable: bool,
}

impl Core {
    /// Every live package, in no particular order. O(packages): for status snapshots only.
    pub fn package_views(&self) -> impl Iterator<Item = PackageView> + '_ {
        self.packages.iter().map(|(_, p)| PackageView {
            id: p.id,
            user: p.user,
            priority: p.opts.priority,
            deadline: p.deadline,
            counts: p.counts,
            is_calls: p.calls,
        })
    }

    /// Every resource class, in no particular order; its `queued` counts its queued tasks and
    /// calls. O(classes + the services' sub-queues).
    pub fn class_views(&self) -> impl Iterator<Item = ClassView> + '_ {
        let mut calls: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        for (_, s) in self.services.iter() {
            for (&class, cc) in &s.classes {
                *calls.entry(class).or_default() += cc.queue.len();
            }
        }
        self.classes.iter().map(move |(slot, c)| ClassView {
            name: c.describe(),
            resources: c.resources.clone(),
            labels: c.labels.clone(),
            queued: c.queue.len() + calls.get(&slot).copied().unwrap_or(0),
            running: c.running,
            workers: self.class_servers(slot),
            unschedulable: !self.class_has_server(slot),
        })
    }

    /// Every connected worker, in no particular order. O(workers).
    pub fn worker_views(&self) -> impl Iterator<Item = WorkerView> + '_ {
        self.workers.iter().map(|(id, w)| WorkerView {
            id: *id,
            slots: w.slots,
            credits: w.credits,
            in_flight: w.in_flight.len(),
            draining: w.draining,
            resources: w.resources.clone(),
            in_use: crate::event::Resources::new(
                w.resources
                    .iter()
                    .zip(&w.in_use)
                    .map(|((n, _), used)| (n.to_owned(), *used)),
            )
            .unwrap_or_default(),
            labels: w.labels.clone(),
        })
    }

    /// Whether deadlines are being missed because the workers cannot keep up, judged on the
    /// deadline results of the window ending at `now` (see [`OverloadStatus`]). O(1).
    pub fn overload(&self, now: Instant) -> OverloadStatus {
        self.overload.status(now, self.queue.len())
    }

    /// Whether the live package `id` has a deadline (false for an unknown one). O(1).
    pub fn has_deadline(&self, id: PackageId) -> bool {
        self.package_slots
            .get(&id)
            .and_then(|&slot| self.packages.get(slot))
            .is_some_and(|p| p.deadline.is_some())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::event::{Action, Event, PackageOpts};
    use crate::ids::{ClientId, FnHash};

    #[test]
    fn views_show_a_package_and_a_worker() {
        let mut core = Core::default();
        let mut out = Vec::new();
        let now = Instant(0);
        core.handle(
            Event::WorkerJoined {
                labels: Default::default(),
                resources: Default::default(),
                worker: WorkerId(7),
                slots: 2,
                key: crate::ids::WorkerKey(7),
            },
            now,
            &mut out,
        );
        core.handle(
            Event::ClientJoined {
                client: ClientId(1),
                user: UserId(3),
            },
            now,
            &mut out,
        );
        let opts = PackageOpts {
            priority: 5,
            ..PackageOpts::default()
        };
        core.handle(
            Event::Submit {
                client: ClientId(1),
                req_id: 1,
                package: PackageId(42),
                fn_hash: FnHash([1; 32]),
                fn_code: Bytes::from_static(b"code"),
                opts,
                tasks: vec![Bytes::new(), Bytes::new(), Bytes::new()],
            },
            now,
            &mut out,
        );
        assert!(out.iter().any(|a| matches!(a, Action::Accepted { .. })));
        let packages: Vec<_> = core.package_views().collect();
        assert_eq!(packages.len(), 1);
        let p = packages[0];
        assert_eq!((p.id, p.user, p.priority), (PackageId(42), UserId(3), 5));
        assert_eq!((p.counts.total, p.counts.queued), (3, 3));
        let workers: Vec<_> = core.worker_views().collect();
        assert_eq!(workers.len(), 1);
        assert_eq!((workers[0].id, workers[0].slots), (WorkerId(7), 2));
    }
}
