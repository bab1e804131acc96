/* dmmul from C, Ninf style: C = A B on a worker serving rtpool.lib.linalg, checked here.
 *   RTPOOL_TOKEN=... ./dmmul [n] [config_file]     (n default 100)
 * Prints `dmmul n=N max_abs_err=E` and exits 0 when every element is within 1e-9 * n. */
#include <math.h>

#include "common.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    size_t len = (size_t)n * n;
    double *A = malloc(len * sizeof *A), *B = malloc(len * sizeof *B), *C = calloc(len, sizeof *C);
    fill(A, len, 1);
    fill(B, len, 2);

    grpc_function_handle_t h;
    check(grpc_initialize(argc > 2 ? argv[2] : NULL), "grpc_initialize");
    check(grpc_function_handle_default(&h, "dmmul"), "grpc_function_handle_default");
    check(grpc_call(&h, n, A, B, C), "grpc_call dmmul"); /* C is filled in place */

    double err = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double want = 0;
            for (int k = 0; k < n; k++) want += A[i * n + k] * B[k * n + j];
            err = fmax(err, fabs(want - C[i * n + j]));
        }
    printf("dmmul n=%d max_abs_err=%.3g\n", n, err);
    check(grpc_function_handle_destruct(&h), "grpc_function_handle_destruct");
    check(grpc_finalize(), "grpc_finalize");
    free(A), free(B), free(C);
    return err <= 1e-9 * n ? 0 : 1;
}
