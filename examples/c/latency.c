/* Call latency from C: `rounds` sequential dmmul calls of n = 11 (each matrix 968 bytes, about
 * 1 KiB per argument), after 20 warm-up calls.
 *   RTPOOL_TOKEN=... ./latency [rounds]   (default 1000)
 * Prints `c latency_us p50=.. p99=.. p99.9=.. max=.. rounds=..`. */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include "common.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1000, n = 11;
    double A[121], B[121], C[121], *us = malloc(rounds * sizeof *us);
    fill(A, 121, 7);
    fill(B, 121, 8);
    grpc_function_handle_t h;
    check(grpc_initialize(NULL), "grpc_initialize");
    check(grpc_function_handle_default(&h, "dmmul"), "grpc_function_handle_default");
    for (int i = 0; i < 20; i++) check(grpc_call(&h, n, A, B, C), "warm-up");
    for (int i = 0; i < rounds; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        check(grpc_call(&h, n, A, B, C), "grpc_call dmmul");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        us[i] = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    qsort(us, rounds, sizeof *us, cmp);
    printf("c latency_us p50=%.0f p99=%.0f p99.9=%.0f max=%.0f rounds=%d\n", us[rounds / 2],
           us[(int)(rounds * 0.99)], us[(int)(rounds * 0.999)], us[rounds - 1], rounds);
    check(grpc_finalize(), "grpc_finalize");
    return 0;
}
