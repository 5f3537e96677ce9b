/*
 * mig_gi.c - MIG mode, GPU instance profiles and the placement rules.
 *
 * Occupancy model: a GPU instance holds memory slots [start, start+size) and
 * its profile's compute slices (7 in all). A placement must be one of the
 * profile's starts with the profile's size (else INVALID_ARGUMENT); it must
 * not overlap another instance, exceed the compute slices or the profile's
 * instance count (else INSUFFICIENT_RESOURCES). Hopper applies a MIG mode
 * change at once; Ampere keeps it pending until the GPU is reset (the
 * simulated host rewrites mig_current).
 */
#include "nvml_mock.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct gi_state *gpu_find_gi(struct gpu_state *g, unsigned int id)
{
    for (int i = 0; i < g->ngi; i++)
        if (g->gi[i].id == id)
            return &g->gi[i];
    return NULL;
}

struct ci_state *gi_find_ci(struct gi_state *gi, unsigned int id)
{
    for (int i = 0; gi && i < gi->nci; i++)
        if (gi->ci[i].id == id)
            return &gi->ci[i];
    return NULL;
}

void mig_make_uuid(char *out, const char *gpu_uuid, unsigned gi, unsigned ci)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = gpu_uuid; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h = (h ^ (gi << 8 | ci)) * 1099511628211ULL;
    uint64_t h2 = (h ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20)) * 1099511628211ULL;
    uint64_t h3 = (h2 ^ (uint64_t)getpid() ^ (h2 >> 29)) * 1099511628211ULL;
    snprintf(out, UUID_LEN, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(h >> 32),
             (unsigned)(h >> 16) & 0xffff, (unsigned)(h2 >> 48) & 0xffff,
             (unsigned)(h2 >> 32) & 0xffff, (unsigned long long)(h3 & 0xffffffffffffULL));
}

/* ---- MIG mode ------------------------------------------------------------ */

static nvmlReturn_t get_mode_impl(nvmlDevice_t d, unsigned *cur, unsigned *pend)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetMigMode", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.gpu->m->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!cur || !pend)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cur = (unsigned)r.gpu->mig_current;
    *pend = (unsigned)r.gpu->mig_pending;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *cur, unsigned *pend)
{
    LOCKED(get_mode_impl(d, cur, pend));
}

struct set_mode_arg {
    unsigned mode;
    nvmlReturn_t activation;
};

static nvmlReturn_t set_mode_op(struct state *st, struct gpu_state *g, void *arg)
{
    struct set_mode_arg *a = arg;
    (void)st;
    if (a->mode == 0 && g->ngi > 0)
        return NVML_ERROR_IN_USE;
    g->mig_pending = (int)a->mode;
    if (!g->m->mig_needs_reset)
        g->mig_current = (int)a->mode;
    a->activation = g->mig_current == g->mig_pending ? NVML_SUCCESS : NVML_ERROR_RESET_REQUIRED;
    return NVML_SUCCESS;
}

static nvmlReturn_t set_mode_impl(nvmlDevice_t d, unsigned mode, nvmlReturn_t *activation)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceSetMigMode", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.gpu->m->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (mode > 1 || !activation)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct set_mode_arg a = {mode, NVML_SUCCESS};
    rc = rt_mutate(r.slot, set_mode_op, &a);
    if (rc == NVML_SUCCESS)
        *activation = a.activation;
    return rc;
}

API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned mode, nvmlReturn_t *status)
{
    LOCKED(set_mode_impl(d, mode, status));
}

/* ---- GPU instance profiles ------------------------------------------------ */

/* Resolve a GPU handle that supports MIG; with need_enabled, MIG must be on. */
nvmlReturn_t mig_gpu(nvmlDevice_t d, const char *fn, int need_enabled, struct dev_ref *r)
{
    nvmlReturn_t rc = rt_gpu(d, fn, r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r->gpu->m->mig_capable || (need_enabled && !r->gpu->mig_current))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t profile_lookup(nvmlDevice_t d, const char *fn, int by_id, unsigned key,
                                   const struct gi_profile **out)
{
    struct dev_ref r;
    nvmlReturn_t rc = mig_gpu(d, fn, 0, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!by_id && key >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = by_id ? model_profile_by_id(r.gpu->m, key) : model_profile_by_enum(r.gpu->m, key);
    if (!*out)
        return by_id ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t profile_v1_impl(nvmlDevice_t d, unsigned profile,
                                    nvmlGpuInstanceProfileInfo_t *info)
{
    const struct gi_profile *p;
    nvmlReturn_t rc = profile_lookup(d, "nvmlDeviceGetGpuInstanceProfileInfo", 0, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlGpuInstanceProfileInfo_t){p->id, 0, p->compute_slices, p->max_count, p->sms,
                                           p->ce, p->dec, p->enc, p->jpeg, p->ofa,
                                           p->memory_mib};
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned profile,
                                                     nvmlGpuInstanceProfileInfo_t *info)
{
    LOCKED(profile_v1_impl(d, profile, info));
}

static nvmlReturn_t profile_v_impl(nvmlDevice_t d, const char *fn, int by_id, unsigned key,
                                   void *out)
{
    const struct gi_profile *p;
    nvmlReturn_t rc = profile_lookup(d, fn, by_id, key, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = *(unsigned *)out;
    if (version == nvmlGpuInstanceProfileInfo_v2) {
        nvmlGpuInstanceProfileInfo_v2_t *i = out;
        *i = (nvmlGpuInstanceProfileInfo_v2_t){version, p->id, 0, p->compute_slices,
                                               p->max_count, p->sms, p->ce, p->dec, p->enc,
                                               p->jpeg, p->ofa, p->memory_mib, {0}};
        copy_str(i->name, sizeof(i->name), p->name);
    } else if (version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *i = out;
        *i = (nvmlGpuInstanceProfileInfo_v3_t){version, p->id, p->compute_slices, p->max_count,
                                               p->sms, p->ce, p->dec, p->enc, p->jpeg, p->ofa,
                                               p->memory_mib, {0}, 0};
        copy_str(i->name, sizeof(i->name), p->name);
    } else {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned profile,
                                                      void *info)
{
    LOCKED(profile_v_impl(d, "nvmlDeviceGetGpuInstanceProfileInfoV", 0, profile, info));
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t d, unsigned id,
                                                          void *info)
{
    LOCKED(profile_v_impl(d, "nvmlDeviceGetGpuInstanceProfileInfoByIdV", 1, id, info));
}

static nvmlReturn_t placements_impl(nvmlDevice_t d, unsigned id,
                                    nvmlGpuInstancePlacement_t *out, unsigned *count)
{
    const struct gi_profile *p;
    nvmlReturn_t rc = profile_lookup(d, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", 1,
                                     id, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!out) {
        *count = p->nstarts;
        return NVML_SUCCESS;
    }
    if (*count < p->nstarts) {
        *count = p->nstarts;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < p->nstarts; i++)
        out[i] = (nvmlGpuInstancePlacement_t){p->starts[i], p->memory_slots};
    *count = p->nstarts;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t d, unsigned id, nvmlGpuInstancePlacement_t *placements, unsigned *count)
{
    LOCKED(placements_impl(d, id, placements, count));
}

/* ---- occupancy ------------------------------------------------------------ */

/* Why p cannot be placed at start on g (INVALID_ARGUMENT / INSUFFICIENT_RESOURCES). */
nvmlReturn_t gi_fit(const struct gpu_state *g, const struct gi_profile *p, unsigned start)
{
    int valid = 0, count = 0;
    unsigned slices = 0;
    for (unsigned i = 0; i < p->nstarts; i++)
        valid |= p->starts[i] == start;
    if (!valid)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g->ngi; i++) {
        const struct gi_state *o = &g->gi[i];
        const struct gi_profile *op = model_profile_by_id(g->m, o->profile_id);
        slices += op ? op->compute_slices : 0;
        count += o->profile_id == p->id;
        if (start < o->start + o->size && o->start < start + p->memory_slots)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (g->ngi >= MAX_GIS || (unsigned)count >= p->max_count ||
        slices + p->compute_slices > MIG_COMPUTE_SLICES)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}
