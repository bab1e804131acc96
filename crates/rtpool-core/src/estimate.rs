//! [`Estimator`]: a running estimate of one function's execution time, learned from the
//! execution times workers report.
//!
//! A histogram of fixed log-spaced buckets (four per octave, so a quantile is known within
//! 19 %) from 1 us to about 12 days. When it has counted [`WINDOW`] samples every count and the
//! sum are halved, so the estimate follows a function whose cost changes, with older samples
//! weighing less. Adding a sample is O(1); a quantile walks the fixed bucket array, O(1) in the
//! size of the state (and cached until the next sample).
//!
//! Beside the histogram, each function keeps the **pace** of the workers that ran it (at most
//! [`MAX_PACES`], the least recently heard from replaced first): a smoothed mean and mean
//! deviation per worker, like TCP's round-trip estimator. A pace is kept under the worker's
//! [`WorkerKey`], not its connection: a supervised worker whose process is replaced after an
//! abort (the usual fate of a straggler's losing copy) reconnects as the same key and is still
//! known for what it is. Hedging judges a running task against the fastest pace
//! ([`Estimator::fast_p95`]), so a slow worker that runs half the tasks cannot teach the master
//! that slow is normal. A pace learns from every successful run, also from a copy that lost its
//! race: that copy is what its worker takes.

/// Buckets per doubling of the execution time.
const PER_OCTAVE: u32 = 4;
/// Buckets: 40 octaves cover 1 us to 2^40 us (about 12.7 days).
const BUCKETS: usize = 40 * PER_OCTAVE as usize;
/// Samples counted before the counts are halved.
const WINDOW: u32 = 1024;
/// Workers whose pace one function remembers.
pub(crate) const MAX_PACES: usize = 32;
/// Weight of a new sample in a pace's smoothed mean and deviation: 1/8 (as TCP's SRTT).
const PACE_SHIFT: u32 = 3;

use crate::ids::WorkerKey;

/// How fast one worker runs one function: smoothed mean and mean deviation, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    /// The worker, by its stable key.
    pub(crate) worker: WorkerKey,
    /// Smoothed execution time, microseconds.
    pub(crate) mean_us: u64,
    /// Smoothed mean deviation from `mean_us`, microseconds.
    pub(crate) dev_us: u64,
    /// Results learned from.
    pub(crate) samples: u32,
    /// The function's pace clock at this worker's last result (for replacement).
    last_seen: u64,
}

impl Pace {
    /// A high percentile of this worker's time: mean + 2 deviations (about the p95 of a
    /// normal spread), microseconds.
    pub(crate) fn p95_us(&self) -> u64 {
        self.mean_us.saturating_add(self.dev_us.saturating_mul(2))
    }

    fn add(&mut self, us: u64) {
        if self.samples == 0 {
            self.mean_us = us;
            self.dev_us = us / 2;
        } else {
            let dev = us.abs_diff(self.mean_us);
            // x += (sample - x) / 8, in integers and without going negative.
            self.mean_us = self.mean_us - (self.mean_us >> PACE_SHIFT) + (us >> PACE_SHIFT);
            self.dev_us = self.dev_us - (self.dev_us >> PACE_SHIFT) + (dev >> PACE_SHIFT);
        }
        self.samples = self.samples.saturating_add(1);
    }
}

/// What the core knows of a function's execution time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Results it was learned from (all of them, not only the current window).
    pub samples: u64,
    /// Mean of the current window, microseconds.
    pub mean_us: u64,
    /// Median, microseconds (a bucket's upper bound, at most the largest sample).
    pub p50_us: u64,
    /// 95th percentile, microseconds (likewise).
    pub p95_us: u64,
}

/// The running histogram of one function.
#[derive(Debug, Clone)]
pub(crate) struct Estimator {
    counts: Box<[u32; BUCKETS]>,
    /// Samples in the window (sum of `counts`).
    window: u32,
    /// Sum of the window's samples, halved with the counts.
    sum_us: u64,
    /// Largest sample ever seen: caps a quantile, which is otherwise a bucket's upper bound.
    max_us: u64,
    samples: u64,
    /// The estimate as of the last sample, computed on demand.
    cached: Option<Estimate>,
    /// The pace of the workers that ran it (at most [`MAX_PACES`]).
    paces: Vec<Pace>,
    /// Runs counted by [`Estimator::add_pace`]: orders the paces by their last result.
    pace_clock: u64,
}

impl Default for Estimator {
    fn default() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            window: 0,
            sum_us: 0,
            max_us: 0,
            samples: 0,
            cached: None,
            paces: Vec::new(),
            pace_clock: 0,
        }
    }
}

/// The bucket of a duration: `floor(log2(us) * PER_OCTAVE)`, by the leading bit and the two
/// bits after it.
fn bucket(us: u64) -> usize {
    let us = us.max(1);
    let octave = 63 - us.leading_zeros();
    // The two bits below the leading one pick the quarter octave, roughly (linear within it).
    let frac = if octave >= 2 {
        (us >> (octave - 2)) & 0b11
    } else {
        (us << (2 - octave)) & 0b11
    };
    ((octave * PER_OCTAVE) as usize + frac as usize).min(BUCKETS - 1)
}

/// The upper bound (exclusive) of a bucket, microseconds.
fn upper(bucket: usize) -> u64 {
    let octave = bucket as u32 / PER_OCTAVE;
    let frac = bucket as u64 % u64::from(PER_OCTAVE);
    let base = 1u64 << octave;
    // Quarter steps of the octave: base * (4 + frac + 1) / 4.
    (base * (4 + frac + 1)).div_ceil(4)
}

impl Estimator {
    /// Counts one execution time.
    pub(crate) fn add(&mut self, us: u64) {
        if self.window >= WINDOW {
            for c in self.counts.iter_mut() {
                *c /= 2;
            }
            self.window = self.counts.iter().sum();
            self.sum_us /= 2;
        }
        self.counts[bucket(us)] += 1;
        self.window += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.max_us = self.max_us.max(us);
        self.samples += 1;
        self.cached = None;
    }

    /// Counts one successful run on `worker` in that worker's pace only (the histogram
    /// describes the runs whose answers counted; see [`Estimator::add`]). O([`MAX_PACES`]).
    pub(crate) fn add_pace(&mut self, worker: WorkerKey, us: u64) {
        self.pace_clock += 1;
        let seen = self.pace_clock;
        let i = match self.paces.iter().position(|p| p.worker == worker) {
            Some(i) => i,
            None if self.paces.len() < MAX_PACES => {
                self.paces.push(Pace {
                    worker,
                    mean_us: 0,
                    dev_us: 0,
                    samples: 0,
                    last_seen: 0,
                });
                self.paces.len() - 1
            }
            None => {
                let (i, _) = self
                    .paces
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, p)| p.last_seen)
                    .expect("MAX_PACES > 0");
                self.paces[i] = Pace {
                    worker,
                    mean_us: 0,
                    dev_us: 0,
                    samples: 0,
                    last_seen: 0,
                };
                i
            }
        };
        let pace = &mut self.paces[i];
        pace.add(us);
        pace.last_seen = seen;
    }

    /// A run on `worker` that was aborted after `us` because another copy won: it would have
    /// taken at least that long. Counted as `us` or the worker's mean, whichever is larger, so
    /// a straggler whose copies are killed (never answering) still gets a known pace.
    pub(crate) fn add_censored_pace(&mut self, worker: WorkerKey, us: u64) {
        let mean = self.pace(worker).map_or(0, |p| p.mean_us);
        self.add_pace(worker, us.max(mean));
    }

    /// The pace of `worker` on this function, if it has run it.
    pub(crate) fn pace(&self, worker: WorkerKey) -> Option<&Pace> {
        self.paces.iter().find(|p| p.worker == worker)
    }

    /// The p95 of the fastest pace among the keys `counts` accepts (connected ones) with
    /// at least `min_samples` results: what a healthy worker takes. None if no pace
    /// qualifies. O([`MAX_PACES`]).
    pub(crate) fn fast_p95(
        &self,
        min_samples: u32,
        counts: impl Fn(WorkerKey) -> bool,
    ) -> Option<u64> {
        self.paces
            .iter()
            .filter(|p| p.samples >= min_samples && counts(p.worker))
            .map(Pace::p95_us)
            .min()
    }

    /// Results learned from.
    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// The mean execution time, microseconds (0 with nothing learned), without touching the
    /// cache: O(1).
    pub(crate) fn mean_hint(&self) -> u64 {
        if self.window == 0 {
            0
        } else {
            self.sum_us / u64::from(self.window)
        }
    }

    /// The current estimate (`samples == 0`: nothing known).
    pub(crate) fn estimate(&mut self) -> Estimate {
        if let Some(e) = self.cached {
            return e;
        }
        let e = if self.window == 0 {
            Estimate::default()
        } else {
            Estimate {
                samples: self.samples,
                mean_us: self.sum_us / u64::from(self.window),
                p50_us: self.quantile(0.50),
                p95_us: self.quantile(0.95),
            }
        };
        self.cached = Some(e);
        e
    }

    /// The upper bound of the bucket holding the `q` quantile, capped by the largest sample.
    fn quantile(&self, q: f64) -> u64 {
        let rank = (f64::from(self.window) * q).ceil().max(1.0) as u32;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max_us).max(1);
            }
        }
        self.max_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_samples() {
        let mut last = 0;
        for us in [
            1u64,
            2,
            3,
            4,
            5,
            7,
            8,
            9,
            100,
            1_000,
            10_000,
            123_456,
            1 << 30,
        ] {
            let b = bucket(us);
            assert!(b >= last, "bucket({us}) = {b} < {last}");
            last = b;
            assert!(upper(b) > us, "upper({b}) = {} <= {us}", upper(b));
            assert!(
                upper(b) as f64 <= us as f64 * 1.26 + 1.0,
                "upper({b}) = {} too far above {us}",
                upper(b)
            );
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut e = Estimator::default();
        // 90 samples of 10 ms, 10 of 100 ms: p50 ~10 ms, p95 ~100 ms, mean 19 ms.
        for _ in 0..90 {
            e.add(10_000);
        }
        for _ in 0..10 {
            e.add(100_000);
        }
        let est = e.estimate();
        assert_eq!(est.samples, 100);
        assert_eq!(est.mean_us, 19_000);
        assert!((10_000..=12_500).contains(&est.p50_us), "{est:?}");
        assert!((100_000..=125_000).contains(&est.p95_us), "{est:?}");
    }

    #[test]
    fn old_samples_fade() {
        let mut e = Estimator::default();
        for _ in 0..WINDOW {
            e.add(1_000);
        }
        // Three halvings later, the old samples are an eighth of the window.
        for _ in 0..(3 * WINDOW) {
            e.add(50_000);
        }
        let est = e.estimate();
        assert!(est.p50_us >= 50_000, "{est:?}");
        assert_eq!(est.samples, u64::from(4 * WINDOW));
        assert!(e.window <= WINDOW + 1);
    }

    #[test]
    fn paces_tell_a_slow_worker_from_a_fast_one() {
        let mut e = Estimator::default();
        for _ in 0..10 {
            e.add_pace(WorkerKey(1), 20_000);
            e.add_pace(WorkerKey(2), 200_000);
        }
        assert_eq!(e.pace(WorkerKey(1)).map(|p| p.samples), Some(10));
        // The slow worker's pace converges on 200 ms; the fast one's is exactly 20 ms.
        assert_eq!(
            e.fast_p95(5, |_| true),
            Some(e.pace(WorkerKey(1)).unwrap().p95_us())
        );
        let fast = e.fast_p95(5, |_| true).unwrap();
        assert!((20_000..=30_000).contains(&fast), "{fast}");
        let slow = e.pace(WorkerKey(2)).unwrap().mean_us;
        assert!(slow >= 150_000, "{slow}");
        // A gone fast worker does not count; too few results do not either.
        assert!(e.fast_p95(5, |w| w == WorkerKey(2)).unwrap() >= 150_000);
        assert_eq!(e.fast_p95(11, |_| true), None);
    }

    #[test]
    fn paces_are_bounded_and_forget_the_least_recent_worker() {
        let mut e = Estimator::default();
        for w in 0..(MAX_PACES as u64 + 5) {
            e.add_pace(WorkerKey(w), 1_000);
        }
        assert_eq!(e.paces.len(), MAX_PACES);
        assert!(
            e.pace(WorkerKey(0)).is_none(),
            "the oldest worker was replaced"
        );
        assert!(e.pace(WorkerKey(MAX_PACES as u64 + 4)).is_some());
    }

    #[test]
    fn empty_estimator_knows_nothing() {
        assert_eq!(Estimator::default().estimate(), Estimate::default());
    }
}
