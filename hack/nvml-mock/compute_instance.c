/*
 * compute_instance.c - compute instances inside a GPU instance.
 *
 * CI profile ids equal their NVML_COMPUTE_INSTANCE_PROFILE_* value; a profile
 * exists in a GI when its slice count fits the GI's compute slices. Each CI
 * gets a MIG UUID (stored in the state file) that its MIG device reports.
 */
#include "nvml_mock.h"

#include <stdio.h>
#include <string.h>

static const unsigned CI_SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 0, 0, 0, 0};

struct ci_ctx {
    struct dev_ref r;
    const struct gi_profile *gp;
    unsigned slices; /* of the requested CI profile */
};

static nvmlReturn_t ci_profile(nvmlGpuInstance_t h, const char *fn, unsigned profile,
                               struct ci_ctx *c)
{
    nvmlReturn_t rc = rt_gi(h, fn, &c->r);
    if (rc != NVML_SUCCESS)
        return rc;
    c->gp = model_profile_by_id(c->r.gpu->m, c->r.gi->profile_id);
    if (!c->gp || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    c->slices = CI_SLICES[profile];
    if (c->slices == 0 || c->slices > c->gp->compute_slices)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static void ci_name(const struct ci_ctx *c, char *out, size_t cap)
{
    if (c->slices == c->gp->compute_slices)
        copy_str(out, cap, c->gp->name);
    else
        snprintf(out, cap, "MIG %uc.%s", c->slices, c->gp->name + 4);
}

static nvmlReturn_t profile_impl(nvmlGpuInstance_t h, const char *fn, unsigned profile,
                                 unsigned eng, void *out, int versioned)
{
    struct ci_ctx c;
    nvmlReturn_t rc = ci_profile(h, fn, profile, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct gi_profile *p = c.gp;
    nvmlComputeInstanceProfileInfo_t v1 = {profile, c.slices, p->compute_slices / c.slices,
                                           p->sms * c.slices / p->compute_slices, p->ce,
                                           p->dec, p->enc, p->jpeg, p->ofa};
    if (!versioned) {
        *(nvmlComputeInstanceProfileInfo_t *)out = v1;
        return NVML_SUCCESS;
    }
    nvmlComputeInstanceProfileInfo_v2_t *v2 = out;
    if (v2->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memcpy(&v2->id, &v1, sizeof(v1));
    ci_name(&c, v2->name, sizeof(v2->name));
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gi, unsigned profile, unsigned eng, nvmlComputeInstanceProfileInfo_t *i)
{
    LOCKED(profile_impl(gi, "nvmlGpuInstanceGetComputeInstanceProfileInfo", profile, eng, i,
                        0));
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gi, unsigned profile, unsigned eng, nvmlComputeInstanceProfileInfo_v2_t *i)
{
    LOCKED(profile_impl(gi, "nvmlGpuInstanceGetComputeInstanceProfileInfoV", profile, eng, i,
                        1));
}

/* Why a CI of `slices` cannot start at `start` inside gi. */
static nvmlReturn_t ci_fit(const struct gi_state *gi, unsigned gi_slices, unsigned slices,
                           unsigned start)
{
    if (start % slices != 0 || start + slices > gi_slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gi->nci; i++)
        if (start < gi->ci[i].start + gi->ci[i].size && gi->ci[i].start < start + slices)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return gi->nci < MAX_CIS ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
}

static nvmlReturn_t remaining_impl(nvmlGpuInstance_t h, unsigned profile, unsigned *count)
{
    struct ci_ctx c;
    nvmlReturn_t rc = ci_profile(h, "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
                                 profile, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    for (unsigned s = 0; s + c.slices <= c.gp->compute_slices; s += c.slices)
        *count += ci_fit(c.r.gi, c.gp->compute_slices, c.slices, s) == NVML_SUCCESS;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gi,
                                                                    unsigned profile,
                                                                    unsigned *count)
{
    LOCKED(remaining_impl(gi, profile, count));
}

static nvmlReturn_t placements_impl(nvmlGpuInstance_t h, unsigned profile,
                                    nvmlComputeInstancePlacement_t *out, unsigned *count)
{
    struct ci_ctx c;
    nvmlReturn_t rc = ci_profile(h, "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
                                 profile, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = c.gp->compute_slices / c.slices;
    if (out && *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; out && i < n; i++)
        out[i] = (nvmlComputeInstancePlacement_t){i * c.slices, c.slices};
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gi, unsigned profile, nvmlComputeInstancePlacement_t *pl, unsigned *count)
{
    LOCKED(placements_impl(gi, profile, pl, count));
}

struct create_arg {
    unsigned gi_id, profile, slices, gi_slices;
    long start;
    unsigned id;
};

static nvmlReturn_t create_op(struct state *st, struct gpu_state *g, void *arg)
{
    struct create_arg *a = arg;
    (void)st;
    struct gi_state *gi = gpu_find_gi(g, a->gi_id);
    if (!gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (a->start >= 0)
        rc = ci_fit(gi, a->gi_slices, a->slices, (unsigned)a->start);
    for (unsigned s = 0; a->start < 0 && s + a->slices <= a->gi_slices; s += a->slices)
        if (ci_fit(gi, a->gi_slices, a->slices, s) == NVML_SUCCESS) {
            a->start = s;
            rc = NVML_SUCCESS;
        }
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned id = 0;
    while (id < MAX_CI_ID && gi_find_ci(gi, id))
        id++;
    if (id == MAX_CI_ID)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    struct ci_state *ci = &gi->ci[gi->nci++];
    *ci = (struct ci_state){id, a->profile, (unsigned)a->start, a->slices, {0}};
    mig_make_uuid(ci->uuid, g->uuid, gi->id, id);
    a->id = id;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_impl(nvmlGpuInstance_t h, const char *fn, unsigned profile,
                                const nvmlComputeInstancePlacement_t *pl,
                                nvmlComputeInstance_t *out)
{
    struct ci_ctx c;
    nvmlReturn_t rc = ci_profile(h, fn, profile, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || (pl && pl->size != c.slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct create_arg a = {c.r.gi->id, profile, c.slices, c.gp->compute_slices,
                           pl ? (long)pl->start : -1, 0};
    rc = rt_mutate(c.r.slot, create_op, &a);
    if (rc == NVML_SUCCESS)
        *out = rt_ci_handle(c.r.slot, a.gi_id, a.id);
    return rc;
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned profile,
                                                      nvmlComputeInstance_t *ci)
{
    LOCKED(create_impl(gi, "nvmlGpuInstanceCreateComputeInstance", profile, NULL, ci));
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gi, unsigned profile, const nvmlComputeInstancePlacement_t *pl,
    nvmlComputeInstance_t *ci)
{
    if (!pl)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(create_impl(gi, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", profile, pl,
                       ci));
}
