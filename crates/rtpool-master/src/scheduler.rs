//! The scheduler task: sole owner of the [`Core`]. It receives events from connection tasks,
//! stamps them with the master's monotonic clock, and routes the core's actions to the writer
//! of the connection they address.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use rtpool_core::{
    Action, Core, CoreConfig, Event, FnHash, PackageId, PackageOpts, RejectReason, RestoredPackage,
    TaskOutcome, TaskStatus, UserId,
};
use rtpool_proto::{Assignment, Msg, TaskResult};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::auth::Authenticator;
use crate::connection::OutboundTx;
use crate::handle::{MasterStats, ReplayStats};
use crate::journal::{DoneRecord, FsyncPolicy, Journal, PackageRecord, Record, Replay};
use crate::store::UserQuota;

/// How often charged compute time is written behind to the user store, and quotas re-read.
const USAGE_FLUSH: Duration = Duration::from_secs(1);

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
        /// The authenticated user's name.
        user: String,
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
    /// Quotas re-read from the store after a usage flush.
    Quotas(Vec<UserQuota>),
    /// Tell every peer the master is going away, then stop.
    Shutdown,
}

/// The scheduler task's state.
pub struct Scheduler {
    core: Core,
    routes: HashMap<u64, OutboundTx>,
    epoch: StdInstant,
    actions: Vec<Action>,
    /// User names interned as core [`UserId`]s.
    users: HashMap<String, UserId>,
    user_names: Vec<String>,
    /// Id of the next package.
    next_package: u64,
    /// Token checks and the user store (quotas are written behind through it).
    auth: Option<Authenticator>,
    /// A usage flush is running; its answer comes back as [`ToScheduler::Quotas`].
    flushing: bool,
    core_config: CoreConfig,
    /// Users of connected clients, by session.
    client_users: HashMap<u64, UserId>,
    /// The crash-recovery journal, if any.
    journal: Option<Journal>,
    /// `fsync always`: a package is handled (and acknowledged) only once its record is durable.
    ack_after_fsync: bool,
    /// What the journal replayed at start-up, waiting to be restored.
    replay: Option<Replay>,
    replay_stats: Option<ReplayStats>,
    /// LSN of the last record appended.
    last_lsn: u64,
    /// Client events held back behind a submission whose record is not durable yet, in
    /// arrival order, with the LSN each must wait for.
    held: VecDeque<(u64, Held)>,
}

/// Something a client sent that waits for the journal (`fsync always`).
enum Held {
    Event(Event),
    Reply { session: u64, msg: Msg, close: bool },
    Closed { session: u64, event: Event },
}

impl Scheduler {
    /// A scheduler with an empty core and no user store.
    pub fn new(config: CoreConfig) -> Self {
        Self {
            core: Core::new(config.clone()),
            routes: HashMap::new(),
            epoch: StdInstant::now(),
            actions: Vec::with_capacity(64),
            users: HashMap::new(),
            user_names: Vec::new(),
            next_package: 1,
            auth: None,
            flushing: false,
            core_config: config,
            client_users: HashMap::new(),
            journal: None,
            ack_after_fsync: false,
            replay: None,
            replay_stats: None,
            last_lsn: 0,
            held: VecDeque::new(),
        }
    }

    /// Record packages, results and deliveries in `journal`, and restore what `replay` found
    /// when the scheduler starts.
    pub fn with_journal(mut self, journal: Journal, replay: Replay, policy: FsyncPolicy) -> Self {
        self.core_config.report_deliveries = true;
        self.core = Core::new(self.core_config.clone());
        self.ack_after_fsync = policy == FsyncPolicy::Always;
        self.next_package = replay.next_package.max(1);
        self.last_lsn = replay.last_lsn;
        self.replay_stats = Some(ReplayStats {
            records: replay.records,
            bytes: replay.bytes,
            elapsed_us: replay.elapsed.as_micros() as u64,
            packages: replay.packages.len(),
        });
        self.journal = Some(journal);
        self.replay = Some(replay);
        self
    }

    /// Charge compute time to users and enforce their quotas through `auth`'s store.
    pub fn with_auth(mut self, auth: Authenticator) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Run until every sender is dropped or [`ToScheduler::Shutdown`] arrives.
    pub async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<ToScheduler>,
        tx: mpsc::UnboundedSender<ToScheduler>,
    ) {
        self.restore().await;
        self.load_quotas().await;
        let mut flush = tokio::time::interval(USAGE_FLUSH);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut durable = self.journal.as_ref().map(Journal::durable);
        loop {
            let timer = self.core.next_timer().map(|at| {
                let now = self.now();
                tokio::time::Instant::now() + Duration::from_nanos(at.0.saturating_sub(now.0))
            });
            let waiting = !self.held.is_empty();
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { break };
                    if !self.on_message(msg) {
                        break;
                    }
                }
                changed = wait_durable(&mut durable), if waiting => {
                    if let Some(lsn) = changed {
                        self.release_held(lsn);
                    }
                }
                _ = sleep_until(timer), if timer.is_some() => self.apply(Event::Tick),
                _ = flush.tick() => self.flush_usage(&tx),
            }
        }
        // Whatever was charged since the last flush.
        self.flush_usage_now().await;
        if let Some(journal) = self.journal.take() {
            if let Err(e) = journal.close() {
                warn!("journal close failed: {e}");
            }
        }
    }

    /// Rebuilds the packages the journal replayed, and charges the compute time recorded
    /// after the store's watermark (so a crash never lets a user overshoot its quota).
    async fn restore(&mut self) {
        let Some(replay) = self.replay.take() else {
            return;
        };
        let watermark = match self.auth.clone().filter(Authenticator::has_store) {
            Some(auth) => tokio::task::spawn_blocking(move || auth.watermark())
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        if let (Some(watermark), Some(auth)) = (watermark, self.auth.clone()) {
            let mut sums: HashMap<String, u64> = HashMap::new();
            for (user, exec_us, lsn) in &replay.charges {
                if *lsn > watermark {
                    *sums.entry(user.clone()).or_default() += exec_us;
                }
            }
            let usage: Vec<(String, u64)> = sums.into_iter().collect();
            let last = replay.last_lsn;
            let journal = self.journal.clone();
            let res = tokio::task::spawn_blocking(move || auth.add_usage(&usage, last)).await;
            match res {
                Ok(Ok(())) => {
                    if let Some(j) = journal {
                        j.set_watermark(last);
                    }
                }
                Ok(Err(e)) => warn!("cannot charge replayed usage to the user store: {e}"),
                Err(e) => warn!("usage writer failed: {e}"),
            }
        }
        let restored = replay.packages.len();
        for p in replay.packages {
            let user = self.user_id(&p.record.user);
            let r = p.record;
            let done = p
                .done
                .into_iter()
                .map(|d| TaskOutcome {
                    index: d.index,
                    status: TaskStatus::from_u8(d.status).unwrap_or(TaskStatus::Failed),
                    data: d.data,
                    queue_us: 0,
                    worker_us: 0,
                    exec_us: d.exec_us,
                    wait_us: 0,
                    flush_us: 0,
                    late_us: d.late_us,
                })
                .collect();
            let opts = restored_opts(&r);
            let event = Event::Restore(Box::new(RestoredPackage {
                package: PackageId(r.package),
                user,
                fn_hash: FnHash(r.fn_hash),
                fn_code: r.fn_code,
                opts,
                tasks: r.tasks,
                done,
                delivered: p.delivered,
            }));
            self.apply_now(event);
        }
        if restored > 0 {
            info!("restored {restored} packages from the journal; waiting for their clients to attach");
        }
    }

    /// Handles held client events whose submissions are now durable.
    fn release_held(&mut self, durable: u64) {
        while let Some((lsn, _)) = self.held.front() {
            if *lsn > durable {
                break;
            }
            let (_, held) = self.held.pop_front().expect("peeked");
            match held {
                Held::Event(event) => self.apply_now(event),
                Held::Reply {
                    session,
                    msg,
                    close,
                } => self.reply(session, msg, close),
                Held::Closed { session, event } => {
                    self.routes.remove(&session);
                    self.apply_now(event);
                }
            }
        }
    }

    fn now(&self) -> rtpool_core::Instant {
        rtpool_core::Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    /// The core id of a user name.
    fn user_id(&mut self, name: &str) -> UserId {
        if let Some(&id) = self.users.get(name) {
            return id;
        }
        let id = UserId(self.user_names.len() as u64);
        self.user_names.push(name.to_owned());
        self.users.insert(name.to_owned(), id);
        id
    }

    /// Reads every user's quota from the store at start-up.
    async fn load_quotas(&mut self) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            return;
        };
        match tokio::task::spawn_blocking(move || auth.quotas()).await {
            Ok(Ok(quotas)) => self.set_quotas(quotas),
            Ok(Err(e)) => warn!("cannot read quotas from the user store: {e}"),
            Err(e) => warn!("quota reader failed: {e}"),
        }
    }

    fn set_quotas(&mut self, quotas: Vec<UserQuota>) {
        for q in quotas {
            let user = self.user_id(&q.user);
            let remaining_us = q
                .quota_us
                .map(|quota| quota as i64 - q.used_us.min(i64::MAX as u64) as i64);
            self.apply(Event::SetQuota { user, remaining_us });
        }
    }

    /// Usage charged since the last flush, by user name.
    fn take_usage(&mut self) -> Vec<(String, u64)> {
        self.core
            .take_usage()
            .into_iter()
            .map(|(user, us)| (self.user_names[user.0 as usize].clone(), us))
            .collect()
    }

    /// Writes the usage behind (off this task) and re-reads the quotas.
    fn flush_usage(&mut self, tx: &mpsc::UnboundedSender<ToScheduler>) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            let _ = self.core.take_usage();
            return;
        };
        if self.flushing {
            return;
        }
        let usage = self.take_usage();
        self.flushing = true;
        let tx = tx.clone();
        // Every result charged so far was journaled at or before this LSN.
        let watermark = self.last_lsn;
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || {
            if !usage.is_empty() {
                match auth.add_usage(&usage, watermark) {
                    Ok(()) => {
                        if let Some(j) = journal {
                            j.set_watermark(watermark);
                        }
                    }
                    Err(e) => warn!("cannot write usage to the user store: {e}"),
                }
            }
            match auth.quotas() {
                Ok(q) => drop(tx.send(ToScheduler::Quotas(q))),
                Err(e) => {
                    warn!("cannot read quotas from the user store: {e}");
                    drop(tx.send(ToScheduler::Quotas(Vec::new())));
                }
            }
        });
    }

    /// Writes the last usage at shutdown, and waits for it (off this task: a store may block).
    async fn flush_usage_now(&mut self) {
        let Some(auth) = self.auth.clone().filter(Authenticator::has_store) else {
            return;
        };
        let usage = self.take_usage();
        if usage.is_empty() {
            return;
        }
        let watermark = self.last_lsn;
        let done = tokio::task::spawn_blocking(move || auth.add_usage(&usage, watermark)).await;
        match done {
            Ok(Ok(())) => {
                if let Some(j) = &self.journal {
                    j.set_watermark(watermark);
                }
            }
            Ok(Err(e)) => warn!("cannot write the last usage to the user store: {e}"),
            Err(e) => warn!("usage writer failed: {e}"),
        }
    }

    /// Handle one message; false means stop.
    fn on_message(&mut self, msg: ToScheduler) -> bool {
        match msg {
            ToScheduler::Register {
                session,
                user,
                tx,
                mut event,
            } => {
                self.routes.insert(session, tx);
                if let Event::ClientJoined { user: id, .. } = &mut event {
                    *id = self.user_id(&user);
                    self.client_users.insert(session, *id);
                }
                self.apply(event);
            }
            ToScheduler::Event(event) => self.apply(event),
            ToScheduler::Events(events) => events.into_iter().for_each(|e| self.apply(e)),
            ToScheduler::Closed { session, event } => {
                self.client_users.remove(&session);
                if self.held.is_empty() {
                    self.routes.remove(&session);
                    self.apply(event);
                } else {
                    // After the events it sent before closing.
                    let lsn = self.last_lsn;
                    self.held.push_back((lsn, Held::Closed { session, event }));
                }
            }
            ToScheduler::Reply {
                session,
                msg,
                close,
            } => {
                if self.held.is_empty() {
                    self.reply(session, msg, close);
                } else {
                    let lsn = self.last_lsn;
                    self.held.push_back((
                        lsn,
                        Held::Reply {
                            session,
                            msg,
                            close,
                        },
                    ));
                }
            }
            ToScheduler::Stats(reply) => {
                let _ = reply.send(MasterStats {
                    core: self.core.stats(),
                    connections: self.routes.len(),
                    journal: self.journal.as_ref().map(Journal::stats),
                    replay: self.replay_stats,
                    realtime: None, // the handle adds it: it is not the scheduler's
                });
            }
            ToScheduler::Quotas(quotas) => {
                self.flushing = false;
                self.set_quotas(quotas);
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

    /// Numbers and journals a submission; under `fsync always` holds it (and every client
    /// event after it) until its record is durable. Everything else is handled now.
    fn apply(&mut self, mut event: Event) {
        let is_client_event = matches!(
            event,
            Event::Submit { .. }
                | Event::Cancel { .. }
                | Event::Status { .. }
                | Event::Attach { .. }
                | Event::Ack { .. }
        );
        if let Event::Submit {
            client,
            package,
            fn_hash,
            fn_code,
            opts,
            tasks,
            ..
        } = &mut event
        {
            *package = PackageId(self.next_package);
            self.next_package += 1;
            if let Some(journal) = &self.journal {
                let user = self
                    .client_users
                    .get(&client.0)
                    .map(|u| self.user_names[u.0 as usize].clone())
                    .unwrap_or_default();
                let record = package_record(*package, user, *fn_hash, fn_code, opts, tasks);
                self.last_lsn = journal.append(Record::Package(record));
                if self.ack_after_fsync {
                    self.held.push_back((self.last_lsn, Held::Event(event)));
                    return;
                }
            }
        } else if is_client_event && !self.held.is_empty() {
            let lsn = self.last_lsn;
            self.held.push_back((lsn, Held::Event(event)));
            return;
        }
        self.apply_now(event);
    }

    /// Runs the core on one event and carries out its actions.
    fn apply_now(&mut self, event: Event) {
        let submitted = match &event {
            Event::Submit { package, .. } => Some(*package),
            _ => None,
        };
        let now = self.now();
        self.core.handle(event, now, &mut self.actions);
        let mut actions = std::mem::take(&mut self.actions);
        if let (Some(package), Some(journal)) = (submitted, &self.journal) {
            // A refused or deduplicated submission never became a package: end its record.
            let created = actions
                .iter()
                .any(|a| matches!(a, Action::Accepted { package: p, .. } if *p == package));
            if !created {
                self.last_lsn = journal.append(Record::End { package: package.0 });
            }
        }
        for action in actions.drain(..) {
            self.journal_action(&action);
            self.route(action);
        }
        self.actions = actions;
    }

    /// Appends the journal record an action implies, if any.
    fn journal_action(&mut self, action: &Action) {
        let Some(journal) = &self.journal else {
            return;
        };
        match action {
            Action::SendResults {
                package, results, ..
            } => {
                for r in results {
                    self.last_lsn = journal.append(Record::Done(DoneRecord {
                        package: package.0,
                        index: r.index,
                        status: r.status as u8,
                        data: r.data.clone(),
                        exec_us: r.exec_us,
                        late_us: r.late_us,
                    }));
                }
            }
            Action::Delivered { package, indices } => {
                self.last_lsn = journal.append(Record::Delivered {
                    package: package.0,
                    indices: indices.clone(),
                });
            }
            Action::PackageFreed { package, .. } => {
                self.last_lsn = journal.append(Record::End { package: package.0 });
            }
            _ => {}
        }
    }

    fn reply(&self, session: u64, msg: Msg, close: bool) {
        if let Some(tx) = self.routes.get(&session) {
            let _ = tx.send(if close {
                Out::SendAndClose(msg)
            } else {
                Out::Send(msg)
            });
        }
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
            // TODO(#5): the grid RPC frames (docs/protocol.md) are routed by the shell's
            // `ASSIGN_CALLS`/`FUNCTIONS_REPLY`/`serve_conflict` encoders, being written.
            Action::AssignCalls { .. }
            | Action::FunctionsReply { .. }
            | Action::ServeRefused { .. } => {}
            Action::Assign { worker, tasks } => {
                let tasks = tasks
                    .into_iter()
                    .map(|t| Assignment {
                        task: t.task.0,
                        attempt: t.attempt,
                        fn_hash: Bytes::copy_from_slice(&t.fn_hash.0),
                        fn_code: t.fn_code,
                        args: t.args,
                        timeout_ms: t.timeout_ms,
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
                let code = match reason {
                    RejectReason::QuotaExhausted { .. } => "quota",
                    RejectReason::Admission { .. } | RejectReason::NoWorkerSlots { .. } => {
                        "admission"
                    }
                    RejectReason::UnknownFunction { .. } => "unknown_function",
                    RejectReason::Empty
                    | RejectReason::TooManyTasks { .. }
                    | RejectReason::InvalidOptions(_)
                    | RejectReason::InvalidCall { .. } => "rejected",
                };
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
            Action::PackageFreed { package, expired } => {
                if expired {
                    info!(%package, "no client attached within the result TTL: dropped");
                }
            }
            Action::Abort { worker, tasks } => {
                let tasks = tasks.into_iter().map(|(t, a)| (t.0, a)).collect();
                self.send(worker.0, Msg::Abort { tasks });
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
                        met: counts.met,
                        missed: counts.missed,
                    },
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

/// The next durable LSN the journal reports; `None` if it stopped (then never again).
async fn wait_durable(rx: &mut Option<tokio::sync::watch::Receiver<u64>>) -> Option<u64> {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                *rx = None;
                return None;
            }
            Some(*r.borrow_and_update())
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The journal record of an accepted package.
fn package_record(
    package: PackageId,
    user: String,
    fn_hash: FnHash,
    fn_code: &Bytes,
    opts: &PackageOpts,
    tasks: &[Bytes],
) -> PackageRecord {
    // Destructured so that a new option cannot be left out of the journal.
    let PackageOpts {
        priority,
        timeout_ms,
        key,
        deadline_ms,
        on_miss,
        admit,
        replicas,
        quorum,
        max_copies,
        hedge,
    } = opts;
    PackageRecord {
        package: package.0,
        user,
        key: key.clone(),
        fn_hash: fn_hash.0,
        fn_code: fn_code.clone(),
        priority: *priority,
        timeout_ms: *timeout_ms,
        tasks: tasks.to_vec(),
        deadline_ms: *deadline_ms,
        on_miss: *on_miss,
        admit: *admit,
        replicas: *replicas,
        quorum: *quorum,
        max_copies: *max_copies,
        hedge: *hedge,
    }
}

/// The options of a package restored from its journal record.
fn restored_opts(r: &PackageRecord) -> PackageOpts {
    PackageOpts {
        priority: r.priority,
        timeout_ms: r.timeout_ms,
        key: r.key.clone(),
        deadline_ms: r.deadline_ms,
        on_miss: r.on_miss,
        admit: r.admit,
        replicas: r.replicas,
        quorum: r.quorum,
        max_copies: r.max_copies,
        hedge: r.hedge,
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
        late_us: o.late_us,
    }
}

#[cfg(test)]
mod tests {
    use rtpool_core::{ClientId, MissPolicy, PackageCounts};

    use super::*;

    /// A scheduler with one client route (session 5), and that route's receiving end.
    fn with_client() -> (Scheduler, crate::connection::OutboundRx) {
        let mut scheduler = Scheduler::new(CoreConfig::default());
        let (tx, rx) = OutboundTx::new(1 << 20);
        scheduler.routes.insert(5, tx);
        (scheduler, rx)
    }

    fn sent(rx: &mut crate::connection::OutboundRx) -> Msg {
        match rx.try_recv() {
            Some(Out::Send(msg)) => msg,
            other => panic!("expected one message, got {other:?}"),
        }
    }

    #[test]
    fn refusals_answer_with_their_code_and_the_reason() {
        let (mut scheduler, mut rx) = with_client();
        let admission = RejectReason::Admission {
            tasks: 100,
            finish_us: 5_000_000,
            deadline_us: 1_000_000,
            per_task_us: 50_000,
            p95_us: 60_000,
            samples: 12,
            slots: 1,
            backlog_us: 0,
        };
        let cases = [
            (admission, "admission"),
            (
                RejectReason::NoWorkerSlots {
                    deadline_us: 50_000,
                },
                "admission",
            ),
            (
                RejectReason::InvalidOptions("quorum 3 > replicas 2".into()),
                "rejected",
            ),
            (RejectReason::QuotaExhausted { over_us: 0 }, "quota"),
            (RejectReason::Empty, "rejected"),
        ];
        for (reason, code) in cases {
            let message = reason.to_string();
            scheduler.route(Action::Rejected {
                client: ClientId(5),
                req_id: 9,
                reason,
            });
            let expected = Msg::Error {
                code: code.into(),
                message,
                reference: 9,
            };
            assert_eq!(sent(&mut rx), expected);
        }
    }

    #[test]
    fn met_missed_and_late_us_reach_the_wire() {
        let (mut scheduler, mut rx) = with_client();
        let counts = PackageCounts {
            total: 10,
            done: 10,
            met: 7,
            missed: 3,
            ..PackageCounts::default()
        };
        scheduler.route(Action::StatusReply {
            client: ClientId(5),
            req_id: 4,
            package: PackageId(2),
            counts,
        });
        let Msg::StatusReply { met, missed, .. } = sent(&mut rx) else {
            panic!("expected STATUS_REPLY");
        };
        assert_eq!((met, missed), (7, 3));
        let outcome = TaskOutcome {
            index: 1,
            status: TaskStatus::Missed,
            data: Bytes::from_static(b"missed its deadline"),
            queue_us: 1,
            worker_us: 2,
            exec_us: 3,
            wait_us: 4,
            flush_us: 5,
            late_us: 6,
        };
        scheduler.route(Action::SendResults {
            client: Some(ClientId(5)),
            package: PackageId(2),
            results: vec![outcome],
        });
        let Msg::Results { results, .. } = sent(&mut rx) else {
            panic!("expected RESULTS");
        };
        assert_eq!((results[0].status, results[0].late_us), (7, 6));
    }

    #[test]
    fn package_options_survive_the_journal_record() {
        let opts = PackageOpts {
            priority: -2,
            timeout_ms: 900,
            key: "k-1".into(),
            deadline_ms: 250,
            on_miss: MissPolicy::Drop,
            admit: true,
            replicas: 3,
            quorum: 2,
            max_copies: 5,
            hedge: true,
        };
        let tasks = [Bytes::from_static(b"a")];
        let code = Bytes::from_static(b"code");
        let record = package_record(
            PackageId(7),
            "alice".into(),
            FnHash([1; 32]),
            &code,
            &opts,
            &tasks,
        );
        assert_eq!(restored_opts(&record), opts);
        assert_eq!((record.package, record.user.as_str()), (7, "alice"));
        let default = PackageOpts::default();
        let record = package_record(
            PackageId(8),
            String::new(),
            FnHash([1; 32]),
            &code,
            &default,
            &tasks,
        );
        assert_eq!(restored_opts(&record), default);
    }
}
