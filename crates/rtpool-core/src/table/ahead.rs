//! [`Ahead`]: grows a [`Map`](super::Map) or [`Set`](super::Set) before it is full, a
//! bounded share per idle call, so the resize and the first touch of its memory happen off the hot
//! path; [`Growable`] is what it needs of a map.

/// A [`Map`](super::Map) or [`Set`](super::Set) (any hasher) that [`Ahead`] can grow ahead of
/// need.
pub(crate) trait Growable {
    /// The key [`Ahead`] inserts and removes again to move entries into a new table.
    type Key;
    /// Entries.
    fn len(&self) -> usize;
    /// Entries it holds before it must grow.
    fn capacity(&self) -> usize;
    /// Starts an incremental resize to room for `additional` more entries.
    fn reserve(&mut self, additional: usize);
    /// Inserts `key` and removes it again (each insert moves a few entries of a resize in
    /// progress); does nothing if `key` is a real entry.
    fn poke(&mut self, key: Self::Key);
}

impl<K: std::hash::Hash + Eq + Clone, V: Default, S: std::hash::BuildHasher> Growable
    for griddle::HashMap<K, V, S>
{
    type Key = K;
    fn len(&self) -> usize {
        griddle::HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        griddle::HashMap::capacity(self)
    }
    fn reserve(&mut self, additional: usize) {
        griddle::HashMap::reserve(self, additional);
    }
    fn poke(&mut self, key: K) {
        if !self.contains_key(&key) {
            self.insert(key.clone(), V::default());
            self.remove(&key);
        }
    }
}

impl<T: std::hash::Hash + Eq + Clone, S: std::hash::BuildHasher> Growable
    for griddle::HashSet<T, S>
{
    type Key = T;
    fn len(&self) -> usize {
        griddle::HashSet::len(self)
    }
    fn capacity(&self) -> usize {
        griddle::HashSet::capacity(self)
    }
    fn reserve(&mut self, additional: usize) {
        griddle::HashSet::reserve(self, additional);
    }
    fn poke(&mut self, key: T) {
        if self.insert(key.clone()) {
            self.remove(&key);
        }
    }
}

/// Grows a [`Map`](super::Map) or [`Set`](super::Set) ahead of need, off the hot path.
///
/// A griddle map grows incrementally (8 entries moved per insert), but the new table is fresh
/// memory: the inserts that move entries into it take its first-touch page faults, several in
/// one insert right after the resize (a few hundred microseconds on a busy VM, measured at
/// 10^6 queued tasks). So the shell's idle calls start the resize early, at four fifths full,
/// to double the room, and move the entries themselves (an insert and removal of a key that
/// is not an entry, which moves 8): by the time the operations need the room, the new table
/// is filled and touched.
///
/// Never called on a resize griddle started by itself: that one is finished by the inserts
/// that take the table from full to four fifths of its doubled room (3/5 of the old length,
/// where the move needs 1/8).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Ahead {
    /// Pokes left to finish the resize this started.
    pokes_left: usize,
}

impl Ahead {
    /// Below this many entries, a resize is small enough to leave to the map.
    const MIN_LEN: usize = 256;

    /// One bounded share of growing `map` ahead of need: at most `max_pokes` pokes of `spare`
    /// (a key that is no entry; if it is one, nothing moves this call). Returns whether more
    /// is left to do. O(`max_pokes`) (the resize's allocation aside).
    pub(crate) fn prepare<M: Growable>(
        &mut self,
        map: &mut M,
        spare: M::Key,
        max_pokes: usize,
    ) -> bool
    where
        M::Key: Clone,
    {
        if self.pokes_left == 0 {
            let (len, cap) = (map.len(), map.capacity());
            if len < Self::MIN_LEN || cap - len >= cap / 5 {
                return false;
            }
            map.reserve(len);
            self.pokes_left = len.div_ceil(8) + 1;
        }
        let n = self.pokes_left.min(max_pokes);
        for _ in 0..n {
            map.poke(spare.clone());
        }
        self.pokes_left -= n;
        self.pokes_left > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Map, Set};

    #[test]
    fn ahead_grows_a_map_before_it_is_full_and_keeps_every_entry() {
        let mut m: Map<u64, u64> = Map::default();
        let mut ahead = Ahead::default();
        let mut grew_ahead = 0;
        for i in 0..100_000u64 {
            let cap = m.capacity();
            if m.len() >= Ahead::MIN_LEN && m.len() == cap {
                panic!("the map filled up at {i} entries: prepare did not grow it ahead");
            }
            m.insert(i, i + 1);
            let before = m.capacity();
            while ahead.prepare(&mut m, u64::MAX, 32) {}
            if m.capacity() > before {
                grew_ahead += 1;
                // Doubles the room, less at most one slot: the spare key's insert and remove
                // may leave a tombstone in the new table (hash-dependent: the map's hasher is
                // random, so this was seen once in 40 runs as 14336 -> 28671).
                assert!(
                    m.capacity() + 1 >= 2 * before,
                    "doubles the room: {before} -> {} at {i}",
                    m.capacity()
                );
            }
        }
        assert!(grew_ahead >= 7, "grew {grew_ahead} times ahead of need");
        assert_eq!(m.len(), 100_000);
        assert!((0..100_000u64).all(|i| m.get(&i) == Some(&(i + 1))));
        assert!(!m.contains_key(&u64::MAX), "the spare key is never left in");
        // A spare key that is an entry moves nothing and is kept.
        m.insert(u64::MAX, 5);
        let mut s: Set<u64> = (0..1000).collect();
        while Ahead::default().prepare(&mut m, u64::MAX, 8) {}
        while ahead.prepare(&mut s, u64::MAX, 8) {}
        assert_eq!(m.get(&u64::MAX), Some(&5));
        assert_eq!(s.len(), 1000);
        assert!(!s.contains(&u64::MAX));
    }
}
