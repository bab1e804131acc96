//! Scenarios: a package of calls restored from the journal (after a master restart). Its
//! undelivered calls run again, with the acknowledged calls they take inputs from; the other
//! acknowledged calls are gone; the functions need not be served yet; a client re-attaches.

mod common;

use bytes::Bytes;
use common::*;
use rtpool_core::{
    Action, Event, PackageId, PackageOpts, RestoredPackage, TaskStatus, UserId, CALLS_HASH,
};

fn versioned(name: &str, version: &str, args: &str, deps: &[u32]) -> rtpool_core::CallSpec {
    let mut c = call(name, args, deps);
    c.version = version.to_owned();
    c
}

/// The journal gives back `package` of user 1 (default options): these calls, of which the
/// client had acknowledged the results of `delivered`.
fn restore(
    env: &mut TestEnv,
    package: PackageId,
    delivered: Vec<u32>,
    calls: Vec<rtpool_core::CallSpec>,
) -> Vec<Action> {
    env.step(Event::Restore(Box::new(RestoredPackage {
        package,
        user: UserId(1),
        fn_hash: CALLS_HASH,
        fn_code: Bytes::new(),
        opts: PackageOpts::default(),
        tasks: Vec::new(),
        done: Vec::new(),
        delivered,
        calls,
    })))
}

#[test]
fn a_restored_package_of_calls_waits_for_its_server_and_reruns_what_was_not_acknowledged() {
    let mut env = TestEnv::new();
    let package = PackageId((1 << 63) | 7);
    // 0 and 1 were acknowledged; 2 takes 1's result and was not; 3 takes 0's and was.
    let calls = vec![
        versioned("f", "1", "a", &[]),
        versioned("f", "1", "b", &[]),
        versioned("f", "1", "c", &[1]),
        versioned("f", "1", "d", &[0]),
    ];
    let out = restore(&mut env, package, vec![0, 1, 3], calls);
    assert!(out.is_empty(), "nothing serves f yet: {out:?}");
    let client = env.new_client_of(UserId(1));
    let out = env.attach(client, package);
    assert!(matches!(out[..], [Action::Accepted { .. }]), "{out:?}");
    let w = env.new_worker(2);
    env.serve(w, &[("f", "1")]);
    // Only 1 (an input of 2) runs first; 0 and 3 are gone.
    let out = env.credit(w, 2);
    let first = call_assignments(&out);
    assert_eq!(first.len(), 1, "{out:?}");
    assert_eq!(first[0].1.len(), 1, "only call 1 is queued: {out:?}");
    assert_eq!(first[0].1[0].args, Bytes::from_static(b"b"));
    let out = env.complete(w, first[0].1[0].task);
    // Its result goes to its dependent (the client had it already), which runs now.
    let second = call_assignments(&out);
    assert_eq!(second.len(), 1, "{out:?}");
    assert_eq!(second[0].1[0].args, Bytes::from_static(b"c"));
    let out = env.complete(w, second[0].1[0].task);
    let got = outcomes(&out);
    assert!(
        got.iter().any(|(i, s, _)| *i == 2 && *s == TaskStatus::Ok),
        "{got:?}"
    );
    assert_eq!(env.core.stats().packages, 0, "acknowledged (auto): freed");
}

#[test]
fn a_restored_package_of_calls_whose_server_never_comes_fails_after_the_grace() {
    let mut env = TestEnv::new();
    let package = PackageId((1 << 63) | 8);
    restore(
        &mut env,
        package,
        Vec::new(),
        vec![versioned("gone", "1", "a", &[])],
    );
    let client = env.new_client_of(UserId(1));
    env.attach(client, package);
    let out = env.tick_after(31_000);
    let got = outcomes(&out);
    assert!(matches!(got[..], [(0, TaskStatus::Failed, _)]), "{got:?}");
}
