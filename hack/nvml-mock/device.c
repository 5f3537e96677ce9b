/*
 * device.c - device enumeration and per-device queries (GPU and MIG handles).
 */
#include "nvml_mock.h"

#include <stdio.h>
#include <string.h>



/* ---- enumeration ------------------------------------------------------- */

static nvmlReturn_t count_impl(unsigned int *count)
{
    nvmlReturn_t rc = rt_enter("nvmlDeviceGetCount_v2", NULL);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = (unsigned)rt_device_count();
    return rc;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { LOCKED(count_impl(count)); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { LOCKED(count_impl(count)); }

static nvmlReturn_t by_slot(int slot, const char *fn, nvmlDevice_t *device)
{
    struct dev_ref r;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = rt_device(rt_gpu_handle(slot), fn, &r);
    if (rc == NVML_SUCCESS)
        *device = rt_gpu_handle(slot);
    return rc;
}

static nvmlReturn_t by_index_impl(unsigned int index, nvmlDevice_t *device)
{
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    int slot = rt_slot_of_index((int)index);
    if (slot < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return by_slot(slot, "nvmlDeviceGetHandleByIndex_v2", device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(by_index_impl(index, device));
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(by_index_impl(index, device));
}

enum key_kind { KEY_UUID, KEY_SERIAL, KEY_BUS };

static int parse_bus(const char *s, unsigned v[4])
{
    if (sscanf(s, "%x:%x:%x.%x", &v[0], &v[1], &v[2], &v[3]) == 4)
        return 1;
    v[0] = 0;
    return sscanf(s, "%x:%x.%x", &v[1], &v[2], &v[3]) == 3;
}

static int key_matches(const struct gpu_state *g, enum key_kind kind, const char *key)
{
    unsigned a[4], b[4];
    switch (kind) {
    case KEY_UUID: return strcmp(g->uuid, key) == 0;
    case KEY_SERIAL: return strcmp(g->serial, key) == 0;
    case KEY_BUS:
        return parse_bus(key, a) && parse_bus(g->bus_id, b) && memcmp(a, b, sizeof(a)) == 0;
    }
    return 0;
}

static nvmlReturn_t by_key_impl(enum key_kind kind, const char *key, const char *fn,
                                nvmlDevice_t *device)
{
    nvmlReturn_t rc = rt_enter(fn, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!key || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < rt_device_count(); i++) {
        int slot = rt_slot_of_index(i);
        struct gpu_state *g = state_gpu(&g_state, rt_slot_uuid(slot));
        if (!g) {
            if (kind == KEY_UUID && strcmp(rt_slot_uuid(slot), key) == 0)
                return NVML_ERROR_GPU_IS_LOST;
            continue;
        }
        if (key_matches(g, kind, key))
            return by_slot(slot, fn, device);
        for (int j = 0; kind == KEY_UUID && j < g->ngi; j++)
            for (int k = 0; k < g->gi[j].nci; k++)
                if (strcmp(g->gi[j].ci[k].uuid, key) == 0) {
                    if (g->lost)
                        return NVML_ERROR_GPU_IS_LOST;
                    *device = rt_mig_handle(slot, g->gi[j].id, g->gi[j].ci[k].id);
                    return NVML_SUCCESS;
                }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LOCKED(by_key_impl(KEY_UUID, uuid, "nvmlDeviceGetHandleByUUID", device));
}

API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    LOCKED(by_key_impl(KEY_SERIAL, serial, "nvmlDeviceGetHandleBySerial", device));
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *device)
{
    LOCKED(by_key_impl(KEY_BUS, bus, "nvmlDeviceGetHandleByPciBusId_v2", device));
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *device)
{
    LOCKED(by_key_impl(KEY_BUS, bus, "nvmlDeviceGetHandleByPciBusId", device));
}

/* ---- identity ------------------------------------------------------------ */

static const struct gi_profile *ref_profile(const struct dev_ref *r)
{
    return model_profile_by_id(r->gpu->m, r->gi->profile_id);
}

static nvmlReturn_t name_impl(nvmlDevice_t d, char *name, unsigned int len)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, "nvmlDeviceGetName", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.is_mig)
        return put_str(name, len, r.gpu->m->name);
    const struct gi_profile *p = ref_profile(&r);
    char buf[192];
    const char *short_name = p ? p->name + 4 : "unknown"; /* drop "MIG " */
    if (p && r.ci->size < p->compute_slices)
        snprintf(buf, sizeof(buf), "%s MIG %uc.%s", r.gpu->m->name, r.ci->size, short_name);
    else
        snprintf(buf, sizeof(buf), "%s MIG %s", r.gpu->m->name, short_name);
    return put_str(name, len, buf);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    LOCKED(name_impl(d, name, len));
}

static nvmlReturn_t uuid_impl(nvmlDevice_t d, char *uuid, unsigned int len)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, "nvmlDeviceGetUUID", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    return put_str(uuid, len, r.is_mig ? r.ci->uuid : r.gpu->uuid);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    LOCKED(uuid_impl(d, uuid, len));
}

static nvmlReturn_t serial_impl(nvmlDevice_t d, char *serial, unsigned int len)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetSerial", &r);
    return rc == NVML_SUCCESS ? put_str(serial, len, r.gpu->serial) : rc;
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int len)
{
    LOCKED(serial_impl(d, serial, len));
}

enum uint_attr { A_INDEX, A_MINOR, A_BRAND, A_ARCH };

static nvmlReturn_t uint_impl(nvmlDevice_t d, const char *fn, enum uint_attr a, unsigned *out)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, fn, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (a) {
    case A_INDEX: {
        int idx = rt_index_of_slot(r.slot);
        if (idx < 0)
            return NVML_ERROR_GPU_IS_LOST;
        *out = (unsigned)idx;
        break;
    }
    case A_MINOR: *out = r.gpu->minor; break;
    case A_BRAND: *out = r.gpu->m->brand; break;
    case A_ARCH: *out = r.gpu->m->arch; break;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
    LOCKED(uint_impl(d, "nvmlDeviceGetIndex", A_INDEX, index));
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    LOCKED(uint_impl(d, "nvmlDeviceGetMinorNumber", A_MINOR, minor));
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, unsigned int *brand)
{
    LOCKED(uint_impl(d, "nvmlDeviceGetBrand", A_BRAND, brand));
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    LOCKED(uint_impl(d, "nvmlDeviceGetArchitecture", A_ARCH, arch));
}

static nvmlReturn_t pci_impl(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetPciInfo_v3", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned v[4];
    if (!pci || !parse_bus(r.gpu->bus_id, v))
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->domain = v[0];
    pci->bus = v[1];
    pci->device = v[2];
    pci->pciDeviceId = r.gpu->m->pci_device_id;
    pci->pciSubSystemId = r.gpu->m->pci_subsystem_id;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", v[0], v[1], v[2], v[3]);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", v[0] & 0xffff,
             v[1] & 0xff, v[2] & 0xff, v[3] & 0xf);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    LOCKED(pci_impl(d, pci));
}

/* ---- memory, compute capability, attributes ----------------------------- */

static nvmlReturn_t total_memory(nvmlDevice_t d, const char *fn, unsigned long long *bytes)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, fn, &r);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct gi_profile *p = r.is_mig ? ref_profile(&r) : NULL;
    *bytes = (p ? p->memory_mib : r.gpu->m->memory_mib) << 20;
    return NVML_SUCCESS;
}

static nvmlReturn_t mem_v1_impl(nvmlDevice_t d, nvmlMemory_t *mem)
{
    unsigned long long total = 0;
    nvmlReturn_t rc = total_memory(d, "nvmlDeviceGetMemoryInfo", &total);
    if (rc == NVML_SUCCESS && !mem)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        mem->total = total;
        mem->used = 0;
        mem->free = total;
    }
    return rc;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem)
{
    LOCKED(mem_v1_impl(d, mem));
}

static nvmlReturn_t mem_v2_impl(nvmlDevice_t d, nvmlMemory_v2_t *mem)
{
    unsigned long long total = 0;
    nvmlReturn_t rc = total_memory(d, "nvmlDeviceGetMemoryInfo_v2", &total);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem->total = total;
    mem->reserved = 0;
    mem->used = 0;
    mem->free = total;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem)
{
    LOCKED(mem_v2_impl(d, mem));
}

static nvmlReturn_t cc_impl(nvmlDevice_t d, int *major, int *minor)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, "nvmlDeviceGetCudaComputeCapability", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = (int)r.gpu->m->cc_major;
    *minor = (int)r.gpu->m->cc_minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    LOCKED(cc_impl(d, major, minor));
}

static nvmlReturn_t attrs_impl(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_device(d, "nvmlDeviceGetAttributes_v2", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!r.is_mig)
        return NVML_ERROR_NOT_SUPPORTED; /* NVML: MIG device handles only */
    const struct gi_profile *p = ref_profile(&r);
    if (!a || !p)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(a, 0, sizeof(*a));
    a->multiprocessorCount = p->sms * r.ci->size / p->compute_slices;
    a->sharedCopyEngineCount = p->ce;
    a->sharedDecoderCount = p->dec;
    a->sharedEncoderCount = p->enc;
    a->sharedJpegCount = p->jpeg;
    a->sharedOfaCount = p->ofa;
    a->gpuInstanceSliceCount = p->compute_slices;
    a->computeInstanceSliceCount = r.ci->size;
    a->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    LOCKED(attrs_impl(d, a));
}

API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    LOCKED(attrs_impl(d, a));
}
