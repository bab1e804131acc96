//! The leader lease: one row of `rtpool_leader` with a fencing epoch, taken when it has
//! expired by the database's clock, or at once when its holder's database session has ended
//! (its process is gone), and renewed by its holder every third of the lease.
//!
//! Why a row and not an advisory lock (docs/ha.md): a session-level advisory lock belongs to a
//! connection, and a SIGSTOPped or frozen leader keeps its connection open, so it would keep
//! the lock for ever while serving nobody; a row's expiry is judged by one clock, the
//! database's, for every master, and its epoch fences the journal (`journal::pg`).
//!
//! The leader *also* holds a session-level advisory lock keyed by its epoch ([`LOCK_KEY`]),
//! for liveness only: a killed leader's session ends at once (its kernel closes the socket),
//! so a standby that can take that lock knows nobody holds the lease's session and takes the
//! row at once (`WHERE epoch = the one it saw`) instead of at expiry. Safety still rests on the
//! epoch alone. After a PostgreSQL restart every session has ended, so the early take is
//! allowed only once the leader renewed after the server started (`renewed_at >
//! pg_postmaster_start_time()`): its first renewal on its new session takes the lock in the
//! same statement, so a restart of the database is not a failover.
//!
//! This module owns the SQL of the lease and the thread that runs it ([`LeaseThread`]), which
//! publishes a [`LeaseView`] on every change. It does not decide what a master does with the
//! lease: `ha/mod.rs` starts and ends leadership terms from the view, and tells the thread to
//! [`LeaseThread::resign`] when it fenced itself.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use postgres::Client;
use tokio::sync::watch;

use crate::journal::pg::{connect, JOURNAL_TABLE_SQL, LEASE_TABLE_SQL};

/// Arbitrary constant naming the lock two masters creating the tables at once take in turn.
const SCHEMA_LOCK: i64 = 0x7274_6861_6c65;

/// The advisory lock the leader of `epoch` holds on its lease session, as SQL of `epoch`: the
/// lease table's OID (one per schema, so deployments or tests sharing a database never share
/// a lock) and the epoch's low 31 bits.
macro_rules! lock_key {
    ($epoch:literal) => {
        concat!(
            "(('rtpool_leader'::regclass)::oid::bigint << 31) | (",
            $epoch,
            " & 2147483647)"
        )
    };
}

/// [`lock_key!`] of the `epoch` column, for documentation and tests.
pub const LOCK_KEY: &str = lock_key!("epoch");

/// How to run the lease.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The `--ha` database.
    pub url: String,
    /// Names this master process in the row (unique per process: a restarted master is a new
    /// holder).
    pub holder: String,
    /// The address peers should use for this master, published in the row for standbys to
    /// name.
    pub advertise: String,
    /// The lease, milliseconds.
    pub lease_ms: u32,
}

impl LeaseConfig {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.into())
    }

    /// How long before the lease's end (by our clock) a leader stops trusting it: a fifth of
    /// the lease, for the time a renewal's answer took to arrive and clock rates.
    pub fn margin(&self) -> Duration {
        self.lease() / 5
    }
}

/// What the lease thread knows, published on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// `Some(epoch)` while this master holds the lease.
    pub held: Option<u64>,
    /// While held: until when (our monotonic clock) the lease is surely ours, the start of
    /// the last successful take or renewal plus the lease less [`LeaseConfig::margin`].
    pub valid_until: Option<Instant>,
    /// The epoch last seen in the row.
    pub epoch: u64,
    /// The advertised address of the master holding an unexpired lease, if any.
    pub leader: Option<String>,
    /// Whether the last query succeeded.
    pub db_ok: bool,
}

impl LeaseView {
    /// `(leader: HOST:PORT)` or `(leader: unknown)`, the end of every `not_leader` message.
    pub fn leader_suffix(&self) -> String {
        format!("(leader: {})", self.leader.as_deref().unwrap_or("unknown"))
    }
}

enum Cmd {
    /// Stop counting on the lease (the master fenced itself); try to take it again later.
    Resign,
    /// Give the lease up (expire it now, so a standby takes over at once) and end.
    Stop,
}

/// The thread that takes, renews and gives up the lease.
pub struct LeaseThread {
    cmds: mpsc::Sender<Cmd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaseThread {
    /// Starts the thread; the view starts as "standby, database not reached yet".
    ///
    /// # Errors
    ///
    /// When the thread cannot be started.
    pub fn start(cfg: LeaseConfig) -> std::io::Result<(Self, watch::Receiver<LeaseView>)> {
        let (tx, rx) = mpsc::channel();
        let (view_tx, view_rx) = watch::channel(LeaseView::default());
        let thread = std::thread::Builder::new()
            .name("rtpool-lease".into())
            .spawn(move || Runner::new(cfg, view_tx).run(&rx))?;
        let lease = LeaseThread {
            cmds: tx,
            thread: Some(thread),
        };
        Ok((lease, view_rx))
    }

    /// The master stopped leading on its own (fenced): forget the lease held, look again.
    pub fn resign(&self) {
        let _ = self.cmds.send(Cmd::Resign);
    }

    /// Gives up the lease (if held) and ends the thread.
    pub fn stop(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LeaseThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's state.
struct Runner {
    cfg: LeaseConfig,
    client: Option<Client>,
    view: LeaseView,
    tx: watch::Sender<LeaseView>,
    last_warned: Option<Instant>,
    /// The epoch whose [`LOCK_KEY`] this thread's current session holds.
    locked: Option<u64>,
}

impl Runner {
    fn new(cfg: LeaseConfig, tx: watch::Sender<LeaseView>) -> Self {
        Runner {
            cfg,
            client: None,
            view: LeaseView::default(),
            tx,
            last_warned: None,
            locked: None,
        }
    }

    fn run(mut self, cmds: &mpsc::Receiver<Cmd>) {
        loop {
            let started = Instant::now();
            let mut next = self.view.clone();
            match self.step(&mut next, started) {
                Ok(()) => next.db_ok = true,
                Err(e) => {
                    self.client = None;
                    next.db_ok = false;
                    next.leader = None;
                    if self
                        .last_warned
                        .is_none_or(|at| at.elapsed() >= Duration::from_secs(5))
                    {
                        self.last_warned = Some(Instant::now());
                        tracing::warn!(
                            "high availability: cannot reach the lease in {}: {}; retrying",
                            crate::store::redact_url(&self.cfg.url),
                            crate::journal::pg_detail(&e)
                        );
                    }
                }
            }
            self.publish(next);
            // Leader: renew every third of the lease; standby: look twenty times a lease, so a
            // takeover comes soon after the expiry.
            let pause = match self.view.held {
                Some(_) => self.cfg.lease() / 3,
                None => (self.cfg.lease() / 20).max(Duration::from_millis(10)),
            };
            let wait = pause.saturating_sub(started.elapsed());
            match cmds.recv_timeout(wait) {
                Ok(Cmd::Resign) => {
                    // A new session: the old one's lock goes with it, so a standby may take
                    // over at once (this master no longer serves).
                    self.client = None;
                    let mut next = self.view.clone();
                    next.held = None;
                    next.valid_until = None;
                    self.publish(next);
                }
                Ok(Cmd::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        self.release();
    }

    fn publish(&mut self, next: LeaseView) {
        if next != self.view {
            self.view = next.clone();
            self.tx.send_replace(next);
        }
    }

    /// One round: renew what is held, else try to take it, else look who holds it (and take
    /// it at once when its holder's session has ended).
    fn step(&mut self, next: &mut LeaseView, started: Instant) -> Result<(), postgres::Error> {
        let lease_ms = self.cfg.lease_ms;
        if let Some(epoch) = next.held {
            self.client()?; // first: a new session holds no lock yet
            let lock = self.locked != Some(epoch);
            let client = self.client()?;
            if let Some(locked) = renew_locking(client, epoch, lease_ms, lock)? {
                if lock && locked {
                    self.locked = Some(epoch);
                } else if lock {
                    tracing::warn!(
                        "high availability: another session holds the lock of epoch {epoch}; \
                         a standby may be taking over"
                    );
                }
                next.valid_until = Some(started + self.cfg.lease() - self.cfg.margin());
                return Ok(());
            }
            tracing::warn!(
                "high availability: lease of epoch {epoch} lost (another master took it)"
            );
            next.held = None;
            next.valid_until = None;
        }
        let cfg = self.cfg.clone();
        let client = self.client()?;
        let mut taken = take(client, &cfg)?.map(|t| (t, None));
        if taken.is_none() {
            let seen = look_live(client, &cfg.holder)?;
            next.epoch = seen.epoch;
            next.leader = seen.leader;
            if seen.holder_gone {
                taken = take_from(client, &cfg, seen.epoch)?.map(|t| (t, Some(seen.epoch)));
            }
        }
        let Some(((epoch, locked), early)) = taken else {
            return Ok(());
        };
        match early {
            Some(was) => tracing::info!(
                "high availability: took the leader lease early, epoch {epoch} ({lease_ms} ms): \
                 the database session of epoch {was}'s leader has ended"
            ),
            None => tracing::info!(
                "high availability: took the leader lease, epoch {epoch} ({lease_ms} ms)"
            ),
        }
        self.locked = locked.then_some(epoch);
        next.held = Some(epoch);
        next.valid_until = Some(started + cfg.lease() - cfg.margin());
        next.epoch = epoch;
        next.leader = Some(cfg.advertise.clone());
        Ok(())
    }

    fn client(&mut self) -> Result<&mut Client, postgres::Error> {
        if self.client.is_none() {
            let mut client = connect(&self.cfg.url, self.cfg.lease_ms)?;
            setup(&mut client, self.cfg.lease_ms)?;
            self.client = Some(client);
            self.locked = None;
        }
        Ok(self.client.as_mut().expect("connected just now"))
    }

    /// Expires a held lease now, so that a standby takes over without waiting for it.
    fn release(&mut self) {
        let Some(epoch) = self.view.held else { return };
        if let Ok(client) = self.client() {
            match client.execute(
                "UPDATE rtpool_leader SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1",
                &[&(epoch as i64)],
            ) {
                Ok(_) => tracing::info!("high availability: gave up the lease of epoch {epoch}"),
                Err(e) => tracing::warn!("high availability: could not give up the lease: {e}"),
            }
        }
    }
}

/// Creates the tables (once, whoever comes first) and bounds every statement of the lease's
/// connection by the lease, so that a lock held by a frozen master cannot hold this thread.
pub fn setup(client: &mut Client, lease_ms: u32) -> Result<(), postgres::Error> {
    let mut txn = client.transaction()?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
    txn.batch_execute(LEASE_TABLE_SQL)?;
    txn.batch_execute(JOURNAL_TABLE_SQL)?;
    txn.commit()?;
    client.batch_execute(&format!(
        "SET statement_timeout = {lease_ms}; SET lock_timeout = {lease_ms}"
    ))
}

/// Takes the lease if it has expired by the database's clock (or this holder has it): a new
/// epoch, and its [`LOCK_KEY`] taken in the same statement. Returns `(epoch, locked)`, or
/// `None` when another master's lease is still running.
pub fn take(
    client: &mut Client,
    cfg: &LeaseConfig,
) -> Result<Option<(u64, bool)>, postgres::Error> {
    let row = client.query_opt(
        concat!(
            "UPDATE rtpool_leader SET epoch = epoch + 1, holder = $1, advertise = $2, \
             expires_at = now() + $3 * interval '1 millisecond', renewed_at = now() \
             WHERE id = 1 AND (expires_at < now() OR holder = $1) \
             RETURNING epoch, pg_try_advisory_lock(",
            lock_key!("epoch"),
            ")"
        ),
        &[&cfg.holder, &cfg.advertise, &f64::from(cfg.lease_ms)],
    )?;
    Ok(row.map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
}

/// Takes the lease of `seen` (an unexpired one whose holder's session has ended: this
/// session holds `seen`'s lock) with a new epoch, unless the row moved on meanwhile; then
/// lets `seen`'s lock go. Returns `(epoch, locked)` as [`take`].
pub fn take_from(
    client: &mut Client,
    cfg: &LeaseConfig,
    seen: u64,
) -> Result<Option<(u64, bool)>, postgres::Error> {
    let row = client.query_opt(
        concat!(
            "UPDATE rtpool_leader SET epoch = epoch + 1, holder = $1, advertise = $2, \
             expires_at = now() + $3 * interval '1 millisecond', renewed_at = now() \
             WHERE id = 1 AND epoch = $4 \
             RETURNING epoch, pg_try_advisory_lock(",
            lock_key!("epoch"),
            ")"
        ),
        &[
            &cfg.holder,
            &cfg.advertise,
            &f64::from(cfg.lease_ms),
            &(seen as i64),
        ],
    )?;
    client.execute(
        concat!("SELECT pg_advisory_unlock(", lock_key!("$1::bigint"), ")"),
        &[&(seen as i64)],
    )?;
    Ok(row.map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
}

/// Extends the lease of `epoch`; `false` when the row has another epoch (lost).
pub fn renew(client: &mut Client, epoch: u64, lease_ms: u32) -> Result<bool, postgres::Error> {
    Ok(renew_locking(client, epoch, lease_ms, false)?.is_some())
}

/// [`renew`], and with `lock` take the epoch's [`LOCK_KEY`] in the same statement (on a new
/// session: a standby must never see a renewal after the database started without the
/// lock). `None` when lost, else whether the lock was taken (`true` without `lock`).
pub fn renew_locking(
    client: &mut Client,
    epoch: u64,
    lease_ms: u32,
    lock: bool,
) -> Result<Option<bool>, postgres::Error> {
    let row = client.query_opt(
        concat!(
            "UPDATE rtpool_leader SET expires_at = now() + $2 * interval '1 millisecond', \
             renewed_at = now() WHERE id = 1 AND epoch = $1 \
             RETURNING CASE WHEN $3 THEN pg_try_advisory_lock(",
            lock_key!("epoch"),
            ") ELSE true END"
        ),
        &[&(epoch as i64), &f64::from(lease_ms), &lock],
    )?;
    Ok(row.map(|r| r.get(0)))
}

/// The row's epoch, and the advertised address of its holder while its lease runs.
pub fn look(client: &mut Client) -> Result<(u64, Option<String>), postgres::Error> {
    let row = client.query_one(
        "SELECT epoch, advertise, expires_at > now() FROM rtpool_leader WHERE id = 1",
        &[],
    )?;
    let epoch = row.get::<_, i64>(0) as u64;
    let live: bool = row.get(2);
    let advertise: String = row.get(1);
    Ok((epoch, (live && !advertise.is_empty()).then_some(advertise)))
}

/// What a standby's look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The row's epoch.
    pub epoch: u64,
    /// The advertised address of its holder while its lease runs.
    pub leader: Option<String>,
    /// The lease runs, but its holder's session has ended: this session now holds the
    /// epoch's [`LOCK_KEY`] and may [`take_from`] it.
    pub holder_gone: bool,
}

/// [`look`], and while another holder's lease runs and it renewed after the database
/// started, try its epoch's lock: taken means its session has ended.
pub fn look_live(client: &mut Client, me: &str) -> Result<Seen, postgres::Error> {
    let row = client.query_one(
        concat!(
            "SELECT epoch, advertise, expires_at > now(), \
             CASE WHEN expires_at > now() AND holder <> $1 \
             AND renewed_at > pg_postmaster_start_time() \
             THEN pg_try_advisory_lock(",
            lock_key!("epoch"),
            ") ELSE false END FROM rtpool_leader WHERE id = 1"
        ),
        &[&me],
    )?;
    let live: bool = row.get(2);
    let advertise: String = row.get(1);
    Ok(Seen {
        epoch: row.get::<_, i64>(0) as u64,
        leader: (live && !advertise.is_empty()).then_some(advertise),
        holder_gone: row.get(3),
    })
}
