/*
 * processes.c - nvmlDevice{Compute,Graphics}RunningProcesses (_v2, _v3).
 *
 * The processes live in the state file (a GPU's "processes": [pid, ...],
 * none when absent), written by the simulated host when something holds the
 * GPU, so every process sees them at once. They run as compute processes;
 * no graphics ones. Semantics from the NVML reference: *infoCount in, the
 * array's room; out, the number of processes. Too little room (a count of 0
 * with a NULL array is how callers ask) is INSUFFICIENT_SIZE with the count
 * set; no processes is SUCCESS with 0. A NULL infoCount is INVALID_ARGUMENT.
 * pynvml's nvmlProcessInfo_t (v2 and v3 alike) is pid, usedGpuMemory,
 * gpuInstanceId, computeInstanceId; the mock knows no memory use or instance.
 *
 * nvmlDeviceGetProcessUtilization: the GPU's "process_utilization" entries
 * (pid, sm, mem percent), each a level that holds until changed, so every
 * query answers one sample per entry stamped now (CLOCK_REALTIME, us), newer
 * than any lastSeenTimeStamp in the past. From the NVML reference: a GPU
 * handle only; NOT_SUPPORTED while MIG is enabled; a NULL count is
 * INVALID_ARGUMENT; no sample newer than lastSeenTimeStamp is NOT_FOUND; a
 * NULL array or too little room is INSUFFICIENT_SIZE with the count set
 * (pynvml asks so first). Layout: pynvml's c_nvmlProcessUtilizationSample_t.
 */
#include "nvml_mock.h"

#include <string.h>
#include <time.h>

#define NVML_VALUE_NOT_AVAILABLE_U32 0xFFFFFFFFu

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static nvmlReturn_t list_impl(nvmlDevice_t d, const char *fn, int compute, unsigned *count,
                              nvmlProcessInfo_t *infos)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, fn, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = compute ? (unsigned)r.gpu->nproc : 0;
    if (*count < n || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        memset(&infos[i], 0, sizeof(infos[i]));
        infos[i].pid = r.gpu->pid[i];
        infos[i].usedGpuMemory = 0;
        infos[i].gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_U32;
        infos[i].computeInstanceId = NVML_VALUE_NOT_AVAILABLE_U32;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count,
                                                         nvmlProcessInfo_t *infos)
{
    LOCKED(list_impl(d, "nvmlDeviceGetComputeRunningProcesses_v3", 1, count, infos));
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *count,
                                                         nvmlProcessInfo_t *infos)
{
    LOCKED(list_impl(d, "nvmlDeviceGetComputeRunningProcesses_v2", 1, count, infos));
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned *count,
                                                          nvmlProcessInfo_t *infos)
{
    LOCKED(list_impl(d, "nvmlDeviceGetGraphicsRunningProcesses_v3", 0, count, infos));
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned *count,
                                                          nvmlProcessInfo_t *infos)
{
    LOCKED(list_impl(d, "nvmlDeviceGetGraphicsRunningProcesses_v2", 0, count, infos));
}

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

static unsigned long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

static nvmlReturn_t putil_impl(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                               unsigned *count, unsigned long long last_seen)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetProcessUtilization", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (r.gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long t = now_us();
    unsigned n = t > last_seen ? (unsigned)r.gpu->nputil : 0;
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!out || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].pid = r.gpu->putil[i].pid;
        out[i].timeStamp = t;
        out[i].smUtil = r.gpu->putil[i].sm > 100 ? 100 : r.gpu->putil[i].sm;
        out[i].memUtil = r.gpu->putil[i].mem > 100 ? 100 : r.gpu->putil[i].mem;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                                 nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp)
{
    LOCKED(putil_impl(d, utilization, processSamplesCount, lastSeenTimeStamp));
}
