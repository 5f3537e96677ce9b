/*
 * system.c - system-level queries and error strings.
 */
#include "nvml_mock.h"

#include <stdio.h>

static const struct {
    int code;
    const char *text;
} TEXTS[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "Timeout"},
    {NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request"},
    {NVML_ERROR_IN_USE, "In use by another client"},
    {NVML_ERROR_MEMORY, "Insufficient Memory"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Version mismatch"},
    {NVML_ERROR_INVALID_STATE, "Invalid state"},
};

API const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof(TEXTS) / sizeof(TEXTS[0]); i++)
        if (TEXTS[i].code == result)
            return TEXTS[i].text;
    return "Unknown Error";
}

static nvmlReturn_t version_string(const char *fn, int which, char *buf, unsigned int len)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = rt_enter(fn, NULL);
    if (rc == NVML_SUCCESS)
        rc = put_str(buf, len, which ? g_state.nvml_version : g_state.driver_version);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return version_string("nvmlSystemGetDriverVersion", 0, version, length);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return version_string("nvmlSystemGetNVMLVersion", 1, version, length);
}

static nvmlReturn_t cuda_version(const char *fn, int *out)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = out ? rt_enter(fn, NULL) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = g_state.cuda_version;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    return cuda_version("nvmlSystemGetCudaDriverVersion", v);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v);
}
