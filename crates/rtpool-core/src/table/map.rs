//! The core's hash maps and sets: [`Map`] and [`Set`] for keys a peer chooses, [`IdMap`] and
//! [`IdSet`] for the ids the master hands out, hashed with [`IdHasher`]. All grow
//! incrementally (griddle), so no insert pays for the whole table; growing them ahead of need
//! is [`super::ahead`]'s job.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasherDefault, Hasher};

/// The core's hash map: [`griddle::HashMap`], which grows incrementally. A std (hashbrown) map
/// that outgrows its table rehashes every entry in the one insert that crossed the line; griddle
/// allocates the bigger table and moves 8 old entries with each later insert, so no single
/// insert pays for more than a bounded share of the resize. Lookups look in both tables while
/// the move lasts. Same SipHash hasher as `std`.
pub(crate) type Map<K, V> = griddle::HashMap<K, V, RandomState>;

/// The core's hash set: [`griddle::HashSet`], which grows incrementally like [`Map`].
pub(crate) type Set<T> = griddle::HashSet<T, RandomState>;

/// A [`Map`] keyed by ids the master hands out (tasks, packages and their slab keys, workers,
/// clients, users, worker keys), hashed with [`IdHasher`]. Keys a peer chooses (function
/// hashes, idempotency keys, service names) stay in a [`Map`], under SipHash.
pub(crate) type IdMap<K, V> = griddle::HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A [`Set`] of ids the master hands out, hashed with [`IdHasher`] (see [`IdMap`]).
pub(crate) type IdSet<T> = griddle::HashSet<T, BuildHasherDefault<IdHasher>>;

/// A hasher for ids the master hands out, never a peer's input: one rotation, one xor and one
/// multiplication per word (FxHash's), where SipHash takes about a hundred instructions. A
/// no-op task goes through some 40 map operations in the core, and hashing was a sixth of the
/// scheduler's instructions per task (issue 13). Multiplying by an odd constant maps the low
/// bits of consecutive ids one to one, so slab keys spread over the buckets; the top bits
/// (hashbrown's control byte) mix every bit of the id.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u64(u64::from(n as u32));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    #[test]
    fn id_hasher_spreads_consecutive_slab_keys_over_buckets_and_control_bytes() {
        use std::collections::HashSet;
        use std::hash::{BuildHasher, BuildHasherDefault};

        let build = BuildHasherDefault::<IdHasher>::default();
        let mut t = Table::default();
        let keys: Vec<u64> = (0..4096).map(|i| t.insert(i)).collect();
        // The bucket index of a 4,096-bucket table: one key per bucket.
        let buckets: HashSet<u64> = keys.iter().map(|&k| build.hash_one(k) & 4095).collect();
        assert_eq!(buckets.len(), keys.len());
        // The top 7 bits (hashbrown's control byte) take most of their 128 values.
        let control: HashSet<u64> = keys.iter().map(|&k| build.hash_one(k) >> 57).collect();
        assert!(control.len() > 100, "{} control bytes", control.len());
        // An id newtype hashes as its integer; bytes hash by 8-byte words.
        assert_eq!(
            build.hash_one(crate::TaskId(keys[7])),
            build.hash_one(keys[7])
        );
        assert_ne!(build.hash_one([1u8; 9]), build.hash_one([1u8; 10]));
    }
}
