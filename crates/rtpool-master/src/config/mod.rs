//! [`MasterConfig`]: every knob of the master, each with a sane default, and the checks of the
//! knobs that have a valid range ([`MasterConfig::validate`]).
//!
//! The front ends fill it from one definition of the options: [`args::MasterArgs`] is the
//! command line of both the `rtpool-master` binary and `rtpool master`, and [`options`] reads
//! an embedded master's options dict with the same parser.

pub mod args;
pub mod logging;
pub mod options;
mod parse;

use std::path::PathBuf;
use std::time::Duration;

use crate::error::MasterError;

/// Default of [`MasterConfig::hedge_factor`].
pub const DEFAULT_HEDGE_FACTOR: f64 = 1.5;

/// Default of [`MasterConfig::log_summary`].
pub const DEFAULT_LOG_SUMMARY: Duration = Duration::from_secs(60);

/// Default of [`MasterConfig::service_grace`], in seconds.
pub const DEFAULT_SERVICE_GRACE_SECS: u64 = 30;

/// The leader lease of `--ha` when none is given, milliseconds.
pub const DEFAULT_HA_LEASE_MS: u32 = 1000;

/// Configuration of one master.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    /// Address to listen on; loopback unless told otherwise (default `127.0.0.1:7070`).
    pub listen: String,
    /// Where tokens (and, later, the journal and store) live. `None`: nothing on disk, tokens
    /// from [`MasterConfig::client_token`]/[`MasterConfig::worker_token`] or generated.
    pub data_dir: Option<PathBuf>,
    /// Fixed client token; generated (or read from the data dir) when `None`.
    pub client_token: Option<String>,
    /// Fixed worker token; generated (or read from the data dir) when `None`.
    pub worker_token: Option<String>,
    /// Largest frame body after authentication (default 256 MiB).
    pub max_frame_bytes: usize,
    /// How often idle workers send heartbeats (default 1000 ms).
    pub heartbeat_ms: u32,
    /// How often a worker that holds no task heartbeats (`--idle-heartbeat-ms`); `None`: every
    /// 3 leases (9000 ms by default); 0: every `heartbeat_ms`, like a busy one.
    pub idle_heartbeat: Option<u32>,
    /// A peer must complete its handshake (TLS included) within this time (default 3 s).
    pub handshake_timeout: Duration,
    /// A worker that sent nothing for this long is closed with `ERROR lease_expired` and its
    /// tasks requeued (default 3000 ms; 0: never).
    pub lease_ms: u32,
    /// User store: `None` = SQLite in the data dir (when there is one), or `sqlite:///path`,
    /// or `postgres://user@host:port/db`.
    pub store: Option<String>,
    /// High availability: the PostgreSQL database holding the leader lease and the journal
    /// (`--ha`); `None`: a single master with its journal in the data dir.
    pub ha: Option<String>,
    /// With [`MasterConfig::ha`]: the address peers should use for this master; `None`: the
    /// listen address, or the hostname and its port when it listens on every interface.
    pub advertise: Option<String>,
    /// With [`MasterConfig::ha`]: the leader lease in milliseconds (default 1000).
    pub ha_lease_ms: u32,
    /// How long a disconnected client's packages keep running and keep their results
    /// (default 300 s).
    pub result_ttl: Duration,
    /// A task whose worker was lost on this many attempts fails as a poison task (default 3).
    pub max_attempts: u32,
    /// Straggler hedging: a task of a package with `hedge` gets a backup copy once it has run
    /// this many times its function's p95 execution time (default 1.5; must be above 1, see
    /// [`check_hedge_factor`]).
    pub hedge_factor: f64,
    /// Longest any task may run; zero = no limit (default 24 h).
    pub max_task_time: Duration,
    /// Overload: the share of the window's deadline results that missed, with tasks waiting,
    /// past which the master says it is overloaded (default 0.05; 0 = never; 0-1).
    pub overload_miss_ratio: f64,
    /// Overload: the window of deadline results judged (default 10 s).
    pub overload_window: Duration,
    /// Admission control for every package with a deadline (default false: only for those
    /// submitted with `admit=True`).
    pub admit_deadlines: bool,
    /// How long past a task's own time limit the master waits for the worker's report before
    /// failing the task itself (default 2 s).
    pub timeout_grace: Duration,
    /// Grid RPC: how long calls queued for a function whose last server left wait for a
    /// server to return before they fail (default 30 s).
    pub service_grace: Duration,
    /// Keep the crash-recovery journal `<data_dir>/journal.log` (default true; needs a data
    /// dir).
    pub journal: bool,
    /// When the journal is fsynced (default `batch` with a 10 ms window).
    pub fsync: crate::journal::FsyncPolicy,
    /// Pace of a journal compaction's writes, MB/s (0: as fast as the disk goes).
    pub journal_compact_mb_per_s: u32,
    /// PEM certificate chain to serve TLS with (with [`MasterConfig::tls_key`]); plain TCP
    /// when neither is set and [`MasterConfig::tls_self_signed`] is false.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of [`MasterConfig::tls_cert`].
    pub tls_key: Option<PathBuf>,
    /// Serve TLS with a self-signed certificate for localhost, 127.0.0.1, ::1 and the listen
    /// host, generated on first start into `<data_dir>/tls/{cert.pem,key.pem}` (needs
    /// [`MasterConfig::data_dir`]).
    pub tls_self_signed: bool,
    /// Authenticated connections (clients and workers) served at once; the next one gets
    /// `ERROR busy`. 0 (the default): derived from the open-file limit the master raised at
    /// start, see [`crate::fd_limit::default_max_connections`] (784 at a limit of 1,024).
    pub max_connections: usize,
    /// Connections in their handshake at once; `None`: `max_connections / 8` within 16..=1024
    /// (see [`crate::connection::gate::Limits::derive`]).
    pub max_unauthenticated: Option<usize>,
    /// Connections in their handshake at once from one IP address; `None`: a quarter of
    /// `max_unauthenticated`, at least 4.
    pub max_unauthenticated_per_host: Option<usize>,
    /// Places of `max_connections` workers cannot take, kept for clients; `None`: 16, at most
    /// a quarter of `max_connections`.
    pub client_reserve: Option<usize>,
    /// Bytes of outbound frames a connection may have waiting for its peer to read them;
    /// beyond that it is closed with `ERROR slow_consumer`. `None`: one frame of the largest
    /// size (`max_frame_bytes`) plus [`BUFFERED_BEHIND_BYTES`]; an explicit value must be at
    /// least `max_frame_bytes`, or the peer a maximum frame is sent to would be closed. Read
    /// it with [`MasterConfig::outbound_limit_bytes`].
    pub max_buffered_bytes: Option<usize>,
    /// A client that sent nothing for this long is closed with `ERROR idle` (default
    /// 30000 ms; 0: never).
    pub client_timeout_ms: u32,
    /// Most tasks one user may have queued or running at once (default 1,048,576; 0: no
    /// limit); past it a submission gets `ERROR queue_limit`.
    pub max_queued_tasks_per_user: u64,
    /// Most argument bytes one user's queued and running tasks may hold (default 1 GiB; 0: no
    /// limit); past it a submission gets `ERROR queue_limit`.
    pub max_queued_bytes_per_user: u64,
    /// Result bytes one client connection may leave unacknowledged (default 256 MiB; 0: no
    /// limit); past it the connection is closed with `ERROR unacked_limit`.
    pub max_unacked_bytes_per_client: u64,
    /// Results one client connection may leave unacknowledged (default 1,048,576; 0: no
    /// limit); same rule.
    pub max_unacked_results_per_client: u64,
    /// Real-time mode: memory locked, `SCHED_FIFO` and optional CPU pinning of the serving
    /// threads, each as far as the OS permits (default off).
    pub realtime: crate::realtime::RealtimeConfig,
    /// How often the master logs its one-line summary at info, when something happened
    /// (default 60 s; zero: never).
    pub log_summary: Duration,
    /// The HTTP listener's address (dashboard, `/metrics`, `/api/status`, `/api/events`);
    /// `None`: no listener (the default of an embedded master; the command line's is
    /// [`DEFAULT_HTTP`]).
    pub http: Option<String>,
    /// `http` is the command line's default rather than an address asked for: when it is
    /// taken, the master warns once and runs without HTTP instead of failing.
    pub http_is_default: bool,
    /// Bearer token the HTTP listener requires (all routes but `/healthz`); needed beyond
    /// loopback unless the master serves TLS.
    pub http_token: Option<String>,
    /// Count metrics (latency histograms, per-worker and per-user counts) on the scheduler
    /// thread (default true). Off, the status snapshot still has the core's gauges.
    pub metrics: bool,
}

/// The HTTP listener's address of a command-line master unless `--http` says otherwise.
pub const DEFAULT_HTTP: &str = "127.0.0.1:7071";

impl MasterConfig {
    /// The core's tunables from this configuration.
    pub fn core_config(&self) -> rtpool_core::CoreConfig {
        rtpool_core::CoreConfig {
            max_attempts: self.max_attempts.max(1),
            timeout_grace_ns: self.timeout_grace.as_nanos().min(u64::MAX as u128) as u64,
            max_exec_ns: self.max_task_time.as_nanos().min(u64::MAX as u128) as u64,
            result_ttl_ns: self.result_ttl.as_nanos().min(u64::MAX as u128) as u64,
            hedge_factor: self.hedge_factor,
            service_grace_ns: self.service_grace.as_nanos().min(u64::MAX as u128) as u64,
            max_queued_tasks_per_user: self.max_queued_tasks_per_user,
            max_queued_bytes_per_user: self.max_queued_bytes_per_user,
            max_unacked_bytes_per_client: self.max_unacked_bytes_per_client,
            max_unacked_results_per_client: self.max_unacked_results_per_client,
            overload_miss_ratio: self.overload_miss_ratio,
            overload_window_ns: self.overload_window.as_nanos().min(u64::MAX as u128) as u64,
            admit_deadlines: self.admit_deadlines,
            ..rtpool_core::CoreConfig::default()
        }
    }

    /// Checks the knobs that have a valid range.
    ///
    /// # Errors
    ///
    /// [`MasterError::InvalidConfig`] naming the first knob out of range and why.
    pub fn validate(&self) -> Result<(), MasterError> {
        check_hedge_factor(self.hedge_factor).map_err(|reason| MasterError::InvalidConfig {
            option: "hedge factor",
            reason,
        })?;
        // Protocol version 2 reads a prefix with its top bit set as a segmented frame.
        if self.max_frame_bytes > MAX_FRAME_LIMIT {
            return Err(MasterError::InvalidConfig {
                option: "max frame mb",
                reason: format!(
                    "must be at most {} MiB (frames are announced in 31 bits), not {} MiB",
                    MAX_FRAME_LIMIT >> 20,
                    self.max_frame_bytes >> 20
                ),
            });
        }
        if let Some(limit) = self.max_buffered_bytes {
            if limit < self.max_frame_bytes {
                return Err(MasterError::InvalidConfig {
                    option: "max buffered mb",
                    reason: format!(
                        "must be at least the frame limit ({} MiB, --max-frame-mb), not {} \
                         MiB: a peer sent one frame of the largest size would be closed as a \
                         slow consumer",
                        self.max_frame_bytes >> 20,
                        limit >> 20
                    ),
                });
            }
        }
        check_miss_ratio(self.overload_miss_ratio).map_err(|reason| {
            MasterError::InvalidConfig {
                option: "overload miss ratio",
                reason,
            }
        })?;
        Ok(())
    }
}

/// Bytes that may wait behind one maximum frame for a peer, by default (64 MiB).
pub const BUFFERED_BEHIND_BYTES: usize = 64 << 20;

impl MasterConfig {
    /// How often a worker that holds no task heartbeats, announced in `WELCOME`: the
    /// `--idle-heartbeat-ms` given, else 3 leases; 0 (as often as a busy worker) without a
    /// lease or when it would not be slower than `heartbeat_ms`.
    pub fn idle_heartbeat_ms(&self) -> u32 {
        let idle = self
            .idle_heartbeat
            .unwrap_or_else(|| self.lease_ms.saturating_mul(3));
        if self.lease_ms == 0 || idle <= self.heartbeat_ms {
            0
        } else {
            idle
        }
    }

    /// Outbound bytes one connection may have waiting (`max_buffered_bytes`, or by default
    /// one maximum frame plus [`BUFFERED_BEHIND_BYTES`]).
    pub fn outbound_limit_bytes(&self) -> usize {
        self.max_buffered_bytes
            .unwrap_or(self.max_frame_bytes.saturating_add(BUFFERED_BEHIND_BYTES))
    }
}

/// Largest `max_frame_bytes` allowed: 2 GiB - 1 MiB (a frame's length fields have 31 bits).
pub const MAX_FRAME_LIMIT: usize = (2048 - 1) << 20;

/// Checks `--overload-miss-ratio`: a share from 0 (never overloaded) to 1.
///
/// # Errors
///
/// Why `value` is not a number from 0 to 1.
pub fn check_miss_ratio(value: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!(
            "must be a share from 0 to 1 of the deadline results that missed (0 = never \
             overloaded; default 0.05), not {value}"
        ))
    }
}

/// Checks a hedge factor, for [`MasterConfig::validate`] and for the front ends that want to
/// refuse a bad value as soon as they read it (`--hedge-factor`, `options={"hedge_factor":}`).
///
/// # Errors
///
/// Why `value` is not a finite number above 1. At 1 or below, every hedged task would get a
/// backup copy as soon as it reached its function's typical time: twice the work for nothing.
pub fn check_hedge_factor(value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "must be a number above 1 (a hedged task gets a backup copy once it has run that \
             many times its function's p95 execution time; default {DEFAULT_HEDGE_FACTOR}), \
             not {value}"
        ))
    }
}

impl Default for MasterConfig {
    fn default() -> Self {
        let core = rtpool_core::CoreConfig::default();
        Self {
            listen: "127.0.0.1:7070".into(),
            data_dir: None,
            client_token: None,
            worker_token: None,
            max_frame_bytes: rtpool_proto::DEFAULT_MAX_FRAME,
            heartbeat_ms: 1000,
            idle_heartbeat: None,
            handshake_timeout: Duration::from_secs(3),
            lease_ms: 3000,
            ha: None,
            advertise: None,
            ha_lease_ms: DEFAULT_HA_LEASE_MS,
            store: None,
            result_ttl: Duration::from_secs(300),
            max_attempts: 3,
            hedge_factor: DEFAULT_HEDGE_FACTOR,
            max_task_time: Duration::from_secs(86_400),
            overload_miss_ratio: core.overload_miss_ratio,
            overload_window: Duration::from_nanos(core.overload_window_ns),
            admit_deadlines: core.admit_deadlines,
            timeout_grace: Duration::from_secs(2),
            service_grace: Duration::from_secs(DEFAULT_SERVICE_GRACE_SECS),
            journal: true,
            fsync: crate::journal::FsyncPolicy::default(),
            journal_compact_mb_per_s: 0,
            tls_cert: None,
            tls_key: None,
            tls_self_signed: false,
            max_connections: 0,
            max_unauthenticated: None,
            max_unauthenticated_per_host: None,
            client_reserve: None,
            max_buffered_bytes: None,
            client_timeout_ms: 30_000,
            max_queued_tasks_per_user: core.max_queued_tasks_per_user,
            max_queued_bytes_per_user: core.max_queued_bytes_per_user,
            max_unacked_bytes_per_client: core.max_unacked_bytes_per_client,
            max_unacked_results_per_client: core.max_unacked_results_per_client,
            realtime: crate::realtime::RealtimeConfig::default(),
            log_summary: DEFAULT_LOG_SUMMARY,
            http: None,
            http_is_default: false,
            http_token: None,
            metrics: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hedge_factor_reaches_the_core() {
        let config = MasterConfig {
            hedge_factor: 2.5,
            ..MasterConfig::default()
        };
        assert!(config.validate().is_ok());
        assert_eq!(config.core_config().hedge_factor, 2.5);
        let default = MasterConfig::default();
        assert_eq!(
            default.core_config().hedge_factor,
            rtpool_core::CoreConfig::default().hedge_factor
        );
    }

    #[test]
    fn the_service_grace_reaches_the_core() {
        let config = MasterConfig {
            service_grace: Duration::from_millis(2_500),
            ..MasterConfig::default()
        };
        assert_eq!(config.core_config().service_grace_ns, 2_500_000_000);
        assert_eq!(
            MasterConfig::default().core_config().service_grace_ns,
            rtpool_core::CoreConfig::default().service_grace_ns
        );
    }

    #[test]
    fn a_hedge_factor_of_1_or_less_is_refused_with_its_value() {
        for bad in [1.0, 0.5, 0.0, -3.0, f64::NAN, f64::INFINITY] {
            let config = MasterConfig {
                hedge_factor: bad,
                ..MasterConfig::default()
            };
            let err = config.validate().expect_err("refused");
            let text = err.to_string();
            assert!(
                text.starts_with("invalid hedge factor: must be a number above 1"),
                "{text}"
            );
            assert!(text.ends_with(&format!("not {bad}")), "{text}");
        }
        assert_eq!(check_hedge_factor(1.000_001), Ok(1.000_001));
    }
}
