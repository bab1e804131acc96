//! Actions to frames: the writer queue each of the core's orders goes to, and the message it
//! becomes there.

use bytes::Bytes;
use rtpool_core::{Action, TaskOutcome};
use rtpool_proto::{Assignment, CallAssignment, Msg, TaskResult};
use tracing::{info, warn};

use super::Scheduler;
use crate::outbound::Out;

impl Scheduler {
    /// Closes every connection with a fatal `ERROR code` and `message`, and forgets them
    /// (shutdown, or fenced under `--ha`); returns `false`: the scheduler stops.
    pub(super) fn close_all(&mut self, code: &str, message: String) -> bool {
        for tx in self.routes.values() {
            let _ = tx.send(Out::SendAndClose(Msg::Error {
                code: code.into(),
                message: message.clone(),
                reference: 0,
            }));
        }
        self.routes.clear();
        false
    }

    pub(super) fn reply(&self, session: u64, msg: Msg, close: bool) {
        if let Some(tx) = self.routes.get(&session) {
            let _ = tx.send(if close {
                Out::SendAndClose(msg)
            } else {
                Out::Send(msg)
            });
        }
    }

    pub(super) fn send(&self, session: u64, msg: Msg) {
        // A missing route means the peer already left; its loss event is on its way. A refused
        // send (a slow consumer) closes that connection, whose loss event follows too.
        if let Some(tx) = self.routes.get(&session) {
            tx.send(Out::Send(msg));
        }
    }

    /// The worker of `session` holds a task from now: its lease runs (`connection::reader`).
    fn note_assigned(&self, session: u64) {
        if let Some(tx) = self.routes.get(&session) {
            tx.liveness().assigned(tokio::time::Instant::now());
        }
    }

    /// After an event of `worker` that may have taken its last task (a result, a return): tell
    /// its reader when it holds none, so that its silence is judged by the idle limit.
    pub(super) fn note_released(&self, worker: rtpool_core::WorkerId) {
        let Some(tx) = self.routes.get(&worker.0) else {
            return;
        };
        let live = tx.liveness();
        if live.holds()
            && self
                .core
                .worker_stats(worker)
                .is_none_or(|s| s.in_flight == 0)
        {
            live.released();
        }
    }

    pub(super) fn route(&mut self, action: Action) {
        match action {
            Action::AssignCalls { worker, calls } => {
                let calls = calls
                    .into_iter()
                    .map(|c| CallAssignment {
                        task: c.task.0,
                        attempt: c.attempt,
                        name: c.name,
                        version: c.version,
                        args: c.args,
                        inputs: c.inputs,
                        timeout_ms: c.timeout_ms,
                        keep: c.keep,
                        res: c.res,
                    })
                    .collect();
                self.note_assigned(worker.0);
                self.send(worker.0, Msg::AssignCalls { calls });
            }
            Action::FunctionsReply {
                client,
                req_id,
                functions,
            } => {
                self.send(client.0, Msg::FunctionsReply { req_id, functions });
            }
            Action::ServeRefused {
                worker,
                name,
                version,
            } => {
                warn!(
                    session = worker.0,
                    %name,
                    %version,
                    "SERVE refused: another worker serves it with a different interface"
                );
                self.send(worker.0, serve_conflict(&name, &version));
            }
            Action::Assign { worker, tasks } => {
                let tasks = tasks
                    .into_iter()
                    .map(|t| Assignment {
                        res: t.res,
                        task: t.task.0,
                        attempt: t.attempt,
                        fn_hash: Bytes::copy_from_slice(&t.fn_hash.0),
                        fn_code: t.fn_code,
                        args: t.args,
                        timeout_ms: t.timeout_ms,
                        inputs: t.inputs,
                    })
                    .collect();
                self.note_assigned(worker.0);
                self.send(worker.0, Msg::Assign { tasks });
            }
            Action::Accepted {
                client,
                req_id,
                package,
            } => {
                // A package queued for a worker that can serve it (option unschedulable =
                // "wait") is told so first; an overload warning joins it.
                let notice = match (
                    self.core.unschedulable_notice(package),
                    self.overload_notice(package),
                ) {
                    (Some(a), Some(b)) => Some(format!("{a}; also, {b}")),
                    (a, b) => a.or(b),
                };
                self.send(
                    client.0,
                    Msg::Accepted {
                        req_id,
                        package: package.0,
                        notice,
                    },
                );
            }
            Action::Rejected {
                client,
                req_id,
                reason,
            } => {
                let code = crate::status::recorder::refusal_code(&reason);
                let msg = Msg::Error {
                    code: code.into(),
                    message: reason.to_string(),
                    reference: req_id,
                };
                self.send(client.0, msg);
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
                let results = results.into_iter().map(to_wire_result).collect();
                self.send(
                    client.0,
                    Msg::Results {
                        package: package.0,
                        results,
                    },
                );
            }
            Action::SendResults { client: None, .. } | Action::Delivered { .. } => {}
            Action::PackageFreed {
                package, expired, ..
            } => {
                if expired {
                    info!(%package, "no client attached within the result TTL: dropped");
                }
            }
            Action::Overreported {
                worker,
                task,
                reported_us,
                allowed_us,
            } => {
                // Once per worker connection (the core sends it once): a hostile or broken
                // worker cannot flood the log.
                warn!(
                    session = worker.0,
                    %task,
                    reported_us,
                    allowed_us,
                    "worker reported a task time longer than the master saw it run: clamped to \
                     the assignment-to-result time (logged once per connection)"
                );
            }
            Action::Abort { worker, tasks } => {
                let tasks = tasks.into_iter().map(|(t, a)| (t.0, a)).collect();
                self.send(worker.0, Msg::Abort { tasks });
            }
            Action::DropKept { worker, keys } => self.send(worker.0, Msg::Drop { keys }),
            Action::StatusReply {
                client,
                req_id,
                package,
                counts,
            } => {
                self.send(
                    client.0,
                    Msg::StatusReply {
                        req_id,
                        package: package.0,
                        counts,
                        workers: self.core.workers_for(package) as u32,
                    },
                );
            }
            Action::UnackedLimit {
                client,
                results,
                bytes,
                max_results,
                max_bytes,
            } => {
                warn!(
                    session = client.0,
                    results, bytes, "client holds too many unacknowledged results: closing"
                );
                self.reply(
                    client.0,
                    unacked_limit(results, bytes, max_results, max_bytes),
                    true,
                );
            }
            Action::UnknownPackage { client, package } => {
                self.send(
                    client.0,
                    Msg::Error {
                        code: "unknown_package".into(),
                        message: format!(
                            "{package} is not one of this user's live packages (finished \
                             packages are forgotten once their results are acknowledged, \
                             detached ones after the result TTL)"
                        ),
                        reference: package.0,
                    },
                );
            }
        }
    }
}

/// The fatal `unacked_limit` error for a client past the bound on unacknowledged results.
fn unacked_limit(results: u64, bytes: u64, max_results: u64, max_bytes: u64) -> Msg {
    let limit = |n: u64| {
        if n == 0 {
            "no limit".to_owned()
        } else {
            n.to_string()
        }
    };
    Msg::Error {
        code: "unacked_limit".into(),
        message: format!(
            "this connection holds {results} results ({bytes} bytes) sent and not acknowledged, \
             past the master's limit ({} results, {} bytes: --max-unacked-results, \
             --max-unacked-mb): closing; its packages keep their results for the result TTL, \
             so reconnect, ATTACH and ACK what you read",
            limit(max_results),
            limit(max_bytes)
        ),
        reference: 0,
    }
}

/// The non-fatal `serve_conflict` error for a worker's refused `SERVE` entry.
fn serve_conflict(name: &str, version: &str) -> Msg {
    Msg::Error {
        code: "serve_conflict".into(),
        message: format!(
            "another worker serves {name} version {version} with a different interface; this \
             worker's {name} is not served"
        ),
        reference: 0,
    }
}

fn to_wire_result(o: TaskOutcome) -> TaskResult {
    TaskResult {
        index: o.index,
        status: o.status as u8,
        data: o.data,
        queue_us: o.queue_us,
        worker_us: o.worker_us,
        exec_us: o.exec_us,
        wait_us: o.wait_us,
        flush_us: o.flush_us,
        late_us: o.late_us,
    }
}
