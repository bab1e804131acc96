//! The GridRPC error codes (GFD.52, section 5) and rtpool's own, the per-thread last error and
//! its message, and the one mapping from a [`ClientError`] to a code.
//!
//! Every entry point of the C API returns a [`grpc_error_t`]; the message that goes with a
//! failure is kept per thread until that thread's next call and read with
//! `rtpool_last_error_message()`. A session's outcome is kept with the session
//! (`sessions.rs`), not here.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use rtpool_client::ClientError;

/// The result of every GridRPC call: `GRPC_NO_ERROR` or one of the codes below.
#[allow(non_camel_case_types)]
pub type grpc_error_t = i32;

/// Success.
pub const GRPC_NO_ERROR: grpc_error_t = 0;
/// A call before `grpc_initialize` (or after `grpc_finalize`).
pub const GRPC_NOT_INITIALIZED: grpc_error_t = 1;
/// The configuration file given to `grpc_initialize` does not exist or cannot be read.
pub const GRPC_CONFIGFILE_NOT_FOUND: grpc_error_t = 2;
/// The configuration file has a line this library does not understand.
pub const GRPC_CONFIGFILE_ERROR: grpc_error_t = 3;
/// No master answers at the server's address.
pub const GRPC_SERVER_NOT_FOUND: grpc_error_t = 4;
/// No worker serves the function.
pub const GRPC_FUNCTION_NOT_FOUND: grpc_error_t = 5;
/// A null, destructed or never-initialized function handle.
pub const GRPC_INVALID_FUNCTION_HANDLE: grpc_error_t = 6;
/// An unknown (or already waited for) session id.
pub const GRPC_INVALID_SESSION_ID: grpc_error_t = 7;
/// The master refused the call (its token, a quota, a queue limit).
pub const GRPC_RPC_REFUSED: grpc_error_t = 8;
/// The connection to the master was lost for good.
pub const GRPC_COMMUNICATION_FAILED: grpc_error_t = 9;
/// The call failed: the function raised, its worker was lost on every attempt, it missed its
/// deadline or ran past its time limit.
pub const GRPC_SESSION_FAILED: grpc_error_t = 10;
/// `grpc_probe`: the session has not completed yet.
pub const GRPC_NOT_COMPLETED: grpc_error_t = 11;
/// `grpc_probe_or`: none of the sessions has completed yet.
pub const GRPC_NONE_COMPLETED: grpc_error_t = 12;
/// Any other failure (the message says which).
pub const GRPC_OTHER_ERROR_CODE: grpc_error_t = 13;
/// A code this library does not know (given to `grpc_error_string`).
pub const GRPC_UNKNOWN_ERROR_CODE: grpc_error_t = 14;
/// `grpc_initialize` called twice.
pub const GRPC_ALREADY_INITIALIZED: grpc_error_t = 15;
/// The last GridRPC code; rtpool's own codes come after it.
pub const GRPC_LAST_ERROR_CODE: grpc_error_t = 16;
/// rtpool: the arguments do not match the function's interface (count, type, dtype, shape) or
/// a pointer is null; nothing was sent.
pub const RTPOOL_INVALID_ARGUMENTS: grpc_error_t = 100;
/// rtpool: the call's arguments are above the master's frame limit; nothing was sent.
pub const RTPOOL_ARGUMENTS_TOO_LARGE: grpc_error_t = 101;
/// rtpool: the call was cancelled (`grpc_cancel`).
pub const RTPOOL_CANCELLED: grpc_error_t = 102;

/// A failure of one C API call: its code and the message for `rtpool_last_error_message()`.
#[derive(Debug, Clone, PartialEq)]
pub struct CapiError {
    /// The code returned to C.
    pub code: grpc_error_t,
    /// What failed, where, and what to try.
    pub message: String,
}

impl CapiError {
    /// An error of `code` with `message`.
    pub fn new(code: grpc_error_t, message: impl Into<String>) -> CapiError {
        CapiError {
            code,
            message: message.into(),
        }
    }

    /// Wrong arguments: `function: problem`.
    pub fn arguments(function: &str, problem: impl std::fmt::Display) -> CapiError {
        CapiError::new(RTPOOL_INVALID_ARGUMENTS, format!("{function}: {problem}"))
    }
}

impl From<ClientError> for CapiError {
    fn from(err: ClientError) -> CapiError {
        let code = match &err {
            ClientError::UnknownFunction { .. } => GRPC_FUNCTION_NOT_FOUND,
            ClientError::WrongArguments { .. } => RTPOOL_INVALID_ARGUMENTS,
            ClientError::TooLarge { .. } => RTPOOL_ARGUMENTS_TOO_LARGE,
            ClientError::Cancelled { .. } => RTPOOL_CANCELLED,
            ClientError::Auth { .. } | ClientError::Rejected { .. } => GRPC_RPC_REFUSED,
            ClientError::Unreachable { .. } => GRPC_SERVER_NOT_FOUND,
            ClientError::ConnectionLost { .. } | ClientError::ResultsLost { .. } => {
                GRPC_COMMUNICATION_FAILED
            }
            ClientError::DeadlineMissed { .. }
            | ClientError::WorkerLost { .. }
            | ClientError::TimeLimit { .. }
            | ClientError::Remote { .. }
            | ClientError::Failed { .. }
            | ClientError::WaitTimeout { .. } => GRPC_SESSION_FAILED,
            ClientError::Closed => GRPC_NOT_INITIALIZED,
            _ => GRPC_OTHER_ERROR_CODE,
        };
        CapiError::new(code, err.to_string())
    }
}

thread_local! {
    static LAST: RefCell<(grpc_error_t, CString)> = RefCell::new((GRPC_NO_ERROR, CString::default()));
}

/// Record `result` as this thread's last outcome and return its code.
pub fn record(result: Result<(), CapiError>) -> grpc_error_t {
    let (code, message) = match result {
        Ok(()) => (GRPC_NO_ERROR, String::new()),
        Err(err) => (err.code, err.message),
    };
    // A message never holds a NUL from us; one from a peer is cut there.
    let message = CString::new(message).unwrap_or_else(|e| {
        let end = e.nul_position();
        CString::new(&e.into_vec()[..end]).expect("cut at the first NUL")
    });
    LAST.with(|last| *last.borrow_mut() = (code, message));
    code
}

/// This thread's last code.
pub fn last_code() -> grpc_error_t {
    LAST.with(|last| last.borrow().0)
}

/// This thread's last message, valid until this thread's next call into the library.
pub fn last_message_ptr() -> *const c_char {
    LAST.with(|last| last.borrow().1.as_ptr())
}

/// The fixed description of a code (GFD.52's `grpc_error_string`), NUL-terminated.
pub fn describe(code: grpc_error_t) -> &'static [u8] {
    match code {
        GRPC_NO_ERROR => b"no error\0",
        GRPC_NOT_INITIALIZED => b"GridRPC is not initialized: call grpc_initialize first\0",
        GRPC_CONFIGFILE_NOT_FOUND => b"the configuration file was not found\0",
        GRPC_CONFIGFILE_ERROR => b"the configuration file is invalid\0",
        GRPC_SERVER_NOT_FOUND => b"the server (rtpool master) was not found\0",
        GRPC_FUNCTION_NOT_FOUND => b"no worker serves the function\0",
        GRPC_INVALID_FUNCTION_HANDLE => b"invalid function handle\0",
        GRPC_INVALID_SESSION_ID => b"invalid session id\0",
        GRPC_RPC_REFUSED => b"the server refused the call\0",
        GRPC_COMMUNICATION_FAILED => b"communication with the server failed\0",
        GRPC_SESSION_FAILED => b"the call failed\0",
        GRPC_NOT_COMPLETED => b"the call has not completed\0",
        GRPC_NONE_COMPLETED => b"none of the calls has completed\0",
        GRPC_OTHER_ERROR_CODE => b"other error (see rtpool_last_error_message)\0",
        GRPC_ALREADY_INITIALIZED => b"GridRPC is already initialized\0",
        RTPOOL_INVALID_ARGUMENTS => b"the arguments do not match the function's interface\0",
        RTPOOL_ARGUMENTS_TOO_LARGE => b"the arguments are above the master's frame limit\0",
        RTPOOL_CANCELLED => b"the call was cancelled\0",
        _ => b"unknown error code\0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_map_to_their_codes() {
        let unknown = ClientError::UnknownFunction {
            function: "nope".into(),
            served: "dmmul (1)".into(),
        };
        let err = CapiError::from(unknown);
        assert_eq!(err.code, GRPC_FUNCTION_NOT_FOUND);
        assert!(
            err.message.contains("no worker serves nope"),
            "{}",
            err.message
        );
        let auth = ClientError::Auth {
            address: "127.0.0.1:1".into(),
            message: "bad token".into(),
        };
        assert_eq!(CapiError::from(auth).code, GRPC_RPC_REFUSED);
    }

    #[test]
    fn the_last_message_is_per_thread_and_cut_at_a_nul() {
        let code = record(Err(CapiError::new(GRPC_OTHER_ERROR_CODE, "bad\0tail")));
        assert_eq!(code, GRPC_OTHER_ERROR_CODE);
        assert_eq!(last_code(), GRPC_OTHER_ERROR_CODE);
        // SAFETY: the pointer is this thread's current message, alive until the next record.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_message_ptr()) };
        assert_eq!(msg.to_str().unwrap(), "bad");
        std::thread::spawn(|| assert_eq!(last_code(), GRPC_NO_ERROR))
            .join()
            .unwrap();
    }

    #[test]
    fn every_code_has_a_description() {
        for code in 0..GRPC_LAST_ERROR_CODE {
            let text = describe(code);
            assert!(text.ends_with(b"\0") && text.len() > 1);
        }
        assert_eq!(describe(9999), b"unknown error code\0");
    }
}
