//! rtpool-master: the tokio server around the scheduler core.
//!
//! The master is glue: one task ([`scheduler`]) owns the [`rtpool_core::Core`]; one reader and
//! one writer task per connection ([`connection`]) turn frames into core events and the core's
//! actions into frames. Nothing shares the core behind a lock. The whole server runs on one
//! thread (a current-thread runtime): a task's path from client to worker and back then never
//! pays a cross-thread wake-up inside the master, which on a small VM costs more than the
//! scheduling itself.
//!
//! Module dependencies form a DAG (checked by `scripts/check-imports`), from the top:
//! [`cli`] (the command line of `rtpool-master` and `rtpool master`) and [`handle`] (running a
//! master) -> [`server`] (accept loop) -> [`connection`] (handshake, admission, reader) ->
//! [`scheduler`] -> [`outbound`] (what goes out to a peer: [`outbound::Out`], the queue, the writer),
//! [`stats`], [`journal`], [`auth`] -> [`store`]; [`package_ids`] (the scheduler's package
//! numbering), [`data_dir`] (the data dir's lock and modes), [`fd_limit`] (the open-file
//! limit), [`listen`] (the listening socket and its backlog), [`accept_backoff`] (the accept
//! loop's pauses), [`config`] (with [`config::args`], the one definition of the master's
//! options), [`tls`], [`realtime`] and [`error`] below them; [`sim`] (simulated workers for
//! `rtpool bench scale`) is a leaf that only shares the protocol crate. A
//! module never reaches up: the scheduler gets the instance id from [`handle`] as an argument.

pub mod accept_backoff;
pub mod auth;
pub mod cli;
pub mod config;
pub mod connection;
pub mod data_dir;
pub mod error;
pub mod fd_limit;
pub mod ha;
pub mod handle;
pub mod http;
pub mod journal;
pub mod listen;
pub mod mem_trim;
pub mod outbound;
pub mod package_ids;
pub mod ratelimit;
pub mod realtime;
pub mod scheduler;
pub mod server;
pub mod shm_sweep;
pub mod sim;
pub mod stats;
pub mod status;
pub mod store;
pub mod tls;

pub use auth::Tokens;
pub use config::args::MasterArgs;
pub use config::MasterConfig;
pub use error::MasterError;
pub use handle::{run_blocking, MasterHandle};
pub use realtime::{RealtimeConfig, RealtimeReport};
pub use stats::{MasterStats, ReplayStats};

/// Install a stderr logger with `filter` (e.g. `info`, `rtpool_master=debug`) writing `format`
/// lines; a no-op when a logger is already installed. Text lines carry ANSI colours only when
/// stderr is a terminal and `$NO_COLOR` is not set, so a log file or a pipe gets plain text.
pub fn init_logging(filter: &str, format: config::logging::LogFormat) {
    use std::io::IsTerminal;

    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        config::logging::LogFormat::Json => builder.json().try_init(),
        config::logging::LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).try_init()
        }
    };
}
