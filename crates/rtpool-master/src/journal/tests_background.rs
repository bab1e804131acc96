//! Compaction in the background: appends go on and become durable while it runs, the file it
//! installs replays to everything appended before and during it, and closing abandons it at
//! once, leaving the old file whole.

use super::*;

/// A journal in `dir` holding `packages` live packages of one 64 KiB task each (about 4 MiB
/// per 64 packages), closed.
fn big_journal(dir: &Path, packages: u64) -> Vec<Record> {
    let (journal, _) = open(dir, FsyncPolicy::Off);
    let records: Vec<Record> = (0..packages)
        .map(|id| {
            let mut rec = package(id, "u", 0);
            if let Record::Package(p) = &mut rec {
                p.tasks = vec![Bytes::from(vec![id as u8; 64 << 10])];
            }
            rec
        })
        .collect();
    append_all(&journal, &records);
    journal.close().unwrap();
    records
}

#[test]
fn appends_become_durable_while_a_compaction_runs_and_all_survive_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = big_journal(dir.path(), 640); // ~40 MiB to rewrite
    let (journal, _) = open(dir.path(), FsyncPolicy::Always);
    let compacting = {
        let journal = journal.clone();
        std::thread::spawn(move || journal.compact_now())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !journal.stats().compacting {
        assert!(Instant::now() < deadline, "no compaction started");
        std::thread::yield_now();
    }
    // Under `always`, durable means written and fsynced: the writer is not held by the
    // compaction (before, appends waited in the queue until it ended).
    let mut durable_during = 0;
    while journal.stats().compacting {
        assert!(Instant::now() < deadline, "the compaction never ended");
        let rec = done(records.len() as u64 % 640, 0, 5);
        records.push(rec.clone());
        let lsn = journal.append(rec);
        assert!(wait_durable(&journal, lsn, Duration::from_secs(10)));
        if journal.stats().compacting {
            durable_during += 1;
        }
    }
    compacting.join().unwrap().unwrap();
    assert!(
        durable_during > 0,
        "no append was durable during the compaction"
    );
    let stats = journal.stats();
    assert_eq!((stats.compactions, stats.compactions_cancelled), (1, 0));
    journal.close().unwrap();
    let (_, replay) = open(dir.path(), FsyncPolicy::Always);
    let (packages, next_package, charges) = expected(&records);
    assert_eq!(replay.packages, packages);
    assert_eq!(replay.next_package, next_package);
    assert_eq!(replay.last_lsn, records.len() as u64);
    assert_eq!(replay.charges, charges);
}

#[test]
fn closing_abandons_a_running_compaction_and_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let records = big_journal(dir.path(), 1280); // ~80 MiB to rewrite
    let path = dir.path().join("journal.log");
    let before = std::fs::read(&path).unwrap();
    let (mut cfg, _) = config(dir.path(), FsyncPolicy::Always);
    // Over the threshold at open: compacted at once, in the background.
    cfg.compact_min_bytes = 1 << 20;
    let (journal, _) = Journal::open(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !journal.stats().compacting && journal.stats().compactions == 0 {
        assert!(Instant::now() < deadline, "no compaction started");
        std::thread::yield_now();
    }
    let started = Instant::now();
    journal.close().unwrap();
    let took = started.elapsed();
    let stats = journal.stats();
    // Closed mid-compaction (the rewrite of 80 MiB takes seconds): abandoned after at most
    // one 8 MiB fsync and one read chunk.
    assert_eq!((stats.compactions, stats.compactions_cancelled), (0, 1));
    assert!(took < Duration::from_secs(1), "close took {took:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the old file changed"
    );
    assert!(!dir.path().join("journal.log.compact").exists());
    let (_, replay) = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(replay.packages, expected(&records).0);
}
