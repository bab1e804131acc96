//! [`ServiceTable`]: the registry of named functions (grid RPC) and who serves them.
//!
//! A service is one `(name, version)` with its interface blob, the connected workers that
//! serve it, and the queue of its calls that wait for a free server. An entry lives while a
//! worker serves it or a live call names it; calls hold it by slab key, so it is never freed
//! under them. Calls whose package asks for resources or labels queue apart, one
//! [`ClassCalls`] per resource class, with the servers of the function that also serve the
//! class (`core/calls/classes.rs` keeps those lists).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bytes::Bytes;

use crate::ids::{FnHash, Instant, WorkerId};
use crate::queue::ReadyQueue;
use crate::table::{IdMap, Map, Table};

/// One named function at one version.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) name: String,
    pub(crate) version: String,
    /// The interface blob of its first server (others must match it byte for byte).
    pub(crate) interface: Bytes,
    /// Key of its execution-time estimate: derived from name and version, so what was learned
    /// survives the service leaving and coming back.
    pub(crate) fn_hash: FnHash,
    /// Connected, non-draining workers that serve it, in joining order.
    pub(crate) servers: Vec<WorkerId>,
    /// Position of each server in `servers` (O(1) removal).
    positions: IdMap<WorkerId, usize>,
    /// Where the next placement starts looking (rotates, so ties go round robin).
    pub(crate) cursor: usize,
    /// Its calls that wait for a free server.
    pub(crate) queue: ReadyQueue,
    /// Live calls naming it (not done, not cancelled).
    pub(crate) calls: u64,
    /// When its queued calls fail if no server returns (armed while it has none).
    pub(crate) orphan_at: Option<Instant>,
    /// Its calls of packages that ask for resources or labels, by resource class (slab key):
    /// made when a call of that class is first submitted, kept while the class lives (so a
    /// steady stream of such calls never rebuilds its server list). Empty for the functions
    /// whose calls ask for nothing: their path does not look here.
    pub(crate) classes: BTreeMap<u64, ClassCalls>,
}

/// The calls of one service whose package asks for one request (a resource class): queued
/// apart from the service's other calls, for the servers of the service that can serve the
/// class. Placement looks at these servers only, from a rotating start, as for the others.
#[derive(Debug, Default)]
pub(crate) struct ClassCalls {
    /// Connected, non-draining workers that serve the function and can serve the class.
    pub(crate) servers: Vec<WorkerId>,
    positions: IdMap<WorkerId, usize>,
    /// Where the next placement starts looking.
    pub(crate) cursor: usize,
    /// Its calls that wait for a server with a credit and the request free.
    pub(crate) queue: ReadyQueue,
    /// When its queued calls of packages with the policy `error` fail if no server returns
    /// (armed when its last server leaves).
    pub(crate) orphan_at: Option<Instant>,
}

impl ClassCalls {
    /// Adds a server; false if it already is one.
    pub(crate) fn add_server(&mut self, worker: WorkerId) -> bool {
        add_server(&mut self.servers, &mut self.positions, worker)
    }

    /// Removes a server, O(1); false if it was not one.
    pub(crate) fn remove_server(&mut self, worker: WorkerId) -> bool {
        remove_server(&mut self.servers, &mut self.positions, worker)
    }
}

fn add_server(
    servers: &mut Vec<WorkerId>,
    positions: &mut IdMap<WorkerId, usize>,
    worker: WorkerId,
) -> bool {
    if positions.contains_key(&worker) {
        return false;
    }
    positions.insert(worker, servers.len());
    servers.push(worker);
    true
}

fn remove_server(
    servers: &mut Vec<WorkerId>,
    positions: &mut IdMap<WorkerId, usize>,
    worker: WorkerId,
) -> bool {
    let Some(pos) = positions.remove(&worker) else {
        return false;
    };
    servers.swap_remove(pos);
    if let Some(&moved) = servers.get(pos) {
        positions.insert(moved, pos);
    }
    true
}

impl Service {
    /// Adds a server; false if it already serves this.
    pub(crate) fn add_server(&mut self, worker: WorkerId) -> bool {
        add_server(&mut self.servers, &mut self.positions, worker)
    }

    /// Removes a server, O(1); false if it did not serve this.
    pub(crate) fn remove_server(&mut self, worker: WorkerId) -> bool {
        remove_server(&mut self.servers, &mut self.positions, worker)
    }

    /// The queue of its calls of resource class `class` (`None`: those that ask for nothing).
    pub(crate) fn queue_of(&mut self, class: Option<u64>) -> Option<&mut ReadyQueue> {
        match class {
            None => Some(&mut self.queue),
            Some(c) => self.classes.get_mut(&c).map(|cc| &mut cc.queue),
        }
    }

    /// Calls queued, in every queue of it.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len() + self.classes.values().map(|c| c.queue.len()).sum::<usize>()
    }

    /// Nothing refers to it any more, and its grace after its last server left is over.
    pub(crate) fn is_unused(&self) -> bool {
        self.servers.is_empty() && self.calls == 0 && self.orphan_at.is_none()
    }

    /// A call may name it: a worker serves it, or its last server left less than the
    /// service grace ago (a worker process replaced, a worker reconnecting), so calls wait
    /// for a server to return instead of being refused. An entry restored from the journal
    /// that no worker served yet (no interface) is not available.
    pub(crate) fn is_available(&self) -> bool {
        !self.servers.is_empty() || (self.orphan_at.is_some() && !self.interface.is_empty())
    }
}

/// What registering one `(name, version)` for a worker did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Registered {
    /// The worker serves it now (slab key).
    Served(u64),
    /// Another worker serves it with a different interface.
    Conflict,
}

/// The registry.
#[derive(Debug, Default)]
pub(crate) struct ServiceTable {
    table: Table<Service>,
    by_key: Map<(String, String), u64>,
    /// Versions of each name, by slab key (a handful per name).
    by_name: BTreeMap<String, Vec<u64>>,
}

impl ServiceTable {
    /// Entries (served, or named by live calls).
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get(&self, slot: u64) -> Option<&Service> {
        self.table.get(slot)
    }

    pub(crate) fn get_mut(&mut self, slot: u64) -> Option<&mut Service> {
        self.table.get_mut(slot)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Service)> {
        self.table.iter()
    }

    /// Registers `worker` as a server of `(name, version)`.
    pub(crate) fn register(
        &mut self,
        worker: WorkerId,
        name: &str,
        version: &str,
        interface: &Bytes,
    ) -> Registered {
        let key = (name.to_owned(), version.to_owned());
        if let Some(&slot) = self.by_key.get(&key) {
            let s = self.table.get_mut(slot).expect("indexed service");
            // A service no worker serves any more (only calls name it) takes the newcomer's
            // interface: nobody relies on the old one but calls checked against it, which
            // workers re-check.
            if s.interface != *interface {
                if !s.servers.is_empty() {
                    return Registered::Conflict;
                }
                s.interface = interface.clone();
            }
            s.add_server(worker);
            return Registered::Served(slot);
        }
        let mut s = Service {
            name: key.0.clone(),
            version: key.1.clone(),
            interface: interface.clone(),
            fn_hash: service_hash(name, version),
            servers: Vec::new(),
            positions: IdMap::default(),
            cursor: 0,
            queue: ReadyQueue::default(),
            calls: 0,
            orphan_at: None,
            classes: BTreeMap::new(),
        };
        s.add_server(worker);
        let slot = self.table.insert(s);
        self.by_name.entry(key.0.clone()).or_default().push(slot);
        self.by_key.insert(key, slot);
        Registered::Served(slot)
    }

    /// The entry of `(name, version)`, served or not, created unserved (its interface is
    /// taken from its first server) if there is none: for calls restored from the journal,
    /// which wait for a server. An empty `version` is the newest served one, if any.
    pub(crate) fn unserved_or_served(&mut self, name: &str, version: &str) -> u64 {
        if version.is_empty() {
            if let Some(slot) = self.resolve(name, version) {
                return slot;
            }
        }
        let key = (name.to_owned(), version.to_owned());
        if let Some(&slot) = self.by_key.get(&key) {
            return slot;
        }
        let slot = self.table.insert(Service {
            name: key.0.clone(),
            version: key.1.clone(),
            interface: Bytes::new(),
            fn_hash: service_hash(name, version),
            servers: Vec::new(),
            positions: IdMap::default(),
            cursor: 0,
            queue: ReadyQueue::default(),
            calls: 0,
            orphan_at: None,
            classes: BTreeMap::new(),
        });
        self.by_name.entry(key.0.clone()).or_default().push(slot);
        self.by_key.insert(key, slot);
        slot
    }

    /// Frees the entry if nothing refers to it.
    pub(crate) fn free_if_unused(&mut self, slot: u64) {
        if !self.table.get(slot).is_some_and(Service::is_unused) {
            return;
        }
        let s = self.table.remove(slot).expect("checked");
        self.by_key.remove(&(s.name.clone(), s.version.clone()));
        if let Some(versions) = self.by_name.get_mut(&s.name) {
            versions.retain(|&v| v != slot);
            if versions.is_empty() {
                self.by_name.remove(&s.name);
            }
        }
    }

    /// The available entry a call names ([`Service::is_available`]): that version, or, when
    /// `version` is empty, the newest served one, else the newest within its grace. Entries
    /// no worker serves (or served within the grace) do not count.
    pub(crate) fn resolve(&self, name: &str, version: &str) -> Option<u64> {
        let versions = self.by_name.get(name)?;
        versions
            .iter()
            .copied()
            .filter(|&slot| {
                let s = self.table.get(slot).expect("indexed service");
                s.is_available() && (version.is_empty() || s.version == version)
            })
            .max_by(|&a, &b| {
                let (a, b) = (
                    self.table.get(a).expect("live"),
                    self.table.get(b).expect("live"),
                );
                let served = (!a.servers.is_empty()).cmp(&!b.servers.is_empty());
                served.then_with(|| compare_versions(&a.version, &b.version))
            })
    }

    /// Slab keys of the available entries ([`Service::is_available`]), names sorted, served
    /// ones before those within their grace, then newest version first; one name's only
    /// when `name` is not empty.
    pub(crate) fn listed(&self, name: &str) -> Vec<u64> {
        let mut out = Vec::new();
        let names: Box<dyn Iterator<Item = (&String, &Vec<u64>)>> = if name.is_empty() {
            Box::new(self.by_name.iter())
        } else {
            Box::new(self.by_name.get_key_value(name).into_iter())
        };
        for (_, versions) in names {
            let mut served: Vec<u64> = versions
                .iter()
                .copied()
                .filter(|&s| self.table.get(s).expect("indexed").is_available())
                .collect();
            served.sort_by(|&a, &b| {
                let (a, b) = (
                    self.table.get(a).expect("live"),
                    self.table.get(b).expect("live"),
                );
                let served = (!b.servers.is_empty()).cmp(&!a.servers.is_empty());
                served.then_with(|| compare_versions(&b.version, &a.version))
            });
            out.extend(served);
        }
        out
    }

    /// What is served, for error messages: `add (2, 1), dmmul (1)`, or `nothing`.
    pub(crate) fn describe_served(&self) -> String {
        let mut parts = Vec::new();
        let mut last: Option<&str> = None;
        let mut versions: Vec<&str> = Vec::new();
        for slot in self.listed("") {
            let s = self.table.get(slot).expect("listed");
            if s.servers.is_empty() {
                continue; // within its grace: not served now
            }
            if last.is_some_and(|n| n != s.name) {
                parts.push(format!("{} ({})", last.unwrap_or(""), versions.join(", ")));
                versions.clear();
            }
            last = Some(&s.name);
            versions.push(if s.version.is_empty() {
                "\"\""
            } else {
                &s.version
            });
        }
        if let Some(n) = last {
            parts.push(format!("{n} ({})", versions.join(", ")));
        }
        if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// Orders versions as dot-separated parts, numerically where both parts are numbers
/// (`1.10 > 1.9 > 1`), as strings otherwise.
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    let mut pa = a.split('.');
    let mut pb = b.split('.');
    loop {
        match (pa.next(), pb.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n),
                    _ => x.cmp(y),
                };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

/// The estimate key of a service: FNV-1a over `rpc\0name\0version` with four seeds. Not a
/// code hash (nothing is verified against it); distinct from every SHA-256 of real code in
/// practice, and stable across restarts of the service.
pub(crate) fn service_hash(name: &str, version: &str) -> FnHash {
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in b"rpc\0"
            .iter()
            .chain(name.as_bytes())
            .chain(b"\0")
            .chain(version.as_bytes())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    FnHash(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically_by_part() {
        assert_eq!(compare_versions("1.10", "1.9"), Ordering::Greater);
        assert_eq!(compare_versions("2", "10"), Ordering::Less);
        assert_eq!(compare_versions("1.0", "1"), Ordering::Greater);
        assert_eq!(compare_versions("beta", "alpha"), Ordering::Greater);
        assert_eq!(compare_versions("3", "3"), Ordering::Equal);
    }

    #[test]
    fn resolve_picks_the_newest_served_version() {
        let mut t = ServiceTable::default();
        let iface = Bytes::from_static(b"i");
        let Registered::Served(v2) = t.register(WorkerId(1), "add", "2", &iface) else {
            panic!("registered");
        };
        let Registered::Served(v10) = t.register(WorkerId(2), "add", "10", &iface) else {
            panic!("registered");
        };
        assert_eq!(t.resolve("add", ""), Some(v10));
        assert_eq!(t.resolve("add", "2"), Some(v2));
        assert_eq!(t.resolve("add", "3"), None);
        assert_eq!(t.resolve("mul", ""), None);
        // Version 10's only server leaves: it no longer resolves, and goes when unused.
        assert!(t.get_mut(v10).unwrap().remove_server(WorkerId(2)));
        assert_eq!(t.resolve("add", ""), Some(v2));
        t.free_if_unused(v10);
        assert_eq!(t.len(), 1);
        assert_eq!(t.describe_served(), "add (2)");
    }

    #[test]
    fn a_different_interface_conflicts_while_served() {
        let mut t = ServiceTable::default();
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        let Registered::Served(slot) = t.register(WorkerId(1), "f", "1", &a) else {
            panic!("registered");
        };
        assert_eq!(t.register(WorkerId(2), "f", "1", &b), Registered::Conflict);
        assert_eq!(
            t.register(WorkerId(3), "f", "1", &a),
            Registered::Served(slot)
        );
        assert_eq!(t.get(slot).unwrap().servers, vec![WorkerId(1), WorkerId(3)]);
        assert!(t.get_mut(slot).unwrap().remove_server(WorkerId(1)));
        assert!(t.get_mut(slot).unwrap().remove_server(WorkerId(3)));
        // No server left: a newcomer's interface replaces the old one.
        assert_eq!(
            t.register(WorkerId(2), "f", "1", &b),
            Registered::Served(slot)
        );
        assert_eq!(t.get(slot).unwrap().interface, b);
    }

    #[test]
    fn listing_sorts_names_and_puts_newest_first() {
        let mut t = ServiceTable::default();
        let i = Bytes::new();
        t.register(WorkerId(1), "zeta", "1", &i);
        t.register(WorkerId(1), "add", "1", &i);
        t.register(WorkerId(1), "add", "2", &i);
        let names: Vec<(String, String)> = t
            .listed("")
            .into_iter()
            .map(|s| {
                let s = t.get(s).unwrap();
                (s.name.clone(), s.version.clone())
            })
            .collect();
        let expect = [("add", "2"), ("add", "1"), ("zeta", "1")];
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(names, expect);
        assert_eq!(t.listed("add").len(), 2);
        assert_eq!(t.describe_served(), "add (2, 1), zeta (1)");
        assert_ne!(service_hash("add", "1"), service_hash("add", "2"));
    }
}
