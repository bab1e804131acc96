//! The [`TestEnv`] itself: the core, its synthetic clock, the peers that join and leave, and
//! [`TestEnv::step`], the one way every event goes in (invariants checked after each).

use std::collections::HashMap;

use bytes::Bytes;
use rtpool_core::{
    Action, ClientId, Core, CoreConfig, Event, Instant, LossCause, PackageId, ServiceDecl, TaskId,
    UserId, WorkerId, WorkerKey,
};

/// A core under test.
pub struct TestEnv {
    pub core: Core,
    pub now: Instant,
    pub(super) next_worker: u64,
    pub(super) next_client: u64,
    pub(super) next_req: u64,
    pub(super) next_package: u64,
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

    /// The timer fires at the current time.
    pub fn tick(&mut self) -> Vec<Action> {
        self.step(Event::Tick)
    }

    /// The task about to report `exec_us` ran that long: the clock moves on by it (at most
    /// a minute, so a test of absurd reports does not move the clock past every timer), as
    /// the master bounds a reported time by what it saw (`REPORT_MARGIN_US`).
    pub fn ran_for(&mut self, exec_us: u64) {
        self.now = Instant(self.now.0 + exec_us.min(60_000_000) * 1_000);
    }

    /// Moves the clock forward by `ms`.
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
            .step(Event::WorkerJoined {
                labels: Default::default(),
                resources: Default::default(),
                worker,
                slots,
                key
            })
            .is_empty());
        worker
    }

    /// A new worker with `slots` slots, `resources` and `labels`, and no credits.
    pub fn new_worker_with(
        &mut self,
        slots: u32,
        resources: &[(&str, u64)],
        labels: &[(&str, &str)],
    ) -> WorkerId {
        let worker = WorkerId(self.next_worker);
        self.next_worker += 1;
        let resources =
            rtpool_core::Resources::new(resources.iter().map(|(n, a)| ((*n).to_owned(), *a)));
        let labels = rtpool_core::Labels::new(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        self.step(Event::WorkerJoined {
            worker,
            slots,
            key: WorkerKey(worker.0),
            resources: resources.unwrap(),
            labels: labels.unwrap(),
        });
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

    /// The worker starts draining.
    pub fn drain(&mut self, worker: WorkerId) -> Vec<Action> {
        self.step(Event::Drain { worker })
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
