/*
 * nvml_mock.h - shared types of patchbay's NVML mock.
 *
 * The mock is a stand-in for libnvidia-ml.so.1 that pynvml loads through
 * ctypes. The ABI (struct layouts, constants, signatures) follows pynvml's
 * ctypes definitions and the NVML reference; the behaviour follows the NVML
 * documentation. State lives in a JSON file named by PATCHBAY_NVML_STATE so
 * that several processes see the same simulated GPUs.
 */
#ifndef PATCHBAY_NVML_MOCK_H
#define PATCHBAY_NVML_MOCK_H

#include <pthread.h>
#include <stddef.h>

#define API __attribute__((visibility("default")))

/* ---- NVML ABI ---------------------------------------------------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

#define NVML_BRAND_NVIDIA 14
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_DEVICE_ARCH_ADA 8
#define NVML_DEVICE_ARCH_HOPPER 9

#define NVML_GPU_INSTANCE_PROFILE_COUNT 0x12
#define NVML_COMPUTE_INSTANCE_PROFILE_COUNT 0x9
#define NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED 0

#define nvmlMemory_v2 0x02000028u
#define nvmlGpuInstanceProfileInfo_v2 0x02000098u
#define nvmlGpuInstanceProfileInfo_v3 0x03000098u
#define nvmlComputeInstanceProfileInfo_v2 0x02000088u
#define nvmlComputeInstanceProfileInfo_v3 0x03000088u

#define nvmlEventTypeSingleBitEccError 0x1ULL
#define nvmlEventTypeDoubleBitEccError 0x2ULL
#define nvmlEventTypeXidCriticalError 0x8ULL

/* Opaque handles: addresses inside the handle tables of runtime.c. */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount,
        multiprocessorCount, copyEngineCount, decoderCount, encoderCount, jpegCount,
        ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount,
        sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
        sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
} nvmlEventData_v1_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* ---- model profiles (models.c) ---------------------------------------- */

#define MIG_MEMORY_SLOTS 8
#define MIG_COMPUTE_SLICES 7
#define GI_PROFILE_KINDS 7

struct gi_profile {
    unsigned int enum_value; /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;         /* NVML GI profile id */
    unsigned int compute_slices, memory_slots, max_count;
    unsigned int starts[8], nstarts;
    const char *name;
    unsigned long long memory_mib;
    unsigned int sms, ce, dec, enc, jpeg, ofa;
};

struct model {
    const char *key;  /* as written in the state file */
    const char *name; /* nvmlDeviceGetName */
    unsigned int arch, cc_major, cc_minor, brand;
    unsigned long long memory_mib;
    unsigned int pci_device_id, pci_subsystem_id, sms;
    int mig_capable;
    int mig_needs_reset; /* Ampere: a mode change stays pending until reset */
    struct gi_profile profiles[GI_PROFILE_KINDS];
};

const struct model *model_find(const char *key);
const struct gi_profile *model_profile_by_enum(const struct model *m, unsigned int e);
const struct gi_profile *model_profile_by_id(const struct model *m, unsigned int id);

/* ---- state (state.c) --------------------------------------------------- */

#define MAX_GPUS 32
#define MAX_GI_ID 16 /* GI ids 1..15 */
#define MAX_CI_ID 8  /* CI ids 0..7 */
#define MAX_GIS 8
#define MAX_CIS 8
#define MAX_XIDS 32
#define MAX_PROCS 32
#define MAX_FAILURES 32
#define UUID_LEN 96

/* A utilization level as tests set it (utilization.c): the level holds until
 * changed; busy integrates level over time (percent x ms, CLOCK_MONOTONIC)
 * up to since, so GPM metrics between two samples are the mean over them. */
struct util_state {
    unsigned level;     /* percent */
    double busy, since; /* percent x ms up to since; since in ms */
};

struct ci_state {
    unsigned int id, profile_id, start, size;
    char uuid[UUID_LEN];
};

struct gi_state {
    unsigned int id, profile_id, start, size;
    int nci;
    struct ci_state ci[MAX_CIS];
    struct util_state util; /* the GI's SM utilization (GPM, utilization.c) */
};

struct gpu_state {
    char uuid[UUID_LEN], model[32], serial[32], bus_id[32];
    unsigned int minor, compute_mode; /* nvmlComputeMode_t (compute_mode.c) */
    int mig_current, mig_pending, lost;
    int nxid;
    unsigned long long xid[MAX_XIDS];
    int nproc; /* processes running on the GPU (processes.c) */
    unsigned int pid[MAX_PROCS];
    int nputil; /* per-process utilization samples (processes.c) */
    struct { unsigned int pid, sm, mem; } putil[MAX_PROCS];
    int nholder; /* processes with an event set on the GPU open (events.c) */
    unsigned int holder[MAX_PROCS];
    int recovery_action; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; -1: unsupported */
    int remap_pending, remap_failure; /* nvmlDeviceGetRemappedRows (recovery.c) */
    unsigned long long ecc_uncorrected; /* volatile uncorrected ECC count */
    char reset_failure[128]; /* kept for the host's nvidia-smi: its reset fails so */
    struct util_state util;  /* GPU utilization (utilization.c) */
    unsigned mem_util;       /* memory utilization, percent */
    int ngi;
    struct gi_state gi[MAX_GIS];
    const struct model *m;
};

struct failure {
    char function[64], gpu[UUID_LEN];
    int error, remaining; /* remaining < 0: always */
};

struct state {
    char driver_version[32], nvml_version[32];
    int cuda_version;
    int ngpu;
    struct gpu_state gpu[MAX_GPUS];
    int nfail;
    struct failure fail[MAX_FAILURES];
};

int state_load(const char *path, struct state *out); /* 0 or NVML error */
int state_save(const char *path, const struct state *st);
struct gpu_state *state_gpu(struct state *st, const char *uuid);
int error_from_name(const char *name);
const char *error_name(int code);

/* ---- runtime (runtime.c) ------------------------------------------------ */

extern struct state g_state;
extern int g_init_count;
extern pthread_mutex_t g_mu;

/* Body of an exported entry point: run impl under the API mutex. */
#define LOCKED(expr)                                                                  \
    do {                                                                              \
        pthread_mutex_lock(&g_mu);                                                    \
        nvmlReturn_t rc_ = (expr);                                                    \
        pthread_mutex_unlock(&g_mu);                                                  \
        return rc_;                                                                   \
    } while (0)

/* Resolved handles. */
struct dev_ref {
    int slot;
    struct gpu_state *gpu;
    int is_mig;
    struct gi_state *gi;
    struct ci_state *ci;
};

nvmlReturn_t rt_enter(const char *fn, const char *uuid);
const char *rt_state_path(void); /* the state file (PATCHBAY_NVML_STATE) */
nvmlReturn_t rt_device(nvmlDevice_t h, const char *fn, struct dev_ref *out);
nvmlReturn_t rt_gpu(nvmlDevice_t h, const char *fn, struct dev_ref *out); /* no MIG */
nvmlReturn_t rt_gi(nvmlGpuInstance_t h, const char *fn, struct dev_ref *out);
nvmlReturn_t rt_ci(nvmlComputeInstance_t h, const char *fn, struct dev_ref *out);
nvmlDevice_t rt_gpu_handle(int slot);
nvmlDevice_t rt_mig_handle(int slot, unsigned gi_id, unsigned ci_id);
nvmlGpuInstance_t rt_gi_handle(int slot, unsigned gi_id);
nvmlComputeInstance_t rt_ci_handle(int slot, unsigned gi_id, unsigned ci_id);
int rt_device_count(void);
int rt_slot_of_index(int index);
int rt_index_of_slot(int slot);
const char *rt_slot_uuid(int slot);

/* Run op(gpu, arg) on a freshly read state under the exclusive lock, then
 * persist it. The op gets the GPU of `slot` (NULL when slot < 0); a lost or
 * removed GPU fails with GPU_IS_LOST before the op runs. Ops validate first
 * and modify only on success. */
typedef nvmlReturn_t (*rt_mutation)(struct state *st, struct gpu_state *gpu, void *arg);
nvmlReturn_t rt_mutate(int slot, rt_mutation op, void *arg);

void copy_str(char *dst, size_t cap, const char *src);
nvmlReturn_t put_str(char *dst, unsigned int cap, const char *src);

/* ---- event-set holders (events.c) ------------------------------------- */

void events_release_all(void); /* nvmlShutdown to zero: this process's sets go */

/* ---- failure injection (failure.c) ------------------------------------- */

nvmlReturn_t failure_check(const char *fn, const char *uuid);

/* ---- MIG helpers (mig_gi.c) -------------------------------------------- */

struct gi_state *gpu_find_gi(struct gpu_state *g, unsigned int id);
struct ci_state *gi_find_ci(struct gi_state *gi, unsigned int id);
nvmlReturn_t gi_fit(const struct gpu_state *g, const struct gi_profile *p, unsigned start);
nvmlReturn_t mig_gpu(nvmlDevice_t d, const char *fn, int need_enabled, struct dev_ref *r);
void mig_make_uuid(char *out, const char *gpu_uuid, unsigned gi, unsigned ci);

#endif
