//! [`CallHandle`]: one call in flight, a future of its outputs; [`wait_any`] and
//! [`wait_all`] over several.
//!
//! A handle owns the receiving end of its call's outcome; the connection task
//! (`driver.rs`) owns the sending end and resolves it from the master's `RESULTS` (or an
//! error). Decoding the outputs happens here, on the caller's task, not on the connection's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::calls::Outcome;
use crate::decode::decode_values;
use crate::driver::{Command, Link};
use crate::error::{ClientError, Result};
use crate::value::Value;

/// The outputs of a call: the return value (if any), then its `Out` and `InOut` parameters,
/// in the interface's order.
pub type Outputs = Vec<Value>;

/// One call in flight. Await it for its outputs; drop it to stop caring (the call still
/// runs; [`cancel`](CallHandle::cancel) stops it).
#[must_use = "a call's handle is how its outputs arrive; await it, or cancel it"]
pub struct CallHandle {
    function: String,
    link: Link,
    group: u64,
    index: u32,
    fetched: bool,
    state: State,
    wait: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
}

enum State {
    Waiting(oneshot::Receiver<Outcome>),
    Done,
}

impl CallHandle {
    pub(crate) fn new(
        function: String,
        link: Link,
        group: u64,
        index: u32,
        fetched: bool,
        rx: oneshot::Receiver<Outcome>,
        wait: Option<Duration>,
    ) -> CallHandle {
        CallHandle {
            function,
            link,
            group,
            index,
            fetched,
            state: State::Waiting(rx),
            wait: wait.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
        }
    }

    /// The function called.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// Whether the outputs come back to this client (false for a transaction's
    /// intermediate, whose outputs stay on its worker: it resolves to
    /// [`ClientError::NotFetched`] once it succeeded).
    pub fn is_fetched(&self) -> bool {
        self.fetched
    }

    /// Whether the outcome was taken already (by awaiting, [`try_result`](Self::try_result)
    /// or [`wait_any`]).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Cancels the call (and, in a transaction, the calls that depend on it): a queued call
    /// never runs, a running one is stopped on its worker. The handle then resolves to
    /// [`ClientError::Cancelled`] unless its result came first.
    pub fn cancel(&self) {
        self.link.send(Command::Cancel {
            group: self.group,
            index: self.index,
        });
    }

    /// The outcome if it has arrived, without waiting; `None` while the call runs (or once
    /// the outcome was taken).
    pub fn try_result(&mut self) -> Option<Result<Outputs>> {
        let State::Waiting(rx) = &mut self.state else {
            return None;
        };
        match rx.try_recv() {
            Ok(outcome) => Some(self.finish(Ok(outcome))),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(self.finish(Err(()))),
        }
    }

    fn finish(&mut self, got: std::result::Result<Outcome, ()>) -> Result<Outputs> {
        self.state = State::Done;
        match got {
            Ok(Ok(data)) if !self.fetched => {
                drop(data);
                Err(ClientError::NotFetched {
                    function: self.function.clone(),
                })
            }
            Ok(Ok(data)) => decode_values(&data),
            Ok(Err(e)) => Err(e),
            Err(()) => Err(ClientError::Closed),
        }
    }
}

impl Future for CallHandle {
    type Output = Result<Outputs>;

    /// # Panics
    ///
    /// When polled again after it returned `Ready`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let State::Waiting(rx) = &mut this.state else {
            panic!("a CallHandle polled after its outcome was taken");
        };
        if let Poll::Ready(got) = Pin::new(rx).poll(cx) {
            return Poll::Ready(this.finish(got.map_err(|_| ())));
        }
        if let Some((waited, sleep)) = &mut this.wait {
            if sleep.as_mut().poll(cx).is_ready() {
                let waited = *waited;
                this.cancel();
                this.state = State::Done;
                return Poll::Ready(Err(ClientError::WaitTimeout {
                    function: this.function.clone(),
                    waited,
                }));
            }
        }
        Poll::Pending
    }
}

/// Waits for the first of `handles` to finish (skipping those already done) and returns its
/// position and outcome; `None` when every handle is done already.
pub async fn wait_any(handles: &mut [CallHandle]) -> Option<(usize, Result<Outputs>)> {
    let mut refs: Vec<&mut CallHandle> = handles.iter_mut().collect();
    wait_any_of(&mut refs).await
}

/// [`wait_any`] over borrowed handles (the blocking wrapper's).
pub(crate) async fn wait_any_of(
    handles: &mut [&mut CallHandle],
) -> Option<(usize, Result<Outputs>)> {
    if handles.iter().all(|h| h.is_done()) {
        return None;
    }
    std::future::poll_fn(|cx| {
        for (i, h) in handles.iter_mut().enumerate() {
            if h.is_done() {
                continue;
            }
            if let Poll::Ready(outcome) = Pin::new(&mut **h).poll(cx) {
                return Poll::Ready(Some((i, outcome)));
            }
        }
        Poll::Pending
    })
    .await
}

/// Waits for every handle; the outcomes in the handles' order (one already taken is
/// [`ClientError::Closed`]).
pub async fn wait_all(handles: Vec<CallHandle>) -> Vec<Result<Outputs>> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if h.is_done() {
            out.push(Err(ClientError::Closed));
        } else {
            out.push(h.await);
        }
    }
    out
}
