//! [`DenseMap`]: a map from the ids of one [`Table`](super::Table) to values, stored at
//! each id's slot index in chunks that never move.

use super::chunks::Chunks;
use super::slab::unpack;

/// A map from the ids of one [`Table`](super::Table) to values, each stored at its id's slot index
/// in chunks that never move, like the table's own: O(1) get, insert and remove with no hashing and
/// no resize, and its growth made ahead of need by [`DenseMap::prepare`]. For values that most of a
/// table's ids have (the ready queue's entry of a package): an insert at an index far past the end
/// fills the slots between, so an id space used sparsely wants a [`Map`](super::Map).
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

    /// Every `(id, value)`, in slot order. O(slots): for tests only.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots
            .iter()
            .filter_map(|slot| slot.as_ref().map(|(k, v)| (*k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::chunks::CHUNK;
    use crate::table::slab::pack;
    use crate::table::Table;

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
}
