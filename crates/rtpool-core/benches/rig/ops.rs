//! The operations the benches time ([`Op`]) and, for each, how the rig prepares its event and
//! undoes its effect ([`Rig::prepare`], [`Rig::undo`]), so the state keeps its size.

use super::*;

/// One core operation, as timed by the benches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `Submit` of a 1-task package (no worker has credits: nothing is assigned).
    Submit1,
    /// `Submit` of a 100-task package, reported per call.
    Submit100,
    /// `Credit` of 1 that assigns one queued task.
    Assign,
    /// `Results` with one result of a running task.
    Complete,
    /// `Cancel` of a whole package of 100 queued tasks.
    Cancel100,
    /// `Cancel` of one index of a queued package.
    CancelOne,
    /// `WorkerLost` of a worker running its 4 slots full.
    WorkerLost,
    /// `WorkerLost` of a worker holding a full prefetch of 16 (4 running, 12 waiting): what the
    /// master sends the core when a worker's lease expires.
    LeaseExpiry,
    /// `Tick` that fires exactly one task's time limit.
    TimeLimitTick,
    /// `Tick` at the deadline of a 4-task package with `on_miss = drop`, one task running and
    /// three queued: the deadline timer fails all four (one aborted on its worker).
    DeadlineTick,
    /// `Tick` that fires one hedged task's straggler check. Every other worker is busy with no
    /// free credit (the queue is never empty), so the core re-arms the check a p95 later
    /// instead of starting a backup copy.
    HedgeTick,
    /// `WorkerJoined` of a worker with no credit: with resource classes, it is checked against
    /// each class and becomes a server of those it can serve (every one, in this rig).
    WorkerJoin,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: [Op; 12] = [
        Op::Submit1,
        Op::Submit100,
        Op::Assign,
        Op::Complete,
        Op::Cancel100,
        Op::CancelOne,
        Op::WorkerLost,
        Op::LeaseExpiry,
        Op::TimeLimitTick,
        Op::DeadlineTick,
        Op::HedgeTick,
        Op::WorkerJoin,
    ];

    /// Name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Submit1 => "submit, 1-task package",
            Op::Submit100 => "submit, 100-task package",
            Op::Assign => "assign (credit of 1)",
            Op::Complete => "complete (1 result)",
            Op::Cancel100 => "cancel, queued package of 100",
            Op::CancelOne => "cancel, 1 index",
            Op::WorkerLost => "worker lost (4 running)",
            Op::LeaseExpiry => "lease expiry = worker lost (16 held)",
            Op::TimeLimitTick => "tick: 1 time limit fires",
            Op::DeadlineTick => "tick: deadline drops a 4-task package",
            Op::HedgeTick => "tick: 1 hedge check (re-armed)",
            Op::WorkerJoin => "worker joins (no credit yet)",
        }
    }

    /// Identifier for JSON and criterion.
    pub fn slug(self) -> &'static str {
        match self {
            Op::Submit1 => "submit_1",
            Op::Submit100 => "submit_100",
            Op::Assign => "assign",
            Op::Complete => "complete",
            Op::Cancel100 => "cancel_100",
            Op::CancelOne => "cancel_one",
            Op::WorkerLost => "worker_lost",
            Op::LeaseExpiry => "lease_expiry",
            Op::TimeLimitTick => "tick_time_limit",
            Op::DeadlineTick => "tick_deadline",
            Op::HedgeTick => "tick_hedge",
            Op::WorkerJoin => "worker_join",
        }
    }
}

impl Rig {
    /// The event to time, with the state set up for it; `self.now` is its instant.
    pub(super) fn prepare(&mut self, op: Op) -> Event {
        match op {
            Op::WorkerJoin => {
                let id = WorkerId(self.next_worker);
                self.next_worker += 1;
                self.now += STEP_NS;
                self.join_event(id, SLOTS)
            }
            Op::Submit1 => self.prepare_submit(1, PackageOpts::default()),
            Op::Submit100 => self.prepare_submit(PACKAGE, PackageOpts::default()),
            Op::Assign => {
                let i = self.next_index();
                let worker = self.workers[i].id;
                self.now += STEP_NS;
                Event::Credit { worker, credits: 1 }
            }
            Op::Complete => {
                let i = self.next_index();
                let (task, attempt) = self.workers[i].tasks.pop_front().expect("busy worker");
                self.now += STEP_NS;
                Event::Results {
                    worker: self.workers[i].id,
                    results: vec![ok(task, attempt, TaskStatus::Ok)],
                }
            }
            Op::Cancel100 => {
                let (package, client) = self.take_intact();
                self.now += STEP_NS;
                Event::Cancel {
                    client,
                    package,
                    indices: vec![],
                }
            }
            Op::CancelOne => {
                // The partial package is the newest whole one when taken, but tasks of an
                // older package of its user may all go meanwhile: then its own front is taken
                // by the next assignment, and the next index may not be queued any more.
                let next = match self.partial {
                    Some((package, client, index)) if (index as usize) < PACKAGE => {
                        let counts = self.counts(client, package);
                        let whole =
                            counts.is_some_and(|c| c.queued as usize == PACKAGE - index as usize);
                        whole.then_some((package, client, index))
                    }
                    _ => None,
                };
                let (package, client, index) = next.unwrap_or_else(|| {
                    let (package, client) = self.take_intact();
                    (package, client, 0)
                });
                self.partial = Some((package, client, index + 1));
                self.now += STEP_NS;
                Event::Cancel {
                    client,
                    package,
                    indices: vec![index],
                }
            }
            Op::WorkerLost => {
                let i = self.next_index();
                let worker = self.workers[i].id;
                let tasks = self.workers[i].tasks.iter().copied().collect();
                self.pending = Pending::Lost {
                    tasks,
                    replace: Some(i),
                };
                self.now += STEP_NS;
                Event::WorkerLost {
                    worker,
                    cause: LossCause::Closed,
                }
            }
            Op::LeaseExpiry => {
                let victim = self.join(SLOTS, PREFETCH);
                assert_eq!(victim.tasks.len(), PREFETCH as usize);
                self.pending = Pending::Lost {
                    tasks: victim.tasks.into_iter().collect(),
                    replace: None,
                };
                self.now += STEP_NS;
                Event::WorkerLost {
                    worker: victim.id,
                    cause: LossCause::Silent,
                }
            }
            Op::TimeLimitTick => {
                // A 1-task package with a 1 ms limit, at a higher priority so the next credit
                // takes it, assigned to a busy worker: its timer is the earliest one.
                let opts = PackageOpts {
                    priority: 1,
                    timeout_ms: 1,
                    ..PackageOpts::default()
                };
                self.submit_untimed(1, opts, None);
                let i = self.next_index();
                let worker = self.workers[i].id;
                let got = self.give(worker, 1);
                assert_eq!(got.len(), 1, "the victim is assigned");
                let at = self.core.next_timer().expect("the victim's timer");
                assert!(
                    at.0 > self.now && at.0 - self.now <= 1_000_000 + 2_000_000_000,
                    "the earliest timer is the victim's"
                );
                self.now = at.0;
                Event::Tick
            }
            Op::DeadlineTick => {
                // 4 tasks at a higher priority, so a busy worker's next credit takes the
                // first; the tick comes 1 ms + 1 us after the master received the package.
                let opts = PackageOpts {
                    priority: 1,
                    deadline_ms: 1,
                    on_miss: MissPolicy::Drop,
                    ..PackageOpts::default()
                };
                let received = self.now + STEP_NS;
                let (package, client) = self.submit_untimed(DEADLINE_TASKS, opts, None);
                let (worker, task) = self.run_one_of(package, client);
                self.pending = Pending::Victim {
                    package,
                    client,
                    worker,
                    task,
                    dropped: self.core.stats().counters.deadline_dropped,
                    hedges: 0,
                };
                self.now = received + 1_000_000 + STEP_NS;
                Event::Tick
            }
            Op::HedgeTick => {
                let opts = PackageOpts {
                    priority: 1,
                    hedge: true,
                    ..PackageOpts::default()
                };
                let (package, client) = self.submit_untimed(1, opts, Some(HEDGE_FN));
                let assigned_at = self.now + STEP_NS;
                let (worker, task) = self.run_one_of(package, client);
                let at = self.core.next_timer().expect("the hedge timer");
                // 1.5 x the p95 of the fastest worker's pace (its assignment-to-result times,
                // the rig's steps included, so a little over HEDGE_EXEC_US): after one healthy
                // run, well before three.
                let after = at.0 - assigned_at;
                assert!(
                    after > HEDGE_EXEC_US * 1_000 && after < 3 * HEDGE_EXEC_US * 1_000,
                    "the earliest timer is the hedge check, 1.5 x the fast pace's p95 after the \
                     start, not {after} ns"
                );
                self.pending = Pending::Victim {
                    package,
                    client,
                    worker,
                    task,
                    dropped: 0,
                    hedges: self.core.stats().counters.hedges,
                };
                self.now = at.0;
                Event::Tick
            }
        }
    }

    /// Undoes what the timed call did, from its actions.
    pub(super) fn undo(&mut self, op: Op, out: &[Action]) {
        match op {
            Op::WorkerJoin => {
                assert!(
                    out.is_empty(),
                    "a worker with no credit is sent nothing: {out:?}"
                );
                let out = self.apply(Event::WorkerLost {
                    worker: WorkerId(self.next_worker - 1),
                    cause: LossCause::Closed,
                });
                assert!(out.is_empty(), "it held nothing: {out:?}");
            }
            Op::Submit1 | Op::Submit100 => {
                let Some(Action::Accepted {
                    client, package, ..
                }) = out.first()
                else {
                    panic!("submission not accepted: {out:?}");
                };
                self.cancel_untimed(*client, *package);
            }
            Op::Assign => {
                let [Action::Assign { worker, tasks }] = out else {
                    panic!("one assignment expected: {out:?}");
                };
                assert_eq!(tasks.len(), 1);
                let returned = vec![(tasks[0].task, tasks[0].attempt)];
                self.apply(Event::Returned {
                    worker: *worker,
                    tasks: returned,
                });
            }
            Op::Complete => {
                assert!(
                    matches!(out, [Action::SendResults { results, .. }] if results.len() == 1),
                    "one result sent: {out:?}"
                );
                self.settle(out);
                let i = self.last_index();
                let worker = self.workers[i].id;
                let got = self.give(worker, 1);
                self.workers[i].tasks.extend(got);
                self.deficit += 1;
            }
            Op::Cancel100 => {
                assert!(
                    out.iter().any(|a| matches!(a, Action::PackageFreed { .. })),
                    "the cancelled package is freed: {out:?}"
                );
                self.deficit += PACKAGE;
            }
            Op::CancelOne => {
                assert!(
                    !out.iter().any(|a| matches!(a, Action::Abort { .. })),
                    "a queued task was cancelled: {out:?}"
                );
                self.deficit += 1;
            }
            Op::WorkerLost | Op::LeaseExpiry => {
                let Pending::Lost { tasks, replace } =
                    std::mem::replace(&mut self.pending, Pending::None)
                else {
                    panic!("no lost worker prepared");
                };
                assert!(
                    out.is_empty(),
                    "the lost worker's tasks are requeued, nothing else: {out:?}"
                );
                // The queue got the lost tasks back; the sink takes them and as many others.
                let taken = self.finish_on_sink(&tasks);
                match replace {
                    Some(i) => {
                        self.workers[i] = self.join(SLOTS, SLOTS);
                        self.deficit += taken + SLOTS as usize - tasks.len();
                    }
                    None => self.deficit += taken - tasks.len() + PREFETCH as usize,
                }
            }
            Op::TimeLimitTick => {
                assert!(
                    out.iter().any(|a| matches!(a, Action::Abort { .. })),
                    "the time limit fired: {out:?}"
                );
                self.settle(out);
                // The worker answers the abort; the task, acknowledged, is freed.
                for action in out {
                    if let Action::Abort { worker, tasks } = action {
                        let results = tasks
                            .iter()
                            .map(|&(task, attempt)| ok(task, attempt, TaskStatus::Error))
                            .collect();
                        self.apply(Event::Results {
                            worker: *worker,
                            results,
                        });
                    }
                }
            }
            Op::DeadlineTick => {
                let Pending::Victim {
                    package,
                    client,
                    worker,
                    task,
                    dropped,
                    ..
                } = std::mem::replace(&mut self.pending, Pending::None)
                else {
                    panic!("no deadline victim prepared");
                };
                assert_eq!(
                    self.core.stats().counters.deadline_dropped,
                    dropped + DEADLINE_TASKS as u64,
                    "the deadline dropped the package's tasks: {out:?}"
                );
                assert!(
                    out.iter().any(|a| matches!(a,
                        Action::Abort { worker: w, tasks } if *w == worker && tasks == &[task])),
                    "the running task is aborted: {out:?}"
                );
                self.deadline_fired += 1;
                self.settle(out);
                self.apply(Event::Results {
                    worker,
                    results: vec![ok(task.0, task.1, TaskStatus::Error)],
                });
                assert!(
                    self.counts(client, package).is_none(),
                    "the victim is freed"
                );
            }
            Op::HedgeTick => {
                let Pending::Victim {
                    package,
                    client,
                    worker,
                    task,
                    hedges,
                    ..
                } = std::mem::replace(&mut self.pending, Pending::None)
                else {
                    panic!("no hedge victim prepared");
                };
                assert!(out.is_empty(), "no worker is free: no copy starts: {out:?}");
                assert_eq!(
                    self.core.stats().counters.hedges,
                    hedges,
                    "no hedge started"
                );
                let again = self.core.next_timer().expect("the re-armed check");
                assert!(
                    again.0 > self.now && again.0 - self.now < 3 * HEDGE_EXEC_US * 1_000,
                    "the check is re-armed a healthy p95 later (the fast pace's, a little over \
                     HEDGE_EXEC_US), not {} ns",
                    again.0 - self.now
                );
                self.hedge_checks += 1;
                let answer = self.apply(Event::Results {
                    worker,
                    results: vec![result(task.0, task.1, TaskStatus::Ok, HEDGE_EXEC_US)],
                });
                self.settle(&answer);
                assert!(
                    self.counts(client, package).is_none(),
                    "the victim is freed"
                );
            }
        }
        self.top_up();
    }
}
