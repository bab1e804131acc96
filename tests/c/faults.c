/* Faults seen from librtpool, for tests/test_capi_faults.py. Each case prints one line:
 *   faults pid_after PATH SECONDS   `pid P`: the PID that ran pid_after (tasks.rpc_e2e)
 *   faults too_large N              `CODE MESSAGE` of a dmmul of n = N, then `after ok` when a
 *                                   small dmmul on the same session is right
 *   faults threads T K              `threads ok calls=T*K` when T threads x K dmmul calls on
 *                                   one session all got their own right product
 * A failed call prints `error CODE MESSAGE` and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtpool_grpc.h"

static grpc_function_handle_t dmmul;

static int fail(grpc_error_t err) {
    printf("error %d %s\n", err, rtpool_last_error_message());
    return 1;
}

/* C = A B for n x n matrices with A[i] = seed + i, B = I + 1: checks C against a local product. */
static int dmmul_checked(int n, double seed) {
    size_t len = (size_t)n * n;
    double *A = malloc(len * sizeof *A), *B = malloc(len * sizeof *B), *C = calloc(len, sizeof *C);
    for (size_t i = 0; i < len; i++) {
        A[i] = seed + (double)i;
        B[i] = (i / n == i % n) + 1.0;
    }
    grpc_error_t err = grpc_call(&dmmul, n, A, B, C);
    int wrong = err != GRPC_NO_ERROR;
    for (int i = 0; !wrong && i < n; i++)
        for (int j = 0; j < n; j++) {
            double want = 0;
            for (int k = 0; k < n; k++) want += A[i * n + k] * B[k * n + j];
            if (fabs(want - C[i * n + j]) > 1e-9 * fabs(want)) wrong = 1;
        }
    if (err != GRPC_NO_ERROR) fail(err);
    free(A);
    free(B);
    free(C);
    return wrong;
}

struct job {
    int index, calls, wrong;
};

static void *thread_calls(void *arg) {
    struct job *job = arg;
    for (int c = 0; c < job->calls; c++) job->wrong += dmmul_checked(6, 1000.0 * job->index + c);
    return NULL;
}

static int threads(int t, int k) {
    pthread_t ids[64];
    struct job jobs[64];
    if (t < 1 || t > 64) return 2;
    for (int i = 0; i < t; i++) {
        jobs[i] = (struct job){i, k, 0};
        pthread_create(&ids[i], NULL, thread_calls, &jobs[i]);
    }
    int wrong = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(ids[i], NULL);
        wrong += jobs[i].wrong;
    }
    if (wrong) {
        printf("threads wrong=%d of %d\n", wrong, t * k);
        return 1;
    }
    printf("threads ok calls=%d\n", t * k);
    return 0;
}

static int too_large(int n) {
    size_t len = (size_t)n * n;
    double *A = calloc(len, sizeof *A), *C = calloc(len, sizeof *C);
    grpc_error_t err = grpc_call(&dmmul, n, A, A, C);
    printf("%d %s\n", err, err == GRPC_NO_ERROR ? "" : rtpool_last_error_message());
    free(A);
    free(C);
    if (dmmul_checked(3, 0.5)) return 1;
    printf("after ok\n");
    return 0;
}

static int pid_after(const char *path, double seconds) {
    grpc_function_handle_t h;
    int64_t pid = 0;
    grpc_error_t err = grpc_function_handle_default(&h, "pid_after");
    if (err == GRPC_NO_ERROR) err = grpc_call(&h, path, seconds, &pid);
    if (err != GRPC_NO_ERROR) return fail(err);
    printf("pid %lld\n", (long long)pid);
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    grpc_error_t err = grpc_initialize(NULL);
    if (err != GRPC_NO_ERROR) return fail(err);
    int rc = 2;
    if (!strcmp(what, "pid_after") && argc == 4) {
        rc = pid_after(argv[2], atof(argv[3]));
    } else if ((err = grpc_function_handle_default(&dmmul, "dmmul")) != GRPC_NO_ERROR) {
        rc = fail(err);
    } else if (!strcmp(what, "too_large") && argc == 3) {
        rc = too_large(atoi(argv[2]));
    } else if (!strcmp(what, "threads") && argc == 4) {
        rc = threads(atoi(argv[2]), atoi(argv[3]));
    }
    grpc_finalize();
    return rc;
}
