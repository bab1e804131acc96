//! Placement of a call among the workers that serve its function: the policy of Ninf's
//! metaserver (server load and network throughput), as a pure function.
//!
//! ```text
//! score(w) = transfer(w, bytes) + wait(w) + exec x slowness(w)
//! transfer(w, b) = rtt(w) + b / throughput(w)
//! wait(w)        = max(exec, 1 ms) x max(0, in_flight(w) + 1 - slots(w)) / slots(w)
//! ```
//!
//! The lowest score wins; ties go to the earliest candidate (the caller rotates where the
//! candidates start, so ties go round robin). What is not known yet of a worker (its link, its
//! speed) takes the pool's value, so it neither wins nor loses on it.

/// What was learned of the link to one worker: moving averages of the round-trip overhead of
/// small payloads and of the throughput of large ones.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Link {
    /// Microseconds of overhead per assignment (transfer of a small payload both ways).
    pub(crate) rtt_us: Option<f64>,
    /// Bytes per microsecond (MB/s) of large payloads.
    pub(crate) bytes_per_us: Option<f64>,
}

/// Payloads at least this large measure throughput; smaller ones measure the round trip.
pub(crate) const LARGE_PAYLOAD: u64 = 64 * 1024;

/// Weight of a new sample in the moving averages.
const ALPHA: f64 = 0.2;

fn ewma(old: Option<f64>, sample: f64) -> f64 {
    old.map_or(sample, |o| o + ALPHA * (sample - o))
}

impl Link {
    /// Learns from one assignment: `bytes` moved (arguments, inputs, result) and the
    /// `overhead_us` of the master's assignment-to-result time the worker did not spend
    /// executing, waiting or batching.
    pub(crate) fn learn(&mut self, bytes: u64, overhead_us: u64) {
        if bytes < LARGE_PAYLOAD {
            self.rtt_us = Some(ewma(self.rtt_us, overhead_us as f64));
        } else {
            let moving_us = (overhead_us as f64 - self.rtt_us.unwrap_or(0.0)).max(1.0);
            self.bytes_per_us = Some(ewma(self.bytes_per_us, bytes as f64 / moving_us));
        }
    }

    /// Estimated microseconds to move `bytes`, with `pool` for what is unknown.
    pub(crate) fn transfer_us(&self, bytes: u64, pool: &Link) -> f64 {
        let rtt = self.rtt_us.or(pool.rtt_us).unwrap_or(0.0);
        let moving = match self.bytes_per_us.or(pool.bytes_per_us) {
            Some(bw) if bw > 0.0 => bytes as f64 / bw,
            _ => 0.0,
        };
        rtt + moving
    }
}

/// One worker that serves the function and has a free credit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Candidate {
    /// Tasks it runs at once.
    pub(crate) slots: u32,
    /// Tasks it holds now (running or waiting in its prefetch).
    pub(crate) in_flight: u32,
    /// Its link.
    pub(crate) link: Link,
    /// Its execution times over the functions' means (1.0: average; `None`: unknown).
    pub(crate) slowness: Option<f64>,
}

/// The least a call ahead in a worker's queue is assumed to take, microseconds: a function
/// not measured yet (or measured at microseconds) still makes a busy worker worse than an idle
/// one.
pub(crate) const MIN_WAIT_US: f64 = 1_000.0;

/// The estimated completion time of a call on `c`, microseconds.
pub(crate) fn score(c: &Candidate, bytes: u64, exec_us: f64, pool: &Link) -> f64 {
    let slots = f64::from(c.slots.max(1));
    let ahead = (f64::from(c.in_flight) + 1.0 - slots).max(0.0);
    let wait = exec_us.max(MIN_WAIT_US) * ahead / slots;
    let slowness = c.slowness.unwrap_or(1.0);
    c.link.transfer_us(bytes, pool) + wait + exec_us * slowness
}

/// Index of the best candidate (the first of equals), `None` if there is none.
pub(crate) fn choose(cands: &[Candidate], bytes: u64, exec_us: f64, pool: &Link) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in cands.iter().enumerate() {
        let s = score(c, bytes, exec_us, pool);
        match best {
            Some((_, b)) if s >= b => {}
            _ => best = Some((i, s)),
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(slots: u32) -> Candidate {
        Candidate {
            slots,
            in_flight: 0,
            link: Link::default(),
            slowness: None,
        }
    }

    const NO_POOL: Link = Link {
        rtt_us: None,
        bytes_per_us: None,
    };

    #[test]
    fn an_idle_worker_beats_a_busy_one() {
        let busy = Candidate {
            in_flight: 2,
            ..idle(2)
        };
        assert_eq!(choose(&[busy, idle(2)], 100, 1_000.0, &NO_POOL), Some(1));
        // A free slot left on the busy one: no wait, so equal, and the first wins.
        let half = Candidate {
            in_flight: 1,
            ..idle(2)
        };
        assert_eq!(choose(&[half, idle(2)], 100, 1_000.0, &NO_POOL), Some(0));
    }

    #[test]
    fn a_busy_worker_loses_even_when_the_function_is_not_measured() {
        let busy = Candidate {
            in_flight: 1,
            ..idle(1)
        };
        assert_eq!(choose(&[busy, idle(1)], 100, 0.0, &NO_POOL), Some(1));
    }

    #[test]
    fn large_arguments_go_to_the_fast_link() {
        let slow_link = Candidate {
            link: Link {
                rtt_us: Some(100.0),
                bytes_per_us: Some(10.0), // 10 MB/s
            },
            ..idle(1)
        };
        let fast_link = Candidate {
            link: Link {
                rtt_us: Some(300.0),
                bytes_per_us: Some(1_000.0), // 1 GB/s
            },
            ..idle(1)
        };
        // 8 MB: 800 ms against 8 ms.
        let cands = [slow_link, fast_link];
        assert_eq!(choose(&cands, 8 << 20, 5_000.0, &NO_POOL), Some(1));
        // 100 bytes: the round trip decides.
        assert_eq!(choose(&cands, 100, 5_000.0, &NO_POOL), Some(0));
    }

    #[test]
    fn transfer_cost_outweighs_a_queue_only_when_it_is_larger() {
        // The near worker has one call ahead of this one (1 slot, 1 in flight): waits 10 ms.
        let near_busy = Candidate {
            in_flight: 1,
            link: Link {
                rtt_us: Some(50.0),
                bytes_per_us: Some(1_000.0),
            },
            ..idle(1)
        };
        let far_idle = Candidate {
            link: Link {
                rtt_us: Some(50.0),
                bytes_per_us: Some(10.0),
            },
            ..idle(1)
        };
        let cands = [near_busy, far_idle];
        // 1 MB: 100 ms to the far one, more than the 10 ms wait.
        assert_eq!(choose(&cands, 1 << 20, 10_000.0, &NO_POOL), Some(0));
        // 10 KB: 1 ms to the far one, less than the wait.
        assert_eq!(choose(&cands, 10_000, 10_000.0, &NO_POOL), Some(1));
    }

    #[test]
    fn a_slower_worker_loses_on_long_calls() {
        let slow = Candidate {
            slowness: Some(3.0),
            ..idle(1)
        };
        let fast = Candidate {
            slowness: Some(1.0),
            ..idle(1)
        };
        assert_eq!(choose(&[slow, fast], 0, 1_000.0, &NO_POOL), Some(1));
        // Unknown speed counts as average: better than known slow, worse than known fast.
        assert_eq!(choose(&[slow, idle(1)], 0, 1_000.0, &NO_POOL), Some(1));
        let quick = Candidate {
            slowness: Some(0.5),
            ..idle(1)
        };
        assert_eq!(choose(&[idle(1), quick], 0, 1_000.0, &NO_POOL), Some(1));
    }

    #[test]
    fn unknown_links_take_the_pools_value() {
        let pool = Link {
            rtt_us: Some(200.0),
            bytes_per_us: Some(100.0),
        };
        let known_worse = Candidate {
            link: Link {
                rtt_us: Some(400.0),
                bytes_per_us: Some(100.0),
            },
            ..idle(1)
        };
        assert_eq!(choose(&[known_worse, idle(1)], 1_000, 0.0, &pool), Some(1));
        assert!((idle(1).link.transfer_us(1_000, &pool) - 210.0).abs() < 1e-9);
        assert_eq!(choose(&[], 0, 0.0, &pool), None);
    }

    #[test]
    fn links_learn_round_trip_and_throughput_separately() {
        let mut l = Link::default();
        l.learn(100, 200);
        assert_eq!(l.rtt_us, Some(200.0));
        l.learn(100, 300);
        assert!((l.rtt_us.unwrap() - 220.0).abs() < 1e-9);
        // 1 MB in 1,220 us of overhead: 1,000 us moving at the learned round trip.
        l.learn(1_000_000, 1_220);
        assert!((l.bytes_per_us.unwrap() - 1_000.0).abs() < 1e-6);
        assert_eq!(l.bytes_per_us.map(|b| b > 0.0), Some(true));
    }
}
