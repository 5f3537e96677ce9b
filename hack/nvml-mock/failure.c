/*
 * failure.c - failure injection driven by the state file.
 *
 * A rule {"function": "nvmlDeviceGetUUID", "error": "GPU_IS_LOST",
 * "remaining": N, "gpu": "GPU-..."} makes the named entry point fail with that
 * error the next N times (remaining -1: always), optionally only for one GPU.
 * Consumption is written back under the state lock, so "fail once" means
 * once across all processes sharing the state file.
 */
#include "nvml_mock.h"

#include <string.h>

struct consume_arg {
    const char *fn, *uuid;
    int error;
};

static int matches(const struct failure *f, const char *fn, const char *uuid)
{
    if (strcmp(f->function, fn) != 0)
        return 0;
    return f->gpu[0] == '\0' || (uuid && strcmp(f->gpu, uuid) == 0);
}

static nvmlReturn_t consume(struct state *st, struct gpu_state *gpu, void *arg)
{
    struct consume_arg *a = arg;
    (void)gpu;
    for (int i = 0; i < st->nfail; i++) {
        struct failure *f = &st->fail[i];
        if (!matches(f, a->fn, a->uuid) || f->remaining == 0)
            continue;
        a->error = f->error;
        if (f->remaining > 0 && --f->remaining == 0) {
            memmove(f, f + 1, sizeof(*f) * (size_t)(st->nfail - i - 1));
            st->nfail--;
        }
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND; /* another process used it up: nothing to write */
}

nvmlReturn_t failure_check(const char *fn, const char *uuid)
{
    for (int i = 0; i < g_state.nfail; i++) {
        const struct failure *f = &g_state.fail[i];
        if (!matches(f, fn, uuid))
            continue;
        if (f->remaining < 0)
            return f->error;
        struct consume_arg a = {fn, uuid, NVML_SUCCESS};
        if (rt_mutate(-1, consume, &a) == NVML_SUCCESS)
            return a.error;
        return NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}
