//! [`Seldom`]: a future polled only once its own waker fired, for what a connection task waits
//! on besides its socket (a revoked token, the master's shutdown, a full outbound queue).
//!
//! `tokio::select!` polls every branch each time its task wakes, and a connection's reader
//! wakes for each frame: with 10,000 idle workers heartbeating, the three branches that almost
//! never fire were polled 10,000 times a second, each poll taking a lock in its `Notify`
//! (issue 25). Behind [`Seldom`] they are polled on the first poll and after a wake-up of
//! their own only; a wake of the task for its socket costs an atomic swap here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// What the inner future's waker does: note that it fired, then wake the task.
#[derive(Debug, Default)]
struct Flag {
    woken: AtomicBool,
    /// The task's waker, as last seen by [`Seldom::poll`].
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

/// `inner`, polled only when its own waker fired since its last poll (or the task's waker
/// changed, or it was never polled).
pub(super) struct Seldom<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    /// The waker handed to `inner`.
    waker: Waker,
    /// The task's waker at the last poll; `None` before the first.
    task: Option<Waker>,
}

impl<F: Future> Seldom<F> {
    pub(super) fn new(inner: F) -> Self {
        let flag = Arc::new(Flag::default());
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(flag.clone()),
            flag,
            task: None,
        }
    }
}

impl<F: Future> Future for Seldom<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let same_task = this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker()));
        if !same_task {
            let waker = cx.waker().clone();
            *this.flag.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker.clone());
            this.task = Some(waker);
        } else if !this.flag.woken.swap(false, Ordering::AcqRel) {
            // Woken for something else: `inner` registered its waker and nothing fired it.
            return Poll::Pending;
        }
        // A wake-up from now on is noted again: one during this poll means a poll more.
        this.flag.woken.store(false, Ordering::Release);
        let mut cx = Context::from_waker(&this.waker);
        this.inner.as_mut().poll(&mut cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its polls; ready once `ready` is set (and its waker was woken).
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.ready.load(Ordering::Relaxed) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn polls_its_future_only_after_its_own_wake_up_and_wakes_the_task() {
        let (polls, ready) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let inner_waker = Arc::new(Mutex::new(None));
        let probe = Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: inner_waker.clone(),
        };
        let mut seldom = Box::pin(Seldom::new(probe));
        let task = Arc::new(CountingWaker::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(seldom.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "the first poll reaches the future"
        );
        for _ in 0..5 {
            assert!(seldom.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "wake-ups of the task for others do not"
        );
        ready.store(true, Ordering::Relaxed);
        let inner = inner_waker.lock().unwrap().take().expect("registered");
        inner.wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "its own wake-up wakes the task"
        );
        assert!(seldom.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_new_task_waker_reaches_the_future() {
        let (polls, ready) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let probe = Probe {
            polls: polls.clone(),
            ready,
            waker: Arc::new(Mutex::new(None)),
        };
        let mut seldom = Box::pin(Seldom::new(probe));
        let (a, b) = (
            Waker::from(Arc::new(CountingWaker::default())),
            Waker::from(Arc::new(CountingWaker::default())),
        );
        assert!(seldom
            .as_mut()
            .poll(&mut Context::from_waker(&a))
            .is_pending());
        assert!(seldom
            .as_mut()
            .poll(&mut Context::from_waker(&b))
            .is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }
}
