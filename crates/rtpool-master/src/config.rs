//! [`MasterConfig`]: every knob of the master, each with a sane default.

use std::path::PathBuf;
use std::time::Duration;

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
    /// A peer must complete its handshake within this time (default 10 s).
    pub handshake_timeout: Duration,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7070".into(),
            data_dir: None,
            client_token: None,
            worker_token: None,
            max_frame_bytes: rtpool_proto::DEFAULT_MAX_FRAME,
            heartbeat_ms: 1000,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}
