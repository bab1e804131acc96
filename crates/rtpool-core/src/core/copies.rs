//! Copies of a task: replicas validated by quorum, copies added after a disagreement, and
//! straggler hedges (see [`crate::group`]). Every operation here touches one group, at most
//! `max_copies` (16) tasks: O(1) in the size of the state.

use super::timers::Results;
use super::{Core, Timer};
use crate::event::{TaskOutcome, TaskStatus};
use crate::group::{Group, Vote};
use crate::ids::{FnHash, Instant, TaskId, WorkerId};
use crate::task::{Task, TaskState};

impl Core {
    /// Makes a task the first copy of a group, if it is not in one yet. Returns the group.
    pub(super) fn ensure_group(&mut self, id: TaskId) -> u64 {
        let task = self.tasks.get(id.0).expect("group of a freed task");
        if let Some(g) = task.group {
            return g;
        }
        let g = self.groups.insert(Group::new(task.package, task.index, id));
        self.tasks.get_mut(id.0).expect("checked").group = Some(g);
        g
    }

    /// Starts one more copy of the task `of` (any live copy of it): a shadow, queued at the
    /// front of its package (`front`) or the back. Returns it.
    pub(super) fn new_copy(&mut self, of: TaskId, now: Instant, front: bool) -> TaskId {
        let g = self.ensure_group(of);
        let task = self.tasks.get(of.0).expect("copy of a freed task");
        let mut copy = Task::new(task.package, task.index, task.args.clone(), now);
        copy.submitted_at = task.submitted_at;
        copy.group = Some(g);
        copy.shadow = true;
        let id = TaskId(self.tasks.insert(copy));
        let group = self.groups.get_mut(g).expect("live group");
        group.copies.push(id);
        group.started = group.started.saturating_add(1);
        self.counters.extra_copies += 1;
        self.enqueue(id, front);
        id
    }

    /// Whether `worker` already holds or answered another copy of the task: copies run on
    /// distinct workers, so agreeing answers are independent.
    pub(super) fn conflicts(&self, id: TaskId, worker: WorkerId) -> bool {
        let Some(group) = self
            .tasks
            .get(id.0)
            .and_then(|t| t.group)
            .and_then(|g| self.groups.get(g))
        else {
            return false;
        };
        group.votes.iter().any(|v| v.worker == worker)
            || group
                .copies
                .iter()
                .any(|&c| c != id && self.tasks.get(c.0).and_then(Task::holder) == Some(worker))
    }

    /// Cancels a live copy that lost the race (or whose task ended otherwise): a queued one is
    /// freed, a running one is aborted on its worker and freed when the worker answers.
    pub(super) fn cancel_copy(&mut self, id: TaskId) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        task.group = None;
        let slot = task.package;
        match task.state {
            TaskState::Queued => {
                let pos = task.queue_pos;
                self.unqueue(slot, pos);
                self.tasks.remove(id.0);
            }
            TaskState::Running { worker, seq, .. } => self.abort_running(id, slot, worker, seq),
            _ => return,
        }
        self.counters.copies_cancelled += 1;
    }

    /// Aborts the running task `id` of the package in `slot` on `worker`: it stays
    /// `Cancelled` until the worker answers, which frees it.
    pub(super) fn abort_running(&mut self, id: TaskId, slot: u64, worker: WorkerId, seq: u64) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        task.state = TaskState::Cancelled { worker, seq };
        self.pending_aborts.push((worker, id, task.attempt));
        self.disarm_task_timer(id);
        self.leave_running(slot);
        self.cancelling += 1;
    }

    /// A copy of the package in `slot` ran `us` on `worker` before it was aborted: a lower
    /// bound of that worker's time (see [`crate::estimate::Estimator::add_censored_pace`]).
    fn learn_censored(&mut self, slot: u64, worker: WorkerId, us: u64) {
        let key = self.workers.get(&worker).map(|w| w.key);
        if let (Some(p), Some(key)) = (self.packages.get(slot), key) {
            let fn_hash = p.fn_hash;
            self.estimates
                .entry(fn_hash)
                .or_default()
                .add_censored_pace(key, us);
        }
    }

    /// A running copy leaves after answering (or being failed by the master): if its worker
    /// still holds it (`held`, a master-made outcome) it is aborted there and freed when the
    /// worker answers; otherwise it is freed now. It must not be the package's listed copy.
    fn retire_copy(&mut self, id: TaskId, held: bool) {
        self.disarm_task_timer(id);
        let task = self.tasks.get_mut(id.0).expect("retire of a freed copy");
        debug_assert!(task.shadow, "retire of a primary");
        let slot = task.package;
        let TaskState::Running { worker, seq, .. } = task.state else {
            panic!("retire of {id} in state {:?}", task.state);
        };
        if held {
            task.group = None;
            task.state = TaskState::Cancelled { worker, seq };
            self.pending_aborts.push((worker, id, task.attempt));
            self.cancelling += 1;
        } else {
            self.tasks.remove(id.0);
        }
        self.leave_running(slot);
    }

    /// The live copy of the group to list next: a running one if any (it is nearest to an
    /// answer), else the first.
    fn next_primary(&self, g: u64) -> TaskId {
        let group = self.groups.get(g).expect("live group");
        group
            .copies
            .iter()
            .copied()
            .find(|&c| {
                matches!(
                    self.tasks.get(c.0).map(|t| t.state),
                    Some(TaskState::Running { .. })
                )
            })
            .or_else(|| group.copies.first().copied())
            .expect("a group with a live copy")
    }

    /// Makes the live copy `next` the package's listed copy instead of the running copy `old`,
    /// which becomes a shadow (about to be retired).
    fn promote(&mut self, next: TaskId, old: TaskId) {
        let next_queued = {
            let t = self
                .tasks
                .get_mut(next.0)
                .expect("promotion of a freed copy");
            t.shadow = false;
            t.state == TaskState::Queued
        };
        let t = self.tasks.get_mut(old.0).expect("live primary");
        t.shadow = true;
        let (slot, index) = (t.package, t.index as usize);
        let p = self.packages.get_mut(slot).expect("live package");
        p.tasks[index] = next;
        p.counts.running -= 1;
        if next_queued {
            p.counts.queued += 1;
        } else {
            p.counts.running += 1;
        }
    }

    /// One copy of a grouped task answered (`held == false`: its worker sent a result or was
    /// lost) or the master failed it (`held == true`: a time limit; the worker still runs it).
    /// The answer is a vote; `quorum` byte-equal votes accept it, the other copies are
    /// cancelled. Otherwise more copies start (up to `max_copies`) while the quorum can still
    /// be reached, and with no copy left the task fails with status 8, every answer attached.
    pub(super) fn copy_answered(
        &mut self,
        id: TaskId,
        worker: WorkerId,
        outcome: TaskOutcome,
        held: bool,
        now: Instant,
        results: &mut Results,
    ) {
        self.disarm_task_timer(id);
        let task = self.tasks.get(id.0).expect("answer of a freed copy");
        let (g, slot, is_primary) = (
            task.group.expect("a grouped copy"),
            task.package,
            !task.shadow,
        );
        let opts = &self.packages.get(slot).expect("live package").opts;
        let (quorum, max_copies) = (usize::from(opts.quorum()), opts.max_copies());
        let group = self.groups.get_mut(g).expect("live group");
        group.copies.retain(|&c| c != id);
        // A failure the master made up (a time limit, a lost worker) is not an answer while
        // another copy may still give one: the copy just leaves.
        let system = held || outcome.status == TaskStatus::Lost;
        if system && !group.copies.is_empty() {
            if is_primary {
                let next = self.next_primary(g);
                self.promote(next, id);
            }
            self.retire_copy(id, held);
            return;
        }
        group.votes.push(Vote {
            worker,
            status: outcome.status,
            data: outcome.data.clone(),
        });
        let agree = group.agreeing(outcome.status, &outcome.data);
        if agree >= quorum {
            let winner = if is_primary {
                id
            } else {
                self.retire_copy(id, held);
                self.counters.hedge_wins += u64::from(self.groups.get(g).is_some_and(|g| g.hedged));
                let index = self.groups.get(g).expect("live group").index;
                self.packages.get(slot).expect("live package").tasks[index as usize]
            };
            self.finish_copy_task(winner, outcome, is_primary && !held, now, results);
            return;
        }
        if group.votes.len() > 1 && agree == 1 {
            self.counters.disagreements += 1;
        }
        let need = quorum.saturating_sub(group.best_agreement());
        let room = usize::from(max_copies.saturating_sub(group.started));
        let spawn = need.saturating_sub(group.copies.len()).min(room);
        for _ in 0..spawn {
            self.new_copy(id, now, true);
        }
        let group = self.groups.get(g).expect("live group");
        if !is_primary {
            self.retire_copy(id, held);
            return;
        }
        // The listed copy answered without deciding the task: another live copy takes its
        // place, or, with none left, the task fails.
        if !group.copies.is_empty() {
            let next = self.next_primary(g);
            self.promote(next, id);
            self.retire_copy(id, held);
            return;
        }
        let data = group.disagreement(quorum as u8);
        let message = Self::system_outcome(
            self.tasks.get(id.0).expect("live"),
            TaskStatus::Disagree,
            String::new(),
            now,
        );
        let failed = TaskOutcome { data, ..message };
        self.counters.quorum_failed += 1;
        self.finish_copy_task(id, failed, !held, now, results);
    }

    /// Finishes the package's listed copy with `outcome` (which cancels the other copies). If
    /// `answered`, its own worker sent the answer and holds nothing; otherwise a worker still
    /// running it is told to abort.
    fn finish_copy_task(
        &mut self,
        id: TaskId,
        outcome: TaskOutcome,
        answered: bool,
        now: Instant,
        results: &mut Results,
    ) {
        let task = self.tasks.get(id.0).expect("finish of a freed task");
        let slot = task.package;
        let running_on = match task.state {
            TaskState::Running {
                worker,
                assigned_at,
                ..
            } => Some((worker, task.attempt, assigned_at)),
            _ => None,
        };
        let outcome = self.finish_task(id, outcome, now);
        if let Some((worker, attempt, assigned_at)) = running_on {
            if answered {
                let task = self.tasks.get_mut(id.0).expect("just finished");
                task.state = TaskState::Done {
                    holder: None,
                    acked: false,
                };
            } else {
                // Another copy decided it while this one still runs.
                self.pending_aborts.push((worker, id, attempt));
                self.learn_censored(slot, worker, now.micros_since(assigned_at));
                self.counters.copies_cancelled += 1;
            }
        }
        results.add(self, slot, outcome);
    }

    /// Arms a hedged task's straggler check when it starts: after `hedge_factor` times what a
    /// healthy worker takes (the p95 of the fastest connected worker's pace on its function,
    /// or the function's p95 before any pace is known), or earlier when its deadline would be
    /// at risk (less than that p95 left). A worker whose own pace is already past that mark
    /// is a known straggler: its task is hedged at once. Nothing is armed until the
    /// function's estimate rests on enough results.
    pub(super) fn arm_hedge(&mut self, id: TaskId, now: Instant) {
        let task = self.tasks.get(id.0).expect("hedge of a freed task");
        let TaskState::Running { worker, .. } = task.state else {
            return;
        };
        let p = self.packages.get(task.package).expect("live package");
        if !p.opts.hedge {
            return;
        }
        let (fn_hash, deadline) = (p.fn_hash, p.deadline);
        let Some(est) = self.trusted_estimate(&fn_hash) else {
            return;
        };
        let p95_ns = self.healthy_p95_us(&fn_hash, est.p95_us).max(1) * 1_000;
        let delay = (p95_ns as f64 * self.config.hedge_factor.max(1.0)) as u64;
        let mut at = if self.is_known_straggler(&fn_hash, worker, delay) {
            now.0
        } else {
            now.0.saturating_add(delay)
        };
        if let Some(deadline) = deadline {
            at = at.min(deadline.0.saturating_sub(p95_ns).max(now.0));
        }
        self.arm_hedge_at(id, Instant(at));
    }

    /// What a healthy worker takes to run the function, microseconds: the p95 of the fastest
    /// connected worker's pace with enough results, else `fallback_us` (the function's p95).
    /// O(paces kept per function, at most 32).
    fn healthy_p95_us(&self, fn_hash: &FnHash, fallback_us: u64) -> u64 {
        let min = self.config.estimate_min_samples.max(1);
        self.estimates
            .get(fn_hash)
            .and_then(|e| e.fast_p95(min, |k| self.worker_keys.contains_key(&k)))
            .unwrap_or(fallback_us)
    }

    /// Whether `worker`'s own pace on the function (with enough results) is a mean past
    /// `mark_ns`: its tasks are hedged at once, and re-checked often while no other worker
    /// has a free credit.
    fn is_known_straggler(&self, fn_hash: &FnHash, worker: WorkerId, mark_ns: u64) -> bool {
        let min = self.config.estimate_min_samples.max(1);
        let Some(key) = self.workers.get(&worker).map(|w| w.key) else {
            return false;
        };
        self.estimates
            .get(fn_hash)
            .and_then(|e| e.pace(key))
            .is_some_and(|p| p.samples >= min && p.mean_us.saturating_mul(1_000) > mark_ns)
    }

    fn arm_hedge_at(&mut self, id: TaskId, at: Instant) {
        let task = self.tasks.get_mut(id.0).expect("hedge of a freed task");
        if let Some(old) = task.hedge_at.replace(at) {
            self.timers.remove(&(old, Timer::Hedge(id, task.attempt)));
        }
        self.timers.insert((at, Timer::Hedge(id, task.attempt)), ());
    }

    /// A hedged attempt's check fired: if it still runs, start a backup copy for another
    /// worker — unless no other worker has a free credit now (then check again a p95 later,
    /// or an eighth of it on a known straggler).
    /// One hedge per task, within `max_copies`.
    pub(super) fn on_hedge_timer(&mut self, id: TaskId, attempt: u32, now: Instant) {
        let Some(task) = self.tasks.get_mut(id.0) else {
            return;
        };
        let TaskState::Running { worker, .. } = task.state else {
            return;
        };
        if task.attempt != attempt {
            return;
        }
        task.hedge_at = None;
        let slot = task.package;
        let group = task.group.and_then(|g| self.groups.get(g));
        let p = self.packages.get(slot).expect("live package");
        if group.is_some_and(|g| g.hedged || g.started >= p.opts.max_copies()) {
            return;
        }
        let fn_hash = p.fn_hash;
        let own = self
            .workers
            .get(&worker)
            .map_or(0, |w| u64::from(w.credits));
        if self.free_credits <= own {
            let p95 = self.estimate(&fn_hash).map_or(1_000, |e| e.p95_us);
            let mut retry = self.healthy_p95_us(&fn_hash, p95).max(1_000);
            // On a known straggler every moment counts (a credit elsewhere may come back a
            // moment later): check again after an eighth of a healthy run, at least 1 ms.
            let mark = (retry as f64 * 1_000.0 * self.config.hedge_factor.max(1.0)) as u64;
            if self.is_known_straggler(&fn_hash, worker, mark) {
                retry = (retry / 8).max(1_000);
            }
            self.arm_hedge_at(id, Instant(now.0.saturating_add(retry * 1_000)));
            return;
        }
        self.new_copy(id, now, true);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.note_hedged(id, attempt, fn_hash);
        }
        let g = self.tasks.get(id.0).and_then(|t| t.group).expect("grouped");
        self.groups.get_mut(g).expect("live group").hedged = true;
        self.counters.hedges += 1;
    }
}
