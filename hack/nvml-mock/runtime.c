/*
 * runtime.c - library lifecycle, handles, and the shared state discipline.
 *
 * - nvmlInit* (re)reads the state file named by PATCHBAY_NVML_STATE and
 *   fixes the device set (index order = PCI bus id order) until the next
 *   init; GPUs added later appear only after a fresh init.
 * - Every call re-reads the file when it changed on disk (mtime/inode/size),
 *   so MIG changes and "lost" marks from other processes show up live; a GPU
 *   that vanished from the file reports GPU_IS_LOST on its old handles.
 * - Mutations re-read the file under an exclusive flock on "<state>.lock",
 *   apply the change, and replace the file atomically (state.c).
 * - Handles are addresses inside static token tables: a GPU handle names a
 *   slot (bound to a UUID for the life of the process), a GI/CI/MIG handle
 *   names (slot, GI id[, CI id]); they are resolved against the current
 *   state on every call, so stale handles fail cleanly.
 * - One mutex serialises API calls; event waits sleep without it.
 */
#include "nvml_mock.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SLOTS 64

struct state g_state;
static struct state g_fresh;
int g_init_count;
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static char g_path[4096];
static struct stat g_stamp;
static char g_slot_uuid[MAX_SLOTS][UUID_LEN];
static int g_nslots;
static int g_index_slot[MAX_GPUS];
static int g_ndev;

static char g_gpu_tok[MAX_SLOTS];
static char g_gi_tok[MAX_SLOTS][MAX_GI_ID];
static char g_ci_tok[MAX_SLOTS][MAX_GI_ID][MAX_CI_ID];
static char g_mig_tok[MAX_SLOTS][MAX_GI_ID][MAX_CI_ID];

void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

nvmlReturn_t put_str(char *dst, unsigned int cap, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static int lock_file(int how)
{
    char lock[4200];
    snprintf(lock, sizeof(lock), "%s.lock", g_path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        fd = open(lock, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, how) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void unlock_file(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

static int stamp_changed(void)
{
    struct stat now;
    if (stat(g_path, &now) != 0)
        return 0;
    return now.st_ino != g_stamp.st_ino || now.st_size != g_stamp.st_size ||
           now.st_mtim.tv_sec != g_stamp.st_mtim.tv_sec ||
           now.st_mtim.tv_nsec != g_stamp.st_mtim.tv_nsec;
}

/* Load g_path into g_state (caller holds a lock). */
static nvmlReturn_t load_locked(void)
{
    nvmlReturn_t rc = state_load(g_path, &g_fresh);
    if (rc == NVML_SUCCESS) {
        g_state = g_fresh;
        stat(g_path, &g_stamp);
    }
    return rc;
}

static void refresh(void)
{
    if (!stamp_changed())
        return;
    int fd = lock_file(LOCK_SH);
    if (load_locked() != NVML_SUCCESS)
        fprintf(stderr, "nvml-mock: keeping previous state\n");
    unlock_file(fd);
}

static int slot_for(const char *uuid)
{
    for (int i = 0; i < g_nslots; i++)
        if (strcmp(g_slot_uuid[i], uuid) == 0)
            return i;
    if (g_nslots == MAX_SLOTS)
        return -1;
    copy_str(g_slot_uuid[g_nslots], UUID_LEN, uuid);
    return g_nslots++;
}

static int by_bus_id(const void *a, const void *b)
{
    const struct gpu_state *x = &g_state.gpu[*(const int *)a];
    const struct gpu_state *y = &g_state.gpu[*(const int *)b];
    return strcasecmp(x->bus_id, y->bus_id);
}

static nvmlReturn_t init_impl(void)
{
    const char *path = getenv("PATCHBAY_NVML_STATE");
    if (!path || !*path) {
        fprintf(stderr, "nvml-mock: PATCHBAY_NVML_STATE is not set\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    copy_str(g_path, sizeof(g_path), path);
    int fd = lock_file(LOCK_SH);
    nvmlReturn_t rc = load_locked();
    unlock_file(fd);
    if (rc == NVML_SUCCESS)
        rc = failure_check("nvmlInitWithFlags", NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    int order[MAX_GPUS];
    for (int i = 0; i < g_state.ngpu; i++)
        order[i] = i;
    qsort(order, (size_t)g_state.ngpu, sizeof(int), by_bus_id);
    g_ndev = 0;
    for (int i = 0; i < g_state.ngpu; i++) {
        int slot = slot_for(g_state.gpu[order[i]].uuid);
        if (slot < 0)
            return NVML_ERROR_MEMORY;
        g_index_slot[g_ndev++] = slot;
    }
    g_init_count++;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    LOCKED(init_impl());
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

static nvmlReturn_t shutdown_impl(void)
{
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--g_init_count == 0)
        events_release_all(); /* NVML closes the process's event sets with it */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlShutdown(void) { LOCKED(shutdown_impl()); }

const char *rt_state_path(void) { return g_path; }

nvmlReturn_t rt_enter(const char *fn, const char *uuid)
{
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    refresh();
    return failure_check(fn, uuid);
}

int rt_device_count(void) { return g_ndev; }
int rt_slot_of_index(int index) { return index >= 0 && index < g_ndev ? g_index_slot[index] : -1; }
const char *rt_slot_uuid(int slot) { return g_slot_uuid[slot]; }

int rt_index_of_slot(int slot)
{
    for (int i = 0; i < g_ndev; i++)
        if (g_index_slot[i] == slot)
            return i;
    return -1;
}

nvmlDevice_t rt_gpu_handle(int slot) { return (nvmlDevice_t)(void *)&g_gpu_tok[slot]; }
nvmlGpuInstance_t rt_gi_handle(int slot, unsigned gi)
{
    return (nvmlGpuInstance_t)(void *)&g_gi_tok[slot][gi];
}
nvmlComputeInstance_t rt_ci_handle(int slot, unsigned gi, unsigned ci)
{
    return (nvmlComputeInstance_t)(void *)&g_ci_tok[slot][gi][ci];
}
nvmlDevice_t rt_mig_handle(int slot, unsigned gi, unsigned ci)
{
    return (nvmlDevice_t)(void *)&g_mig_tok[slot][gi][ci];
}

/* Offset of p inside table, or -1. */
static long offset_in(const void *p, const void *table, size_t size)
{
    const char *c = p, *t = table;
    if (!p || c < t || c >= t + size)
        return -1;
    return (long)(c - t);
}

static nvmlReturn_t resolve(int slot, long gi, long ci, const char *fn, struct dev_ref *out)
{
    memset(out, 0, sizeof(*out));
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (slot >= g_nslots)
        return NVML_ERROR_INVALID_ARGUMENT;
    refresh();
    out->slot = slot;
    nvmlReturn_t rc = failure_check(fn, g_slot_uuid[slot]);
    if (rc != NVML_SUCCESS)
        return rc;
    out->gpu = state_gpu(&g_state, g_slot_uuid[slot]);
    if (!out->gpu || out->gpu->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (gi >= 0) {
        out->gi = gpu_find_gi(out->gpu, (unsigned)gi);
        if (!out->gi)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (ci >= 0) {
        out->ci = gi_find_ci(out->gi, (unsigned)ci);
        if (!out->ci)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t rt_device(nvmlDevice_t h, const char *fn, struct dev_ref *out)
{
    long off = offset_in(h, g_gpu_tok, sizeof(g_gpu_tok));
    if (off >= 0)
        return resolve((int)off, -1, -1, fn, out);
    off = offset_in(h, g_mig_tok, sizeof(g_mig_tok));
    if (off < 0) {
        memset(out, 0, sizeof(*out));
        return g_init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    }
    nvmlReturn_t rc = resolve((int)(off / (MAX_GI_ID * MAX_CI_ID)),
                              (off / MAX_CI_ID) % MAX_GI_ID, off % MAX_CI_ID, fn, out);
    out->is_mig = 1;
    return rc;
}

nvmlReturn_t rt_gpu(nvmlDevice_t h, const char *fn, struct dev_ref *out)
{
    nvmlReturn_t rc = rt_device(h, fn, out);
    if (rc == NVML_SUCCESS && out->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

nvmlReturn_t rt_gi(nvmlGpuInstance_t h, const char *fn, struct dev_ref *out)
{
    long off = offset_in(h, g_gi_tok, sizeof(g_gi_tok));
    if (off < 0) {
        memset(out, 0, sizeof(*out));
        return g_init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    }
    return resolve((int)(off / MAX_GI_ID), off % MAX_GI_ID, -1, fn, out);
}

nvmlReturn_t rt_ci(nvmlComputeInstance_t h, const char *fn, struct dev_ref *out)
{
    long off = offset_in(h, g_ci_tok, sizeof(g_ci_tok));
    if (off < 0) {
        memset(out, 0, sizeof(*out));
        return g_init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    }
    return resolve((int)(off / (MAX_GI_ID * MAX_CI_ID)), (off / MAX_CI_ID) % MAX_GI_ID,
                   off % MAX_CI_ID, fn, out);
}

nvmlReturn_t rt_mutate(int slot, rt_mutation op, void *arg)
{
    int fd = lock_file(LOCK_EX);
    if (fd < 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    nvmlReturn_t rc = state_load(g_path, &g_fresh);
    if (rc == NVML_SUCCESS) {
        struct gpu_state *g = slot >= 0 ? state_gpu(&g_fresh, g_slot_uuid[slot]) : NULL;
        if (slot >= 0 && (!g || g->lost))
            rc = NVML_ERROR_GPU_IS_LOST;
        else
            rc = op(&g_fresh, g, arg);
        if (rc == NVML_SUCCESS)
            rc = state_save(g_path, &g_fresh);
        if (rc == NVML_SUCCESS) {
            g_state = g_fresh;
            stat(g_path, &g_stamp);
        }
    }
    unlock_file(fd);
    return rc;
}
