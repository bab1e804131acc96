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
use crate::ids::{Instant, PackageId, TaskId};
use crate::task::{Call, Task, TaskState};

impl Core {
    /// The version each call of a live package of calls was resolved to, by index (the
    /// journal records it so the restored calls name what they ran on); `None` if the package
    /// is not a live package of calls. A call no longer live reads as `""`.
    pub fn call_versions(&self, package: PackageId) -> Option<Vec<String>> {
        let slot = *self.package_slots.get(&package)?;
        let p = self.packages.get(slot).filter(|p| p.calls)?;
        let versions = (0u32..)
            .zip(&p.tasks)
            .map(|(index, id)| {
                self.tasks
                    .get(id.0)
                    .filter(|t| t.package == slot && t.index == index)
                    .and_then(|t| t.call.as_ref())
                    .and_then(|c| self.services.get(c.service))
                    .map_or_else(String::new, |s| s.version.clone())
            })
            .collect();
        Some(versions)
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
