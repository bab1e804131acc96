//! Where to dial next among several masters (a leader and its standbys, `docs/ha.md`): the
//! address that gave the last session first, the leader a `not_leader` named (a standby's
//! answer to `HELLO`, or a deposed leader's on an open session) before that, and each address
//! at most once per pass. Dialling itself is `session.rs`'s; this module does no I/O.
//!
//! It also paces the passes (as the Python side's `_masters.py`): while a standby answers
//! (an election under way, and a standby is cheap to ask) the next pass comes after
//! [`LEADER_SEARCH_PAUSE`], not after the doubling backoff; and with several addresses each
//! waits at most [`FIRST_PASS_TIMEOUT`] (doubling while passes find no master at all), so a
//! dead or cut address costs little.

use std::time::Duration;

/// The pause before the next pass while a standby answers (drawn between half and all of it).
pub(crate) const LEADER_SEARCH_PAUSE: Duration = Duration::from_millis(100);
/// With several addresses, the most one address may take in a pass (connect and handshake),
/// doubled by each pass in a row that found no master at all.
pub(crate) const FIRST_PASS_TIMEOUT: Duration = Duration::from_secs(1);

/// The addresses of a [`Config`](crate::Config) and what dialling learned about them.
#[derive(Debug, Clone)]
pub(crate) struct Masters {
    addresses: Vec<String>,
    /// The address of the last session.
    last: Option<String>,
    /// The leader a `not_leader` named, dialled first in the next pass.
    leader: Option<String>,
    /// Whether the last failed pass had a standby answering (the leader is being elected).
    pub(crate) standby_answered: bool,
    /// Failed passes in a row in which no master answered (refused, silent, unresolvable).
    unanswered_passes: u32,
}

impl Masters {
    pub(crate) fn new(addresses: &[String]) -> Masters {
        Masters {
            addresses: addresses.to_vec(),
            last: None,
            leader: None,
            standby_answered: false,
            unanswered_passes: 0,
        }
    }

    /// A pass found no leader; `answered`: a master answered (a standby).
    pub(crate) fn on_pass_failed(&mut self, answered: bool) {
        self.standby_answered = answered;
        self.unanswered_passes = if answered {
            0
        } else {
            self.unanswered_passes.saturating_add(1)
        };
    }

    /// The most one address may take in the next pass: `timeout` for one address; for
    /// several [`FIRST_PASS_TIMEOUT`], doubled by each pass in a row that found no master at
    /// all (a slow but live one still gets its time), up to `timeout`.
    pub(crate) fn dial_timeout(&self, timeout: Duration) -> Duration {
        if self.addresses.len() > 1 {
            timeout.min(FIRST_PASS_TIMEOUT * (1u32 << self.unanswered_passes.min(16)))
        } else {
            timeout
        }
    }

    /// A session ended with `not_leader` (`reason` holds its message): dial the leader it
    /// names first.
    pub(crate) fn follow(&mut self, reason: &str) {
        self.leader = leader_of(reason);
    }

    /// The order of one pass: the named leader (even if not in the list), else the address
    /// of the last session, then the rest of the list in its order.
    pub(crate) fn pass(&mut self) -> Vec<String> {
        let mut out = self.addresses.clone();
        let first = self.leader.take().or_else(|| self.last.clone());
        if let Some(first) = first {
            match out.iter().position(|a| *a == first) {
                Some(i) => out.rotate_left(i),
                None => out.insert(0, first),
            }
        }
        out
    }

    /// `address` gave a session: the next pass starts with it.
    pub(crate) fn on_connected(&mut self, address: &str) {
        self.last = Some(address.to_owned());
        self.standby_answered = false;
        self.unanswered_passes = 0;
    }

    /// `address` could not be dialled: a followed leader outside the list is forgotten.
    pub(crate) fn on_failed(&mut self, address: &str) {
        if self.last.as_deref() == Some(address) && !self.addresses.iter().any(|a| a == address) {
            self.last = None;
        }
    }
}

/// The leader a `not_leader` message names (`... (leader: HOST:PORT)`), or `None` for
/// `(leader: unknown)` or no such part.
pub(crate) fn leader_of(message: &str) -> Option<String> {
    let at = message.rfind("(leader: ")? + "(leader: ".len();
    let rest = &message[at..];
    let leader = rest[..rest.find(')')?].trim();
    let valid = matches!(leader.rsplit_once(':'), Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok());
    (valid && leader != "unknown").then(|| leader.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masters(list: &[&str]) -> Masters {
        Masters::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn a_pass_starts_with_the_last_good_address() {
        let mut m = masters(&["a:1", "b:2", "c:3"]);
        assert_eq!(m.pass(), ["a:1", "b:2", "c:3"]);
        m.on_connected("b:2");
        assert_eq!(m.pass(), ["b:2", "c:3", "a:1"]);
    }

    #[test]
    fn a_named_leader_comes_first_once_even_outside_the_list() {
        let mut m = masters(&["a:1", "b:2"]);
        m.follow("the master closed the connection (not_leader: lost the lease (leader: z:9))");
        assert_eq!(m.pass(), ["z:9", "a:1", "b:2"]);
        assert_eq!(m.pass(), ["a:1", "b:2"]);
        m.follow("standby (leader: b:2)");
        assert_eq!(m.pass(), ["b:2", "a:1"]);
        m.on_connected("z:9");
        m.on_failed("z:9");
        assert_eq!(m.pass(), ["a:1", "b:2"]);
    }

    #[test]
    fn several_addresses_get_a_short_wait_until_a_pass_finds_no_master() {
        let long = Duration::from_secs(10);
        let mut m = masters(&["a:1", "b:2"]);
        assert_eq!(m.dial_timeout(long), FIRST_PASS_TIMEOUT);
        m.on_pass_failed(true); // a standby answered: still short, and soon
        assert!(m.standby_answered);
        assert_eq!(m.dial_timeout(long), FIRST_PASS_TIMEOUT);
        m.on_pass_failed(false); // nobody: twice the wait next time, up to the timeout
        assert_eq!(m.dial_timeout(long), 2 * FIRST_PASS_TIMEOUT);
        for _ in 0..5 {
            m.on_pass_failed(false);
        }
        assert_eq!(m.dial_timeout(long), long);
        m.on_connected("b:2");
        assert_eq!(m.dial_timeout(long), FIRST_PASS_TIMEOUT);
        assert_eq!(masters(&["a:1"]).dial_timeout(long), long);
    }

    #[test]
    fn leader_of_reads_the_end_of_the_message() {
        assert_eq!(
            leader_of("standby (leader: 10.0.0.2:7070)").as_deref(),
            Some("10.0.0.2:7070")
        );
        assert_eq!(leader_of("standby (leader: unknown)"), None);
        assert_eq!(leader_of("standby (leader: nonsense)"), None);
        assert_eq!(leader_of("busy"), None);
    }
}
