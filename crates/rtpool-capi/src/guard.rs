//! The FFI edge: every entry point runs its body through [`guard`], so no panic crosses into C
//! (it becomes `GRPC_OTHER_ERROR_CODE` with a message) and every outcome is this thread's last
//! error; and the helpers that read C strings.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{
    self, grpc_error_t, CapiError, GRPC_OTHER_ERROR_CODE, RTPOOL_INVALID_ARGUMENTS,
};

/// Run `body`, catch a panic, record the outcome and return its code.
pub fn guard(body: impl FnOnce() -> Result<(), CapiError>) -> grpc_error_t {
    let result =
        catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| Err(panic_error(&*panic)));
    error::record(result)
}

/// The error a caught panic becomes.
pub fn panic_error(panic: &(dyn std::any::Any + Send)) -> CapiError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    CapiError::new(
        GRPC_OTHER_ERROR_CODE,
        format!("internal error in librtpool: {what}; please report it"),
    )
}

/// A C string argument: `None` for null; an error naming `what` when it is not UTF-8.
///
/// # Safety
///
/// `ptr` is null or a NUL-terminated string.
pub unsafe fn opt_str<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>, CapiError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map(Some)
        .map_err(|_| CapiError::new(RTPOOL_INVALID_ARGUMENTS, format!("{what} is not UTF-8")))
}

/// A required C string argument.
///
/// # Safety
///
/// As [`opt_str`].
pub unsafe fn req_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, CapiError> {
    // SAFETY: the caller's promise.
    unsafe { opt_str(ptr, what) }?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| CapiError::new(RTPOOL_INVALID_ARGUMENTS, format!("{what} is null or empty")))
}

/// A required out-pointer or in-pointer argument.
///
/// # Errors
///
/// `RTPOOL_INVALID_ARGUMENTS` naming `what` when null.
pub fn non_null<T>(ptr: *mut T, what: &str) -> Result<*mut T, CapiError> {
    if ptr.is_null() {
        Err(CapiError::new(
            RTPOOL_INVALID_ARGUMENTS,
            format!("{what} is a null pointer"),
        ))
    } else {
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_code_with_a_message() {
        let code = guard(|| panic!("boom"));
        assert_eq!(code, GRPC_OTHER_ERROR_CODE);
        // SAFETY: this thread's current message.
        let msg = unsafe { CStr::from_ptr(error::last_message_ptr()) }
            .to_str()
            .unwrap()
            .to_owned();
        assert!(msg.contains("internal error in librtpool: boom"), "{msg}");
        assert_eq!(guard(|| Ok(())), 0);
    }
}
