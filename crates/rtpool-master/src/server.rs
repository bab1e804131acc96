//! The accept loop and the shutdown sequence (as in mini-redis: broadcast stop, then wait until
//! every connection task has finished).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::connection::{self, ConnCtx};
use crate::scheduler::{Scheduler, ToScheduler};

/// Connections being refused with `ERROR busy` at once, at most.
const MAX_REFUSALS: usize = 64;

/// Serve `listener` until `stop` turns true; then tell every peer, close every connection and
/// return.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<ConnCtx>,
    scheduler: Scheduler,
    sched_tx: mpsc::UnboundedSender<ToScheduler>,
    sched_rx: mpsc::UnboundedReceiver<ToScheduler>,
    mut stop: watch::Receiver<bool>,
) {
    let scheduler = scheduler.with_auth(ctx.auth.clone());
    let scheduler = tokio::spawn(scheduler.run(sched_rx, sched_tx.clone()));
    let policy = tokio::spawn(ctx.auth.clone().poll_policy());
    let mut conns = JoinSet::new();
    // Connections beyond the limit, being told `ERROR busy`; bounded too, past that they are
    // closed without a word.
    let mut refusals = JoinSet::new();
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    while conns.try_join_next().is_some() {}
                    while refusals.try_join_next().is_some() {}
                    if conns.len() < ctx.max_connections {
                        conns.spawn(connection::serve(stream, ctx.clone(), sched_tx.clone(), conn_stop.clone()));
                    } else if refusals.len() < MAX_REFUSALS {
                        warn!("connection limit ({}) reached: refusing a connection", ctx.max_connections);
                        refusals.spawn(connection::refuse_busy(stream, ctx.clone()));
                    }
                }
                // Out of file descriptors and the like: log, and keep serving the others.
                Err(e) => error!("accept failed: {e}"),
            },
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
}
