/* Call latency from C: `rounds` sequential dmmul calls of n = 11 (each matrix 968 bytes, about
 * 1 KiB per argument), after 20 warm-up calls, each product checked against a local one.
 *   RTPOOL_TOKEN=... ./latency [rounds] [--go] [--seconds S]   (default 1000 rounds)
 * --go: print `ready` after the warm-up and start on a `go` line on stdin (so that several
 * clients start together: `rtpool bench clients`); --seconds: stop after S seconds even if
 * fewer rounds are done. Prints one JSON line:
 *   {"client": "c", "calls": K, "wrong": W, "seconds": S, "us": [every call's microseconds]}
 * and exits 0 when every product was right. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <string.h>
#include <time.h>

#include "common.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int rounds = 1000, n = 11, go = 0;
    double seconds = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--go")) go = 1;
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else rounds = atoi(argv[i]);
    }
    if (rounds < 1) rounds = 1;
    double A[121], B[121], C[121], want[121], *us = malloc(rounds * sizeof *us);
    fill(A, 121, 7);
    fill(B, 121, 8);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            want[i * n + j] = 0;
            for (int k = 0; k < n; k++) want[i * n + j] += A[i * n + k] * B[k * n + j];
        }
    grpc_function_handle_t h;
    check(grpc_initialize(NULL), "grpc_initialize");
    check(grpc_function_handle_default(&h, "dmmul"), "grpc_function_handle_default");
    for (int i = 0; i < 20; i++) check(grpc_call(&h, n, A, B, C), "warm-up");
    if (go) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin) || strncmp(line, "go", 2)) return 2;
    }
    int calls = 0, wrong = 0;
    double start = now_s();
    for (; calls < rounds; calls++) {
        if (seconds > 0 && now_s() - start > seconds) break;
        memset(C, 0, sizeof C);
        double t0 = now_s();
        check(grpc_call(&h, n, A, B, C), "grpc_call dmmul");
        us[calls] = (now_s() - t0) * 1e6;
        for (int k = 0; k < n * n; k++)
            if (fabs(C[k] - want[k]) > 1e-9 * fabs(want[k])) {
                wrong++;
                break;
            }
    }
    printf("{\"client\": \"c\", \"calls\": %d, \"wrong\": %d, \"seconds\": %.6f, \"us\": [", calls, wrong,
           now_s() - start);
    for (int i = 0; i < calls; i++) printf(i ? ", %.1f" : "%.1f", us[i]);
    printf("]}\n");
    check(grpc_finalize(), "grpc_finalize");
    return wrong ? 1 : 0;
}
