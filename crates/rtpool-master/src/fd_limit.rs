//! The process's open-file limit: raised at start from the soft limit to the hard limit (most
//! shells start programs with a soft limit of 1,024, far below what a master serving thousands
//! of peers needs), and the default connection limit derived from what it got.
//!
//! Every connection costs one descriptor, a refused one too for as long as it is being
//! answered; the rest of the master (journal, store, TLS and HTTP files, the listener, the
//! runtime's own descriptors) needs a few dozen more. [`default_max_connections`] keeps that
//! headroom so that, at the default settings, `accept` does not run out of descriptors.

use tracing::info;

/// Descriptors kept for everything but connections: the journal, the store (SQLite keeps a
/// few, PostgreSQL one per connection), TLS and HTTP files, the listener, the tokio runtime
/// (64), plus the refusals being answered at once (64, see [`crate::server`]).
pub const HEADROOM_FDS: u64 = 128;

/// The default connection limit is never above this (a served connection costs ~25 KB of
/// memory and a descriptor; a machine with a huge hard limit need not reserve for millions).
pub const MAX_DEFAULT_CONNECTIONS: usize = 65_536;

/// The default connection limit is never below this, however low the descriptor limit.
pub const MIN_DEFAULT_CONNECTIONS: usize = 16;

/// What [`raise_nofile`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit before the master raised it.
    pub before: u64,
    /// The soft limit now (what the master can use).
    pub soft: u64,
    /// The hard limit (the ceiling an unprivileged process can raise its soft limit to).
    pub hard: u64,
}

/// The default of `--max-connections` for a soft open-file limit of `nofile`:
/// `(nofile - 128) * 7 / 8` (the 128 of [`HEADROOM_FDS`] for the master's own files and the
/// refusals being answered; of the rest, an eighth for connections in their handshake, whose
/// default budget is `max_connections / 8`), within
/// [`MIN_DEFAULT_CONNECTIONS`]..=[`MAX_DEFAULT_CONNECTIONS`].
/// A soft limit of 1,024 gives 784; 65,536 gives 57,232; 1,048,576 gives 65,536.
pub fn default_max_connections(nofile: u64) -> usize {
    let usable = nofile.saturating_sub(HEADROOM_FDS) / 8 * 7;
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .clamp(MIN_DEFAULT_CONNECTIONS, MAX_DEFAULT_CONNECTIONS)
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and log what the master got; `None` where
/// the limit cannot be read (then the caller keeps its own default).
pub fn raise_nofile() -> Option<NofileLimit> {
    let limit = raise()?;
    if limit.soft > limit.before {
        info!(
            "open-file limit raised from {} to {} (the hard limit)",
            limit.before, limit.soft
        );
    } else {
        info!("open-file limit {} (hard limit {})", limit.soft, limit.hard);
    }
    Some(limit)
}

#[cfg(target_os = "linux")]
fn raise() -> Option<NofileLimit> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (before, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if hard > before {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!("cannot raise the open-file limit from {before} to {hard}: {e}");
        }
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    Some(NofileLimit { before, soft, hard })
}

#[cfg(not(target_os = "linux"))]
fn raise() -> Option<NofileLimit> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_leaves_headroom_and_is_bounded() {
        assert_eq!(default_max_connections(1024), 784);
        assert_eq!(default_max_connections(65_536), 57_232);
        assert_eq!(default_max_connections(1 << 20), MAX_DEFAULT_CONNECTIONS);
        assert_eq!(default_max_connections(10), MIN_DEFAULT_CONNECTIONS);
        assert_eq!(default_max_connections(u64::MAX), MAX_DEFAULT_CONNECTIONS);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let got = raise().expect("linux has RLIMIT_NOFILE");
        assert!(got.soft >= got.before);
        assert_eq!(got.soft, got.hard);
    }
}
