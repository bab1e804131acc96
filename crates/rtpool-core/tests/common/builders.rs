//! The setups scenario tests share, one call each: workers that take their tasks at once,
//! servers of named functions, the clock moved on with the timers fired, a worker's report
//! built by hand.

use bytes::Bytes;
use rtpool_core::{Action, ClientId, Event, PackageId, TaskId, TaskStatus, WorkerId};

use super::{tasks_of, TestEnv};

impl TestEnv {
    /// A scenario's usual start on this core: a client of user 1 submits one package of `n`
    /// tasks (function 0, priority 0): `(env, client, package)`.
    pub fn with_package(mut self, n: usize) -> (Self, ClientId, PackageId) {
        let client = self.new_client();
        let (package, _) = self.submit(client, n);
        (self, client, package)
    }

    /// A new one-slot worker granting one credit, and the one task it got.
    ///
    /// # Panics
    ///
    /// If it got none.
    pub fn new_worker_running(&mut self) -> (WorkerId, TaskId) {
        let (worker, tasks) = self.new_worker_taking(1);
        assert_eq!(tasks.len(), 1, "{worker} got no task");
        (worker, tasks[0])
    }

    /// The worker grants `credits` credits: the tasks assigned to it by that step.
    pub fn take(&mut self, worker: WorkerId, credits: u32) -> Vec<TaskId> {
        tasks_of(&self.credit(worker, credits), worker)
    }

    /// A new worker with `slots` slots that grants as many credits: it and the tasks it got.
    pub fn new_worker_taking(&mut self, slots: u32) -> (WorkerId, Vec<TaskId>) {
        let worker = self.new_worker(slots);
        (worker, self.take(worker, slots))
    }

    /// `n` new workers of `slots` slots each granting as many credits, one after another: each
    /// with the tasks it got.
    pub fn new_workers_taking(&mut self, n: usize, slots: u32) -> Vec<(WorkerId, Vec<TaskId>)> {
        (0..n).map(|_| self.new_worker_taking(slots)).collect()
    }

    /// New workers of `(slots, credits)` each: all join first, then each grants its credits, in
    /// order. Idle: nothing is queued for them yet.
    ///
    /// # Panics
    ///
    /// If a credit is answered with any action (something was queued).
    pub fn new_idle_workers<const N: usize>(&mut self, specs: [(u32, u32); N]) -> [WorkerId; N] {
        let workers = specs.map(|(slots, _)| self.new_worker(slots));
        for (worker, (_, credits)) in workers.iter().zip(specs) {
            let out = self.credit(*worker, credits);
            assert!(out.is_empty(), "{worker} is not idle: {out:?}");
        }
        workers
    }

    /// A new worker with `slots` slots serving `functions` (each `name:version` as its
    /// interface), then granting `credits` credits (none if 0).
    ///
    /// # Panics
    ///
    /// If serving them produced any action (a refusal).
    pub fn new_server(&mut self, slots: u32, functions: &[(&str, &str)], credits: u32) -> WorkerId {
        let worker = self.new_worker(slots);
        let out = self.serve(worker, functions);
        assert!(out.is_empty(), "serving {functions:?}: {out:?}");
        if credits > 0 {
            self.credit(worker, credits);
        }
        worker
    }

    /// The clock moves on by `ms`, then the timer fires.
    pub fn tick_after(&mut self, ms: u64) -> Vec<Action> {
        self.advance(ms);
        self.tick()
    }

    /// One credit for `worker`, then, if it got nothing, a tick at the same instant (a hedge
    /// armed for "now" fires on the next tick): the actions of whichever assigned something.
    pub fn credit_then_tick(&mut self, worker: WorkerId) -> Vec<Action> {
        let out = self.credit(worker, 1);
        if tasks_of(&out, worker).is_empty() {
            self.tick()
        } else {
            out
        }
    }

    /// The worker reports `(task, attempt)` with `status` and `data` (worker timings as in
    /// [`TestEnv::outcome`]): for reports the current assignment does not tell, such as a
    /// replaced process's report of its predecessor's crash.
    pub fn report(
        &mut self,
        worker: WorkerId,
        task: TaskId,
        attempt: u32,
        status: TaskStatus,
        data: &'static [u8],
    ) -> Vec<Action> {
        let mut outcome = self.outcome(task, attempt);
        outcome.status = status;
        outcome.data = Bytes::from_static(data);
        self.step(Event::Results {
            worker,
            results: vec![outcome],
        })
    }
}
