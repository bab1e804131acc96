//! [`OverloadWatch`]: whether deadlines are being missed because more work is offered than the
//! workers can do, judged over a sliding window of the latest deadline results.
//!
//! Every result of a task with a deadline is counted as met or missed (dropped counts as
//! missed) in one of [`SLICES`] slices of the window (`CoreConfig::overload_window_ns`). The
//! master is **overloaded** once the window holds at least [`MIN_RESULTS`] such results, at
//! least `overload_miss_ratio` of them missed, and tasks wait in the queue (work is offered
//! faster than it is taken: a function that is merely slower than its deadline, on idle
//! workers, is not overload). It stays so until the window's miss ratio falls under half the
//! threshold, or the window holds no deadline result at all (hysteresis, so the state does not
//! flap at the edge). Counting is O(1) per result; a query is O([`SLICES`]).
//!
//! The core only keeps the state; the master says so (a gauge, a rate-limited log line, and a
//! notice in `ACCEPTED` to a client whose deadline package it accepts while overloaded).

use crate::ids::Instant;

/// Slices of the window: the window slides by an eighth.
pub(crate) const SLICES: usize = 8;
/// Deadline results the window must hold before it can say "overloaded": a handful of late
/// results out of a few is noise, not overload.
pub const MIN_RESULTS: u64 = 20;

/// One slice of the window: its number (time / slice length) and its counts.
#[derive(Debug, Clone, Copy, Default)]
struct Slice {
    number: u64,
    met: u64,
    missed: u64,
}

/// What [`crate::Core::overload`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OverloadStatus {
    /// Deadlines are being missed because the workers cannot keep up (see the module docs).
    pub overloaded: bool,
    /// Deadline results in the window that came by their deadline.
    pub met: u64,
    /// Deadline results in the window that came after it, or were dropped.
    pub missed: u64,
    /// `missed / (met + missed)` in the window; 0 with no result.
    pub miss_ratio: f64,
    /// Tasks waiting in the queue now.
    pub queued: u64,
    /// Since when it is overloaded (core clock), if it is.
    pub since: Option<Instant>,
}

/// The sliding window and the overload state (see the module docs).
#[derive(Debug)]
pub(crate) struct OverloadWatch {
    slice_ns: u64,
    threshold: f64,
    slices: [Slice; SLICES],
    since: Option<Instant>,
}

impl OverloadWatch {
    /// A window of `window_ns` (at least 8 ns) judging overload at a miss ratio of `threshold`
    /// (0 < threshold <= 1; 0 or less: never overloaded).
    pub(crate) fn new(window_ns: u64, threshold: f64) -> Self {
        Self {
            slice_ns: (window_ns / SLICES as u64).max(1),
            threshold,
            slices: [Slice::default(); SLICES],
            since: None,
        }
    }

    /// Counts one deadline result at `now` (`missed`: late or dropped), with `queued` tasks
    /// waiting; returns true if this result made the master overloaded.
    pub(crate) fn record(&mut self, now: Instant, missed: bool, queued: usize) -> bool {
        if self.window(now) == (0, 0) {
            self.since = None; // a quiet window ended the last overload
        }
        let number = now.0 / self.slice_ns;
        let slice = &mut self.slices[(number % SLICES as u64) as usize];
        if slice.number != number {
            *slice = Slice {
                number,
                ..Slice::default()
            };
        }
        if missed {
            slice.missed += 1;
        } else {
            slice.met += 1;
        }
        let (met, late) = self.window(now);
        let ratio = ratio(met, late);
        match self.since {
            None if self.threshold > 0.0
                && met + late >= MIN_RESULTS
                && ratio >= self.threshold
                && queued > 0 =>
            {
                self.since = Some(now);
                true
            }
            Some(_) if ratio < self.threshold / 2.0 => {
                self.since = None;
                false
            }
            _ => false,
        }
    }

    /// Met and missed results of the window ending at `now`.
    fn window(&self, now: Instant) -> (u64, u64) {
        let current = now.0 / self.slice_ns;
        self.slices
            .iter()
            .filter(|s| s.number + (SLICES as u64) > current && s.number <= current)
            .fold((0, 0), |(m, l), s| (m + s.met, l + s.missed))
    }

    /// The state at `now` with `queued` tasks waiting.
    pub(crate) fn status(&self, now: Instant, queued: usize) -> OverloadStatus {
        let (met, missed) = self.window(now);
        // A window with no deadline result says nothing more: the overload is over.
        let since = self.since.filter(|_| met + missed > 0);
        OverloadStatus {
            overloaded: since.is_some(),
            met,
            missed,
            miss_ratio: ratio(met, missed),
            queued: queued as u64,
            since,
        }
    }
}

fn ratio(met: u64, missed: u64) -> f64 {
    if met + missed == 0 {
        0.0
    } else {
        missed as f64 / (met + missed) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn misses_with_a_backlog_make_overload_and_recovery_ends_it() {
        let mut w = OverloadWatch::new(1_000 * MS, 0.05);
        for i in 0..100 {
            assert!(!w.record(Instant(i * MS), false, 10), "all met");
        }
        // 5 % missed, but no backlog: slow, not overloaded.
        for i in 0..6 {
            assert!(!w.record(Instant((100 + i) * MS), true, 0));
        }
        assert!(!w.status(Instant(106 * MS), 0).overloaded);
        assert!(w.record(Instant(107 * MS), true, 3), "with a backlog it is");
        let s = w.status(Instant(108 * MS), 3);
        assert!(s.overloaded, "{s:?}");
        assert_eq!((s.met, s.missed), (100, 7));
        // Still above half the threshold: stays overloaded.
        assert!(!w.record(Instant(109 * MS), false, 0));
        assert!(w.status(Instant(109 * MS), 0).overloaded);
        // A second later the old results left the window; fresh met results end it.
        for i in 0..50 {
            w.record(Instant((1_200 + i) * MS), false, 0);
        }
        let s = w.status(Instant(1_250 * MS), 0);
        assert!(!s.overloaded, "{s:?}");
        assert_eq!(s.missed, 0);
    }

    #[test]
    fn a_few_misses_are_not_overload_and_an_empty_window_ends_it() {
        let mut w = OverloadWatch::new(1_000 * MS, 0.05);
        for i in 0..(MIN_RESULTS - 1) {
            assert!(!w.record(Instant(i * MS), true, 5), "too few results yet");
        }
        assert!(w.record(Instant(MIN_RESULTS * MS), true, 5));
        assert!(w.status(Instant(MIN_RESULTS * MS), 5).overloaded);
        // Nothing for two windows: the window is empty and the state reads not overloaded.
        assert!(!w.status(Instant(3_000 * MS), 5).overloaded);
    }

    #[test]
    fn a_zero_threshold_never_says_overloaded() {
        let mut w = OverloadWatch::new(1_000 * MS, 0.0);
        for i in 0..100 {
            assert!(!w.record(Instant(i * MS), true, 5));
        }
        assert!(!w.status(Instant(100 * MS), 5).overloaded);
    }
}
