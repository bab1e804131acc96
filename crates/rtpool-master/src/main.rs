//! `rtpool-master`: parse arguments, run the master library.

use std::path::PathBuf;

use clap::Parser;
use rtpool_master::{run_blocking, MasterConfig};

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
        ..MasterConfig::default()
    };
    run_blocking(config)?;
    Ok(())
}

fn default_data_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/rtpool"))
}
