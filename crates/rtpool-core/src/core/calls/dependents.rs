//! A call decided and its dependents: its result fed to the calls that read it (queued when
//! their last input arrives), or its failure or cancellation passed on to them, transitively.

use bytes::Bytes;

use crate::core::lineage::NO_SOURCE;
use crate::core::Core;
use crate::event::{TaskOutcome, TaskStatus};
use crate::ids::{Instant, TaskId, WorkerId};
use crate::task::{Call, TaskState};

impl Core {
    /// A call is decided (`outcome`, before its data is withheld from the client): its
    /// dependents receive its result and the ready ones are queued, or, if it failed, they
    /// fail in turn (transitively). Returns whether the client gets the data (always for a
    /// failure).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::core) fn call_finished(
        &mut self,
        slot: u64,
        index: u32,
        call: &Call,
        outcome: &TaskOutcome,
        made_on: Option<WorkerId>,
        args: Bytes,
        now: Instant,
    ) -> bool {
        self.service_call_ended(call.service);
        // A kept intermediate: recorded, so that it is dropped once its readers are done and
        // made again if its worker is lost before (lineage.rs).
        let kept = match made_on {
            Some(worker) if !call.fetch && outcome.status == TaskStatus::Ok => {
                Some(self.record_kept(slot, index, worker, outcome.data.clone(), call, args))
            }
            _ => None,
        };
        for &j in &call.dependents {
            let Some(id) = self.call_id(slot, j) else {
                continue;
            };
            let task = self.tasks.get_mut(id.0).expect("checked by call_id");
            if task.state != TaskState::Waiting {
                continue;
            }
            if outcome.status == TaskStatus::Ok {
                let dependent = task.call.as_mut().expect("a call");
                for (p, &d) in dependent.deps.iter().enumerate() {
                    if d == index {
                        dependent.inputs[p] = outcome.data.clone();
                        dependent.waiting -= 1;
                        if let Some(record) = kept {
                            if dependent.sources.is_empty() {
                                dependent.sources = vec![NO_SOURCE; dependent.deps.len()];
                            }
                            dependent.sources[p] = record;
                        }
                    }
                }
                if let Some(record) = kept.and_then(|k| self.kept_calls.get_mut(k)) {
                    record.readers += 1;
                }
                let task = self.tasks.get_mut(id.0).expect("checked by call_id");
                let dependent = task.call.as_mut().expect("a call");
                if dependent.waiting == 0 {
                    task.state = TaskState::Queued;
                    self.enqueue(id, false);
                }
            } else {
                let reason = self.failure_reason(slot, index, call.service, j, outcome);
                self.doomed.push((id, reason));
            }
        }
        self.fail_doomed(now);
        if let Some(record) = kept {
            self.settle(record); // dropped now if every dependent was cancelled or failed
        }
        call.fetch || outcome.status != TaskStatus::Ok
    }

    /// Fails the waiting calls of `doomed` (their results go out at the end of the event),
    /// unless an outer call is already working the list off (a long chain does not recurse).
    pub(in crate::core) fn fail_doomed(&mut self, now: Instant) {
        if self.failing_dependents {
            return;
        }
        self.failing_dependents = true;
        while let Some((id, reason)) = self.doomed.pop() {
            let Some(task) = self.tasks.get(id.0) else {
                continue;
            };
            if task.state != TaskState::Waiting {
                continue;
            }
            let pkg = task.package;
            let o = Self::system_outcome(task, TaskStatus::Failed, reason, now);
            let o = self.finish_task(id, o, now);
            self.cascade.push((pkg, o));
        }
        self.failing_dependents = false;
    }

    /// Why call `dependent` will not run: its input from call `index` failed.
    pub(super) fn failure_reason(
        &self,
        slot: u64,
        index: u32,
        service: u64,
        dependent: u32,
        outcome: &TaskOutcome,
    ) -> String {
        let name = |svc: u64| {
            self.services
                .get(svc)
                .map_or_else(|| "?".to_owned(), |s| s.name.clone())
        };
        let dep_service = self
            .call_id(slot, dependent)
            .and_then(|id| self.tasks.get(id.0))
            .and_then(|t| t.call.as_ref())
            .map_or(service, |c| c.service);
        let what = match outcome.status {
            TaskStatus::Error => "raised an error (see that call's result)".to_owned(),
            status => {
                let text = String::from_utf8_lossy(&outcome.data);
                let text: String = text.chars().take(300).collect();
                format!("failed ({status:?}: {text})")
            }
        };
        format!(
            "call #{dependent} {} not run: its input from call #{index} {} {what}",
            name(dep_service),
            name(service)
        )
    }

    /// A cancelled call's dependents are cancelled too (no results: the client cancelled
    /// their input). Transitive, O(calls cancelled).
    pub(in crate::core) fn cancel_dependents(
        &mut self,
        slot: u64,
        call: &Call,
        aborts: &mut Vec<(WorkerId, TaskId, u32)>,
    ) {
        if let Some(s) = self.services.get_mut(call.service) {
            s.calls -= 1;
        }
        self.free_service_if_unused(call.service);
        for &j in &call.dependents {
            if let Some(id) = self.call_id(slot, j) {
                self.cancel_task(id, aborts);
            }
        }
    }
}
