//! Scenarios: a package with `near` (its task's data is kept on one worker) runs on that
//! worker when it can take the task now, and anywhere otherwise.

mod common;

use bytes::Bytes;
use common::{fn_code, fn_hash, tasks_of, TestEnv};
use rtpool_core::{Action, ClientId, Event, PackageId, PackageOpts, WorkerId};

/// Submits one task of function 0 whose data is on `near`.
fn submit_near(env: &mut TestEnv, client: ClientId, package: u64, near: WorkerId) -> Vec<Action> {
    env.step(Event::Submit {
        client,
        req_id: package,
        package: PackageId(package),
        fn_hash: fn_hash(0),
        fn_code: fn_code(0),
        opts: PackageOpts {
            near: near.0,
            ..PackageOpts::default()
        },
        tasks: vec![Bytes::from_static(b"args")],
    })
}

#[test]
fn a_task_goes_to_the_worker_that_holds_its_data_when_that_one_has_a_credit() {
    let mut env = TestEnv::new();
    let [a, b] = env.new_idle_workers([(1, 1), (1, 1)]); // a is first in the ring
    let client = env.new_client();
    let out = submit_near(&mut env, client, 100, b);
    assert_eq!(tasks_of(&out, b).len(), 1, "{out:?}");
    assert!(tasks_of(&out, a).is_empty(), "{out:?}");
    env.core.check_invariants();
}

#[test]
fn a_task_whose_data_holder_is_busy_runs_elsewhere_at_once() {
    let mut env = TestEnv::new();
    let (a, b) = (env.new_worker(1), env.new_worker(1));
    env.credit(a, 1); // b has no credit: waiting for it would cost an unknown queue
    let client = env.new_client();
    let out = submit_near(&mut env, client, 100, b);
    assert_eq!(tasks_of(&out, a).len(), 1, "{out:?}");
    env.core.check_invariants();
}

#[test]
fn a_task_whose_data_holder_is_gone_runs_anywhere() {
    let mut env = TestEnv::new();
    let [a, b] = env.new_idle_workers([(1, 1), (1, 1)]);
    env.lose_worker(b);
    let client = env.new_client();
    let out = submit_near(&mut env, client, 100, b);
    assert_eq!(tasks_of(&out, a).len(), 1, "{out:?}");
    env.core.check_invariants();
}

#[test]
fn other_tasks_are_not_held_back_by_a_task_that_prefers_another_worker() {
    let mut env = TestEnv::new();
    let [a, b] = env.new_idle_workers([(2, 2), (1, 1)]);
    let client = env.new_client();
    let first = submit_near(&mut env, client, 100, b);
    assert_eq!(tasks_of(&first, b).len(), 1, "{first:?}");
    let (_, out) = env.submit(client, 2);
    assert_eq!(tasks_of(&out, a).len(), 2, "{out:?}");
    env.core.check_invariants();
}

/// Submits one task of function 0 asking for `gpu=1`, whose data is on `near`.
fn submit_gpu_near(
    env: &mut TestEnv,
    client: ClientId,
    package: u64,
    near: WorkerId,
) -> Vec<Action> {
    let resources = rtpool_core::Resources::new([("gpu".to_owned(), 1)]).expect("valid");
    env.step(Event::Submit {
        client,
        req_id: package,
        package: PackageId(package),
        fn_hash: fn_hash(0),
        fn_code: fn_code(0),
        opts: PackageOpts {
            near: near.0,
            resources,
            ..PackageOpts::default()
        },
        tasks: vec![Bytes::from_static(b"args")],
    })
}

#[test]
fn a_class_task_goes_to_the_matching_worker_that_holds_its_data() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    // Three idle gpu workers, offered to the class in joining order: b, the data's holder,
    // is not the first.
    let [a, b, c] = [(); 3].map(|_| env.new_worker_with(1, &[("gpu", 1)], &[]));
    for w in [a, b, c] {
        env.credit(w, 1);
    }
    let out = submit_gpu_near(&mut env, client, 100, b);
    assert_eq!(tasks_of(&out, b).len(), 1, "{out:?}");
    assert!(tasks_of(&out, a).is_empty() && tasks_of(&out, c).is_empty());
    // The others still wait for the class's next task.
    let out = submit_gpu_near(&mut env, client, 101, b);
    assert_eq!(
        tasks_of(&out, a).len() + tasks_of(&out, c).len(),
        1,
        "{out:?}"
    );
    env.core.check_invariants();
}

#[test]
fn a_class_task_whose_data_holder_cannot_take_it_runs_on_another_matching_worker() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    let a = env.new_worker_with(2, &[("gpu", 1)], &[]);
    let b = env.new_worker_with(2, &[("gpu", 1)], &[]);
    let plain = env.new_worker(1);
    env.credit(plain, 1);
    env.credit(a, 1);
    // b has a credit but its one gpu is taken: the task does not wait for it.
    env.credit(b, 2);
    let first = submit_gpu_near(&mut env, client, 100, a);
    assert_eq!(tasks_of(&first, a).len(), 1, "{first:?}");
    let out = submit_gpu_near(&mut env, client, 101, a);
    assert_eq!(tasks_of(&out, b).len(), 1, "{out:?}");
    // Its holder busy (no gpu free on a), the next one queues for whichever frees first.
    let out = submit_gpu_near(&mut env, client, 102, b);
    assert!(tasks_of(&out, plain).is_empty(), "{out:?}");
    env.core.check_invariants();
}
