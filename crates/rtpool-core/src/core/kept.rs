//! Results kept on workers (`docs/data.md`): a client's `RELEASE` becomes one `DROP` per
//! worker that holds a released value.
//!
//! The core holds no table of kept values: a value lives in its worker process, named by a key
//! only its owner knows, and the client decides when it is no longer needed (its future is
//! gone and no task of its waits for it). The core only routes the release to the worker's
//! connection, if that session is still connected; a worker that is gone holds nothing.

use bytes::Bytes;

use super::Core;
use crate::event::Action;
use crate::ids::{ClientId, WorkerId};

impl Core {
    /// `RELEASE`: order each connected worker to drop its keys (one `DropKept` per worker, in
    /// the order the keys came).
    pub(super) fn on_release_kept(
        &mut self,
        client: ClientId,
        keys: Vec<(WorkerId, Bytes)>,
        out: &mut Vec<Action>,
    ) {
        if !self.clients.contains_key(&client) {
            return; // a shell bug, or a client already lost: nothing it owns to release
        }
        let mut drops: Vec<(WorkerId, Vec<Bytes>)> = Vec::new();
        for (worker, key) in keys {
            if !self.workers.contains_key(&worker) {
                self.counters.kept_release_unknown += 1;
                continue;
            }
            self.counters.kept_released += 1;
            match drops.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, list)) => list.push(key),
                None => drops.push((worker, vec![key])),
            }
        }
        out.extend(
            drops
                .into_iter()
                .map(|(worker, keys)| Action::DropKept { worker, keys }),
        );
    }
}
