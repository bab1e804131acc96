//! What clients do to a [`TestEnv`]'s core: submit packages and calls, attach, acknowledge,
//! cancel, ask for status; and the quotas an operator sets.

use bytes::Bytes;
use rtpool_core::{Action, CallSpec, ClientId, Event, MissPolicy, PackageId, PackageOpts, UserId};

use super::{fn_code, fn_hash, tasks_of, Spec, TestEnv};

impl TestEnv {
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
                resources: spec.request.0,
                labels: spec.request.1,
                unschedulable: spec.request.2,
                near: spec.near,
            },
            tasks,
        });
        (package, out)
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

    /// Acknowledges everything sent to `client` for `package` so far.
    pub fn ack_all(&mut self, client: ClientId, package: PackageId) -> Vec<Action> {
        let count = self.sent.get(&(client, package)).copied().unwrap_or(0);
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
}
