/* Helpers shared by the C examples: failing with the library's message, a seeded matrix. */
#ifndef RTPOOL_EXAMPLES_COMMON_H
#define RTPOOL_EXAMPLES_COMMON_H
#include <stdio.h>
#include <stdlib.h>

#include "rtpool_grpc.h"

/* Exits with the code and message of a failed GridRPC call: `what: CODE (text): message`. */
static void check(grpc_error_t err, const char *what) {
    if (err == GRPC_NO_ERROR) return;
    fprintf(stderr, "%s: error %d (%s): %s\n", what, err, grpc_error_string(err), rtpool_last_error_message());
    exit(err < 100 ? 10 + err : err - 50);
}

/* Fills m[0..len) with values in [0, 1) from a small LCG seeded with `seed`. */
static void fill(double *m, size_t len, unsigned seed) {
    unsigned long long s = seed * 6364136223846793005ULL + 1;
    for (size_t i = 0; i < len; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        m[i] = (double)(s >> 11) / 9007199254740992.0;
    }
}
#endif
