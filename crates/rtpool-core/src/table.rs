//! [`Table`]: a generational slab with a free list, the storage of tasks and packages.
//!
//! Get, insert and remove are O(1) and never scan (the RT-BOINC rule). Insert is O(1) in the
//! worst case too, not only amortised: the slots live in fixed-size chunks ([`chunks`]) that are
//! allocated one at a time and never move, so a table that grows never copies what it holds
//! (a doubling `Vec` would stall the scheduler for the whole copy: 12.6 ms at 10^5 tasks). An
//! id packs the slot index in its low 32 bits and the slot's generation in its high 32 bits;
//! removing a value bumps the generation, so an id kept after its value was removed (a late
//! worker result, an index of a package whose task was freed) is recognised as stale instead
//! of reaching whatever reuses the slot. The table knows nothing of
//! what it stores: the id newtypes are the caller's business.
//!
//! The core's hash maps and sets ([`Map`], [`Set`], and [`IdMap`], [`IdSet`] for the ids the
//! master hands out) are defined here too: they obey the same rule, no insert that pays for the
//! whole table.
//!
//! Each part has its module: [`chunks`] (the storage that never moves), [`slab`] (the
//! [`Table`] and its id layout), [`dense`] (a [`DenseMap`] indexed by a table's ids), [`map`]
//! (the hash maps and the [`IdHasher`]) and [`ahead`] (growing a map ahead of need).

mod ahead;
mod chunks;
mod dense;
mod map;
mod slab;

pub(crate) use self::ahead::Ahead;
pub(crate) use self::dense::DenseMap;
pub use self::map::IdHasher;
pub(crate) use self::map::{IdMap, IdSet, Map, Set};
pub(crate) use self::slab::Table;
