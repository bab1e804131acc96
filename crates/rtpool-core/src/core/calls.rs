//! Named functions (grid RPC): the registry of who serves what, packages of calls, their data
//! dependencies, and placement of calls on the workers that serve them.
//!
//! A call is a task of a package submitted with `SubmitCalls`: it names a service instead of
//! carrying code. A call whose inputs (results of earlier calls of its package) do not all
//! exist yet is `Waiting`, in no queue; it is queued in its service's queue when the last one
//! arrives, and fails (status 3, naming the call that failed) when one of them fails. Queued
//! calls are placed on the serving worker with a free credit that has the lowest estimated
//! completion time (`crate::placement`), before shipped-code tasks are dispatched.
//!
//! A package of calls may ask for resources or labels as a package of tasks does: its calls
//! then run only on servers of their function that can serve its resource class, holding the
//! request while they run ([`classes`]).
//!
//! This file holds the submission of a package of calls; [`services`] the registry, [`dispatch`]
//! the placement of queued calls on servers, [`classes`] the calls that ask for resources or
//! labels, [`dependents`] what a decided call passes on.

mod classes;
mod dependents;
mod dispatch;
mod services;

use bytes::Bytes;

use super::Core;
use crate::event::{Action, CallSpec, PackageOpts, RejectReason};
use crate::ids::{ClientId, FnHash, Instant, PackageId, TaskId};
use crate::task::{Call, Task, TaskState};

/// The function hash of every call package: calls carry no code. (The shell verifies every
/// code hash as the SHA-256 of its code, so no code can claim it.) The journal records a call
/// package under it.
pub const CALLS_HASH: FnHash = FnHash(*b"rtpool calls: no code, no hash!!");

/// Most inputs one call may take.
const MAX_DEPS: usize = 1024;

impl Core {
    /// Creates a package of calls, resolving each call's function and version, then
    /// dispatches. Refused: options calls do not support, a function (or version) no worker
    /// serves, a dependency that is not an earlier call, a request of resources or labels no
    /// server of a called function can serve (policy `error`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_submit_calls(
        &mut self,
        client: ClientId,
        req_id: u64,
        package: PackageId,
        opts: PackageOpts,
        calls: Vec<CallSpec>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let user = self.clients.entry(client).or_default().user;
        if !opts.key.is_empty() {
            if let Some(&existing) = self.keys.get(&(user, opts.key.clone())) {
                let slot = self.package_slots[&existing];
                out.push(Action::Accepted {
                    client,
                    req_id,
                    package: existing,
                });
                self.attach(client, slot, out);
                return;
            }
        }
        let bytes: u64 = calls.iter().map(|c| c.args.len() as u64).sum();
        let checked = self.check_size(calls.len()).and_then(|total| {
            Self::check_call_options(&opts)?;
            self.check_quota(user)?;
            self.check_user_bounds(user, u64::from(total), bytes)?;
            let services = self.resolve_calls(&calls)?;
            let class = self.class_for(&opts)?;
            if let Some(class) = class {
                if let Err(reason) = self.check_call_class(class, &services, opts.unschedulable) {
                    // A class made for this package alone goes with it.
                    self.forget_class_if_unused(class);
                    return Err(reason);
                }
            }
            Ok((total, services, class))
        });
        let (total, services, class) = match checked {
            Ok(ok) => ok,
            Err(reason) => {
                out.push(Action::Rejected {
                    client,
                    req_id,
                    reason,
                });
                return;
            }
        };
        let slot = self.create_package(
            package,
            user,
            Some(client),
            CALLS_HASH,
            Bytes::new(),
            opts,
            total,
            now,
        );
        self.user_takes(user, u64::from(total), bytes);
        self.set_class(slot, class);
        self.create_calls(slot, calls, &services, now);
        out.push(Action::Accepted {
            client,
            req_id,
            package,
        });
        self.dispatch(now, out);
    }

    /// Refuses the options that make no sense for calls (copies, admission, dropping).
    fn check_call_options(opts: &PackageOpts) -> Result<(), RejectReason> {
        let refused = [
            (opts.replicas > 1, "replicas"),
            (opts.quorum > 1, "quorum"),
            (opts.max_copies > 0, "max_copies"),
            (opts.hedge, "hedge"),
            (opts.admit, "admit"),
            (opts.on_miss == crate::MissPolicy::Drop, "on_miss = drop"),
        ];
        if let Some((_, name)) = refused.iter().find(|(set, _)| *set) {
            return Err(RejectReason::InvalidOptions(format!(
                "{name} is for shipped-code tasks; calls of named functions do not support it"
            )));
        }
        Self::check_options(opts)
    }

    /// The service of each call, and the check of its dependencies.
    fn resolve_calls(&self, calls: &[CallSpec]) -> Result<Vec<u64>, RejectReason> {
        let mut services = Vec::with_capacity(calls.len());
        for (index, call) in (0u32..).zip(calls) {
            let Some(slot) = self.services.resolve(&call.name, &call.version) else {
                let what = if call.version.is_empty() {
                    format!("'{}'", call.name)
                } else {
                    format!("'{}' version {}", call.name, call.version)
                };
                return Err(RejectReason::UnknownFunction {
                    what,
                    served: self.services.describe_served(),
                });
            };
            if call.deps.len() > MAX_DEPS {
                return Err(RejectReason::InvalidCall {
                    index,
                    reason: format!("{} inputs, at most {MAX_DEPS}", call.deps.len()),
                });
            }
            if let Some(&d) = call.deps.iter().find(|&&d| d >= index) {
                return Err(RejectReason::InvalidCall {
                    index,
                    reason: format!(
                        "it depends on call #{d}, which is not an earlier call of the package"
                    ),
                });
            }
            services.push(slot);
        }
        Ok(services)
    }

    /// Inserts the calls of the package in `slot`: those without inputs are queued, the others
    /// wait for them.
    fn create_calls(&mut self, slot: u64, calls: Vec<CallSpec>, services: &[u64], now: Instant) {
        let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); calls.len()];
        for (index, call) in (0u32..).zip(&calls) {
            for &d in &call.deps {
                let list = &mut dependents[d as usize];
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        let mut ids = Vec::with_capacity(calls.len());
        for ((index, spec), (&service, dependents)) in
            (0u32..).zip(calls).zip(services.iter().zip(dependents))
        {
            let waiting = spec.deps.len() as u32;
            let mut task = Task::new(slot, index, spec.args, now);
            task.call = Some(Box::new(Call {
                service,
                inputs: vec![Bytes::new(); spec.deps.len()],
                deps: spec.deps,
                waiting,
                fetch: spec.fetch || dependents.is_empty(),
                dependents,
                sources: Vec::new(),
                remakes: super::lineage::NO_SOURCE,
            }));
            if waiting > 0 {
                task.state = TaskState::Waiting;
            }
            self.services.get_mut(service).expect("resolved").calls += 1;
            let id = TaskId(self.tasks.insert(task));
            if waiting == 0 {
                self.enqueue(id, false);
            }
            ids.push(id);
        }
        self.packages.get_mut(slot).expect("just made").tasks = ids;
    }

    /// The live task of call `index` of the package, if any.
    pub(super) fn call_id(&self, slot: u64, index: u32) -> Option<TaskId> {
        let id = *self.packages.get(slot)?.tasks.get(index as usize)?;
        self.tasks.get(id.0).map(|_| id)
    }
}
