//! Connection admission: who may hold one of the master's connections, and the `busy` answer
//! (with its reason) for the others.
//!
//! Three budgets, so that no kind of peer can keep another out:
//! - connections still in their handshake (not yet authenticated) have a small budget of their
//!   own ([`Limits::max_unauthenticated`]) and, within it, a per-address one
//!   ([`Limits::max_unauthenticated_per_host`]): idle sockets from one host cannot take every
//!   handshake place, and none of them takes a session's place;
//! - authenticated sessions share [`Limits::max_connections`];
//! - workers cannot take the last [`Limits::client_reserve`] of those, so a client always finds
//!   a place even when workers fill the master.
//!
//! [`Gate`] counts; the permits ([`Pending`], [`Session`]) give their place back when dropped,
//! so a connection task that ends in any way frees it. Every refusal is counted by reason, and
//! logged at most once per [`LOG_WINDOW`] with the count of the others (a flood of refusals
//! costs one line every few seconds, not one per connection).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rtpool_proto::Role;

use crate::ratelimit::{suppressed_note, LogLimiter};

/// Refusals are logged at most once per window (with the count of the ones not logged).
pub const LOG_WINDOW: Duration = Duration::from_secs(10);

/// The admission limits, resolved from the configuration (see [`Limits::derive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Authenticated sessions at once (clients and workers).
    pub max_connections: usize,
    /// Connections in their handshake at once.
    pub max_unauthenticated: usize,
    /// Connections in their handshake at once from one IP address.
    pub max_unauthenticated_per_host: usize,
    /// Sessions of `max_connections` only clients may take.
    pub client_reserve: usize,
}

impl Limits {
    /// The limits for `max_connections` sessions, with the defaults of the others:
    /// `max_unauthenticated` = `max_connections / 8` within 16..=1024,
    /// `max_unauthenticated_per_host` = a quarter of that, at least 4, and
    /// `client_reserve` = 16, at most a quarter of `max_connections`.
    pub fn derive(
        max_connections: usize,
        max_unauthenticated: Option<usize>,
        max_unauthenticated_per_host: Option<usize>,
        client_reserve: Option<usize>,
    ) -> Self {
        let max_connections = max_connections.max(1);
        let unauth = max_unauthenticated.unwrap_or((max_connections / 8).clamp(16, 1024));
        let per_host = max_unauthenticated_per_host.unwrap_or((unauth / 4).max(4));
        let reserve = client_reserve.unwrap_or(16.min(max_connections / 4));
        Self {
            max_connections,
            max_unauthenticated: unauth.max(1),
            max_unauthenticated_per_host: per_host.clamp(1, unauth.max(1)),
            client_reserve: reserve.min(max_connections.saturating_sub(1)),
        }
    }
}

/// Why a connection was refused; its [`Refusal::message`] is the `busy` error's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Every session place is taken.
    Full {
        /// `max_connections`.
        limit: usize,
    },
    /// Every handshake place is taken.
    Handshakes {
        /// `max_unauthenticated`.
        limit: usize,
    },
    /// This address holds all the handshake places it may.
    Host {
        /// The peer's address.
        host: IpAddr,
        /// `max_unauthenticated_per_host`.
        limit: usize,
    },
    /// Workers hold every place but the clients' reserve.
    WorkerPlaces {
        /// `max_connections`.
        limit: usize,
        /// `client_reserve`.
        reserve: usize,
    },
}

impl Refusal {
    /// A short label (log lines, metrics).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Full { .. } => "max_connections",
            Self::Handshakes { .. } => "max_unauthenticated",
            Self::Host { .. } => "max_unauthenticated_per_host",
            Self::WorkerPlaces { .. } => "client_reserve",
        }
    }

    /// The text of the `busy` error: what is full, and what to do.
    pub fn message(&self) -> String {
        match self {
            Self::Full { limit } => format!(
                "the master serves its limit of {limit} connections; retry later or raise \
                 --max-connections"
            ),
            Self::Handshakes { limit } => format!(
                "{limit} connections are in their handshake (--max-unauthenticated); retry later"
            ),
            Self::Host { host, limit } => format!(
                "{limit} connections from {host} are in their handshake \
                 (--max-unauthenticated-per-host); retry later"
            ),
            Self::WorkerPlaces { limit, reserve } => format!(
                "workers hold {} of {limit} connections, the last {reserve} are kept for \
                 clients (--client-reserve); retry later or raise --max-connections",
                limit - reserve
            ),
        }
    }
}

#[derive(Debug)]
struct State {
    pending: usize,
    pending_by_host: HashMap<IpAddr, usize>,
    workers: usize,
    clients: usize,
    /// One refusal line per [`LOG_WINDOW`].
    lines: LogLimiter<()>,
    /// Every refusal since start.
    refused: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            pending: 0,
            pending_by_host: HashMap::new(),
            workers: 0,
            clients: 0,
            lines: LogLimiter::new(LOG_WINDOW),
            refused: 0,
        }
    }
}

/// The admission counters of one master (see the module docs).
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    state: Mutex<State>,
}

/// A connection's place while it is in its handshake; freed when dropped.
#[derive(Debug)]
pub struct Pending {
    gate: Arc<Gate>,
    host: IpAddr,
}

/// An authenticated connection's place; freed when dropped.
#[derive(Debug)]
pub struct Session {
    gate: Arc<Gate>,
    role: Role,
}

impl Gate {
    /// A gate with no connection yet.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    /// The limits it applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Refusals since start.
    pub fn refused(&self) -> u64 {
        self.lock().refused
    }

    /// Sessions and handshakes now: `(clients, workers, pending)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (s.clients, s.workers, s.pending)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handshake place for a connection from `host`.
    ///
    /// # Errors
    /// Why not: every session place is taken, every handshake place is, or `host`'s are.
    pub fn admit(self: &Arc<Self>, host: IpAddr) -> Result<Pending, Refusal> {
        let l = self.limits;
        let mut s = self.lock();
        if s.workers + s.clients >= l.max_connections {
            return Err(Refusal::Full {
                limit: l.max_connections,
            });
        }
        if s.pending >= l.max_unauthenticated {
            return Err(Refusal::Handshakes {
                limit: l.max_unauthenticated,
            });
        }
        let from_host = s.pending_by_host.entry(host).or_insert(0);
        if *from_host >= l.max_unauthenticated_per_host {
            return Err(Refusal::Host {
                host,
                limit: l.max_unauthenticated_per_host,
            });
        }
        *from_host += 1;
        s.pending += 1;
        Ok(Pending {
            gate: self.clone(),
            host,
        })
    }

    /// Count a refusal; returns the line to log when one is due (the first, then one per
    /// [`LOG_WINDOW`], saying how many were not logged).
    pub fn note_refusal(&self, refusal: &Refusal, now: Instant) -> Option<String> {
        let mut s = self.lock();
        s.refused += 1;
        let held = s.lines.check((), now)?;
        Some(format!(
            "refused a connection ({}): {}{}; {} refused since start",
            refusal.reason(),
            refusal.message(),
            suppressed_note(held, LOG_WINDOW),
            s.refused
        ))
    }
}

impl Pending {
    /// Turn the handshake place into a session place for `role`.
    ///
    /// # Errors
    /// A worker when workers hold every place but the clients' reserve; anyone when every
    /// place is taken.
    pub fn promote(self, role: Role) -> Result<Session, Refusal> {
        let l = self.gate.limits;
        let gate = self.gate.clone();
        let mut s = gate.lock();
        let sessions = s.workers + s.clients;
        if sessions >= l.max_connections {
            return Err(Refusal::Full {
                limit: l.max_connections,
            });
        }
        if role == Role::Worker && sessions >= l.max_connections - l.client_reserve {
            return Err(Refusal::WorkerPlaces {
                limit: l.max_connections,
                reserve: l.client_reserve,
            });
        }
        match role {
            Role::Worker => s.workers += 1,
            Role::Client => s.clients += 1,
        }
        drop(s);
        drop(self); // frees the handshake place
        Ok(Session { gate, role })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.pending -= 1;
        if let Some(n) = s.pending_by_host.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                s.pending_by_host.remove(&self.host);
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        match self.role {
            Role::Worker => s.workers -= 1,
            Role::Client => s.clients -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_defaults_follow_max_connections() {
        let l = Limits::derive(784, None, None, None);
        assert_eq!(
            (l.max_unauthenticated, l.max_unauthenticated_per_host),
            (98, 24)
        );
        assert_eq!(l.client_reserve, 16);
        let small = Limits::derive(8, None, None, None);
        assert_eq!((small.max_unauthenticated, small.client_reserve), (16, 2));
    }

    #[test]
    fn one_host_cannot_take_every_handshake_place() {
        let gate = Gate::new(Limits::derive(100, Some(10), Some(3), Some(0)));
        let held: Vec<_> = (0..3).map(|_| gate.admit(ip(2)).unwrap()).collect();
        assert_eq!(
            gate.admit(ip(2)).unwrap_err().reason(),
            "max_unauthenticated_per_host"
        );
        let other = gate.admit(ip(1)).expect("another host still gets a place");
        drop(held);
        assert_eq!(gate.counts(), (0, 0, 1));
        let _session = other.promote(Role::Client).unwrap();
        assert_eq!(gate.counts(), (1, 0, 0));
    }

    #[test]
    fn workers_leave_the_client_reserve() {
        let gate = Gate::new(Limits::derive(4, Some(8), Some(8), Some(1)));
        let workers: Vec<_> = (0..3)
            .map(|_| gate.admit(ip(1)).unwrap().promote(Role::Worker).unwrap())
            .collect();
        let refused = gate
            .admit(ip(1))
            .unwrap()
            .promote(Role::Worker)
            .unwrap_err();
        assert_eq!(refused.reason(), "client_reserve");
        let client = gate.admit(ip(1)).unwrap().promote(Role::Client).unwrap();
        assert_eq!(gate.admit(ip(1)).unwrap_err().reason(), "max_connections");
        drop((workers, client));
        assert_eq!(gate.counts(), (0, 0, 0));
    }

    #[test]
    fn refusals_are_logged_once_per_window_with_a_count() {
        let gate = Gate::new(Limits::derive(4, None, None, None));
        let r = Refusal::Full { limit: 4 };
        let t0 = Instant::now();
        assert!(gate.note_refusal(&r, t0).is_some());
        assert!(gate.note_refusal(&r, t0 + Duration::from_secs(1)).is_none());
        assert!(gate.note_refusal(&r, t0 + Duration::from_secs(2)).is_none());
        let line = gate.note_refusal(&r, t0 + LOG_WINDOW).unwrap();
        assert!(line.contains("2 more lines like it held back"), "{line}");
        assert_eq!(gate.refused(), 4);
    }
}
