//! The master's HTTP listener (`--http`): the dashboard page, Prometheus metrics, the status
//! snapshot as JSON and as server-sent events.
//!
//! | route          | answer                                                          |
//! |----------------|-----------------------------------------------------------------|
//! | `GET /`        | the dashboard page (`assets/dashboard.html`, compiled in)       |
//! | `GET /metrics` | Prometheus text format ([`metrics`])                            |
//! | `GET /api/status` | the latest [`Status`] snapshot as JSON                       |
//! | `GET /api/events` | `event: status` with the same JSON, about once a second      |
//! | `GET /healthz` | `ok`                                                            |
//! | `GET /readyz`  | 200, or 503 for an `--ha` standby that cannot reach its database |
//! | `GET /leader`  | 200 on the master that serves (leader or single), else 503      |
//!
//! It runs on a thread of its own with its own one-thread runtime, not on the master's: the
//! master's runtime is the scheduler's thread, and rendering pages there would delay tasks.
//! The scheduler publishes one snapshot a second through a `watch` channel; a task here
//! renders its JSON once and every reader (status requests, every event stream) shares it.
//! Nothing here can make the scheduler wait. Given a [`Demand`] (a single master), the
//! scheduler builds a snapshot only when a reader asked for one: a request finding the latest
//! older than [`STALE_AFTER`] waits for the next (at most about a second), an open event
//! stream asks for each, and an unwatched master builds and renders none.
//!
//! Beyond loopback the listener needs TLS (the main port's certificate, so it serves HTTPS)
//! or a token (`--http-token`): [`check_exposure`].

pub mod metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, info, warn};

use crate::error::MasterError;
use crate::status::{Demand, Status};
use crate::tls::Tls;

/// The page served at `/`.
const DASHBOARD: &str = include_str!("../../assets/dashboard.html");

/// HTTP connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 256;

/// Event streams open at once; more get 503.
const MAX_SUBSCRIBERS: usize = 64;

/// An event stream that fell this many snapshots behind (its reader does not keep up) is
/// closed: a slow reader costs neither memory nor the others' updates.
const MAX_SKIPPED: u64 = 5;

/// A snapshot older than this is not served as it is when the scheduler builds on demand: the
/// request asks for a fresh one and waits for it (the scheduler's status tick is 1 s).
const STALE_AFTER: Duration = Duration::from_millis(1500);

/// How long a request waits for the snapshot it asked for before it takes the latest there is
/// (a scheduler busy with a burst may be late; the answer is then older, never missing).
const FRESH_WAIT: Duration = Duration::from_secs(3);

/// A request's headers must arrive within this time.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP listener's settings.
#[derive(Clone)]
pub struct HttpConfig {
    /// Bearer token every route but `/healthz` requires, if any.
    pub token: Option<String>,
    /// Serve HTTPS with the main port's certificate.
    pub tls: Option<Tls>,
}

/// One rendered snapshot, shared by every reader.
#[derive(Debug, Clone)]
struct Rendered {
    /// Snapshots rendered so far; an event stream compares it with the last one it sent.
    seq: u64,
    status: Arc<Status>,
    json: Arc<str>,
    /// When it was rendered (its snapshot was published just before).
    at: std::time::Instant,
}

#[derive(Clone)]
struct AppState {
    rendered: watch::Receiver<Rendered>,
    token: Option<Arc<str>>,
    subscribers: Arc<AtomicUsize>,
    /// Where readers ask the scheduler for a snapshot; `None`: it publishes one a second.
    demand: Option<Arc<Demand>>,
}

impl AppState {
    /// The latest rendering, after asking for a fresh one when the scheduler builds on demand
    /// and waiting for it (up to [`FRESH_WAIT`]) when the latest is older than
    /// [`STALE_AFTER`].
    async fn fresh(&self) -> Rendered {
        if let Some(demand) = &self.demand {
            demand.want();
            let mut rx = self.rendered.clone();
            let stale = rx.borrow_and_update().at.elapsed() > STALE_AFTER;
            if stale {
                let _ = tokio::time::timeout(FRESH_WAIT, rx.changed()).await;
            }
        }
        self.rendered.borrow().clone()
    }
}

/// Refuses an address beyond loopback unless there is TLS or a token.
///
/// # Errors
///
/// [`MasterError::HttpExposed`] naming the address and what to add.
pub fn check_exposure(addr: SocketAddr, config: &HttpConfig) -> Result<(), MasterError> {
    if addr.ip().is_loopback() || config.tls.is_some() || config.token.is_some() {
        return Ok(());
    }
    Err(MasterError::HttpExposed {
        addr: addr.to_string(),
    })
}

/// Binds `addr` (std, so a failure shows at start-up) and checks it against [`check_exposure`].
///
/// # Errors
///
/// [`MasterError::HttpBind`] or [`MasterError::HttpExposed`].
pub fn bind(addr: &str, config: &HttpConfig) -> Result<std::net::TcpListener, MasterError> {
    let bind_error = |source| MasterError::HttpBind {
        addr: addr.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    // Named as asked (`0.0.0.0:0`), not as bound.
    check_exposure(local, config).map_err(|_| MasterError::HttpExposed {
        addr: addr.to_string(),
    })?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    Ok(listener)
}

/// The running listener: dropping it stops it.
pub struct HttpServer {
    addr: SocketAddr,
    tls: bool,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `listener` on a new thread from the snapshots `status` receives.
    ///
    /// # Errors
    ///
    /// When the thread or its runtime cannot be started.
    pub fn start(
        listener: std::net::TcpListener,
        config: HttpConfig,
        status: watch::Receiver<Arc<Status>>,
    ) -> Result<Self, MasterError> {
        Self::start_on_demand(listener, config, status, None)
    }

    /// As [`HttpServer::start`], for a scheduler that publishes a snapshot only when `demand`
    /// says a reader wants one (the listener asks on each request that reads it).
    ///
    /// # Errors
    ///
    /// When the thread or its runtime cannot be started.
    pub fn start_on_demand(
        listener: std::net::TcpListener,
        config: HttpConfig,
        status: watch::Receiver<Arc<Status>>,
        demand: Option<Arc<Demand>>,
    ) -> Result<Self, MasterError> {
        let addr = listener
            .local_addr()
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        let tls = config.tls.is_some();
        let (stop, stop_rx) = watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        let thread = std::thread::Builder::new()
            .name("rtpool-http".into())
            .spawn(move || rt.block_on(serve(listener, config, status, demand, stop_rx)))
            .map_err(|e| MasterError::Runtime(e.to_string()))?;
        Ok(Self {
            addr,
            tls,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The dashboard's URL (`http://` or `https://`); a wildcard address (`0.0.0.0`, `::`)
    /// is given as loopback, where this machine reaches it.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        format!("{scheme}://{addr}/")
    }

    /// Stops serving and joins the thread. Idempotent.
    pub fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    config: HttpConfig,
    status: watch::Receiver<Arc<Status>>,
    demand: Option<Arc<Demand>>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return warn!("HTTP listener failed: {e}"),
    };
    // The first rendering now, so no reader ever sees an empty one.
    let (rendered_tx, rendered) = watch::channel(render(&status.borrow(), 1));
    tokio::spawn(render_loop(status, rendered_tx));
    let state = AppState {
        rendered,
        token: config.token.as_deref().map(Arc::from),
        subscribers: Arc::new(AtomicUsize::new(0)),
        demand,
    };
    let app = router(state);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("never closed"),
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let tls = config.tls.clone();
        let mut conn_stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let result = match tls {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        r = conn => r,
                        _ = conn_stop.wait_for(|s| *s) => Ok(()),
                    }
                }
                Some(tls) => {
                    let accept = tls.acceptor.accept(stream);
                    let Ok(Ok(stream)) = tokio::time::timeout(HEADER_TIMEOUT, accept).await else {
                        return debug!(%peer, "HTTPS handshake failed");
                    };
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        r = conn => r,
                        _ = conn_stop.wait_for(|s| *s) => Ok(()),
                    }
                }
            };
            if let Err(e) = result {
                debug!(%peer, "HTTP connection ended: {e}");
            }
        });
    }
    info!("HTTP listener stopped");
}

/// Renders each new snapshot's JSON once, for every reader.
async fn render_loop(mut status: watch::Receiver<Arc<Status>>, tx: watch::Sender<Rendered>) {
    let mut seq = 1;
    while status.changed().await.is_ok() {
        seq += 1;
        let rendered = render(&status.borrow_and_update(), seq);
        tx.send_replace(rendered);
    }
}

fn render(snapshot: &Arc<Status>, seq: u64) -> Rendered {
    // Serializing plain structs of numbers and strings cannot fail.
    let json = serde_json::to_string(&**snapshot).unwrap_or_else(|_| "{}".into());
    Rendered {
        seq,
        status: snapshot.clone(),
        json: Arc::from(json),
        at: std::time::Instant::now(),
    }
}

fn router(state: AppState) -> Router {
    let guarded = Router::new()
        .route("/", get(|| async { Html(DASHBOARD) }))
        .route("/metrics", get(metrics_route))
        .route("/api/status", get(status_route))
        .route("/api/events", get(events_route))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_route))
        .route("/leader", get(leader_route))
        .merge(guarded)
        .with_state(state)
}

/// With `--http-token`, a request needs `Authorization: Bearer TOKEN` or `?token=TOKEN` (the
/// page's event stream cannot set headers).
async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(req).await;
    };
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let from_query = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
    let given = from_header.or(from_query).unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this master's HTTP listener needs its token: Authorization: Bearer TOKEN (or ?token=TOKEN)\n",
    )
        .into_response()
}

/// Readiness for a load balancer: 200 for a single master, a leader, or a standby that can
/// reach its database (it could take over); 503 for a standby that cannot.
async fn readyz_route(State(state): State<AppState>) -> Response {
    let status = state.rendered.borrow().status.clone();
    match &status.ha {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(ha) if ha.is_leader() || ha.db_ok => {
            (StatusCode::OK, format!("ready: {}\n", ha.role)).into_response()
        }
        Some(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "standby: cannot reach its --ha database\n",
        )
            .into_response(),
    }
}

/// 200 only on the master that serves (a leader, or a single master): what a Kubernetes
/// Service's readiness probe points at to reach the leader.
async fn leader_route(State(state): State<AppState>) -> Response {
    let status = state.rendered.borrow().status.clone();
    match &status.ha {
        None => (StatusCode::OK, "leader (single master)\n").into_response(),
        Some(ha) if ha.is_leader() => {
            (StatusCode::OK, format!("leader, epoch {}\n", ha.epoch)).into_response()
        }
        Some(ha) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "standby (leader: {})\n",
                ha.leader.as_deref().unwrap_or("unknown")
            ),
        )
            .into_response(),
    }
}

async fn status_route(State(state): State<AppState>) -> Response {
    let json = state.fresh().await.json;
    (
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
        .into_response()
}

async fn metrics_route(State(state): State<AppState>) -> Response {
    let status = state.fresh().await.status;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&status),
    )
        .into_response()
}

/// Counts an open event stream; uncounts it when dropped.
struct Subscriber(Arc<AtomicUsize>);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn events_route(State(state): State<AppState>) -> Response {
    if state.subscribers.fetch_add(1, Ordering::Relaxed) >= MAX_SUBSCRIBERS {
        state.subscribers.fetch_sub(1, Ordering::Relaxed);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many event streams open (at most {MAX_SUBSCRIBERS}); poll /api/status instead\n"),
        )
            .into_response();
    }
    let guard = Subscriber(state.subscribers.clone());
    let mut rx = state.rendered.clone();
    // The current snapshot first, then each new one.
    rx.mark_changed();
    let demand = state.demand.clone();
    let stream = futures_util::stream::unfold((rx, 0u64, guard), move |(mut rx, last, guard)| {
        let demand = demand.clone();
        async move {
            // Ask for the next one: a stream open is a reader of every snapshot.
            if let Some(demand) = &demand {
                demand.want();
            }
            rx.changed().await.ok()?;
            let r = rx.borrow_and_update().clone();
            if last > 0 && r.seq > last + MAX_SKIPPED {
                debug!(
                    "event stream fell {} snapshots behind: closed",
                    r.seq - last
                );
                return None;
            }
            let event = Event::default().event("status").data(&*r.json);
            Some((Ok::<_, Infallible>(event), (rx, r.seq, guard)))
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
