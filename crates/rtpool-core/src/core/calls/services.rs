//! The registry of named functions: the services a worker declares it serves (and stops
//! serving), a registry request answered, and a service freed once nothing uses it.

use crate::core::{Core, Timer};
use crate::event::{Action, ServiceDecl, ServiceInfo};
use crate::ids::{ClientId, Instant, WorkerId};
use crate::service::Registered;

impl Core {
    /// Registers the functions a worker serves; each one another worker serves with a different
    /// interface is refused. Then dispatches (calls may have waited for this worker).
    pub(in crate::core) fn on_serve(
        &mut self,
        worker: WorkerId,
        functions: Vec<ServiceDecl>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        match self.workers.get(&worker) {
            Some(w) if !w.draining => {}
            _ => return,
        }
        for f in functions {
            match self
                .services
                .register(worker, &f.name, &f.version, &f.interface)
            {
                Registered::Served(slot) => {
                    let w = self.workers.get_mut(&worker).expect("checked above");
                    if !w.serves.contains(&slot) {
                        w.serves.push(slot);
                    }
                    let s = self.services.get_mut(slot).expect("just registered");
                    if let Some(at) = s.orphan_at.take() {
                        self.timers.remove(&(at, Timer::Service(slot)));
                    }
                    if !s.classes.is_empty() {
                        self.serve_class_calls(worker, slot);
                    }
                }
                Registered::Conflict => out.push(Action::ServeRefused {
                    worker,
                    name: f.name,
                    version: f.version,
                }),
            }
        }
        self.dispatch(now, out);
    }

    /// The worker serves nothing any more (lost, or draining). A service left without a
    /// server stays for the grace period (`service_grace_ns`), with its queued calls, and new
    /// calls may still name it: they wait for a server to return (a worker process replaced,
    /// a worker reconnecting) instead of being refused. The grace timer fails what waits and
    /// frees the entry.
    pub(in crate::core) fn unserve(&mut self, worker: WorkerId, serves: &[u64], now: Instant) {
        let grace = self.config.service_grace_ns;
        for &slot in serves {
            if let Some(s) = self.services.get_mut(slot) {
                s.remove_server(worker);
                if s.servers.is_empty() && s.orphan_at.is_none() && grace > 0 {
                    let at = Instant(now.0.saturating_add(grace));
                    s.orphan_at = Some(at);
                    self.timers.insert((at, Timer::Service(slot)), ());
                }
                if !s.classes.is_empty() {
                    self.unserve_class_calls(worker, slot, now);
                }
            }
            self.free_service_if_unused(slot);
        }
    }

    /// Frees a service nothing refers to any more, with its grace timer.
    pub(super) fn free_service_if_unused(&mut self, slot: u64) {
        let Some(s) = self.services.get(slot).filter(|s| s.is_unused()) else {
            return;
        };
        if let Some(at) = s.orphan_at {
            self.timers.remove(&(at, Timer::Service(slot)));
        }
        for (&class, cc) in &s.classes {
            if let Some(at) = cc.orphan_at {
                self.timers.remove(&(at, Timer::Calls(slot, class)));
            }
        }
        self.services.free_if_unused(slot);
    }

    /// Answers a registry request.
    pub(in crate::core) fn on_functions(
        &mut self,
        client: ClientId,
        req_id: u64,
        name: &str,
        out: &mut Vec<Action>,
    ) {
        let functions = self
            .services
            .listed(name)
            .into_iter()
            .map(|slot| {
                let s = self.services.get(slot).expect("listed");
                ServiceInfo {
                    name: s.name.clone(),
                    version: s.version.clone(),
                    servers: s.servers.len().min(u32::MAX as usize) as u32,
                    interface: s.interface.clone(),
                }
            })
            .collect();
        out.push(Action::FunctionsReply {
            client,
            req_id,
            functions,
        });
    }

    /// A call of `service` is gone: the service is freed if nothing else uses it.
    pub(in crate::core) fn service_call_ended(&mut self, service: u64) {
        if let Some(s) = self.services.get_mut(service) {
            s.calls -= 1;
        }
        self.free_service_if_unused(service);
    }
}
