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

use bytes::Bytes;

use super::Core;
use crate::event::Action;
use crate::ids::WorkerId;
use crate::task::Call;

/// "No record": a [`Call::sources`] entry of an input that is not a kept value.
pub(crate) const NO_SOURCE: u64 = u64::MAX;

/// One kept intermediate result of a transaction.
#[derive(Debug)]
pub(crate) struct KeptCall {
    /// Slab key of the package of the call that made it.
    pub(crate) package: u64,
    /// That call's index in its package.
    pub(crate) index: u32,
    /// The worker that keeps it (the connection the `DROP` goes to).
    pub(crate) worker: WorkerId,
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
            worker,
            key,
            reference,
            readers: 0,
            service: call.service,
            args,
            inputs: call.inputs.clone(),
        };
        let id = self.kept_calls.insert(record);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.kept_calls.insert(id);
        }
        id
    }

    /// A dependent finished (done, failed or cancelled): it reads none of its sources any
    /// more. Each source it was the last reader of is released.
    pub(super) fn release_sources(&mut self, call: &Call) {
        let mut sources: Vec<u64> = call
            .sources
            .iter()
            .copied()
            .filter(|&s| s != NO_SOURCE)
            .collect();
        if sources.is_empty() {
            return;
        }
        sources.sort_unstable();
        sources.dedup();
        for id in sources {
            let Some(record) = self.kept_calls.get_mut(id) else {
                continue;
            };
            record.readers = record.readers.saturating_sub(1);
            if record.readers == 0 {
                self.release_kept(id);
            }
        }
    }

    /// Forgets a record and orders its worker, if still connected, to drop the value.
    pub(super) fn release_kept(&mut self, id: u64) {
        let Some(record) = self.kept_calls.remove(id) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&record.worker) else {
            return; // its worker is gone, and the value with it
        };
        w.kept_calls.remove(&id);
        if !record.key.is_empty() {
            self.counters.kept_calls_released += 1;
            self.pending_drops.push((record.worker, record.key));
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
