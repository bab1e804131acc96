//! The standby's tailer: a thread that keeps a [`WarmState`] of the journal up to date while
//! this master stands by (a look every tenth of the lease), so that a takeover replays only
//! the rows written since the last look.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::Client;

use crate::journal::pg::connect;
use crate::journal::{JournalError, WarmState};

/// A running tailer; [`Tailer::finish`] stops it and hands its state over. Dropping it stops
/// the thread without waiting for it.
pub struct Tailer {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<WarmState>,
}

impl Tailer {
    /// Starts tailing the journal of `url`.
    ///
    /// # Errors
    ///
    /// When the thread cannot be started.
    pub fn start(url: String, lease_ms: u32) -> std::io::Result<Tailer> {
        let (stop, stopped) = mpsc::channel();
        let every = Duration::from_millis((lease_ms / 10).max(10).into());
        let thread = std::thread::Builder::new()
            .name("rtpool-tail".into())
            .spawn(move || run(&url, lease_ms, every, &stopped))?;
        Ok(Tailer { stop, thread })
    }

    /// Stops the thread (after its look in progress) and returns what it applied. Blocking:
    /// call it off the tokio runtime.
    pub fn finish(self) -> WarmState {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

fn run(url: &str, lease_ms: u32, every: Duration, stopped: &mpsc::Receiver<()>) -> WarmState {
    let mut warm = WarmState::default();
    let mut client: Option<Client> = None;
    loop {
        if client.is_none() {
            client = connect(url, lease_ms).ok();
        }
        if let Some(c) = client.as_mut() {
            match warm.catch_up(c) {
                Ok(()) => {}
                Err(JournalError::CorruptRow { .. }) => {
                    // The takeover reads it again and reports it; nothing to keep here.
                    warm = WarmState::default();
                }
                // The table may not exist yet, or the database is out of reach: later.
                Err(_) => client = None,
            }
        }
        match stopped.recv_timeout(every) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return warm,
        }
    }
}
