//! [`ClientError`]: every way a call from this crate can fail, one variant per situation a
//! caller may handle, each message saying what failed, where, and what to try.
//!
//! This module owns the mapping from a task status (`rtpool_proto::status`) and an `ERROR`
//! code of the master to a variant; building the messages' context (the address, the
//! function) is the caller's.

use std::time::Duration;

/// The crate's result type.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Everything that can go wrong talking to a master or calling a served function.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No worker serves the function (or that version of it).
    #[error("no worker serves {function}; served: {served}; start a worker with `rtpool worker --serve MODULE` or check the name")]
    UnknownFunction {
        /// The function, with its version when one was asked for (`dmmul version 2`).
        function: String,
        /// What the master lists as served (`dmmul (1), linpack (1)`), or `nothing`.
        served: String,
    },

    /// The arguments do not match the function's interface; nothing was sent.
    #[error("{function}: {problem}")]
    WrongArguments {
        /// The function called.
        function: String,
        /// What is wrong: the argument, what was expected and what was given.
        problem: String,
    },

    /// The call could not make its deadline (`status 7`, the master dropped it).
    #[error("{function} missed its deadline: {message}; give it a later deadline or more workers")]
    DeadlineMissed {
        /// The function called.
        function: String,
        /// The master's message.
        message: String,
    },

    /// The worker running the call was lost on each of its attempts (a poison call).
    #[error("{function}: its worker was lost on every attempt: {message}")]
    WorkerLost {
        /// The function called.
        function: String,
        /// The master's message, naming the attempts.
        message: String,
    },

    /// The call ran past its time limit ([`CallOptions::timeout`](crate::CallOptions)) and
    /// was killed.
    #[error("{function} ran past its time limit and was killed: {message}")]
    TimeLimit {
        /// The function called.
        function: String,
        /// The worker's message.
        message: String,
    },

    /// The function raised on the worker.
    #[error("{function} raised {type_name}: {message}")]
    Remote {
        /// The function called.
        function: String,
        /// The remote exception's type (`ValueError`, `numpy.linalg.LinAlgError`).
        type_name: String,
        /// Its message.
        message: String,
        /// The remote traceback.
        traceback: String,
    },

    /// The system could not run the call (a failed dependency, its function left, a quota).
    #[error("{function} failed: {message}")]
    Failed {
        /// The function called.
        function: String,
        /// The master's message.
        message: String,
    },

    /// The call was cancelled (by [`CallHandle::cancel`](crate::CallHandle::cancel), or with
    /// the package).
    #[error("{function} was cancelled")]
    Cancelled {
        /// The function called.
        function: String,
    },

    /// The call's result is a transaction intermediate that stayed on its worker.
    #[error("{function} succeeded, but its result stayed on its worker (a transaction intermediate); call it with fetch to get it")]
    NotFetched {
        /// The function called.
        function: String,
    },

    /// The master refused the token.
    #[error("the master at {address} refused the token: {message}; use the client token (RTPOOL_TOKEN, or `client.token` in the master's data dir)")]
    Auth {
        /// The master's address.
        address: String,
        /// The master's message.
        message: String,
    },

    /// No master answered at any of the addresses.
    #[error("cannot reach a master at {addresses} ({reason}); is `rtpool master` running?")]
    Unreachable {
        /// The addresses tried, comma-separated.
        addresses: String,
        /// The last failure.
        reason: String,
    },

    /// The master forgot a package across a reconnection (it restarted: call packages are
    /// not journaled), so its unfinished calls have no result.
    #[error("after reconnecting, the master at {address} no longer knows the package of {function} ({message}); call it again")]
    ResultsLost {
        /// The master's address.
        address: String,
        /// The function called.
        function: String,
        /// The master's message.
        message: String,
    },

    /// The master refused the request (`rejected`, `quota`, `queue_limit`, ...).
    #[error("the master at {address} refused the call ({code}): {message}")]
    Rejected {
        /// The master's address.
        address: String,
        /// The `ERROR` code.
        code: String,
        /// The master's message.
        message: String,
    },

    /// The encoded call is above the master's frame limit; nothing was sent.
    #[error("the call's arguments take {size_bytes} bytes, above the master's frame limit of {limit_bytes} bytes; send less data per call, or start the master with a larger --max-frame-mb")]
    TooLarge {
        /// The frame's size.
        size_bytes: usize,
        /// The master's `max_frame_bytes`.
        limit_bytes: usize,
    },

    /// No result within the time the caller waited; the call was cancelled.
    #[error("{function}: no result within {waited:?}; the call was cancelled")]
    WaitTimeout {
        /// The function called.
        function: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The settings given to [`Config`](crate::Config) cannot work (no token, a bad address,
    /// an unreadable CA file).
    #[error("{0}")]
    Config(String),

    /// The master's connection failed for good (the master stopped, reconnecting ran out of
    /// time) or the master sent something this client cannot read.
    #[error("connection to the master at {address} lost: {reason}")]
    ConnectionLost {
        /// The master's address.
        address: String,
        /// Why.
        reason: String,
    },

    /// The client was closed.
    #[error("the client is closed")]
    Closed,
}
