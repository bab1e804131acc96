//! `grpc_call` and `grpc_call_async`, the variadic GridRPC entry points, exported by both
//! `librtpool.a` and `librtpool.so`.
//!
//! Stable Rust cannot define a C variadic function, so the bodies are C
//! (`csrc/grpc_varargs.c`: `rtpool_va_grpc_call`, `rtpool_va_grpc_call_async`, which read the
//! arguments with `va_arg` and call `rtpool_call_argv`). A cdylib only exports the Rust items
//! marked `no_mangle` (rustc writes the linker's version script), so the C symbols of the shim
//! would stay local to the `.so`. The exported names are therefore these two Rust functions:
//! naked, a single tail jump to the C body, so every register and the stack (the variadic
//! arguments, and `%al` on x86-64) reach it untouched. On other architectures build.rs has the
//! shim define the two names itself (exported by the static library only).

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod trampoline {
    use crate::error::grpc_error_t;
    use crate::library::grpc_function_handle_t;
    use crate::sessions::grpc_sessionid_t;

    extern "C" {
        fn rtpool_va_grpc_call(handle: *mut grpc_function_handle_t, ...) -> grpc_error_t;
        fn rtpool_va_grpc_call_async(
            handle: *mut grpc_function_handle_t,
            session_id: *mut grpc_sessionid_t,
            ...
        ) -> grpc_error_t;
    }

    // A macro also keeps these out of cbindgen's sight (it cannot parse `#[unsafe(naked)]`):
    // the header declares the variadic prototypes in its trailer.
    macro_rules! trampoline {
        ($(#[doc = $doc:literal])* $name:ident => $target:ident) => {
            $(#[doc = $doc])*
            #[unsafe(naked)]
            #[no_mangle]
            pub extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!("jmp {}", sym $target);
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("b {}", sym $target);
            }
        };
    }

    trampoline! {
        /// `grpc_error_t grpc_call(grpc_function_handle_t *handle, ...)`, declared in the
        /// header's trailer; the body is the C shim's.
        grpc_call => rtpool_va_grpc_call
    }

    trampoline! {
        /// `grpc_error_t grpc_call_async(grpc_function_handle_t *handle,
        /// grpc_sessionid_t *session_id, ...)`, as `grpc_call`.
        grpc_call_async => rtpool_va_grpc_call_async
    }
}
