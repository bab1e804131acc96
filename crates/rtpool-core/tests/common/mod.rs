//! `TestEnv`: a core, a synthetic clock and builders for the scenario tests.
//!
//! Every step goes through [`TestEnv::step`], which checks the core's invariants afterwards and
//! remembers the current assignment of each task, so tests can say "complete this task" without
//! tracking attempts themselves.

// Each test binary uses a different subset of the helpers.
#![allow(dead_code)]

use std::collections::HashMap;

use bytes::Bytes;
use rtpool_core::{
    Action, AssignCall, AssignTask, CallSpec, ClientId, Core, CoreConfig, Event, FnHash, Instant,
    LossCause, MissPolicy, PackageId, PackageOpts, ServiceDecl, TaskId, TaskOutcome, TaskStatus,
    UserId, WorkerId, WorkerKey, WorkerOutcome,
};

/// The hash of test function `n`.
pub fn fn_hash(n: u8) -> FnHash {
    FnHash([n; 32])
}

/// The code of test function `n`.
pub fn fn_code(n: u8) -> Bytes {
    Bytes::from(format!("code of function {n}"))
}

/// A package to submit.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Tasks in it.
    pub tasks: usize,
    /// Its priority.
    pub priority: i32,
    /// Which test function.
    pub function: u8,
    /// Time limit per task, ms (0: none).
    pub timeout_ms: u32,
    /// Idempotency key ("": none).
    pub key: &'static str,
    /// Deadline, ms after submission (0: none).
    pub deadline_ms: u32,
    /// Drop tasks that cannot make the deadline.
    pub drop_late: bool,
    /// Admission control.
    pub admit: bool,
    /// Copies per task (0/1: one).
    pub replicas: u8,
    /// Agreeing results needed (0/1: first wins).
    pub quorum: u8,
    /// Most copies ever (0: default).
    pub max_copies: u8,
    /// Straggler hedging.
    pub hedge: bool,
    /// Attempts before a lost task fails as poison (0: the core's `max_attempts`).
    pub max_attempts: u32,
    /// A dependency held by the master: `(package, index)` of the producing task.
    pub after: Option<(PackageId, u32)>,
}

impl Spec {
    /// `tasks` tasks of function 0 at priority 0.
    pub fn tasks(tasks: usize) -> Self {
        Self {
            tasks,
            priority: 0,
            function: 0,
            timeout_ms: 0,
            key: "",
            deadline_ms: 0,
            drop_late: false,
            admit: false,
            replicas: 0,
            quorum: 0,
            max_copies: 0,
            hedge: false,
            max_attempts: 0,
            after: None,
        }
    }

    /// The same, with a deadline `ms` after submission.
    pub fn deadline_ms(self, deadline_ms: u32) -> Self {
        Self {
            deadline_ms,
            ..self
        }
    }

    /// The same, with `on_miss = drop`.
    pub fn drop_late(self) -> Self {
        Self {
            drop_late: true,
            ..self
        }
    }

    /// The same, with admission control.
    pub fn admit(self) -> Self {
        Self {
            admit: true,
            ..self
        }
    }

    /// The same, with `replicas` copies and a quorum of `quorum`.
    pub fn replicas(self, replicas: u8, quorum: u8) -> Self {
        Self {
            replicas,
            quorum,
            ..self
        }
    }

    /// The same, with at most `max_copies` copies.
    pub fn max_copies(self, max_copies: u8) -> Self {
        Self { max_copies, ..self }
    }

    /// The same, with straggler hedging.
    pub fn hedge(self) -> Self {
        Self {
            hedge: true,
            ..self
        }
    }

    /// The same, depending on task `index` of `package` (option `after`).
    pub fn after(self, package: PackageId, index: u32) -> Self {
        Self {
            after: Some((package, index)),
            ..self
        }
    }

    /// The same, with at most `max_attempts` attempts per task.
    pub fn max_attempts(self, max_attempts: u32) -> Self {
        Self {
            max_attempts,
            ..self
        }
    }

    /// The same, with an idempotency key.
    pub fn key(self, key: &'static str) -> Self {
        Self { key, ..self }
    }

    /// The same, with a time limit per task.
    pub fn timeout_ms(self, timeout_ms: u32) -> Self {
        Self { timeout_ms, ..self }
    }

    /// The same, at `priority`.
    pub fn priority(self, priority: i32) -> Self {
        Self { priority, ..self }
    }

    /// The same, with test function `function`.
    pub fn function(self, function: u8) -> Self {
        Self { function, ..self }
    }
}

/// A core under test.
pub struct TestEnv {
    pub core: Core,
    pub now: Instant,
    next_worker: u64,
    next_client: u64,
    next_req: u64,
    next_package: u64,
    /// Acknowledge every result sent to a client right away (as the SDK does), so a package
    /// is freed once its last result is out. Tests of acknowledgement turn it off.
    pub auto_ack: bool,
    /// Results sent per `(client, package)` since the client attached.
    pub sent: HashMap<(ClientId, PackageId), u64>,
    /// Current `(worker, attempt)` of every task ever assigned, from the `Assign` actions.
    pub assigned: HashMap<TaskId, (WorkerId, u32)>,
    /// Argument payload of every task ever assigned.
    pub args: HashMap<TaskId, Bytes>,
    /// Inputs of every call ever assigned.
    pub inputs: HashMap<TaskId, Vec<Bytes>>,
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    /// An empty core at time 1 s.
    pub fn new() -> Self {
        Self::with_config(CoreConfig::default())
    }

    /// An empty core with `config`.
    pub fn with_config(config: CoreConfig) -> Self {
        Self {
            core: Core::new(config),
            now: Instant(1_000_000_000),
            next_worker: 1,
            next_client: 1,
            next_req: 1,
            next_package: 1,
            auto_ack: true,
            sent: HashMap::new(),
            assigned: HashMap::new(),
            args: HashMap::new(),
            inputs: HashMap::new(),
        }
    }

    /// The worker serves `functions` as `(name, version)`, each with interface `name:version`.
    pub fn serve(&mut self, worker: WorkerId, functions: &[(&str, &str)]) -> Vec<Action> {
        let functions = functions
            .iter()
            .map(|(name, version)| ServiceDecl {
                name: (*name).to_owned(),
                version: (*version).to_owned(),
                interface: Bytes::from(format!("{name}:{version}")),
            })
            .collect();
        self.step(Event::Serve { worker, functions })
    }

    /// The client submits calls (options default).
    pub fn submit_calls(
        &mut self,
        client: ClientId,
        calls: Vec<CallSpec>,
    ) -> (PackageId, Vec<Action>) {
        self.submit_calls_with(client, PackageOpts::default(), calls)
    }

    /// The client submits calls with `opts`.
    pub fn submit_calls_with(
        &mut self,
        client: ClientId,
        opts: PackageOpts,
        calls: Vec<CallSpec>,
    ) -> (PackageId, Vec<Action>) {
        let package = PackageId(self.next_package);
        self.next_package += 1;
        let req_id = self.next_req;
        self.next_req += 1;
        let out = self.step(Event::SubmitCalls {
            client,
            req_id,
            package,
            opts,
            calls,
        });
        (package, out)
    }

    /// Teaches the core that test function `f` runs `exec_us` per task, from `n` results of
    /// a throwaway user's package on a throwaway worker.
    pub fn learn(&mut self, f: u8, exec_us: u64, n: usize) {
        let client = self.new_client_of(UserId(99));
        self.submit_spec(client, Spec::tasks(n).function(f));
        let w = self.new_worker(1);
        for _ in 0..n {
            let task = tasks_of(&self.credit(w, 1), w)[0];
            self.complete_exec(w, task, exec_us);
        }
        self.drain(w);
        self.lose_worker(w);
    }

    /// Handles one event at the current time, checks the invariants, records assignments.
    pub fn step(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        // As the master does between events: every scenario also runs over tables whose next
        // chunk is (partly) prepared, with the invariants checked.
        self.core.prepare(64);
        self.core.handle(event, self.now, &mut out);
        self.core.check_invariants();
        let mut acks = Vec::new();
        for action in &out {
            match action {
                Action::Assign { worker, tasks } => {
                    for t in tasks {
                        self.assigned.insert(t.task, (*worker, t.attempt));
                        self.args.insert(t.task, t.args.clone());
                    }
                }
                Action::AssignCalls { worker, calls } => {
                    for c in calls {
                        self.assigned.insert(c.task, (*worker, c.attempt));
                        self.args.insert(c.task, c.args.clone());
                        self.inputs.insert(c.task, c.inputs.clone());
                    }
                }
                Action::Accepted {
                    client, package, ..
                } => {
                    self.sent.insert((*client, *package), 0);
                }
                Action::SendResults {
                    client: Some(client),
                    package,
                    results,
                    ..
                }
                | Action::Resend {
                    client,
                    package,
                    results,
                } => {
                    let n = self.sent.entry((*client, *package)).or_default();
                    *n += results.len() as u64;
                    acks.push((*client, *package, *n));
                }
                _ => {}
            }
        }
        if self.auto_ack {
            for (client, package, count) in acks {
                self.core.handle(
                    Event::Ack {
                        client,
                        package,
                        count,
                    },
                    self.now,
                    &mut out,
                );
                self.core.check_invariants();
            }
        }
        out
    }

    /// Acknowledges everything sent to `client` for `package` so far.
    pub fn ack_all(&mut self, client: ClientId, package: PackageId) -> Vec<Action> {
        let count = self.sent.get(&(client, package)).copied().unwrap_or(0);
        self.step(Event::Ack {
            client,
            package,
            count,
        })
    }

    /// The timer fires at the current time.
    pub fn tick(&mut self) -> Vec<Action> {
        self.step(Event::Tick)
    }

    /// Moves the clock forward.
    /// The task about to report `exec_us` ran that long: the clock moves on by it (at most
    /// a minute, so a test of absurd reports does not move the clock past every timer), as
    /// the master bounds a reported time by what it saw (`REPORT_MARGIN_US`).
    pub fn ran_for(&mut self, exec_us: u64) {
        self.now = Instant(self.now.0 + exec_us.min(60_000_000) * 1_000);
    }

    pub fn advance(&mut self, ms: u64) {
        self.now = Instant(self.now.0 + ms * 1_000_000);
    }

    /// A new worker with `slots` slots and no credits, under a key of its own.
    pub fn new_worker(&mut self, slots: u32) -> WorkerId {
        let key = WorkerKey(self.next_worker);
        self.new_worker_keyed(slots, key)
    }

    /// A new worker connection with `slots` slots and no credits under `key`: the same key as
    /// an earlier connection is the same worker back (a replaced process, a reconnect).
    pub fn new_worker_keyed(&mut self, slots: u32, key: WorkerKey) -> WorkerId {
        let worker = WorkerId(self.next_worker);
        self.next_worker += 1;
        assert!(self
            .step(Event::WorkerJoined { worker, slots, key })
            .is_empty());
        worker
    }

    /// A new client of user 1.
    pub fn new_client(&mut self) -> ClientId {
        self.new_client_of(UserId(1))
    }

    /// A new client of `user`.
    pub fn new_client_of(&mut self, user: UserId) -> ClientId {
        let client = ClientId(self.next_client);
        self.next_client += 1;
        assert!(self.step(Event::ClientJoined { client, user }).is_empty());
        client
    }

    /// The worker grants `n` credits.
    pub fn credit(&mut self, worker: WorkerId, n: u32) -> Vec<Action> {
        self.step(Event::Credit { worker, credits: n })
    }

    /// Submits `n` tasks of function 0 at priority 0; returns the package and the actions.
    pub fn submit(&mut self, client: ClientId, n: usize) -> (PackageId, Vec<Action>) {
        self.submit_spec(client, Spec::tasks(n))
    }

    /// Submits a package; task `i`'s payload is `"<req_id>:<i>"`.
    ///
    /// # Panics
    ///
    /// If it is not accepted.
    pub fn submit_spec(&mut self, client: ClientId, spec: Spec) -> (PackageId, Vec<Action>) {
        let req_id = self.next_req;
        let (package, out) = self.submit_raw(client, spec);
        match out.first() {
            Some(&Action::Accepted {
                client: c,
                req_id: r,
                package: p,
            }) => {
                assert_eq!((c, r, p), (client, req_id, package));
                (package, out)
            }
            other => panic!("submission not accepted first: {other:?}"),
        }
    }

    /// Submits a package under the next package id, whatever the answer; returns that id (the
    /// one the core was offered) and the actions.
    pub fn submit_raw(&mut self, client: ClientId, spec: Spec) -> (PackageId, Vec<Action>) {
        let req_id = self.next_req;
        self.next_req += 1;
        let tasks = (0..spec.tasks)
            .map(|i| Bytes::from(format!("{req_id}:{i}")))
            .collect();
        let package = PackageId(self.next_package);
        self.next_package += 1;
        let out = self.step(Event::Submit {
            client,
            req_id,
            package,
            fn_hash: fn_hash(spec.function),
            fn_code: fn_code(spec.function),
            opts: PackageOpts {
                priority: spec.priority,
                timeout_ms: spec.timeout_ms,
                key: spec.key.to_string(),
                deadline_ms: spec.deadline_ms,
                on_miss: if spec.drop_late {
                    MissPolicy::Drop
                } else {
                    MissPolicy::Run
                },
                admit: spec.admit,
                replicas: spec.replicas,
                quorum: spec.quorum,
                max_copies: spec.max_copies,
                hedge: spec.hedge,
                max_attempts: spec.max_attempts,
                after: spec.after.map_or(0, |(p, _)| p.0),
                after_index: spec.after.map_or(0, |(_, i)| i),
                ..PackageOpts::default()
            },
            tasks,
        });
        (package, out)
    }

    /// The client attaches to a package.
    pub fn attach(&mut self, client: ClientId, package: PackageId) -> Vec<Action> {
        let req_id = self.next_req;
        self.next_req += 1;
        self.step(Event::Attach {
            client,
            req_id,
            package,
        })
    }

    /// The client acknowledges the first `count` results sent since it attached.
    pub fn ack(&mut self, client: ClientId, package: PackageId, count: u64) -> Vec<Action> {
        self.step(Event::Ack {
            client,
            package,
            count,
        })
    }

    /// Sets a user's remaining compute time.
    pub fn set_quota(&mut self, user: UserId, remaining_us: Option<i64>) -> Vec<Action> {
        self.step(Event::SetQuota { user, remaining_us })
    }

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

    /// The client cancels `indices` of its package (empty = all).
    pub fn cancel(&mut self, client: ClientId, package: PackageId, indices: &[u32]) -> Vec<Action> {
        self.step(Event::Cancel {
            client,
            package,
            indices: indices.to_vec(),
        })
    }

    /// The client asks for the package's counters.
    pub fn status(&mut self, client: ClientId, package: PackageId) -> Vec<Action> {
        self.step(Event::Status {
            client,
            req_id: 77,
            package,
        })
    }

    /// The worker starts draining.
    pub fn drain(&mut self, worker: WorkerId) -> Vec<Action> {
        self.step(Event::Drain { worker })
    }

    /// The worker returns tasks at their current attempts.
    pub fn return_tasks(&mut self, worker: WorkerId, tasks: &[TaskId]) -> Vec<Action> {
        let tasks = tasks.iter().map(|&t| (t, self.attempt(t))).collect();
        self.step(Event::Returned { worker, tasks })
    }

    /// The worker's connection closes.
    pub fn lose_worker(&mut self, worker: WorkerId) -> Vec<Action> {
        self.step(Event::WorkerLost {
            worker,
            cause: LossCause::Closed,
        })
    }

    /// The worker is silent past its lease: the master closes it.
    pub fn expire_lease(&mut self, worker: WorkerId) -> Vec<Action> {
        self.step(Event::WorkerLost {
            worker,
            cause: LossCause::Silent,
        })
    }

    /// The client's connection closes.
    pub fn lose_client(&mut self, client: ClientId) -> Vec<Action> {
        self.step(Event::ClientLost { client })
    }
}

/// The tasks of every `Assign`, per worker, in action order.
pub fn assignments(actions: &[Action]) -> Vec<(WorkerId, Vec<AssignTask>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Assign { worker, tasks } => Some((*worker, tasks.clone())),
            _ => None,
        })
        .collect()
}

/// The ids of the tasks assigned to `worker` by these actions.
pub fn tasks_of(actions: &[Action], worker: WorkerId) -> Vec<TaskId> {
    assignments(actions)
        .into_iter()
        .filter(|(w, _)| *w == worker)
        .flat_map(|(_, tasks)| tasks.into_iter().map(|t| t.task))
        .collect()
}

/// Every assigned task id, in action order.
pub fn all_assigned(actions: &[Action]) -> Vec<TaskId> {
    assignments(actions)
        .into_iter()
        .flat_map(|(_, ts)| ts.into_iter().map(|t| t.task))
        .collect()
}

/// The results of every `SendResults` (new results, whether a client is attached or not), as
/// `(package, outcomes)`.
pub fn results(actions: &[Action]) -> Vec<(PackageId, Vec<TaskOutcome>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendResults {
                package, results, ..
            } => Some((*package, results.clone())),
            _ => None,
        })
        .collect()
}

/// The indices of every delivered result, in order.
pub fn result_indices(actions: &[Action]) -> Vec<u32> {
    results(actions)
        .into_iter()
        .flat_map(|(_, rs)| rs.into_iter().map(|r| r.index))
        .collect()
}

/// Every `(package, expired)` freed by these actions, in order.
pub fn freed(actions: &[Action]) -> Vec<(PackageId, bool)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::PackageFreed {
                package, expired, ..
            } => Some((*package, *expired)),
            _ => None,
        })
        .collect()
}

/// Every `(worker, task, attempt)` of the `Abort` actions, in order.
pub fn aborts(actions: &[Action]) -> Vec<(WorkerId, TaskId, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Abort { worker, tasks } => Some(tasks.iter().map(|&(t, at)| (*worker, t, at))),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Every `(worker, keys)` of the `DropKept` actions, in order.
pub fn drops(actions: &[Action]) -> Vec<(WorkerId, Vec<Bytes>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::DropKept { worker, keys } => Some((*worker, keys.clone())),
            _ => None,
        })
        .collect()
}

/// The indices of every `Resend`, in order.
pub fn resent_indices(actions: &[Action]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Resend { results, .. } => Some(results.iter().map(|r| r.index)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Every result of every `SendResults`, as `(index, status, UTF-8 data)`.
pub fn outcomes(actions: &[Action]) -> Vec<(u32, TaskStatus, String)> {
    results(actions)
        .into_iter()
        .flat_map(|(_, rs)| rs)
        .map(|r| {
            (
                r.index,
                r.status,
                String::from_utf8_lossy(&r.data).into_owned(),
            )
        })
        .collect()
}

/// A call of `name` (newest version) with `args`, taking the results of `deps`.
pub fn call(name: &str, args: &str, deps: &[u32]) -> CallSpec {
    CallSpec {
        name: name.to_owned(),
        version: String::new(),
        args: Bytes::from(args.to_owned()),
        deps: deps.to_vec(),
        fetch: false,
    }
}

/// The calls assigned, per worker.
pub fn call_assignments(actions: &[Action]) -> Vec<(WorkerId, Vec<AssignCall>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::AssignCalls { worker, calls } => Some((*worker, calls.clone())),
            _ => None,
        })
        .collect()
}

/// The calls assigned to `worker`.
pub fn calls_of(actions: &[Action], worker: WorkerId) -> Vec<TaskId> {
    call_assignments(actions)
        .into_iter()
        .filter(|(w, _)| *w == worker)
        .flat_map(|(_, calls)| calls.into_iter().map(|c| c.task))
        .collect()
}
