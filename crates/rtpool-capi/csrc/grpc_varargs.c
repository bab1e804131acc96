/* The variadic GridRPC entry points, grpc_call and grpc_call_async: stable Rust cannot define
 * a C variadic function, so this shim asks the library how to read each argument of the
 * handle's function (rtpool_handle_arg_kinds: from the interface fetched from the master),
 * reads them with va_arg, and calls the argument-array form (rtpool_call_argv /
 * rtpool_call_async_argv), which checks and sends them. Scalars arrive by value (int as C
 * int, float as double), everything else as a pointer.
 *
 * The exported names are naked Rust tail jumps to rtpool_va_grpc_call(_async) (src/varargs.rs),
 * so that librtpool.so exports them too; where there is no such jump (build.rs defines
 * RTPOOL_VA_DIRECT) this file defines grpc_call and grpc_call_async itself. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "../../../include/rtpool_grpc.h"

#ifdef RTPOOL_VA_DIRECT
#define RTPOOL_VA_CALL grpc_call
#define RTPOOL_VA_CALL_ASYNC grpc_call_async
#else
#define RTPOOL_VA_CALL rtpool_va_grpc_call
#define RTPOOL_VA_CALL_ASYNC rtpool_va_grpc_call_async
grpc_error_t rtpool_va_grpc_call(grpc_function_handle_t *handle, ...);
grpc_error_t rtpool_va_grpc_call_async(grpc_function_handle_t *handle, grpc_sessionid_t *session_id, ...);
#endif

/* grpc_call reads at most this many arguments; a longer interface needs rtpool_call_argv. */
#define RTPOOL_VA_MAX_ARGS 64

union rtpool_va_slot {
    int64_t i;
    int32_t b;
    double d;
};

/* Reads the handle's arguments from ap into argv (scalars stored in slots). */
static grpc_error_t rtpool_va_read(grpc_function_handle_t *handle, va_list *ap, union rtpool_va_slot *slots,
                                   void **argv, size_t *argc) {
    int32_t kinds[RTPOOL_VA_MAX_ARGS];
    grpc_error_t err = rtpool_handle_arg_kinds(handle, kinds, RTPOOL_VA_MAX_ARGS, argc);
    if (err != GRPC_NO_ERROR) return err;
    for (size_t i = 0; i < *argc; i++) {
        switch (kinds[i]) {
        case RTPOOL_VA_INT:
            slots[i].i = va_arg(*ap, int);
            argv[i] = &slots[i].i;
            break;
        case RTPOOL_VA_BOOL:
            slots[i].b = va_arg(*ap, int) != 0;
            argv[i] = &slots[i].b;
            break;
        case RTPOOL_VA_DOUBLE:
            slots[i].d = va_arg(*ap, double);
            argv[i] = &slots[i].d;
            break;
        default:
            argv[i] = va_arg(*ap, void *);
            break;
        }
    }
    return GRPC_NO_ERROR;
}

grpc_error_t RTPOOL_VA_CALL(grpc_function_handle_t *handle, ...) {
    union rtpool_va_slot slots[RTPOOL_VA_MAX_ARGS];
    void *argv[RTPOOL_VA_MAX_ARGS];
    size_t argc = 0;
    va_list ap;
    va_start(ap, handle);
    grpc_error_t err = rtpool_va_read(handle, &ap, slots, argv, &argc);
    va_end(ap);
    if (err != GRPC_NO_ERROR) return err;
    return rtpool_call_argv(handle, argv, argc);
}

grpc_error_t RTPOOL_VA_CALL_ASYNC(grpc_function_handle_t *handle, grpc_sessionid_t *session_id, ...) {
    union rtpool_va_slot slots[RTPOOL_VA_MAX_ARGS];
    void *argv[RTPOOL_VA_MAX_ARGS];
    size_t argc = 0;
    va_list ap;
    va_start(ap, session_id);
    grpc_error_t err = rtpool_va_read(handle, &ap, slots, argv, &argc);
    va_end(ap);
    if (err != GRPC_NO_ERROR) return err;
    return rtpool_call_async_argv(handle, session_id, argv, argc);
}
