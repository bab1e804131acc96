//! The protocol's size limits, each declared once: what a frame, a name, a key or a list may
//! hold at most. A leaf module: the messages, the options and the decoder read it; it reads
//! nothing of theirs.

/// Largest frame body accepted before the handshake authenticated the peer.
pub const PRE_AUTH_MAX_FRAME: usize = 8192;

/// Default largest frame body after authentication (256 MiB).
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;

/// Longest `HELLO.name` accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Longest `HELLO.token` accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Length of a function hash (SHA-256), in bytes.
pub const FN_HASH_BYTES: usize = 32;

/// Longest idempotency key (`SUBMIT.opts.key`) accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 128;

/// Longest name of a named function (grid RPC), in bytes; a name has at least one byte.
pub const MAX_FUNCTION_NAME_BYTES: usize = 128;

/// Longest version of a named function, in bytes (empty is allowed).
pub const MAX_FUNCTION_VERSION_BYTES: usize = 64;

/// Largest interface blob of a named function (`SERVE`, `FUNCTIONS_REPLY`), in bytes.
pub const MAX_INTERFACE_BYTES: usize = 64 << 10;

/// Most functions one `SERVE` may declare.
pub const MAX_SERVE_FUNCTIONS: usize = 4096;

/// Length of a kept result's key (`RELEASE`, `DROP`): 128 random bits, the name of the value
/// and the capability to read it.
pub const KEPT_KEY_BYTES: usize = 16;

/// Most keys one `RELEASE` may name.
pub const MAX_RELEASE_KEYS: usize = 65_536;
