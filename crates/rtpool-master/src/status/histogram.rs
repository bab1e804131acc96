//! Histograms that cost a few instructions to update on the scheduler thread: [`Histogram`]
//! (log-linear buckets, for percentiles) and [`Buckets`] (fixed bounds, for Prometheus).
//! Plain integers, no atomics and no allocation on record: they live in the scheduler task
//! and are copied out once a second.

use super::schema::{Bucket, HistogramStatus, Percentiles};

/// Sub-buckets per power of two: each bucket is at most 1/8 of its value wide.
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Values below this each have a bucket of their own.
const LINEAR: u64 = 2 * SUB as u64;
/// Buckets: the linear ones, then `SUB` per power of two up to 2^63.
pub const FINE_BUCKETS: usize = LINEAR as usize + (64 - SUB_BITS as usize - 1) * SUB;

/// A histogram of microsecond values with buckets 1/8 of a power of two wide.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; FINE_BUCKETS]>,
    count: u64,
    max: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Box::new([0; FINE_BUCKETS]),
            count: 0,
            max: 0,
        }
    }
}

/// The bucket of `v`.
fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let sub = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
    LINEAR as usize + (exp - SUB_BITS - 1) as usize * SUB + sub
}

/// The largest value of bucket `i`.
fn upper(i: usize) -> u64 {
    if i < LINEAR as usize {
        return i as u64;
    }
    let k = i - LINEAR as usize;
    let exp = (k / SUB) as u32 + SUB_BITS + 1;
    let sub = (k % SUB) as u64;
    let low = (SUB as u64 + sub) << (exp - SUB_BITS);
    low.saturating_add((1u64 << (exp - SUB_BITS)) - 1)
}

impl Histogram {
    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.count += 1;
        self.max = self.max.max(v);
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The percentiles of what was recorded since `earlier` (a copy of this histogram taken
    /// before), or since start when `earlier` is `None`. `max_us` is the largest value since
    /// start.
    pub fn percentiles_since(&self, earlier: Option<&Histogram>) -> Percentiles {
        let base = |i: usize| earlier.map_or(0, |e| e.counts[i]);
        let count = self.count - earlier.map_or(0, |e| e.count);
        let at = |q: f64| -> u64 {
            if count == 0 {
                return 0;
            }
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for i in 0..FINE_BUCKETS {
                seen += self.counts[i] - base(i);
                if seen >= rank {
                    return upper(i).min(self.max);
                }
            }
            self.max
        };
        Percentiles {
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: self.max,
            count,
        }
    }
}

/// A histogram with fixed upper bounds (microseconds), plus an overflow bucket: what
/// Prometheus histograms are made of.
#[derive(Debug, Clone)]
pub struct Buckets {
    bounds_us: &'static [u64],
    /// One count per bound, then the overflow bucket.
    counts: Vec<u64>,
    sum_us: u64,
}

/// Bounds of the latency histograms, microseconds: 100 µs to 60 s.
pub const LATENCY_BOUNDS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// Bounds of the fsync histogram, microseconds: 50 µs to 1 s.
pub const FSYNC_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

impl Buckets {
    /// Empty, with these upper bounds (ascending).
    pub fn new(bounds_us: &'static [u64]) -> Self {
        Self {
            bounds_us,
            counts: vec![0; bounds_us.len() + 1],
            sum_us: 0,
        }
    }

    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let i = self.bounds_us.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum_us = self.sum_us.saturating_add(v);
    }

    /// Sum of the values, microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us
    }

    /// As a snapshot's histogram.
    pub fn to_status(&self) -> HistogramStatus {
        HistogramStatus {
            buckets: self.to_buckets(),
            count: self.counts.iter().sum(),
            sum_s: self.sum_us as f64 / 1e6,
        }
    }

    /// The buckets, each with its own count (not cumulative); the last has no bound.
    pub fn to_buckets(&self) -> Vec<Bucket> {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &count)| Bucket {
                le_s: self.bounds_us.get(i).map(|b| *b as f64 / 1e6),
                count,
            })
            .collect()
    }
}

/// [`Buckets`] for a thread other than the reader's (the journal's writer): relaxed atomic
/// adds on record, read as a plain copy.
#[derive(Debug)]
pub struct AtomicBuckets {
    bounds_us: &'static [u64],
    counts: Vec<std::sync::atomic::AtomicU64>,
    sum_us: std::sync::atomic::AtomicU64,
    max_us: std::sync::atomic::AtomicU64,
}

impl AtomicBuckets {
    /// Empty, with these upper bounds (ascending).
    pub fn new(bounds_us: &'static [u64]) -> Self {
        Self {
            bounds_us,
            counts: (0..=bounds_us.len()).map(|_| Default::default()).collect(),
            sum_us: Default::default(),
            max_us: Default::default(),
        }
    }

    /// Counts one value.
    pub fn record(&self, v: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let i = self.bounds_us.partition_point(|b| *b < v);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(v, Relaxed);
        self.max_us.fetch_max(v, Relaxed);
    }

    /// A copy: each bucket's own count (one per bound, then the overflow), the sum and the
    /// largest value.
    pub fn read(&self) -> FsyncCounts {
        use std::sync::atomic::Ordering::Relaxed;
        FsyncCounts {
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
            max_us: self.max_us.load(Relaxed),
        }
    }
}

/// A copy of an [`AtomicBuckets`] with the [`FSYNC_BOUNDS_US`] bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsyncCounts {
    /// Each bucket's own count: one per bound, then the overflow.
    pub counts: Vec<u64>,
    /// Sum of the values, microseconds.
    pub sum_us: u64,
    /// Largest value, microseconds.
    pub max_us: u64,
}

impl FsyncCounts {
    /// As a snapshot's histogram.
    pub fn to_status(&self) -> HistogramStatus {
        HistogramStatus {
            buckets: self.to_buckets(),
            count: self.counts.iter().sum(),
            sum_s: self.sum_us as f64 / 1e6,
        }
    }

    /// The buckets with their bounds, in seconds.
    pub fn to_buckets(&self) -> Vec<Bucket> {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &count)| Bucket {
                le_s: FSYNC_BOUNDS_US.get(i).map(|b| *b as f64 / 1e6),
                count,
            })
            .collect()
    }

    /// Approximate percentiles: each is its bucket's upper bound (the largest value for the
    /// last bucket).
    pub fn percentiles(&self) -> Percentiles {
        let count: u64 = self.counts.iter().sum();
        let at = |q: f64| -> u64 {
            if count == 0 {
                return 0;
            }
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for (i, c) in self.counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return FSYNC_BOUNDS_US
                        .get(i)
                        .copied()
                        .unwrap_or(self.max_us)
                        .min(self.max_us);
                }
            }
            self.max_us
        };
        Percentiles {
            p50_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: self.max_us,
            count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_bounds_hold_it() {
        let mut prev_upper = None;
        for i in 0..FINE_BUCKETS {
            let up = upper(i);
            if let Some(p) = prev_upper {
                assert!(up > p, "bucket {i}");
                assert_eq!(index(p + 1), i, "first value of bucket {i}");
            }
            assert_eq!(index(up), i, "last value of bucket {i}");
            prev_upper = Some(up);
        }
        assert_eq!(upper(FINE_BUCKETS - 1), u64::MAX);
        for v in [0, 1, 15, 16, 17, 100, 1_000, 123_456, u64::MAX / 3] {
            let up = upper(index(v));
            assert!(
                up >= v && (up - v) as f64 <= v as f64 / 8.0 + 1.0,
                "{v} -> {up}"
            );
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v);
        }
        let p = h.percentiles_since(None);
        assert_eq!((p.count, p.max_us), (1000, 1000));
        assert!((500..=560).contains(&p.p50_us), "{p:?}");
        assert!((990..=1000).contains(&p.p99_us), "{p:?}");
        assert_eq!(p.p999_us, 1000);
        let earlier = h.clone();
        for _ in 0..10 {
            h.record(5_000);
        }
        let recent = h.percentiles_since(Some(&earlier));
        assert_eq!(recent.count, 10);
        assert!((5_000..=5_625).contains(&recent.p50_us), "{recent:?}");
        assert_eq!(Histogram::default().percentiles_since(None).p99_us, 0);
    }

    #[test]
    fn buckets_count_each_value_once_under_its_bound() {
        let mut b = Buckets::new(&[10, 100]);
        for v in [0, 10, 11, 100, 101, 5_000] {
            b.record(v);
        }
        let got: Vec<u64> = b.to_buckets().iter().map(|b| b.count).collect();
        assert_eq!(got, vec![2, 2, 2]);
        assert_eq!(b.to_buckets()[2].le_s, None);
        assert_eq!(b.to_buckets()[0].le_s, Some(10e-6));
        assert_eq!(b.sum_us(), 5_222);
    }
}
