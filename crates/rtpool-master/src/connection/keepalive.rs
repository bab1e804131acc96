//! TCP keepalive and `TCP_USER_TIMEOUT` on every accepted connection, so a peer whose path is
//! cut (host down, cable out, a firewall dropping packets) is noticed by the kernel even while
//! the master has nothing to tell it, and data the master sent it is not retried for the
//! kernel's default ~15 minutes. Together with the worker lease and the master's own
//! `HEARTBEAT` on a link it left silent (see `outbound.rs`), both sides notice a cut within
//! about the lease (the master) or 3 leases (its peers).

use std::time::Duration;

use tokio::net::TcpStream;

/// Idle time before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Time between probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes after which the connection is dropped.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Enable keepalive on `stream`, and give up on data unacknowledged for `user_timeout`
/// (best effort: an option the OS refuses is left at its default).
pub fn enable(stream: &TcpStream, user_timeout: Duration) {
    imp::enable(stream, user_timeout);
}

#[cfg(target_os = "linux")]
mod imp {
    use nix::sys::socket::{setsockopt, sockopt};

    use super::*;

    pub(super) fn enable(stream: &TcpStream, user_timeout: Duration) {
        let secs = |d: Duration| d.as_secs().clamp(1, u64::from(u32::MAX)) as u32;
        let _ = setsockopt(stream, sockopt::KeepAlive, &true);
        let _ = setsockopt(stream, sockopt::TcpKeepIdle, &secs(KEEPALIVE_IDLE));
        let _ = setsockopt(stream, sockopt::TcpKeepInterval, &secs(KEEPALIVE_INTERVAL));
        let _ = setsockopt(stream, sockopt::TcpKeepCount, &KEEPALIVE_PROBES);
        let ms = user_timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        let _ = setsockopt(stream, sockopt::TcpUserTimeout, &ms);
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    pub(super) fn enable(_stream: &TcpStream, _user_timeout: Duration) {}
}
