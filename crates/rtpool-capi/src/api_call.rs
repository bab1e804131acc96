//! The C entry points of calls: the argument-array forms (`rtpool_call_argv`,
//! `rtpool_call_async_argv`, which the varargs `grpc_call`/`grpc_call_async` of
//! `csrc/grpc_varargs.c` and Fortran use), the waits, probes and cancels of sessions, and
//! `rtpool_handle_arg_kinds`, which tells the varargs shim how to read each argument.

use std::ffi::c_void;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::args;
use crate::error::{grpc_error_t, CapiError, RTPOOL_INVALID_ARGUMENTS};
use crate::guard::{guard, non_null};
use crate::library::{self, grpc_function_handle_t, Library};
use crate::sessions::grpc_sessionid_t;

/// A varargs argument read as a C `int` (an `int` or `bool` parameter).
pub const RTPOOL_VA_INT: i32 = 1;
/// A varargs argument read as a `double` (a `float` parameter).
pub const RTPOOL_VA_DOUBLE: i32 = 2;
/// A varargs argument read as a pointer (a string, an array, the return value's slot).
pub const RTPOOL_VA_POINTER: i32 = 3;
/// A varargs argument read as a C `int` and passed on as `int32_t` (a `bool` parameter).
pub const RTPOOL_VA_BOOL: i32 = 4;

fn start(
    library: &Library,
    handle: *mut grpc_function_handle_t,
    argv: *const *mut c_void,
    argc: usize,
) -> Result<grpc_sessionid_t, CapiError> {
    let handle = non_null(handle, "handle")?;
    // SAFETY: non-null, the caller's handle (checked against the table).
    let bound = library.handle(unsafe { *handle })?;
    // SAFETY: argv holds argc pointers as the interface describes (the caller's promise).
    let prepared = unsafe { args::read(&bound.signature, argv, argc) }?;
    let cancel = Arc::new(Notify::new());
    let wake = cancel.clone();
    let id = library.sessions.start(Box::new(move || wake.notify_one()));
    let opts = bound
        .options
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let sent = bound.backend.start(
        &bound.function,
        prepared,
        opts,
        library.sessions.clone(),
        id,
        cancel,
    );
    if let Err(err) = sent {
        library.sessions.discard(id);
        return Err(err);
    }
    Ok(id)
}

/// Calls the handle's function and waits for it. `argv[i]` points at the `i`-th argument in
/// the interface's order (`int64_t *`, `double *`, `int32_t *` for a bool, `const char *`, an
/// array's data, or an `rtpool_array_t *` for an array of open shape), then, if the function
/// returns a value, where to put it. `Out` and `InOut` arrays are filled in place.
///
/// # Safety
///
/// `handle` points at an initialized handle; `argv` at `argc` pointers valid for the
/// interface's arguments, the arrays as large as their shapes.
#[no_mangle]
pub unsafe extern "C" fn rtpool_call_argv(
    handle: *mut grpc_function_handle_t,
    argv: *const *mut c_void,
    argc: usize,
) -> grpc_error_t {
    guard(|| {
        let library = library::current()?;
        let id = start(&library, handle, argv, argc)?;
        library.sessions.wait(id)
    })
}

/// Starts the call as [`rtpool_call_argv`] does and returns at once with its session id in
/// `*session_id`; the outputs are in place once `grpc_wait*` returns for it. The `In` arrays
/// are copied before this returns; the output buffers must stay alive until then.
///
/// # Safety
///
/// As [`rtpool_call_argv`]; `session_id` points at a `grpc_sessionid_t`.
#[no_mangle]
pub unsafe extern "C" fn rtpool_call_async_argv(
    handle: *mut grpc_function_handle_t,
    session_id: *mut grpc_sessionid_t,
    argv: *const *mut c_void,
    argc: usize,
) -> grpc_error_t {
    guard(|| {
        let out = non_null(session_id, "session_id")?;
        let library = library::current()?;
        let id = start(&library, handle, argv, argc)?;
        // SAFETY: non-null, the caller's.
        unsafe { *out = id };
        Ok(())
    })
}

/// How to read each of the handle's C arguments (`RTPOOL_VA_*`), into `kinds[0..capacity]`;
/// `*count` is their number (the interface's parameters, plus one for a return value).
///
/// # Safety
///
/// `handle` points at a handle, `kinds` at `capacity` ints, `count` at a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rtpool_handle_arg_kinds(
    handle: *mut grpc_function_handle_t,
    kinds: *mut i32,
    capacity: usize,
    count: *mut usize,
) -> grpc_error_t {
    guard(|| {
        let handle = non_null(handle, "handle")?;
        let (kinds, count) = (non_null(kinds, "kinds")?, non_null(count, "count")?);
        // SAFETY: non-null, the caller's handle.
        let bound = library::current()?.handle(unsafe { *handle })?;
        let wanted = bound.signature.va_kinds();
        // SAFETY: non-null out-pointers of the documented sizes.
        unsafe { *count = wanted.len() };
        if wanted.len() > capacity {
            let msg = format!("{} takes {} arguments, more than grpc_call reads ({capacity}); use rtpool_call_argv", bound.function, wanted.len());
            return Err(CapiError::new(RTPOOL_INVALID_ARGUMENTS, msg));
        }
        // SAFETY: capacity ints at kinds, wanted.len() <= capacity.
        unsafe { std::ptr::copy_nonoverlapping(wanted.as_ptr(), kinds, wanted.len()) };
        Ok(())
    })
}

/// Waits for session `session_id`; returns its outcome and forgets it.
#[no_mangle]
pub extern "C" fn grpc_wait(session_id: grpc_sessionid_t) -> grpc_error_t {
    guard(|| library::current()?.sessions.wait(session_id))
}

fn wait_each(library: &Library, ids: &[grpc_sessionid_t]) -> Result<(), CapiError> {
    let mut first_error = None;
    for &id in ids {
        if let Err(err) = library.sessions.wait(id) {
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// # Safety
///
/// `ids` is null with `length` 0, or points at `length` session ids.
unsafe fn id_slice<'a>(
    ids: *const grpc_sessionid_t,
    length: usize,
) -> Result<&'a [grpc_sessionid_t], CapiError> {
    if length == 0 {
        return Ok(&[]);
    }
    if ids.is_null() {
        return Err(CapiError::new(
            RTPOOL_INVALID_ARGUMENTS,
            "the session id array is a null pointer",
        ));
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(ids, length) })
}

/// Waits for every one of the `length` sessions at `ids`; returns the first error among them
/// (each is waited for and forgotten either way).
///
/// # Safety
///
/// `ids` points at `length` session ids.
#[no_mangle]
pub unsafe extern "C" fn grpc_wait_and(
    ids: *const grpc_sessionid_t,
    length: usize,
) -> grpc_error_t {
    guard(|| {
        let library = library::current()?;
        // SAFETY: the caller's promise.
        wait_each(&library, unsafe { id_slice(ids, length) }?)
    })
}

/// Waits for the first of the `length` sessions at `ids` to complete; its id goes to
/// `*completed` and its outcome is returned.
///
/// # Safety
///
/// `ids` points at `length` session ids, `completed` at one.
#[no_mangle]
pub unsafe extern "C" fn grpc_wait_or(
    ids: *const grpc_sessionid_t,
    length: usize,
    completed: *mut grpc_sessionid_t,
) -> grpc_error_t {
    guard(|| {
        let out = non_null(completed, "completed")?;
        // SAFETY: the caller's promise.
        let ids = unsafe { id_slice(ids, length) }?;
        let (id, outcome) = library::current()?.sessions.wait_or(Some(ids));
        // SAFETY: non-null, the caller's.
        unsafe { *out = id };
        outcome
    })
}

/// Waits for every session started and not yet waited for; returns the first error.
#[no_mangle]
pub extern "C" fn grpc_wait_all() -> grpc_error_t {
    guard(|| {
        let library = library::current()?;
        let ids = library.sessions.live_ids();
        wait_each(&library, &ids)
    })
}

/// Waits for any session not yet waited for; its id goes to `*completed`.
///
/// # Safety
///
/// `completed` points at a session id.
#[no_mangle]
pub unsafe extern "C" fn grpc_wait_any(completed: *mut grpc_sessionid_t) -> grpc_error_t {
    guard(|| {
        let out = non_null(completed, "completed")?;
        let (id, outcome) = library::current()?.sessions.wait_or(None);
        // SAFETY: non-null, the caller's.
        unsafe { *out = id };
        outcome
    })
}

/// `GRPC_NO_ERROR` when session `session_id` has completed (wait for it to get its outcome),
/// `GRPC_NOT_COMPLETED` while it runs.
#[no_mangle]
pub extern "C" fn grpc_probe(session_id: grpc_sessionid_t) -> grpc_error_t {
    guard(|| library::current()?.sessions.probe(session_id))
}

/// The first completed session of the `length` at `ids` goes to `*completed`;
/// `GRPC_NONE_COMPLETED` when none has.
///
/// # Safety
///
/// `ids` points at `length` session ids, `completed` at one.
#[no_mangle]
pub unsafe extern "C" fn grpc_probe_or(
    ids: *const grpc_sessionid_t,
    length: usize,
    completed: *mut grpc_sessionid_t,
) -> grpc_error_t {
    guard(|| {
        let out = non_null(completed, "completed")?;
        // SAFETY: the caller's promise.
        let id = library::current()?
            .sessions
            .probe_or(unsafe { id_slice(ids, length) }?)?;
        // SAFETY: non-null, the caller's.
        unsafe { *out = id };
        Ok(())
    })
}

/// Cancels session `session_id`: a queued call never runs, a running one is stopped on its
/// worker; waiting for it then returns `RTPOOL_CANCELLED` (or its result, if that came first).
#[no_mangle]
pub extern "C" fn grpc_cancel(session_id: grpc_sessionid_t) -> grpc_error_t {
    guard(|| library::current()?.sessions.cancel(session_id))
}

/// Cancels every session not yet waited for.
#[no_mangle]
pub extern "C" fn grpc_cancel_all() -> grpc_error_t {
    guard(|| {
        let library = library::current()?;
        for id in library.sessions.live_ids() {
            library.sessions.cancel(id)?;
        }
        Ok(())
    })
}
