//! The queue between the [`super::Journal`] handle and its writer thread: bounded, and handed
//! over whole.
//!
//! This module owns LSN assignment (under the queue's lock, so LSNs reach the writer in order),
//! the bound on what waits to be written ([`MAX_QUEUED_BYTES`]) and the wake-ups on both sides.
//! What the writer does with what it takes is `thread.rs`'s.
//!
//! Appending is a lock, a push and, only when the writer sleeps, a wake-up: no allocation per
//! record and no system call while the writer is busy. The writer takes every queued command
//! with one swap, so a burst of appends costs it one lock however long it is (group commit).
//! When the estimated bytes queued pass the bound, [`Queue::append`] waits until the writer
//! has taken them: the master's one thread then stops reading from its peers, which is the
//! backpressure (TCP's windows fill) instead of memory growing without bound while the disk is
//! slower than the scheduler.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::record::Record;
use super::shared::Shared;
use super::JournalError;

/// Most bytes (estimated, see [`approx_bytes`]) of records that wait for the writer thread
/// before [`Queue::append`] waits for room: 16 MiB, about 70,000 results of small tasks
/// (each takes a ~200-byte slot), a few tens of milliseconds of the writer's work.
pub(super) const MAX_QUEUED_BYTES: usize = 16 << 20;

/// What the handle sends the writer thread.
// Nearly every command is an `Append`: boxing its record would allocate once per record to
// shrink the rare `Compact`.
#[allow(clippy::large_enum_variant)]
pub(super) enum Cmd {
    /// Write this record with this LSN.
    Append(u64, Record),
    /// Compact (in the background) and answer once the compacted file is in place.
    Compact(mpsc::Sender<Result<(), JournalError>>),
}

/// What [`Queue::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Commands were moved into the caller's vector.
    Some,
    /// The timeout passed with nothing queued.
    Timeout,
    /// The handle closed and nothing is left.
    Closed,
}

/// The queue proper, under [`Queue`]'s lock.
struct State {
    next_lsn: u64,
    cmds: Vec<Cmd>,
    /// Estimated bytes of the records in `cmds`.
    bytes: usize,
    /// No more commands are accepted (closed, or the writer stopped).
    closed: bool,
    /// The writer waits on `work`: an append must wake it.
    writer_waiting: bool,
    /// Appenders waiting on `room`.
    appenders_waiting: usize,
}

/// The handle's and the writer's shared queue.
pub(super) struct Queue {
    state: Mutex<State>,
    /// The writer waits here for commands.
    work: Condvar,
    /// Appenders wait here for room.
    room: Condvar,
}

impl Queue {
    /// An empty queue whose first LSN is `next_lsn`.
    pub(super) fn new(next_lsn: u64) -> Self {
        Queue {
            state: Mutex::new(State {
                next_lsn,
                cmds: Vec::new(),
                bytes: 0,
                closed: false,
                writer_waiting: false,
                appenders_waiting: 0,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Assigns `rec` the next LSN and queues it, first waiting while the queue is over
    /// [`MAX_QUEUED_BYTES`] (counted in `shared`). Returns the LSN, and whether the record was
    /// queued (not after close or a fatal error).
    pub(super) fn append(&self, rec: Record, shared: &Shared) -> (u64, bool) {
        let bytes = approx_bytes(&rec);
        let mut s = self.lock();
        if s.bytes > MAX_QUEUED_BYTES && !s.closed {
            let started = Instant::now();
            shared.backpressure_waits.fetch_add(1, Relaxed);
            // A lingering writer is not waiting for a wake-up: give it one.
            self.work.notify_one();
            s.appenders_waiting += 1;
            while s.bytes > MAX_QUEUED_BYTES && !s.closed {
                s = self.room.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            s.appenders_waiting -= 1;
            let waited = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            shared.backpressure_us.fetch_add(waited, Relaxed);
        }
        let lsn = s.next_lsn;
        s.next_lsn += 1;
        if s.closed {
            return (lsn, false);
        }
        s.cmds.push(Cmd::Append(lsn, rec));
        s.bytes += bytes;
        shared.queued_bytes.store(s.bytes as u64, Relaxed);
        if s.writer_waiting {
            s.writer_waiting = false;
            self.work.notify_one();
        }
        (lsn, true)
    }

    /// Queues a compaction request; false when closed.
    pub(super) fn compact(&self, ack: mpsc::Sender<Result<(), JournalError>>) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        s.cmds.push(Cmd::Compact(ack));
        self.work.notify_one();
        true
    }

    /// The highest LSN assigned so far.
    pub(super) fn last_lsn(&self) -> u64 {
        self.lock().next_lsn - 1
    }

    /// Whether [`Queue::close`] was called (or the writer stopped).
    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Accepts no more commands; the writer drains what is queued, then ends. Appenders
    /// waiting for room go on (their records are dropped).
    pub(super) fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        self.work.notify_all();
        self.room.notify_all();
    }

    /// Moves every queued command into `into` (empty on entry), waiting up to `timeout` (or
    /// for ever) for one.
    ///
    /// With `linger`, it first waits up to that long without asking appenders to wake it (a
    /// busy writer then costs the appending thread no system call: it finds the next batch
    /// by its own timer), then as above.
    pub(super) fn take(
        &self,
        into: &mut Vec<Cmd>,
        timeout: Option<Duration>,
        linger: Option<Duration>,
        shared: &Shared,
    ) -> Taken {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.lock();
        if let Some(linger) = linger.filter(|_| s.cmds.is_empty() && !s.closed) {
            let linger = deadline.map_or(linger, |at| {
                linger.min(at.saturating_duration_since(Instant::now()))
            });
            s = self
                .work
                .wait_timeout(s, linger)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        while s.cmds.is_empty() {
            if s.closed {
                return Taken::Closed;
            }
            s.writer_waiting = true;
            s = match deadline {
                None => self.work.wait(s).unwrap_or_else(PoisonError::into_inner),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        s.writer_waiting = false;
                        return Taken::Timeout;
                    }
                    self.work
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        s.writer_waiting = false;
        std::mem::swap(&mut s.cmds, into);
        s.bytes = 0;
        shared.queued_bytes.store(0, Relaxed);
        if s.appenders_waiting > 0 {
            self.room.notify_all();
        }
        Taken::Some
    }
}

/// What a record costs in memory while queued, roughly: its variable parts plus its slot in
/// the queue's vector and the headers of its allocations.
fn approx_bytes(rec: &Record) -> usize {
    const OVERHEAD: usize = std::mem::size_of::<Cmd>() + 32;
    OVERHEAD
        + match rec {
            Record::Package(p) => {
                p.user.len() + p.fn_code.len() + p.tasks.iter().map(|t| t.len() + 32).sum::<usize>()
            }
            Record::Done(d) => d.data.len(),
            Record::Delivered { indices, .. } => indices.len() * 4,
            Record::End { .. } => 0,
            Record::Charge { user, .. } => user.len(),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn end(package: u64) -> Record {
        Record::End { package }
    }

    #[test]
    fn lsns_are_consecutive_and_take_hands_over_everything() {
        let q = Queue::new(7);
        let shared = Shared::default();
        assert_eq!(q.append(end(1), &shared), (7, true));
        assert_eq!(q.append(end(2), &shared), (8, true));
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, None, None, &shared), Taken::Some);
        let lsns: Vec<u64> = got
            .iter()
            .map(|c| match c {
                Cmd::Append(lsn, _) => *lsn,
                Cmd::Compact(_) => 0,
            })
            .collect();
        assert_eq!(lsns, [7, 8]);
        got.clear();
        let timeout = Some(Duration::from_millis(1));
        assert_eq!(q.take(&mut got, timeout, None, &shared), Taken::Timeout);
        q.close();
        assert_eq!(q.append(end(3), &shared), (9, false));
        assert_eq!(q.take(&mut got, None, None, &shared), Taken::Closed);
        assert_eq!(q.last_lsn(), 9);
    }

    #[test]
    fn a_full_queue_makes_the_appender_wait_until_the_writer_takes() {
        let q = Arc::new(Queue::new(1));
        let shared = Arc::new(Shared::default());
        let big = |package| {
            Record::Package(crate::journal::PackageRecord {
                package,
                user: String::new(),
                fn_hash: [0; 32],
                fn_code: bytes::Bytes::from(vec![0u8; MAX_QUEUED_BYTES / 2]),
                tasks: Vec::new(),
                opts: Default::default(),
            })
        };
        // Three halves: the third append finds the queue over its bound.
        q.append(big(1), &shared);
        q.append(big(2), &shared);
        assert_eq!(shared.backpressure_waits.load(Relaxed), 0);
        let appender = {
            let (q, shared) = (q.clone(), shared.clone());
            std::thread::spawn(move || q.append(big(3), &shared))
        };
        // The appender must be blocked until the take below: wait (bounded) until it counts
        // its wait, then check it has not returned.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.backpressure_waits.load(Relaxed) == 0 {
            assert!(Instant::now() < deadline, "the appender never waited");
            std::thread::yield_now();
        }
        assert!(!appender.is_finished());
        let mut got = Vec::new();
        assert_eq!(q.take(&mut got, None, None, &shared), Taken::Some);
        assert_eq!(got.len(), 2);
        assert_eq!(appender.join().unwrap(), (3, true));
        got.clear();
        assert_eq!(q.take(&mut got, None, None, &shared), Taken::Some);
        assert_eq!(got.len(), 1);
    }
}
