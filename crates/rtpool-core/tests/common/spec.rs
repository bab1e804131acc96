//! What a test submits: [`Spec`], a package of tasks built option by option
//! (`Spec::tasks(4).deadline_ms(50)`), and [`call`]/[`calls`], the calls of a transaction.

use bytes::Bytes;
use rtpool_core::{CallSpec, Labels, PackageId, Resources, Unschedulable};

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

/// Calls of `name` (newest version), one per `(args, deps)`: a transaction's graph on one line,
/// `calls("f", &[("a", &[]), ("b", &[0])])` (b takes a's result).
pub fn calls(name: &str, graph: &[(&str, &[u32])]) -> Vec<CallSpec> {
    graph
        .iter()
        .map(|(args, deps)| call(name, args, deps))
        .collect()
}

/// A package to submit.
#[derive(Debug, Clone)]
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
    /// What each task holds of its worker (`gpu=1`), the labels it needs, and whether it
    /// waits when no worker can serve it.
    pub request: (Resources, Labels, Unschedulable),
    /// The worker that keeps its input (`near`; 0: none).
    pub near: u64,
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
            request: Default::default(),
            near: 0,
        }
    }

    /// The same, with its input kept on `worker` (option `near`).
    pub fn near(self, worker: rtpool_core::WorkerId) -> Self {
        Self {
            near: worker.0,
            ..self
        }
    }

    /// The same, asking for `resources` and `labels` of its worker.
    pub fn asking(self, resources: &[(&str, u64)], labels: &[(&str, &str)]) -> Self {
        let resources = Resources::new(resources.iter().map(|(n, a)| ((*n).to_owned(), *a)));
        let labels = Labels::new(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        Self {
            request: (resources.unwrap(), labels.unwrap(), self.request.2),
            ..self
        }
    }

    /// The same, waiting when no worker can serve its request.
    pub fn waiting(mut self) -> Self {
        self.request.2 = Unschedulable::Wait;
        self
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
