//! Work ahead of need, for the shell's idle time: the memory the next growth of the tables,
//! the ready queue and the per-package maps needs, made a bounded share per call so no
//! operation on the hot path pays the first touch of fresh memory or a map's resize.

use crate::ids::PackageId;

use super::Core;

impl Core {
    /// Prepares the memory the next growth of the task and package tables needs, at most
    /// `max_slots` slots of each per call, so an operation that grows them does not pay the
    /// first touch of fresh memory (a page fault every 4 KiB, tens of microseconds each on a
    /// busy VM: the rest of `handle`'s worst case at 10^6 queued tasks). The shell calls it
    /// when it has nothing else to do; it is never needed for correctness. Returns whether more
    /// is left to prepare. O(`max_slots`).
    pub fn prepare(&mut self, max_slots: usize) -> bool {
        let tasks = self.tasks.prepare(max_slots);
        let packages = self.packages.prepare(max_slots);
        let queue = self.queue_store.prepare(max_slots);
        let buffers = self.buffers.prepare(max_slots * 16);
        let maps = self.prepare_maps(max_slots / 8);
        tasks || packages || queue || buffers || maps
    }

    /// Grows the maps that gain an entry per package ahead of need (see
    /// [`Ahead`](crate::table::Ahead)): the package ids, and the package sets of the latest
    /// package's user and client. `u64::MAX` is never a slab key (a table panics before its 2^32nd
    /// slot), and a package id that happens to be it only makes a call move nothing.
    pub(super) fn prepare_maps(&mut self, max_pokes: usize) -> bool {
        const SPARE: u64 = u64::MAX;
        let mut more =
            self.slots_ahead
                .prepare(&mut self.package_slots, PackageId(SPARE), max_pokes);
        if let Some((user, client)) = self.latest_owner {
            if let Some(u) = self.users.get_mut(&user) {
                more |= u.ahead.prepare(&mut u.packages, SPARE, max_pokes);
            }
            if let Some(c) = client.and_then(|c| self.clients.get_mut(&c)) {
                more |= c.ahead.prepare(&mut c.packages, SPARE, max_pokes);
            }
        }
        more
    }
}
