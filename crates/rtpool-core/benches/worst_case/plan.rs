//! What a run of the bench does: the grid of core sizes, rounds, iterations and budgets,
//! read from the command line and the environment (`RTPOOL_WORST_CASE_*`), and whether the
//! memory is locked first.

use std::time::Duration;

/// What to run.
pub struct Plan {
    pub quick: bool,
    /// Queued tasks, smallest first.
    pub sizes: Vec<usize>,
    /// Workers.
    pub workers: Vec<usize>,
    /// Times the whole grid runs, each on freshly built cores.
    pub rounds: usize,
    /// Timed calls per operation, core and round.
    pub iterations: usize,
    /// Blocks the iterations are split into (interleaved over the cores).
    pub blocks: usize,
    /// Untimed calls per operation and core before the first block.
    pub warm_up: usize,
    /// Wall time (timed and untimed) one operation may spend on one core in one round.
    pub budget: Duration,
    /// Between growing submissions, call `Core::prepare` as the master does between events
    /// (`RTPOOL_WORST_CASE_PREPARE=0`: do not, to see the growth without it). Nothing else is
    /// done to the memory: no allocator tuning, no heap faulted in ahead, as in the master.
    pub prepare: bool,
}

impl Plan {
    pub fn from_env() -> Self {
        let quick = std::env::args().any(|a| a == "--quick" || a == "--test")
            || std::env::var("RTPOOL_WORST_CASE_QUICK").is_ok_and(|v| v == "1");
        let prepare = std::env::var("RTPOOL_WORST_CASE_PREPARE").map_or(true, |v| v != "0");
        let rounds = std::env::var("RTPOOL_WORST_CASE_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&r| r > 0);
        if quick {
            Self {
                quick,
                sizes: vec![1_000, 10_000],
                workers: vec![10, 100],
                rounds: rounds.unwrap_or(1),
                iterations: 200,
                blocks: 4,
                warm_up: 10,
                budget: Duration::from_millis(300),
                prepare,
            }
        } else {
            Self {
                quick,
                sizes: vec![1_000, 100_000, 1_000_000],
                workers: vec![10, 1_000, 10_000],
                rounds: rounds.unwrap_or(3),
                iterations: 5_000,
                blocks: 20,
                warm_up: 100,
                budget: Duration::from_secs(3),
                prepare,
            }
        }
    }
}

/// Locks this process's memory with `RTPOOL_WORST_CASE_LOCK=1`: whether it did, or the OS's
/// refusal.
pub fn lock_memory() -> Result<bool, nix::Error> {
    use nix::sys::mman::{mlockall, MlockAllFlags};

    if !std::env::var("RTPOOL_WORST_CASE_LOCK").is_ok_and(|v| v == "1") {
        return Ok(false);
    }
    mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE).map(|()| true)
}
