//! [`LogLimiter`]: at most one log line per key (a peer address, a user, a reason) per window,
//! with a count of the lines it held back, so a peer that retries a bad token in a loop costs
//! one readable line every few seconds instead of flooding the log.
//!
//! It is a plain value with no clock and no lock of its own: the caller passes `now` and keeps
//! it where its lines are written (a `Mutex` in a `static` for the connection tasks, a field for
//! the scheduler). Memory is bounded: at most [`LogLimiter::MAX_KEYS`] keys are remembered; when
//! more show up, keys idle for a whole window are forgotten, and if every key is recent, the
//! newcomers share one overflow slot (their lines are then limited together).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Default window of [`LogLimiter::new`] callers in the master: one line per key per 10 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// Per-key state: when the last line was written and how many were held back since.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// `None` before the first line.
    last: Option<Instant>,
    suppressed: u64,
}

const NEW_SLOT: Slot = Slot {
    last: None,
    suppressed: 0,
};

/// Decides which log lines of a repeated kind are written (see the module docs).
#[derive(Debug)]
pub struct LogLimiter<K> {
    window: Duration,
    slots: HashMap<K, Slot>,
    /// The shared slot of keys beyond [`LogLimiter::MAX_KEYS`].
    overflow: Option<Slot>,
}

impl<K: Eq + Hash> LogLimiter<K> {
    /// Keys remembered at most (a few hundred bytes each).
    pub const MAX_KEYS: usize = 1024;

    /// A limiter writing at most one line per key per `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            slots: HashMap::new(),
            overflow: None,
        }
    }

    /// Whether to write a line for `key` now: `Some(n)` with the number of lines held back for
    /// this key since the last one written (to say "and n more"), `None` to hold this one back.
    pub fn check(&mut self, key: K, now: Instant) -> Option<u64> {
        let window = self.window;
        if !self.slots.contains_key(&key) && self.slots.len() >= Self::MAX_KEYS {
            self.slots.retain(|_, s| {
                s.last
                    .is_some_and(|t| now.saturating_duration_since(t) < window)
            });
        }
        let slot = if self.slots.contains_key(&key) || self.slots.len() < Self::MAX_KEYS {
            self.slots.entry(key).or_insert(NEW_SLOT)
        } else {
            self.overflow.get_or_insert(NEW_SLOT)
        };
        admit(slot, now, window)
    }

    /// Keys remembered now (for tests and bounds checks).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No key is remembered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// The first line, and then one line per window, is written; the others are counted.
fn admit(slot: &mut Slot, now: Instant, window: Duration) -> Option<u64> {
    let due = match slot.last {
        None => true,
        Some(t) => now.saturating_duration_since(t) >= window,
    };
    if due {
        let held = slot.suppressed;
        *slot = Slot {
            last: Some(now),
            suppressed: 0,
        };
        Some(held)
    } else {
        slot.suppressed += 1;
        None
    }
}

/// `" (and 3 more like it in the last 10 s)"`, or nothing when none was held back.
pub fn suppressed_note(held: u64, window: Duration) -> String {
    if held == 0 {
        String::new()
    } else {
        let lines = if held == 1 { "line" } else { "lines" };
        format!(
            " ({held} more {lines} like it held back in the last {} s)",
            window.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_window_with_the_count_of_the_others() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut l = LogLimiter::new(Duration::from_secs(10));
        assert_eq!(l.check("a", t0), Some(0));
        assert_eq!(l.check("a", t0 + s), None);
        assert_eq!(l.check("a", t0 + 2 * s), None);
        assert_eq!(l.check("b", t0 + 2 * s), Some(0), "keys are independent");
        assert_eq!(l.check("a", t0 + 10 * s), Some(2));
        assert_eq!(l.check("a", t0 + 11 * s), None);
        assert_eq!(l.check("a", t0 + 25 * s), Some(1));
    }

    #[test]
    fn keys_are_bounded() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let max = LogLimiter::<u32>::MAX_KEYS as u32;
        for k in 0..max {
            assert_eq!(l.check(k, t0), Some(0));
        }
        // Every key is recent: newcomers share the overflow slot.
        assert_eq!(l.check(max, t0), Some(0));
        assert_eq!(l.check(max + 1, t0), None);
        assert_eq!(l.len(), max as usize);
        // A window later the old keys are forgotten to make room.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(l.check(max + 2, later), Some(0));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn the_note_says_how_many_were_held_back() {
        let w = Duration::from_secs(10);
        assert_eq!(suppressed_note(0, w), "");
        assert_eq!(
            suppressed_note(1, w),
            " (1 more line like it held back in the last 10 s)"
        );
        assert!(suppressed_note(5, w).contains("5 more lines"));
    }
}
