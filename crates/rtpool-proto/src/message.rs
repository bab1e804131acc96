//! The messages of protocol version 2, one enum variant per message kind.
//!
//! Field order and types follow `docs/protocol.md` exactly; the codec in `codec/` turns these
//! values into msgpack arrays and back. Package options are [`PackageOpts`], defined in
//! `options.rs`. Payloads are [`Bytes`] so that decoding a frame slices
//! it instead of copying user data.

use bytes::Bytes;

use crate::counts::PackageCounts;
use crate::error::ProtoError;
use crate::kind;
use crate::options::{Labels, PackageOpts, Resources};

/// Protocol version spoken by this crate.
pub const PROTOCOL_VERSION: u32 = 2;

/// Task status codes shared by [`TaskResult`] and [`WorkerResult`].
pub mod status {
    /// The function returned; `data` is the pickled value.
    pub const OK: u8 = 0;
    /// The function raised; `data` is the pickled error report.
    pub const ERROR: u8 = 1;
    /// The task was cancelled; `data` is a UTF-8 message.
    pub const CANCELLED: u8 = 2;
    /// The system could not run the task; `data` is a UTF-8 message.
    pub const FAILED: u8 = 3;
    /// The task ran past its time limit and was killed; `data` is a UTF-8 message.
    pub const TIMEOUT: u8 = 4;
    /// The task's worker was lost on each of its attempts (a poison task); `data` is a UTF-8
    /// message naming the attempts.
    pub const LOST: u8 = 5;
    /// The user's compute-time quota ran out before the task ran; `data` is a UTF-8 message.
    pub const QUOTA: u8 = 6;
    /// The task could not make its package's deadline and the package's `on_miss` is
    /// `"drop"`; `data` is a UTF-8 message.
    pub const MISSED: u8 = 7;
    /// The task's copies never reached the quorum; `data` is a msgpack array
    /// `[message: str, [[worker: str, status: u8, data: bin], ...]]` of every copy's result.
    pub const DISAGREE: u8 = 8;
}

/// Role a peer claims in its `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Submits packages and receives results.
    Client,
    /// Pulls tasks and publishes results.
    Worker,
}

impl Role {
    /// The role's name on the wire: `"client"` or `"worker"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Worker => "worker",
        }
    }

    /// Parses the wire name of a role; `None` for anything but `"client"` and `"worker"`.
    pub fn from_wire(name: &[u8]) -> Option<Role> {
        match name {
            b"client" => Some(Role::Client),
            b"worker" => Some(Role::Worker),
            _ => None,
        }
    }
}

/// One task's result as the master sends it to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskResult {
    /// Position of the task in its package.
    pub index: u32,
    /// One of [`status`].
    pub status: u8,
    /// Pickled value, pickled error report, or UTF-8 message (see [`status`]).
    pub data: Bytes,
    /// Master: receipt of the package to assignment, microseconds.
    pub queue_us: u64,
    /// Master: assignment sent to result received, microseconds.
    pub worker_us: u64,
    /// Worker: execution time, microseconds.
    pub exec_us: u64,
    /// Worker: receipt of the assignment to start of execution, microseconds.
    pub wait_us: u64,
    /// Worker: end of execution to sending the result, microseconds.
    pub flush_us: u64,
    /// Master: how long after the package's deadline the result came, microseconds; 0 when
    /// on time or without a deadline.
    pub late_us: u64,
}

/// One task sent to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The master's task id, opaque to the worker.
    pub task: u64,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// SHA-256 of the function's code.
    pub fn_hash: Bytes,
    /// The code, present the first time this connection gets `fn_hash`.
    pub fn_code: Option<Bytes>,
    /// Opaque argument payload.
    pub args: Bytes,
    /// Execution time limit, milliseconds; 0 = none.
    pub timeout_ms: u32,
    /// The results of the tasks this one depends on, held by the master (package option
    /// `after`), in order; empty for every other task (and then not on the wire).
    pub inputs: Vec<Bytes>,
    /// What the task holds of its worker while it runs (its package's `resources`), for the
    /// worker to pick devices (`gpu`: which GPUs); empty for every other task (and then not on
    /// the wire: an eighth field, after `inputs`).
    pub res: Resources,
}

/// One task's result as a worker publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerResult {
    /// The master's task id from the [`Assignment`].
    pub task: u64,
    /// Attempt number from the [`Assignment`].
    pub attempt: u32,
    /// One of [`status`].
    pub status: u8,
    /// Pickled value, pickled error report, or UTF-8 message.
    pub data: Bytes,
    /// Execution time, microseconds.
    pub exec_us: u64,
    /// Receipt of the assignment to start of execution, microseconds.
    pub wait_us: u64,
    /// End of execution to sending the result, microseconds.
    pub flush_us: u64,
}

/// A named function a worker serves, as its `SERVE` declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedFunction {
    /// The function's name, 1 to [`MAX_FUNCTION_NAME_BYTES`](crate::MAX_FUNCTION_NAME_BYTES) bytes.
    pub name: String,
    /// Its version, at most [`MAX_FUNCTION_VERSION_BYTES`](crate::MAX_FUNCTION_VERSION_BYTES) bytes.
    pub version: String,
    /// Its interface: an opaque msgpack blob (`docs/rpc.md`) of at most
    /// [`MAX_INTERFACE_BYTES`](crate::MAX_INTERFACE_BYTES), which the master hands out without reading it.
    pub interface: Bytes,
}

/// One call of a `CALL`; call `i` is task `i` of the package the master creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The function's name, 1 to [`MAX_FUNCTION_NAME_BYTES`](crate::MAX_FUNCTION_NAME_BYTES) bytes.
    pub name: String,
    /// Its version, at most [`MAX_FUNCTION_VERSION_BYTES`](crate::MAX_FUNCTION_VERSION_BYTES) bytes; empty means the newest
    /// version served.
    pub version: String,
    /// Opaque argument payload (msgpack, `docs/rpc.md`).
    pub args: Bytes,
    /// Indices of earlier calls of the same `CALL` whose result blobs this call takes as its
    /// inputs, in this order.
    pub deps: Vec<u32>,
    /// Send this call's result data to the client even though other calls depend on it.
    pub fetch: bool,
}

/// One call sent to a worker, in `ASSIGN_CALLS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallAssignment {
    /// The master's task id, opaque to the worker.
    pub task: u64,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The function's name.
    pub name: String,
    /// The function's version (the one the master resolved).
    pub version: String,
    /// Opaque argument payload.
    pub args: Bytes,
    /// Result blobs of the call's dependencies, in the order of its `deps`.
    pub inputs: Vec<Bytes>,
    /// Execution time limit, milliseconds; 0 = none.
    pub timeout_ms: u32,
    /// Keep the result on the worker and answer with a reference blob (an intermediate result
    /// of a transaction); on the wire only when true or when `res` follows, as an eighth
    /// field.
    pub keep: bool,
    /// What the call holds of its worker while it runs (its package's `resources`), as a
    /// ninth field only when not empty (the same rule as [`Assignment::res`]).
    pub res: Resources,
}

/// One served function as `FUNCTIONS_REPLY` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionInfo {
    /// The function's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Connected workers that serve it.
    pub servers: u32,
    /// Its interface blob, as a worker's `SERVE` declared it.
    pub interface: Bytes,
}

/// The bits of `HELLO.features`.
pub mod features {
    /// The worker heartbeats at `WELCOME.idle_heartbeat_ms` while it holds no task, and at
    /// `heartbeat_ms` from the moment it receives one.
    pub const IDLE_HEARTBEAT: u32 = 1;
}

/// Every message of protocol version 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Kind 1: first frame of every connection.
    Hello {
        /// Protocol version the peer speaks.
        version: u32,
        /// Client or worker.
        role: Role,
        /// Secret token for that role.
        token: String,
        /// Informational peer name (host and pid), at most 256 bytes.
        name: String,
        /// Tasks a worker runs at once; 0 for clients.
        slots: u32,
        /// Optional trailing field: what a worker runs on, the same across its reconnects and
        /// the restarts of its process (`host:supervisor-pid/slot`), at most 256 bytes. The
        /// master keeps what it learns of the worker's speed under it. `None`: not sent.
        identity: Option<String>,
        /// Optional trailing field (after `identity`): what a worker has to hold for tasks
        /// that ask (`gpu=2`); empty: not sent.
        resources: Resources,
        /// Optional trailing field (after `resources`): the worker's labels (`zone=a`);
        /// empty: not sent.
        labels: Labels,
        /// Optional trailing field (after `labels`): what the worker's side of the protocol
        /// knows beyond version 2, a bit set of [`features`]; 0: not sent.
        features: u32,
    },
    /// Kind 2: handshake accepted.
    Welcome {
        /// Protocol version of the master.
        version: u32,
        /// Connection id.
        session: u64,
        /// Largest frame body accepted from now on.
        max_frame_bytes: u32,
        /// How often an idle peer should send `HEARTBEAT`.
        heartbeat_ms: u32,
        /// A worker silent for this long loses its connection and its tasks.
        lease_ms: u32,
        /// Random number drawn at master start: a change tells a reconnecting peer the master
        /// restarted.
        instance: u64,
        /// Optional trailing field, only to a worker whose `HELLO` had
        /// [`features::IDLE_HEARTBEAT`]: how often that worker heartbeats while it holds no
        /// task (the master's silence limit for it is then this plus `lease_ms`); 0: not sent
        /// (the worker heartbeats every `heartbeat_ms` whatever it holds).
        idle_heartbeat_ms: u32,
    },
    /// Kind 3: an error; fatal codes close the connection.
    Error {
        /// Machine-readable code (see `docs/protocol.md`).
        code: String,
        /// Human-readable message saying what to try.
        message: String,
        /// The request or package the error refers to, or 0.
        reference: u64,
    },
    /// Kind 10: a package of tasks sharing one function.
    Submit {
        /// Client-chosen request id, unique on the connection.
        req_id: u64,
        /// SHA-256 of `fn_code` (32 bytes).
        fn_hash: Bytes,
        /// The pickled function.
        fn_code: Bytes,
        /// Package options.
        opts: PackageOpts,
        /// One opaque payload per task.
        tasks: Vec<Bytes>,
    },
    /// Kind 11: a package was accepted.
    Accepted {
        /// The `req_id` of the `SUBMIT`.
        req_id: u64,
        /// The master's package id.
        package: u64,
        /// An optional third field: a warning about the package (the master is overloaded and
        /// misses deadlines). Absent (`None`) in the usual two-field form.
        notice: Option<String>,
    },
    /// Kind 12: results of one package, in completion order.
    Results {
        /// Package id.
        package: u64,
        /// One entry per completed task.
        results: Vec<TaskResult>,
    },
    /// Kind 13: cancel tasks of a package (empty `indices` = all).
    Cancel {
        /// Package id.
        package: u64,
        /// Task indices to cancel; empty cancels the whole package.
        indices: Vec<u32>,
    },
    /// Kind 14: ask for a package's counters.
    Status {
        /// Client-chosen request id.
        req_id: u64,
        /// Package id.
        package: u64,
    },
    /// Kind 15: a package's counters.
    StatusReply {
        /// The `req_id` of the `STATUS`.
        req_id: u64,
        /// Package id.
        package: u64,
        /// Its counters, one wire field each.
        counts: PackageCounts,
        /// Workers connected now that can run its tasks: every worker for a package of code,
        /// those serving its function for a package of calls (a client waiting on a result
        /// says "no worker is connected" when it is 0).
        workers: u32,
    },
    /// Kind 16: re-attach to a package after a reconnect.
    Attach {
        /// Client-chosen request id.
        req_id: u64,
        /// Package id.
        package: u64,
    },
    /// Kind 17: the client received the first `count` results of a package on this connection
    /// since the `ACCEPTED` that answered its `SUBMIT` or `ATTACH`.
    Ack {
        /// Package id.
        package: u64,
        /// Cumulative count of `TaskResult` entries received.
        count: u64,
    },
    /// Kind 18: a package of calls of named functions (grid RPC); a transaction when calls
    /// depend on each other.
    Call {
        /// Client-chosen request id, unique on the connection.
        req_id: u64,
        /// Package options, as in `SUBMIT` (the master refuses those that do not apply to
        /// calls).
        opts: PackageOpts,
        /// The calls; call `i` is task `i` of the package.
        calls: Vec<Call>,
    },
    /// Kind 19: ask for the registry of served functions.
    Functions {
        /// Client-chosen request id.
        req_id: u64,
        /// One name's versions, or every function when empty.
        name: String,
    },
    /// Kind 20: the worker grants more credits.
    Pull {
        /// Credits added.
        credits: u32,
    },
    /// Kind 21: tasks for a worker.
    Assign {
        /// At most as many as the worker's credits.
        tasks: Vec<Assignment>,
    },
    /// Kind 22: results from a worker.
    Result {
        /// One entry per finished task.
        results: Vec<WorkerResult>,
    },
    /// Kind 23: assigned tasks handed back unstarted, as `(task, attempt)`.
    Return {
        /// Tasks handed back.
        tasks: Vec<(u64, u32)>,
    },
    /// Kind 24: the worker is alive.
    Heartbeat,
    /// Kind 25: the worker wants no more tasks (graceful shutdown).
    Drain,
    /// Kind 26: stop these assigned tasks, as `(task, attempt)`; the master already answered
    /// them.
    Abort {
        /// Tasks to stop.
        tasks: Vec<(u64, u32)>,
    },
    /// Kind 27: the named functions a worker serves; at most once per connection, before its
    /// first `PULL`.
    Serve {
        /// At most [`MAX_SERVE_FUNCTIONS`](crate::MAX_SERVE_FUNCTIONS).
        functions: Vec<ServedFunction>,
    },
    /// Kind 28: calls for a worker (credits, leases, `ABORT`, `RETURN` and `RESULT` as for
    /// `ASSIGN`).
    AssignCalls {
        /// At most as many as the worker's credits, together with any `ASSIGN`.
        calls: Vec<CallAssignment>,
    },
    /// Kind 29: the answer to `FUNCTIONS`.
    FunctionsReply {
        /// The `req_id` of the `FUNCTIONS`.
        req_id: u64,
        /// Names sorted, newest version first within a name.
        functions: Vec<FunctionInfo>,
    },
    /// Kind 30: ask for the master's status snapshot (workers, queues, rates, latencies,
    /// deadlines, users), the same one `GET /api/status` serves.
    ClusterStatus {
        /// Client-chosen request id.
        req_id: u64,
    },
    /// Kind 31: the answer to `CLUSTER_STATUS`.
    ClusterStatusReply {
        /// The `req_id` of the `CLUSTER_STATUS`.
        req_id: u64,
        /// The snapshot: one msgpack map, kept here as its encoded bytes (written into the
        /// frame as they are, not wrapped in a `bin`). Its schema is `docs/operations.md`'s.
        status: Bytes,
    },
    /// Kind 32: the client no longer needs these results kept on workers (`docs/data.md`):
    /// `(session of the worker that holds it, key)` pairs.
    Release {
        /// Each key is [`KEPT_KEY_BYTES`](crate::KEPT_KEY_BYTES) long; at most [`MAX_RELEASE_KEYS`](crate::MAX_RELEASE_KEYS) of them.
        keys: Vec<(u64, Bytes)>,
    },
    /// Kind 33: forget these kept results (their owner released them).
    Drop {
        /// Each key is [`KEPT_KEY_BYTES`](crate::KEPT_KEY_BYTES) long.
        keys: Vec<Bytes>,
    },
}

impl Msg {
    /// The message kind written as the first array element on the wire (see [`kind`]).
    pub fn kind(&self) -> u8 {
        match self {
            Msg::Hello { .. } => kind::HELLO,
            Msg::Welcome { .. } => kind::WELCOME,
            Msg::Error { .. } => kind::ERROR,
            Msg::Submit { .. } => kind::SUBMIT,
            Msg::Accepted { .. } => kind::ACCEPTED,
            Msg::Results { .. } => kind::RESULTS,
            Msg::Cancel { .. } => kind::CANCEL,
            Msg::Status { .. } => kind::STATUS,
            Msg::StatusReply { .. } => kind::STATUS_REPLY,
            Msg::Attach { .. } => kind::ATTACH,
            Msg::Ack { .. } => kind::ACK,
            Msg::Call { .. } => kind::CALL,
            Msg::Functions { .. } => kind::FUNCTIONS,
            Msg::Pull { .. } => kind::PULL,
            Msg::Assign { .. } => kind::ASSIGN,
            Msg::Result { .. } => kind::RESULT,
            Msg::Return { .. } => kind::RETURN,
            Msg::Heartbeat => kind::HEARTBEAT,
            Msg::Drain => kind::DRAIN,
            Msg::Abort { .. } => kind::ABORT,
            Msg::Serve { .. } => kind::SERVE,
            Msg::AssignCalls { .. } => kind::ASSIGN_CALLS,
            Msg::FunctionsReply { .. } => kind::FUNCTIONS_REPLY,
            Msg::ClusterStatus { .. } => kind::CLUSTER_STATUS,
            Msg::ClusterStatusReply { .. } => kind::CLUSTER_STATUS_REPLY,
            Msg::Release { .. } => kind::RELEASE,
            Msg::Drop { .. } => kind::DROP,
        }
    }

    /// The upper-case name of the message kind, as in `docs/protocol.md` (`"SUBMIT"`).
    pub fn name(&self) -> &'static str {
        // Every variant has a kind that `kind::name` knows; the match in `kind()` and the table
        // in `kind::name` are tested against each other.
        kind::name(self.kind()).unwrap_or("UNKNOWN")
    }
}

/// The `ERROR` frame of a decoding failure lives with the messages, so that [`ProtoError`]
/// does not depend on them.
impl ProtoError {
    /// The `ERROR` message answering this error: its code, its display text and its reference.
    pub fn to_msg(&self) -> Msg {
        Msg::Error {
            code: self.code().to_owned(),
            message: self.to_string(),
            reference: self.reference(),
        }
    }
}
