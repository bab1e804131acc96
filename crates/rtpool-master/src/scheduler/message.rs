//! What connection tasks tell the scheduler task ([`ToScheduler`]).

use rtpool_core::Event;
use rtpool_proto::Msg;
use tokio::sync::oneshot;

use crate::outbound::OutboundTx;
use crate::stats::MasterStats;
use crate::store::UserQuota;

/// Messages to the scheduler task.
#[derive(Debug)]
pub enum ToScheduler {
    /// A connection authenticated; its writer listens on `tx`.
    Register {
        /// Session id.
        session: u64,
        /// The authenticated user's name.
        user: String,
        /// The name the peer gave in its `HELLO`.
        name: String,
        /// The identity a worker gave in its `HELLO` (empty: none).
        identity: String,
        /// The address it connected from (without the port).
        host: String,
        /// The peer's outbound queue.
        tx: OutboundTx,
        /// `ClientJoined` or `WorkerJoined`.
        event: Event,
    },
    /// An event from an authenticated connection.
    Event(Event),
    /// Several events read from one buffer, handled in order.
    Events(Vec<Event>),
    /// A connection closed: `ClientLost` or `WorkerLost`.
    Closed {
        /// Session id.
        session: u64,
        /// The loss event.
        event: Event,
    },
    /// Send `msg` to a connection, in order with the answers to its earlier events (a
    /// rejected `SUBMIT` must not overtake the `ACCEPTED` of the one before); `close` closes
    /// the connection after it.
    Reply {
        /// Session id.
        session: u64,
        /// The message.
        msg: Msg,
        /// Close the connection after sending.
        close: bool,
    },
    /// A client's `CLUSTER_STATUS`: answer it with the status snapshot.
    ClusterStatus {
        /// Session id.
        session: u64,
        /// The request id to echo.
        req_id: u64,
    },
    /// Report gauges.
    Stats(oneshot::Sender<MasterStats>),
    /// Quotas re-read from the store after a usage flush.
    Quotas(Vec<UserQuota>),
    /// Tell every peer the master is going away, then stop.
    Shutdown,
    /// High availability: this master no longer leads. Close every connection with
    /// `ERROR not_leader` and `message` (which names the leader), then stop.
    Fenced {
        /// Human-readable, ending `(leader: HOST:PORT)` or `(leader: unknown)`.
        message: String,
    },
}
