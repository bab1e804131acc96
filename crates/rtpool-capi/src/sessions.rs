//! The table of asynchronous calls (GridRPC sessions): ids, outcomes, and the waits of
//! `grpc_wait*` / `grpc_probe*` on one condition variable.
//!
//! A call's background task records its outcome with [`Sessions::complete`] after it wrote the
//! outputs into the caller's memory, so an outcome seen here means the outputs are in place. A
//! session leaves the table when it is waited for (`grpc_wait`, `_and`, `_or`, `_all`, `_any`);
//! its id is then invalid. Any number of threads may start, probe, cancel and wait for
//! sessions at once; a session is handed to exactly one waiter.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::{CapiError, GRPC_INVALID_SESSION_ID, GRPC_NONE_COMPLETED, GRPC_NOT_COMPLETED};

/// A GridRPC session id.
#[allow(non_camel_case_types)]
pub type grpc_sessionid_t = i32;

/// How to cancel a pending call.
pub type Cancel = Box<dyn Fn() + Send + Sync>;

struct Entry {
    outcome: Option<Result<(), CapiError>>,
    cancel: Cancel,
}

#[derive(Default)]
struct Table {
    next: grpc_sessionid_t,
    live: HashMap<grpc_sessionid_t, Entry>,
}

/// Every session of the library.
#[derive(Default)]
pub struct Sessions {
    table: Mutex<Table>,
    changed: Condvar,
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock is caught at the FFI edge; the table stays usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new pending session; `cancel` stops its call.
    pub fn start(&self, cancel: Cancel) -> grpc_sessionid_t {
        let mut table = self.lock();
        loop {
            table.next = if table.next == i32::MAX {
                1
            } else {
                table.next + 1
            };
            let id = table.next;
            if let std::collections::hash_map::Entry::Vacant(slot) = table.live.entry(id) {
                slot.insert(Entry {
                    outcome: None,
                    cancel,
                });
                return id;
            }
        }
    }

    /// Record a session's outcome (its outputs are written) and wake the waiters.
    pub fn complete(&self, id: grpc_sessionid_t, outcome: Result<(), CapiError>) {
        if let Some(entry) = self.lock().live.get_mut(&id) {
            entry.outcome = Some(outcome);
        }
        self.changed.notify_all();
    }

    /// Forget a session that never started (its call could not be sent).
    pub fn discard(&self, id: grpc_sessionid_t) {
        self.lock().live.remove(&id);
    }

    /// Block until `id` completes; return its outcome and forget it.
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_SESSION_ID` for an unknown id, else the call's own error.
    pub fn wait(&self, id: grpc_sessionid_t) -> Result<(), CapiError> {
        let mut table = self.lock();
        loop {
            match table.live.get(&id) {
                None => return Err(invalid(id)),
                Some(entry) if entry.outcome.is_some() => {
                    return table
                        .live
                        .remove(&id)
                        .and_then(|e| e.outcome)
                        .expect("checked");
                }
                Some(_) => table = self.changed.wait(table).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Block until the first of `ids` (or, with `None`, of every live session) completes; return
    /// its id and outcome and forget it.
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_SESSION_ID` when an id is unknown or there is nothing to wait for.
    pub fn wait_or(
        &self,
        ids: Option<&[grpc_sessionid_t]>,
    ) -> (grpc_sessionid_t, Result<(), CapiError>) {
        let mut table = self.lock();
        loop {
            let candidates: Vec<grpc_sessionid_t> = match ids {
                Some(ids) => ids.to_vec(),
                None => table.live.keys().copied().collect(),
            };
            if candidates.is_empty() {
                return (
                    0,
                    Err(CapiError::new(
                        GRPC_INVALID_SESSION_ID,
                        "no session to wait for",
                    )),
                );
            }
            if let Some(&bad) = candidates.iter().find(|id| !table.live.contains_key(id)) {
                return (bad, Err(invalid(bad)));
            }
            let done = candidates
                .iter()
                .copied()
                .find(|id| table.live[id].outcome.is_some());
            if let Some(id) = done {
                return (
                    id,
                    table
                        .live
                        .remove(&id)
                        .and_then(|e| e.outcome)
                        .expect("checked"),
                );
            }
            table = self.changed.wait(table).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The ids of every live session.
    pub fn live_ids(&self) -> Vec<grpc_sessionid_t> {
        let mut ids: Vec<_> = self.lock().live.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// `Ok` when `id` completed (its outcome stays for a wait), `GRPC_NOT_COMPLETED` otherwise.
    ///
    /// # Errors
    ///
    /// `GRPC_NOT_COMPLETED`, or `GRPC_INVALID_SESSION_ID` for an unknown id.
    pub fn probe(&self, id: grpc_sessionid_t) -> Result<(), CapiError> {
        match self.lock().live.get(&id) {
            None => Err(invalid(id)),
            Some(entry) if entry.outcome.is_some() => Ok(()),
            Some(_) => Err(CapiError::new(
                GRPC_NOT_COMPLETED,
                format!("session {id} has not completed"),
            )),
        }
    }

    /// The first completed session of `ids`.
    ///
    /// # Errors
    ///
    /// `GRPC_NONE_COMPLETED`, or `GRPC_INVALID_SESSION_ID` for an unknown id.
    pub fn probe_or(&self, ids: &[grpc_sessionid_t]) -> Result<grpc_sessionid_t, CapiError> {
        let table = self.lock();
        if let Some(&bad) = ids.iter().find(|id| !table.live.contains_key(id)) {
            return Err(invalid(bad));
        }
        ids.iter()
            .copied()
            .find(|id| table.live[id].outcome.is_some())
            .ok_or_else(|| {
                CapiError::new(GRPC_NONE_COMPLETED, "none of the sessions has completed")
            })
    }

    /// The outcome code of a session not yet waited for (`GRPC_NOT_COMPLETED` while it runs).
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_SESSION_ID` for an unknown id.
    pub fn error_of(&self, id: grpc_sessionid_t) -> Result<Option<CapiError>, CapiError> {
        match self.lock().live.get(&id) {
            None => Err(invalid(id)),
            Some(Entry { outcome: None, .. }) => {
                Ok(Some(CapiError::new(GRPC_NOT_COMPLETED, "running")))
            }
            Some(Entry {
                outcome: Some(o), ..
            }) => Ok(o.clone().err()),
        }
    }

    /// Ask a pending session's call to stop (it then completes as cancelled); a completed
    /// session is left as it is.
    ///
    /// # Errors
    ///
    /// `GRPC_INVALID_SESSION_ID` for an unknown id.
    pub fn cancel(&self, id: grpc_sessionid_t) -> Result<(), CapiError> {
        let table = self.lock();
        let entry = table.live.get(&id).ok_or_else(|| invalid(id))?;
        if entry.outcome.is_none() {
            (entry.cancel)();
        }
        Ok(())
    }
}

fn invalid(id: grpc_sessionid_t) -> CapiError {
    CapiError::new(
        GRPC_INVALID_SESSION_ID,
        format!("session {id} is unknown (never started, or already waited for)"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::error::GRPC_SESSION_FAILED;

    #[test]
    fn a_wait_returns_the_outcome_once() {
        let sessions = Sessions::default();
        let id = sessions.start(Box::new(|| {}));
        assert_eq!(sessions.probe(id).unwrap_err().code, GRPC_NOT_COMPLETED);
        sessions.complete(id, Err(CapiError::new(GRPC_SESSION_FAILED, "boom")));
        assert!(sessions.probe(id).is_ok());
        assert_eq!(
            sessions.error_of(id).unwrap().unwrap().code,
            GRPC_SESSION_FAILED
        );
        assert_eq!(sessions.wait(id).unwrap_err().message, "boom");
        assert_eq!(sessions.wait(id).unwrap_err().code, GRPC_INVALID_SESSION_ID);
    }

    #[test]
    fn wait_or_wakes_on_a_completion_from_another_thread() {
        let sessions = Arc::new(Sessions::default());
        let a = sessions.start(Box::new(|| {}));
        let b = sessions.start(Box::new(|| {}));
        let s = sessions.clone();
        let finisher = std::thread::spawn(move || s.complete(b, Ok(())));
        let (id, outcome) = sessions.wait_or(Some(&[a, b]));
        finisher.join().unwrap();
        assert_eq!((id, outcome), (b, Ok(())));
        assert_eq!(sessions.live_ids(), vec![a]);
        assert_eq!(
            sessions.probe_or(&[a]).unwrap_err().code,
            GRPC_NONE_COMPLETED
        );
        assert_eq!(sessions.wait_or(Some(&[a, 999])).0, 999);
    }

    #[test]
    fn cancel_reaches_only_pending_calls() {
        let sessions = Sessions::default();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let id = sessions.start(Box::new(move || {
            h.fetch_add(1, Ordering::SeqCst);
        }));
        sessions.cancel(id).unwrap();
        sessions.complete(id, Ok(()));
        sessions.cancel(id).unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert_eq!(
            sessions.cancel(12345).unwrap_err().code,
            GRPC_INVALID_SESSION_ID
        );
    }
}
