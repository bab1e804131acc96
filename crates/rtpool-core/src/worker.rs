//! [`Worker`]: one worker connection's credits, in-flight tasks and code cache.

use rtpool_proto::{Labels, Resources};

use crate::ids::{FnHash, TaskId, WorkerKey};
use crate::placement::Link;
use crate::table::{IdMap, IdSet, Set};

/// One worker.
#[derive(Debug)]
pub(crate) struct Worker {
    /// Tasks it runs at once (informational: credits are what limit assignment).
    pub(crate) slots: u32,
    /// Tasks it may still be sent. Always 0 once draining.
    pub(crate) credits: u32,
    /// Asked for no more work (graceful shutdown).
    pub(crate) draining: bool,
    /// Tasks it holds: `Running` or `Cancelled` on this worker.
    pub(crate) in_flight: IdSet<TaskId>,
    /// Hashes whose code it was sent (the protocol's per-connection code cache).
    pub(crate) fn_sent: Set<FnHash>,
    /// What it runs on, stable across reconnects: its pace is kept under this key.
    pub(crate) key: WorkerKey,
    /// Distinguishes this worker from an earlier one with the same id in the hungry ring.
    pub(crate) epoch: u64,
    /// It has an entry in the hungry ring.
    pub(crate) in_ring: bool,
    /// Slab keys of the services it serves (grid RPC).
    pub(crate) serves: Vec<u64>,
    /// What was learned of the link to it (placement).
    pub(crate) link: Link,
    /// Moving average of its execution times over each function's mean (`None`: unknown).
    pub(crate) slowness: Option<f64>,
    /// Its running tasks that got a hedge copy elsewhere, as `(task, attempt, function)`: when
    /// one answers after its package is gone (its copy lost the race), its time still teaches
    /// this worker's pace. At most [`MAX_HEDGED`], the oldest forgotten first.
    pub(crate) hedged: Vec<(TaskId, u32, FnHash)>,
    /// Records of the transaction intermediates it keeps (`core/lineage.rs`): made again
    /// elsewhere if it is lost before their dependents read them.
    pub(crate) kept_calls: Set<u64>,
    /// It reported a time longer than the master saw the task run ([`crate::Action::Overreported`]
    /// was sent once for it).
    pub(crate) overreported: bool,
    /// What it has for tasks that ask (`gpu=2`), as it announced on joining.
    pub(crate) resources: Resources,
    /// Its labels (`zone=a`).
    pub(crate) labels: Labels,
    /// How much of each of `resources` its running tasks hold, in the same order.
    pub(crate) in_use: Vec<u64>,
    /// Slab key of its kind (`kind.rs`), whose classes it can serve; `None` when it has no
    /// resources and no labels (it serves no class).
    pub(crate) kind: Option<u64>,
    /// Its index in its kind's workers.
    pub(crate) kind_pos: usize,
    /// It is offered to every class of its kind (it waits, hungry, for their next task); a
    /// placement that pops it from one clears this.
    pub(crate) offered_all: bool,
    /// Its tasks that hold resources, with their class.
    pub(crate) holding: IdMap<TaskId, u64>,
}

/// Hedged tasks a worker remembers (see [`Worker::hedged`]).
pub(crate) const MAX_HEDGED: usize = 16;

impl Worker {
    /// A new worker with no credits.
    pub(crate) fn new(slots: u32, epoch: u64, key: WorkerKey) -> Self {
        Self {
            slots,
            key,
            credits: 0,
            draining: false,
            in_flight: IdSet::default(),
            fn_sent: Set::default(),
            epoch,
            in_ring: false,
            serves: Vec::new(),
            link: Link::default(),
            slowness: None,
            hedged: Vec::new(),
            kept_calls: Set::default(),
            overreported: false,
            resources: Resources::default(),
            labels: Labels::default(),
            in_use: Vec::new(),
            kind: None,
            kind_pos: 0,
            offered_all: false,
            holding: IdMap::default(),
        }
    }

    /// Its free resources cover `request` now.
    pub(crate) fn has_free(&self, request: &Resources) -> bool {
        request.iter().all(|(name, asked)| {
            self.resource_index(name)
                .is_some_and(|i| self.total_at(i).saturating_sub(self.in_use[i]) >= asked)
        })
    }

    /// Takes (`take`) or gives back a request's amounts.
    pub(crate) fn account(&mut self, request: &Resources, take: bool) {
        for (name, amount) in request.iter() {
            if let Some(i) = self.resource_index(name) {
                self.in_use[i] = if take {
                    self.in_use[i] + amount
                } else {
                    self.in_use[i].saturating_sub(amount)
                };
            }
        }
    }

    fn resource_index(&self, name: &str) -> Option<usize> {
        self.resources.iter().position(|(n, _)| n == name)
    }

    fn total_at(&self, i: usize) -> u64 {
        self.resources.iter().nth(i).map_or(0, |(_, a)| a)
    }

    /// Remembers that `(task, attempt)`, running here, got a hedge copy elsewhere.
    pub(crate) fn note_hedged(&mut self, task: TaskId, attempt: u32, fn_hash: FnHash) {
        if self.hedged.len() >= MAX_HEDGED {
            self.hedged.remove(0);
        }
        self.hedged.push((task, attempt, fn_hash));
    }

    /// The function of a hedged `(task, attempt)` that answered, forgotten now.
    pub(crate) fn take_hedged(&mut self, task: TaskId, attempt: u32) -> Option<FnHash> {
        let i = self
            .hedged
            .iter()
            .position(|&(t, a, _)| t == task && a == attempt)?;
        Some(self.hedged.swap_remove(i).2)
    }

    /// It may be sent a task now.
    pub(crate) fn is_hungry(&self) -> bool {
        self.credits > 0 && !self.draining
    }

    /// It has no credit now but a free slot, so its next `PULL` is on its way (a worker sends
    /// its result and its `PULL` together; the master handles them as two events).
    pub(crate) fn is_about_to_pull(&self) -> bool {
        !self.draining && (self.in_flight.len() as u64) < u64::from(self.slots)
    }
}
