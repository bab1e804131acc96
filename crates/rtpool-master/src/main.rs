//! `rtpool-master`: parse arguments, run the master library.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rtpool_master::config::{check_hedge_factor, DEFAULT_HEDGE_FACTOR, DEFAULT_SERVICE_GRACE_SECS};
use rtpool_master::{run_blocking, MasterConfig, RealtimeConfig};

/// The rtpool master: accepts task packages from clients and hands them to pull-based workers.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on (loopback by default; use 0.0.0.0:7070 to accept other machines).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Directory for tokens (created on first start).
    #[arg(long, env = "RTPOOL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Largest frame after authentication, in MiB.
    #[arg(long, default_value_t = 256)]
    max_frame_mb: usize,
    /// How often idle workers send heartbeats, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u32,
    /// Serve TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve TLS with a self-signed certificate for localhost, 127.0.0.1, ::1 and the listen
    /// host, generated on first start into <data-dir>/tls/ (clients use its cert.pem as CA file).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    tls_self_signed: bool,
    /// Connections served at once; more are answered `ERROR busy` and closed.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Outbound frames, in MiB, that may wait for one peer to read them; a peer that lets more
    /// pile up is closed with `ERROR slow_consumer`.
    #[arg(long, default_value_t = 64)]
    max_buffered_mb: usize,
    /// Worker lease, in milliseconds: a worker silent this long is closed and its tasks are
    /// requeued (0: never).
    #[arg(long, default_value_t = 3000)]
    lease_ms: u32,
    /// A client silent this long, in milliseconds, is closed with `ERROR idle` (0: never).
    #[arg(long, default_value_t = 30_000)]
    client_timeout_ms: u32,
    /// Straggler hedging: a task of a package submitted with `hedge` gets a backup copy on
    /// another worker once it has run this many times its function's p95 execution time
    /// (must be above 1).
    #[arg(long, value_name = "F", default_value_t = DEFAULT_HEDGE_FACTOR, value_parser = parse_hedge_factor)]
    hedge_factor: f64,
    /// Grid RPC: calls queued for a function whose last worker left wait this many seconds for
    /// a worker serving it to return, then fail.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_SERVICE_GRACE_SECS as f64,
          value_parser = parse_seconds)]
    service_grace: f64,
    /// Real-time mode: lock the master's memory (mlockall), run its threads under SCHED_FIFO
    /// and pin them with --cpus, each as far as the OS permits (a refused step is logged once
    /// and stays in normal mode).
    #[arg(long)]
    realtime: bool,
    /// SCHED_FIFO priority of the master's threads in real-time mode (1-99).
    #[arg(long, value_name = "N", default_value_t = rtpool_master::realtime::DEFAULT_PRIORITY,
          value_parser = clap::value_parser!(u8).range(1..=99), requires = "realtime")]
    rt_priority: u8,
    /// Pin the master's threads to these CPUs in real-time mode: `1`, `0,1`, `0-3`.
    #[arg(long, value_name = "LIST", value_parser = parse_cpus, requires = "realtime")]
    cpus: Option<CpuList>,
    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, default_value = "info", env = "RTPOOL_LOG")]
    log_level: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rtpool_master::init_logging(&args.log_level);
    let data_dir = args.data_dir.or_else(default_data_dir);
    let config = MasterConfig {
        listen: args.listen,
        data_dir,
        max_frame_bytes: args.max_frame_mb << 20,
        heartbeat_ms: args.heartbeat_ms,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_self_signed: args.tls_self_signed,
        max_connections: args.max_connections,
        max_buffered_bytes: args.max_buffered_mb << 20,
        lease_ms: args.lease_ms,
        client_timeout_ms: args.client_timeout_ms,
        hedge_factor: args.hedge_factor,
        service_grace: Duration::from_secs_f64(args.service_grace),
        realtime: RealtimeConfig {
            enabled: args.realtime,
            priority: args.rt_priority,
            cpus: args.cpus.map(|c| c.0),
        },
        ..MasterConfig::default()
    };
    run_blocking(config)?;
    Ok(())
}

/// `--hedge-factor`: a number above 1.
fn parse_hedge_factor(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number; use e.g. 3 or 2.5"))?;
    check_hedge_factor(value)
}

/// A duration in seconds (`--service-grace`): a finite number >= 0.
fn parse_seconds(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds; use e.g. 30 or 2.5"))?;
    if Duration::try_from_secs_f64(value).is_err() {
        return Err(format!("must be a number of seconds >= 0, not {value}"));
    }
    Ok(value)
}

/// The value of `--cpus`; a newtype because clap takes an `Option<Vec<_>>` field for an option
/// given several times.
#[derive(Debug, Clone)]
struct CpuList(Vec<usize>);

fn parse_cpus(list: &str) -> Result<CpuList, String> {
    rtpool_master::realtime::parse_cpus(list)
        .map(CpuList)
        .map_err(|e| e.to_string())
}

fn default_data_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/rtpool"))
}
