//! [`Chunks`]: a vector stored in fixed-size chunks that never move, the storage under
//! [`Table`](super::Table) and [`DenseMap`](super::DenseMap). Growing allocates one chunk,
//! never copies what it holds, and can be made ahead of need ([`Chunks::prepare`]).

/// log2 of the slots per chunk.
const CHUNK_BITS: u32 = 10;
/// Slots per chunk: 1,024, so a table of tasks allocates a few hundred KiB at a time and wastes
/// at most one chunk.
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;

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
pub(super) struct Chunks<S> {
    pub(super) chunks: Vec<Vec<S>>,
    len: usize,
    /// The next chunk, being filled with placeholders (capacity [`CHUNK`]).
    pub(super) spare: Option<Vec<S>>,
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
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, index: usize) -> Option<&S> {
        if index >= self.len {
            return None;
        }
        self.chunks
            .get(index >> CHUNK_BITS)?
            .get(index & (CHUNK - 1))
    }

    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut S> {
        if index >= self.len {
            return None;
        }
        self.chunks
            .get_mut(index >> CHUNK_BITS)?
            .get_mut(index & (CHUNK - 1))
    }

    pub(super) fn push(&mut self, slot: S) {
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
    pub(super) fn prepare(&mut self, max_slots: usize, filler: impl Fn() -> S) -> bool {
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

    pub(super) fn iter(&self) -> impl Iterator<Item = &S> {
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
