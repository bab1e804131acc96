//! High availability (`rtpool master --ha postgres://...`, docs/ha.md): any number of
//! masters share one PostgreSQL database; the one holding the lease row leads (serves, with
//! its journal in the database), the others are standbys that answer `HELLO` with
//! `ERROR not_leader` naming the leader, and take over when its lease runs out.
//!
//! A process alternates between two phases on one listening socket: standby (`standby.rs`)
//! until the lease thread (`lease.rs`) takes the lease, then a leadership term: the journal
//! replayed from the database, a scheduler with a new `instance` (peers re-attach as after a
//! restart) served by [`crate::server::serve`], until a signal or until this master may no
//! longer lead. It fences itself (closes every connection with `not_leader`, stops
//! acknowledging, back to standby) at the first of: the lease thread saw the epoch gone, the
//! database refused a journal write of this epoch, or the lease was not renewed for the lease
//! less a margin by this master's own monotonic clock (frozen, or cut off from the database).

pub mod lease;
pub mod standby;
pub mod tail;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use self::lease::{LeaseConfig, LeaseThread, LeaseView};
use crate::config::MasterConfig;
use crate::connection::ConnCtx;
use crate::error::MasterError;
use crate::handle;
use crate::http::HttpServer;
use crate::journal::pg::{PgJournal, PgJournalConfig};
use crate::journal::{FsyncPolicy, Journal, JournalError, Replay};
use crate::realtime::Realtime;
use crate::scheduler::{Scheduler, ToScheduler};
use crate::status::schema::HaStatus;
use crate::status::{CountsSource, MasterFacts, Status};

/// Why a leadership term ended.
enum Ended {
    /// SIGINT or SIGTERM: shut down.
    Signal,
    /// This master may no longer lead: back to standby.
    Fenced,
}

/// What every term shares.
struct Shared<'a> {
    config: &'a MasterConfig,
    url: String,
    listener: Arc<TcpListener>,
    addr: SocketAddr,
    advertise: String,
    ctx: Arc<ConnCtx>,
    status: Arc<watch::Sender<Arc<Status>>>,
    lease: &'a LeaseThread,
}

/// Runs a master in high-availability mode in the current thread until SIGINT or SIGTERM
/// (what `rtpool master --ha URL` does): `listening on ADDR` is printed once the socket is
/// bound, whether this master leads or stands by.
///
/// # Errors
///
/// When the configuration is invalid, the address cannot be bound, or the store cannot be
/// opened.
pub fn run_blocking(mut config: MasterConfig) -> Result<(), MasterError> {
    config.validate()?;
    let url = config
        .ha
        .clone()
        .ok_or_else(|| MasterError::InvalidConfig {
            option: "ha",
            reason: "needs a postgres:// URL".into(),
        })?;
    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Err(MasterError::InvalidConfig {
            option: "ha",
            reason: format!(
                "must be a postgres://user@host:port/db URL, not {:?}",
                crate::store::redact_url(&url)
            ),
        });
    }
    // Users, tokens and quotas are shared by the masters: in the same database by default.
    if config.store.is_none() {
        config.store = Some(url.clone());
    }
    let mut lock = handle::lock_data_dir(&config)?;
    let (tokens, created) = handle::resolve_tokens(&config)?;
    let tls = crate::tls::from_config(&config)?;
    // Opened here, off the runtime: a PostgreSQL store's client blocks on a runtime of its own.
    let ctx = handle::conn_ctx(&config, tokens.clone(), tls, 0)?;
    let limits = ctx.gate.limits();
    let http_socket = handle::bind_http(&config, ctx.tls.as_ref())?;
    let realtime = Realtime::start(&config.realtime);
    let entered = handle::enter_realtime(&realtime);
    let rt = handle::build_runtime(&realtime)?;
    let kept = ctx.clone();
    let lock_slot = &mut lock;
    let mut lease_slot = None;
    let lease_ref = &mut lease_slot;
    let result = rt.block_on(async move {
        let listener = Arc::new(handle::bind(&config.listen, limits).await?);
        let addr = listener
            .local_addr()
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        if let Some(lock) = lock_slot {
            lock.set_address(addr);
        }
        let signalled = handle::signals();
        let advertise = advertise_address(&config, addr);
        let holder = format!("{advertise}/{:016x}", handle::random_instance());
        let lease_cfg = LeaseConfig {
            url: url.clone(),
            holder,
            advertise: advertise.clone(),
            lease_ms: config.ha_lease_ms,
        };
        let (lease, view) =
            LeaseThread::start(lease_cfg).map_err(|e| MasterError::Runtime(e.to_string()))?;
        let lease: &LeaseThread = lease_ref.insert(lease);
        let first = standby::standby_status(&addr.to_string(), &view.borrow());
        let (status_tx, status_rx) = watch::channel(Arc::new(first));
        let http = match http_socket {
            Some((l, hc)) => Some(HttpServer::start(l, hc, status_rx)?),
            None => None,
        };
        handle::announce(
            &config,
            &tokens,
            created,
            addr,
            ctx.tls.as_ref(),
            http.as_ref(),
        );
        tracing::info!(
            "high availability: lease and journal in {}, lease {} ms, advertised as {advertise}",
            crate::store::redact_url(&url),
            config.ha_lease_ms
        );
        let shared = Shared {
            config: &config,
            url,
            listener,
            addr,
            advertise,
            ctx,
            status: Arc::new(status_tx),
            lease,
        };
        run_phases(&shared, view, signalled).await;
        drop(http);
        Ok(())
    });
    // The lease last but for the store: given up once the journal is closed.
    if let Some(mut lease) = lease_slot {
        lease.stop();
    }
    drop(rt);
    drop(kept);
    drop(entered);
    drop(lock);
    result
}

/// Standby, leader, standby, ... until a signal.
async fn run_phases(
    shared: &Shared<'_>,
    mut view: watch::Receiver<LeaseView>,
    signalled: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(signalled);
    let address = shared.addr.to_string();
    // The epoch of the last term: a term ends before the lease thread has heard of it, so
    // only a newer epoch starts the next one.
    let mut led = 0;
    loop {
        // A warm copy of the journal while standing by (none: a takeover replays it all).
        let tailer = tail::Tailer::start(shared.url.clone(), shared.config.ha_lease_ms)
            .map_err(|e| tracing::warn!("high availability: no journal tailer: {e}"))
            .ok();
        let standby = standby::serve(
            &shared.listener,
            &shared.ctx,
            &mut view,
            &shared.status,
            &address,
            led,
        );
        let epoch = tokio::select! {
            () = &mut signalled => return,
            epoch = standby => epoch,
        };
        led = epoch;
        match lead(shared, epoch, tailer, &mut view, &mut signalled).await {
            Ended::Signal => return,
            Ended::Fenced => shared.lease.resign(),
        }
    }
}

/// One leadership term of `epoch`.
async fn lead(
    shared: &Shared<'_>,
    epoch: u64,
    tailer: Option<tail::Tailer>,
    view: &mut watch::Receiver<LeaseView>,
    signalled: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Ended {
    let fenced = Arc::new(Notify::new());
    let opened = tokio::select! {
        () = signalled.as_mut() => return Ended::Signal,
        opened = open_journal(shared, epoch, tailer, fenced.clone()) => opened,
    };
    let (journal, replay) = match opened {
        Ok(j) => j,
        Err(e) => {
            tracing::error!("high availability: epoch {epoch}: cannot open the journal: {e}");
            return Ended::Fenced;
        }
    };
    let instance = handle::random_instance();
    tracing::info!(
        "high availability: leading with epoch {epoch} (instance {instance:016x}); replayed {} \
         packages ({} records) in {:.1} ms",
        replay.packages.len(),
        replay.records,
        replay.elapsed.as_secs_f64() * 1e3
    );
    let ctx = Arc::new(term_ctx(&shared.ctx, instance));
    let (term_tx, term_rx) = watch::channel(Arc::new(Status::default()));
    let facts = MasterFacts {
        address: shared.addr.to_string(),
        realtime: shared.config.realtime.enabled,
        fsync: "postgres".into(),
        connection_refusals: Some({
            let gate = ctx.gate.clone();
            CountsSource(Arc::new(move || gate.refusals()))
        }),
    };
    let scheduler = Scheduler::new(shared.config.core_config(), instance)
        .with_summary_every(shared.config.log_summary)
        .with_journal(journal, replay, FsyncPolicy::Always)
        .with_status(shared.config.metrics, facts, Some(term_tx));
    let forward = tokio::spawn(forward_status(
        term_rx,
        shared.status.clone(),
        epoch,
        shared.advertise.clone(),
    ));
    let (stop, stop_rx) = watch::channel(false);
    let (sched_tx, sched_rx) = mpsc::unbounded_channel();
    let fence_tx = sched_tx.clone();
    let server = tokio::spawn(crate::server::serve(
        shared.listener.clone(),
        ctx,
        scheduler,
        sched_tx,
        sched_rx,
        stop_rx,
    ));
    let ended = watch_term(epoch, view, &fenced, signalled).await;
    if let Some(why) = &ended {
        let mut now = view.borrow().clone();
        if now.leader.as_deref() == Some(&shared.advertise) {
            now.leader = None; // ourselves, as far as we knew: who leads now is unknown
        }
        let message = format!(
            "this master no longer leads ({why}); connect to the leader {}",
            now.leader_suffix()
        );
        tracing::warn!("high availability: {message}; closing every connection");
        let _ = fence_tx.send(ToScheduler::Fenced { message });
        // A standby from now on for `/leader` and `/readyz`, not once the term has wound down
        // (closing the journal may wait for the database): a front must not route here.
        forward.abort();
        let address = shared.addr.to_string();
        let standby = standby::standby_status(&address, &now);
        shared.status.send_replace(Arc::new(standby));
    }
    let _ = stop.send(true);
    let _ = server.await;
    forward.abort();
    match ended {
        None => Ended::Signal,
        Some(_) => Ended::Fenced,
    }
}

/// Waits for the end of the term of `epoch`: `None` on a signal, else why it must fence.
async fn watch_term(
    epoch: u64,
    view: &mut watch::Receiver<LeaseView>,
    fenced: &Notify,
    signalled: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Option<String> {
    let expired = || format!("the lease of epoch {epoch} was not renewed in time");
    let mut last_until: Option<Instant> = None;
    loop {
        let now = view.borrow_and_update().clone();
        if now.held != Some(epoch) {
            // Back from a freeze, the lease thread may report the lease taken before the
            // timer below fires: the term ran out by our own clock first, so say that.
            if last_until.is_some_and(|until| until <= Instant::now()) {
                return Some(expired());
            }
            return Some(format!("the lease of epoch {epoch} was lost"));
        }
        let until = now.valid_until.unwrap_or_else(Instant::now);
        last_until = Some(until);
        tokio::select! {
            () = signalled.as_mut() => return None,
            () = fenced.notified() => {
                // Back from a freeze, a write queued before it may be refused before the timer
                // below fires: the term ran out by our own clock first, so say that.
                if until <= Instant::now() {
                    return Some(expired());
                }
                return Some(format!("the database refused a journal write of epoch {epoch}"));
            }
            changed = view.changed() => {
                if changed.is_err() {
                    return Some("the lease thread ended".into());
                }
            }
            () = tokio::time::sleep_until(until.into()) => {
                // Not renewed in time by our own clock (frozen, or the database out of
                // reach): the database may already let another master take over.
                if view.borrow().valid_until == now.valid_until {
                    return Some(expired());
                }
            }
        }
    }
}

/// Opens the journal of `epoch` on a thread of its own (the client blocks on a runtime of its
/// own), from the standby's tailed copy when there is one (then it reads only the rows since
/// its last look); `fenced` is notified if the database refuses one of its writes.
async fn open_journal(
    shared: &Shared<'_>,
    epoch: u64,
    tailer: Option<tail::Tailer>,
    fenced: Arc<Notify>,
) -> Result<(Journal, Replay), JournalError> {
    let mut cfg = PgJournalConfig::new(shared.url.clone(), epoch, shared.config.ha_lease_ms);
    cfg.on_fenced = Arc::new(move |_| fenced.notify_one());
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("rtpool-journal-open".into())
        .spawn(move || {
            let warm = tailer.map(tail::Tailer::finish).unwrap_or_default();
            let opened = PgJournal::open_warm(cfg, warm);
            let _ = tx.send(opened.map(|(j, r)| (Journal::from(j), r)));
        })
        .map_err(|e| {
            JournalError::io("start a thread to open", std::path::Path::new("journal"), e)
        })?;
    rx.await.unwrap_or(Err(JournalError::Stopped))
}

/// Copies the scheduler's snapshots to the HTTP listener with the leader's role.
async fn forward_status(
    mut term: watch::Receiver<Arc<Status>>,
    out: Arc<watch::Sender<Arc<Status>>>,
    epoch: u64,
    advertise: String,
) {
    loop {
        let mut status = (**term.borrow_and_update()).clone();
        status.ha = Some(HaStatus {
            role: "leader",
            epoch,
            leader: Some(advertise.clone()),
            db_ok: true,
        });
        out.send_replace(Arc::new(status));
        if term.changed().await.is_err() {
            return;
        }
    }
}

/// The connection settings of one term: the process's, with the term's instance number.
fn term_ctx(base: &ConnCtx, instance: u64) -> ConnCtx {
    ConnCtx {
        auth: base.auth.clone(),
        max_frame_bytes: base.max_frame_bytes,
        heartbeat_ms: base.heartbeat_ms,
        idle_heartbeat_ms: base.idle_heartbeat_ms,
        handshake_timeout: base.handshake_timeout,
        lease_ms: base.lease_ms,
        instance,
        tls: base.tls.clone(),
        gate: base.gate.clone(),
        max_buffered_bytes: base.max_buffered_bytes,
        lease: base.lease,
        client_timeout: base.client_timeout,
    }
}

/// `--advertise`, else the listen address unless it is unspecified (`0.0.0.0`, `::`), else
/// this machine's hostname with the listen port.
pub fn advertise_address(config: &MasterConfig, addr: SocketAddr) -> String {
    if let Some(a) = &config.advertise {
        return a.clone();
    }
    if !addr.ip().is_unspecified() {
        return addr.to_string();
    }
    format!("{}:{}", hostname(), addr.port())
}

/// This machine's name as the kernel has it (`localhost` when it cannot be read).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests;
