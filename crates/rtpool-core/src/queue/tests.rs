//! The ready queue's unit tests: its order (classes, turns, EDF, FIFO), exact removal, work
//! sums, and its lists against a model.

use std::collections::BTreeMap;

use super::check::Linked;
use super::*;

fn key(priority: i32, user: u64, deadline: u64, seq: u64) -> QueueKey {
    QueueKey {
        priority,
        user: UserId(user),
        deadline,
        seq,
    }
}

fn drain(q: &mut ReadyQueue) -> Vec<u64> {
    let out = std::iter::from_fn(|| q.pop()).map(|(t, _)| t.0).collect();
    q.check();
    out
}

#[test]
fn higher_priority_first_fifo_within_a_package() {
    let mut q = ReadyQueue::default();
    q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
    q.push_back(2, key(5, 1, u64::MAX, 2), 0, TaskId(2));
    q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(3));
    q.push_back(3, key(-3, 1, u64::MAX, 3), 0, TaskId(4));
    q.push_back(2, key(5, 1, u64::MAX, 2), 0, TaskId(5));
    q.check();
    assert_eq!(q.len(), 5);
    assert_eq!(drain(&mut q), vec![2, 5, 1, 3, 4]);
    assert!(q.is_empty());
    assert_eq!(q.iter().count(), 0);
    assert!(q.queue.classes.is_empty(), "empty classes are removed");
}

#[test]
fn submit_and_cancel_churn_does_not_grow_the_turns() {
    let mut q = ReadyQueue::default();
    q.push_back(1, key(0, 2, u64::MAX, 1), 0, TaskId(1));
    for slot in 10..1000 {
        let pos = q.push_back(slot, key(0, 1, u64::MAX, slot), 0, TaskId(slot));
        q.remove(slot, pos);
    }
    q.check();
    assert!(
        q.queue
            .classes
            .get_mut(Reverse(0))
            .expect("queued")
            .turns
            .len()
            <= 2
    );
    assert_eq!(drain(&mut q), vec![1]);
    assert!(q.is_empty());
}

#[test]
fn earliest_deadline_first_within_a_user() {
    let mut q = ReadyQueue::default();
    q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(10));
    q.push_back(2, key(0, 1, 500, 2), 0, TaskId(20));
    q.push_back(3, key(0, 1, 100, 3), 0, TaskId(30));
    q.push_back(4, key(0, 1, 500, 4), 0, TaskId(40));
    q.push_back(3, key(0, 1, 100, 3), 0, TaskId(31));
    assert_eq!(
        drain(&mut q),
        vec![30, 31, 20, 40, 10],
        "deadline 100, then 500 (submission order), then no deadline"
    );
}

#[test]
fn users_take_turns_within_a_class() {
    let mut q = ReadyQueue::default();
    for t in 0..5 {
        q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(100 + t));
    }
    q.push_back(2, key(0, 2, u64::MAX, 2), 0, TaskId(200));
    q.push_back(3, key(0, 3, 10, 3), 0, TaskId(300));
    q.push_back(3, key(0, 3, 10, 3), 0, TaskId(301));
    assert_eq!(drain(&mut q), vec![100, 200, 300, 101, 301, 102, 103, 104]);
}

#[test]
fn push_front_goes_ahead_within_its_package_only() {
    let mut q = ReadyQueue::default();
    q.push_back(1, key(1, 1, u64::MAX, 1), 0, TaskId(1));
    q.push_back(2, key(0, 1, u64::MAX, 2), 0, TaskId(2));
    q.push_front(2, key(0, 1, u64::MAX, 2), 0, TaskId(3));
    q.push_front(2, key(0, 1, u64::MAX, 2), 0, TaskId(4));
    assert_eq!(drain(&mut q), vec![1, 4, 3, 2]);
}

#[test]
fn removal_is_exact_and_keeps_the_order() {
    let mut q = ReadyQueue::default();
    let pos: Vec<u64> = (1..=4)
        .map(|t| q.push_back(7, key(0, 1, u64::MAX, 1), 0, TaskId(t)))
        .collect();
    q.remove(7, pos[0]);
    q.remove(7, pos[2]);
    assert_eq!(q.len(), 2);
    q.check();
    assert_eq!(drain(&mut q), vec![2, 4]);
    assert!(q.is_empty());
}

#[test]
fn removing_a_whole_package_drops_it() {
    let mut q = ReadyQueue::default();
    let a = q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
    let b = q.push_back(1, key(0, 1, u64::MAX, 1), 0, TaskId(2));
    q.push_back(2, key(0, 2, u64::MAX, 2), 0, TaskId(3));
    q.remove(1, a);
    q.remove(1, b);
    q.check();
    assert_eq!(q.iter().count(), 1);
    assert_eq!(drain(&mut q), vec![3]);
}

#[test]
fn work_sums_follow_the_queued_tasks() {
    let mut q = ReadyQueue::default();
    let a = q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(1));
    q.push_back(1, key(0, 1, u64::MAX, 1), 100, TaskId(2));
    q.push_back(2, key(5, 1, u64::MAX, 2), 7, TaskId(3));
    assert_eq!(q.work_at_or_above(0), 207);
    assert_eq!(q.work_at_or_above(5), 7);
    assert_eq!(q.work_at_or_above(6), 0);
    q.remove(1, a);
    q.check();
    assert_eq!(q.work_at_or_above(0), 107);
    q.pop();
    assert_eq!(q.work_at_or_above(0), 100);
    q.check();
}

proptest::proptest! {
    /// The lists against a model: one user, packages in submission order, each a deque;
    /// pushes at both ends, exact removals and pops in any order, `check` after each; the
    /// packages' entries stored densely or in a hash map.
    #[test]
    fn lists_follow_a_model_of_deques(
        dense in proptest::bool::ANY,
        ops in proptest::collection::vec((0u8..4, 0u64..6, 0usize..64), 1..300)
    ) {
        let mut q = if dense { ReadyQueue::dense() } else { ReadyQueue::default() };
        let mut model: BTreeMap<u64, VecDeque<(u64, u64)>> = BTreeMap::new();
        let mut next = 0;
        for (op, slot, pick) in ops {
            let k = key(0, 1, u64::MAX, slot);
            match op {
                0 | 1 => {
                    next += 1;
                    let t = TaskId(next);
                    let entries = model.entry(slot).or_default();
                    if op == 0 {
                        entries.push_back((q.push_back(slot, k, 1, t), next));
                    } else {
                        entries.push_front((q.push_front(slot, k, 1, t), next));
                    }
                }
                2 => {
                    let all: Vec<(u64, usize)> = model
                        .iter()
                        .flat_map(|(&s, d)| (0..d.len()).map(move |i| (s, i)))
                        .collect();
                    if let Some(&(s, i)) = all.get(pick % all.len().max(1)) {
                        let (pos, _) = model.get_mut(&s).unwrap().remove(i).unwrap();
                        q.remove(s, pos);
                    }
                }
                _ => {
                    let want = model
                        .iter_mut()
                        .find(|(_, d)| !d.is_empty())
                        .map(|(&s, d)| (d.pop_front().unwrap().1, s));
                    proptest::prop_assert_eq!(q.pop().map(|(t, s)| (t.0, s)), want);
                }
            }
            model.retain(|_, d| !d.is_empty());
            q.check();
            let len: usize = model.values().map(VecDeque::len).sum();
            proptest::prop_assert_eq!(q.len(), len);
            let mut listed: Vec<(u64, u64)> =
                q.iter().map(|(s, _, _, t)| (s, t.0)).collect();
            listed.sort_unstable();
            let mut expected: Vec<(u64, u64)> = model
                .iter()
                .flat_map(|(&s, d)| d.iter().map(move |&(_, t)| (s, t)))
                .collect();
            expected.sort_unstable();
            proptest::prop_assert_eq!(listed, expected);
        }
    }
}

#[test]
#[should_panic(expected = "not queued")]
fn removing_from_an_unqueued_package_panics() {
    ReadyQueue::default().remove(9, 0);
}

proptest::proptest! {
    /// Queues sharing one store (the core's and its resource classes'): three [`Queue`]s on
    /// one store, each package in one of them (`slot % 3`), against three [`ReadyQueue`]s with
    /// a store each doing the same operations (priorities, users and deadlines mixed): the
    /// same pops, the same entries, each queue's own check and the store's check of their sums
    /// after each operation, the store's entries and nodes exactly the queues'.
    #[test]
    fn queues_sharing_a_store_behave_as_queues_with_their_own(
        dense in proptest::bool::ANY,
        ops in proptest::collection::vec((0u8..4, 0u64..12, 0usize..64), 1..300)
    ) {
        let mut store = if dense { QueueStore::dense() } else { QueueStore::default() };
        let mut shared: Vec<Queue> = (0..3).map(|_| Queue::default()).collect();
        let mut alone: Vec<ReadyQueue> = (0..3).map(|_| ReadyQueue::default()).collect();
        // Queued tasks: (slot, task, position in the shared store, position in its own).
        let mut queued: Vec<(u64, u64, u64, u64)> = Vec::new();
        let mut next = 0;
        for (op, slot, pick) in ops {
            let k = key((slot % 2) as i32, slot % 4, if slot < 6 { 1000 - slot } else { u64::MAX }, slot);
            let i = (slot % 3) as usize;
            match op {
                0 | 1 => {
                    next += 1;
                    let t = TaskId(next);
                    let (a, b) = if op == 0 {
                        (shared[i].push_back(&mut store, slot, k, 2, t), alone[i].push_back(slot, k, 2, t))
                    } else {
                        (shared[i].push_front(&mut store, slot, k, 2, t), alone[i].push_front(slot, k, 2, t))
                    };
                    queued.push((slot, next, a, b));
                }
                2 => {
                    if !queued.is_empty() {
                        let (s, _, a, b) = queued.swap_remove(pick % queued.len());
                        let i = (s % 3) as usize;
                        shared[i].remove(&mut store, s, a);
                        alone[i].remove(s, b);
                    }
                }
                _ => {
                    let i = pick % 3;
                    let got = shared[i].pop(&mut store);
                    proptest::prop_assert_eq!(got, alone[i].pop());
                    if let Some((t, _)) = got {
                        queued.retain(|e| e.1 != t.0);
                    }
                }
            }
            let mut linked = Linked::default();
            for (q, r) in shared.iter().zip(&alone) {
                linked += q.check(&store);
                r.check();
                proptest::prop_assert_eq!(q.len(), r.len());
                proptest::prop_assert_eq!(q.top_priority(), r.top_priority());
                proptest::prop_assert_eq!(q.peek(&store), r.peek());
                let mut a: Vec<(u64, u64)> = q.iter(&store).map(|(s, _, _, t)| (s, t.0)).collect();
                let mut b: Vec<(u64, u64)> = r.iter().map(|(s, _, _, t)| (s, t.0)).collect();
                a.sort_unstable();
                b.sort_unstable();
                proptest::prop_assert_eq!(a, b);
            }
            store.check(linked);
            proptest::prop_assert_eq!(linked.nodes, queued.len());
        }
    }
}

#[test]
#[should_panic(expected = "nodes outside every list")]
fn a_store_with_an_entry_of_no_queue_fails_its_check() {
    let mut store = QueueStore::default();
    let (mut a, mut b) = (Queue::default(), Queue::default());
    a.push_back(&mut store, 1, key(0, 1, u64::MAX, 1), 0, TaskId(1));
    b.push_back(&mut store, 2, key(0, 1, u64::MAX, 2), 0, TaskId(2));
    // Queue `b` left out of the walk: its entry is nobody's.
    store.check(a.check(&store));
}
