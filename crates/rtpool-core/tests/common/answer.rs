//! What workers answer in a [`TestEnv`]: results at a task's current attempt (tracked from the
//! `Assign` actions), timed or not, and tasks handed back.

use bytes::Bytes;
use rtpool_core::{Action, Event, TaskId, TaskStatus, WorkerId, WorkerOutcome};

use super::TestEnv;

impl TestEnv {
    /// The worker publishes an `Ok` result for `task` at its current attempt, measured at
    /// `exec_us`.
    pub fn complete_exec(&mut self, worker: WorkerId, task: TaskId, exec_us: u64) -> Vec<Action> {
        let mut outcome = self.outcome(task, self.attempt(task));
        outcome.exec_us = exec_us;
        self.ran_for(exec_us);
        self.step(Event::Results {
            worker,
            results: vec![outcome],
        })
    }

    /// The worker publishes a result for `task` at its current attempt with `status` and
    /// `data`, measured at `exec_us`.
    pub fn answer(
        &mut self,
        worker: WorkerId,
        task: TaskId,
        status: TaskStatus,
        data: &[u8],
        exec_us: u64,
    ) -> Vec<Action> {
        let mut outcome = self.outcome(task, self.attempt(task));
        outcome.status = status;
        outcome.data = Bytes::copy_from_slice(data);
        outcome.exec_us = exec_us;
        self.ran_for(exec_us);
        self.step(Event::Results {
            worker,
            results: vec![outcome],
        })
    }

    /// The worker publishes an `Ok` result for `task`, at its current attempt, with the task's
    /// own arguments as data.
    pub fn complete(&mut self, worker: WorkerId, task: TaskId) -> Vec<Action> {
        let attempt = self.attempt(task);
        self.result(worker, task, attempt)
    }

    /// The worker publishes an `Ok` result for `(task, attempt)`.
    pub fn result(&mut self, worker: WorkerId, task: TaskId, attempt: u32) -> Vec<Action> {
        let outcome = self.outcome(task, attempt);
        self.step(Event::Results {
            worker,
            results: vec![outcome],
        })
    }

    /// A result for `(task, attempt)`: status Ok, data = its args, worker timings of 1 ms,
    /// 0.2 ms and 0.3 ms (within [`rtpool_core::REPORT_MARGIN_US`]: no time need pass).
    pub fn outcome(&self, task: TaskId, attempt: u32) -> WorkerOutcome {
        WorkerOutcome {
            task,
            attempt,
            status: TaskStatus::Ok,
            data: self.args.get(&task).cloned().unwrap_or_default(),
            exec_us: 1_000,
            wait_us: 200,
            flush_us: 300,
        }
    }

    /// The attempt of the task's latest assignment.
    pub fn attempt(&self, task: TaskId) -> u32 {
        self.assigned
            .get(&task)
            .unwrap_or_else(|| panic!("{task} was never assigned"))
            .1
    }

    /// The index of an assigned task in its package, from its payload.
    pub fn index(&self, task: TaskId) -> u32 {
        let args = std::str::from_utf8(&self.args[&task]).unwrap();
        args.split(':').nth(1).unwrap().parse().unwrap()
    }

    /// The worker returns tasks at their current attempts.
    pub fn return_tasks(&mut self, worker: WorkerId, tasks: &[TaskId]) -> Vec<Action> {
        let tasks = tasks.iter().map(|&t| (t, self.attempt(t))).collect();
        self.step(Event::Returned { worker, tasks })
    }
}
