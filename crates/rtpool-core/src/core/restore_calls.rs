//! Packages of calls restored from the journal after a master restart.
//!
//! The journal keeps a call package's calls (each with the version it was resolved to), its
//! deliveries and its end, not its results: a restored package runs again every call whose
//! result the client did not acknowledge, and every acknowledged call whose result such a call
//! takes as an input (its data goes to its dependents only: the client has it already). The
//! other acknowledged calls are gone. The functions need not be served yet: a call names its
//! service entry, created unserved if no worker serves it, and waits for the service grace
//! period like calls whose last server left.

use bytes::Bytes;

use super::submit::NO_TASK;
use super::Core;
use crate::event::{Action, CallSpec, RestoredPackage};
use crate::ids::{Instant, TaskId};
use crate::task::{Call, Task, TaskState};

impl Core {
    /// Pins each call that names no version to the version a submission now resolves it to
    /// (the newest served), before the package reaches the core: the master journals a
    /// package of calls before it is applied (under `--fsync always` it is applied once its
    /// record is durable), so the record and the restored calls name what the calls run on.
    /// False if some call resolves to nothing now (the core will refuse the package if it
    /// still does when it is applied).
    pub fn pin_call_versions(&self, calls: &mut [CallSpec]) -> bool {
        let mut all = true;
        for call in calls.iter_mut() {
            match self.services.resolve(&call.name, &call.version) {
                Some(slot) if call.version.is_empty() => {
                    if let Some(s) = self.services.get(slot) {
                        call.version.clone_from(&s.version);
                    }
                }
                Some(_) => {}
                None => all = false,
            }
        }
        all
    }

    /// Recreates a package of calls from the journal, detached, with its TTL armed.
    pub(super) fn on_restore_calls(
        &mut self,
        r: RestoredPackage,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let n = r.calls.len().min(self.config.max_tasks_per_package);
        let calls = &r.calls[..n];
        let (acknowledged, gone) = acknowledged_and_unneeded(calls, &r.delivered);
        let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (index, call) in (0u32..).zip(calls) {
            for &d in call.deps.iter().filter(|&&d| d < index) {
                let list = &mut dependents[d as usize];
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        let slot = self.create_package(
            r.package,
            r.user,
            None,
            super::calls::CALLS_HASH,
            Bytes::new(),
            r.opts,
            n as u32,
            now,
        );
        // Its class, waiting whatever its policy: its servers may not have reconnected yet.
        let class = self.restored_class(slot);
        self.set_class(slot, class);
        let mut ids = Vec::with_capacity(n);
        let (mut kept, mut bytes) = (0u32, 0u64);
        for ((index, spec), dependents) in (0u32..).zip(r.calls.into_iter().take(n)).zip(dependents)
        {
            if gone[index as usize] {
                ids.push(NO_TASK);
                continue;
            }
            let service = self.services.unserved_or_served(&spec.name, &spec.version);
            let deps: Vec<u32> = spec.deps.into_iter().filter(|&d| d < index).collect();
            let waiting = deps.len() as u32;
            let delivered = acknowledged[index as usize];
            let mut task = Task::new(slot, index, spec.args, now);
            task.call = Some(Box::new(Call {
                service,
                inputs: vec![Bytes::new(); deps.len()],
                deps,
                waiting,
                fetch: !delivered && (spec.fetch || dependents.is_empty()),
                dependents,
                sources: Vec::new(),
                remakes: super::lineage::NO_SOURCE,
            }));
            if waiting > 0 {
                task.state = TaskState::Waiting;
            }
            self.services.get_mut(service).expect("just found").calls += 1;
            kept += 1;
            bytes += task.args.len() as u64;
            let id = TaskId(self.tasks.insert(task));
            if waiting == 0 {
                self.enqueue(id, false);
            }
            ids.push(id);
        }
        self.user_takes(r.user, u64::from(kept), bytes);
        let p = self.packages.get_mut(slot).expect("just made");
        p.counts.done = n as u32 - kept;
        p.counts.queued = kept;
        p.tasks = ids;
        self.detach(slot, now);
        self.free_package_if_finished(slot, out);
        self.dispatch(now, out);
    }
}

/// Which calls were acknowledged, and which are gone for good: acknowledged, and no call that
/// runs again takes their result. Dependencies point to earlier calls, so one walk from the
/// last call back decides.
fn acknowledged_and_unneeded(calls: &[CallSpec], delivered: &[u32]) -> (Vec<bool>, Vec<bool>) {
    let n = calls.len();
    let mut acknowledged = vec![false; n];
    for &i in delivered {
        if let Some(a) = acknowledged.get_mut(i as usize) {
            *a = true;
        }
    }
    let mut needed = vec![false; n];
    let mut gone = vec![false; n];
    for i in (0..n).rev() {
        if acknowledged[i] && !needed[i] {
            gone[i] = true;
            continue;
        }
        for &d in &calls[i].deps {
            if (d as usize) < i {
                needed[d as usize] = true;
            }
        }
    }
    (acknowledged, gone)
}
