//! Scenario tests of the whole journal: replay, torn tails, corruption, compaction, fsync
//! policies and fatal errors, against real files in temporary directories.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::frame;
use super::*;

/// A config for `<dir>/journal.log` whose fatal handler counts calls instead of exiting.
fn config(dir: &Path, policy: FsyncPolicy) -> (JournalConfig, Arc<AtomicUsize>) {
    let fatals = Arc::new(AtomicUsize::new(0));
    let counter = fatals.clone();
    let mut cfg = JournalConfig::new(dir.join("journal.log"));
    cfg.policy = policy;
    cfg.on_fatal = Arc::new(move |err| {
        eprintln!("test journal fatal: {err}");
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (cfg, fatals)
}

fn open(dir: &Path, policy: FsyncPolicy) -> (Journal, Replay) {
    Journal::open(config(dir, policy).0).expect("open journal")
}

pub(super) fn package(id: u64, user: &str, tasks: usize) -> Record {
    Record::Package(PackageRecord {
        package: id,
        user: user.to_owned(),
        fn_hash: [id as u8; 32],
        fn_code: Bytes::from(format!("code of {id}")),
        tasks: (0..tasks).map(|i| Bytes::from(vec![i as u8; i])).collect(),
        opts: rtpool_core::PackageOpts {
            labels: Default::default(),
            resources: Default::default(),
            unschedulable: Default::default(),
            key: format!("k{id}"),
            priority: id as i32 % 5 - 2,
            timeout_ms: 1000 + id as u32,
            deadline_ms: (id as u32 % 3) * 100,
            on_miss: if id % 2 == 1 {
                rtpool_core::MissPolicy::Drop
            } else {
                rtpool_core::MissPolicy::Run
            },
            admit: id % 3 == 1,
            replicas: (id % 4) as u8,
            quorum: (id % 3) as u8,
            max_copies: (id % 5) as u8,
            hedge: id % 2 == 1,
            max_attempts: (id % 4) as u32,
            near: 0,
            after: 0,
            after_index: 0,
        },
    })
}

pub(super) fn done(package: u64, index: u32, exec_us: u64) -> Record {
    Record::Done(DoneRecord {
        package,
        index,
        status: (index % 3) as u8,
        data: Bytes::from(format!("result {package}/{index}")),
        exec_us,
        late_us: u64::from(index % 2) * exec_us,
    })
}

/// Waits, at most `timeout`, until the durable LSN reaches `lsn`; returns whether it did.
pub(super) fn wait_durable(journal: &Journal, lsn: u64, timeout: Duration) -> bool {
    let mut rx = journal.durable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(timeout, rx.wait_for(|d| *d >= lsn))
            .await
            .is_ok_and(|r| r.is_ok())
    })
}

/// What replaying `records` (with LSNs 1, 2, ...) must give: packages, next_package, charges.
/// Written independently of `replay.rs`, as plainly as possible.
fn expected(records: &[Record]) -> (Vec<ReplayedPackage>, u64, Vec<(String, u64, u64)>) {
    let mut live: BTreeMap<u64, (u64, ReplayedPackage)> = BTreeMap::new();
    let mut users = BTreeMap::new();
    let mut next_package = 0;
    let mut charges = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        let lsn = i as u64 + 1;
        match rec {
            Record::Package(p) => {
                next_package = next_package.max(p.package + 1);
                users.insert(p.package, p.user.clone());
                let fresh = ReplayedPackage {
                    record: p.clone(),
                    done: vec![],
                    delivered: vec![],
                };
                live.insert(p.package, (lsn, fresh));
            }
            Record::Done(d) => {
                if let Some(user) = users.get(&d.package) {
                    charges.push((user.clone(), d.exec_us, lsn));
                }
                if let Some((_, p)) = live.get_mut(&d.package) {
                    if !p.delivered.contains(&d.index) {
                        p.done.push(d.clone());
                    }
                }
            }
            Record::Delivered { package, indices } => {
                if let Some((_, p)) = live.get_mut(package) {
                    let all: BTreeSet<u32> = p.delivered.iter().chain(indices).copied().collect();
                    p.delivered = all.into_iter().collect();
                    let delivered = p.delivered.clone();
                    p.done.retain(|d| !delivered.contains(&d.index));
                }
            }
            Record::End { package } => {
                live.remove(package);
            }
            Record::Charge { user, exec_us } => charges.push((user.clone(), *exec_us, lsn)),
        }
    }
    // In the order the packages were accepted (their `Package` record's LSN).
    let mut live: Vec<(u64, ReplayedPackage)> = live.into_values().collect();
    live.sort_by_key(|(lsn, _)| *lsn);
    (
        live.into_iter().map(|(_, p)| p).collect(),
        next_package,
        charges,
    )
}

/// A scenario with every record type, ended and live packages, partial deliveries.
pub(super) fn scenario() -> Vec<Record> {
    vec![
        package(1, "alice", 3),
        package(2, "bob", 2),
        done(1, 0, 10),
        done(2, 1, 20),
        done(1, 2, 30),
        Record::Delivered {
            package: 1,
            indices: vec![0],
        },
        package(7, "carol", 1),
        done(2, 0, 40),
        Record::Delivered {
            package: 2,
            indices: vec![0, 1],
        },
        Record::End { package: 2 },
        Record::Charge {
            user: "dave".into(),
            exec_us: 50,
        },
        done(7, 0, 60),
        package(3, "alice", 0),
        Record::End { package: 3 },
    ]
}

pub(super) fn append_all(journal: &Journal, records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| journal.append(r.clone())).collect()
}

/// Offsets of the frames in `path`, in file order (meta record first).
fn frame_offsets(path: &Path) -> Vec<usize> {
    let buf = std::fs::read(path).unwrap();
    let mut offsets = vec![];
    let mut off = 0;
    while off < buf.len() {
        offsets.push(off);
        off = frame::check(&buf, off).expect("whole frame").end;
    }
    offsets
}

pub(super) fn assert_replay_matches(replay: &Replay, records: &[Record]) {
    let (packages, next_package, charges) = expected(records);
    assert_eq!(replay.packages, packages);
    assert_eq!(replay.next_package, next_package);
    assert_eq!(replay.charges, charges);
}

#[test]
fn fsync_policy_parses_and_displays() {
    let ms = Duration::from_millis;
    let cases = [
        ("always", FsyncPolicy::Always),
        ("off", FsyncPolicy::Off),
        ("batch", FsyncPolicy::Batch { window: ms(10) }),
        ("batch:250", FsyncPolicy::Batch { window: ms(250) }),
    ];
    for (text, policy) in cases {
        assert_eq!(text.parse::<FsyncPolicy>().unwrap(), policy);
        assert_eq!(policy.to_string().parse::<FsyncPolicy>().unwrap(), policy);
    }
    assert_eq!(FsyncPolicy::default().to_string(), "batch:10");
    for bad in [
        "",
        "Always",
        "batch:",
        "batch:0",
        "batch:-1",
        "batch:x",
        "sometimes",
    ] {
        let err = bad.parse::<FsyncPolicy>().unwrap_err();
        assert!(matches!(err, JournalError::BadPolicy { ref text } if text == bad));
    }
}

#[test]
fn a_missing_file_is_an_empty_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, replay) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(
        (
            replay.packages.len(),
            replay.next_package,
            replay.last_lsn,
            replay.records
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(replay.truncated_tail, None);
    journal.close().unwrap();
    // The file now exists with its meta record only.
    assert_eq!(frame_offsets(&dir.path().join("journal.log")).len(), 1);
    let (_, again) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!((again.records, again.last_lsn), (0, 0));
}

#[test]
fn a_retired_version_1_file_is_refused_with_how_to_upgrade_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.log");
    let mut buf = Vec::new();
    let meta = record::Entry::Meta {
        version: 1,
        next_package: 5,
        last_lsn: 1,
    };
    frame::put_with(&mut buf, 0, |b| b.extend(record::encode(&meta))).unwrap();
    frame::put_with(&mut buf, 1, |b| {
        b.extend(record::encode(&record::Entry::Record(package(
            4, "alice", 2,
        ))))
    })
    .unwrap();
    std::fs::write(&path, &buf).unwrap();

    let Err(err) = Journal::open(config(dir.path(), FsyncPolicy::Always).0) else {
        panic!("a version-1 journal opened");
    };
    assert!(
        matches!(&err, JournalError::RetiredFormat { version: 1, path: p } if *p == path),
        "{err:?}"
    );
    let msg = err.to_string();
    for part in [
        "format version 1",
        "reads versions 2 and 3",
        "an older master that still reads version 1",
        "move the file away",
        "docs/journal.md",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        buf,
        "a refused file is not touched"
    );
}

#[test]
fn a_version_2_file_replays_with_every_option_and_is_upgraded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.log");
    // Version 2 knew every option but `max_attempts`.
    let packages: Vec<PackageRecord> = (1..=4)
        .map(|id| match package(id, "alice", 2) {
            Record::Package(p) => PackageRecord {
                opts: rtpool_core::PackageOpts {
                    max_attempts: 0,
                    ..p.opts
                },
                ..p
            },
            _ => unreachable!(),
        })
        .collect();
    let mut buf = Vec::new();
    let meta = record::Entry::Meta {
        version: 2,
        next_package: 5,
        last_lsn: 5,
    };
    frame::put_with(&mut buf, 0, |b| b.extend(record::encode(&meta))).unwrap();
    for (lsn, p) in (1..).zip(&packages) {
        let rec = Record::Package(p.clone());
        frame::put_with(&mut buf, lsn, |b| b.extend(record::encode_v2(&rec))).unwrap();
    }
    let done = done(2, 1, 70);
    frame::put_with(&mut buf, 5, |b| b.extend(record::encode_v2(&done))).unwrap();
    std::fs::write(&path, &buf).unwrap();

    let (journal, replay) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(replay.format_version, 2);
    let got: Vec<PackageRecord> = replay.packages.iter().map(|p| p.record.clone()).collect();
    assert_eq!(got, packages, "every option of every package as written");
    assert_eq!(journal.stats().compactions, 1, "upgraded at open");
    journal.close().unwrap();

    let (journal, again) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(again.format_version, FORMAT_VERSION);
    assert_eq!(again.packages, replay.packages);
    assert_eq!((again.next_package, again.last_lsn), (5, 5));
    journal.close().unwrap();
}

#[test]
fn replay_after_close_equals_what_was_appended() {
    let dir = tempfile::tempdir().unwrap();
    let records = scenario();
    let (journal, _) = open(dir.path(), FsyncPolicy::default());
    let lsns = append_all(&journal, &records);
    assert_eq!(lsns, (1..=records.len() as u64).collect::<Vec<_>>());
    journal.close().unwrap();
    journal.close().unwrap(); // idempotent
    let size = std::fs::metadata(dir.path().join("journal.log"))
        .unwrap()
        .len();

    let (journal, replay) = open(dir.path(), FsyncPolicy::default());
    assert_replay_matches(&replay, &records);
    assert_eq!(replay.records, records.len() as u64);
    assert_eq!(replay.last_lsn, records.len() as u64);
    assert_eq!(replay.bytes, size);
    assert_eq!(replay.truncated_tail, None);
    // Spot-check the model itself on this scenario.
    let ids: Vec<u64> = replay.packages.iter().map(|p| p.record.package).collect();
    assert_eq!(ids, vec![1, 7]);
    assert_eq!(replay.packages[0].delivered, vec![0]);
    assert_eq!(replay.packages[0].done.len(), 1);
    assert_eq!(replay.next_package, 8);
    // Appends continue after the replayed LSN.
    assert_eq!(
        journal.append(Record::End { package: 1 }),
        records.len() as u64 + 1
    );
}

#[test]
fn appends_from_many_threads_reach_the_file_in_lsn_order() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let j = journal.clone();
            std::thread::spawn(move || {
                (0..250u64)
                    .map(|i| {
                        j.append(Record::End {
                            package: t * 1000 + i,
                        })
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut lsns: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    journal.close().unwrap();
    lsns.sort_unstable();
    assert_eq!(lsns, (1..=1000).collect::<Vec<_>>());
    let buf = std::fs::read(dir.path().join("journal.log")).unwrap();
    let file_lsns: Vec<u64> = frame_offsets(&dir.path().join("journal.log"))
        .into_iter()
        .skip(1)
        .map(|off| frame::check(&buf, off).unwrap().lsn)
        .collect();
    assert_eq!(file_lsns, lsns);
    assert!(journal.stats().max_group_records >= 1);
}

#[test]
fn a_torn_tail_is_cut_at_every_byte_of_the_last_three_records() {
    let dir = tempfile::tempdir().unwrap();
    let records = scenario();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    append_all(&journal, &records);
    journal.close().unwrap();
    let path = dir.path().join("journal.log");
    let full = std::fs::read(&path).unwrap();
    let offsets = frame_offsets(&path);
    // offsets[0] is the meta record; record k (0-based) starts at offsets[k + 1].
    let first_cut = offsets[offsets.len() - 3];
    let case_dir = tempfile::tempdir().unwrap();
    let case_path = case_dir.path().join("journal.log");
    for cut in first_cut..full.len() {
        std::fs::write(&case_path, &full[..cut]).unwrap();
        // The frame the cut falls in (or starts at); frame 0 is the meta record.
        let torn = offsets.iter().rposition(|&o| o <= cut).unwrap();
        let (whole, start) = (torn - 1, offsets[torn]);
        let (journal, replay) = open(case_dir.path(), FsyncPolicy::Off);
        assert_eq!(replay.records, whole as u64, "cut at {cut}");
        assert_replay_matches(&replay, &records[..whole]);
        let expect_tail = (cut > start).then(|| (start as u64, (cut - start) as u64));
        assert_eq!(replay.truncated_tail, expect_tail, "cut at {cut}");
        assert_eq!(replay.bytes, start as u64);
        assert_eq!(std::fs::metadata(&case_path).unwrap().len(), start as u64);
        // The repaired journal takes appends, and they replay.
        let lsn = journal.append(Record::End { package: 99 });
        assert_eq!(lsn, whole as u64 + 1, "cut at {cut}");
        journal.close().unwrap();
        let (_, again) = open(case_dir.path(), FsyncPolicy::Off);
        assert_eq!((again.records, again.last_lsn), (whole as u64 + 1, lsn));
        assert_eq!(again.truncated_tail, None);
    }
}

#[test]
fn a_damaged_middle_record_refuses_to_open_and_names_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    for i in 0..100u64 {
        journal.append(if i % 2 == 0 {
            package(i, "u", 2)
        } else {
            done(i - 1, 1, i)
        });
    }
    journal.close().unwrap();
    let path = dir.path().join("journal.log");
    let good = std::fs::read(&path).unwrap();
    let offsets = frame_offsets(&path);
    let middle = offsets[50];
    let payload_len = offsets[51] - middle - frame::HEADER_BYTES;
    // (byte within the frame, xor mask): magic, length (longer and shorter), crc, lsn, payload.
    let damages = [
        (0, 0xFF),
        (3, 0x01),
        (4, 0x40),
        (4, 0x01),
        (7, 0x80),
        (9, 0x10),
        (14, 0x02),
        (frame::HEADER_BYTES, 0x01),
        (frame::HEADER_BYTES + payload_len / 2, 0x20),
        (frame::HEADER_BYTES + payload_len - 1, 0x08),
    ];
    for (at, mask) in damages {
        let mut bad = good.clone();
        bad[middle + at] ^= mask;
        std::fs::write(&path, &bad).unwrap();
        match Journal::open(config(dir.path(), FsyncPolicy::Off).0) {
            Err(JournalError::Corrupt {
                path: p, offset, ..
            }) => {
                assert_eq!(
                    (p.as_path(), offset),
                    (path.as_path(), middle as u64),
                    "{at}"
                );
            }
            Err(other) => panic!("damage at {at}: {other}"),
            Ok(_) => panic!("damage at {at}: opened"),
        }
        // Nothing was cut: the file is left for a person to look at.
        assert_eq!(std::fs::read(&path).unwrap(), bad);
    }
    let err = {
        let mut bad = good.clone();
        bad[middle] ^= 0xFF;
        std::fs::write(&path, &bad).unwrap();
        Journal::open(config(dir.path(), FsyncPolicy::Off).0)
            .err()
            .unwrap()
    };
    assert!(
        err.to_string().contains(&format!("byte offset {middle}")),
        "{err}"
    );
}

#[test]
fn compaction_keeps_lsns_ids_and_state_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = scenario();
    // The highest id and the highest LSN both belong to a package that ends: compaction drops
    // every record of it, yet neither may be reused.
    records.extend([package(9, "erin", 1), Record::End { package: 9 }]);
    let n = records.len() as u64;
    let (journal, _) = open(dir.path(), FsyncPolicy::Always);
    append_all(&journal, &records);
    journal.set_watermark(4);
    journal.compact_now().unwrap();
    let stats = journal.stats();
    assert_eq!(stats.compactions, 1);
    assert_eq!(stats.durable_lsn, n);
    journal.close().unwrap();

    let (journal, replay) = open(dir.path(), FsyncPolicy::Always);
    assert!(replay.records < n, "compaction dropped nothing: {replay:?}");
    assert_eq!((replay.last_lsn, replay.next_package), (n, 10));
    let above =
        |c: &[(String, u64, u64)]| -> Vec<_> { c.iter().filter(|c| c.2 > 4).cloned().collect() };
    let (packages, _, charges) = expected(&records);
    assert_eq!(replay.packages, packages);
    assert_eq!(above(&replay.charges), above(&charges));
    // Appends go to the compacted file and continue the LSNs.
    let extra = done(1, 1, 70);
    assert_eq!(journal.append(extra.clone()), n + 1);
    journal.close().unwrap();
    let (_, replay) = open(dir.path(), FsyncPolicy::Always);
    records.push(extra);
    let (packages, next_package, charges) = expected(&records);
    assert_eq!(replay.packages, packages);
    assert_eq!(
        (replay.last_lsn, replay.next_package),
        (n + 1, next_package)
    );
    assert_eq!(above(&replay.charges), above(&charges));
}

#[test]
fn the_journal_compacts_itself_when_it_doubles() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cfg, fatals) = config(dir.path(), FsyncPolicy::Off);
    cfg.compact_min_bytes = 4096;
    let (journal, _) = Journal::open(cfg).unwrap();
    let mut records = vec![];
    for id in 0..200u64 {
        records.push(package(id, "u", 3));
        records.push(done(id, 0, id));
        if id % 10 != 0 {
            records.push(Record::Delivered {
                package: id,
                indices: vec![0],
            });
            records.push(Record::End { package: id });
        }
    }
    let last = *append_all(&journal, &records).last().unwrap();
    journal.set_watermark(last / 2);
    assert!(wait_durable(&journal, last, Duration::from_secs(10)));
    // Compaction runs in the background; closing would abandon one still running.
    let deadline = Instant::now() + Duration::from_secs(10);
    while journal.stats().compactions == 0 {
        assert!(Instant::now() < deadline, "{:?}", journal.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    journal.close().unwrap();
    let stats = journal.stats();
    assert!(stats.compactions >= 1, "{stats:?}");
    assert!(stats.file_bytes < stats.bytes_written, "{stats:?}");
    assert_eq!(fatals.load(Ordering::SeqCst), 0);

    let (_, replay) = open(dir.path(), FsyncPolicy::Off);
    let (packages, next_package, charges) = expected(&records);
    assert_eq!(replay.packages, packages);
    assert_eq!(replay.packages.len(), 20);
    assert_eq!(replay.next_package, next_package);
    assert_eq!(replay.last_lsn, last);
    // Charges above the watermark survive every compaction (the watermark rose mid-way, so
    // some below it may survive too).
    let high = |c: &[(String, u64, u64)]| {
        c.iter()
            .filter(|c| c.2 > last / 2)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(high(&replay.charges), high(&charges));
}

#[test]
fn a_leftover_compaction_file_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    journal.append(package(1, "u", 1));
    journal.close().unwrap();
    let tmp = dir.path().join("journal.log.compact");
    std::fs::write(&tmp, b"half a compaction").unwrap();
    let (_, replay) = open(dir.path(), FsyncPolicy::Off);
    assert_eq!(replay.packages.len(), 1);
    assert!(!tmp.exists());
}

/// One step of a random history; `pick` chooses among the packages alive at that point.
#[derive(Debug, Clone)]
enum Op {
    Package {
        tasks: usize,
    },
    Done {
        pick: usize,
        index: u32,
        exec_us: u64,
    },
    Delivered {
        pick: usize,
        indices: Vec<u32>,
    },
    End {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..4).prop_map(|tasks| Op::Package { tasks }),
        4 => (any::<usize>(), 0u32..4, 0u64..1000)
            .prop_map(|(pick, index, exec_us)| Op::Done { pick, index, exec_us }),
        2 => (any::<usize>(), proptest::collection::vec(0u32..4, 0..3))
            .prop_map(|(pick, indices)| Op::Delivered { pick, indices }),
        1 => any::<usize>().prop_map(|pick| Op::End { pick }),
    ]
}

/// Turns ops into records: ids ascend (with gaps), a Done may target an ended package.
fn to_records(ops: &[Op]) -> Vec<Record> {
    let mut live: Vec<u64> = vec![];
    let mut ever: Vec<u64> = vec![];
    let mut next = 1;
    let mut out = vec![];
    for op in ops {
        let choose = |pick: usize, from: &[u64]| from.get(pick % from.len().max(1)).copied();
        match op {
            Op::Package { tasks } => {
                out.push(package(next, ["a", "b", "c"][next as usize % 3], *tasks));
                live.push(next);
                ever.push(next);
                next += 1 + next % 2;
            }
            Op::Done {
                pick,
                index,
                exec_us,
            } => {
                // Mostly live packages; now and then a late result of an ended one.
                let from = if pick % 7 == 0 { &ever } else { &live };
                if let Some(p) = choose(*pick / 7, from) {
                    out.push(done(p, *index, *exec_us));
                }
            }
            Op::Delivered { pick, indices } => {
                if let Some(p) = choose(*pick, &live) {
                    out.push(Record::Delivered {
                        package: p,
                        indices: indices.clone(),
                    });
                }
            }
            Op::End { pick } => {
                if let Some(p) = choose(*pick, &live) {
                    live.retain(|&x| x != p);
                    out.push(Record::End { package: p });
                }
            }
        }
    }
    out
}

fn reopen(path: &Path) -> Replay {
    let (journal, replay) = open(path, FsyncPolicy::Off);
    journal.close().unwrap();
    replay
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn compaction_preserves_the_replay(
        ops in proptest::collection::vec(op(), 0..60),
        watermark_frac in 0u64..=100,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let records = to_records(&ops);
        let (journal, _) = open(dir.path(), FsyncPolicy::Off);
        append_all(&journal, &records);
        journal.close().unwrap();
        let before = reopen(dir.path());
        assert_replay_matches(&before, &records);

        let watermark = records.len() as u64 * watermark_frac / 100;
        let (journal, _) = open(dir.path(), FsyncPolicy::Off);
        journal.set_watermark(watermark);
        journal.compact_now().unwrap();
        journal.close().unwrap();
        let after = reopen(dir.path());

        prop_assert_eq!(&after.packages, &before.packages);
        prop_assert_eq!(after.next_package, before.next_package);
        prop_assert_eq!(after.last_lsn, before.last_lsn);
        let above = |r: &Replay| -> Vec<(String, u64, u64)> {
            r.charges.iter().filter(|c| c.2 > watermark).cloned().collect()
        };
        prop_assert_eq!(above(&after), above(&before));
        // Nothing at or below the watermark survives unless a kept Done carries it.
        let kept: BTreeSet<u64> = after.charges.iter().map(|c| c.2).collect();
        let undelivered = after.packages.iter().map(|p| p.done.len()).sum::<usize>();
        prop_assert!(kept.iter().filter(|&&l| l <= watermark).count() <= undelivered);
    }
}

#[test]
fn always_publishes_durable_only_after_its_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Always);
    let rx = journal.durable();
    for i in 0..20u64 {
        let lsn = journal.append(package(i, "u", 1));
        assert!(wait_durable(&journal, lsn, Duration::from_secs(10)));
        let durable = *rx.borrow();
        let stats = journal.stats();
        // The counters are updated before the durable LSN is published.
        assert!(stats.synced_lsn >= durable, "{stats:?}");
        assert_eq!(stats.fsyncs, stats.groups, "one fsync per group: {stats:?}");
    }
    assert_eq!(journal.stats().fsyncs, 20);
}

#[test]
fn off_publishes_after_write_and_syncs_only_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    let lsn = journal.append(package(1, "u", 1));
    assert!(wait_durable(&journal, lsn, Duration::from_secs(10)));
    let stats = journal.stats();
    assert_eq!((stats.fsyncs, stats.written_lsn), (0, lsn));
    journal.close().unwrap();
    assert_eq!(journal.stats().fsyncs, 1);
}

#[test]
fn batch_makes_a_lone_record_durable_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let window = Duration::from_millis(300);
    let (journal, _) = open(dir.path(), FsyncPolicy::Batch { window });
    // Back to back with open, so the window since the last sync (at open) has not passed:
    // only the idle timer can sync this record.
    let appended = Instant::now();
    let lsn = journal.append(package(1, "u", 1));
    assert!(wait_durable(&journal, lsn, Duration::from_secs(10)));
    let took = appended.elapsed();
    let stats = journal.stats();
    assert_eq!((stats.fsyncs, stats.synced_lsn), (1, lsn), "{stats:?}");
    // Generous slack for a loaded machine; the point is that no further append or close was
    // needed.
    assert!(took < window + Duration::from_secs(5), "took {took:?}");
    journal.close().unwrap();
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct TinyFs {
    dir: tempfile::TempDir,
}

impl TinyFs {
    fn mount(size: &str) -> Result<TinyFs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed (not root?): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(TinyFs { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn a_failed_write_calls_on_fatal_once_and_stops() {
    let fs = match TinyFs::mount("64k") {
        Ok(fs) => fs,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let (cfg, fatals) = config(&fs.path(), FsyncPolicy::Always);
    let (journal, _) = Journal::open(cfg).unwrap();
    let big = Bytes::from(vec![0xAB; 8 << 10]);
    let mut last = 0;
    // 8 KiB each: the 64 KiB file system is full after at most 8 of them.
    for i in 0..20u32 {
        last = journal.append(Record::Done(DoneRecord {
            package: 1,
            index: i,
            status: 0,
            data: big.clone(),
            exec_us: 1,
            late_us: 0,
        }));
        if journal.stats().failed {
            break;
        }
        // Give each record its own group so that the failure hits a write mid-way.
        let _ = wait_durable(&journal, last, Duration::from_secs(2));
    }
    let err = journal.close().unwrap_err();
    assert!(
        matches!(&err, JournalError::Io { op: "write", .. }),
        "unexpected error: {err}"
    );
    assert_eq!(fatals.load(Ordering::SeqCst), 1);
    assert!(*journal.durable().borrow() < last);
    // Appends after the failure are dropped, and closing again reports the stop.
    journal.append(Record::End { package: 1 });
    assert!(matches!(journal.close(), Err(JournalError::Stopped)));
    assert_eq!(fatals.load(Ordering::SeqCst), 1);
    drop(journal);
    // What did reach the disk replays; the torn record is cut off.
    let (journal, replay) = open(&fs.path(), FsyncPolicy::Off);
    assert!(replay.records >= 1 && replay.last_lsn < last, "{replay:?}");
    journal.close().unwrap();
}

#[test]
fn the_handle_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Journal>();
}

#[test]
fn dropping_the_last_handle_writes_and_syncs_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    let records = scenario();
    let clone = journal.clone();
    append_all(&clone, &records);
    drop(journal);
    drop(clone);
    let (_, replay) = open(dir.path(), FsyncPolicy::Off);
    assert_replay_matches(&replay, &records);
}

#[test]
fn a_closed_journal_refuses_compaction_and_drops_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Always);
    let first = journal.append(package(1, "u", 1));
    journal.close().unwrap();
    assert!(matches!(journal.compact_now(), Err(JournalError::Stopped)));
    let dropped = journal.append(package(2, "u", 1));
    assert_eq!(dropped, first + 1);
    assert_eq!(*journal.durable().borrow(), first);
    let (_, replay) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!((replay.records, replay.last_lsn), (1, first));
}

#[test]
fn a_last_record_with_a_good_crc_but_a_bad_payload_is_corruption_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    journal.append(package(1, "u", 1));
    journal.close().unwrap();
    let path = dir.path().join("journal.log");
    let mut buf = std::fs::read(&path).unwrap();
    let offset = buf.len();
    // fixarray of 2: tag 99 (unknown), 0.
    frame::put(&mut buf, 2, &[0x92, 99, 0]);
    std::fs::write(&path, &buf).unwrap();
    match Journal::open(config(dir.path(), FsyncPolicy::Off).0) {
        Err(JournalError::Corrupt {
            offset: at, reason, ..
        }) => {
            assert_eq!(at, offset as u64);
            assert!(reason.contains("unknown record tag 99"), "{reason}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("opened"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), buf);
}

#[path = "tests_background.rs"]
mod background;

#[path = "tests_order.rs"]
mod order;
