//! The [`Core`]: tables, ready queue, credits, and the one entry point [`Core::handle`].
//!
//! This file holds the state and the helpers that several events share (freeing tasks and
//! packages, requeueing); the events themselves are in `core/client_events.rs` and
//! `core/worker_events.rs`, assignment in `core/dispatch.rs`, and the invariant walk in
//! `core/invariants.rs`.
//!
//! Where a task is, and who points at it:
//!
//! | task state  | ready queue    | worker in-flight set | package counter        |
//! |-------------|----------------|----------------------|------------------------|
//! | `Queued`    | one live entry | none                 | `queued`               |
//! | `Running`   | none           | its worker's         | `running`              |
//! | `Cancelled` | none           | its worker's         | `cancelled`            |
//! | freed       | maybe a tombstone (if cancelled while queued) | none | `done` or `cancelled` |
//!
//! A `Cancelled` task's package may already be freed: the client is done with it, and only the
//! worker's answer (or loss) is awaited so the in-flight set stays exact.

mod client_events;
mod dispatch;
mod invariants;
mod worker_events;

use std::collections::HashMap;

use bytes::Bytes;

use crate::client::Client;
use crate::event::{Action, Event};
use crate::function::FunctionTable;
use crate::hungry::HungryRing;
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId, WorkerId};
use crate::package::Package;
use crate::queue::ReadyQueue;
use crate::table::Table;
use crate::task::{Task, TaskState};
use crate::worker::Worker;

/// Tunables of the core; every field has a sane default.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Largest number of tasks in one package (default 16,777,216).
    pub max_tasks_per_package: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            max_tasks_per_package: 1 << 24,
        }
    }
}

/// Gauges and counters for logs, status and tests.
///
/// `tasks == queued + running + cancelling` at all times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Tasks held (queued, running or waiting for delivery).
    pub tasks: usize,
    /// Packages held.
    pub packages: usize,
    /// Tasks in the ready queue.
    pub queued: usize,
    /// Tasks assigned to workers.
    pub running: usize,
    /// Tasks their client cancelled while a worker held them: kept until that worker's result,
    /// return or loss, then freed without a result.
    pub cancelling: usize,
    /// Connected workers.
    pub workers: usize,
    /// Connected clients.
    pub clients: usize,
    /// Function codes held.
    pub functions: usize,
    /// Results delivered since start.
    pub delivered: u64,
    /// Worker results ignored because their task or attempt was no longer assigned there.
    pub stale_results: u64,
}

/// Gauges of one worker, from [`Core::worker_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Tasks it runs at once, as it announced on joining.
    pub slots: u32,
    /// Tasks it may still be sent.
    pub credits: u32,
    /// Tasks it holds: assigned and neither answered nor returned (cancelled ones included).
    pub in_flight: usize,
    /// It sent `DRAIN`: it gets no more tasks.
    pub draining: bool,
}

/// The scheduler state machine.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    tasks: Table<Task>,
    packages: Table<Package>,
    queue: ReadyQueue,
    functions: FunctionTable,
    workers: HashMap<WorkerId, Worker>,
    clients: HashMap<ClientId, Client>,
    hungry: HungryRing,
    /// Tasks in state `Running`.
    running: usize,
    /// Tasks in state `Cancelled`.
    cancelling: usize,
    /// Epoch of the next worker to join.
    next_epoch: u64,
    /// Sequence number of the next assignment.
    next_seq: u64,
    delivered: u64,
    stale_results: u64,
}

impl Default for Core {
    fn default() -> Self {
        Self::new(CoreConfig::default())
    }
}

impl Core {
    /// An empty core.
    pub fn new(config: CoreConfig) -> Self {
        Self {
            config,
            tasks: Table::default(),
            packages: Table::default(),
            queue: ReadyQueue::default(),
            functions: FunctionTable::default(),
            workers: HashMap::new(),
            clients: HashMap::new(),
            hungry: HungryRing::default(),
            running: 0,
            cancelling: 0,
            next_epoch: 0,
            next_seq: 0,
            delivered: 0,
            stale_results: 0,
        }
    }

    /// Apply one event at time `now`, appending the resulting actions to `out`.
    ///
    /// Bad input from a peer (an unknown task id, a result for a task that is not assigned to
    /// that worker, a package of another client) never panics: it is ignored and counted, or
    /// answered with an action such as [`Action::UnknownPackage`].
    pub fn handle(&mut self, event: Event, now: Instant, out: &mut Vec<Action>) {
        match event {
            Event::ClientJoined { client } => self.on_client_joined(client),
            Event::ClientLost { client } => self.on_client_lost(client),
            Event::Submit {
                client,
                req_id,
                fn_hash,
                fn_code,
                opts,
                tasks,
            } => {
                let submit = client_events::Submit {
                    client,
                    req_id,
                    fn_hash,
                    fn_code,
                    opts,
                    tasks,
                };
                self.on_submit(submit, now, out);
            }
            Event::Cancel {
                client,
                package,
                indices,
            } => self.on_cancel(client, package, &indices, out),
            Event::Status {
                client,
                req_id,
                package,
            } => self.on_status(client, req_id, package, out),
            Event::WorkerJoined { worker, slots } => self.on_worker_joined(worker, slots),
            Event::Credit { worker, credits } => self.on_credit(worker, credits, now, out),
            Event::Results { worker, results } => self.on_results(worker, results, now, out),
            Event::Returned { worker, tasks } => self.on_returned(worker, &tasks, now, out),
            Event::Drain { worker } => self.on_drain(worker),
            Event::WorkerLost { worker } => self.on_worker_lost(worker, now, out),
        }
    }

    /// Current gauges and counters.
    pub fn stats(&self) -> CoreStats {
        CoreStats {
            tasks: self.tasks.len(),
            packages: self.packages.len(),
            queued: self.queue.len(),
            running: self.running,
            cancelling: self.cancelling,
            workers: self.workers.len(),
            clients: self.clients.len(),
            functions: self.functions.len(),
            delivered: self.delivered,
            stale_results: self.stale_results,
        }
    }

    /// The code stored for `hash`, if a live package uses it.
    pub fn function_code(&self, hash: &FnHash) -> Option<&Bytes> {
        self.functions.code(hash)
    }

    /// Connected workers.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// One worker's gauges, or `None` if it is not connected.
    pub fn worker_stats(&self, worker: WorkerId) -> Option<WorkerStats> {
        self.workers.get(&worker).map(|w| WorkerStats {
            slots: w.slots,
            credits: w.credits,
            in_flight: w.in_flight.len(),
            draining: w.draining,
        })
    }

    /// Takes a `Running` or `Cancelled` task out of its worker's in-flight set and requeues it at
    /// the front of its priority, or frees it if it was cancelled. The caller has checked that
    /// the task exists and is held; the worker may already be removed (worker lost).
    fn requeue_front(&mut self, id: TaskId) {
        let task = self.tasks.get_mut(id.0).expect("requeue of a freed task");
        if let Some(w) = task.holder().and_then(|w| self.workers.get_mut(&w)) {
            w.in_flight.remove(&id);
        }
        match task.state {
            TaskState::Running { .. } => {
                task.state = TaskState::Queued;
                let package = self
                    .packages
                    .get_mut(task.package.0)
                    .expect("running task without package");
                package.counts.running -= 1;
                package.counts.queued += 1;
                self.queue.push_front(package.opts.priority, id);
                self.running -= 1;
            }
            TaskState::Cancelled { .. } => {
                self.tasks.remove(id.0);
                self.cancelling -= 1;
            }
            TaskState::Queued => panic!("requeue of {id}, which is already queued"),
        }
    }

    /// Frees `package` if none of its tasks is queued or running, releasing its function.
    fn free_package_if_finished(&mut self, package: PackageId) {
        if !self
            .packages
            .get(package.0)
            .is_some_and(Package::is_finished)
        {
            return;
        }
        let p = self.packages.remove(package.0).expect("checked above");
        if let Some(client) = self.clients.get_mut(&p.client) {
            client.packages.remove(&package);
        }
        self.functions.release(&p.fn_hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::PackageOpts;

    fn submit(core: &mut Core, n: usize) -> PackageId {
        let mut out = Vec::new();
        let tasks = vec![Bytes::from_static(b"x"); n];
        let event = Event::Submit {
            client: ClientId(1),
            req_id: 1,
            fn_hash: FnHash([0; 32]),
            fn_code: Bytes::from_static(b"f"),
            opts: PackageOpts::default(),
            tasks,
        };
        core.handle(event, Instant(0), &mut out);
        match out[0] {
            Action::Accepted { package, .. } => package,
            ref other => panic!("not accepted: {other:?}"),
        }
    }

    #[test]
    fn cancelled_queue_entries_are_purged_once_they_outnumber_live_ones() {
        let mut core = Core::default();
        let keep = submit(&mut core, 10);
        for _ in 0..30 {
            let package = submit(&mut core, 100);
            let cancel = Event::Cancel {
                client: ClientId(1),
                package,
                indices: vec![],
            };
            core.handle(cancel, Instant(0), &mut Vec::new());
            assert!(core.queue.tombstones() <= core.queue.len() + 1024 + 100);
        }
        core.check_invariants();
        assert!(
            core.queue.tombstones() < 1100,
            "{} tombstones",
            core.queue.tombstones()
        );
        assert_eq!(core.queue.len(), 10);
        assert!(core.packages.get(keep.0).is_some());
    }
}
