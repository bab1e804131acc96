//! Submission checks: a package's size, its options, admission control against its deadline,
//! and its user's quota. Each refuses with the [`RejectReason`] a client is told; none changes
//! state.

use super::Core;
use crate::event::{MissPolicy, PackageOpts, RejectReason};
use crate::ids::{ClientId, FnHash, UserId};

/// Most copies of one task (replicas, disagreement copies and hedges together).
const MAX_COPIES: u8 = 16;

impl Core {
    /// The task count of a package, if it is within 1..=limit (and so fits a `u32`).
    pub(super) fn check_size(&self, tasks: usize) -> Result<u32, RejectReason> {
        let limit = self.config.max_tasks_per_package.min(u32::MAX as usize);
        match tasks {
            0 => Err(RejectReason::Empty),
            n if n > limit => Err(RejectReason::TooManyTasks { tasks: n, limit }),
            n => Ok(n as u32),
        }
    }

    /// Refuses options that contradict each other or exceed a limit.
    pub(super) fn check_options(opts: &PackageOpts) -> Result<(), RejectReason> {
        let bad = |m: String| Err(RejectReason::InvalidOptions(m));
        let (replicas, quorum) = (opts.replicas(), opts.quorum());
        if replicas > MAX_COPIES {
            return bad(format!("replicas is {replicas}, at most {MAX_COPIES}"));
        }
        if quorum > replicas {
            return bad(format!(
                "quorum is {quorum} but replicas is {replicas}: a quorum needs that many copies"
            ));
        }
        if opts.max_copies > MAX_COPIES {
            return bad(format!(
                "max_copies is {}, at most {MAX_COPIES}",
                opts.max_copies
            ));
        }
        if opts.max_copies > 0 && opts.max_copies < replicas {
            return bad(format!(
                "max_copies is {} but replicas is {replicas}",
                opts.max_copies
            ));
        }
        if opts.admit && opts.deadline_ms == 0 {
            return bad("admit needs a deadline".to_owned());
        }
        if opts.on_miss == MissPolicy::Drop && opts.deadline_ms == 0 {
            return bad("on_miss = drop needs a deadline".to_owned());
        }
        Ok(())
    }

    /// Admission control: with `admit` (or for every package with a deadline under
    /// `admit_deadlines`), refuses a package whose last task, by the running
    /// estimate of its function, cannot finish by its deadline. The estimate: the work queued
    /// at its priority or above and the work running (each task at its function's mean) are
    /// spread over the worker slots, then its own tasks; its last task takes the function's
    /// p95. A function with no result yet is admitted (nothing is known). O(priority classes).
    ///
    /// A package of a resource class (`class`) counts only the slots of the workers that can
    /// serve it, the work queued in its class, and the running work's share of those slots
    /// (running work spread evenly over all slots: the core does not track it per class).
    pub(super) fn check_admission(
        &mut self,
        fn_hash: &FnHash,
        opts: &PackageOpts,
        tasks: u32,
        class: Option<u64>,
    ) -> Result<(), RejectReason> {
        let asked = opts.admit || self.config.admit_deadlines;
        if !asked || opts.deadline_ms == 0 {
            return Ok(());
        }
        let deadline_us = u64::from(opts.deadline_ms) * 1_000;
        let (all_slots, queued_us, running_us) =
            match class.and_then(|slot| Some((self.class_slots(slot), self.classes.get(slot)?))) {
                Some((class_slots, c)) => {
                    let share = u128::from(self.running_work_us) * u128::from(class_slots)
                        / u128::from(self.total_slots.max(1));
                    let share = u64::try_from(share).unwrap_or(u64::MAX);
                    (class_slots, c.queue.work_at_or_above(opts.priority), share)
                }
                None => (
                    self.total_slots,
                    self.queue.work_at_or_above(opts.priority),
                    self.running_work_us,
                ),
            };
        let slots = all_slots.min(u64::from(u32::MAX)) as u32;
        let backlog_us = queued_us.saturating_add(running_us);
        let est = self.estimate(fn_hash).unwrap_or_default();
        let refuse = |finish_us: u64| RejectReason::Admission {
            tasks,
            finish_us,
            deadline_us,
            per_task_us: est.mean_us,
            p95_us: est.p95_us,
            samples: est.samples.min(u64::from(u32::MAX)) as u32,
            slots,
            backlog_us,
        };
        if slots == 0 {
            return Err(RejectReason::NoWorkerSlots { deadline_us });
        }
        if est.samples == 0 {
            return Ok(());
        }
        let own = u64::from(tasks - 1).saturating_mul(est.mean_us);
        let finish_us = backlog_us
            .saturating_add(own)
            .div_ceil(u64::from(slots))
            .saturating_add(est.p95_us);
        if finish_us > deadline_us {
            return Err(refuse(finish_us));
        }
        Ok(())
    }

    /// Refuses a package of `tasks` tasks and `bytes` argument bytes that would take its user's
    /// queued and running tasks past a per-user bound. O(1).
    pub(super) fn check_user_bounds(
        &self,
        user: UserId,
        tasks: u64,
        bytes: u64,
    ) -> Result<(), RejectReason> {
        let (used_tasks, used_bytes) = self
            .users
            .get(&user)
            .map_or((0, 0), |u| (u.queued_tasks, u.queued_bytes));
        let checks = [
            (
                "tasks",
                "--max-queued-tasks-per-user",
                used_tasks,
                tasks,
                self.config.max_queued_tasks_per_user,
            ),
            (
                "argument bytes",
                "--max-queued-mb-per-user",
                used_bytes,
                bytes,
                self.config.max_queued_bytes_per_user,
            ),
        ];
        for (what, option, used, adding, limit) in checks {
            if limit > 0 && used.saturating_add(adding) > limit {
                return Err(RejectReason::UserLimit {
                    what,
                    option,
                    used,
                    adding,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Whether a package of `tasks` tasks and `bytes` argument bytes from `client` would be
    /// refused by its user's bounds now (the shell does not journal such a package).
    pub fn refuses_for_user_bounds(&self, client: ClientId, tasks: usize, bytes: u64) -> bool {
        let Some(c) = self.clients.get(&client) else {
            return false;
        };
        self.check_user_bounds(c.user, tasks as u64, bytes).is_err()
    }

    /// `tasks` tasks holding `bytes` argument bytes of `user` are queued (or restored).
    pub(super) fn user_takes(&mut self, user: UserId, tasks: u64, bytes: u64) {
        let u = self.users.entry(user).or_default();
        u.queued_tasks += tasks;
        u.queued_bytes += bytes;
    }

    /// One task of `user` holding `bytes` argument bytes is done or cancelled.
    pub(super) fn user_releases(&mut self, user: UserId, bytes: usize) {
        if let Some(u) = self.users.get_mut(&user) {
            u.queued_tasks -= 1;
            u.queued_bytes -= bytes as u64;
        }
    }

    /// Refuses a user whose quota is used up.
    pub(super) fn check_quota(&self, user: UserId) -> Result<(), RejectReason> {
        match self.users.get(&user).and_then(|u| u.remaining_us) {
            Some(left) if left <= 0 => Err(RejectReason::QuotaExhausted {
                over_us: left.unsigned_abs(),
            }),
            _ => Ok(()),
        }
    }
}
