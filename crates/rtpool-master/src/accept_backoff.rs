//! [`AcceptBackoff`]: what the accept loop does when `accept` fails.
//!
//! Out of file descriptors (`EMFILE`, `ENFILE`) or kernel memory (`ENOBUFS`, `ENOMEM`), the
//! pending connection stays in the listen backlog and `accept` fails again at once: retrying
//! in a loop burns a core and writes the same line millions of times. Instead the loop pauses
//! accepting, 10 ms after the first failure, doubling up to 1 s, back to nothing after the
//! first success; the connections already served keep being served meanwhile. The error is
//! logged at most once per [`LOG_WINDOW`], with the count of the failures not logged.
//!
//! Errors about one connection only (`ECONNABORTED`: the peer left before we took it) are
//! neither paused for nor logged above debug.
//!
//! A plain value with no clock of its own: the caller passes `now`. Its lines go through the
//! master's one [`LogLimiter`].

use std::io;
use std::time::{Duration, Instant};

use crate::ratelimit::{suppressed_note, LogLimiter};

/// First pause after a resource error.
pub const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// The accept error is logged at most once per window.
pub const LOG_WINDOW: Duration = Duration::from_secs(10);

/// Pauses and log decisions of the accept loop (see the module docs).
#[derive(Debug)]
pub struct AcceptBackoff {
    /// The next pause; zero after a success.
    next: Duration,
    /// One line per [`LOG_WINDOW`].
    lines: LogLimiter<()>,
    /// Failures since start.
    failures: u64,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            next: Duration::ZERO,
            lines: LogLimiter::new(LOG_WINDOW),
            failures: 0,
        }
    }
}

/// What to do after a failed `accept`.
#[derive(Debug, PartialEq, Eq)]
pub struct OnError {
    /// Stop accepting this long (zero: retry now).
    pub pause: Duration,
    /// A line to log at error level, when one is due.
    pub log: Option<String>,
}

/// Whether `e` says the process or the system is out of a resource (retrying at once would
/// fail again), rather than something about one connection.
pub fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_code::EMFILE | libc_code::ENFILE | libc_code::ENOBUFS | libc_code::ENOMEM)
    )
}

/// The errno values we look at (Linux and the BSDs share them).
mod libc_code {
    pub const ENOMEM: i32 = 12;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    #[cfg(target_os = "linux")]
    pub const ENOBUFS: i32 = 105;
    #[cfg(not(target_os = "linux"))]
    pub const ENOBUFS: i32 = 55;
}

impl AcceptBackoff {
    /// `accept` succeeded: the next failure starts from the shortest pause again.
    pub fn on_success(&mut self) {
        self.next = Duration::ZERO;
    }

    /// `accept` failed with `e` at `now`.
    pub fn on_error(&mut self, e: &io::Error, now: Instant) -> OnError {
        if !is_resource_error(e) {
            return OnError {
                pause: Duration::ZERO,
                log: None,
            };
        }
        self.failures += 1;
        let pause = self.next.max(FIRST_PAUSE);
        self.next = (pause * 2).min(MAX_PAUSE);
        let log = self.lines.check((), now).map(|held| {
            format!(
                "accept failed: {e}; pausing new connections (up to {} ms at a time) while \
                 the served ones continue{}; raise the open-file limit (`ulimit -n`, \
                 systemd LimitNOFILE=) or lower --max-connections",
                MAX_PAUSE.as_millis(),
                suppressed_note(held, LOG_WINDOW)
            )
        });
        OnError { pause, log }
    }

    /// Resource failures since start.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc_code::EMFILE)
    }

    #[test]
    fn pauses_double_up_to_a_second_and_reset_on_success() {
        let mut b = AcceptBackoff::default();
        let t = Instant::now();
        let pauses: Vec<_> = (0..9)
            .map(|_| b.on_error(&emfile(), t).pause.as_millis())
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.on_success();
        assert_eq!(b.on_error(&emfile(), t).pause, FIRST_PAUSE);
    }

    #[test]
    fn one_line_per_window_with_the_count_of_the_others() {
        let mut b = AcceptBackoff::default();
        let t0 = Instant::now();
        assert!(b.on_error(&emfile(), t0).log.is_some());
        for i in 1..=5 {
            assert!(b
                .on_error(&emfile(), t0 + Duration::from_secs(i))
                .log
                .is_none());
        }
        let line = b.on_error(&emfile(), t0 + LOG_WINDOW).log.unwrap();
        assert!(line.contains("5 more lines like it held back"), "{line}");
        assert_eq!(b.failures(), 7);
    }

    #[test]
    fn a_connection_error_is_not_paused_for() {
        let mut b = AcceptBackoff::default();
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        let got = b.on_error(&aborted, Instant::now());
        assert_eq!(
            got,
            OnError {
                pause: Duration::ZERO,
                log: None
            }
        );
    }
}
