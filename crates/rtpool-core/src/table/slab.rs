//! [`Table`]: the generational slab with a free list, and the id layout it hands out
//! ([`pack`], [`unpack`]: slot index in the low 32 bits, generation in the high 32).

use super::chunks::Chunks;

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
pub(super) fn pack(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

/// Splits an id into slot index and generation.
pub(super) fn unpack(id: u64) -> (u32, u32) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::chunks::CHUNK;

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
