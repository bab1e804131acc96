//! A standby's listener: every connection is answered `ERROR not_leader` naming the leader
//! (its `HELLO` drained, TLS first when the master serves TLS) and closed, until the lease
//! thread reports that this master holds the lease.

use std::sync::Arc;
use std::time::Duration;

use rtpool_proto::Msg;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::lease::LeaseView;
use crate::connection::{self, ConnCtx};
use crate::status::schema::HaStatus;
use crate::status::Status;

/// Refusals answered at once, at most; past that a connection is closed without an answer
/// (its peer retries, as after a refused connect).
const MAX_REFUSALS: usize = 64;

/// The `ERROR not_leader` a standby answers with.
pub fn not_leader(view: &LeaseView) -> Msg {
    Msg::Error {
        code: "not_leader".into(),
        message: format!(
            "this master is a standby: it does not serve; connect to the leader {}",
            view.leader_suffix()
        ),
        reference: 0,
    }
}

/// The status snapshot of a standby (no scheduler runs): its address and role.
pub fn standby_status(address: &str, view: &LeaseView) -> Status {
    let mut status = Status::default();
    status.master.address = address.to_string();
    status.master.version = env!("CARGO_PKG_VERSION");
    status.master.pid = std::process::id();
    status.ha = Some(HaStatus {
        role: "standby",
        epoch: view.epoch,
        leader: view.leader.clone(),
        db_ok: view.db_ok,
    });
    status
}

/// Serves `listener` as a standby until the lease is ours with an epoch above `led` (the
/// last term's); returns it.
pub async fn serve(
    listener: &TcpListener,
    ctx: &Arc<ConnCtx>,
    view: &mut watch::Receiver<LeaseView>,
    status: &watch::Sender<Arc<Status>>,
    address: &str,
    led: u64,
) -> u64 {
    let mut refusals = JoinSet::new();
    let mut logged: Option<(u64, Option<String>)> = None;
    loop {
        let mut now = view.borrow_and_update().clone();
        match now.held {
            Some(epoch) if epoch > led => {
                refusals.shutdown().await;
                return epoch;
            }
            // The term that just ended, not yet resigned by the lease thread.
            Some(_) => now.leader = None,
            None => {}
        }
        status.send_replace(Arc::new(standby_status(address, &now)));
        let seen = (now.epoch, now.leader.clone());
        if logged.as_ref() != Some(&seen) && now.db_ok {
            tracing::info!(
                "high availability: standby; the lease is at epoch {} {}",
                now.epoch,
                now.leader_suffix()
            );
            logged = Some(seen);
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    while refusals.try_join_next().is_some() {}
                    if refusals.len() < MAX_REFUSALS {
                        refusals.spawn(connection::refuse_with(stream, ctx.clone(), not_leader(&now)));
                    }
                }
                // Out of descriptors or memory: pause rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            changed = view.changed() => {
                if changed.is_err() {
                    // The lease thread ended (it never does before the master): this master
                    // cannot lead again; keep refusing, looking once a second.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}
