/*
 * gpu_instance.c - creating, listing and destroying GPU instances.
 *
 * GI ids are the lowest free id from 1. Destroying a GI that still holds
 * compute instances fails with IN_USE, as in NVML.
 */
#include "nvml_mock.h"

#include <string.h>

static nvmlReturn_t gi_profile_of(nvmlDevice_t d, const char *fn, unsigned id,
                                  struct dev_ref *r, const struct gi_profile **p)
{
    nvmlReturn_t rc = mig_gpu(d, fn, 1, r);
    if (rc != NVML_SUCCESS)
        return rc;
    *p = model_profile_by_id(r->gpu->m, id);
    return *p ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static struct gpu_state g_scratch;

static nvmlReturn_t remaining_impl(nvmlDevice_t d, unsigned id, unsigned *count)
{
    struct dev_ref r;
    const struct gi_profile *p;
    nvmlReturn_t rc = gi_profile_of(d, "nvmlDeviceGetGpuInstanceRemainingCapacity", id, &r, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    g_scratch = *r.gpu;
    *count = 0;
    for (unsigned i = 0; i < p->nstarts; i++) {
        if (gi_fit(&g_scratch, p, p->starts[i]) != NVML_SUCCESS)
            continue;
        g_scratch.gi[g_scratch.ngi++] =
            (struct gi_state){0, p->id, p->starts[i], p->memory_slots, 0, {{0}}, {0, 0, 0}};
        (*count)++;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned id,
                                                           unsigned *count)
{
    LOCKED(remaining_impl(d, id, count));
}

struct create_arg {
    const struct gi_profile *p;
    long start; /* -1: first free placement */
    unsigned id;
};

static nvmlReturn_t create_op(struct state *st, struct gpu_state *g, void *arg)
{
    struct create_arg *a = arg;
    (void)st;
    if (!g->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (a->start >= 0) {
        rc = gi_fit(g, a->p, (unsigned)a->start);
    } else {
        for (unsigned i = 0; i < a->p->nstarts && rc != NVML_SUCCESS; i++)
            if (gi_fit(g, a->p, a->p->starts[i]) == NVML_SUCCESS) {
                a->start = a->p->starts[i];
                rc = NVML_SUCCESS;
            }
    }
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned id = 1;
    while (id < MAX_GI_ID && gpu_find_gi(g, id))
        id++;
    if (id == MAX_GI_ID)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    a->id = id;
    g->gi[g->ngi++] =
        (struct gi_state){id, a->p->id, (unsigned)a->start, a->p->memory_slots, 0, {{0}}, {0, 0, 0}};
    return NVML_SUCCESS;
}

static nvmlReturn_t create_impl(nvmlDevice_t d, const char *fn, unsigned id,
                                const nvmlGpuInstancePlacement_t *pl, nvmlGpuInstance_t *out)
{
    struct dev_ref r;
    const struct gi_profile *p;
    nvmlReturn_t rc = gi_profile_of(d, fn, id, &r, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || (pl && pl->size != p->memory_slots))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct create_arg a = {p, pl ? (long)pl->start : -1, 0};
    rc = rt_mutate(r.slot, create_op, &a);
    if (rc == NVML_SUCCESS)
        *out = rt_gi_handle(r.slot, a.id);
    return rc;
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned id,
                                             nvmlGpuInstance_t *gi)
{
    LOCKED(create_impl(d, "nvmlDeviceCreateGpuInstance", id, NULL, gi));
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned id,
                                                          const nvmlGpuInstancePlacement_t *pl,
                                                          nvmlGpuInstance_t *gi)
{
    if (!pl)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(create_impl(d, "nvmlDeviceCreateGpuInstanceWithPlacement", id, pl, gi));
}

static nvmlReturn_t list_impl(nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *out,
                              unsigned *count)
{
    struct dev_ref r;
    const struct gi_profile *p;
    nvmlReturn_t rc = gi_profile_of(d, "nvmlDeviceGetGpuInstances", id, &r, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (int i = 0; i < r.gpu->ngi; i++) {
        if (r.gpu->gi[i].profile_id != id)
            continue;
        if (n == *count)
            return NVML_ERROR_INSUFFICIENT_SIZE;
        out[n++] = rt_gi_handle(r.slot, r.gpu->gi[i].id);
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned id,
                                           nvmlGpuInstance_t *gis, unsigned *count)
{
    LOCKED(list_impl(d, id, gis, count));
}

static nvmlReturn_t by_id_impl(nvmlDevice_t d, unsigned id, nvmlGpuInstance_t *out)
{
    struct dev_ref r;
    nvmlReturn_t rc = mig_gpu(d, "nvmlDeviceGetGpuInstanceById", 1, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu_find_gi(r.gpu, id))
        return NVML_ERROR_NOT_FOUND;
    *out = rt_gi_handle(r.slot, id);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned id,
                                              nvmlGpuInstance_t *gi)
{
    LOCKED(by_id_impl(d, id, gi));
}

static nvmlReturn_t info_impl(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gi(h, "nvmlGpuInstanceGetInfo", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlGpuInstanceInfo_t){rt_gpu_handle(r.slot), r.gi->id, r.gi->profile_id,
                                    {r.gi->start, r.gi->size}};
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info)
{
    LOCKED(info_impl(gi, info));
}

static nvmlReturn_t destroy_op(struct state *st, struct gpu_state *g, void *arg)
{
    unsigned id = *(unsigned *)arg;
    (void)st;
    struct gi_state *gi = gpu_find_gi(g, id);
    if (!gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gi->nci > 0)
        return NVML_ERROR_IN_USE;
    long idx = gi - g->gi;
    memmove(gi, gi + 1, sizeof(*gi) * (size_t)(g->ngi - idx - 1));
    g->ngi--;
    return NVML_SUCCESS;
}

static nvmlReturn_t destroy_impl(nvmlGpuInstance_t h)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gi(h, "nvmlGpuInstanceDestroy", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned id = r.gi->id;
    return rt_mutate(r.slot, destroy_op, &id);
}

API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) { LOCKED(destroy_impl(gi)); }
