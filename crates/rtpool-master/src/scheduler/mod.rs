//! The scheduler task: sole owner of the [`Core`]. It receives events from connection tasks,
//! stamps them with the master's monotonic clock, journals what must survive a restart, and
//! routes the core's actions to the writer of the connection they address. `message.rs` holds
//! what connections send it, `route.rs` turns each action into its frame, `journaling.rs` writes the
//! journal records of packages and results, `calls_journal.rs` journals packages of calls and
//! reads them back, `usage.rs` keeps the
//! users' quotas and charged time in step with the user store.

mod activity;
mod calls_journal;
mod journaling;
mod message;
mod overload;
mod route;
mod status;
#[cfg(test)]
mod tests;
mod usage;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant as StdInstant};

use rtpool_core::{
    Action, Core, CoreConfig, Event, FnHash, PackageId, RestoredPackage, TaskOutcome, TaskStatus,
    UserId,
};
use rtpool_proto::Msg;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::auth::Authenticator;
use crate::journal::{FsyncPolicy, Journal, Record, Replay};
use crate::outbound::OutboundTx;
use crate::package_ids::PackageIds;
use crate::stats::{MasterStats, ReplayStats};
use crate::status::recorder::IdMap;

use self::activity::Activity;
use self::journaling::package_record;
pub use self::message::ToScheduler;
pub use self::status::STATUS_PERIOD;

/// How often charged compute time is written behind to the user store, and quotas re-read.
const USAGE_FLUSH: Duration = Duration::from_secs(1);

/// Idle time beyond [`USAGE_FLUSH`] between two wakes of the scheduler loop that counts as a
/// stall of the master itself (SIGSTOP, a frozen VM, a swapped-out process): the loop wakes
/// at least once per flush tick, so a longer gap is time the master could not observe.
const STALL_MIN: Duration = Duration::from_millis(500);

/// The scheduler task's state.
pub struct Scheduler {
    core: Core,
    routes: IdMap<u64, OutboundTx>,
    epoch: StdInstant,
    actions: Vec<Action>,
    /// User names interned as core [`UserId`]s.
    users: HashMap<String, UserId>,
    user_names: Vec<String>,
    /// Numbers packages, submitted and of calls: unguessable ids, never reused within this
    /// lifetime, fresh for each (see [`PackageIds`]); a client re-attaching to an id from
    /// before a restart gets `unknown_package`, never another package.
    package_ids: PackageIds,
    /// Token checks and the user store (quotas are written behind through it).
    auth: Option<Authenticator>,
    /// A usage flush is running; its answer comes back as [`ToScheduler::Quotas`].
    flushing: bool,
    core_config: CoreConfig,
    /// Users of connected clients, by session.
    client_users: IdMap<u64, UserId>,
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
    /// When the loop last went idle (after handling what woke it).
    idle_since: StdInstant,
    /// A submission refused by its user's bounds before it was journaled (no `End` for it).
    unjournaled: Option<PackageId>,
    /// Time the master was stalled (see [`STALL_MIN`]), left out of the core's clock so that
    /// time limits, result TTLs and deadlines are judged on time the master could observe.
    stalled: Duration,
    /// Package lifecycle lines (debug) and the periodic summary (info).
    activity: Activity,
    /// Metrics and the status snapshot (`status.rs`).
    status: self::status::StatusState,
    /// What the log was told of overload (`overload.rs`).
    overload_log: self::overload::OverloadLog,
}

/// Something a client sent that waits for the journal (`fsync always`).
enum Held {
    Event(Event),
    Reply { session: u64, msg: Msg, close: bool },
    Closed { session: u64, event: Event },
}

impl Scheduler {
    /// A scheduler with an empty core and no user store. `instance` is the master process's
    /// random number (`WELCOME.instance`).
    pub fn new(config: CoreConfig, _instance: u64) -> Self {
        Self {
            core: Core::new(config.clone()),
            routes: IdMap::default(),
            epoch: StdInstant::now(),
            actions: Vec::with_capacity(64),
            users: HashMap::new(),
            user_names: Vec::new(),
            package_ids: PackageIds::new(),
            auth: None,
            flushing: false,
            core_config: config,
            client_users: IdMap::default(),
            journal: None,
            ack_after_fsync: false,
            replay: None,
            replay_stats: None,
            last_lsn: 0,
            held: VecDeque::new(),
            idle_since: StdInstant::now(),
            stalled: Duration::ZERO,
            unjournaled: None,
            activity: Activity::new(crate::config::DEFAULT_LOG_SUMMARY),
            status: self::status::StatusState::default(),
            overload_log: self::overload::OverloadLog::default(),
        }
    }

    /// Log the one-line summary every `every` instead of every 60 s (zero: never).
    pub fn with_summary_every(mut self, every: Duration) -> Self {
        self.activity = Activity::new(every);
        self
    }

    /// Record packages, results and deliveries in `journal`, and restore what `replay` found
    /// when the scheduler starts.
    pub fn with_journal(mut self, journal: Journal, replay: Replay, policy: FsyncPolicy) -> Self {
        self.core_config.report_deliveries = true;
        self.core = Core::new(self.core_config.clone());
        // PostgreSQL (`--ha`): a package is acknowledged only once its row is committed.
        self.ack_after_fsync = policy == FsyncPolicy::Always || journal.is_commit_acked();
        for p in &replay.packages {
            self.package_ids.reserve(PackageId(p.record.package));
        }
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
        let mut status_tick = tokio::time::interval(STATUS_PERIOD);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let status_on = self.needs_status_tick();
        let mut durable = self.journal.as_ref().map(Journal::durable);
        loop {
            let timer = self.core.next_timer().map(|at| {
                let now = self.now();
                tokio::time::Instant::now() + Duration::from_nanos(at.0.saturating_sub(now.0))
            });
            let waiting = !self.held.is_empty();
            self.prepare_growth(&rx, timer);
            self.idle_since = StdInstant::now();
            tokio::select! {
                msg = rx.recv() => {
                    self.note_stall();
                    let Some(msg) = msg else { break };
                    if !self.on_message(msg) {
                        break;
                    }
                }
                changed = wait_durable(&mut durable), if waiting => {
                    self.note_stall();
                    if let Some(lsn) = changed {
                        self.release_held(lsn);
                    }
                }
                _ = sleep_until(timer), if timer.is_some() => {
                    self.note_stall();
                    self.apply(Event::Tick);
                }
                _ = flush.tick() => {
                    self.note_stall();
                    self.flush_usage(&tx);
                    self.activity.maybe_summary(&self.core.stats());
                    self.log_overload();
                }
                _ = status_tick.tick(), if status_on => self.on_status_tick(),
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

    /// Makes the core's next growth ahead of need (tables, queue nodes, id buffers, maps), so
    /// no event pays the first touch of fresh memory: while nothing waits, share after share
    /// (each bounded: `Core::PREPARE_SLOTS`) until all is ready or a message arrives or the
    /// next timer is due; while messages wait, one eighth of a share per message, so a flood
    /// of submissions that never empties the inbox still finds its memory ready (up to 32
    /// tasks per message; a larger burst takes some first touches itself).
    fn prepare_growth(
        &mut self,
        rx: &mpsc::UnboundedReceiver<ToScheduler>,
        timer: Option<tokio::time::Instant>,
    ) {
        if !rx.is_empty() {
            self.core.prepare(Core::PREPARE_SLOTS / 8);
            return;
        }
        while self.core.prepare(Core::PREPARE_SLOTS)
            && rx.is_empty()
            && timer.is_none_or(|at| tokio::time::Instant::now() < at)
        {}
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
        for mut p in replay.packages {
            let user = self.user_id(&p.record.user);
            let Some(calls) = calls_journal::replayed_calls(&mut p.record) else {
                continue;
            };
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
            let event = Event::Restore(Box::new(RestoredPackage {
                package: PackageId(r.package),
                user,
                fn_hash: FnHash(r.fn_hash),
                fn_code: r.fn_code,
                opts: r.opts,
                tasks: r.tasks,
                done,
                delivered: p.delivered,
                calls,
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

    /// The core's clock: time since start, less the time the master was stalled.
    fn now(&self) -> rtpool_core::Instant {
        let observed = self.epoch.elapsed().saturating_sub(self.stalled);
        rtpool_core::Instant(observed.as_nanos() as u64)
    }

    /// Called first when the loop wakes: idle time past a flush tick plus [`STALL_MIN`] is a
    /// stall of the master, taken out of the core's clock so that no running task's time
    /// limit, no detached package's TTL and no deadline runs out because of it.
    fn note_stall(&mut self) {
        let idle = self.idle_since.elapsed();
        if idle > USAGE_FLUSH + STALL_MIN {
            let stall = idle - USAGE_FLUSH;
            self.stalled += stall;
            warn!(
                stall_ms = stall.as_millis() as u64,
                "the master did not run for {} ms (stopped or starved); its timers are \
                 extended by that much",
                stall.as_millis()
            );
        }
    }

    /// Handle one message; false means stop.
    fn on_message(&mut self, msg: ToScheduler) -> bool {
        match msg {
            ToScheduler::Register {
                session,
                user,
                name,
                identity,
                host,
                tx,
                mut event,
            } => {
                self.routes.insert(session, tx);
                if matches!(event, Event::WorkerJoined { .. }) {
                    let now = self.now();
                    let recorder = &mut self.status.recorder;
                    recorder.worker_joined(session, name, identity, host, now);
                }
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
                self.status.recorder.worker_left(session);
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
            ToScheduler::ClusterStatus { session, req_id } => {
                self.on_cluster_status(session, req_id);
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
            // High availability: another master leads (or may); nothing more is acknowledged
            // here, and every peer is told where to go.
            ToScheduler::Fenced { message } => return self.close_all("not_leader", message),
            ToScheduler::Shutdown => {
                let message = "the master is shutting down; reconnect when it is back";
                return self.close_all("shutdown", message.into());
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
                | Event::SubmitCalls { .. }
                | Event::Functions { .. }
                | Event::Cancel { .. }
                | Event::Status { .. }
                | Event::Attach { .. }
                | Event::Ack { .. }
                | Event::ReleaseKept { .. }
        );
        if let Event::SubmitCalls { package, .. } = &mut event {
            *package = self.package_ids.next_id();
        }
        if self.refuse_unjournalable(&event) {
            return;
        }
        if let Event::SubmitCalls { .. } = &event {
            match self.journal_calls(event) {
                Some(now) => event = now,
                None => return, // held until its record is durable
            }
        } else if let Event::Submit {
            client,
            package,
            fn_hash,
            fn_code,
            opts,
            tasks,
            ..
        } = &mut event
        {
            *package = self.package_ids.next_id();
            // A package its user's bounds refuse is not journaled (a flood of them must not
            // cost the journal's memory and disk), when nothing is held: then the core
            // decides on this same state at once.
            let bytes: u64 = tasks.iter().map(|t| t.len() as u64).sum();
            let refused = self.held.is_empty()
                && self
                    .core
                    .refuses_for_user_bounds(*client, tasks.len(), bytes);
            if refused {
                self.unjournaled = Some(*package);
            } else if let Some(journal) = &self.journal {
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
            Event::Submit { package, .. } | Event::SubmitCalls { package, .. } => Some(*package),
            _ => None,
        };
        let user = match &event {
            Event::Submit { client, .. } => self.client_users.get(&client.0),
            _ => None,
        };
        let user = user.map_or("", |u| self.user_names[u.0 as usize].as_str());
        let from_worker = match &event {
            Event::Results { worker, .. } | Event::Returned { worker, .. } => Some(*worker),
            _ => None,
        };
        self.activity.on_event(&event, user);
        let now = self.now();
        let client_users = &self.client_users;
        self.status.recorder.on_event(&event, now, || match &event {
            Event::Submit { client, .. } | Event::SubmitCalls { client, .. } => {
                client_users.get(&client.0).copied()
            }
            _ => None,
        });
        self.core.handle(event, now, &mut self.actions);
        let mut actions = std::mem::take(&mut self.actions);
        if let (Some(package), Some(journal)) = (submitted, &self.journal) {
            // A refused or deduplicated submission never became a package: end its record.
            let created = actions
                .iter()
                .any(|a| matches!(a, Action::Accepted { package: p, .. } if *p == package));
            let journaled = self.unjournaled.take() != Some(package);
            if !created && journaled {
                self.last_lsn = journal.append(Record::End { package: package.0 });
            }
        }
        for action in actions.drain(..) {
            self.activity.on_action(&action, &self.core);
            self.journal_action(&action);
            self.status.recorder.on_action(&action);
            self.route(action);
        }
        self.actions = actions;
        if let Some(worker) = from_worker {
            self.note_released(worker);
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
