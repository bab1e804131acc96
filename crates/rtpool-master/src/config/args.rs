//! [`MasterArgs`]: every option of the master's command line, defined once for both front ends,
//! the `rtpool-master` binary and `rtpool master` (Python, through `rtpool._native`), and read
//! by the same parser for the options dict of an embedded master ([`super::options`]).
//!
//! Every option is optional here: one that is not given leaves [`MasterConfig`]'s default (or,
//! for the dict, the value the embedded master's keywords set). The defaults are therefore
//! written in the help texts, from the constants [`MasterConfig::default`] uses where there is
//! one.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

use super::logging::parse_log_filter;
pub use super::logging::{LogFormat, Logging};
use super::parse::{
    parse_fsync, parse_ha_lease, parse_hedge_factor, parse_listen, parse_miss_ratio,
    parse_positive, parse_positive_u64, parse_priority, parse_seconds,
};
use super::MasterConfig;
use crate::journal::FsyncPolicy;
use crate::realtime::{parse_cpus, RealtimeConfig};

/// Environment variable read for `--data-dir` when it is not given.
pub const DATA_DIR_ENV: &str = "RTPOOL_DATA_DIR";

/// Environment variable read for `--http-token` when it is not given.
pub const HTTP_TOKEN_ENV: &str = "RTPOOL_HTTP_TOKEN";

/// Environment variable read for `--log-level` when it is not given.
pub const LOG_ENV: &str = "RTPOOL_LOG";

/// The master's command-line options.
///
/// The field names are the keys of the options dict ([`super::options`]); the flags are their
/// `--kebab-case` forms except where noted (`result_ttl_s` is `--result-ttl`, `journal` is
/// `--no-journal`).
#[derive(Debug, Clone, Parser)]
#[command(
    version,
    about = "The rtpool master: accepts task packages from clients and hands them to pull-based \
             workers.",
    long_about = "The rtpool master: accepts task packages from clients and hands them to \
                  pull-based workers.\n\n\
                  Runs in the foreground until SIGINT (Ctrl-C) or SIGTERM, either a graceful \
                  shutdown with exit code 0. On first start it generates a \
                  client and a worker token and writes them to the data dir (client.token, \
                  worker.token) and prints them; it prints \"listening on HOST:PORT\" once it \
                  accepts connections."
)]
pub struct MasterArgs {
    /// Address to listen on (default: 127.0.0.1:7070, this machine only; 0.0.0.0:7070 accepts
    /// other machines; port 0 picks a free one).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub listen: Option<String>,
    /// Where the tokens, the crash-recovery journal and the user store live (default:
    /// $RTPOOL_DATA_DIR, else $XDG_DATA_HOME/rtpool or ~/.local/share/rtpool).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// User store for tokens and quotas: postgres://user@host:port/db or sqlite:///path
    /// (default: SQLite in the data dir).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Log filter: error, warn, info, debug, trace, off, or tracing directives such as
    /// rtpool_master=debug,warn (default: $RTPOOL_LOG, else info). At info the master logs
    /// connections and a one-line summary every 60 s when something happened; at debug also
    /// each package's lifecycle.
    #[arg(long, value_name = "FILTER", value_parser = parse_log_filter)]
    pub log_level: Option<String>,
    /// Log line format: text (colours only on a terminal, and never with $NO_COLOR) or json
    /// (one JSON object per line, for log collectors) (default: text).
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log a one-line summary (workers, tasks done and their rate, queue, deadlines) at info
    /// every SECONDS when something happened since the last one; 0: never (default: 60).
    #[arg(long = "log-summary", value_name = "SECONDS", value_parser = parse_seconds)]
    pub log_summary_s: Option<f64>,

    /// Serve TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// Serve TLS with a self-signed certificate for localhost, 127.0.0.1, ::1 and the listen
    /// host, generated on first start into DIR/tls/ (its cert.pem is the clients' ca_file and
    /// the workers' --ca-file).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"], help_heading = "TLS")]
    pub tls_self_signed: bool,

    /// The HTTP listener: dashboard at /, Prometheus /metrics, /api/status, /api/events
    /// (default: 127.0.0.1:7071, skipped with a warning if taken; "off" for none; port 0 picks
    /// a free one; beyond loopback only with TLS or --http-token).
    #[arg(long, value_name = "HOST:PORT|off", help_heading = "Monitoring")]
    pub http: Option<String>,
    /// Token the HTTP listener requires as "Authorization: Bearer TOKEN" or ?token=TOKEN
    /// (default: $RTPOOL_HTTP_TOKEN; none on loopback).
    #[arg(long, value_name = "TOKEN", help_heading = "Monitoring")]
    pub http_token: Option<String>,
    /// Do not count metrics on the scheduler thread (latency histograms, per-worker and
    /// per-user counts); the status keeps the scheduler's own gauges.
    #[arg(long = "no-metrics", action = ArgAction::SetFalse, help_heading = "Monitoring")]
    pub metrics: bool,

    /// Largest frame accepted after the handshake, in MiB (default: 256).
    #[arg(
        long,
        value_name = "MB",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_frame_mb: Option<usize>,
    /// How often idle workers send a heartbeat, in milliseconds (default: 1000).
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub heartbeat_ms: Option<u32>,
    /// How often a worker that holds no task heartbeats, in milliseconds (default: 3 leases,
    /// 9000; 0: as often as a busy one). Such a worker is closed after this plus the lease of
    /// silence; from the moment it is assigned a task, within a lease.
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub idle_heartbeat_ms: Option<u32>,
    /// Authenticated connections (clients and workers) served at once; more are answered
    /// `ERROR busy` and closed (default: from the open-file limit, which the master raises to
    /// its hard limit: (limit - 128) * 7/8, at most 65536; 784 at 1024).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_connections: Option<usize>,
    /// Connections still in their handshake (not yet authenticated) at once; more are answered
    /// `ERROR busy` (default: max-connections / 8, within 16..1024).
    #[arg(long, value_name = "N", value_parser = parse_positive, help_heading = "Limits")]
    pub max_unauthenticated: Option<usize>,
    /// Connections in their handshake at once from one IP address (default: a quarter of
    /// --max-unauthenticated, at least 4).
    #[arg(long, value_name = "N", value_parser = parse_positive, help_heading = "Limits")]
    pub max_unauthenticated_per_host: Option<usize>,
    /// Connections of --max-connections that workers cannot take, kept for clients
    /// (default: 16, at most a quarter of --max-connections; 0: none).
    #[arg(long, value_name = "N", help_heading = "Limits")]
    pub client_reserve: Option<usize>,
    /// Time a new connection has to complete its handshake (TLS and HELLO), in milliseconds
    /// (default: 3000).
    #[arg(long, value_name = "MS", value_parser = parse_positive_u64, help_heading = "Limits")]
    pub handshake_timeout_ms: Option<u64>,
    /// Outbound frames, in MiB, that may wait for one peer to read them; a peer that lets more
    /// pile up is closed with `ERROR slow_consumer` (default: one maximum frame, --max-frame-mb,
    /// plus 64; at least --max-frame-mb).
    #[arg(
        long,
        value_name = "MB",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_buffered_mb: Option<usize>,
    /// A client silent this long, in milliseconds, is closed with `ERROR idle` (default:
    /// 30000; 0: never).
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub client_timeout_ms: Option<u32>,
    /// Most tasks one user may have queued or running at once, over all its packages; a
    /// submission past it is refused with `ERROR queue_limit` (default: 1048576; 0: no limit).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_queued_tasks_per_user: Option<u64>,
    /// Most argument MiB one user's queued and running tasks may hold at once; a submission
    /// past it is refused with `ERROR queue_limit` (default: 1024; 0: no limit).
    #[arg(
        long,
        value_name = "MB",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_queued_mb_per_user: Option<u64>,
    /// Result MiB sent to one client connection and not yet acknowledged; a client that lets
    /// more pile up is closed with `ERROR unacked_limit`, its packages keeping their results
    /// for the result TTL (default: 256; 0: no limit).
    #[arg(
        long,
        value_name = "MB",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_unacked_mb: Option<u64>,
    /// Results sent to one client connection and not yet acknowledged (same rule; default:
    /// 1048576; 0: no limit).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Limits"
    )]
    pub max_unacked_results: Option<u64>,

    /// Worker lease, in milliseconds: a worker silent this long is closed and its tasks run
    /// elsewhere (default: 3000; 0: never).
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        help_heading = "Reliability"
    )]
    pub lease_ms: Option<u32>,
    /// A disconnected client's packages keep running and keep their results this many
    /// seconds, waiting for it to reconnect; then they are dropped (default: 300).
    #[arg(long = "result-ttl", value_name = "SECONDS", allow_negative_numbers = true, value_parser = parse_seconds,
          help_heading = "Reliability")]
    pub result_ttl_s: Option<f64>,
    /// A task whose worker was lost on N attempts fails as a poison task (default: 3).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Reliability"
    )]
    pub max_attempts: Option<u32>,
    /// Longest any task may run, in seconds; 0 = no limit (default: 86400).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, value_parser = parse_seconds,
          help_heading = "Reliability")]
    pub max_task_seconds: Option<f64>,
    /// How long past a task's own time limit the master waits for its worker's report before
    /// failing the task itself, in seconds (default: 2).
    #[arg(long = "timeout-grace", value_name = "SECONDS", allow_negative_numbers = true, value_parser = parse_seconds,
          help_heading = "Reliability")]
    pub timeout_grace_s: Option<f64>,
    /// When the crash-recovery journal is synced to disk (see the help text).
    #[arg(long, value_name = "POLICY", value_parser = parse_fsync, help_heading = "Reliability",
          help = "When the crash-recovery journal is synced to disk: always (a package is \
                  acknowledged only once on disk), batch[:MS] (at most MS ms later; default \
                  batch:10) or off (the OS decides)")]
    pub fsync: Option<FsyncPolicy>,
    /// Keep no journal: a master crash loses every package (default: a journal in the data
    /// dir).
    #[arg(long = "no-journal", action = ArgAction::SetFalse, help_heading = "Reliability")]
    pub journal: bool,
    /// Write a journal compaction at most this fast, MB/s (default 0: as fast as the disk
    /// goes). A limit keeps a compaction of a large journal from crowding out the fsyncs of
    /// new packages on a shared disk; compaction then takes longer (in the background).
    #[arg(
        long = "journal-compact-mb-per-s",
        value_name = "MB",
        help_heading = "Reliability"
    )]
    pub journal_compact_mb_per_s: Option<u32>,
    /// High availability: keep the leader lease and the journal in this PostgreSQL database
    /// (postgres://user@host:port/db; also $RTPOOL_HA). Any number of masters may point at one
    /// database: one leads, the others are standbys that answer HELLO with `not_leader` and
    /// take over when the leader's lease runs out (see docs/ha.md).
    #[arg(
        long,
        value_name = "URL",
        env = "RTPOOL_HA",
        help_heading = "High availability"
    )]
    pub ha: Option<String>,
    /// With --ha: the address clients and workers should use for this master, HOST:PORT
    /// (default: the listen address unless it is 0.0.0.0 or ::, else this machine's
    /// hostname and the listen port).
    #[arg(long, value_name = "HOST:PORT", help_heading = "High availability")]
    pub advertise: Option<String>,
    /// With --ha: the leader lease, in milliseconds (default: 1000). A standby takes over at
    /// most about this long after the leader stopped renewing; the leader renews every third
    /// of it. (--lease-ms is the workers' lease.)
    #[arg(long = "ha-lease-ms", value_name = "MS", value_parser = parse_ha_lease, help_heading = "High availability")]
    pub ha_lease_ms: Option<u32>,

    /// Straggler hedging: a task of a package submitted with hedge=True gets a backup copy on
    /// another worker once it has run F times its function's p95 execution time (above 1;
    /// default: 1.5).
    #[arg(long, value_name = "F", allow_negative_numbers = true, value_parser = parse_hedge_factor, help_heading = "Scheduling")]
    pub hedge_factor: Option<f64>,
    /// Grid RPC: calls queued for a function whose last worker left wait this many seconds for
    /// a worker serving it to return, then fail (default: 30).
    #[arg(long = "service-grace", value_name = "SECONDS", allow_negative_numbers = true, value_parser = parse_seconds,
          help_heading = "Scheduling")]
    pub service_grace_s: Option<f64>,
    /// Overload: the master says it is overloaded (metric rtpool_overloaded, a rate-limited
    /// warning in its log, a warning to each client whose package with a deadline it accepts)
    /// when at least this share of the deadline results of the last --overload-window missed
    /// their deadline while tasks waited in the queue (0-1; 0 = never; default: 0.05).
    #[arg(long, value_name = "RATIO", allow_negative_numbers = true, value_parser = parse_miss_ratio,
          help_heading = "Scheduling")]
    pub overload_miss_ratio: Option<f64>,
    /// Overload: the window of deadline results judged, in seconds (default: 10).
    #[arg(long = "overload-window", value_name = "SECONDS", allow_negative_numbers = true,
          value_parser = parse_seconds, help_heading = "Scheduling")]
    pub overload_window_s: Option<f64>,
    /// Admission control for every package with a deadline, not only those submitted with
    /// admit=True: one that cannot finish by its deadline is refused (AdmissionError) instead
    /// of queued (default: off; see docs/deadlines.md).
    #[arg(long, help_heading = "Scheduling")]
    pub admit_deadlines: bool,

    /// Real-time mode: lock the master's memory (mlockall), run its threads under SCHED_FIFO
    /// and pin them with --cpus, each as far as the OS permits (a refused step is logged once
    /// and stays in normal mode).
    #[arg(long, help_heading = "Real-time mode")]
    pub realtime: bool,
    /// SCHED_FIFO priority of the master's threads with --realtime, 1-99 (default: 50).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_priority, help_heading = "Real-time mode")]
    pub rt_priority: Option<u8>,
    /// With --realtime, pin the master's threads to these CPUs: 1, 0,1 or 0-3.
    #[arg(long, value_name = "LIST", value_parser = parse_cpu_list,
          help_heading = "Real-time mode")]
    pub cpus: Option<CpuList>,
}

/// The value of `--cpus`; a newtype because clap reads an `Option<Vec<_>>` field as an option
/// given several times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl MasterArgs {
    /// The command line as `name` (`rtpool-master`, `rtpool master`) shows it in its help and
    /// errors.
    pub fn command_named(name: &'static str) -> clap::Command {
        Self::command()
            .name(name)
            .bin_name(name)
            .after_help(format!(
                "example:\n  {name} --listen 0.0.0.0:7070 --data-dir /var/lib/rtpool"
            ))
    }

    /// Parses `args` (without the program name) as the command line of `name`, and turns them
    /// into a configuration and a log filter.
    ///
    /// # Errors
    ///
    /// clap's error (or the request for help or the version) to print with
    /// [`clap::Error::print`] and to exit with [`clap::Error::exit_code`]: an unknown or
    /// malformed option, an out-of-range value, or a real-time option without `--realtime`.
    pub fn parse_named<I, T>(
        name: &'static str,
        args: I,
    ) -> Result<(MasterConfig, Logging), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut cmd = Self::command_named(name);
        let argv = std::iter::once(OsString::from(name)).chain(args.into_iter().map(Into::into));
        let matches = cmd.try_get_matches_from_mut(argv)?;
        let args = Self::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        args.check_realtime(&mut cmd)?;
        Ok(args.into_config())
    }

    /// `--rt-priority` and `--cpus` mean nothing without `--realtime`: refused rather than
    /// silently ignored.
    fn check_realtime(&self, cmd: &mut clap::Command) -> Result<(), clap::Error> {
        let given: Vec<&str> = [
            ("--rt-priority", self.rt_priority.is_some()),
            ("--cpus", self.cpus.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if self.realtime || given.is_empty() {
            return Ok(());
        }
        Err(cmd.error(
            ErrorKind::MissingRequiredArgument,
            format!("{} need --realtime", given.join(", ")),
        ))
    }

    /// The configuration of a command-line master: the defaults, the data dir and log filter
    /// from the environment when not given, then every option given. A `$RTPOOL_LOG` that is
    /// no valid filter is reported on stderr and replaced by `info`.
    pub fn into_config(self) -> (MasterConfig, Logging) {
        let filter = self.log_level.clone().unwrap_or_else(|| {
            match non_empty_env(LOG_ENV).map(|v| parse_log_filter(&v).map_err(|e| (v, e))) {
                Some(Ok(filter)) => filter,
                Some(Err((v, e))) => {
                    eprintln!("${LOG_ENV}={v:?} ignored: {e}; logging at info");
                    "info".into()
                }
                None => "info".into(),
            }
        });
        let log_level = Logging {
            filter,
            format: self.log_format.unwrap_or_default(),
        };
        let mut config = MasterConfig {
            data_dir: non_empty_env(DATA_DIR_ENV)
                .map(PathBuf::from)
                .or_else(default_data_dir),
            http: Some(super::DEFAULT_HTTP.into()),
            http_is_default: true,
            http_token: non_empty_env(HTTP_TOKEN_ENV),
            ..MasterConfig::default()
        };
        self.apply_to(&mut config);
        (config, log_level)
    }

    /// Sets the fields of `config` whose option was given; the others keep their value.
    /// `log_level` is not part of a configuration (logging is per process).
    pub fn apply_to(self, config: &mut MasterConfig) {
        // Destructured so that a new option cannot be forgotten here.
        let Self {
            listen,
            data_dir,
            store,
            log_level: _,
            log_format: _,
            log_summary_s,
            tls_cert,
            tls_key,
            tls_self_signed,
            max_frame_mb,
            heartbeat_ms,
            idle_heartbeat_ms,
            max_connections,
            max_unauthenticated,
            max_unauthenticated_per_host,
            client_reserve,
            handshake_timeout_ms,
            max_buffered_mb,
            client_timeout_ms,
            max_queued_tasks_per_user,
            max_queued_mb_per_user,
            max_unacked_mb,
            max_unacked_results,
            lease_ms,
            result_ttl_s,
            max_attempts,
            max_task_seconds,
            timeout_grace_s,
            fsync,
            journal,
            journal_compact_mb_per_s,
            ha,
            advertise,
            ha_lease_ms,
            hedge_factor,
            service_grace_s,
            overload_miss_ratio,
            overload_window_s,
            admit_deadlines,
            realtime,
            rt_priority,
            cpus,
            http,
            http_token,
            metrics,
        } = self;
        let secs = Duration::from_secs_f64; // the parsers let only valid durations through
        set(&mut config.listen, listen);
        set(&mut config.data_dir, data_dir.map(Some));
        set(&mut config.store, store.map(Some));
        set(&mut config.tls_cert, tls_cert.map(Some));
        set(&mut config.tls_key, tls_key.map(Some));
        config.tls_self_signed |= tls_self_signed;
        set(&mut config.max_frame_bytes, max_frame_mb.map(|mb| mb << 20));
        set(&mut config.heartbeat_ms, heartbeat_ms);
        set(&mut config.idle_heartbeat, idle_heartbeat_ms.map(Some));
        set(&mut config.max_connections, max_connections);
        set(
            &mut config.max_unauthenticated,
            max_unauthenticated.map(Some),
        );
        set(
            &mut config.max_unauthenticated_per_host,
            max_unauthenticated_per_host.map(Some),
        );
        set(&mut config.client_reserve, client_reserve.map(Some));
        set(
            &mut config.handshake_timeout,
            handshake_timeout_ms.map(Duration::from_millis),
        );
        set(
            &mut config.max_buffered_bytes,
            max_buffered_mb.map(|mb| Some(mb << 20)),
        );
        set(&mut config.client_timeout_ms, client_timeout_ms);
        set(
            &mut config.max_queued_tasks_per_user,
            max_queued_tasks_per_user,
        );
        set(
            &mut config.max_queued_bytes_per_user,
            max_queued_mb_per_user.map(|mb| mb.saturating_mul(1 << 20)),
        );
        set(
            &mut config.max_unacked_bytes_per_client,
            max_unacked_mb.map(|mb| mb.saturating_mul(1 << 20)),
        );
        set(
            &mut config.max_unacked_results_per_client,
            max_unacked_results,
        );
        set(&mut config.lease_ms, lease_ms);
        set(&mut config.result_ttl, result_ttl_s.map(secs));
        set(&mut config.max_attempts, max_attempts);
        set(&mut config.max_task_time, max_task_seconds.map(secs));
        set(&mut config.timeout_grace, timeout_grace_s.map(secs));
        set(&mut config.fsync, fsync);
        set(
            &mut config.journal_compact_mb_per_s,
            journal_compact_mb_per_s,
        );
        config.journal &= journal;
        set(&mut config.ha, ha.map(Some));
        set(&mut config.advertise, advertise.map(Some));
        set(&mut config.ha_lease_ms, ha_lease_ms);
        set(&mut config.hedge_factor, hedge_factor);
        set(&mut config.service_grace, service_grace_s.map(secs));
        set(&mut config.overload_miss_ratio, overload_miss_ratio);
        set(&mut config.overload_window, overload_window_s.map(secs));
        config.admit_deadlines |= admit_deadlines;
        set(&mut config.log_summary, log_summary_s.map(secs));
        if let Some(http) = http {
            config.http_is_default = false;
            config.http = (!http.eq_ignore_ascii_case("off")).then_some(http);
        }
        set(&mut config.http_token, http_token.map(Some));
        config.metrics &= metrics;
        let RealtimeConfig {
            enabled,
            priority,
            cpus: pinned,
        } = &mut config.realtime;
        *enabled |= realtime;
        set(priority, rt_priority);
        set(pinned, cpus.map(|c| Some(c.0)));
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *field = value;
    }
}

/// `$RTPOOL_DATA_DIR`'s default, as `rtpool token` has it too: `$XDG_DATA_HOME/rtpool`, else
/// `~/.local/share/rtpool`; `None` without a home directory (nothing on disk then).
pub fn default_data_dir() -> Option<PathBuf> {
    let base = non_empty_env("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty_env("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(base.join("rtpool"))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `--cpus`: `1`, `0,1`, `0-3`.
fn parse_cpu_list(list: &str) -> Result<CpuList, String> {
    parse_cpus(list).map(CpuList).map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
