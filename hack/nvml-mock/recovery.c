/*
 * recovery.c - what a health check reads after an XID: the GPU's recovery
 * action (nvmlDeviceGetFieldValues with NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
 * its row remapper (nvmlDeviceGetRemappedRows) and its uncorrectable ECC
 * count (nvmlDeviceGetTotalEccErrors).
 *
 * All three live in the state file (state.c: "recovery_action",
 * "row_remap_pending", "row_remap_failure", "ecc_uncorrected"), written by
 * the simulated host when it raises a failure and cleared by its GPU reset
 * (fabric/simhost/nvidia_smi.py), so every process sees them at once.
 * Semantics from the NVML reference: nvmlDeviceGetFieldValues answers per
 * value (each value's nvmlReturn), the call itself fails only for a bad
 * handle or arguments; a field the mock does not model, or the recovery
 * action on a GPU whose state says -1 (older drivers), is NOT_SUPPORTED in
 * that value. The ECC count is the volatile one (since the last reset); the
 * aggregate counter is NOT_SUPPORTED here.
 */
#include "nvml_mock.h"

#include <string.h>
#include <time.h>

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    unsigned int nvmlReturn;
    union {
        double dVal;
        unsigned int uiVal;
        unsigned long ulVal;
        unsigned long long ullVal;
        long long sllVal;
        int siVal;
        unsigned short usVal;
    } value;
} nvmlFieldValue_t;

static nvmlReturn_t fields_impl(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetFieldValues", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count < 0 || (count > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof(v->value));
        if (v->fieldId != NVML_FI_DEV_GET_GPU_RECOVERY_ACTION || r.gpu->recovery_action < 0) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned int)r.gpu->recovery_action;
        v->nvmlReturn = NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
    LOCKED(fields_impl(d, count, values));
}

static nvmlReturn_t remapped_impl(nvmlDevice_t d, unsigned *corr, unsigned *unc, unsigned *pending,
                                  unsigned *failure)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetRemappedRows", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!corr || !unc || !pending || !failure)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (r.gpu->m->arch < NVML_DEVICE_ARCH_AMPERE)
        return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = (unsigned)(r.gpu->remap_pending || r.gpu->remap_failure);
    *pending = (unsigned)r.gpu->remap_pending;
    *failure = (unsigned)r.gpu->remap_failure;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned *corr, unsigned *unc,
                                           unsigned *pending, unsigned *failure)
{
    LOCKED(remapped_impl(d, corr, unc, pending, failure));
}

static nvmlReturn_t ecc_impl(nvmlDevice_t d, int type, int counter, unsigned long long *count)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetTotalEccErrors", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count || type < 0 || type > 1 || counter < 0 || counter > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (counter != NVML_VOLATILE_ECC)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? r.gpu->ecc_uncorrected : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                             unsigned long long *count)
{
    LOCKED(ecc_impl(d, type, counter, count));
}
