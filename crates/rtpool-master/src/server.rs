//! The accept loop and the shutdown sequence (as in mini-redis: broadcast stop, then wait until
//! every connection task has finished).
//!
//! Each accepted connection first asks [`crate::connection::gate`] for a place; one refused is
//! answered `ERROR busy` with the reason. When `accept` itself fails for want of descriptors
//! or memory, [`AcceptBackoff`] pauses accepting instead of spinning.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::accept_backoff::AcceptBackoff;
use crate::connection::{self, ConnCtx};
use crate::scheduler::{Scheduler, ToScheduler};

/// Connections being refused with `ERROR busy` (and their input drained) at once, at most;
/// past that a refusal is written without waiting and the connection closed at once.
const MAX_REFUSALS: usize = 64;

/// Serve `listener` until `stop` turns true; then tell every peer, close every connection and
/// return. The listener closes when the last clone of it is dropped: here for a single master,
/// later for one in high-availability mode, whose standby serves the same socket next.
pub async fn serve(
    listener: Arc<TcpListener>,
    ctx: Arc<ConnCtx>,
    scheduler: Scheduler,
    sched_tx: mpsc::UnboundedSender<ToScheduler>,
    sched_rx: mpsc::UnboundedReceiver<ToScheduler>,
    mut stop: watch::Receiver<bool>,
) {
    let scheduler = scheduler.with_auth(ctx.auth.clone());
    let scheduler = tokio::spawn(scheduler.run(sched_rx, sched_tx.clone()));
    let policy = tokio::spawn(ctx.auth.clone().poll_policy());
    let shm_sweep = tokio::spawn(crate::shm_sweep::run());
    let mem_trim = tokio::spawn(crate::mem_trim::run());
    let mut conns = JoinSet::new();
    let mut refusals = JoinSet::new();
    let conn_stop = stop.clone();
    let mut backoff = AcceptBackoff::default();
    // While out of descriptors: when to try `accept` again.
    let mut paused_until: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            accepted = listener.accept(), if paused_until.is_none() => match accepted {
                Ok((stream, peer)) => {
                    backoff.on_success();
                    while conns.try_join_next().is_some() {}
                    while refusals.try_join_next().is_some() {}
                    match ctx.gate.admit(peer.ip()) {
                        Ok(place) => {
                            conns.spawn(connection::serve(stream, place, ctx.clone(), sched_tx.clone(), conn_stop.clone()));
                        }
                        Err(refusal) => {
                            if let Some(line) = ctx.gate.note_refusal(&refusal, Instant::now()) {
                                warn!("{line}");
                            }
                            if refusals.len() < MAX_REFUSALS {
                                refusals.spawn(connection::refuse_busy(stream, ctx.clone(), refusal));
                            } else {
                                connection::refuse_now(stream, &ctx, &refusal);
                            }
                        }
                    }
                }
                Err(e) => {
                    let got = backoff.on_error(&e, Instant::now());
                    if let Some(line) = got.log {
                        error!("{line}");
                    } else if got.pause.is_zero() {
                        debug!("accept failed: {e}");
                    }
                    if !got.pause.is_zero() {
                        paused_until = Some(tokio::time::Instant::now() + got.pause);
                    }
                }
            },
            () = wait_until(paused_until), if paused_until.is_some() => paused_until = None,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    info!("shutting down: telling {} connections", conns.len());
    drop(listener);
    refusals.shutdown().await;
    let _ = sched_tx.send(ToScheduler::Shutdown);
    while conns.join_next().await.is_some() {}
    drop(sched_tx);
    let _ = scheduler.await;
    policy.abort();
    shm_sweep.abort();
    mem_trim.abort();
}

async fn wait_until(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}
