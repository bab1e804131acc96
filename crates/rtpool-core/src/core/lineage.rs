//! Intermediate results of transactions (calls not fetched, kept on the worker that made them):
//! when they are released, and how a lost one is made again (`docs/rpc.md`, "Transactions").
//!
//! A call assigned with `keep` answers with a reference (ext 3) instead of its result. When it
//! succeeds, the core records a [`KeptCall`]: where the value is (its worker and key), which
//! dependents were given the reference and have not finished, and how to make it again (the
//! call's service, arguments and inputs). Each dependent names the record in
//! [`Call::sources`]. The record goes, and the worker is told to `DROP` the value, once the
//! last of those dependents is done, failed or cancelled. The value itself never leaves its
//! worker: the core holds about 100 bytes plus the call's arguments per record.
//!
//! Work is bounded per operation: a finishing dependent touches the records of its own inputs;
//! a lost worker, the records of the values it kept.
//!
//! This file holds the records: made, read, released and dropped. [`remake`] makes a lost
//! value again.

mod remake;

use bytes::Bytes;

use super::Core;
use crate::event::Action;
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::Call;

/// "No record": a [`Call::sources`] entry of an input that is not a kept value.
pub(crate) const NO_SOURCE: u64 = u64::MAX;

/// The kept sources a call reads (its `sources` without [`NO_SOURCE`]), each once, in the
/// order they first appear. No allocation: a call has a few arguments, so a repeat is found
/// by a look at the ones before it.
pub(crate) fn distinct_sources(sources: &[u64]) -> impl Iterator<Item = u64> + '_ {
    sources
        .iter()
        .enumerate()
        .filter(|&(i, s)| *s != NO_SOURCE && !sources[..i].contains(s))
        .map(|(_, &s)| s)
}

/// One kept intermediate result of a transaction.
#[derive(Debug)]
pub(crate) struct KeptCall {
    /// Slab key of the package of the call that made it.
    pub(crate) package: u64,
    /// That call's index in its package.
    pub(crate) index: u32,
    /// The worker that keeps it (the connection the `DROP` goes to); `None` while it is
    /// being made again.
    pub(crate) worker: Option<WorkerId>,
    /// Its 16-byte key in that worker's store (empty if the reference could not be read: then
    /// nothing is dropped, the store's bound evicts it).
    pub(crate) key: Bytes,
    /// The reference the dependents read it by (the call's result data).
    pub(crate) reference: Bytes,
    /// Dependents that were given the reference and have not finished.
    pub(crate) readers: u32,
    /// How to make it again: the call's service, arguments and inputs.
    pub(crate) service: u64,
    pub(crate) args: Bytes,
    pub(crate) inputs: Vec<Bytes>,
    pub(crate) deps: Vec<u32>,
    /// Indices of the calls that take it (the producer's dependents).
    pub(crate) dependents: Vec<u32>,
    /// Times the call ran to make it (1, then one more per re-run); at most the package's
    /// `max_attempts`.
    pub(crate) runs: u32,
    /// The copy of the call that makes it again, while one does (then `worker` is `None`).
    pub(crate) remake: Option<TaskId>,
    /// By position in `deps`: the records of its own kept inputs (empty if none), whose
    /// recipes it holds so that a re-run of it can have them made again too.
    pub(crate) sources: Vec<u64>,
    /// Records of kept values made from this one that may have to be made again: its recipe
    /// stays while any does, even after its value is dropped.
    pub(crate) recipe_refs: u32,
    /// Copies making a value of `recipe_refs` again that read this value: they count as
    /// readers (its value stays, or is made again, while they wait or run).
    pub(crate) remake_readers: Vec<TaskId>,
}

impl Core {
    /// Records the kept result `reference` of call `index` of the package in `slot`, made on
    /// `worker`; returns the record's slab key.
    pub(super) fn record_kept(
        &mut self,
        slot: u64,
        index: u32,
        worker: WorkerId,
        reference: Bytes,
        call: &Call,
        args: Bytes,
    ) -> u64 {
        let key = kept_key(&reference).unwrap_or_default();
        let record = KeptCall {
            package: slot,
            index,
            worker: Some(worker),
            key,
            reference,
            readers: 0,
            service: call.service,
            args,
            inputs: call.inputs.clone(),
            deps: call.deps.clone(),
            dependents: call.dependents.clone(),
            runs: 1,
            remake: None,
            sources: call.sources.clone(),
            recipe_refs: 0,
            remake_readers: Vec::new(),
        };
        for source in distinct_sources(&call.sources) {
            if let Some(r) = self.kept_calls.get_mut(source) {
                r.recipe_refs += 1;
            }
        }
        // The record holds its service like a call: a copy may be queued there.
        if let Some(s) = self.services.get_mut(call.service) {
            s.calls += 1;
        }
        let id = self.kept_calls.insert(record);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.kept_calls.insert(id);
        }
        id
    }

    /// A dependent finished (done, failed or cancelled): it reads none of its sources any
    /// more. Each source it was the last reader of is released.
    pub(super) fn release_sources(&mut self, call: &Call) {
        for id in distinct_sources(&call.sources) {
            let Some(record) = self.kept_calls.get_mut(id) else {
                continue;
            };
            record.readers = record.readers.saturating_sub(1);
            self.settle(id);
        }
    }

    /// Once nobody reads the value of record `id` (no reader left, no copy waiting for it),
    /// its worker, if still connected, is told to drop it and a copy still making it is
    /// cancelled; once no value made from it may have to be made again either, the record
    /// goes, and with it its hold on its own sources' recipes (a work list: a long chain
    /// does not recurse). Returns at once while the value is read.
    pub(super) fn settle(&mut self, id: u64) {
        let mut work = vec![id];
        while let Some(id) = work.pop() {
            let Some(record) = self.kept_calls.get_mut(id) else {
                continue;
            };
            if record.readers > 0 || !record.remake_readers.is_empty() {
                continue;
            }
            let (remake, worker) = (record.remake.take(), record.worker.take());
            let key = std::mem::take(&mut record.key);
            if let Some(remake) = remake {
                work.extend(self.cancel_remake(remake));
            }
            if let Some(worker) = worker {
                if self.workers.contains_key(&worker) && !key.is_empty() {
                    self.counters.kept_calls_released += 1;
                }
                self.forget_value(id, worker, key);
            }
            if self.kept_calls.get(id).is_some_and(|r| r.recipe_refs > 0) {
                continue; // its recipe may still be needed
            }
            let record = self.kept_calls.remove(id).expect("checked above");
            self.service_call_ended(record.service);
            for source in distinct_sources(&record.sources) {
                if let Some(r) = self.kept_calls.get_mut(source) {
                    r.recipe_refs -= 1;
                    work.push(source);
                }
            }
        }
    }

    /// `worker` no longer keeps the value of record `id`: drop it there, if connected.
    fn forget_value(&mut self, id: u64, worker: WorkerId, key: Bytes) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return; // its worker is gone, and the value with it
        };
        w.kept_calls.remove(&id);
        if !key.is_empty() {
            self.pending_drops.push((worker, key));
        }
    }

    /// Whether `id` is a copy of a call that makes a lost value again.
    pub(super) fn is_remake(&self, id: TaskId) -> bool {
        self.tasks
            .get(id.0)
            .and_then(|t| t.call.as_ref())
            .is_some_and(|c| c.remakes != NO_SOURCE)
    }

    /// The worker of the values of `records` is lost: each is made again.
    pub(super) fn kept_lost(&mut self, records: Vec<u64>, now: Instant) {
        for rid in records {
            if let Some(r) = self.kept_calls.get_mut(rid) {
                r.worker = None; // gone with its worker: nothing to drop
            }
            self.remake_kept(rid, now);
        }
    }

    /// Sends the drops decided during the event: one `DropKept` per connected worker.
    pub(super) fn push_drops(&mut self, out: &mut Vec<Action>) {
        let mut drops: Vec<(WorkerId, Vec<Bytes>)> = Vec::new();
        for (worker, key) in self.pending_drops.drain(..) {
            if !self.workers.contains_key(&worker) {
                continue;
            }
            match drops.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, keys)) => keys.push(key),
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

/// The 16-byte key of a kept result's reference: msgpack ext 3 whose payload is
/// `[host, port, key, size, pid, session]` (`docs/rpc.md`, "Values"). `None` if it is not one.
pub(crate) fn kept_key(reference: &[u8]) -> Option<Bytes> {
    let (&marker, rest) = reference.split_first()?;
    let (len, rest) = match marker {
        0xd4 => (1, rest),
        0xd5 => (2, rest),
        0xd6 => (4, rest),
        0xd7 => (8, rest),
        0xd8 => (16, rest),
        0xc7 => (usize::from(*rest.first()?), rest.get(1..)?),
        0xc8 => (
            usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
            rest.get(2..)?,
        ),
        _ => return None,
    };
    let (&kind, payload) = rest.split_first()?;
    if kind != 3 || payload.len() != len {
        return None;
    }
    let mut r = rtpool_proto::msgpack::Reader::new(Bytes::copy_from_slice(payload));
    r.array_len("kept", 1).ok().filter(|&n| n >= 3)?;
    r.skip("host", 1).ok()?;
    r.skip("port", 1).ok()?;
    let key = r.bin("key").ok()?;
    (key.len() == 16).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::kept_key;

    /// `msgpack.packb(ExtType(3, packb(["127.0.0.1", 40000, key, 10, 7, 1])))` in Python.
    fn reference(key: &[u8]) -> Vec<u8> {
        let mut inner = vec![0x96, 0xa9];
        inner.extend_from_slice(b"127.0.0.1");
        inner.extend_from_slice(&[0xcd, 0x9c, 0x40, 0xc4, key.len() as u8]);
        inner.extend_from_slice(key);
        inner.extend_from_slice(&[0x0a, 0x07, 0x01]);
        let mut out = vec![0xc7, inner.len() as u8, 3];
        out.extend_from_slice(&inner);
        out
    }

    #[test]
    fn the_key_of_a_reference_is_read() {
        let key = [7u8; 16];
        assert_eq!(kept_key(&reference(&key)).as_deref(), Some(&key[..]));
    }

    #[test]
    fn anything_else_has_no_key() {
        assert_eq!(kept_key(b""), None);
        assert_eq!(kept_key(&[0x93, 1, 2, 3]), None);
        assert_eq!(kept_key(&reference(&[1u8; 15])), None);
        let mut other = reference(&[1u8; 16]);
        other[2] = 2; // another ext type
        assert_eq!(kept_key(&other), None);
        other[2] = 3;
        other.pop(); // truncated
        assert_eq!(kept_key(&other), None);
    }
}
