/*
 * utilization.c - how busy a GPU or a MIG device is: nvmlDeviceGetUtilizationRates
 * for a whole GPU, GPM (GPU Performance Monitoring) samples and metrics for
 * a MIG GPU instance.
 *
 * Tests set a level (percent) per GPU and per GPU instance in the state
 * file (fabric/simhost/nvml_state.py, NvmlStateFile.set_utilization); it
 * holds until changed. The writer keeps the level's integral over time
 * ("util_busy", percent x ms of CLOCK_MONOTONIC up to "util_since"), so a
 * GPM metric between two samples is the mean level over the time between
 * them, as GPM's counters give it on real hardware.
 *
 * Semantics from the NVML reference:
 * - nvmlDeviceGetUtilizationRates: a GPU handle only (a MIG handle is
 *   NOT_SUPPORTED), and NOT_SUPPORTED while MIG is enabled on the GPU.
 * - GPM exists on Hopper and newer: nvmlGpmQueryDeviceSupport says so
 *   (isSupportedDevice), nvmlGpmMigSampleGet answers NOT_SUPPORTED on older
 *   GPUs and while MIG is disabled, NOT_FOUND for a GPU instance id that
 *   does not exist. Versioned structs with a wrong version are
 *   ARGUMENT_VERSION_MISMATCH.
 * - nvmlGpmMetricsGet answers per metric (each metric's nvmlReturn): the
 *   mock's one level stands for GRAPHICS_UTIL, SM_UTIL and SM_OCCUPANCY;
 *   any other metric is NOT_SUPPORTED in its entry. Two samples of
 *   different devices, or a sample never filled, are INVALID_ARGUMENT.
 * Struct layouts follow pynvml (c_nvmlGpmMetricsGet_t, c_nvmlGpmSupport_t).
 */
#include "nvml_mock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRIC_MAX 477
#define GPM_GRAPHICS_UTIL 1
#define GPM_SM_UTIL 2
#define GPM_SM_OCCUPANCY 3
#define SAMPLE_MAGIC 0x67706d73u

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

struct nvmlGpmSample_st {
    unsigned magic;
    int taken;
    char uuid[UUID_LEN];
    unsigned gi_id;
    unsigned level;
    double t, busy; /* ms, percent x ms */
};
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;

typedef struct {
    unsigned int metricId;
    unsigned int nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* ---- whole GPU ------------------------------------------------------------- */

static nvmlReturn_t rates_impl(nvmlDevice_t d, nvmlUtilization_t *u)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetUtilizationRates", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (r.gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = r.gpu->util.level > 100 ? 100 : r.gpu->util.level;
    u->memory = r.gpu->mem_util > 100 ? 100 : r.gpu->mem_util;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    LOCKED(rates_impl(d, u));
}

/* ---- GPM ---------------------------------------------------------------- */

static int gpm_capable(const struct gpu_state *g) { return g->m->arch >= NVML_DEVICE_ARCH_HOPPER; }

static int sample_ok(const struct nvmlGpmSample_st *s) { return s && s->magic == SAMPLE_MAGIC; }

static nvmlReturn_t alloc_impl(nvmlGpmSample_t *out)
{
    nvmlReturn_t rc = rt_enter("nvmlGpmSampleAlloc", NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return NVML_ERROR_MEMORY;
    (*out)->magic = SAMPLE_MAGIC;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) { LOCKED(alloc_impl(sample)); }

static nvmlReturn_t free_impl(nvmlGpmSample_t s)
{
    if (!sample_ok(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    s->magic = 0;
    free(s);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) { LOCKED(free_impl(sample)); }

static nvmlReturn_t support_impl(nvmlDevice_t d, nvmlGpmSupport_t *support)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlGpmQueryDeviceSupport", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!support)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned)gpm_capable(r.gpu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support)
{
    LOCKED(support_impl(d, support));
}

static nvmlReturn_t mig_sample_impl(nvmlDevice_t d, unsigned gi_id, nvmlGpmSample_t s)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlGpmMigSampleGet", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!sample_ok(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_capable(r.gpu) || !r.gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    struct gi_state *gi = gpu_find_gi(r.gpu, gi_id);
    if (!gi)
        return NVML_ERROR_NOT_FOUND;
    s->t = now_ms();
    s->level = gi->util.level > 100 ? 100 : gi->util.level;
    s->busy = gi->util.busy + (double)s->level * (s->t - gi->util.since);
    copy_str(s->uuid, sizeof(s->uuid), r.gpu->uuid);
    s->gi_id = gi_id;
    s->taken = 1;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned gpuInstanceId,
                                     nvmlGpmSample_t sample)
{
    LOCKED(mig_sample_impl(d, gpuInstanceId, sample));
}

static const nvmlGpmMetricInfo_t INFO[] = {
    {"gr_util", "graphics utilization", "%"},
    {"sm_util", "SM utilization", "%"},
    {"sm_occ", "SM occupancy", "%"},
};

static nvmlReturn_t metrics_impl(nvmlGpmMetricsGet_t *m)
{
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct nvmlGpmSample_st *a = m->sample1, *b = m->sample2;
    if (m->numMetrics > NVML_GPM_METRIC_MAX || !sample_ok(a) || !sample_ok(b) || !a->taken ||
        !b->taken || strcmp(a->uuid, b->uuid) != 0 || a->gi_id != b->gi_id)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = rt_enter("nvmlGpmMetricsGet", b->uuid);
    if (rc != NVML_SUCCESS)
        return rc;
    /* The mean level between the samples (either order); the later level at no distance. */
    double value = a->t == b->t ? (double)(a->t > b->t ? a->level : b->level)
                                : (b->busy - a->busy) / (b->t - a->t);
    value = value < 0 ? 0 : value > 100 ? 100 : value;
    for (unsigned i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *e = &m->metrics[i];
        unsigned id = e->metricId;
        memset(&e->metricInfo, 0, sizeof(e->metricInfo));
        e->value = 0;
        if (id < GPM_GRAPHICS_UTIL || id > GPM_SM_OCCUPANCY) {
            e->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        e->value = value;
        e->metricInfo = INFO[id - GPM_GRAPHICS_UTIL];
        e->nvmlReturn = NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    LOCKED(metrics_impl(metricsGet));
}
