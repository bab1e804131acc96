//! Package ids that cannot be confused: unguessable, unique within a master's lifetime, and
//! (with overwhelming probability) unique across lifetimes and tenants.
//!
//! A client re-attaches to its packages by id after a reconnect. Sequential ids (1, 2, 3, ...
//! restarting at 1 without a journal) let a client re-attach to the package another client of
//! the same user created after a restart, and leak every tenant's volume. Here an id is a keyed
//! permutation of a counter: a 4-round Feistel network over 52 bits whose round function is
//! SipHash under a key drawn from the OS at start-up, fresh for each master lifetime. A
//! permutation never repeats a value within a lifetime; a fresh key makes an id of another
//! lifetime as likely as any other of 2^52 values; and without the key nobody can tell from one
//! id the next one or how many came before.
//!
//! Every id has bit 52 set and nothing above it: ids are never 0 (the "not numbered yet"
//! placeholder), never collide with the sequential ids of older journals (below 2^52), and stay
//! exact in a JSON number (at most 2^53). Ids replayed from the journal are reserved, so a new
//! package never takes a restored package's id. The scheduler owns one [`PackageIds`]; it
//! numbers both submitted packages and packages of calls.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use rtpool_core::PackageId;

/// Bits of the permuted counter.
const ID_BITS: u32 = 52;
const HALF_BITS: u32 = ID_BITS / 2;
const HALF_MASK: u64 = (1 << HALF_BITS) - 1;
/// Set in every id: nonzero, and above every sequential id an older journal holds.
const MARK: u64 = 1 << ID_BITS;
const ROUNDS: u64 = 4;

/// Draws package ids; see the module docs.
pub struct PackageIds {
    /// SipHash keyed from the OS random source (std's `RandomState`), fresh per process.
    key: RandomState,
    counter: u64,
    /// Ids in use that this generator did not draw (restored from the journal).
    reserved: HashSet<u64>,
}

impl std::fmt::Debug for PackageIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays secret: only how many ids were drawn.
        f.debug_struct("PackageIds")
            .field("drawn", &self.counter)
            .finish_non_exhaustive()
    }
}

impl Default for PackageIds {
    fn default() -> Self {
        Self::new()
    }
}

impl PackageIds {
    /// A generator with a fresh random key.
    pub fn new() -> Self {
        Self {
            key: RandomState::new(),
            counter: 0,
            reserved: HashSet::new(),
        }
    }

    /// Never hand out `id` (a package restored from the journal keeps its id).
    pub fn reserve(&mut self, id: PackageId) {
        self.reserved.insert(id.0);
    }

    /// The next id: distinct from every id drawn before by this generator and every reserved
    /// one.
    pub fn next_id(&mut self) -> PackageId {
        loop {
            // 2^52 ids per lifetime: at a million packages a second, 140 years.
            let id = MARK | self.permute(self.counter & ((1 << ID_BITS) - 1));
            self.counter += 1;
            if !self.reserved.contains(&id) {
                return PackageId(id);
            }
        }
    }

    /// A bijection of `[0, 2^52)` (balanced Feistel network: any round function gives one).
    fn permute(&self, x: u64) -> u64 {
        let (mut left, mut right) = (x >> HALF_BITS, x & HALF_MASK);
        for round in 0..ROUNDS {
            let f = self.key.hash_one((round, right)) & HALF_MASK;
            (left, right) = (right, left ^ f);
        }
        (left << HALF_BITS) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_marked_and_json_safe() {
        let mut ids = PackageIds::new();
        let drawn: Vec<u64> = (0..100_000).map(|_| ids.next_id().0).collect();
        let set: HashSet<u64> = drawn.iter().copied().collect();
        assert_eq!(set.len(), drawn.len(), "an id repeated within a lifetime");
        assert!(drawn.iter().all(|id| id >> ID_BITS == 1), "{drawn:?}");
        // Not a counter: consecutive ids are not consecutive numbers.
        let steps = drawn.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(steps < 10, "{steps} consecutive ids differ by one");
    }

    #[test]
    fn a_fresh_lifetime_draws_other_ids() {
        let first: HashSet<u64> = {
            let mut ids = PackageIds::new();
            (0..1000).map(|_| ids.next_id().0).collect()
        };
        let mut again = PackageIds::new();
        let common = (0..1000)
            .filter(|_| first.contains(&again.next_id().0))
            .count();
        assert_eq!(common, 0, "two lifetimes drew the same ids");
    }

    #[test]
    fn reserved_ids_are_skipped() {
        let mut probe = PackageIds::new();
        let key = probe.key.clone();
        let taken = probe.next_id();
        let mut ids = PackageIds {
            key,
            counter: 0,
            reserved: HashSet::new(),
        };
        ids.reserve(taken);
        assert_ne!(ids.next_id(), taken);
    }

    #[test]
    fn permute_is_a_bijection_on_a_sample() {
        let ids = PackageIds::new();
        let outs: HashSet<u64> = (0..50_000u64).map(|x| ids.permute(x)).collect();
        assert_eq!(outs.len(), 50_000);
        assert!(outs.iter().all(|x| *x < (1 << ID_BITS)));
    }
}
