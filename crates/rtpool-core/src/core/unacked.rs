//! The per-client bound on results waiting for an acknowledgement: each attached package's
//! share of its client's unacknowledged results (`judged`, `sent_bytes`: the results sent as
//! they came; those resent when the client attached are not judged), kept in step as results
//! are sent, acknowledged, dropped, and as packages attach and detach.
//!
//! A client past the bound is told to close ([`Action::UnackedLimit`]): its packages detach
//! and keep their results for the result TTL, so a client that re-attaches and acknowledges
//! loses nothing, and one that never acknowledges cannot make the master hold more than the
//! bound per connection (plus, once detached, for the TTL).

use std::collections::HashMap;

use super::Core;
use crate::event::Action;
use crate::ids::{ClientId, TaskId, UserId};
use crate::stats::ResultBytes;
use crate::task::TaskState;

impl Core {
    /// `results` results of `bytes` data bytes of the package in `slot` were sent to its
    /// attached client `client` as they came; tells the client to close if it is now past the
    /// bound.
    pub(super) fn results_sent(
        &mut self,
        slot: u64,
        client: ClientId,
        (results, bytes): (u64, u64),
        out: &mut Vec<Action>,
    ) {
        match self.packages.get_mut(slot) {
            Some(p) if p.client == Some(client) => {
                p.judged += results;
                p.sent_bytes += bytes;
            }
            _ => return,
        }
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        c.unacked_results += results;
        c.unacked_bytes += bytes;
        let (max_results, max_bytes) = (
            self.config.max_unacked_results_per_client,
            self.config.max_unacked_bytes_per_client,
        );
        // One result of any size (up to the frame limit) is always deliverable.
        let over = c.unacked_results > 1
            && ((max_results > 0 && c.unacked_results > max_results)
                || (max_bytes > 0 && c.unacked_bytes > max_bytes));
        if over && !c.closing {
            c.closing = true;
            out.push(Action::UnackedLimit {
                client,
                results: c.unacked_results,
                bytes: c.unacked_bytes,
                max_results,
                max_bytes,
            });
        }
    }

    /// The package in `slot` was attached and every unacknowledged result resent: those are
    /// not judged by the bound (a client closed for it can always get its results back by
    /// re-attaching), the results that follow are.
    pub(super) fn results_resent(&mut self, slot: u64) {
        if let Some(p) = self.packages.get_mut(slot) {
            p.resent = p.unacked.len() as u64;
        }
    }

    /// The attached client of the package in `slot` acknowledged these results, the oldest
    /// first (or the package dropped them).
    pub(super) fn results_acked(&mut self, slot: u64, ids: &[TaskId]) {
        let Some(p) = self.packages.get(slot).filter(|p| p.client.is_some()) else {
            // Detached: its results were counted against no client.
            return;
        };
        // The resent ones come first in the unacknowledged list.
        let resent = (p.resent as usize).min(ids.len());
        let judged = &ids[resent..];
        let bytes = self.result_bytes(judged);
        let p = self.packages.get_mut(slot).expect("checked");
        p.resent -= resent as u64;
        p.judged -= judged.len() as u64;
        p.sent_bytes -= bytes;
        if let Some(c) = p.client.and_then(|c| self.clients.get_mut(&c)) {
            c.unacked_results -= judged.len() as u64;
            c.unacked_bytes -= bytes;
        }
    }

    /// The package in `slot` leaves its attached client (detach, re-attach, free): its share
    /// of the client's unacknowledged results goes with it. Call while `p.client` still names
    /// that client.
    pub(super) fn results_unattached(&mut self, slot: u64) {
        let Some(p) = self.packages.get_mut(slot) else {
            return;
        };
        let (results, bytes) = (
            std::mem::take(&mut p.judged),
            std::mem::take(&mut p.sent_bytes),
        );
        p.resent = 0;
        if let Some(c) = p.client.and_then(|c| self.clients.get_mut(&c)) {
            c.unacked_results -= results;
            c.unacked_bytes -= bytes;
        }
    }

    /// Data bytes of the results held until their client acknowledges them, for the
    /// master's status. O(held results): one slab lookup each, once per status snapshot (about
    /// a second), never on an event's path.
    pub fn result_bytes_held(&self) -> ResultBytes {
        let mut bytes = ResultBytes::default();
        for (_, p) in self.packages.iter() {
            let held = self.result_bytes(&p.unacked);
            bytes.held += held;
            if p.client.is_some() {
                bytes.unacked += held;
            }
        }
        bytes
    }

    /// Data bytes of the results of these `Done` tasks.
    pub(super) fn result_bytes<'a>(&self, ids: impl IntoIterator<Item = &'a TaskId>) -> u64 {
        ids.into_iter()
            .filter_map(|id| self.tasks.get(id.0)?.outcome.as_ref())
            .map(|o| o.data.len() as u64)
            .sum()
    }

    /// Each client's unacknowledged results are its attached packages' shares, and each
    /// user's queued tasks and bytes are those of its queued, waiting and running tasks.
    pub(super) fn check_bounds(&self) {
        let mut clients: HashMap<ClientId, (u64, u64)> = HashMap::new();
        let mut users: HashMap<UserId, (u64, u64)> = HashMap::new();
        for (slot, p) in self.packages.iter() {
            match p.client {
                Some(c) => {
                    assert_eq!(
                        p.resent + p.judged,
                        p.unacked.len() as u64,
                        "{}: resent + judged is its unacknowledged results",
                        p.id
                    );
                    let e = clients.entry(c).or_default();
                    e.0 += p.judged;
                    e.1 += p.sent_bytes;
                }
                None => assert_eq!(
                    (p.judged, p.sent_bytes, p.resent),
                    (0, 0, 0),
                    "detached {} has a share of a client's unacknowledged results",
                    p.id
                ),
            }
            let e = users.entry(p.user).or_default();
            for (index, id) in (0u32..).zip(&p.tasks) {
                // An id of a freed task may name a newer task now.
                let Some(t) = self
                    .tasks
                    .get(id.0)
                    .filter(|t| t.package == slot && t.index == index && !t.shadow)
                else {
                    continue;
                };
                if matches!(
                    t.state,
                    TaskState::Queued | TaskState::Waiting | TaskState::Running { .. }
                ) {
                    e.0 += 1;
                    e.1 += t.args.len() as u64;
                }
            }
        }
        for (id, c) in &self.clients {
            let want = clients.get(id).copied().unwrap_or_default();
            assert_eq!(
                (c.unacked_results, c.unacked_bytes),
                want,
                "client {id:?}: unacked (results, bytes)"
            );
        }
        for (id, u) in &self.users {
            let want = users.get(id).copied().unwrap_or_default();
            assert_eq!(
                (u.queued_tasks, u.queued_bytes),
                want,
                "user {id:?}: queued (tasks, bytes)"
            );
        }
    }
}
