/* Bad calls through librtpool, for tests/test_capi.py: each case prints
 * `CODE MESSAGE` of the failing call and exits 0 (2 when the call did not fail).
 *   bad_calls unknown|argc|null_handle|wait_unknown|unschedulable */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rtpool_grpc.h"

static int report(grpc_error_t err) {
    printf("%d %s\n", err, rtpool_last_error_message());
    return err == GRPC_NO_ERROR ? 2 : 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    grpc_function_handle_t h = {0};
    if (grpc_initialize(NULL) != GRPC_NO_ERROR) return report(grpc_get_last_error());
    if (!strcmp(what, "unknown")) return report(grpc_function_handle_default(&h, "no_such_function"));
    if (!strcmp(what, "null_handle")) return report(grpc_call(&h, 4, NULL, NULL, NULL));
    if (!strcmp(what, "wait_unknown")) return report(grpc_wait(12345));
    if (grpc_function_handle_default(&h, "dmmul") != GRPC_NO_ERROR) return report(grpc_get_last_error());
    int64_t n = 2;
    double a[4] = {1, 2, 3, 4}, c[4];
    void *args[3] = {&n, a, a};
    if (!strcmp(what, "unschedulable")) { /* a label and a GPU no worker has */
        if (rtpool_handle_set_label(&h, "zone", "nowhere") != GRPC_NO_ERROR ||
            rtpool_handle_set_resource(&h, "gpu", 1) != GRPC_NO_ERROR)
            return report(grpc_get_last_error());
        void *full[4] = {&n, a, a, c};
        return report(rtpool_call_argv(&h, full, 4));
    }
    (void)c;
    return report(rtpool_call_argv(&h, args, 3)); /* dmmul takes 4 */
}
