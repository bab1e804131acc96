//! Dispatch of queued calls to the workers that serve them: the best server with a free
//! credit by estimated completion time, what one result teaches of a worker (its link and
//! speed), and the grace period of a service left without a server.

use bytes::Bytes;

use crate::core::timers::Results;
use crate::core::{Core, Timer};
use crate::event::{Action, AssignCall, TaskStatus};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::placement::{self, Candidate};
use rtpool_proto::Resources;

/// Servers looked at per placement, from a rotating start: placement stays O(1) however many
/// workers serve a function.
const MAX_CANDIDATES: usize = 64;

/// How queued calls compare: highest priority, then shortest estimated execution.
type CallKey = (std::cmp::Reverse<i32>, u64);

/// A function's mean execution time must be at least this long for its results to teach a
/// worker's speed, microseconds.
const MIN_SPEED_SAMPLE_US: u64 = 1_000;

impl Core {
    /// Places queued calls while a server of theirs has a credit: each time the service whose
    /// head call has the highest priority, then the shortest estimated execution (unknown
    /// counts as 0, so it is learned), then was submitted first. Arms the grace timer of
    /// services whose calls wait with no server at all.
    pub(in crate::core) fn dispatch_calls(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.waiting_services.is_empty() {
            return;
        }
        let mut batches: Vec<(WorkerId, Vec<AssignCall>)> = Vec::new();
        loop {
            // (key, service, resource class of its sub-queue, server index)
            let mut best: Option<(CallKey, u64, Option<u64>, usize)> = None;
            let mut drained = Vec::new();
            for &slot in &self.waiting_services {
                let Some(s) = self.services.get(slot) else {
                    drained.push(slot);
                    continue;
                };
                let est = self.estimates.get(&s.fn_hash).map_or(0, |e| e.mean_hint());
                let mut queued = false;
                if let Some(priority) = s.queue.top_priority() {
                    queued = true;
                    let key = (std::cmp::Reverse(priority), est);
                    let better = best.as_ref().is_none_or(|(k, ..)| key < *k);
                    if better {
                        if let Some(server) = self.place(slot, None) {
                            best = Some((key, slot, None, server));
                        }
                    }
                }
                // Calls that ask for resources or labels: one sub-queue per class (none for
                // the functions whose calls ask for nothing).
                for (&class, cc) in &s.classes {
                    let Some(priority) = cc.queue.top_priority() else {
                        continue;
                    };
                    queued = true;
                    let key = (std::cmp::Reverse(priority), est);
                    if best.as_ref().is_some_and(|(k, ..)| *k <= key) {
                        continue;
                    }
                    if let Some(server) = self.place(slot, Some(class)) {
                        best = Some((key, slot, Some(class), server));
                    }
                }
                if !queued {
                    drained.push(slot);
                }
            }
            for slot in drained {
                self.waiting_services.remove(&slot);
            }
            let Some((_, slot, class, server)) = best else {
                break;
            };
            let s = self.services.get_mut(slot).expect("chosen");
            let (worker, id) = match class {
                None => {
                    s.cursor = server + 1;
                    let (id, _) = s.queue.pop().expect("a waiting service has a call");
                    (s.servers[server], id)
                }
                Some(c) => {
                    let cc = s.classes.get_mut(&c).expect("chosen");
                    cc.cursor = server + 1;
                    let (id, _) = cc.queue.pop().expect("a waiting class has a call");
                    (cc.servers[server], id)
                }
            };
            let call = self.assign_call(id, worker, class, now);
            match batches.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, calls)) => calls.push(call),
                None => batches.push((worker, vec![call])),
            }
        }
        self.arm_orphans(now);
        out.extend(
            batches
                .into_iter()
                .map(|(worker, calls)| Action::AssignCalls { worker, calls }),
        );
    }

    /// The index in the service's server list (or, for `class`, its sub-queue's) of the best
    /// server with a free credit (and the class's request free) for the head call of that
    /// queue, looking at no more than [`MAX_CANDIDATES`] servers from its cursor.
    pub(super) fn place(&self, slot: u64, class: Option<u64>) -> Option<usize> {
        let s = self.services.get(slot)?;
        let (servers, cursor, queue, request) = match class {
            None => (&s.servers, s.cursor, &s.queue, None),
            Some(c) => {
                let cc = s.classes.get(&c)?;
                let request = &self.classes.get(c)?.resources;
                (&cc.servers, cc.cursor, &cc.queue, Some(request))
            }
        };
        let n = servers.len();
        if n == 0 {
            return None;
        }
        let bytes = queue
            .peek()
            .and_then(|id| self.tasks.get(id.0))
            .map_or(0, |t| {
                let inputs: usize = t
                    .call
                    .as_ref()
                    .map_or(0, |c| c.inputs.iter().map(Bytes::len).sum::<usize>());
                (t.args.len() + inputs) as u64
            });
        let exec_us = self.estimates.get(&s.fn_hash).map_or(0, |e| e.mean_hint()) as f64;
        let mut cands = Vec::new();
        let mut index = Vec::new();
        for k in 0..n.min(MAX_CANDIDATES) {
            let i = (cursor + k) % n;
            let Some(w) = self.workers.get(&servers[i]) else {
                continue;
            };
            if !w.is_hungry() || request.is_some_and(|r| !w.has_free(r)) {
                continue;
            }
            cands.push(Candidate {
                slots: w.slots,
                in_flight: w.in_flight.len().min(u32::MAX as usize) as u32,
                link: w.link,
                slowness: w.slowness,
            });
            index.push(i);
        }
        placement::choose(&cands, bytes, exec_us, &self.pool_link).map(|c| index[c])
    }

    /// Arms the grace timer of every waiting service that has no server.
    pub(super) fn arm_orphans(&mut self, now: Instant) {
        let grace = self.config.service_grace_ns;
        for &slot in &self.waiting_services {
            let Some(s) = self.services.get_mut(slot) else {
                continue;
            };
            if s.servers.is_empty() && s.orphan_at.is_none() && s.queued() > 0 {
                let at = Instant(now.0.saturating_add(grace));
                s.orphan_at = Some(at);
                self.timers.insert((at, Timer::Service(slot)), ());
            }
        }
    }

    /// The grace period of a service without servers passed: its queued calls fail.
    pub(in crate::core) fn on_orphan_timer(
        &mut self,
        slot: u64,
        now: Instant,
        results: &mut Results,
    ) {
        let Some(s) = self.services.get_mut(slot) else {
            return;
        };
        s.orphan_at = None;
        if !s.servers.is_empty() {
            return;
        }
        // Its calls of every class too: no worker serves the function at all.
        let ids: Vec<TaskId> = s
            .queue
            .iter()
            .chain(s.classes.values().flat_map(|cc| cc.queue.iter()))
            .map(|(_, _, _, id)| id)
            .collect();
        let message = format!(
            "no worker serves '{}' version {} any more: its last server left and none came \
             back within {:.0} s",
            s.name,
            s.version,
            self.config.service_grace_ns as f64 / 1e9
        );
        for id in ids {
            // Failing one may have ended another already (a remake fails its readers).
            if !self.is_queued(id) {
                continue;
            }
            if self.is_remake(id) {
                let data = Bytes::from(message.clone());
                self.remake_answered(id, WorkerId(0), TaskStatus::Failed, data, now);
                continue;
            }
            let task = self.tasks.get(id.0).expect("queued call is live");
            let pkg = task.package;
            let outcome = Self::system_outcome(task, TaskStatus::Failed, message.clone(), now);
            let outcome = self.finish_task(id, outcome, now);
            results.add(self, pkg, outcome);
        }
        self.free_service_if_unused(slot);
    }

    /// Moves a queued call to the worker: next attempt, one credit, in-flight.
    pub(super) fn assign_call(
        &mut self,
        id: TaskId,
        worker: WorkerId,
        class: Option<u64>,
        now: Instant,
    ) -> AssignCall {
        let timeout_ms = self.start(id, worker, now);
        let res = class.map_or_else(Resources::default, |c| self.hold_for_call(id, worker, c));
        let task = self.tasks.get(id.0).expect("just started");
        let call = task.call.as_ref().expect("a call");
        let s = self
            .services
            .get(call.service)
            .expect("a live call's service");
        AssignCall {
            task: id,
            attempt: task.attempt,
            name: s.name.clone(),
            version: s.version.clone(),
            args: task.args.clone(),
            inputs: call.inputs.clone(),
            timeout_ms,
            // Not fetched means other calls depend on it and the client does not want it.
            keep: !call.fetch,
            res,
        }
    }

    /// Learns, from one result, the link to the worker and its speed (placement).
    pub(in crate::core) fn learn_worker(
        &mut self,
        worker: WorkerId,
        bytes: u64,
        worker_us: u64,
        r: &crate::event::WorkerOutcome,
        fn_mean_us: Option<u64>,
    ) {
        let overhead = worker_us
            .saturating_sub(r.exec_us)
            .saturating_sub(r.wait_us)
            .saturating_sub(r.flush_us);
        self.pool_link.learn(bytes, overhead);
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.link.learn(bytes, overhead);
        // Speed is learned from calls long enough to measure (scheduling noise dominates
        // microsecond runs), and one sample moves it at most 4x either way.
        if let Some(mean) = fn_mean_us.filter(|&m| m >= MIN_SPEED_SAMPLE_US) {
            let sample = (r.exec_us as f64 / mean as f64).clamp(0.25, 4.0);
            w.slowness = Some(w.slowness.map_or(sample, |s| s + 0.2 * (sample - s)));
        }
    }
}
