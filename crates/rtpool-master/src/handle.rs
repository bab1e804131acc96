//! Running a master: [`MasterHandle`] embeds one in background threads (what `rtpool._native`
//! and `LocalCluster` use), [`run_blocking`] runs one in the foreground until a signal (what
//! `rtpool master` and the `rtpool-master` binary use).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

use crate::auth::{Authenticator, Tokens};
use crate::config::MasterConfig;
use crate::connection::gate::{Gate, Limits};
use crate::connection::ConnCtx;
use crate::data_dir::DataDirLock;
use crate::error::MasterError;
use crate::http::{self, HttpConfig, HttpServer};
use crate::journal::{Journal, JournalConfig};
use crate::realtime::Realtime;
use crate::scheduler::{Scheduler, ToScheduler};
use crate::server;
use crate::stats::MasterStats;
use crate::status::{CountsSource, Demand, MasterFacts, Status};
use crate::tls::{self, Tls};

/// A master running in a background thread. Dropping it stops the master.
pub struct MasterHandle {
    addr: SocketAddr,
    tokens: Tokens,
    tls_cert: Option<PathBuf>,
    stop: watch::Sender<bool>,
    sched: mpsc::UnboundedSender<ToScheduler>,
    thread: Option<JoinHandle<()>>,
    /// Kept so the store is closed here, after the runtime's thread ended: a PostgreSQL client
    /// blocks on a runtime of its own when it closes, which cannot run inside ours.
    ctx: Option<Arc<ConnCtx>>,
    realtime: Realtime,
    /// Held while the master runs: no second master on the same data dir.
    lock: Option<DataDirLock>,
    /// The HTTP listener, if any (stopped after the master).
    http: Option<HttpServer>,
}

/// The data dir's exclusive lock, taken before anything in the dir is read or written.
pub(crate) fn lock_data_dir(config: &MasterConfig) -> Result<Option<DataDirLock>, MasterError> {
    config
        .data_dir
        .as_deref()
        .map(DataDirLock::acquire)
        .transpose()
        .map_err(MasterError::from)
}

/// The HTTP listener's socket and settings, bound now so a bad `--http` fails at start-up;
/// `None` when off, or when the default address is taken (warned once).
pub(crate) fn bind_http(
    config: &MasterConfig,
    tls: Option<&Tls>,
) -> Result<Option<(std::net::TcpListener, HttpConfig)>, MasterError> {
    let Some(addr) = &config.http else {
        return Ok(None);
    };
    let http_config = HttpConfig {
        token: config.http_token.clone(),
        tls: tls.cloned(),
    };
    match http::bind(addr, &http_config) {
        Ok(listener) => Ok(Some((listener, http_config))),
        Err(MasterError::HttpBind { source, .. }) if config.http_is_default => {
            tracing::warn!(
                "HTTP listener off: the default address {addr} is taken ({source}); pass \
                 --http HOST:PORT for another one"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The scheduler's status settings, and the HTTP server reading its snapshots.
fn with_status(
    scheduler: Scheduler,
    config: &MasterConfig,
    gate: &Arc<Gate>,
    addr: SocketAddr,
    http: Option<(std::net::TcpListener, HttpConfig)>,
) -> Result<(Scheduler, Option<HttpServer>), MasterError> {
    let facts = MasterFacts {
        address: addr.to_string(),
        realtime: config.realtime.enabled,
        fsync: config.fsync.to_string(),
        connection_refusals: Some({
            let gate = gate.clone();
            CountsSource(Arc::new(move || gate.refusals()))
        }),
    };
    let Some((listener, http_config)) = http else {
        return Ok((scheduler.with_status(config.metrics, facts, None), None));
    };
    let (tx, rx) = watch::channel(Arc::new(Status::default()));
    // The first snapshot goes into the channel before the listener starts: its thread renders
    // what the channel holds when it starts, so it never serves the empty default.
    let demand = Arc::new(Demand::default());
    let scheduler = scheduler
        .with_status(config.metrics, facts, Some(tx))
        .with_status_demand(demand.clone());
    let server = HttpServer::start_on_demand(listener, http_config, rx, Some(demand))?;
    Ok((scheduler, Some(server)))
}

pub(crate) fn resolve_tokens(config: &MasterConfig) -> Result<(Tokens, bool), MasterError> {
    let (mut tokens, created) = match &config.data_dir {
        Some(dir) => Tokens::load_or_create(dir)?,
        None => (Tokens::generate(), true),
    };
    if let Some(t) = &config.client_token {
        tokens.client = t.clone();
    }
    if let Some(t) = &config.worker_token {
        tokens.worker = t.clone();
    }
    Ok((tokens, created))
}

/// The master's runtime: one thread, the caller's, which serves every connection and runs the
/// scheduler. In real-time mode the caller has entered it already ([`enter_realtime`]); the
/// blocking pool's threads (store look-ups) enter as they start.
pub(crate) fn build_runtime(realtime: &Realtime) -> Result<tokio::runtime::Runtime, MasterError> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    realtime.install(&mut builder);
    builder
        .enable_all()
        .build()
        .map_err(|e| MasterError::Runtime(e.to_string()))
}

/// Put the calling thread (the one that will run the runtime) in real-time mode and log one
/// line on what is in effect; the guard uncounts it.
pub(crate) fn enter_realtime(realtime: &Realtime) -> crate::realtime::ThreadGuard {
    let guard = realtime.enter_thread_guard();
    if realtime.is_enabled() {
        tracing::info!("real-time mode: {}", realtime.summary());
    }
    guard
}

/// Bind the peers' listener with a backlog sized for the connection limit (see
/// [`crate::listen`]).
pub(crate) async fn bind(listen: &str, limits: Limits) -> Result<TcpListener, MasterError> {
    crate::listen::bind(
        listen,
        crate::listen::listen_backlog(limits.max_connections),
    )
    .await
    .map_err(|source| MasterError::Bind {
        addr: listen.to_string(),
        source,
    })
}

/// Connection settings, with the data dir's store (if any) behind the authenticator.
pub(crate) fn conn_ctx(
    config: &MasterConfig,
    tokens: Tokens,
    tls: Option<Tls>,
    instance: u64,
) -> Result<Arc<ConnCtx>, MasterError> {
    let millis = |ms: u32| (ms > 0).then(|| Duration::from_millis(ms.into()));
    let store = match (&config.store, &config.data_dir) {
        (Some(url), Some(dir)) => Some(crate::store::open(Some(url), dir)?),
        (Some(url), None) => Some(crate::store::open(Some(url), &std::env::temp_dir())?),
        (None, Some(dir)) => Some(crate::store::open(None, dir)?),
        (None, None) => None,
    };
    Ok(Arc::new(ConnCtx {
        auth: Authenticator::new(tokens, store),
        max_frame_bytes: config.max_frame_bytes,
        heartbeat_ms: config.heartbeat_ms,
        idle_heartbeat_ms: config.idle_heartbeat_ms(),
        handshake_timeout: config.handshake_timeout,
        lease_ms: config.lease_ms,
        instance,
        tls,
        gate: Gate::new(admission_limits(config)),
        max_buffered_bytes: config.outbound_limit_bytes(),
        lease: millis(config.lease_ms),
        client_timeout: millis(config.client_timeout_ms),
    }))
}

/// The admission limits: the open-file limit raised to its hard limit first, since the default
/// connection limit derives from it.
fn admission_limits(config: &MasterConfig) -> Limits {
    let nofile = crate::fd_limit::raise_nofile();
    let max_connections = match (config.max_connections, nofile) {
        (0, Some(l)) => crate::fd_limit::default_max_connections(l.soft),
        (0, None) => 4096,
        (n, _) => n,
    };
    let limits = Limits::derive(
        max_connections,
        config.max_unauthenticated,
        config.max_unauthenticated_per_host,
        config.client_reserve,
    );
    tracing::info!(
        "connection limits: {} sessions ({} kept for clients), {} in handshake ({} per address, \
         {} ms each)",
        limits.max_connections,
        limits.client_reserve,
        limits.max_unauthenticated,
        limits.max_unauthenticated_per_host,
        config.handshake_timeout.as_millis()
    );
    if let Some(l) = nofile {
        let needed = (limits.max_connections + limits.max_unauthenticated) as u64 + 128;
        if needed > l.soft {
            tracing::warn!(
                "the open-file limit ({}) is below what these connection limits need (~{needed}); \
                 the master pauses accepting when it runs out",
                l.soft
            );
        }
    }
    limits
}

/// The scheduler, with the journal opened and replayed when there is a data dir.
fn scheduler(config: &MasterConfig, instance: u64) -> Result<Scheduler, MasterError> {
    let scheduler =
        Scheduler::new(config.core_config(), instance).with_summary_every(config.log_summary);
    let Some(dir) = config.data_dir.as_ref().filter(|_| config.journal) else {
        return Ok(scheduler);
    };
    let mut jc = JournalConfig::new(dir.join("journal.log"));
    jc.policy = config.fsync;
    jc.compact_bytes_per_s = u64::from(config.journal_compact_mb_per_s) * 1_000_000;
    let (journal, replay) = Journal::open(jc)?;
    let secs = replay.elapsed.as_secs_f64();
    tracing::info!(
        records = replay.records,
        bytes = replay.bytes,
        packages = replay.packages.len(),
        "journal {} replayed in {:.1} ms ({:.0} records/s), fsync {}",
        journal.path().display(),
        secs * 1e3,
        replay.records as f64 / secs.max(1e-9),
        config.fsync
    );
    if let Some((offset, cut)) = replay.truncated_tail {
        tracing::warn!("journal had a torn tail: cut {cut} bytes at offset {offset}");
    }
    Ok(scheduler.with_journal(journal, replay, config.fsync))
}

/// A random number naming this master process (`WELCOME.instance`).
pub(crate) fn random_instance() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ u64::from(std::process::id());
    }
    u64::from_le_bytes(bytes)
}

impl MasterHandle {
    /// Bind and start serving in a new thread; returns once the master accepts connections.
    ///
    /// # Errors
    /// When the configuration is invalid, the address cannot be bound or the data dir cannot
    /// be used.
    pub fn start(config: MasterConfig) -> Result<Self, MasterError> {
        config.validate()?;
        let mut lock = lock_data_dir(&config)?;
        let (tokens, _) = resolve_tokens(&config)?;
        let tls = tls::from_config(&config)?;
        let tls_cert = tls.as_ref().map(|t| t.cert_path.clone());
        let instance = random_instance();
        let ctx = conn_ctx(&config, tokens.clone(), tls, instance)?;
        let limits = ctx.gate.limits();
        let kept = ctx.clone();
        let scheduler = scheduler(&config, instance)?;
        let http_socket = bind_http(&config, ctx.tls.as_ref())?;
        let realtime = Realtime::start(&config.realtime);
        let kept_realtime = realtime.clone();
        let (stop, stop_rx) = watch::channel(false);
        let (sched_tx, sched_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sched = sched_tx.clone();
        let thread = std::thread::Builder::new()
            .name("rtpool-master".into())
            .spawn(move || {
                let _realtime = enter_realtime(&realtime);
                let rt = match build_runtime(&realtime) {
                    Ok(rt) => rt,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                rt.block_on(async move {
                    let listener = match bind(&config.listen, limits).await {
                        Ok(l) => l,
                        Err(e) => return drop(ready_tx.send(Err(e))),
                    };
                    let addr = listener
                        .local_addr()
                        .expect("a bound listener has an address");
                    let (scheduler, http) =
                        match with_status(scheduler, &config, &ctx.gate, addr, http_socket) {
                            Ok(s) => s,
                            Err(e) => return drop(ready_tx.send(Err(e))),
                        };
                    let _ = ready_tx.send(Ok((addr, http)));
                    server::serve(
                        Arc::new(listener),
                        ctx,
                        scheduler,
                        sched_tx,
                        sched_rx,
                        stop_rx,
                    )
                    .await;
                });
            })
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        let (addr, http) = ready_rx
            .recv()
            .map_err(|_| MasterError::Runtime("master thread died during start-up".into()))??;
        if let Some(lock) = &mut lock {
            lock.set_address(addr);
        }
        Ok(Self {
            addr,
            tokens,
            tls_cert,
            stop,
            sched,
            thread: Some(thread),
            ctx: Some(kept),
            realtime: kept_realtime,
            lock,
            http,
        })
    }

    /// The HTTP listener's address, `None` without one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(HttpServer::addr)
    }

    /// The dashboard's URL (`http://HOST:PORT/`, `https://` with TLS), `None` without HTTP.
    pub fn dashboard_url(&self) -> Option<String> {
        self.http.as_ref().map(HttpServer::url)
    }

    /// The address the master listens on (with the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The tokens peers must present.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The certificate the master serves TLS with (clients of a self-signed master use it as
    /// their CA file); `None` for plain TCP.
    pub fn tls_cert(&self) -> Option<&Path> {
        self.tls_cert.as_deref()
    }

    /// Current gauges, or `None` once the master stopped. Blocks briefly; call it from outside
    /// the master's runtime.
    pub fn stats(&self) -> Option<MasterStats> {
        let (tx, rx) = oneshot::channel();
        self.sched.send(ToScheduler::Stats(tx)).ok()?;
        let mut stats = rx.blocking_recv().ok()?;
        stats.realtime = self.realtime.is_enabled().then(|| self.realtime.report());
        Some(stats)
    }

    /// Stop serving: tell every peer, close every connection, join the thread. Idempotent.
    pub fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.ctx = None;
        if let Some(mut http) = self.http.take() {
            http.stop();
        }
        // Lets go of the memory lock (the process's last real-time master unlocks it): a
        // stopped handle may be kept around, by Python's `Master` for one.
        self.realtime = Realtime::disabled();
        // A stopped handle may be kept around: let another master use the data dir.
        self.lock = None;
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run a master in the current thread until SIGINT or SIGTERM, printing its tokens on first
/// start and then one `listening on ADDR` line (flushed) once it accepts connections.
///
/// In real-time mode the current thread runs under `SCHED_FIFO` (and pinned) from then on,
/// also after this returns: a thread cannot safely be given back its old policy by the safe
/// API we use, and the thread of a command-line master is about to exit anyway.
///
/// # Errors
/// When the configuration is invalid, the address cannot be bound or the data dir cannot be
/// used.
pub fn run_blocking(config: MasterConfig) -> Result<(), MasterError> {
    config.validate()?;
    let mut lock = lock_data_dir(&config)?;
    let (tokens, created) = resolve_tokens(&config)?;
    let tls = tls::from_config(&config)?;
    // The store and the journal open before the runtime starts: a PostgreSQL client blocks on
    // a runtime of its own, which cannot start inside ours.
    let instance = random_instance();
    let ctx = conn_ctx(&config, tokens.clone(), tls, instance)?;
    let limits = ctx.gate.limits();
    let kept = ctx.clone();
    let scheduler = scheduler(&config, instance)?;
    let http_socket = bind_http(&config, ctx.tls.as_ref())?;
    // After the journal's writer thread started: it must not inherit the policy (see
    // `realtime`).
    let realtime = Realtime::start(&config.realtime);
    let entered = enter_realtime(&realtime);
    let rt = build_runtime(&realtime)?;
    let lock_slot = &mut lock;
    let result = rt.block_on(async move {
        let listener = bind(&config.listen, limits).await?;
        let addr = listener
            .local_addr()
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        if let Some(lock) = lock_slot {
            lock.set_address(addr);
        }
        // Before "listening on": a supervisor that signals the master right after that line
        // gets a graceful shutdown, not the signal's default action.
        let signalled = signals();
        let (scheduler, http) = with_status(scheduler, &config, &ctx.gate, addr, http_socket)?;
        announce(
            &config,
            &tokens,
            created,
            addr,
            ctx.tls.as_ref(),
            http.as_ref(),
        );
        let (stop, stop_rx) = watch::channel(false);
        let (sched_tx, sched_rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(server::serve(
            Arc::new(listener),
            ctx,
            scheduler,
            sched_tx,
            sched_rx,
            stop_rx,
        ));
        signalled.await;
        tracing::info!("signal received, shutting down");
        let _ = stop.send(true);
        let _ = server.await;
        drop(http);
        Ok(())
    });
    // The runtime first, then the store (see `MasterHandle::ctx`).
    drop(rt);
    drop(kept);
    drop(entered);
    // Last: the journal and the store are closed.
    drop(lock);
    result
}

pub(crate) fn announce(
    config: &MasterConfig,
    tokens: &Tokens,
    created: bool,
    addr: SocketAddr,
    tls: Option<&Tls>,
    http: Option<&HttpServer>,
) {
    let mut out = std::io::stdout().lock();
    if let Some(dir) = &config.data_dir {
        if created {
            let _ = writeln!(out, "first start: generated tokens in {}", dir.display());
            let _ = writeln!(out, "client token: {}", tokens.client);
            let _ = writeln!(out, "worker token: {}", tokens.worker);
        } else {
            let _ = writeln!(
                out,
                "tokens: {}/client.token and worker.token",
                dir.display()
            );
        }
    } else {
        let _ = writeln!(out, "client token: {}", tokens.client);
        let _ = writeln!(out, "worker token: {}", tokens.worker);
    }
    match tls {
        Some(tls) if tls.self_signed => {
            let _ = writeln!(
                out,
                "TLS certificate (self-signed; clients use it as CA file): {}",
                tls.cert_path.display()
            );
        }
        Some(tls) => {
            let _ = writeln!(out, "TLS certificate: {}", tls.cert_path.display());
        }
        None if !addr.ip().is_loopback() => {
            tracing::warn!(
                "listening on a non-loopback address {addr} without TLS: use --tls-cert/--tls-key \
                 or --tls-self-signed, or a trusted network"
            );
        }
        None => {}
    }
    if let Some(http) = http {
        // Before "listening on": whoever waits for that line can read this one already.
        let _ = writeln!(out, "dashboard on {}", http.url());
    }
    let _ = writeln!(out, "listening on {addr}");
    let _ = out.flush();
}

/// Installs the SIGINT and SIGTERM handlers now and returns a future that completes at the
/// first of them (SIGINT is Ctrl-C: the same graceful shutdown as SIGTERM).
#[cfg(unix)]
pub(crate) fn signals() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("cannot install a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("cannot install a SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}

#[cfg(not(unix))]
pub(crate) fn signals() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
