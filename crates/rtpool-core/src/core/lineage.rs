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
use crate::event::{Action, TaskOutcome, TaskStatus};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::{Call, Task, TaskState};

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

    /// The value of record `rid` is lost (its worker is gone, or a reader could not read it):
    /// the readers that wait or are queued wait for it again, and a copy of the call that
    /// made it runs again, if the package's `max_attempts` allows one more run; else the
    /// waiting readers fail naming it. O(dependents of the call).
    pub(super) fn remake_kept(&mut self, rid: u64, now: Instant) {
        let Some(record) = self.kept_calls.get_mut(rid) else {
            return;
        };
        if record.remake.is_some() {
            return; // already being made again
        }
        let (slot, index, runs) = (record.package, record.index, record.runs);
        if let Some(worker) = record.worker.take() {
            let key = std::mem::take(&mut record.key);
            self.forget_value(rid, worker, key); // unreadable there: drop what is left
        }
        let dependents = self.kept_calls.get(rid).map(|r| r.dependents.clone());
        for &j in dependents.iter().flatten() {
            self.unread(slot, j, rid);
        }
        if runs as usize >= self.allowed_attempts(slot) {
            let what = self.call_name(rid);
            for &j in dependents.iter().flatten() {
                if let Some(id) = self.call_id(slot, j) {
                    let reason = format!(
                        "call #{j} not run: its input from call #{index} {what} was lost (the \
                         worker that kept it is gone or no longer holds it) and that call ran \
                         {runs} times, its package's max_attempts; run the transaction again"
                    );
                    self.doomed.push((id, reason));
                }
            }
            self.fail_doomed(now);
            let why = format!(
                "its input from call #{index} {what} was lost and that call ran {runs} times"
            );
            self.fail_remake_readers(rid, &why, now);
            return;
        }
        let record = self.kept_calls.get_mut(rid).expect("checked above");
        record.runs += 1;
        let mut task = Task::new(slot, index, record.args.clone(), now);
        task.shadow = true;
        task.call = Some(Box::new(Call {
            service: record.service,
            deps: record.deps.clone(),
            inputs: record.inputs.clone(),
            waiting: 0,
            dependents: Vec::new(),
            fetch: false,
            sources: record.sources.clone(),
            remakes: rid,
        }));
        let service = record.service;
        let sources: Vec<u64> = distinct_sources(&record.sources).collect();
        let id = TaskId(self.tasks.insert(task));
        self.kept_calls.get_mut(rid).expect("checked above").remake = Some(id);
        // It reads the values of its sources: they stay, or are made again, for it. A source
        // whose value was dropped (all its readers had finished) or is lost is made again
        // first, and the copy waits for it.
        let mut missing = Vec::new();
        for source in sources {
            if let Some(r) = self.kept_calls.get_mut(source) {
                r.remake_readers.push(id);
                if r.worker.is_none() {
                    missing.push(source);
                }
            }
        }
        if !missing.is_empty() {
            let task = self.tasks.get_mut(id.0).expect("just made");
            let call = task.call.as_mut().expect("just made");
            for (p, source) in call.sources.iter().enumerate() {
                if missing.contains(source) {
                    call.inputs[p] = Bytes::new();
                    call.waiting += 1;
                }
            }
            task.state = TaskState::Waiting;
        }
        if let Some(s) = self.services.get_mut(service) {
            s.calls += 1;
        }
        self.counters.kept_calls_rerun += 1;
        if missing.is_empty() {
            self.enqueue(id, true);
        }
        for source in missing {
            self.remake_kept(source, now);
        }
    }

    /// The name of the call that made the value of record `rid` (its service's), for messages.
    fn call_name(&self, rid: u64) -> String {
        self.kept_calls
            .get(rid)
            .and_then(|r| self.services.get(r.service))
            .map_or_else(|| "?".to_owned(), |s| s.name.clone())
    }

    /// Call `j` no longer has the value of record `rid`: if it waits or is queued, it waits
    /// for it again (a running one is judged by its answer).
    fn unread(&mut self, slot: u64, j: u32, rid: u64) {
        let Some(id) = self.call_id(slot, j) else {
            return;
        };
        let task = self.tasks.get_mut(id.0).expect("checked by call_id");
        if !matches!(task.state, TaskState::Waiting | TaskState::Queued) {
            return;
        }
        let Some(call) = task.call.as_mut() else {
            return;
        };
        let mut reset = 0;
        for (p, source) in call.sources.iter().enumerate() {
            if *source == rid && !call.inputs[p].is_empty() {
                call.inputs[p] = Bytes::new();
                reset += 1;
            }
        }
        if reset == 0 {
            return;
        }
        call.waiting += reset;
        let service = call.service;
        if task.state == TaskState::Queued {
            task.state = TaskState::Waiting;
            let pos = task.queue_pos;
            if let Some(s) = self.services.get_mut(service) {
                s.queue.remove(slot, pos);
            }
        }
    }

    /// Call `j` of the package gets the new value of record `rid` where it lost it; queued if
    /// that was its last missing input.
    fn feed(&mut self, slot: u64, j: u32, rid: u64, reference: &Bytes) {
        if let Some(id) = self.call_id(slot, j) {
            self.feed_task(id, rid, reference);
        }
    }

    /// Task `id` (a call, or a copy) gets the new value of record `rid` where it lost it;
    /// queued if that was its last missing input.
    fn feed_task(&mut self, id: TaskId, rid: u64, reference: &Bytes) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        if task.state != TaskState::Waiting {
            return;
        }
        let Some(call) = task.call.as_mut() else {
            return;
        };
        for (p, source) in call.sources.iter().enumerate() {
            if *source == rid && call.inputs[p].is_empty() {
                call.inputs[p] = reference.clone();
                call.waiting -= 1;
            }
        }
        if call.waiting == 0 {
            task.state = TaskState::Queued;
            self.enqueue(id, true);
        }
    }

    /// A running call answered that its input at `position` could not be read (status
    /// `InputLost`): it waits for that input again (not counted as an attempt of its own), and
    /// the input is made again unless that is already done or under way. `false` if the input
    /// is not a kept value the master knows how to make (the caller fails the call).
    pub(super) fn input_lost(&mut self, id: TaskId, position: usize, now: Instant) -> bool {
        let task = self.tasks.get(id.0).expect("checked by the caller");
        let Some(rid) = task
            .call
            .as_ref()
            .and_then(|c| c.sources.get(position).copied())
            .filter(|&s| s != NO_SOURCE)
        else {
            return false;
        };
        let Some(record) = self.kept_calls.get(rid) else {
            return false;
        };
        // The value it could not read is the record's, unless made again meanwhile.
        let fresh =
            (record.remake.is_none() && record.worker.is_some()).then(|| record.reference.clone());
        let slot = task.package;
        self.disarm_task_timer(id);
        self.leave_running(slot);
        let task = self.tasks.get_mut(id.0).expect("checked above");
        let call = task.call.as_mut().expect("checked above");
        let stale = call.inputs[position].clone();
        let remade = fresh.filter(|f| *f != stale);
        for (p, source) in call.sources.iter().enumerate() {
            if *source == rid {
                call.inputs[p] = Bytes::new();
                call.waiting += 1;
            }
        }
        task.state = TaskState::Waiting;
        if !task.shadow {
            let package = self.packages.get_mut(slot).expect("a live call's package");
            package.counts.running -= 1;
            package.counts.queued += 1;
        }
        match remade {
            Some(reference) => self.feed_task(id, rid, &reference),
            None => self.remake_kept(rid, now),
        }
        true
    }

    /// A copy making a lost value again ended: `Ok` with the value's new reference, kept on
    /// `worker`, which every reader waiting for it gets; otherwise its waiting readers fail
    /// naming the call. The copy is freed (it was `Running` and its worker no longer holds
    /// it).
    pub(super) fn remake_answered(
        &mut self,
        id: TaskId,
        worker: WorkerId,
        status: TaskStatus,
        data: Bytes,
        now: Instant,
    ) {
        self.disarm_task_timer(id);
        let task = self.tasks.remove(id.0).expect("checked by the caller");
        let slot = task.package;
        let call = task.call.as_ref().expect("a remake is a call");
        match task.state {
            TaskState::Running { .. } => self.leave_running(slot),
            TaskState::Queued => {
                if let Some(s) = self.services.get_mut(call.service) {
                    s.queue.remove(slot, task.queue_pos);
                }
            }
            _ => {}
        }
        if let Some(w) = task.holder().and_then(|w| self.workers.get_mut(&w)) {
            w.in_flight.remove(&id);
        }
        let call = task.call.expect("a remake is a call");
        self.service_call_ended(call.service);
        let sources = self.stop_reading(id, &call.sources);
        self.remake_ended(call.remakes, slot, worker, status, data, now);
        for source in sources {
            self.settle(source);
        }
    }

    /// What a copy making the value of record `rid` again came to (see `remake_answered`).
    fn remake_ended(
        &mut self,
        rid: u64,
        slot: u64,
        worker: WorkerId,
        status: TaskStatus,
        data: Bytes,
        now: Instant,
    ) {
        let Some(record) = self.kept_calls.get_mut(rid) else {
            // Released while it ran: nobody reads what it made.
            if status == TaskStatus::Ok {
                let key = kept_key(&data).unwrap_or_default();
                if !key.is_empty() && self.workers.contains_key(&worker) {
                    self.pending_drops.push((worker, key));
                }
            }
            return;
        };
        record.remake = None;
        let index = record.index;
        let dependents = record.dependents.clone();
        if status == TaskStatus::Ok {
            record.worker = Some(worker);
            record.key = kept_key(&data).unwrap_or_default();
            record.reference = data.clone();
            if let Some(w) = self.workers.get_mut(&worker) {
                w.kept_calls.insert(rid);
            }
            let copies = record.remake_readers.clone();
            for j in dependents {
                self.feed(slot, j, rid, &data);
            }
            for copy in copies {
                self.feed_task(copy, rid, &data);
            }
            self.settle(rid);
            return;
        }
        let what = self.call_name(rid);
        let text: String = String::from_utf8_lossy(&data).chars().take(300).collect();
        for j in dependents {
            if let Some(dep) = self.call_id(slot, j) {
                let reason = format!(
                    "call #{j} not run: its input from call #{index} {what} was lost (the worker \
                     that kept it is gone or no longer holds it) and running that call again \
                     failed ({status:?}: {text})"
                );
                self.doomed.push((dep, reason));
            }
        }
        self.fail_doomed(now);
        let why =
            format!("its input from call #{index} {what} was lost and making it again failed");
        self.fail_remake_readers(rid, &why, now);
    }

    /// The copies waiting for the value of record `rid`, which will not be made again, fail
    /// (and so the readers of what they were making).
    fn fail_remake_readers(&mut self, rid: u64, why: &str, now: Instant) {
        let copies = self
            .kept_calls
            .get(rid)
            .map(|r| r.remake_readers.clone())
            .unwrap_or_default();
        for copy in copies {
            let waiting = self
                .tasks
                .get(copy.0)
                .is_some_and(|t| t.state == TaskState::Waiting);
            if waiting {
                let data = Bytes::from(why.to_owned());
                self.remake_answered(copy, WorkerId(0), TaskStatus::Failed, data, now);
            }
        }
    }

    /// Copy `id` no longer reads its sources: it leaves their `remake_readers`. Returns the
    /// sources, to settle.
    fn stop_reading(&mut self, id: TaskId, sources: &[u64]) -> Vec<u64> {
        let sources: Vec<u64> = distinct_sources(sources).collect();
        for &source in &sources {
            if let Some(r) = self.kept_calls.get_mut(source) {
                r.remake_readers.retain(|&t| t != id);
            }
        }
        sources
    }

    /// A running task's answer, if lineage takes it: the answer of a copy making a value
    /// again, or a call's `InputLost` (its input is made again and it waits for it). `Err`
    /// gives back any other answer, an `InputLost` the master cannot act on turned into a
    /// failure (status `Failed`, the worker's message).
    pub(super) fn lineage_answer(
        &mut self,
        id: TaskId,
        worker: WorkerId,
        mut outcome: TaskOutcome,
        now: Instant,
    ) -> Result<(), TaskOutcome> {
        let position = (outcome.status == TaskStatus::InputLost)
            .then(|| outcome.data.get(..4))
            .flatten()
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize);
        if outcome.status == TaskStatus::InputLost {
            outcome.status = TaskStatus::Failed;
            outcome.data = outcome.data.slice(outcome.data.len().min(4)..);
        }
        if self.is_remake(id) {
            self.remake_answered(id, worker, outcome.status, outcome.data, now);
            return Ok(());
        }
        match position {
            Some(p) if self.input_lost(id, p, now) => Ok(()),
            _ => Err(outcome),
        }
    }

    /// Cancels a copy making a value again that nobody reads any more: a queued one is freed,
    /// a running one aborted (freed when its worker answers).
    fn cancel_remake(&mut self, id: TaskId) -> Vec<u64> {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return Vec::new();
        };
        let slot = task.package;
        let call = task.call.take().expect("a remake is a call");
        match task.state {
            TaskState::Queued => {
                let pos = task.queue_pos;
                self.tasks.remove(id.0);
                if let Some(s) = self.services.get_mut(call.service) {
                    s.queue.remove(slot, pos);
                }
            }
            TaskState::Waiting => {
                self.tasks.remove(id.0);
            }
            TaskState::Running { worker, seq, .. } => self.abort_running(id, slot, worker, seq),
            other => panic!("remake {id} is {other:?}"),
        }
        self.service_call_ended(call.service);
        self.stop_reading(id, &call.sources)
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
