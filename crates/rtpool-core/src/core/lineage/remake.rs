//! A lost kept value made again: when its worker is lost or a reader cannot read it, a copy
//! of the call that made it runs again, its readers wait for the new value (or fail naming
//! the call), and a copy nobody reads any more is cancelled.

use bytes::Bytes;

use crate::core::Core;
use crate::event::{TaskOutcome, TaskStatus};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::{Call, Task, TaskState};

use super::{distinct_sources, kept_key, NO_SOURCE};

impl Core {
    /// The value of record `rid` is lost (its worker is gone, or a reader could not read it):
    /// the readers that wait or are queued wait for it again, and a copy of the call that
    /// made it runs again, if the package's `max_attempts` allows one more run; else the
    /// waiting readers fail naming it. O(dependents of the call).
    pub(in crate::core) fn remake_kept(&mut self, rid: u64, now: Instant) {
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
    pub(super) fn call_name(&self, rid: u64) -> String {
        self.kept_calls
            .get(rid)
            .and_then(|r| self.services.get(r.service))
            .map_or_else(|| "?".to_owned(), |s| s.name.clone())
    }

    /// Call `j` no longer has the value of record `rid`: if it waits or is queued, it waits
    /// for it again (a running one is judged by its answer).
    pub(super) fn unread(&mut self, slot: u64, j: u32, rid: u64) {
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
            self.unqueue_call(service, slot, pos);
        }
    }

    /// Call `j` of the package gets the new value of record `rid` where it lost it; queued if
    /// that was its last missing input.
    pub(super) fn feed(&mut self, slot: u64, j: u32, rid: u64, reference: &Bytes) {
        if let Some(id) = self.call_id(slot, j) {
            self.feed_task(id, rid, reference);
        }
    }

    /// Task `id` (a call, or a copy) gets the new value of record `rid` where it lost it;
    /// queued if that was its last missing input.
    pub(super) fn feed_task(&mut self, id: TaskId, rid: u64, reference: &Bytes) {
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
    pub(in crate::core) fn input_lost(
        &mut self,
        id: TaskId,
        position: usize,
        now: Instant,
    ) -> bool {
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

    /// A running task's answer, if lineage takes it: the answer of a copy making a value
    /// again, or a call's `InputLost` (its input is made again and it waits for it). `Err`
    /// gives back any other answer, an `InputLost` the master cannot act on turned into a
    /// failure (status `Failed`, the worker's message).
    pub(in crate::core) fn lineage_answer(
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

    /// A copy making a lost value again ended: `Ok` with the value's new reference, kept on
    /// `worker`, which every reader waiting for it gets; otherwise its waiting readers fail
    /// naming the call. The copy is freed (it was `Running` and its worker no longer holds
    /// it).
    pub(in crate::core) fn remake_answered(
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
            TaskState::Queued => self.unqueue_call(call.service, slot, task.queue_pos),
            _ => {}
        }
        if let Some(holder) = task.holder() {
            if let Some(w) = self.workers.get_mut(&holder) {
                w.in_flight.remove(&id);
            }
            self.free_resources(holder, id);
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
    pub(super) fn remake_ended(
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
    pub(super) fn fail_remake_readers(&mut self, rid: u64, why: &str, now: Instant) {
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
    pub(super) fn stop_reading(&mut self, id: TaskId, sources: &[u64]) -> Vec<u64> {
        let sources: Vec<u64> = distinct_sources(sources).collect();
        for &source in &sources {
            if let Some(r) = self.kept_calls.get_mut(source) {
                r.remake_readers.retain(|&t| t != id);
            }
        }
        sources
    }

    /// Cancels a copy making a value again that nobody reads any more: a queued one is freed,
    /// a running one aborted (freed when its worker answers).
    pub(super) fn cancel_remake(&mut self, id: TaskId) -> Vec<u64> {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return Vec::new();
        };
        let slot = task.package;
        let call = task.call.take().expect("a remake is a call");
        match task.state {
            TaskState::Queued => {
                let pos = task.queue_pos;
                self.tasks.remove(id.0);
                self.unqueue_call(call.service, slot, pos);
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
}
