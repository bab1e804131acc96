//! The connection task: one tokio task owns the session to the master and every call in
//! flight. Callers talk to it through a [`Link`] (commands over a channel); it turns
//! `ACCEPTED`, `RESULTS` and `ERROR` into call outcomes, acknowledges results, heartbeats an
//! idle link, and after a lost connection reconnects, `ATTACH`es the accepted packages and
//! re-sends the `CALL`s not yet accepted (their idempotency key makes a re-sent one no second
//! package), as the Python client does. The bookkeeping of calls is `calls.rs`'s.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rtpool_proto::{encode_segmented, Call, FunctionInfo, Msg, PackageOpts};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::calls::{Calls, Outcome};
use crate::config::Config;
use crate::error::{ClientError, Result};
use crate::masters::Masters;
use crate::session::{connect_any, pause, plain, Frame, Reader, Session};

/// What callers ask of the connection task.
pub(crate) enum Command {
    /// Send a `CALL` (already encoded) and resolve its calls' outcomes.
    Call {
        group: u64,
        req_id: u64,
        frame: Frame,
        names: Vec<String>,
        deps: Vec<Vec<u32>>,
        sinks: Vec<oneshot::Sender<Outcome>>,
    },
    /// Ask for the registry of served functions (`name` empty: all).
    Functions {
        name: String,
        reply: oneshot::Sender<Result<Vec<FunctionInfo>>>,
    },
    /// Cancel call `index` of `group` (and its dependents).
    Cancel { group: u64, index: u32 },
    /// Close once no call is pending.
    Close { done: oneshot::Sender<()> },
}

/// What a caller shares with the connection task.
struct Shared {
    max_frame: AtomicUsize,
    address: Mutex<String>,
    next_id: AtomicU64,
}

/// A handle on the connection task; cheap to clone.
#[derive(Clone)]
pub(crate) struct Link {
    tx: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
}

/// A submitted `CALL`: its group id and one outcome receiver per call.
pub(crate) struct Submitted {
    pub group: u64,
    pub receivers: Vec<oneshot::Receiver<Outcome>>,
}

impl Link {
    /// Sends a command; nothing happens if the task is gone (the caller's receiver then
    /// reports [`ClientError::Closed`]).
    pub(crate) fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd);
    }

    pub(crate) fn address(&self) -> String {
        self.shared.address.lock().expect("address lock").clone()
    }

    pub(crate) fn max_frame_bytes(&self) -> usize {
        self.shared.max_frame.load(Ordering::Relaxed)
    }

    fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Encodes a `CALL` of `calls` here (on the caller's task), checks it against the
    /// master's frame limit and hands it to the connection task.
    ///
    /// # Errors
    ///
    /// [`ClientError::TooLarge`] when the frame is above the limit; nothing is sent.
    pub(crate) fn submit(&self, calls: Vec<Call>, opts: PackageOpts) -> Result<Submitted> {
        let names = calls.iter().map(|c| c.name.clone()).collect();
        let deps = calls.iter().map(|c| c.deps.clone()).collect();
        let n = calls.len();
        let req_id = self.next_id();
        let msg = Msg::Call {
            req_id,
            opts,
            calls,
        };
        let mut head = BytesMut::new();
        let mut segments = Vec::new();
        encode_segmented(&msg, &mut head, &mut segments);
        let size = head.len() - 4 + segments.iter().map(|s| s.len()).sum::<usize>();
        let limit = self.max_frame_bytes();
        if size > limit {
            return Err(ClientError::TooLarge {
                size_bytes: size,
                limit_bytes: limit,
            });
        }
        let (sinks, receivers) = (0..n).map(|_| oneshot::channel()).unzip();
        let group = self.next_id();
        self.send(Command::Call {
            group,
            req_id,
            frame: (head.freeze(), segments),
            names,
            deps,
            sinks,
        });
        Ok(Submitted { group, receivers })
    }
}

/// The first session. With several addresses a pass that found no leader (refused, silent,
/// standbys: a failover under way) is tried again as a reconnection would be, within the
/// reconnect timeout; with one address it fails at once (a master not running, a typo).
async fn first_session(
    config: &Config,
    masters: &mut Masters,
    token: &str,
) -> std::result::Result<Session, ClientError> {
    let until = Instant::now() + config.reconnect_timeout;
    let mut attempt = 0;
    loop {
        match connect_any(config, masters, token).await {
            Err(ClientError::Unreachable { .. })
                if config.addresses().len() > 1 && Instant::now() < until =>
            {
                let left = until.saturating_duration_since(Instant::now());
                tokio::time::sleep(pause(masters, attempt).min(left)).await;
                if !masters.standby_answered {
                    attempt += 1;
                }
            }
            r => return r,
        }
    }
}

/// Connects (the first session synchronously, so a bad token or address fails here) and
/// spawns the connection task.
pub(crate) async fn start(config: Config) -> Result<Link> {
    let token = config.resolve_token()?;
    let mut masters = Masters::new(config.addresses());
    let session = first_session(&config, &mut masters, &token).await?;
    let shared = Arc::new(Shared {
        max_frame: AtomicUsize::new(session.welcome.max_frame_bytes),
        address: Mutex::new(session.address.clone()),
        next_id: AtomicU64::new(1),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let link = Link {
        tx,
        shared: shared.clone(),
    };
    let driver = Driver {
        config,
        masters,
        token,
        shared,
        rx,
        calls: Calls::new(session.address.clone()),
        instance: session.welcome.instance,
        closing: None,
    };
    tokio::spawn(driver.run(session));
    Ok(link)
}

struct Driver {
    config: Config,
    /// Where to dial next (the last good address, a leader a `not_leader` named).
    masters: Masters,
    token: String,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Command>,
    calls: Calls,
    instance: u64,
    closing: Option<oneshot::Sender<()>>,
}

impl Driver {
    async fn run(mut self, first: Session) {
        let mut session = Some(first);
        loop {
            let Some(s) = session.take() else {
                // Disconnected for good: wait for work, then try again.
                match self.rx.recv().await {
                    None => return,
                    Some(cmd) => {
                        session = self.redial_for(cmd).await;
                        continue;
                    }
                }
            };
            let reason = match self.serve(s).await {
                None => return, // closed
                Some(reason) => reason,
            };
            if self.closing.is_some() && self.calls.is_idle() {
                self.finish_close();
                return;
            }
            session = self.reconnect(&reason).await;
        }
    }

    /// Runs one session until it ends; `None` when the client closed.
    async fn serve(&mut self, session: Session) -> Option<String> {
        let Session {
            mut reader,
            writer,
            welcome,
            address,
        } = session;
        *self.shared.address.lock().expect("address lock") = address.clone();
        self.shared
            .max_frame
            .store(welcome.max_frame_bytes, Ordering::Relaxed);
        let restarted = welcome.instance != self.instance;
        self.instance = welcome.instance;
        let next_id = || self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let resume = self.calls.resume(&address, restarted, next_id);
        let mut sent = !resume.is_empty();
        for f in resume {
            let _ = writer.send(f);
        }
        let beat = Duration::from_millis(u64::from(welcome.heartbeat_ms.max(100)));
        let mut ticker = tokio::time::interval_at(Instant::now() + beat, beat);
        loop {
            tokio::select! {
                msg = reader.next() => {
                    let msg = match msg { Ok(m) => m, Err(reason) => return Some(reason) };
                    if let Some(fatal) = self.calls.on_message(msg) {
                        return Some(fatal);
                    }
                    let more = drain_ready(&mut reader, &mut self.calls);
                    for f in self.calls.take_acks() {
                        let _ = writer.send(f);
                        sent = true;
                    }
                    if let Some(reason) = more {
                        return Some(reason);
                    }
                }
                cmd = self.rx.recv() => {
                    let cmd = cmd?;
                    for f in self.on_command(cmd) {
                        let _ = writer.send(f);
                        sent = true;
                    }
                }
                _ = ticker.tick() => {
                    if !sent {
                        let _ = writer.send(plain(&Msg::Heartbeat));
                    }
                    sent = false;
                }
            }
            if self.closing.is_some() && self.calls.is_idle() {
                self.finish_close();
                return None;
            }
        }
    }

    fn on_command(&mut self, cmd: Command) -> Vec<Frame> {
        let next_id = || self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        match cmd {
            Command::Call {
                group,
                req_id,
                frame,
                names,
                deps,
                sinks,
            } => {
                self.calls
                    .add(group, req_id, frame.clone(), names, deps, sinks);
                vec![frame]
            }
            Command::Functions { name, reply } => {
                let req_id = next_id();
                let f = plain(&Msg::Functions {
                    req_id,
                    name: name.clone(),
                });
                self.calls.add_functions(req_id, name, reply);
                vec![f]
            }
            Command::Cancel { group, index } => self.calls.cancel(group, index),
            Command::Close { done } => {
                self.closing = Some(done);
                Vec::new()
            }
        }
    }

    fn finish_close(&mut self) {
        if let Some(done) = self.closing.take() {
            let _ = done.send(());
        }
    }

    /// Reconnects with backoff for up to the reconnect timeout; `None` (and every pending
    /// call failed) when it ran out or the master refused us.
    async fn reconnect(&mut self, reason: &str) -> Option<Session> {
        if reason.contains("not_leader") {
            self.masters.follow(reason); // deposed: dial the leader it names first
        }
        let until = Instant::now() + self.config.reconnect_timeout;
        let mut attempt = 0;
        let mut last = reason.to_owned();
        while Instant::now() < until {
            tokio::time::sleep(pause(&self.masters, attempt)).await;
            if !self.masters.standby_answered {
                attempt += 1; // doubles only while no master answers
            }
            match connect_any(&self.config, &mut self.masters, &self.token).await {
                Ok(s) => return Some(s),
                Err(e @ (ClientError::Auth { .. } | ClientError::Config(_))) => {
                    self.calls.fail_all(&e);
                    return None;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let e = ClientError::ConnectionLost {
            address: self.config.addresses().join(","),
            reason: format!(
                "{reason}; reconnecting for {:?} failed: {last}",
                self.config.reconnect_timeout
            ),
        };
        self.calls.fail_all(&e);
        None
    }

    /// Disconnected with a new command: one round of dialling; the command fails with the
    /// reason when no master answers.
    async fn redial_for(&mut self, cmd: Command) -> Option<Session> {
        match connect_any(&self.config, &mut self.masters, &self.token).await {
            Ok(s) => {
                // Queue the command's frames; `resume` sends them once the session starts.
                let _ = self.on_command(cmd);
                Some(s)
            }
            Err(e) => {
                let _ = self.on_command(cmd);
                self.calls.fail_all(&e);
                if self.closing.is_some() {
                    self.finish_close();
                }
                None
            }
        }
    }
}

/// Handles every message already buffered without waiting (so one `ACK` covers them);
/// `Some(reason)` when the session must end.
fn drain_ready(reader: &mut Reader, calls: &mut Calls) -> Option<String> {
    while let Some(msg) = reader.try_next() {
        match msg {
            Ok(m) => {
                if let Some(fatal) = calls.on_message(m) {
                    return Some(fatal);
                }
            }
            Err(reason) => return Some(reason),
        }
    }
    None
}
