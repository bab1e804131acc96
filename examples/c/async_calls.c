#define _POSIX_C_SOURCE 199309L
/* Many asynchronous calls in flight: grpc_call_async of dmmul on `calls` small matrices, then
 * grpc_wait_all, then a check of each result.
 *   RTPOOL_TOKEN=... ./async_calls [calls] [n]   (default 100 calls of n = 8)
 * Prints `async calls=K n=N seconds=S calls_per_s=R` and exits 0 when every result is right. */
#include <math.h>
#include <time.h>

#include "common.h"

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 100, n = argc > 2 ? atoi(argv[2]) : 8;
    size_t len = (size_t)n * n;
    double *A = malloc(len * sizeof *A), *B = malloc(len * sizeof *B);
    double *C = calloc(len * calls, sizeof *C);
    grpc_sessionid_t *ids = malloc(calls * sizeof *ids);
    fill(A, len, 5);
    fill(B, len, 6);

    grpc_function_handle_t h;
    check(grpc_initialize(NULL), "grpc_initialize");
    check(grpc_function_handle_default(&h, "dmmul"), "grpc_function_handle_default");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int c = 0; c < calls; c++) check(grpc_call_async(&h, &ids[c], n, A, B, C + c * len), "grpc_call_async");
    check(grpc_wait_all(), "grpc_wait_all");
    clock_gettime(CLOCK_MONOTONIC, &t1);

    double err = 0;
    for (int c = 0; c < calls; c++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double want = 0;
                for (int k = 0; k < n; k++) want += A[i * n + k] * B[k * n + j];
                err = fmax(err, fabs(want - C[c * len + i * n + j]));
            }
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("async calls=%d n=%d seconds=%.3f calls_per_s=%.0f max_abs_err=%.3g\n", calls, n, s, calls / s, err);
    check(grpc_finalize(), "grpc_finalize");
    return err <= 1e-9 * n ? 0 : 1;
}
