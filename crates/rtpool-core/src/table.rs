//! [`Table`]: a generational slab with a free list, the storage of tasks and packages.
//!
//! Get, insert and remove are O(1) and never scan (the RT-BOINC rule). Insert is O(1) in the
//! worst case too, not only amortised: the slots live in fixed-size chunks ([`Chunks`]) that are
//! allocated one at a time and never move, so a table that grows never copies what it holds
//! (a doubling `Vec` would stall the scheduler for the whole copy: 12.6 ms at 10^5 tasks). An id packs the slot index in its low 32 bits and the slot's
//! generation in its high 32 bits; removing a value bumps the generation, so an id kept after its
//! value was removed (a late worker result, an index of a package whose task was freed) is
//! recognised as stale instead of reaching whatever reuses the slot. The table knows nothing of
//! what it stores: the id newtypes are the caller's business.
//!
//! The core's hash maps and sets ([`Map`], [`Set`], and [`IdMap`], [`IdSet`] for the ids the
//! master hands out) are defined here too: they obey the same rule, no insert that pays for the
//! whole table.

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

/// A [`Map`] or [`Set`] (any hasher) that [`Ahead`] can grow ahead of need.
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

/// Grows a [`Map`] or [`Set`] ahead of need, off the hot path.
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

/// One slot: a live value, or a hole that remembers the generation its next value gets.
#[derive(Debug, Clone)]
enum Slot<T> {
    Occupied {
        generation: u32,
        value: T,
    },
    Vacant {
        generation: u32,
        next_free: Option<u32>,
    },
}

/// log2 of the slots per chunk.
const CHUNK_BITS: u32 = 10;
/// Slots per chunk: 1,024, so a table of tasks allocates a few hundred KiB at a time and wastes
/// at most one chunk.
const CHUNK: usize = 1 << CHUNK_BITS;

/// A vector of slots stored in chunks of [`CHUNK`] that never reallocate: growing allocates one
/// more chunk (whose pages the pushes then touch one by one) and appends its header to the
/// chunk list, which is the only part that ever doubles (24 bytes a chunk: 23 KiB at 10^6
/// slots).
///
/// The next chunk may be made ahead of need by [`Chunks::prepare`], a bounded number of slots
/// per call, filled with placeholders: the first touch of fresh memory (a page fault each 4
/// KiB, tens of microseconds on a busy VM) is then paid there, off the hot path, rather than
/// by the operation that needs the slots. Slots past `len` hold placeholders and are never
/// read.
#[derive(Debug, Clone)]
struct Chunks<S> {
    chunks: Vec<Vec<S>>,
    len: usize,
    /// The next chunk, being filled with placeholders (capacity [`CHUNK`]).
    spare: Option<Vec<S>>,
}

impl<S> Default for Chunks<S> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            spare: None,
        }
    }
}

impl<S> Chunks<S> {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Option<&S> {
        if index >= self.len {
            return None;
        }
        self.chunks
            .get(index >> CHUNK_BITS)?
            .get(index & (CHUNK - 1))
    }

    fn get_mut(&mut self, index: usize) -> Option<&mut S> {
        if index >= self.len {
            return None;
        }
        self.chunks
            .get_mut(index >> CHUNK_BITS)?
            .get_mut(index & (CHUNK - 1))
    }

    fn push(&mut self, slot: S) {
        let (c, i) = (self.len >> CHUNK_BITS, self.len & (CHUNK - 1));
        if c == self.chunks.len() {
            // The prepared chunk if any, else a fresh one at full capacity: its pushes never
            // reallocate.
            let chunk = self
                .spare
                .take()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK));
            self.chunks.push(chunk);
        }
        let chunk = &mut self.chunks[c];
        if i < chunk.len() {
            chunk[i] = slot; // over a placeholder
        } else {
            chunk.push(slot);
        }
        self.len += 1;
    }

    /// Fills up to `max_slots` more slots of the next chunk with `filler`, allocating it first
    /// if needed, so that chunk's memory is touched before a push needs it. Returns false when
    /// there is nothing left to prepare (the next chunk is ready). O(`max_slots`).
    ///
    /// The rest of the current chunk comes first: a chunk started without a prepared one (a
    /// burst that outran the shell's idle calls, or a table grown before any) has untouched
    /// memory past its last slot.
    fn prepare(&mut self, max_slots: usize, filler: impl Fn() -> S) -> bool {
        if self.chunks.len() == self.chunks.capacity() {
            // The list of chunks doubles here rather than in the push that needs the room
            // (24 bytes a chunk: a 23 KiB copy at 10^6 slots).
            self.chunks.reserve(self.chunks.len().max(4));
        }
        let mut budget = max_slots;
        if let Some(last) = self.chunks.last_mut() {
            let n = budget.min(CHUNK - last.len());
            last.extend((0..n).map(|_| filler()));
            budget -= n;
        }
        let spare = self.spare.get_or_insert_with(|| Vec::with_capacity(CHUNK));
        let n = budget.min(CHUNK - spare.len());
        spare.extend((0..n).map(|_| filler()));
        spare.len() < CHUNK || self.chunks.last().is_some_and(|c| c.len() < CHUNK)
    }

    fn iter(&self) -> impl Iterator<Item = &S> {
        self.chunks.iter().flatten().take(self.len)
    }
}

impl<S> std::ops::Index<usize> for Chunks<S> {
    type Output = S;

    fn index(&self, index: usize) -> &S {
        self.get(index).expect("slot index in range")
    }
}

impl<S> std::ops::IndexMut<usize> for Chunks<S> {
    fn index_mut(&mut self, index: usize) -> &mut S {
        self.get_mut(index).expect("slot index in range")
    }
}

/// A generational slab keyed by packed `u64` ids.
#[derive(Debug, Clone)]
pub(crate) struct Table<T> {
    slots: Chunks<Slot<T>>,
    /// Head of the free list (most recently freed first, which keeps the hot slots hot).
    free_head: Option<u32>,
    len: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            slots: Chunks::default(),
            free_head: None,
            len: 0,
        }
    }
}

/// Packs a slot index and generation into an id.
fn pack(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

/// Splits an id into slot index and generation.
fn unpack(id: u64) -> (u32, u32) {
    // Truncation is the point: low half is the index, high half the generation.
    (id as u32, (id >> 32) as u32)
}

impl<T> Table<T> {
    /// Live values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value` and returns its id.
    ///
    /// # Panics
    ///
    /// If the table would need more than 2^32 slots.
    pub(crate) fn insert(&mut self, value: T) -> u64 {
        self.len += 1;
        if let Some(index) = self.free_head {
            let slot = &mut self.slots[index as usize];
            let Slot::Vacant {
                generation,
                next_free,
            } = *slot
            else {
                panic!("table free list points at occupied slot {index}");
            };
            self.free_head = next_free;
            *slot = Slot::Occupied { generation, value };
            return pack(index, generation);
        }
        let index = u32::try_from(self.slots.len()).expect("table is full: 2^32 slots");
        self.slots.push(Slot::Occupied {
            generation: 0,
            value,
        });
        pack(index, 0)
    }

    /// Makes up to `max_slots` slots of the next chunk ahead of need (see [`Chunks`]): a
    /// caller with time to spare (the master between events) takes the first touch of the
    /// memory a growing table needs off the operations that grow it. Returns whether more is
    /// left to prepare. O(`max_slots`).
    pub(crate) fn prepare(&mut self, max_slots: usize) -> bool {
        self.slots.prepare(max_slots, || Slot::Vacant {
            generation: 0,
            next_free: None,
        })
    }

    /// The value of `id`, or `None` if it was removed (or never existed).
    pub(crate) fn get(&self, id: u64) -> Option<&T> {
        let (index, generation) = unpack(id);
        match self.slots.get(index as usize)? {
            Slot::Occupied {
                generation: g,
                value,
            } if *g == generation => Some(value),
            _ => None,
        }
    }

    /// The value of `id` for mutation, or `None` if it was removed (or never existed).
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let (index, generation) = unpack(id);
        match self.slots.get_mut(index as usize)? {
            Slot::Occupied {
                generation: g,
                value,
            } if *g == generation => Some(value),
            _ => None,
        }
    }

    /// Removes and returns the value of `id`, or `None` if the id is stale.
    ///
    /// A slot whose generation is exhausted is retired rather than reused, so an id can never
    /// come back to life after 2^32 reuses of its slot.
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
        let (index, generation) = unpack(id);
        let slot = self.slots.get_mut(index as usize)?;
        if !matches!(slot, Slot::Occupied { generation: g, .. } if *g == generation) {
            return None;
        }
        let next = generation.checked_add(1);
        let vacant = Slot::Vacant {
            generation: next.unwrap_or(u32::MAX),
            next_free: self.free_head,
        };
        let Slot::Occupied { value, .. } = std::mem::replace(slot, vacant) else {
            unreachable!("slot checked occupied above");
        };
        if next.is_some() {
            self.free_head = Some(index);
        }
        self.len -= 1;
        Some(value)
    }

    /// Every live `(id, value)`, in slot order. O(slots): for invariant checks only.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot {
                Slot::Occupied { generation, value } => Some((pack(i as u32, *generation), value)),
                Slot::Vacant { .. } => None,
            })
    }

    /// Panics if the length or the free list disagree with the slots. O(slots).
    pub(crate) fn check(&self) {
        let occupied = self.iter().count();
        assert_eq!(
            occupied, self.len,
            "table len {} but {} occupied slots",
            self.len, occupied
        );
        let mut seen = vec![false; self.slots.len()];
        let mut cursor = self.free_head;
        while let Some(index) = cursor {
            let i = index as usize;
            assert!(!seen[i], "table free list loops at slot {index}");
            seen[i] = true;
            match self.slots[i] {
                Slot::Vacant { next_free, .. } => cursor = next_free,
                Slot::Occupied { .. } => panic!("table free list holds occupied slot {index}"),
            }
        }
    }
}

/// A map from the ids of one [`Table`] to values, each stored at its id's slot index in
/// chunks that never move, like the table's own: O(1) get, insert and remove with no hashing
/// and no resize, and its growth made ahead of need by [`DenseMap::prepare`]. For values that
/// most of a table's ids have (the ready queue's entry of a package): an insert at an index
/// far past the end fills the slots between, so an id space used sparsely wants a [`Map`].
#[derive(Debug, Clone)]
pub(crate) struct DenseMap<T> {
    /// At each index: the full id stored there (its generation tells a reused slot apart) and
    /// its value, or nothing.
    slots: Chunks<Option<(u64, T)>>,
    len: usize,
}

impl<T> Default for DenseMap<T> {
    fn default() -> Self {
        Self {
            slots: Chunks::default(),
            len: 0,
        }
    }
}

impl<T> DenseMap<T> {
    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The value of `id`.
    pub(crate) fn get(&self, id: u64) -> Option<&T> {
        match self.slots.get(unpack(id).0 as usize)? {
            Some((k, value)) if *k == id => Some(value),
            _ => None,
        }
    }

    /// The value of `id`, for mutation.
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        match self.slots.get_mut(unpack(id).0 as usize)? {
            Some((k, value)) if *k == id => Some(value),
            _ => None,
        }
    }

    /// The value of `id`, inserted with `make` if it has none. O(1) when the index is at most
    /// one past the end (a table grows one slot at a time).
    ///
    /// # Panics
    ///
    /// If another id of the same slot (another generation) holds a value: the caller removes
    /// a value before its table reuses the slot.
    pub(crate) fn get_or_insert_with(&mut self, id: u64, make: impl FnOnce() -> T) -> &mut T {
        let index = unpack(id).0 as usize;
        while self.slots.len() <= index {
            self.slots.push(None);
        }
        let slot = &mut self.slots[index];
        if let Some((k, _)) = slot {
            assert_eq!(*k, id, "dense map: slot {index} still holds id {k}");
        } else {
            *slot = Some((id, make()));
            self.len += 1;
        }
        &mut slot.as_mut().expect("just filled").1
    }

    /// Removes and returns the value of `id`.
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
        let slot = self.slots.get_mut(unpack(id).0 as usize)?;
        if !matches!(slot, Some((k, _)) if *k == id) {
            return None;
        }
        self.len -= 1;
        slot.take().map(|(_, value)| value)
    }

    /// Makes up to `max_slots` empty slots ahead of need (see [`Chunks`]). Returns whether
    /// more is left to prepare. O(`max_slots`).
    pub(crate) fn prepare(&mut self, max_slots: usize) -> bool {
        self.slots.prepare(max_slots, || None)
    }

    /// Every `(id, value)`, in slot order. O(slots): for invariant checks only.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots
            .iter()
            .filter_map(|slot| slot.as_ref().map(|(k, v)| (*k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_map_follows_a_tables_ids() {
        let mut t = Table::default();
        let mut m = DenseMap::default();
        let ids: Vec<u64> = (0..3000).map(|i| t.insert(i)).collect();
        for &id in &ids[..2500] {
            *m.get_or_insert_with(id, || 0) += id as u32;
        }
        assert_eq!(m.len(), 2500);
        assert_eq!(m.get(ids[7]), Some(&7));
        assert_eq!(m.get(ids[2700]), None, "past the end");
        assert_eq!(
            m.get_or_insert_with(ids[7], || 99),
            &mut 7,
            "kept, not replaced"
        );
        assert_eq!(m.remove(ids[7]), Some(7));
        assert_eq!(m.remove(ids[7]), None);
        assert_eq!(m.len(), 2499);
        // The slot reused by the table under a new generation: the old id is not the new.
        t.remove(ids[7]);
        let again = t.insert(7);
        assert_eq!(again as u32, ids[7] as u32);
        assert_eq!(m.get(again), None);
        m.get_or_insert_with(again, || 70);
        assert_eq!(m.get(again), Some(&70));
        assert_eq!(m.get(ids[7]), None, "a stale id finds nothing");
        // An index far past the end fills the slots between, which stay empty.
        m.get_or_insert_with(ids[2999], || 5);
        assert_eq!(m.get(ids[2999]), Some(&5));
        assert_eq!(m.get(ids[2800]), None);
        assert_eq!(m.iter().count(), 2501);
        assert_eq!(m.len(), 2501);
    }

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
                assert!(m.capacity() >= 2 * before, "doubles the room");
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

    #[test]
    #[should_panic(expected = "still holds")]
    fn dense_map_refuses_a_reused_slot_before_removal() {
        let mut m = DenseMap::default();
        m.get_or_insert_with(pack(3, 0), || 1);
        m.get_or_insert_with(pack(3, 1), || 2);
    }

    #[test]
    fn a_prepared_dense_map_grows_into_its_prepared_chunk() {
        let mut m: DenseMap<u64> = DenseMap::default();
        for i in 0..CHUNK as u32 {
            m.get_or_insert_with(pack(i, 0), || 1);
        }
        while m.prepare(300) {}
        let spare = m.slots.spare.as_ref().map(|s| s.as_ptr() as usize);
        m.get_or_insert_with(pack(CHUNK as u32, 0), || 2);
        assert_eq!(
            m.slots.chunks.last().map(|c| c.as_ptr() as usize),
            spare,
            "the prepared chunk holds the new entry"
        );
        assert_eq!(m.get(pack(CHUNK as u32, 0)), Some(&2));
        assert_eq!(
            m.get(pack(CHUNK as u32 + 1, 0)),
            None,
            "a placeholder is no value"
        );
    }

    #[test]
    fn insert_get_remove() {
        let mut t = Table::default();
        let a = t.insert("a");
        let b = t.insert("b");
        assert_ne!(a, b);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a), Some(&"a"));
        *t.get_mut(b).unwrap() = "B";
        assert_eq!(t.remove(b), Some("B"));
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(b), None);
        t.check();
    }

    #[test]
    fn stale_id_is_rejected_after_reuse() {
        let mut t = Table::default();
        let a = t.insert(1);
        assert_eq!(t.remove(a), Some(1));
        let b = t.insert(2);
        assert_eq!(a as u32, b as u32, "the slot is reused");
        assert_ne!(a, b, "with a new generation");
        assert_eq!(t.get(a), None);
        assert_eq!(t.get_mut(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&2));
        t.check();
    }

    #[test]
    fn double_remove_is_none() {
        let mut t = Table::default();
        let a = t.insert(1);
        assert_eq!(t.remove(a), Some(1));
        assert_eq!(t.remove(a), None);
        assert_eq!(t.len(), 0);
        t.check();
    }

    #[test]
    fn unknown_ids_are_none() {
        let mut t: Table<u8> = Table::default();
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(u64::MAX), None);
        assert_eq!(t.remove(12345), None);
        t.insert(7);
        assert_eq!(t.get(1 << 32), None, "right index, wrong generation");
    }

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

    #[test]
    fn free_list_is_lifo_and_len_exact() {
        let mut t = Table::default();
        let ids: Vec<u64> = (0..10).map(|i| t.insert(i)).collect();
        for &id in &ids[2..6] {
            t.remove(id);
        }
        assert_eq!(t.len(), 6);
        t.check();
        let again = t.insert(99);
        assert_eq!(
            again as u32, ids[5] as u32,
            "most recently freed slot first"
        );
        let live: Vec<i32> = t.iter().map(|(_, v)| *v).collect();
        assert_eq!(live, vec![0, 1, 99, 6, 7, 8, 9]);
        t.check();
    }

    #[test]
    fn growth_never_moves_a_value() {
        // A table that grows must not copy what it holds (the copy is the stall): the first
        // value stays where it was through 2^17 inserts, past many chunk boundaries.
        let mut t = Table::default();
        let first = t.insert(0_u64);
        let at = t.get(first).unwrap() as *const u64;
        let ids: Vec<u64> = (1..1 << 17).map(|i| t.insert(i)).collect();
        assert_eq!(
            t.get(first).unwrap() as *const u64,
            at,
            "the first value moved"
        );
        assert_eq!(t.len(), 1 << 17);
        assert_eq!(t.get(ids[CHUNK]), Some(&(CHUNK as u64 + 1)));
        assert_eq!(t.get(*ids.last().unwrap()), Some(&((1 << 17) - 1)));
        assert_eq!(t.slots.chunks.len(), (1 << 17) / CHUNK);
        assert!(t.slots.chunks.iter().all(|c| c.capacity() == CHUNK));
        t.check();
    }

    #[test]
    fn a_prepared_chunk_is_used_by_the_next_growth_and_its_placeholders_never_show() {
        let mut t = Table::default();
        let ids: Vec<u64> = (0..CHUNK as u64).map(|i| t.insert(i)).collect();
        // Prepared a bounded share at a time: 100 slots per call.
        let mut calls = 0;
        while t.prepare(100) {
            calls += 1;
            assert!(calls < 20, "prepare never finishes");
        }
        assert_eq!(calls, CHUNK / 100, "about CHUNK / 100 calls");
        let spare = t.slots.spare.as_ref().map(|s| s.as_ptr() as usize);
        assert_eq!(t.slots.spare.as_ref().map(Vec::len), Some(CHUNK));
        // Nothing past the live slots is visible, placeholders included.
        assert_eq!(t.iter().count(), CHUNK);
        assert_eq!(t.get(pack(CHUNK as u32, 0)), None);
        let next = t.insert(7);
        assert_eq!(next as u32, CHUNK as u32);
        assert_eq!(
            t.slots.chunks.last().map(|c| c.as_ptr() as usize),
            spare,
            "the prepared chunk holds the new slot"
        );
        assert!(t.slots.spare.is_none());
        assert_eq!(t.get(next), Some(&7));
        assert_eq!(
            t.get(pack(CHUNK as u32 + 1, 0)),
            None,
            "a placeholder is no value"
        );
        assert_eq!(t.iter().count(), CHUNK + 1);
        assert_eq!(t.get(ids[3]), Some(&3));
        // Half-prepared is fine too: the rest is pushed.
        let mut u = Table::default();
        u.prepare(10);
        let a: Vec<u64> = (0..20).map(|i| u.insert(i)).collect();
        assert_eq!(
            u.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
        assert_eq!(u.get(a[15]), Some(&15));
        assert_eq!(u.remove(a[0]), Some(0));
        t.check();
        u.check();
    }

    #[test]
    fn prepare_touches_the_rest_of_the_current_chunk_first() {
        // A chunk started with no prepared one: its slots past the last are untouched.
        let mut t = Table::default();
        let ids: Vec<u64> = (0..10u64).map(|i| t.insert(i)).collect();
        assert_eq!(t.slots.chunks[0].len(), 10);
        assert!(t.prepare(500), "more to prepare");
        assert_eq!(
            t.slots.chunks[0].len(),
            510,
            "the current chunk's rest first"
        );
        assert_eq!(
            t.slots.spare.as_ref().map_or(0, Vec::len),
            0,
            "no budget left for the next one"
        );
        while t.prepare(500) {}
        assert_eq!(t.slots.chunks[0].len(), CHUNK);
        assert_eq!(t.slots.spare.as_ref().map(Vec::len), Some(CHUNK));
        // Placeholders are overwritten in place and never seen.
        let at = t.slots.chunks[0].as_ptr();
        let more: Vec<u64> = (10..CHUNK as u64 + 5).map(|i| t.insert(i)).collect();
        assert_eq!(t.slots.chunks[0].as_ptr(), at, "the chunk did not move");
        assert_eq!(t.len(), CHUNK + 5);
        assert_eq!(t.iter().count(), CHUNK + 5);
        assert_eq!(t.get(ids[3]), Some(&3));
        assert_eq!(t.get(more[CHUNK - 10]), Some(&(CHUNK as u64)));
        t.check();
    }

    #[test]
    fn exhausted_generation_retires_the_slot() {
        let mut t = Table::default();
        let a = t.insert(1);
        *t.slots.get_mut(0).unwrap() = Slot::Occupied {
            generation: u32::MAX,
            value: 1,
        };
        let last = pack(0, u32::MAX);
        assert_ne!(a, last);
        assert_eq!(t.remove(last), Some(1));
        let b = t.insert(2);
        assert_eq!(b as u32, 1, "slot 0 is not reused");
        assert_eq!(t.get(last), None);
        t.check();
    }
}
