//! Scenarios: leases on tasks. A lost worker's tasks are reassigned with the next attempt; its
//! late results are stale; a task whose worker is lost on every allowed attempt fails as a
//! poison task; returned tasks are not losses.

mod common;

use common::{
    assert_freed_last, assert_mentions, only_outcome, outcomes, result_indices, results, Spec,
    TestEnv,
};
use rtpool_core::{CoreConfig, TaskId, TaskStatus, WorkerId};

#[test]
fn worker_lost_mid_package_reassigns_its_tasks_with_the_next_attempt() {
    let (mut env, _, _) = TestEnv::new().with_package(3);
    let (lost, other) = (env.new_worker(2), env.new_worker(2));
    let held = env.take(lost, 2);
    assert!(held.iter().all(|&t| env.attempt(t) == 1));
    let out = env.lose_worker(lost);
    assert!(out.is_empty(), "no credits anywhere: {out:?}");
    let stats = env.core.stats();
    assert_eq!(
        (stats.counters.requeued, stats.queued, stats.running),
        (2, 3, 0)
    );
    let next = env.take(other, 2);
    assert_eq!(next, held, "the lost worker's tasks go first");
    assert!(next.iter().all(|&t| env.attempt(t) == 2), "attempt + 1");
}

#[test]
fn stale_result_of_the_lost_attempt_is_ignored_and_counted_and_one_result_is_delivered() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (lost, other) = (env.new_worker(1), env.new_worker(1));
    let task = env.take(lost, 1)[0];
    env.lose_worker(lost);
    assert_eq!(env.take(other, 1), [task]);
    assert!(
        env.result(lost, task, 1).is_empty(),
        "the lost worker's attempt"
    );
    assert!(
        env.result(other, task, 1).is_empty(),
        "the old attempt from the new holder"
    );
    assert_eq!(env.core.stats().counters.stale_results, 2);
    assert_eq!(
        env.core.stats().running,
        1,
        "still running on the new worker"
    );
    let out = env.complete(other, task);
    assert_eq!(result_indices(&out), [0]);
    assert!(
        env.complete(other, task).is_empty(),
        "a repeat is stale too"
    );
    let stats = env.core.stats();
    assert_eq!(
        (stats.counters.delivered, stats.counters.stale_results),
        (1, 3)
    );
    assert_eq!((stats.packages, stats.tasks), (0, 0));
}

#[test]
fn task_lost_on_three_workers_fails_as_poison_naming_each_attempt_and_the_rest_goes_on() {
    let (mut env, _, package) = TestEnv::new().with_package(3);
    let mut victims = Vec::new();
    let mut last = Vec::new();
    for _ in 0..3 {
        let (w, got) = env.new_worker_taking(1);
        assert_eq!(got.len(), 1);
        assert_eq!(env.index(got[0]), 0, "the requeued task is at the front");
        victims.push(w);
        last = env.lose_worker(w);
    }
    let (index, status, message) = only_outcome(&last, "one poison result expected");
    assert_eq!((index, status), (0, TaskStatus::Lost));
    for (i, w) in victims.iter().enumerate() {
        let named = format!("attempt {} on {w}", i + 1);
        assert!(message.contains(&named), "{named:?} not in {message:?}");
    }
    let stats = env.core.stats();
    assert_eq!((stats.counters.poisoned, stats.counters.requeued), (1, 2));
    assert_eq!(stats.queued, 2, "the other tasks wait, unharmed");
    let (w, rest) = env.new_worker_taking(2);
    assert_eq!(rest.len(), 2);
    env.complete(w, rest[0]);
    let out = env.complete(w, rest[1]);
    assert_freed_last(&out, package);
    assert_eq!(env.core.stats().counters.poisoned, 1);
}

#[test]
fn returned_tasks_do_not_count_toward_the_poison_cap() {
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (w, task) = env.new_worker_running();
    for _ in 0..5 {
        env.return_tasks(w, &[task]);
        assert_eq!(env.take(w, 1), [task]);
    }
    assert_eq!(env.attempt(task), 6);
    // Two losses after five returns: still under the cap of three.
    for _ in 0..2 {
        let lost = env.new_worker(1);
        env.return_tasks(w, &[task]);
        assert_eq!(env.take(lost, 1), [task]);
        assert!(outcomes(&env.lose_worker(lost)).is_empty(), "requeued");
        env.credit(w, 1);
    }
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.poisoned,
            stats.counters.requeued,
            stats.running
        ),
        (0, 2, 1)
    );
    assert_eq!(env.attempt(task), 10, "1 + 5 returns + 2 × (return, lost)");
    let out = env.complete(w, task);
    assert_eq!(outcomes(&out)[0].1, TaskStatus::Ok);
}

#[test]
fn poison_cap_follows_max_attempts() {
    let (mut env, _, _) = TestEnv::with_config(CoreConfig {
        max_attempts: 1,
        ..CoreConfig::default()
    })
    .with_package(1);
    let w = env.new_worker(1);
    env.credit(w, 1);
    let out = env.lose_worker(w);
    let got = outcomes(&out);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, TaskStatus::Lost);
    assert!(
        got[0].2.contains(&format!("attempt 1 on {w}")),
        "{}",
        got[0].2
    );
    assert_eq!(env.core.stats().counters.requeued, 0);
}

#[test]
fn a_package_max_attempts_below_the_masters_poisons_sooner() {
    // The core allows 3 attempts; this package allows 1: its first loss is final, while a
    // package without the option is requeued.
    let mut env = TestEnv::new();
    let client = env.new_client();
    let (capped, _) = env.submit_spec(client, Spec::tasks(1).max_attempts(1));
    env.submit(client, 1);
    let w = env.new_worker(2);
    assert_eq!(env.take(w, 2).len(), 2);
    let out = env.lose_worker(w);
    let got = outcomes(&out);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(results(&out)[0].0, capped);
    assert_eq!(got[0].1, TaskStatus::Lost);
    assert!(got[0].2.contains("1 times"), "{}", got[0].2);
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.poisoned,
            stats.counters.requeued,
            stats.queued
        ),
        (1, 1, 1)
    );
}

#[test]
fn a_package_max_attempts_above_the_masters_retries_longer() {
    // The core allows 1 attempt; this package allows 3: two losses requeue it, the third
    // poisons it.
    let mut env = TestEnv::with_config(CoreConfig {
        max_attempts: 1,
        ..CoreConfig::default()
    });
    let client = env.new_client();
    let (package, _) = env.submit_spec(client, Spec::tasks(1).max_attempts(3));
    for attempt in 1..=3 {
        let w = env.new_worker(1);
        let task = env.take(w, 1)[0];
        assert_eq!(env.attempt(task), attempt);
        let out = env.lose_worker(w);
        let got = outcomes(&out);
        if attempt < 3 {
            assert!(got.is_empty(), "attempt {attempt}: requeued, got {out:?}");
        } else {
            assert_eq!(results(&out)[0].0, package);
            assert_eq!(got[0].1, TaskStatus::Lost);
            assert!(got[0].2.contains("3 times"), "{}", got[0].2);
        }
    }
    let stats = env.core.stats();
    assert_eq!((stats.counters.poisoned, stats.counters.requeued), (1, 2));
}

#[test]
fn lost_worker_with_a_cancelled_task_frees_it_without_a_loss() {
    let (mut env, client, package) = TestEnv::new().with_package(2);
    let w = env.new_worker(2);
    assert_eq!(env.take(w, 2).len(), 2);
    env.cancel(client, package, &[0]);
    env.lose_worker(w);
    let stats = env.core.stats();
    assert_eq!(
        (stats.cancelling, stats.counters.requeued, stats.queued),
        (0, 1, 1)
    );
}

#[test]
fn prefetched_tasks_of_a_lost_worker_are_not_counted_as_losses() {
    // A one-slot worker holding 4 tasks ran only the oldest: three deaths make that one a
    // poison task, but the three it had prefetched each time are requeued, not poisoned.
    let (mut env, _, _) = TestEnv::new().with_package(4);
    let mut first = None;
    for round in 0..3 {
        let w = env.new_worker(1);
        let held = env.take(w, 4);
        assert_eq!(held.len(), 4);
        first.get_or_insert(held[0]);
        assert_eq!(Some(held[0]), first, "the oldest goes first again");
        let out = env.lose_worker(w);
        let lost: Vec<_> = outcomes(&out)
            .into_iter()
            .filter(|o| o.1 == TaskStatus::Lost)
            .collect();
        assert_eq!(
            lost.len(),
            usize::from(round == 2),
            "round {round}: {out:?}"
        );
    }
    let stats = env.core.stats();
    assert_eq!(stats.counters.poisoned, 1);
    assert_eq!(stats.queued, 3, "the prefetched ones wait for a worker");
}

#[test]
fn a_worker_reported_crash_is_retried_then_poison_naming_what_happened() {
    // A worker whose task's process died (it ran it in a process of its own and survived)
    // reports status Lost with how: the task is retried like one whose worker was lost, and
    // after max_attempts fails as poison with each report in its message.
    let (mut env, _, _) = TestEnv::new().with_package(2);
    let w = env.new_worker(1);
    let mut last = Vec::new();
    for attempt in 1..=3 {
        let got = env.take(w, 1);
        assert_eq!(env.index(got[0]), 0, "the crashed task is retried first");
        assert_eq!(env.attempt(got[0]), attempt);
        let how = format!("worker process killed by signal 9 (SIGKILL) (run {attempt})");
        last = env.answer(w, got[0], TaskStatus::Lost, how.as_bytes(), 10);
    }
    let (index, status, message) = only_outcome(&last, "one poison result expected");
    assert_eq!((index, status), (0, TaskStatus::Lost));
    assert!(message.contains("3 times"), "{message}");
    for attempt in 1..=3 {
        let named = format!("attempt {attempt} on {w}: worker process killed by signal 9");
        assert!(message.contains(&named), "{named:?} not in {message:?}");
    }
    let stats = env.core.stats();
    assert_eq!((stats.counters.poisoned, stats.counters.requeued), (1, 2));
    // The worker is still there and runs the other task.
    let rest = env.take(w, 1);
    assert_eq!(rest.len(), 1);
    assert_eq!(result_indices(&env.complete(w, rest[0])), [1]);
}

#[test]
fn a_late_crash_report_names_the_loss_in_the_poison_message() {
    // The process that died was the worker itself: its replacement reports how, after the
    // master saw the connection drop. The report is stale (counted) but names that attempt.
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let (first, task) = env.new_worker_running();
    env.lose_worker(first);
    let second = env.new_worker(1);
    let report = b"worker process exited with code 3 while running task 1 (attempt 1)";
    assert!(env
        .report(second, task, 1, TaskStatus::Lost, report)
        .is_empty());
    assert_eq!(env.core.stats().counters.stale_results, 1);
    let mut last = Vec::new();
    for _ in 2..=3 {
        let w = env.new_worker(1);
        assert_eq!(env.take(w, 1), [task]);
        last = env.lose_worker(w);
    }
    let (_, status, message) = only_outcome(&last, "one poison result expected");
    assert_eq!(status, TaskStatus::Lost);
    assert!(
        message.contains(&format!(
            "attempt 1 on {first}: worker process exited with code 3"
        )),
        "{message}"
    );
    assert_mentions(
        &message,
        &["attempt 2 on", "worker lost (crashed, killed or cut off)"],
    );
}

/// A crash report as the worker sends it: the task's output head (`docs/protocol.md`, "Task
/// output": tag, length, section, padding to 64 bytes), then the text.
fn report_with_output(section: &[u8], text: &str) -> &'static [u8] {
    let mut data = vec![0xB8, 0, 0, 0];
    data.extend_from_slice(&u32::try_from(section.len()).unwrap().to_be_bytes());
    data.extend_from_slice(section);
    data.resize(data.len().div_ceil(64) * 64, 0);
    data.extend_from_slice(text.as_bytes());
    Box::leak(data.into_boxed_slice())
}

#[test]
fn the_output_of_a_crashed_tasks_last_report_goes_before_its_poison_message() {
    // The master keeps the output opaque: the last attempt's comes back with the message,
    // which names each attempt by its text alone.
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let mut last = Vec::new();
    let mut task = TaskId(0);
    for attempt in 1..=3 {
        let w = env.new_worker(1);
        task = env.take(w, 1)[0];
        assert_eq!(env.attempt(task), attempt);
        let text = format!("task process killed by signal 9 (SIGKILL) (attempt {attempt})");
        let section = format!("printed by attempt {attempt}");
        last = env.report(
            w,
            task,
            attempt,
            TaskStatus::Lost,
            report_with_output(section.as_bytes(), &text),
        );
    }
    let data = &results(&last)[0].1[0].data;
    let head = report_with_output(b"printed by attempt 3", "");
    assert_eq!(
        &data[..head.len()],
        head,
        "the last attempt's output, as sent"
    );
    let message = std::str::from_utf8(&data[head.len()..]).expect("the message is text");
    assert!(message.starts_with("poison task"), "{message}");
    assert_mentions(
        message,
        &["(attempt 1)", "(attempt 3)", "killed by signal 9 (SIGKILL)"],
    );
    assert!(!message.contains("printed by"), "{message}");
    assert_eq!(env.core.stats().tasks, 0, "{task} is done");
}

#[test]
fn a_crash_report_whose_output_head_overruns_it_is_all_text() {
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).max_attempts(1));
    let w = env.new_worker(1);
    let task = env.take(w, 1)[0];
    let bogus: &[u8] = b"\xb8\0\0\0\0\0\x10\0worker process exited with code 3";
    let out = env.report(w, task, 1, TaskStatus::Lost, bogus);
    let (_, status, message) = only_outcome(&out, "one poison result expected");
    assert_eq!(status, TaskStatus::Lost);
    assert_mentions(&message, &["poison task", "exited with code 3"]);
}

/// A package of two tasks (`max_attempts` 2) that a one-slot worker took both of (two
/// credits) before its connection closed: that worker and `(innocent, culprit)`, the oldest
/// task (the one the master blames) and the other.
fn two_held_by_a_lost_worker(env: &mut TestEnv) -> (WorkerId, TaskId, TaskId) {
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(2).max_attempts(2));
    let first = env.new_worker(1);
    let held = env.take(first, 2);
    assert_eq!(held.len(), 2, "both tasks taken");
    env.lose_worker(first);
    (first, held[0], held[1])
}

#[test]
fn a_late_crash_report_of_a_task_the_master_did_not_blame_records_its_loss() {
    // The lost worker's oldest running task (whose result was still batched) was blamed; the
    // replacement's report names the task that really ran: its loss is recorded now.
    let mut env = TestEnv::new();
    let (_, innocent, culprit) = two_held_by_a_lost_worker(&mut env);
    let second = env.new_worker(1);
    env.report(
        second,
        culprit,
        1,
        TaskStatus::Lost,
        b"worker process killed by signal 9 (SIGKILL)",
    );
    // The culprit's second loss reaches max_attempts = 2: poison, naming the report.
    let got = env.take(second, 2);
    assert_eq!(got, [innocent, culprit]);
    env.complete(second, innocent);
    let out = env.answer(
        second,
        culprit,
        TaskStatus::Lost,
        b"task process exited with code 3",
        5,
    );
    let (index, status, message) = only_outcome(&out, "one poison result expected");
    assert_eq!((index, status), (1, TaskStatus::Lost));
    assert_mentions(
        &message,
        &[
            "2 times",
            "killed by signal 9 (SIGKILL)",
            "exited with code 3",
        ],
    );
}

#[test]
fn a_late_crash_report_moves_the_blame_off_the_innocent_and_can_poison_a_queued_task() {
    // max_attempts = 2. The first worker held [innocent, culprit] and died running the
    // culprit; the master blamed the innocent (the oldest). The report moves the blame.
    let mut env = TestEnv::new();
    let (first, innocent, culprit) = two_held_by_a_lost_worker(&mut env);
    // The culprit's retry crashes its process on another worker before the report comes.
    let second = env.new_worker(1);
    assert_eq!(env.take(second, 1), [innocent]);
    let third = env.new_worker(1);
    assert_eq!(env.take(third, 1), [culprit]);
    let out = env.answer(
        third,
        culprit,
        TaskStatus::Lost,
        b"task process exited with code 3",
        5,
    );
    assert!(outcomes(&out).is_empty(), "one loss of 2: requeued");
    // The replacement's report of the first death: the culprit's second loss while queued.
    let reporter = env.new_worker(1);
    let out = env.report(
        reporter,
        culprit,
        1,
        TaskStatus::Lost,
        b"worker process killed by signal 11 (SIGSEGV)",
    );
    let (index, status, message) = only_outcome(&out, "the queued culprit fails as poison at once");
    assert_eq!((index, status), (1, TaskStatus::Lost));
    assert!(message.contains("2 times"), "{message}");
    assert!(
        message.contains(&format!(
            "attempt 1 on {first}: worker process killed by signal 11"
        )),
        "{message}"
    );
    // The innocent's loss was withdrawn: one more loss of it is its first, not its second.
    let out = env.lose_worker(second);
    assert!(
        outcomes(&out).is_empty(),
        "the innocent is requeued, not poisoned: {out:?}"
    );
    let w = env.new_worker(1);
    assert_eq!(env.take(w, 1), [innocent]);
    assert_eq!(result_indices(&env.complete(w, innocent)), [0]);
}

#[test]
fn a_worker_silent_past_its_lease_is_not_blamed_even_with_max_attempts_1() {
    // A silent worker may be alive (SIGSTOPped, cut off, starved): its task runs elsewhere
    // with the next attempt, and a package that allows one attempt is not failed as poison.
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).max_attempts(1));
    let (silent, other) = (env.new_worker(1), env.new_worker(1));
    let task = env.take(silent, 1)[0];
    let out = env.expire_lease(silent);
    assert!(outcomes(&out).is_empty(), "not poison: {out:?}");
    let stats = env.core.stats();
    assert_eq!(
        (
            stats.counters.poisoned,
            stats.counters.requeued,
            stats.queued
        ),
        (0, 1, 1)
    );
    assert_eq!(env.take(other, 1), [task]);
    assert_eq!(env.attempt(task), 2);
    assert_eq!(result_indices(&env.complete(other, task)), [0]);
}

#[test]
fn a_mass_lease_expiry_three_times_poisons_nothing() {
    // Three rounds in which every worker holding tasks goes silent at once (a starved host,
    // a frozen switch): every task is lost three times, none of them by its own doing.
    let (mut env, _, _) = TestEnv::new().with_package(8);
    for _ in 0..3 {
        let workers: Vec<_> = (0..4).map(|_| env.new_worker(1)).collect();
        for &w in &workers {
            assert_eq!(env.take(w, 2).len(), 2);
        }
        for w in workers {
            let out = env.expire_lease(w);
            assert!(outcomes(&out).is_empty(), "nothing poisoned: {out:?}");
        }
    }
    let stats = env.core.stats();
    assert_eq!((stats.counters.poisoned, stats.queued), (0, 8));
    let (w, all) = env.new_worker_taking(8);
    assert!(
        all.iter().all(|&t| env.attempt(t) == 4),
        "three attempts lost"
    );
    let mut done = Vec::new();
    for t in all {
        done.extend(result_indices(&env.complete(w, t)));
    }
    done.sort_unstable();
    assert_eq!(done, (0..8).collect::<Vec<_>>());
}

#[test]
fn the_same_losses_with_the_connection_closed_are_blamed() {
    // The counterpart of the test above: a connection that ends on the worker's side (the
    // process died) is evidence against the task it ran, three times make it poison.
    let (mut env, _, _) = TestEnv::new().with_package(1);
    let mut last = Vec::new();
    for _ in 0..3 {
        let w = env.new_worker(1);
        assert_eq!(env.take(w, 1).len(), 1);
        last = env.lose_worker(w);
    }
    assert_eq!(outcomes(&last).len(), 1, "poison: {last:?}");
    assert_eq!(env.core.stats().counters.poisoned, 1);
}

#[test]
fn a_crash_report_after_a_silent_loss_still_counts_against_the_task() {
    // The worker went silent, the master took its task back without blame; then the worker's
    // replacement reports that the process died running it: that report is evidence.
    let mut env = TestEnv::new();
    let client = env.new_client();
    env.submit_spec(client, Spec::tasks(1).max_attempts(2));
    let (first, task) = env.new_worker_running();
    env.expire_lease(first);
    let second = env.new_worker(1);
    env.report(
        second,
        task,
        1,
        TaskStatus::Lost,
        b"worker process killed by signal 9 (SIGKILL)",
    );
    assert_eq!(env.take(second, 1), [task]);
    let out = env.lose_worker(second);
    let (_, status, message) =
        only_outcome(&out, "the report and the closed connection make 2 losses");
    assert_eq!(status, TaskStatus::Lost);
    assert!(
        message.contains(&format!(
            "attempt 1 on {first}: worker process killed by signal 9"
        )),
        "{message}"
    );
}
