//! Errors of the master's setup (binding, data dir, tokens). Peer errors never reach here: they
//! become an `ERROR` frame for that peer.

use std::path::PathBuf;

/// Why the master could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; is another master running there? try another --listen port")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The data dir or a token file could not be read or written.
    #[error("cannot use data dir {path}: {source}; check that it exists and is writable")]
    DataDir {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A token file exists but holds no usable token.
    #[error("token file {path} is empty or malformed; delete it to have a new token generated")]
    BadTokenFile {
        /// The file.
        path: PathBuf,
    },
    /// The store of users and tokens could not be opened.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The journal could not be opened or replayed (corruption names the byte offset).
    #[error("journal: {0}; the master will not start on a journal it cannot trust (move the file away to start empty, losing its packages)")]
    Journal(#[from] crate::journal::JournalError),
    /// A configuration value is out of its range (see [`crate::MasterConfig::validate`]).
    #[error("invalid {option}: {reason}")]
    InvalidConfig {
        /// The knob, as a user would name it (`hedge factor`).
        option: &'static str,
        /// What is wrong with its value and what is allowed.
        reason: String,
    },
    /// A CPU list (`--cpus`) that does not parse.
    #[error(
        "bad CPU list {list:?}: {reason}; write CPUs as taskset -c does, e.g. 1 or 0,1 or 0-3"
    )]
    BadCpuList {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A key of an embedded master's options dict that is no option of `rtpool master`.
    #[error("unknown master option {key:?}; known: {known}")]
    UnknownOption {
        /// The key as given.
        key: String,
        /// Every key the dict takes, comma-separated.
        known: String,
    },
    /// A value of an embedded master's options dict that `rtpool master` would refuse too.
    #[error("master option {key}: {reason}")]
    InvalidOption {
        /// The key (the option's name with underscores), or the keys when the fault is
        /// between options.
        key: String,
        /// The parser's reason, naming the flag and the value.
        reason: String,
    },
    /// The runtime could not be built or the server thread failed.
    #[error("master runtime failed: {0}")]
    Runtime(String),
    /// The HTTP listener's address (`--http`) could not be bound.
    #[error("cannot serve HTTP on {addr}: {source}; pick another --http address (port 0 picks a free one) or --http off")]
    HttpBind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The HTTP listener would be reachable beyond this machine with neither TLS nor a token.
    #[error("refusing to serve HTTP on {addr}: beyond loopback the metrics and status pages need TLS (--tls-cert/--tls-key or --tls-self-signed) or a token (--http-token, or $RTPOOL_HTTP_TOKEN); or bind 127.0.0.1")]
    HttpExposed {
        /// The address asked for.
        addr: String,
    },
}
