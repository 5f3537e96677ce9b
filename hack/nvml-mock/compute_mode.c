/*
 * compute_mode.c - nvmlDeviceGetComputeMode / nvmlDeviceSetComputeMode.
 *
 * The mode lives in the state file ("compute_mode", 0 when absent), so
 * another process (or the simulated host) sees a change at once. Semantics
 * from the NVML reference: a NULL out-pointer or a mode outside
 * nvmlComputeMode_t (0..3) is INVALID_ARGUMENT; EXCLUSIVE_THREAD (1) is
 * "support removed": NOT_SUPPORTED; a GPU with MIG enabled takes compute
 * modes per MIG device only, so its GPU handle answers NOT_SUPPORTED to a
 * set; a lost GPU answers GPU_IS_LOST. The mock runs unprivileged, so there
 * is no NO_PERMISSION.
 */
#include "nvml_mock.h"

#define COMPUTEMODE_EXCLUSIVE_THREAD 1u
#define COMPUTEMODE_COUNT 4u

static nvmlReturn_t get_impl(nvmlDevice_t d, unsigned *mode)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetComputeMode", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = r.gpu->compute_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned *mode)
{
    LOCKED(get_impl(d, mode));
}

static nvmlReturn_t set_op(struct state *st, struct gpu_state *g, void *arg)
{
    (void)st;
    if (g->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    g->compute_mode = *(unsigned *)arg;
    return NVML_SUCCESS;
}

static nvmlReturn_t set_impl(nvmlDevice_t d, unsigned mode)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceSetComputeMode", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mode >= COMPUTEMODE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == COMPUTEMODE_EXCLUSIVE_THREAD)
        return NVML_ERROR_NOT_SUPPORTED;
    return rt_mutate(r.slot, set_op, &mode);
}

API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, unsigned mode)
{
    LOCKED(set_impl(d, mode));
}
