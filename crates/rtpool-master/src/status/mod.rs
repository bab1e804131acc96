//! The one status snapshot ([`Status`], `schema.rs`) and what feeds it: the scheduler task's
//! [`Recorder`] (`recorder.rs`, plain counters and [`histogram`]s updated as tasks pass) and
//! [`build`], which assembles a snapshot from the core's views and the recorder. The
//! scheduler builds one about once a second (when the HTTP listener or `CLUSTER_STATUS`
//! needs it); rendering it (JSON, msgpack, Prometheus text) is left to its readers:
//! [`crate::http`] on its own thread, [`to_msgpack`] for `CLUSTER_STATUS`.

pub mod histogram;
pub mod recorder;
pub mod schema;

use std::collections::{BTreeMap, HashMap};

use bytes::{Bytes, BytesMut};
use rtpool_core::{Core, PackageView, UserId};
use rtpool_proto::msgpack::Writer;

use self::histogram::FsyncCounts;
pub use self::recorder::Recorder;
pub use self::schema::Status;
use self::schema::{
    ClassStatus, Deadlines, JournalInfo, Latency, MasterInfo, PackageStatus, Rates,
    ResourceClassStatus, UserStatus, WorkerStatus, MAX_PACKAGES,
};

/// What a snapshot says about the master that the core and the recorder do not know.
#[derive(Debug, Clone, Default)]
pub struct MasterFacts {
    /// The main port's address.
    pub address: String,
    /// Real-time mode was asked for.
    pub realtime: bool,
    /// The journal's fsync policy (`always`, `batch:10`, `off`).
    pub fsync: String,
    /// The connection admission counters (refusals and evictions), when there is a listener.
    pub connection_refusals: Option<CountsSource>,
}

/// Counters by name read when a snapshot is built (the connection gate's refusals: a closure,
/// so that `status` does not depend on `connection`).
#[derive(Clone)]
pub struct CountsSource(pub std::sync::Arc<dyn Fn() -> BTreeMap<&'static str, u64> + Send + Sync>);

impl std::fmt::Debug for CountsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CountsSource").field(&(self.0)()).finish()
    }
}

/// Whether a reader wants a fresh snapshot: the HTTP listener says so on each request that
/// reads one (and for as long as an event stream is open), the scheduler's status tick builds
/// one only then. A snapshot is O(workers + packages) to build and to render: with 10,000
/// workers, building and rendering one a second that nobody read was about a tenth of an idle
/// master's CPU (issue 25).
#[derive(Debug, Default)]
pub struct Demand {
    wanted: std::sync::atomic::AtomicBool,
}

impl Demand {
    /// A reader wants the next snapshot.
    pub fn want(&self) {
        self.wanted
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a reader asked since the last call (and forget it).
    pub fn take(&self) -> bool {
        self.wanted
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Assembles a snapshot. O(packages + workers + users); `journal` is the journal's part, if
/// there is one (with its fsync histogram); `core_now` the core's clock now (for the time left to deadlines).
pub fn build(
    core: &Core,
    recorder: &Recorder,
    user_names: &[String],
    facts: &MasterFacts,
    journal: Option<(JournalInfo, &FsyncCounts)>,
    core_now: rtpool_core::Instant,
) -> Status {
    let (journal, fsync) = journal.map_or((None, None), |(j, f)| (Some(j), Some(f)));
    let now = std::time::Instant::now();
    let stats = core.stats();
    let overload = core.overload(core_now);
    let name = |u: UserId| user_names.get(u.0 as usize).cloned().unwrap_or_default();
    let window = recorder.window_start();
    let window_s = window.map_or(0.0, |s| now.duration_since(s.at).as_secs_f64());
    let per_s = |delta: u64| {
        if window_s > 0.5 {
            delta as f64 / window_s
        } else {
            0.0
        }
    };
    let mut totals: BTreeMap<&'static str, u64> = stats.iter().collect();
    let (mut slots, mut credits) = (0u64, 0u64);
    let mut workers: Vec<WorkerStatus> = core
        .worker_views()
        .map(|w| {
            slots += u64::from(w.slots);
            credits += u64::from(w.credits);
            let rec = recorder.workers.get(&w.id.0);
            let done = rec.map_or(0, |r| r.done);
            let before = window.and_then(|s| s.worker_done.get(&w.id.0)).copied();
            WorkerStatus {
                id: w.id.0,
                name: rec.map(|r| r.name.clone()).unwrap_or_default(),
                identity: rec.map(|r| r.identity.clone()).unwrap_or_default(),
                host: rec.map(|r| r.host.clone()).unwrap_or_default(),
                slots: w.slots,
                running: w.in_flight,
                credits: w.credits,
                draining: w.draining,
                done,
                exec_s: rec.map_or(0.0, |r| r.exec_us as f64 / 1e6),
                // A worker missing from the window's first sample joined within the window:
                // all it did counts (before, its rate read 0 for its first ~10 s).
                tasks_per_s: per_s(done.saturating_sub(before.unwrap_or(0))),
                last_seen_s: rec.map_or(0.0, |r| {
                    core_now.0.saturating_sub(r.last_seen.0) as f64 / 1e9
                }),
                resources: amounts(&w.resources),
                in_use: amounts(&w.in_use),
                labels: named(&w.labels),
            }
        })
        .collect();
    workers.sort_unstable_by_key(|w| w.id);
    totals.insert("slots", slots);
    totals.insert("credits", credits);
    totals.insert("done", recorder.done);
    totals.insert("failed", recorder.failed);
    totals.insert("worker_frames_in", recorder.worker_frames_in);
    totals.insert("worker_frames_out", recorder.worker_frames_out);
    // What results hold (issue 29: a growth of the master's memory has a name).
    let held = core.result_bytes_held();
    totals.insert("result_bytes", held.held);
    totals.insert("unacked_bytes", held.unacked);
    let mut users: HashMap<UserId, UserStatus> = HashMap::new();
    let mut classes: HashMap<(UserId, i32), ClassStatus> = HashMap::new();
    // Cheap copies first; names and the package rows only for the listed ones, so a master
    // with many small packages pays O(packages) integer work here, not string copies.
    let mut views: Vec<PackageView> = core
        .package_views()
        .inspect(|p| {
            let u = users.entry(p.user).or_insert_with(|| UserStatus {
                user: name(p.user),
                ..UserStatus::default()
            });
            u.packages += 1;
            u.queued += u64::from(p.counts.queued);
            u.running += u64::from(p.counts.running);
            let c = classes.entry((p.user, p.priority)).or_default();
            c.queued += u64::from(p.counts.queued);
            c.running += u64::from(p.counts.running);
        })
        .collect();
    let packages_omitted = views.len().saturating_sub(MAX_PACKAGES);
    if packages_omitted > 0 {
        views.select_nth_unstable_by_key(MAX_PACKAGES - 1, |p| std::cmp::Reverse(p.id));
        views.truncate(MAX_PACKAGES);
    }
    views.sort_unstable_by_key(|p| std::cmp::Reverse(p.id));
    let packages: Vec<PackageStatus> = views
        .iter()
        .map(|p| PackageStatus {
            id: p.id.0,
            user: users
                .get(&p.user)
                .map(|u| u.user.clone())
                .unwrap_or_default(),
            tasks: p.counts.total,
            queued: p.counts.queued,
            running: p.counts.running,
            done: p.counts.done,
            failed: recorder.failed_of(p.id),
            cancelled: p.counts.cancelled,
            priority: p.priority,
            deadline_in_s: p.deadline.map(|d| (d.0 as f64 - core_now.0 as f64) / 1e9),
            met: p.counts.met,
            missed: p.counts.missed,
        })
        .collect();
    for c in &recorder.classes {
        let u = users.entry(c.user).or_insert_with(|| UserStatus {
            user: name(c.user),
            ..UserStatus::default()
        });
        u.done += c.done;
        u.used_s += c.exec_us as f64 / 1e6;
        classes.entry((c.user, c.priority)).or_default().done = c.done;
    }
    for (id, (quota_us, used_us)) in &recorder.stored {
        let u = users.entry(*id).or_insert_with(|| UserStatus {
            user: name(*id),
            ..UserStatus::default()
        });
        u.quota_s = quota_us.map(|q| q as f64 / 1e6);
        u.used_s = *used_us as f64 / 1e6;
    }
    let mut classes: Vec<ClassStatus> = classes
        .into_iter()
        .map(|((user, priority), c)| ClassStatus {
            user: name(user),
            priority,
            ..c
        })
        .collect();
    classes.sort_unstable_by(|a, b| (&a.user, a.priority).cmp(&(&b.user, b.priority)));
    let mut histograms = BTreeMap::new();
    histograms.insert(
        "submit_to_assign_seconds",
        recorder.submit_to_assign_buckets.to_status(),
    );
    histograms.insert(
        "assign_to_result_seconds",
        recorder.assign_to_result_buckets.to_status(),
    );
    histograms.insert("deadline_lateness_seconds", recorder.lateness.to_status());
    if let Some(fsync) = fsync {
        histograms.insert("journal_fsync_seconds", fsync.to_status());
    }
    let mut users: Vec<UserStatus> = users.into_values().collect();
    users.sort_unstable_by(|a, b| a.user.cmp(&b.user));
    let counters = stats.counters;
    let mut connections = BTreeMap::new();
    connections.insert("client", stats.clients as u64);
    connections.insert("worker", stats.workers as u64);
    Status {
        master: MasterInfo {
            address: facts.address.clone(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION"),
            uptime_s: now.duration_since(recorder.started).as_secs_f64(),
            time_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            journal,
            realtime: facts.realtime,
            metrics: recorder.enabled,
        },
        totals,
        rates: Rates {
            tasks_per_s: per_s(recorder.done - window.map_or(recorder.done, |s| s.done)),
            window_s,
        },
        latency: Latency {
            submit_to_assign: recorder
                .submit_to_assign
                .percentiles_since(window.map(|s| &s.submit_to_assign)),
            assign_to_result: recorder
                .assign_to_result
                .percentiles_since(window.map(|s| &s.assign_to_result)),
        },
        deadlines: Deadlines {
            met: counters.deadlines_met,
            missed: counters.deadlines_missed,
            dropped: counters.deadline_dropped,
            lateness: recorder.lateness.to_buckets(),
            overloaded: overload.overloaded,
            overloaded_s: overload
                .since
                .map_or(0.0, |t| core_now.micros_since(t) as f64 / 1e6),
            window_met: overload.met,
            window_missed: overload.missed,
            window_miss_ratio: overload.miss_ratio,
        },
        workers,
        packages,
        packages_omitted,
        users,
        refusals: recorder.refusals.clone(),
        connection_refusals: facts
            .connection_refusals
            .as_ref()
            .map(|read| (read.0)())
            .unwrap_or_default(),
        connections,
        classes,
        resource_classes: resource_classes(core),
        histograms,
        // Filled in by `crate::ha` around the scheduler's snapshots.
        ha: None,
    }
}

/// The part of `status` a user who is not the operator may see: everything about the master
/// and the workers, but only its own packages and its own row of `users`.
pub fn for_user(status: &Status, user: &str) -> Status {
    let mut mine = status.clone();
    mine.packages.retain(|p| p.user == user);
    mine.packages_omitted = 0;
    mine.users.retain(|u| u.user == user);
    mine
}

/// The snapshot as one msgpack map (the `status` field of `CLUSTER_STATUS_REPLY`).
pub fn to_msgpack(status: &Status) -> Bytes {
    let value = serde_json::to_value(status).unwrap_or(serde_json::Value::Null);
    let mut out = BytesMut::with_capacity(1024);
    write_value(&mut Writer(&mut out), &value);
    out.freeze()
}

fn write_value(w: &mut Writer<'_, BytesMut>, value: &serde_json::Value) {
    use serde_json::Value as V;
    match value {
        V::Null => w.nil(),
        V::Bool(b) => w.bool(*b),
        V::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => w.uint(u),
            (None, Some(i), _) => w.sint(i),
            (_, _, f) => w.f64(f.unwrap_or(0.0)),
        },
        V::String(s) => w.str(s),
        V::Array(items) => {
            w.array(items.len());
            items.iter().for_each(|v| write_value(w, v));
        }
        V::Object(map) => {
            w.map(map.len());
            for (k, v) in map {
                w.str(k);
                write_value(w, v);
            }
        }
    }
}

/// A resource map as the status shows it.
fn amounts(r: &rtpool_core::Resources) -> BTreeMap<String, u64> {
    r.iter().map(|(n, a)| (n.to_owned(), a)).collect()
}

/// A label map as the status shows it.
fn named(l: &rtpool_core::Labels) -> BTreeMap<String, String> {
    l.iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The resource classes, by name.
fn resource_classes(core: &Core) -> Vec<ResourceClassStatus> {
    let mut classes: Vec<ResourceClassStatus> = core
        .class_views()
        .map(|c| ResourceClassStatus {
            name: c.name,
            resources: amounts(&c.resources),
            labels: named(&c.labels),
            queued: c.queued as u64,
            running: c.running,
            workers: c.workers as u64,
            unschedulable: c.unschedulable,
        })
        .collect();
    classes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    classes
}

#[cfg(test)]
mod tests {
    use super::schema::{PackageStatus, UserStatus};
    use super::*;

    fn two_users() -> Status {
        let mut s = Status::default();
        for (id, user) in [(1, "alice"), (2, "bob"), (3, "alice")] {
            s.packages.push(PackageStatus {
                id,
                user: user.into(),
                ..PackageStatus::default()
            });
        }
        for user in ["alice", "bob"] {
            s.users.push(UserStatus {
                user: user.into(),
                ..UserStatus::default()
            });
        }
        s.packages_omitted = 9;
        s.totals.insert("queued", 4);
        s
    }

    #[test]
    fn a_user_sees_only_its_own_packages_and_user_row_but_all_totals() {
        let mine = for_user(&two_users(), "alice");
        let ids: Vec<u64> = mine.packages.iter().map(|p| p.id).collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(mine.users.len(), 1);
        assert_eq!(mine.users[0].user, "alice");
        assert_eq!(mine.packages_omitted, 0);
        assert_eq!(mine.totals.get("queued"), Some(&4));
    }

    #[test]
    fn a_snapshot_lists_the_newest_packages_and_counts_every_one() {
        use rtpool_core::{ClientId, Event, FnHash, PackageId, PackageOpts};
        let mut core = Core::default();
        let mut out = Vec::new();
        let now = rtpool_core::Instant(0);
        let client = ClientId(1);
        core.handle(
            Event::ClientJoined {
                client,
                user: UserId(0),
            },
            now,
            &mut out,
        );
        let n = MAX_PACKAGES as u64 + 5;
        for id in 1..=n {
            let event = Event::Submit {
                client,
                req_id: id,
                package: PackageId(id),
                fn_hash: FnHash([7; 32]),
                fn_code: Bytes::from_static(b"code"),
                opts: PackageOpts {
                    priority: (id % 2) as i32,
                    ..PackageOpts::default()
                },
                tasks: vec![Bytes::new(); 2],
            };
            core.handle(event, now, &mut out);
        }
        let names = vec!["alice".to_owned()];
        let status = build(
            &core,
            &Recorder::new(true),
            &names,
            &MasterFacts::default(),
            None,
            now,
        );
        assert_eq!(status.packages.len(), MAX_PACKAGES);
        assert_eq!(status.packages_omitted, 5);
        assert_eq!(status.packages[0].id, n);
        assert_eq!(status.packages[MAX_PACKAGES - 1].id, 6);
        assert_eq!(status.packages[0].user, "alice");
        // Users and classes count every package, listed or not.
        assert_eq!(status.users[0].packages, n as usize);
        assert_eq!(status.users[0].queued, 2 * n);
        let queued: Vec<(i32, u64)> = status
            .classes
            .iter()
            .map(|c| (c.priority, c.queued))
            .collect();
        assert_eq!(queued, vec![(0, 2 * (n / 2)), (1, 2 * (n - n / 2))]);
        assert_eq!(status.totals.get("queued"), Some(&(2 * n)));
    }

    #[test]
    fn the_msgpack_form_has_the_json_keys_and_values() {
        let bytes = to_msgpack(&two_users());
        let json = serde_json::to_value(two_users()).unwrap();
        // Top level: a map with as many entries as the JSON object (keys in sorted order).
        let top = json.as_object().unwrap().len();
        assert_eq!(bytes[0], 0x80 | top as u8, "a fixmap of {top} entries");
        assert_eq!(&bytes[1..9], b"\xa7classes");
        let text = String::from_utf8_lossy(&bytes);
        for key in [
            "totals",
            "packages_omitted",
            "users",
            "histograms",
            "alice",
            "bob",
        ] {
            assert!(text.contains(key), "{key} missing");
        }
    }
}
