//! The C entry points that set things up: `grpc_initialize`/`_finalize`, function handles,
//! their `rtpool_handle_set_*` options, and the error queries.

use std::ffi::c_char;

use crate::config::Settings;
use crate::error::{self, grpc_error_t};
use crate::guard::{guard, non_null, opt_str, req_str};
use crate::library::{self, grpc_function_handle_t};
use crate::sessions::grpc_sessionid_t;

/// Starts the library: reads `config_file` (`NULL` or `""`: none; the environment alone, see
/// docs/clients.md) and connects to no master yet (the first handle does).
///
/// # Safety
///
/// `config_file` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn grpc_initialize(config_file: *const c_char) -> grpc_error_t {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { opt_str(config_file, "config_file") }?;
        library::initialize(Settings::load(path)?)
    })
}

/// Stops the library: closes its connections (pending calls fail) and forgets its handles and
/// sessions.
#[no_mangle]
pub extern "C" fn grpc_finalize() -> grpc_error_t {
    guard(library::finalize)
}

/// Binds `handle` to `func_name` served through the master at `server_name` (`"host:port"`;
/// `NULL` or `""`: the configured master), fetching the function's interface.
///
/// # Safety
///
/// `handle` points at a `grpc_function_handle_t`; the strings are null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn grpc_function_handle_init(
    handle: *mut grpc_function_handle_t,
    server_name: *const c_char,
    func_name: *const c_char,
) -> grpc_error_t {
    guard(|| {
        let handle = non_null(handle, "handle")?;
        // SAFETY: the caller's promise.
        let (server, function) = unsafe {
            (
                opt_str(server_name, "server_name")?,
                req_str(func_name, "func_name")?,
            )
        };
        let bound = library::current()?.bind(server.filter(|s| !s.is_empty()), function)?;
        // SAFETY: non-null, the caller's handle.
        unsafe { *handle = bound };
        Ok(())
    })
}

/// Binds `handle` to `func_name` on the configured master.
///
/// # Safety
///
/// As [`grpc_function_handle_init`].
#[no_mangle]
pub unsafe extern "C" fn grpc_function_handle_default(
    handle: *mut grpc_function_handle_t,
    func_name: *const c_char,
) -> grpc_error_t {
    // SAFETY: the caller's promise, passed on.
    unsafe { grpc_function_handle_init(handle, std::ptr::null(), func_name) }
}

/// Releases `handle` (its calls in flight go on) and zeroes it.
///
/// # Safety
///
/// `handle` is null or points at a `grpc_function_handle_t`.
#[no_mangle]
pub unsafe extern "C" fn grpc_function_handle_destruct(
    handle: *mut grpc_function_handle_t,
) -> grpc_error_t {
    guard(|| {
        let handle = non_null(handle, "handle")?;
        // SAFETY: non-null, the caller's handle.
        library::current()?.destruct(unsafe { *handle })?;
        // SAFETY: as above.
        unsafe { (*handle).id = 0 };
        Ok(())
    })
}

fn set_option(
    handle: *mut grpc_function_handle_t,
    set: impl FnOnce(&mut crate::backend::HandleOptions),
) -> grpc_error_t {
    guard(|| set_option_in(handle, set))
}

fn set_option_in(
    handle: *mut grpc_function_handle_t,
    set: impl FnOnce(&mut crate::backend::HandleOptions),
) -> Result<(), crate::error::CapiError> {
    let handle = non_null(handle, "handle")?;
    // SAFETY: non-null, the caller's handle (checked against the table next).
    let bound = library::current()?.handle(unsafe { *handle })?;
    set(&mut bound.options.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(())
}

/// rtpool: the deadline of the handle's later calls, `deadline_ms` after each is sent (0:
/// none). Calls are scheduled earliest deadline first within a priority.
///
/// # Safety
///
/// `handle` is null or points at a `grpc_function_handle_t`.
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_set_deadline_ms(
    handle: *mut grpc_function_handle_t,
    deadline_ms: u64,
) -> grpc_error_t {
    set_option(handle, |o| o.deadline_ms = deadline_ms)
}

/// rtpool: the priority of the handle's later calls (higher first; default 0).
///
/// # Safety
///
/// As [`rtpool_handle_set_deadline_ms`].
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_set_priority(
    handle: *mut grpc_function_handle_t,
    priority: i32,
) -> grpc_error_t {
    set_option(handle, |o| o.priority = priority)
}

/// rtpool: the time limit of each of the handle's later calls on its worker (0: none); a call
/// past it is killed and fails with `GRPC_SESSION_FAILED`.
///
/// # Safety
///
/// As [`rtpool_handle_set_deadline_ms`].
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_set_timeout_ms(
    handle: *mut grpc_function_handle_t,
    timeout_ms: u64,
) -> grpc_error_t {
    set_option(handle, |o| o.timeout_ms = timeout_ms)
}

/// rtpool: each of the handle's later calls holds `amount` of resource `name` (`"gpu"`) on its
/// worker while it runs, so it runs only on a server of its function that has it free
/// (`docs/resources.md`); 0 removes the request of `name`. A call no connected server could
/// ever run fails with `GRPC_RPC_REFUSED` and a message naming the request.
///
/// # Safety
///
/// `handle` as [`rtpool_handle_set_deadline_ms`]; `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_set_resource(
    handle: *mut grpc_function_handle_t,
    name: *const c_char,
    amount: u64,
) -> grpc_error_t {
    guard(|| {
        // SAFETY: the caller's promise.
        let name = unsafe { req_str(name, "resource name") }?;
        set_option_in(handle, |o| o.set_resource(name, amount))
    })
}

/// rtpool: each of the handle's later calls runs only on a worker with label `key` equal to
/// `value` (`rtpool worker --label key=value`); a null `value` removes the label `key`.
///
/// # Safety
///
/// `handle` as [`rtpool_handle_set_deadline_ms`]; `key` and `value` are null or
/// NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_set_label(
    handle: *mut grpc_function_handle_t,
    key: *const c_char,
    value: *const c_char,
) -> grpc_error_t {
    guard(|| {
        // SAFETY: the caller's promise.
        let key = unsafe { req_str(key, "label key") }?;
        // SAFETY: as above.
        let value = unsafe { opt_str(value, "label value") }?;
        set_option_in(handle, |o| o.set_label(key, value))
    })
}

/// The fixed description of `error_code` (never null, static).
#[no_mangle]
pub extern "C" fn grpc_error_string(error_code: grpc_error_t) -> *const c_char {
    error::describe(error_code).as_ptr().cast()
}

/// The code of this thread's last GridRPC call.
#[no_mangle]
pub extern "C" fn grpc_get_last_error() -> grpc_error_t {
    error::last_code()
}

/// rtpool: the message of this thread's last GridRPC call (`""` after a success): what failed,
/// where, and what to try. Valid until this thread's next call into the library.
#[no_mangle]
pub extern "C" fn rtpool_last_error_message() -> *const c_char {
    error::last_message_ptr()
}

/// The outcome of session `session_id` not yet waited for: `GRPC_NO_ERROR`, its error, or
/// `GRPC_NOT_COMPLETED` while it runs; `GRPC_INVALID_SESSION_ID` once waited for. Leaves
/// this thread's last error alone unless the id is invalid.
#[no_mangle]
pub extern "C" fn grpc_get_error(session_id: grpc_sessionid_t) -> grpc_error_t {
    let lookup = || library::current()?.sessions.error_of(session_id);
    match std::panic::catch_unwind(lookup) {
        Ok(Ok(None)) => error::GRPC_NO_ERROR,
        Ok(Ok(Some(err))) => err.code,
        Ok(Err(err)) => error::record(Err(err)),
        Err(panic) => error::record(Err(crate::guard::panic_error(&*panic))),
    }
}
