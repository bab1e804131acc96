//! The outbound side of a connection: what a writer is told to do ([`Out`]), the byte-counted
//! queue the scheduler sends frames into ([`OutboundTx`]), the writer task that batches them
//! onto the socket (`write_loop`) and the error frames both the connections and the
//! scheduler build ([`error_msg`], [`rejected`]).
//!
//! It depends on nothing else in the master: [`crate::connection`] and [`crate::scheduler`]
//! both use it, so neither has to reach into the other.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use rtpool_proto::{encode, encode_segmented, Msg};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

/// What a connection writer is told to do.
#[derive(Debug)]
pub enum Out {
    /// Encode and send this message.
    Send(Msg),
    /// Send this message, then close the connection.
    SendAndClose(Msg),
}

/// An `ERROR` frame with this code, message and reference (0: none).
pub fn error_msg(code: &str, message: impl Into<String>, reference: u64) -> Msg {
    Msg::Error {
        code: code.into(),
        message: message.into(),
        reference,
    }
}

/// The non-fatal `rejected` error for a submission.
pub fn rejected(req_id: u64, message: String) -> Msg {
    Msg::Error {
        code: "rejected".into(),
        message,
        reference: req_id,
    }
}

/// Largest write the writer batches before flushing.
const WRITE_BATCH_BYTES: usize = 1 << 20;

/// The grid every connection's silence timer fires on (the writer's idle heartbeat here, the
/// reader's lease in `connection::reader`). tokio fires each timer at its own millisecond, so
/// 10,000 connections whose timers fall at random instants woke the idle master about once a
/// millisecond for a timer alone (issue 25); on the grid, the timers due in one step fire in
/// one wake-up. The cost is a timer up to one step late, nothing against a lease of seconds.
pub(crate) const TIMER_STEP: std::time::Duration = std::time::Duration::from_millis(64);

/// `deadline` moved up to the next point of the [`TIMER_STEP`] grid (the grid starts at the
/// first call in this process; a deadline before it is returned as it is).
pub(crate) fn on_grid(deadline: Instant) -> Instant {
    let origin = origin();
    let step = TIMER_STEP.as_nanos();
    let Some(offset) = deadline.checked_duration_since(origin) else {
        return deadline;
    };
    let steps = offset.as_nanos().div_ceil(step);
    // At most 30 years of nanoseconds (`connection::NEVER`): fits in u64.
    origin + std::time::Duration::from_nanos(u64::try_from(steps * step).unwrap_or(u64::MAX))
}

/// The first instant any connection timer looked at in this process: the [`TIMER_STEP`] grid's
/// origin, and the zero of [`Liveness`]'s stamps.
fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    Instant::from_std(*ORIGIN.get_or_init(std::time::Instant::now))
}

/// What a worker connection's reader needs to know of the core to judge its silence (issue
/// 25): whether the worker holds a task (the lease protects only those), and since when. The
/// scheduler writes it, the reader reads it when its silence timer fires; nothing on a frame's
/// path waits for it.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// The core counts a task on this connection: set when the scheduler assigns one, cleared
    /// when an event of the worker (a result, a return) left it none.
    held: AtomicBool,
    /// When the scheduler last assigned a task here: nanoseconds since [`origin`].
    assigned_at: AtomicU64,
    /// The reader judges the connection by its idle limit (its timer may be far off): an
    /// assignment must wake it through `nudge` to apply the lease from now.
    parked: AtomicBool,
    /// Wakes a parked reader.
    pub(crate) nudge: Notify,
}

impl Liveness {
    /// A task was assigned on this connection at `now`.
    pub(crate) fn assigned(&self, now: Instant) {
        let at = now.saturating_duration_since(origin()).as_nanos();
        self.assigned_at
            .store(u64::try_from(at).unwrap_or(u64::MAX), Ordering::Relaxed);
        // SeqCst with `park`: either the reader sees `held`, or this sees `parked`.
        if !self.held.swap(true, Ordering::SeqCst) && self.parked.load(Ordering::SeqCst) {
            self.nudge.notify_one();
        }
    }

    /// The worker holds no task any more.
    pub(crate) fn released(&self) {
        self.held.store(false, Ordering::SeqCst);
    }

    /// When the worker got a task it still holds (its last assignment), or `None`: it holds none.
    pub(crate) fn held_since(&self) -> Option<Instant> {
        self.held.load(Ordering::SeqCst).then(|| {
            let at = self.assigned_at.load(Ordering::Relaxed);
            origin() + std::time::Duration::from_nanos(at)
        })
    }

    /// Whether the core counts a task on this connection.
    pub(crate) fn holds(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// The reader waits by the idle limit (`true`) or the lease (`false`); returns when the
    /// worker got its last task if it holds one (checked after `parked` was set, so an
    /// assignment racing with this is seen here or nudges the reader).
    pub(crate) fn park(&self, parked: bool) -> Option<Instant> {
        // (The reader ignores the answer when it unparks.)
        self.parked.store(parked, Ordering::SeqCst);
        self.held_since()
    }
}

/// The sending end of one connection's outbound queue, held by the scheduler.
///
/// The queue itself is unbounded (the scheduler never waits for a peer), but it counts the bytes
/// it holds: a [`send`](OutboundTx::send) that would take them past the limit is refused, and
/// the connection is closed with `ERROR slow_consumer` (its writer drops what is queued, its
/// reader stops). A queue holding nothing takes one message of any size, so a frame larger than
/// the limit (up to `max_frame_bytes`) can still be delivered to a peer that reads.
#[derive(Debug, Clone)]
pub struct OutboundTx {
    tx: mpsc::UnboundedSender<(Out, usize)>,
    /// Shared with the writer; the connection's reader waits on its `notify`.
    pub(crate) shared: Arc<Outbound>,
}

/// What a connection's [`OutboundTx`] and its writer share.
#[derive(Debug)]
pub(crate) struct Outbound {
    /// Estimated encoded bytes sent to the queue and not yet written to the socket.
    queued_bytes: AtomicUsize,
    limit_bytes: usize,
    /// Set once, by the send that found the queue full.
    overflowed: AtomicBool,
    /// Wakes the connection's reader when the queue overflowed.
    pub(crate) notify: Notify,
    /// Whether the worker on this connection holds a task (unused for clients).
    pub(crate) live: Liveness,
}

/// The writer's end of an [`OutboundTx`].
#[derive(Debug)]
pub struct OutboundRx {
    rx: mpsc::UnboundedReceiver<(Out, usize)>,
    shared: Arc<Outbound>,
}

impl OutboundRx {
    /// The next queued message, without waiting (for tests and benches of what the scheduler
    /// sends; a connection's writer does not use it).
    pub fn try_recv(&mut self) -> Option<Out> {
        self.rx.try_recv().ok().map(|(out, _)| out)
    }
}

impl OutboundTx {
    /// A queue that holds at most `limit_bytes` (estimated encoded size) at once.
    pub fn new(limit_bytes: usize) -> (Self, OutboundRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Outbound {
            queued_bytes: AtomicUsize::new(0),
            limit_bytes,
            overflowed: AtomicBool::new(false),
            notify: Notify::new(),
            live: Liveness::default(),
        });
        let rx = OutboundRx {
            rx,
            shared: shared.clone(),
        };
        (Self { tx, shared }, rx)
    }

    /// Queue `out` for the peer. False when it was not queued: the connection is gone, or the
    /// queue was full (the connection is then being closed as a slow consumer). Never blocks.
    pub fn send(&self, out: Out) -> bool {
        let shared = &*self.shared;
        if shared.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let size = estimated_size(&out);
        let before = shared.queued_bytes.fetch_add(size, Ordering::Relaxed);
        if before > 0 && before + size > shared.limit_bytes {
            shared.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            shared.overflowed.store(true, Ordering::Relaxed);
            shared.notify.notify_one();
            // Wakes a writer waiting on an empty queue; it sends the error and closes.
            let _ = self.tx.send((Out::Send(Msg::Heartbeat), 0));
            return false;
        }
        if self.tx.send((out, size)).is_err() {
            shared.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether the worker on this connection holds a task, and since when.
    pub(crate) fn liveness(&self) -> &Liveness {
        &self.shared.live
    }

    /// Estimated bytes queued and not yet written (for tests and gauges).
    pub fn queued_bytes(&self) -> usize {
        self.shared.queued_bytes.load(Ordering::Relaxed)
    }
}

/// An upper-bound-ish estimate of `out`'s encoded size: its payloads plus a per-item overhead.
/// It need not be exact, only cheap and the same number on both ends of the queue.
fn estimated_size(out: &Out) -> usize {
    let (Out::Send(msg) | Out::SendAndClose(msg)) = out;
    match msg {
        Msg::Results { results, .. } => {
            16 + results.iter().map(|r| 48 + r.data.len()).sum::<usize>()
        }
        Msg::Assign { tasks, .. } => {
            16 + tasks
                .iter()
                .map(|t| 64 + t.args.len() + t.fn_code.as_ref().map_or(0, |c| c.len()))
                .sum::<usize>()
        }
        Msg::AssignCalls { calls } => {
            16 + calls
                .iter()
                .map(|c| {
                    64 + c.name.len()
                        + c.version.len()
                        + c.args.len()
                        + c.inputs.iter().map(|i| 5 + i.len()).sum::<usize>()
                        + 48 * c.res.len()
                })
                .sum::<usize>()
        }
        Msg::FunctionsReply { functions, .. } => {
            16 + functions
                .iter()
                .map(|f| 32 + f.name.len() + f.version.len() + f.interface.len())
                .sum::<usize>()
        }
        _ => 64,
    }
}

fn slow_consumer(limit_bytes: usize) -> Msg {
    error_msg(
        "slow_consumer",
        format!(
            "more than {} MiB of frames waited for this peer to read them: closing; read \
             results as they come, or raise the master's --max-buffered-mb",
            limit_bytes >> 20
        ),
        0,
    )
}

/// Writes what the scheduler queues for this connection, several frames per write, until the
/// queue closes or a frame asks to close the connection.
///
/// When nothing was written for `idle` (`None`: never), the writer sends a `HEARTBEAT` of its
/// own, so a peer hears from the master at least once per `idle` whatever it sends: peers judge
/// the master silent after 3 leases and a heartbeat, and `idle` is 1.5 leases
/// (`connection::master_heartbeat_period`). The master answers only
/// a connection's first `HEARTBEAT` (`connection::reader`): an idle link costs one frame each way per interval, and a busy
/// one none. One timer per connection for its life: a write only notes its time, and the timer,
/// when it fires early, moves itself to the last write plus `idle` (no timer work per write),
/// on the [`TIMER_STEP`] grid.
///
/// Frames are encoded in protocol version 2: a payload of at least
/// [`rtpool_proto::SEGMENT_MIN_BYTES`] is not copied into `buf` but written from where the
/// reader left it (a slice of the frame it came in), with vectored writes.
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: OutboundRx,
    idle: Option<std::time::Duration>,
) {
    // Far enough never to fire, near enough not to overflow an `Instant`.
    let idle = idle.unwrap_or(std::time::Duration::from_secs(30 * 365 * 86_400));
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut batch = Batch::default();
    let shared = rx.shared.clone();
    let mut last_write = Instant::now();
    let timer = tokio::time::sleep_until(on_grid(last_write + idle));
    tokio::pin!(timer);
    loop {
        let (first, size) = tokio::select! {
            biased;
            next = rx.rx.recv() => match next {
                Some(next) => next,
                None => return,
            },
            () = &mut timer => {
                let due = last_write + idle;
                if Instant::now() < due {
                    timer.as_mut().reset(on_grid(due));
                    continue;
                }
                (Out::Send(Msg::Heartbeat), 0)
            }
        };
        let mut batch_bytes = size;
        let mut close = batch.push(first, &mut buf);
        while !close && buf.len() + batch.bytes < WRITE_BATCH_BYTES {
            match rx.rx.try_recv() {
                Ok((out, size)) => {
                    batch_bytes += size;
                    close = batch.push(out, &mut buf);
                }
                Err(_) => break,
            }
        }
        if shared.overflowed.load(Ordering::Relaxed) {
            // Nothing of `buf` was written yet, so the stream is at a frame boundary.
            buf.clear();
            batch.clear();
            encode(&slow_consumer(shared.limit_bytes), &mut buf);
            close = true;
        }
        batch.seal(&mut buf);
        if write_chunks(&mut wr, &mut batch.chunks).await.is_err() {
            return;
        }
        last_write = Instant::now();
        if timer.deadline() <= last_write {
            timer.as_mut().reset(on_grid(last_write + idle));
        }
        shared
            .queued_bytes
            .fetch_sub(batch_bytes, Ordering::Relaxed);
        batch.clear();
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

/// The chunks of one write: encoded heads (frozen pieces of the writer's buffer) and the
/// payload segments between them, in stream order.
#[derive(Default)]
struct Batch {
    chunks: VecDeque<Bytes>,
    segments: Vec<Bytes>,
    /// Bytes in `chunks`.
    bytes: usize,
}

impl Batch {
    /// Encodes `out` (heads into `buf`, segments aside); true when it asks to close.
    fn push(&mut self, out: Out, buf: &mut BytesMut) -> bool {
        let (msg, close) = match out {
            Out::Send(msg) => (msg, false),
            Out::SendAndClose(msg) => (msg, true),
        };
        encode_segmented(&msg, buf, &mut self.segments);
        if !self.segments.is_empty() {
            self.seal(buf);
            for seg in self.segments.drain(..) {
                self.bytes += seg.len();
                self.chunks.push_back(seg);
            }
        }
        close
    }

    /// Moves what `buf` holds into the chunks.
    fn seal(&mut self, buf: &mut BytesMut) {
        if !buf.is_empty() {
            let head = buf.split().freeze();
            self.bytes += head.len();
            self.chunks.push_back(head);
        }
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.segments.clear();
        self.bytes = 0;
    }
}

/// Most chunks handed to one vectored write (Linux takes up to 1024).
const MAX_IOVECS: usize = 64;

/// Writes every chunk, in order, with vectored writes (one system call for a head and the
/// payloads after it where the stream allows it).
async fn write_chunks<W: AsyncWrite + Unpin>(
    wr: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !chunks.is_empty() {
        let slices: Vec<IoSlice<'_>> = chunks
            .iter()
            .take(MAX_IOVECS)
            .map(|c| IoSlice::new(c))
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let front = chunks.front_mut().expect("wrote no more than the chunks");
            if n >= front.len() {
                n -= front.len();
                chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}
