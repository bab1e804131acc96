//! [`Calls`]: the connection task's record of every call in flight and request outstanding,
//! and what each message of the master does to it. No I/O: it takes messages and returns
//! frames to send, so the driver (`driver.rs`) stays glue.
//!
//! A group is one `CALL` (one call, or a transaction): its calls' outcome senders, its frame
//! until the master accepts it (re-sent after a reconnection), then its package id (attached
//! again after a reconnection) and the count of results to acknowledge.

use std::collections::HashMap;

use rtpool_proto::{status, FunctionInfo, Msg};
use tokio::sync::oneshot;

use crate::error::{ClientError, Result};
use crate::session::{plain, Frame};

/// What the connection task hands a call: its result data (status 0), or its error.
pub(crate) type Outcome = Result<bytes::Bytes>;

struct Group {
    names: Vec<String>,
    deps: Vec<Vec<u32>>,
    sinks: Vec<Option<oneshot::Sender<Outcome>>>,
    open: usize,
    /// The `CALL` frame until the master accepts it.
    frame: Option<Frame>,
    package: Option<u64>,
    /// Calls this client cancelled (sent again as `CANCEL` after a reconnection).
    cancelled: Vec<u32>,
    /// `TaskResult`s received since the `ACCEPTED` on this connection.
    received: u64,
    ack_due: bool,
}

enum Request {
    Call(u64),
    Attach(u64),
    Functions(String, oneshot::Sender<Result<Vec<FunctionInfo>>>),
}

/// Every call in flight and request outstanding on one client's connection.
pub(crate) struct Calls {
    address: String,
    groups: HashMap<u64, Group>,
    by_package: HashMap<u64, u64>,
    requests: HashMap<u64, Request>,
    /// Frames to send with the next acknowledgements (a `CANCEL` that waited for its package
    /// id).
    outbox: Vec<Frame>,
}

impl Calls {
    pub(crate) fn new(address: String) -> Calls {
        Calls {
            address,
            groups: HashMap::new(),
            by_package: HashMap::new(),
            requests: HashMap::new(),
            outbox: Vec::new(),
        }
    }

    /// No call pending and no request outstanding.
    pub(crate) fn is_idle(&self) -> bool {
        self.groups.is_empty() && self.requests.is_empty()
    }

    pub(crate) fn add(
        &mut self,
        group: u64,
        req_id: u64,
        frame: Frame,
        names: Vec<String>,
        deps: Vec<Vec<u32>>,
        sinks: Vec<oneshot::Sender<Outcome>>,
    ) {
        let open = sinks.len();
        self.groups.insert(
            group,
            Group {
                names,
                deps,
                sinks: sinks.into_iter().map(Some).collect(),
                open,
                frame: Some(frame),
                package: None,
                cancelled: Vec::new(),
                received: 0,
                ack_due: false,
            },
        );
        self.requests.insert(req_id, Request::Call(group));
    }

    pub(crate) fn add_functions(
        &mut self,
        req_id: u64,
        name: String,
        reply: oneshot::Sender<Result<Vec<FunctionInfo>>>,
    ) {
        self.requests
            .insert(req_id, Request::Functions(name, reply));
    }

    /// The frames that pick up on a new connection: `ATTACH` (and `CANCEL`) for every
    /// accepted package, then every `CALL` not yet accepted and `FUNCTIONS` not answered.
    pub(crate) fn resume(
        &mut self,
        address: &str,
        _restarted: bool,
        mut next_id: impl FnMut() -> u64,
    ) -> Vec<Frame> {
        address.clone_into(&mut self.address);
        let mut frames = Vec::new();
        let mut attach = Vec::new();
        for (&gid, g) in &mut self.groups {
            g.received = 0;
            g.ack_due = false;
            if let Some(package) = g.package {
                let req_id = next_id();
                attach.push((req_id, gid));
                frames.push(plain(&Msg::Attach { req_id, package }));
                if !g.cancelled.is_empty() {
                    frames.push(plain(&Msg::Cancel {
                        package,
                        indices: g.cancelled.clone(),
                    }));
                }
            }
        }
        for (req_id, gid) in attach {
            self.requests.insert(req_id, Request::Attach(gid));
        }
        let mut pending: Vec<(&u64, &Request)> = self.requests.iter().collect();
        pending.sort_by_key(|(id, _)| **id);
        for (&req_id, r) in pending {
            match r {
                Request::Call(gid) => {
                    if let Some(f) = self.groups.get(gid).and_then(|g| g.frame.clone()) {
                        frames.push(f);
                    }
                }
                Request::Functions(name, _) => frames.push(plain(&Msg::Functions {
                    req_id,
                    name: name.clone(),
                })),
                Request::Attach(_) => {}
            }
        }
        frames
    }

    /// Applies one message; `Some(reason)` for a fatal `ERROR` (the session ends).
    pub(crate) fn on_message(&mut self, msg: Msg) -> Option<String> {
        match msg {
            Msg::Accepted {
                req_id, package, ..
            } => self.on_accepted(req_id, package),
            Msg::Results { package, results } => {
                let g = self
                    .by_package
                    .get(&package)
                    .and_then(|gid| self.groups.get_mut(gid))?;
                for r in results {
                    g.received += 1;
                    g.ack_due = true;
                    let i = r.index as usize;
                    let Some(sink) = g.sinks.get_mut(i).and_then(Option::take) else {
                        continue;
                    };
                    g.open -= 1;
                    let outcome = if r.status == status::OK {
                        Ok(r.data)
                    } else {
                        Err(crate::decode::error_of_status(
                            &g.names[i],
                            r.status,
                            &r.data,
                        ))
                    };
                    let _ = sink.send(outcome);
                }
            }
            Msg::FunctionsReply { req_id, functions } => {
                if let Some(Request::Functions(_, reply)) = self.requests.remove(&req_id) {
                    let _ = reply.send(Ok(functions));
                }
            }
            Msg::Error {
                code,
                message,
                reference,
            } => return self.on_error(&code, message, reference),
            _ => {} // HEARTBEAT, and replies to requests this client does not make
        }
        None
    }

    fn on_accepted(&mut self, req_id: u64, package: u64) {
        let gid = match self.requests.remove(&req_id) {
            Some(Request::Call(gid) | Request::Attach(gid)) => gid,
            Some(other) => {
                self.requests.insert(req_id, other);
                return;
            }
            None => return,
        };
        if let Some(g) = self.groups.get_mut(&gid) {
            g.frame = None;
            g.package = Some(package);
            g.received = 0;
            if !g.cancelled.is_empty() {
                self.outbox.push(plain(&Msg::Cancel {
                    package,
                    indices: g.cancelled.clone(),
                }));
            }
            self.by_package.insert(package, gid);
        }
    }

    fn on_error(&mut self, code: &str, message: String, reference: u64) -> Option<String> {
        match code {
            "unknown_function" | "rejected" | "quota" | "queue_limit" | "admission"
            | "unknown_dependency" | "unschedulable" => {
                let Some(Request::Call(gid)) = self.requests.remove(&reference) else {
                    return None;
                };
                let g = self.groups.remove(&gid)?;
                let function = g.names.join(", ");
                let e = if code == "unknown_function" {
                    ClientError::UnknownFunction {
                        function,
                        served: message,
                    }
                } else {
                    ClientError::Rejected {
                        address: self.address.clone(),
                        code: code.to_owned(),
                        message,
                    }
                };
                fail(g, &e);
            }
            "unknown_package" => {
                let &gid = self.by_package.get(&reference)?;
                let attaching = self.requests.iter().find_map(|(id, r)| match r {
                    Request::Attach(g) if *g == gid => Some(*id),
                    _ => None,
                });
                // Otherwise a CANCEL or ACK raced with the package's last results.
                if let Some(req_id) = attaching {
                    self.requests.remove(&req_id);
                    self.by_package.remove(&reference);
                    if let Some(g) = self.groups.remove(&gid) {
                        let e = ClientError::ResultsLost {
                            address: self.address.clone(),
                            function: g.names.join(", "),
                            message,
                        };
                        fail(g, &e);
                    }
                }
            }
            "auth" => {
                let e = ClientError::Auth {
                    address: self.address.clone(),
                    message: message.clone(),
                };
                self.fail_all(&e);
                return Some(format!("auth: {message}"));
            }
            _ => {
                return Some(format!(
                    "the master closed the connection ({code}: {message})"
                ))
            }
        }
        None
    }

    /// `ACK` frames for the packages that got results since the last call, and drops the
    /// groups whose every call is resolved.
    pub(crate) fn take_acks(&mut self) -> Vec<Frame> {
        let mut frames = std::mem::take(&mut self.outbox);
        let mut finished = Vec::new();
        for (&gid, g) in &mut self.groups {
            if let (true, Some(package)) = (g.ack_due, g.package) {
                frames.push(plain(&Msg::Ack {
                    package,
                    count: g.received,
                }));
                g.ack_due = false;
            }
            if g.open == 0 && g.package.is_some() {
                finished.push(gid);
            }
        }
        for gid in finished {
            if let Some(package) = self.groups.remove(&gid).and_then(|g| g.package) {
                self.by_package.remove(&package);
            }
        }
        frames
    }

    /// Cancels call `index` of `group` and the calls that depend on it, transitively: their
    /// handles resolve to [`ClientError::Cancelled`]; the master sends no result for them.
    pub(crate) fn cancel(&mut self, group: u64, index: u32) -> Vec<Frame> {
        let Some(g) = self.groups.get_mut(&group) else {
            return Vec::new();
        };
        if g.sinks.get(index as usize).is_none_or(Option::is_none) {
            return Vec::new(); // done already
        }
        let mut gone = vec![index];
        for j in index + 1..g.sinks.len() as u32 {
            if g.deps[j as usize].iter().any(|d| gone.contains(d)) {
                gone.push(j);
            }
        }
        let mut indices = Vec::new();
        for &i in &gone {
            if let Some(sink) = g.sinks[i as usize].take() {
                g.open -= 1;
                let _ = sink.send(Err(ClientError::Cancelled {
                    function: g.names[i as usize].clone(),
                }));
                indices.push(i);
            }
        }
        g.cancelled.extend(&indices);
        match g.package {
            Some(package) => {
                let frames = vec![plain(&Msg::Cancel { package, indices })];
                let _ = self.take_acks(); // a group now resolved is dropped
                frames
            }
            None => Vec::new(), // sent with its CANCEL after the ACCEPTED (see resume/on_accepted)
        }
    }

    /// Fails every pending call and request with `e` (the connection is gone for good).
    pub(crate) fn fail_all(&mut self, e: &ClientError) {
        for (_, g) in self.groups.drain() {
            fail(g, e);
        }
        self.by_package.clear();
        for (_, r) in self.requests.drain() {
            if let Request::Functions(_, reply) = r {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

fn fail(g: Group, e: &ClientError) {
    for sink in g.sinks.into_iter().flatten() {
        let _ = sink.send(Err(e.clone()));
    }
}
