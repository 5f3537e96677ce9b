/*
 * mig_device.c - listing/destroying compute instances and the MIG device
 * handles that stand for them (one MIG device per compute instance).
 */
#include "nvml_mock.h"

#include <string.h>

static nvmlReturn_t list_impl(nvmlGpuInstance_t h, unsigned profile,
                              nvmlComputeInstance_t *out, unsigned *count)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gi(h, "nvmlGpuInstanceGetComputeInstances", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || !count || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (int i = 0; i < r.gi->nci; i++) {
        if (r.gi->ci[i].profile_id != profile)
            continue;
        if (n == *count)
            return NVML_ERROR_INSUFFICIENT_SIZE;
        out[n++] = rt_ci_handle(r.slot, r.gi->id, r.gi->ci[i].id);
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned profile,
                                                    nvmlComputeInstance_t *cis,
                                                    unsigned *count)
{
    LOCKED(list_impl(gi, profile, cis, count));
}

static nvmlReturn_t by_id_impl(nvmlGpuInstance_t h, unsigned id, nvmlComputeInstance_t *out)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gi(h, "nvmlGpuInstanceGetComputeInstanceById", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gi_find_ci(r.gi, id))
        return NVML_ERROR_NOT_FOUND;
    *out = rt_ci_handle(r.slot, r.gi->id, id);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned id,
                                                       nvmlComputeInstance_t *ci)
{
    LOCKED(by_id_impl(gi, id, ci));
}

static nvmlReturn_t info_impl(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_ci(h, "nvmlComputeInstanceGetInfo_v2", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlComputeInstanceInfo_t){rt_gpu_handle(r.slot), rt_gi_handle(r.slot, r.gi->id),
                                        r.ci->id, r.ci->profile_id, {r.ci->start, r.ci->size}};
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci,
                                               nvmlComputeInstanceInfo_t *info)
{
    LOCKED(info_impl(ci, info));
}

static nvmlReturn_t destroy_op(struct state *st, struct gpu_state *g, void *arg)
{
    const unsigned *ids = arg;
    (void)st;
    struct gi_state *gi = gpu_find_gi(g, ids[0]);
    struct ci_state *ci = gi_find_ci(gi, ids[1]);
    if (!ci)
        return NVML_ERROR_INVALID_ARGUMENT;
    long idx = ci - gi->ci;
    memmove(ci, ci + 1, sizeof(*ci) * (size_t)(gi->nci - idx - 1));
    gi->nci--;
    return NVML_SUCCESS;
}

static nvmlReturn_t destroy_impl(nvmlComputeInstance_t h)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_ci(h, "nvmlComputeInstanceDestroy", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned ids[2] = {r.gi->id, r.ci->id};
    return rt_mutate(r.slot, destroy_op, ids);
}

API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci)
{
    LOCKED(destroy_impl(ci));
}

/* ---- MIG device handles ---------------------------------------------------- */

static nvmlReturn_t max_count_impl(nvmlDevice_t d, unsigned *count)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetMaxMigDeviceCount", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = r.gpu->m->mig_capable ? MIG_COMPUTE_SLICES : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *count)
{
    LOCKED(max_count_impl(d, count));
}

static nvmlReturn_t by_index_impl(nvmlDevice_t d, unsigned index, nvmlDevice_t *out)
{
    struct dev_ref r;
    nvmlReturn_t rc = mig_gpu(d, "nvmlDeviceGetMigDeviceHandleByIndex", 1, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || index >= MIG_COMPUTE_SLICES)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned gid = 0; gid < MAX_GI_ID; gid++) {
        struct gi_state *gi = gpu_find_gi(r.gpu, gid);
        for (unsigned cid = 0; gi && cid < MAX_CI_ID; cid++)
            if (gi_find_ci(gi, cid) && n++ == index) {
                *out = rt_mig_handle(r.slot, gid, cid);
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned index,
                                                     nvmlDevice_t *mig)
{
    LOCKED(by_index_impl(d, index, mig));
}

enum mig_attr { M_IS_MIG, M_PARENT, M_GI_ID, M_CI_ID };

static nvmlReturn_t mig_attr_impl(nvmlDevice_t d, const char *fn, enum mig_attr a, void *out)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, fn, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a == M_IS_MIG) {
        *(unsigned *)out = (unsigned)r.is_mig;
        return NVML_SUCCESS;
    }
    if (!r.is_mig)
        return a == M_PARENT ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    if (a == M_PARENT)
        *(nvmlDevice_t *)out = rt_gpu_handle(r.slot);
    else
        *(unsigned *)out = a == M_GI_ID ? r.gi->id : r.ci->id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is_mig)
{
    LOCKED(mig_attr_impl(d, "nvmlDeviceIsMigDeviceHandle", M_IS_MIG, is_mig));
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                              nvmlDevice_t *device)
{
    LOCKED(mig_attr_impl(mig, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", M_PARENT, device));
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned *id)
{
    LOCKED(mig_attr_impl(d, "nvmlDeviceGetGpuInstanceId", M_GI_ID, id));
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned *id)
{
    LOCKED(mig_attr_impl(d, "nvmlDeviceGetComputeInstanceId", M_CI_ID, id));
}
