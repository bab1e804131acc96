//! Replay gives live packages in the order they were accepted, whatever their ids: a held
//! dependent (option `after`) must be restored after its producer, and package ids are not
//! monotonic across master instances (a dependent can have the lower id).

use super::*;

#[test]
fn packages_replay_in_acceptance_order_also_after_a_compaction() {
    let dir = tempfile::tempdir().unwrap();
    // Accepted in this order; the later ones have the lower ids.
    let records = vec![
        package(900, "u", 1),
        package(40, "u", 1),
        package(7, "u", 1),
    ];
    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    append_all(&journal, &records);
    journal.close().unwrap();
    let ids = |r: &Replay| -> Vec<u64> { r.packages.iter().map(|p| p.record.package).collect() };
    let before = reopen(dir.path());
    assert_eq!(ids(&before), vec![900, 40, 7]);
    assert_replay_matches(&before, &records);

    let (journal, _) = open(dir.path(), FsyncPolicy::Off);
    journal.compact_now().unwrap();
    journal.close().unwrap();
    assert_eq!(ids(&reopen(dir.path())), vec![900, 40, 7]);
}
