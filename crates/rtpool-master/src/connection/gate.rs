//! Connection admission: who may hold one of the master's connections, and the `busy` answer
//! (with its reason) for the others.
//!
//! Three budgets, so that no kind of peer can keep another out:
//! - connections still in their handshake (not yet authenticated) have a small budget of their
//!   own ([`Limits::max_unauthenticated`]) and, within it, a per-address one
//!   ([`Limits::max_unauthenticated_per_host`]): idle sockets from one host cannot take every
//!   handshake place, and none of them takes a session's place. When the handshake budget is
//!   full, a new connection **evicts** the oldest one that has not sent its `HELLO` yet (from
//!   the address holding the most handshake places), as servers do against slowloris-style
//!   floods: idle sockets from many addresses cannot keep a real peer out, since the peer
//!   needs its place for one round trip and the idle ones have had theirs for longer. The
//!   evicted connection is told `busy` ([`Pending::evicted`]); only when every handshake place
//!   holds a connection that already sent `HELLO` is the new one refused;
//! - authenticated sessions share [`Limits::max_connections`];
//! - workers cannot take the last [`Limits::client_reserve`] of those, so a client always finds
//!   a place even when workers fill the master.
//!
//! [`Gate`] counts; the permits ([`Pending`], [`Session`]) give their place back when dropped,
//! so a connection task that ends in any way frees it. Every refusal is counted by reason, and
//! logged at most once per [`LOG_WINDOW`] with the count of the others (a flood of refusals
//! costs one line every few seconds, not one per connection).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rtpool_proto::Role;
use tokio::sync::Notify;

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

/// Tells a connection in its handshake that it was evicted.
#[derive(Debug, Default)]
struct Eviction {
    notify: Notify,
    /// Set (under the gate's lock) when evicted: its place is freed then, not when dropped.
    fired: AtomicBool,
}

#[derive(Debug)]
struct State {
    pending: usize,
    pending_by_host: HashMap<IpAddr, usize>,
    /// The handshake places that may be evicted, oldest first (by admission number).
    evictable: BTreeMap<u64, Arc<Eviction>>,
    /// The same, by address.
    evictable_by_host: HashMap<IpAddr, BTreeSet<u64>>,
    /// The next admission number.
    next_seq: u64,
    workers: usize,
    clients: usize,
    /// One refusal line per [`LOG_WINDOW`].
    lines: LogLimiter<()>,
    /// One eviction line per [`LOG_WINDOW`].
    eviction_lines: LogLimiter<()>,
    /// Every refusal since start, by reason.
    refused: BTreeMap<&'static str, u64>,
    /// Every eviction since start.
    evicted: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            pending: 0,
            pending_by_host: HashMap::new(),
            evictable: BTreeMap::new(),
            evictable_by_host: HashMap::new(),
            next_seq: 0,
            workers: 0,
            clients: 0,
            lines: LogLimiter::new(LOG_WINDOW),
            eviction_lines: LogLimiter::new(LOG_WINDOW),
            refused: BTreeMap::new(),
            evicted: 0,
        }
    }
}

impl State {
    /// Take one handshake place from `host` (its count and, by `seq`, its evictable entry).
    fn release(&mut self, host: IpAddr, seq: u64) {
        self.pending -= 1;
        if let Some(n) = self.pending_by_host.get_mut(&host) {
            *n -= 1;
            if *n == 0 {
                self.pending_by_host.remove(&host);
            }
        }
        self.forget_evictable(host, seq);
    }

    /// `seq` may no longer be evicted; returns its entry when it could be.
    fn forget_evictable(&mut self, host: IpAddr, seq: u64) -> Option<Arc<Eviction>> {
        let entry = self.evictable.remove(&seq)?;
        if let Some(set) = self.evictable_by_host.get_mut(&host) {
            set.remove(&seq);
            if set.is_empty() {
                self.evictable_by_host.remove(&host);
            }
        }
        Some(entry)
    }

    /// The place to evict: the oldest evictable one of the address holding the most handshake
    /// places (among those with an evictable one; the oldest first on a tie).
    fn victim(&self) -> Option<(IpAddr, u64)> {
        self.evictable_by_host
            .iter()
            .filter_map(|(host, seqs)| {
                let oldest = *seqs.first()?;
                let held = self.pending_by_host.get(host).copied().unwrap_or(0);
                Some((held, std::cmp::Reverse(oldest), *host))
            })
            .max()
            .map(|(_, std::cmp::Reverse(seq), host)| (host, seq))
    }
}

/// The admission counters of one master (see the module docs).
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    state: Mutex<State>,
}

/// A connection's place while it is in its handshake; freed when dropped. A newer connection
/// may evict it until [`Pending::hello_received`]; [`Pending::evicted`] resolves then.
#[derive(Debug)]
pub struct Pending {
    gate: Arc<Gate>,
    host: IpAddr,
    seq: u64,
    since: Instant,
    evict: Arc<Eviction>,
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
        self.lock().refused.values().sum()
    }

    /// Refusals since start by reason ([`Refusal::reason`]), and evictions of connections in
    /// their handshake (`handshake_evicted`).
    pub fn refusals(&self) -> BTreeMap<&'static str, u64> {
        let s = self.lock();
        let mut all = s.refused.clone();
        all.insert("handshake_evicted", s.evicted);
        all
    }

    /// Connections in their handshake evicted since start.
    pub fn evicted(&self) -> u64 {
        self.lock().evicted
    }

    /// Sessions and handshakes now: `(clients, workers, pending)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (s.clients, s.workers, s.pending)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handshake place for a connection from `host`. When every handshake place is taken,
    /// the oldest connection that has not sent `HELLO` (of the address holding the most
    /// places) is evicted to make room: its [`Pending::evicted`] resolves.
    ///
    /// # Errors
    /// Why not: every session place is taken, `host` holds all the handshake places it may,
    /// or every handshake place holds a connection that already sent `HELLO`.
    pub fn admit(self: &Arc<Self>, host: IpAddr) -> Result<Pending, Refusal> {
        let l = self.limits;
        let mut s = self.lock();
        if s.workers + s.clients >= l.max_connections {
            return Err(Refusal::Full {
                limit: l.max_connections,
            });
        }
        if s.pending_by_host.get(&host).copied().unwrap_or(0) >= l.max_unauthenticated_per_host {
            return Err(Refusal::Host {
                host,
                limit: l.max_unauthenticated_per_host,
            });
        }
        if s.pending >= l.max_unauthenticated {
            let Some((victim_host, victim)) = s.victim() else {
                return Err(Refusal::Handshakes {
                    limit: l.max_unauthenticated,
                });
            };
            let evicted = s.forget_evictable(victim_host, victim);
            // The victim's place is freed now (its `Drop` then finds nothing to free): the
            // new connection takes it even if the victim's task has not run yet.
            s.pending -= 1;
            if let Some(n) = s.pending_by_host.get_mut(&victim_host) {
                *n -= 1;
                if *n == 0 {
                    s.pending_by_host.remove(&victim_host);
                }
            }
            s.evicted += 1;
            if let Some(e) = evicted {
                e.fired.store(true, Ordering::Relaxed);
                e.notify.notify_one();
            }
        }
        *s.pending_by_host.entry(host).or_insert(0) += 1;
        s.pending += 1;
        let seq = s.next_seq;
        s.next_seq += 1;
        let evict = Arc::new(Eviction::default());
        s.evictable.insert(seq, evict.clone());
        s.evictable_by_host.entry(host).or_default().insert(seq);
        Ok(Pending {
            gate: self.clone(),
            host,
            seq,
            since: Instant::now(),
            evict,
        })
    }

    /// Count a refusal; returns the line to log when one is due (the first, then one per
    /// [`LOG_WINDOW`], saying how many were not logged).
    pub fn note_refusal(&self, refusal: &Refusal, now: Instant) -> Option<String> {
        let mut s = self.lock();
        *s.refused.entry(refusal.reason()).or_insert(0) += 1;
        let held = s.lines.check((), now)?;
        let total: u64 = s.refused.values().sum();
        Some(format!(
            "refused a connection ({}): {}{}; {total} refused since start",
            refusal.reason(),
            refusal.message(),
            suppressed_note(held, LOG_WINDOW),
        ))
    }

    /// The line to log for an eviction (counted when it happened, in [`Gate::admit`]) when one
    /// is due: the first, then one per [`LOG_WINDOW`] saying how many were not logged.
    pub fn note_eviction(&self, peer: &str, age: Duration, now: Instant) -> Option<String> {
        let mut s = self.lock();
        let held = s.eviction_lines.check((), now)?;
        Some(format!(
            "evicted {peer}, silent in its handshake for {:.1} s: all {} handshake places \
             (--max-unauthenticated) were taken and a new connection needed one{}; {} evicted \
             since start",
            age.as_secs_f64(),
            self.limits.max_unauthenticated,
            suppressed_note(held, LOG_WINDOW),
            s.evicted
        ))
    }
}

/// The text of the `busy` error an evicted connection is answered with.
pub fn eviction_message(limit: usize) -> String {
    format!(
        "evicted: this connection sent no HELLO while all {limit} handshake places \
         (--max-unauthenticated) were taken and a newer connection needed one; connect again \
         and send HELLO at once"
    )
}

impl Pending {
    /// Resolves once a newer connection evicted this one (never after
    /// [`Pending::hello_received`]). Its place is already free then.
    pub async fn evicted(&self) {
        self.evict.notify.notified().await;
    }

    /// How long ago this place was given.
    pub fn age(&self) -> Duration {
        self.since.elapsed()
    }

    /// The connection sent its `HELLO`: it keeps its place until it is authenticated or
    /// refused; no newer connection may evict it.
    pub fn hello_received(&self) {
        self.gate.lock().forget_evictable(self.host, self.seq);
    }

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
        // An evicted place was freed by the eviction (the flag is set under this lock).
        if !self.evict.fired.load(Ordering::Relaxed) {
            s.release(self.host, self.seq);
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

    /// Whether `place` was told it was evicted (without waiting).
    fn is_evicted(place: &Pending) -> bool {
        use futures_util::FutureExt;
        place.evicted().now_or_never().is_some()
    }

    #[test]
    fn a_new_connection_evicts_the_oldest_silent_one_when_the_budget_is_full() {
        let gate = Gate::new(Limits::derive(100, Some(4), Some(2), Some(0)));
        let held: Vec<_> = [1, 2, 3, 4].map(|h| gate.admit(ip(h)).unwrap()).into();
        assert_eq!(gate.counts(), (0, 0, 4));
        let newcomer = gate.admit(ip(9)).expect("evicts instead of refusing");
        assert_eq!(
            gate.counts(),
            (0, 0, 4),
            "the victim's place went to the newcomer"
        );
        let evicted: Vec<bool> = held.iter().map(is_evicted).collect();
        assert_eq!(evicted, [true, false, false, false], "the oldest goes");
        assert_eq!((gate.evicted(), gate.refused()), (1, 0));
        drop(held); // the evicted one's place is not freed twice
        assert_eq!(gate.counts(), (0, 0, 1));
        let _session = newcomer.promote(Role::Client).unwrap();
        assert_eq!(gate.counts(), (1, 0, 0));
        assert_eq!(gate.refusals()["handshake_evicted"], 1);
    }

    #[test]
    fn eviction_prefers_the_address_holding_the_most_places() {
        let gate = Gate::new(Limits::derive(100, Some(4), Some(3), Some(0)));
        let a = gate.admit(ip(1)).unwrap(); // the oldest, alone on its address
        let b: Vec<_> = (0..3).map(|_| gate.admit(ip(2)).unwrap()).collect();
        let _c = gate.admit(ip(3)).unwrap();
        assert!(!is_evicted(&a));
        assert!(is_evicted(&b[0]), "the oldest of the address holding three");
        assert!(!is_evicted(&b[1]) && !is_evicted(&b[2]));
    }

    #[test]
    fn a_connection_that_sent_hello_is_not_evicted() {
        let gate = Gate::new(Limits::derive(100, Some(2), Some(2), Some(0)));
        let held: Vec<_> = (1..=2).map(|h| gate.admit(ip(h)).unwrap()).collect();
        held[0].hello_received();
        let _new = gate.admit(ip(3)).unwrap();
        assert!(!is_evicted(&held[0]) && is_evicted(&held[1]));
        // Now both places hold a connection past its HELLO or its newest: the next waits.
        _new.hello_received();
        let refusal = gate.admit(ip(4)).unwrap_err();
        assert_eq!(refusal.reason(), "max_unauthenticated");
        gate.note_refusal(&refusal, Instant::now());
        assert_eq!(gate.refusals()["max_unauthenticated"], 1);
        drop(held);
        assert_eq!(gate.counts(), (0, 0, 1));
    }

    #[test]
    fn the_per_address_limit_still_refuses() {
        let gate = Gate::new(Limits::derive(100, Some(4), Some(2), Some(0)));
        let _held: Vec<_> = (0..2).map(|_| gate.admit(ip(1)).unwrap()).collect();
        let _other: Vec<_> = (0..2).map(|_| gate.admit(ip(2)).unwrap()).collect();
        assert_eq!(
            gate.admit(ip(1)).unwrap_err().reason(),
            "max_unauthenticated_per_host"
        );
        assert_eq!(gate.evicted(), 0);
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
