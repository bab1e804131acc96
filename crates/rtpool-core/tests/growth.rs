//! A growing state takes no fresh memory per task: after `Core::prepare` (what the master calls
//! between events), a submission of 100 tasks that makes every structure grow allocates
//! nothing: not its tasks' queue entries, its user's package order, id lists or hash-map
//! room. Fresh memory is what costs a first-touch page fault inside an operation (issue 17's
//! 100 us bar), so the test counts the bytes allocated inside `Core::handle`.
//!
//! Allocations are counted by a global allocator, per thread, only while a flag is set (the
//! test harness's own threads do not disturb it).

// Implementing `GlobalAlloc` is unsafe by definition (as in rtpool-proto/tests/hostile.rs): the
// impl only forwards to the system allocator and adds up sizes.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use rtpool_core::{ClientId, Core, Event, FnHash, Instant, PackageId, PackageOpts, UserId};

/// Forwards to [`System`] and adds up, per thread, the bytes allocated while counting.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static BYTES: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown find the slots gone; they are not ours.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = BYTES.try_with(|b| b.set(b.get() + size));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; counting touches const-initialized thread locals, which never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated on this thread by `f`.
fn allocated_by(f: impl FnOnce()) -> usize {
    BYTES.with(|b| b.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    BYTES.with(Cell::get)
}

/// A submission of `tasks` tasks of user 1's function, as package `id`.
fn submit(id: u64, tasks: usize) -> Event {
    Event::Submit {
        client: ClientId(1),
        req_id: id,
        package: PackageId(id),
        fn_hash: FnHash([1; 32]),
        fn_code: Bytes::from_static(b"def f(x): return x"),
        opts: PackageOpts::default(),
        tasks: vec![Bytes::from_static(b"args"); tasks],
    }
}

#[test]
fn a_growing_submission_after_prepare_allocates_nothing_per_task() {
    let mut core = Core::default();
    let mut out = Vec::with_capacity(16);
    core.handle(
        Event::ClientJoined {
            client: ClientId(1),
            user: UserId(1),
        },
        Instant(0),
        &mut out,
    );
    // No worker: every task stays queued, so every submission grows the state. 300 packages
    // first, so the per-package maps are past the size below which they are left to grow alone.
    let mut id = 0;
    let mut now = 0;
    let mut step = |core: &mut Core, out: &mut Vec<_>| {
        id += 1;
        now += 1_000;
        let event = submit(id, 100);
        out.clear();
        let bytes = allocated_by(|| core.handle(event, Instant(now), out));
        assert!(
            matches!(out.first(), Some(rtpool_core::Action::Accepted { .. })),
            "accepted: {out:?}"
        );
        while core.prepare(Core::PREPARE_SLOTS) {}
        bytes
    };
    for _ in 0..300 {
        step(&mut core, &mut out);
    }
    // 200 more (20,000 tasks: the task table, queue nodes and package ids grow through their
    // chunks and resizes), each measured.
    let per_call: Vec<usize> = (0..200).map(|_| step(&mut core, &mut out)).collect();
    let total: usize = per_call.iter().sum();
    let worst = per_call.iter().copied().max().unwrap_or(0);
    assert_eq!(core.stats().queued, 500 * 100);
    // Nothing at all: every structure the growth touches (task and package tables, queue
    // nodes, the users' package orders, id buffers, hash-map room, the chunk lists) was made
    // ahead by `prepare`. Before the package orders moved into a slab (a `BTreeMap` per user),
    // a B-tree node every ~11 packages was left (up to 656 bytes a call); before the queue's
    // lists, each call allocated its tasks' queue entries, two lists of 100 ids and hash-map
    // room: several kilobytes every call.
    assert!(
        worst == 0 && total == 0,
        "growing submissions allocated {total} bytes, at most {worst} a call (per call: {per_call:?})"
    );
}
