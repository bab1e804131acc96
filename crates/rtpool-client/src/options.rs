//! [`CallOptions`]: what one call (or transaction) asks of the master beyond its arguments,
//! mapped onto the protocol's [`PackageOpts`] (one options type on the wire; this one holds
//! only what applies to calls, in the units a caller thinks in).

use std::time::Duration;

use rtpool_proto::{Labels, PackageOpts, Resources, Unschedulable};

use crate::error::ClientError;

/// Per-call options; [`Default`] is the master's defaults (priority 0, no deadline, no time
/// limit, the newest version, wait forever).
///
/// ```
/// use std::time::Duration;
/// use rtpool_client::CallOptions;
/// let urgent = CallOptions::new().priority(10).deadline(Duration::from_millis(500));
/// assert_eq!(urgent.priority, 10);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Higher runs first; FIFO within one priority.
    pub priority: i32,
    /// When the result is due, after the master receives the call (EDF within a priority).
    pub deadline: Option<Duration>,
    /// The worker's execution time limit: a call past it is killed
    /// ([`ClientError::TimeLimit`]).
    pub timeout: Option<Duration>,
    /// How long the caller waits for the result before cancelling the call
    /// ([`ClientError::WaitTimeout`]); `None`: as long as it takes.
    pub wait: Option<Duration>,
    /// Attempts before a call whose worker keeps dying fails ([`ClientError::WorkerLost`]);
    /// `None`: the master's `--max-attempts` (3).
    pub max_attempts: Option<u32>,
    /// The function's version; `None`: the newest served.
    pub version: Option<String>,
    /// What the call holds of its worker while it runs (`gpu=1`): it runs only on a server
    /// of its function that has it free (`docs/resources.md`). Empty: one slot only.
    pub resources: Vec<(String, u64)>,
    /// Labels its worker must have, equal (`zone=a`).
    pub labels: Vec<(String, String)>,
    /// When no connected worker could serve the request: queue it until one joins (`true`),
    /// or fail at once with [`ClientError::Rejected`] of code `unschedulable` (`false`).
    pub wait_if_unschedulable: bool,
}

impl CallOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`CallOptions::priority`].
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets [`CallOptions::deadline`].
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets [`CallOptions::timeout`], the worker's execution limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets [`CallOptions::wait`], how long the caller waits.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Sets [`CallOptions::max_attempts`].
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Sets [`CallOptions::version`].
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Adds a resource to [`CallOptions::resources`].
    pub fn resource(mut self, name: impl Into<String>, amount: u64) -> Self {
        self.resources.push((name.into(), amount));
        self
    }

    /// Adds a label to [`CallOptions::labels`].
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    /// Sets [`CallOptions::wait_if_unschedulable`].
    pub fn wait_if_unschedulable(mut self, wait: bool) -> Self {
        self.wait_if_unschedulable = wait;
        self
    }

    /// The package options on the wire, with a fresh idempotency `key`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Config`] for a deadline or time limit beyond the protocol's `u32`
    /// milliseconds (49 days), `max_attempts` outside 1 to 255, or a resource or label
    /// the protocol does not take (a bad name, one given twice).
    pub(crate) fn to_wire(&self) -> Result<PackageOpts, ClientError> {
        let ms = |what: &str, d: Option<Duration>| -> Result<u32, ClientError> {
            let Some(d) = d else { return Ok(0) };
            u32::try_from(d.as_millis().max(1)).map_err(|_| {
                ClientError::Config(format!("{what} of {d:?} is above the protocol's 49 days"))
            })
        };
        let mut opts = PackageOpts {
            priority: self.priority,
            deadline_ms: ms("deadline", self.deadline)?,
            timeout_ms: ms("timeout", self.timeout)?,
            ..PackageOpts::default()
        };
        if let Some(n) = self.max_attempts {
            if !(1..=255).contains(&n) {
                return Err(ClientError::Config(format!(
                    "max_attempts is {n}; give 1 to 255"
                )));
            }
            opts.max_attempts = n;
        }
        opts.resources = Resources::new(self.resources.iter().cloned())
            .map_err(|e| ClientError::Config(format!("resources: {e}")))?;
        opts.labels = Labels::new(self.labels.iter().cloned())
            .map_err(|e| ClientError::Config(format!("labels: {e}")))?;
        if self.wait_if_unschedulable {
            opts.unschedulable = Unschedulable::Wait;
        }
        opts.key = random_key();
        Ok(opts)
    }
}

/// 128 random bits in hex, as the Python client's `with_key`: a `CALL` re-sent after a
/// reconnection carries the same key, so it never makes a second package.
fn random_key() -> String {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the OS random source");
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_the_wire_in_milliseconds() {
        let o = CallOptions::new()
            .priority(3)
            .deadline(Duration::from_millis(250))
            .timeout(Duration::from_secs(2))
            .to_wire()
            .unwrap();
        assert_eq!((o.priority, o.deadline_ms, o.timeout_ms), (3, 250, 2000));
        assert_eq!(o.key.len(), 32);
        assert!(CallOptions::new().max_attempts(0).to_wire().is_err());
    }

    #[test]
    fn resources_and_labels_go_on_the_wire_and_bad_ones_are_refused() {
        let o = CallOptions::new()
            .resource("gpu", 1)
            .label("zone", "a")
            .wait_if_unschedulable(true)
            .to_wire()
            .unwrap();
        assert_eq!(
            (o.resources.describe(), o.labels.describe()),
            ("gpu=1".into(), "zone=a".into())
        );
        assert_eq!(o.unschedulable, Unschedulable::Wait);
        let twice = CallOptions::new().resource("gpu", 1).resource("gpu", 2);
        let err = twice.to_wire().unwrap_err().to_string();
        assert!(err.contains("gpu given twice"), "{err}");
        assert!(CallOptions::new().to_wire().unwrap().resources.is_empty());
    }
}
