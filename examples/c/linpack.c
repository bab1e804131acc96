/* The Linpack kernel from C: solve A x = b on a worker (rtpool.lib.linalg's `linpack`, whose b
 * is InOut: x replaces it), then check the residual here.
 *   RTPOOL_TOKEN=... ./linpack [n] [config_file]   (n default 100)
 * Prints `linpack n=N residual=R` and exits 0 when max |A x - b| <= 1e-8 * n. */
#include <math.h>
#include <string.h>

#include "common.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    size_t len = (size_t)n * n;
    double *A = malloc(len * sizeof *A), *b = malloc(n * sizeof *b), *x = malloc(n * sizeof *x);
    fill(A, len, 3);
    for (int i = 0; i < n; i++) A[i * n + i] += n; /* well conditioned */
    fill(b, n, 4);
    memcpy(x, b, n * sizeof *x);

    grpc_function_handle_t h;
    check(grpc_initialize(argc > 2 ? argv[2] : NULL), "grpc_initialize");
    check(grpc_function_handle_default(&h, "linpack"), "grpc_function_handle_default");
    check(grpc_call(&h, n, A, x), "grpc_call linpack");

    double residual = 0;
    for (int i = 0; i < n; i++) {
        double r = -b[i];
        for (int j = 0; j < n; j++) r += A[i * n + j] * x[j];
        residual = fmax(residual, fabs(r));
    }
    printf("linpack n=%d residual=%.3g\n", n, residual);
    check(grpc_finalize(), "grpc_finalize");
    free(A), free(b), free(x);
    return residual <= 1e-8 * n ? 0 : 1;
}
