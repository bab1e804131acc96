//! Bounds on the numbers a peer reports, and the per-user rules the admin sets on its token.
//!
//! A worker's times (`exec_us`, `wait_us`, `flush_us`) are charged to users' quotas, written to
//! the store and fed into the execution-time estimates; its slots and credits size what it is
//! sent. None of them is trusted: a value past its bound is clamped to the bound (here a coarse
//! 30 days; the core then bounds each time by the assignment-to-result time the master saw,
//! `rtpool_core::REPORT_MARGIN_US`), and the first
//! clamp on a connection is logged (once per connection, so a hostile peer cannot flood the
//! log). A client's priority above its user's ceiling is refused (`ERROR rejected`), so the
//! client sees why instead of silently running at another priority.

use std::sync::Arc;

use rtpool_proto::PackageOpts;
use tokio::sync::watch;
use tracing::warn;

use crate::auth::Policy;
use crate::outbound::rejected;
use rtpool_proto::Msg;

/// Largest time a worker may report for one task, microseconds: 30 days. A larger `exec_us`,
/// `wait_us` or `flush_us` is clamped to it.
pub const MAX_REPORTED_US: u64 = 30 * 86_400 * 1_000_000;
/// Most slots a worker may declare in its `HELLO`.
pub const MAX_SLOTS: u32 = 4096;
/// Most credits one `PULL` may grant.
pub const MAX_CREDITS: u32 = 65_536;

/// One connection's bounds: what it clamped already, and the user's rules.
pub(super) struct Bounds {
    session: u64,
    user: String,
    policy: watch::Receiver<Arc<Policy>>,
    /// A clamp was logged on this connection.
    logged: bool,
}

impl Bounds {
    pub(super) fn new(session: u64, user: String, policy: watch::Receiver<Arc<Policy>>) -> Self {
        Self {
            session,
            user,
            policy,
            logged: false,
        }
    }

    /// `value` clamped to `max`, logging the first clamp of this connection.
    pub(super) fn clamp<T: PartialOrd + Copy + std::fmt::Display>(
        &mut self,
        what: &str,
        value: T,
        max: T,
    ) -> T {
        if value <= max {
            return value;
        }
        if !self.logged {
            self.logged = true;
            warn!(
                session = self.session,
                user = %self.user,
                "peer reported {what} = {value}, above its bound {max}: clamped (logged once per \
                 connection)"
            );
        }
        max
    }

    /// A worker's task time, clamped to [`MAX_REPORTED_US`].
    pub(super) fn task_us(&mut self, what: &str, value: u64) -> u64 {
        self.clamp(what, value, MAX_REPORTED_US)
    }

    /// The refusal of a package whose priority is above the user's ceiling, if it is.
    pub(super) fn check_priority(&self, req_id: u64, opts: &PackageOpts) -> Option<Msg> {
        let max = *self.policy.borrow().max_priority.get(&self.user)?;
        (opts.priority > max).then(|| {
            rejected(
                req_id,
                format!(
                    "priority {} is above the ceiling {max} the admin set for user {}: submit \
                     with priority <= {max}, or ask the admin to raise it (`rtpool token set \
                     --user {} --max-priority N`)",
                    opts.priority, self.user, self.user
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_and_ceilings() {
        let mut policy = Policy::default();
        policy.max_priority.insert("alice".into(), 3);
        let (_tx, rx) = watch::channel(Arc::new(policy));
        let mut b = Bounds::new(1, "alice".into(), rx.clone());
        assert_eq!(b.task_us("exec_us", 5), 5);
        assert_eq!(b.task_us("exec_us", u64::MAX), MAX_REPORTED_US);
        assert!(b.logged);
        let mut opts = PackageOpts {
            priority: 3,
            ..Default::default()
        };
        assert!(b.check_priority(1, &opts).is_none());
        opts.priority = 4;
        let Some(Msg::Error { code, message, .. }) = b.check_priority(9, &opts) else {
            panic!("priority 4 passed a ceiling of 3");
        };
        assert_eq!(code, "rejected");
        assert!(message.contains("ceiling 3"), "{message}");
        let bob = Bounds::new(2, "bob".into(), rx);
        opts.priority = i32::MAX;
        assert!(bob.check_priority(1, &opts).is_none(), "bob has no ceiling");
    }
}
