//! The scheduler task: sole owner of the [`Core`]. It receives events from connection tasks,
//! stamps them with the master's monotonic clock, and routes the core's actions to the writer
//! of the connection they address.

use std::collections::HashMap;
use std::time::Instant as StdInstant;

use bytes::Bytes;
use rtpool_core::{Action, Core, CoreConfig, Event, TaskOutcome};
use rtpool_proto::{Assignment, Msg, TaskResult};
use tokio::sync::{mpsc, oneshot};

use crate::connection::OutboundTx;
use crate::handle::MasterStats;

/// What a connection writer is told to do.
#[derive(Debug)]
pub enum Out {
    /// Encode and send this message.
    Send(Msg),
    /// Send this message, then close the connection.
    SendAndClose(Msg),
}

/// Messages to the scheduler task.
#[derive(Debug)]
pub enum ToScheduler {
    /// A connection authenticated; its writer listens on `tx`.
    Register {
        /// Session id.
        session: u64,
        /// The peer's outbound queue.
        tx: OutboundTx,
        /// `ClientJoined` or `WorkerJoined`.
        event: Event,
    },
    /// An event from an authenticated connection.
    Event(Event),
    /// Several events read from one buffer, handled in order.
    Events(Vec<Event>),
    /// A connection closed: `ClientLost` or `WorkerLost`.
    Closed {
        /// Session id.
        session: u64,
        /// The loss event.
        event: Event,
    },
    /// Send `msg` to a connection, in order with the answers to its earlier events (a
    /// rejected `SUBMIT` must not overtake the `ACCEPTED` of the one before); `close` closes
    /// the connection after it.
    Reply {
        /// Session id.
        session: u64,
        /// The message.
        msg: Msg,
        /// Close the connection after sending.
        close: bool,
    },
    /// Report gauges.
    Stats(oneshot::Sender<MasterStats>),
    /// Tell every peer the master is going away, then stop.
    Shutdown,
}

/// The scheduler task's state.
pub struct Scheduler {
    core: Core,
    routes: HashMap<u64, OutboundTx>,
    epoch: StdInstant,
    actions: Vec<Action>,
}

impl Scheduler {
    /// A scheduler with an empty core.
    pub fn new(config: CoreConfig) -> Self {
        Self {
            core: Core::new(config),
            routes: HashMap::new(),
            epoch: StdInstant::now(),
            actions: Vec::with_capacity(64),
        }
    }

    /// Run until every sender is dropped or [`ToScheduler::Shutdown`] arrives.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<ToScheduler>) {
        while let Some(msg) = rx.recv().await {
            if !self.on_message(msg) {
                break;
            }
        }
    }

    fn now(&self) -> rtpool_core::Instant {
        rtpool_core::Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Handle one message; false means stop.
    fn on_message(&mut self, msg: ToScheduler) -> bool {
        match msg {
            ToScheduler::Register { session, tx, event } => {
                self.routes.insert(session, tx);
                self.apply(event);
            }
            ToScheduler::Event(event) => self.apply(event),
            ToScheduler::Events(events) => events.into_iter().for_each(|e| self.apply(e)),
            ToScheduler::Closed { session, event } => {
                self.routes.remove(&session);
                self.apply(event);
            }
            ToScheduler::Reply {
                session,
                msg,
                close,
            } => {
                if let Some(tx) = self.routes.get(&session) {
                    let _ = tx.send(if close {
                        Out::SendAndClose(msg)
                    } else {
                        Out::Send(msg)
                    });
                }
            }
            ToScheduler::Stats(reply) => {
                let _ = reply.send(MasterStats {
                    core: self.core.stats(),
                    connections: self.routes.len(),
                });
            }
            ToScheduler::Shutdown => {
                for tx in self.routes.values() {
                    let _ = tx.send(Out::SendAndClose(Msg::Error {
                        code: "shutdown".into(),
                        message: "the master is shutting down; reconnect when it is back".into(),
                        reference: 0,
                    }));
                }
                self.routes.clear();
                return false;
            }
        }
        true
    }

    fn apply(&mut self, event: Event) {
        let now = self.now();
        self.core.handle(event, now, &mut self.actions);
        let mut actions = std::mem::take(&mut self.actions);
        for action in actions.drain(..) {
            self.route(action);
        }
        self.actions = actions;
    }

    fn send(&self, session: u64, msg: Msg) {
        // A missing route means the peer already left; its loss event is on its way. A refused
        // send (a slow consumer) closes that connection, whose loss event follows too.
        if let Some(tx) = self.routes.get(&session) {
            tx.send(Out::Send(msg));
        }
    }

    fn route(&mut self, action: Action) {
        match action {
            Action::Assign { worker, tasks } => {
                let tasks = tasks
                    .into_iter()
                    .map(|t| Assignment {
                        task: t.task.0,
                        attempt: t.attempt,
                        fn_hash: Bytes::copy_from_slice(&t.fn_hash.0),
                        fn_code: t.fn_code,
                        args: t.args,
                    })
                    .collect();
                self.send(worker.0, Msg::Assign { tasks });
            }
            Action::Accepted {
                client,
                req_id,
                package,
            } => {
                self.send(
                    client.0,
                    Msg::Accepted {
                        req_id,
                        package: package.0,
                    },
                );
            }
            Action::Rejected {
                client,
                req_id,
                reason,
            } => {
                self.send(client.0, rejected(req_id, reason.to_string()));
            }
            Action::SendResults {
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
                        total: counts.total,
                        queued: counts.queued,
                        running: counts.running,
                        done: counts.done,
                        cancelled: counts.cancelled,
                    },
                );
            }
            Action::UnknownPackage { client, package } => {
                self.send(
                    client.0,
                    Msg::Error {
                        code: "unknown_package".into(),
                        message: format!(
                            "{package} is not one of this client's live packages (finished \
                             packages are forgotten once their results are delivered)"
                        ),
                        reference: package.0,
                    },
                );
            }
        }
    }
}

/// The non-fatal `rejected` error for a submission.
pub fn rejected(req_id: u64, message: String) -> Msg {
    Msg::Error {
        code: "rejected".into(),
        message,
        reference: req_id,
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
    }
}
