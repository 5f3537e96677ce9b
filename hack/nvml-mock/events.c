/*
 * events.c - event sets for health monitoring.
 *
 * XIDs queued in a GPU's "xid_queue" in the state file are delivered, in
 * order, to the first event set that waits on that GPU with the XID event
 * type registered; delivery removes them from the file (under the lock), so
 * an event is seen once. A registered GPU that is lost or removed makes the
 * wait return GPU_IS_LOST, as NVML does. A wait sleeps until the state
 * file's directory changes (inotify; every 20 ms where inotify is not
 * available), without holding the API mutex: like NVML's, an idle wait costs
 * no CPU (polling cost an idle plugin's XID thread 50 wake-ups a second).
 *
 * Holders: a real GPU reset (nvidia-smi --gpu-reset) is refused while any
 * process has the GPU open, a monitoring one with an event set included.
 * Registering a GPU in an event set records this process's PID in the GPU's
 * "holders" in the state file; freeing the last set that has it (or
 * nvmlShutdown down to zero) removes it. The simulated host's nvidia-smi
 * refuses a reset while a live holder is listed.
 */
#include "nvml_mock.h"

#include <libgen.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 64
#define SUPPORTED_EVENTS \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError)

struct event_set {
    int used, n;
    int slots[MAX_GPUS];
    unsigned long long masks[MAX_GPUS];
};

static struct event_set g_sets[MAX_SETS];

static nvmlReturn_t set_holder(struct state *st, struct gpu_state *unused, void *arg)
{
    const struct {
        const char *uuid;
        int hold;
    } *a = arg;
    (void)unused;
    struct gpu_state *g = state_gpu(st, a->uuid);
    if (!g)
        return NVML_ERROR_NOT_FOUND;
    unsigned pid = (unsigned)getpid();
    for (int i = 0; i < g->nholder; i++)
        if (g->holder[i] == pid) {
            if (a->hold)
                return NVML_ERROR_NOT_FOUND; /* already listed: nothing to write */
            g->holder[i] = g->holder[--g->nholder];
            return NVML_SUCCESS;
        }
    if (!a->hold || g->nholder == MAX_PROCS)
        return NVML_ERROR_NOT_FOUND;
    g->holder[g->nholder++] = pid;
    return NVML_SUCCESS;
}

/* Record or drop this process as a holder of the GPU in `slot`. */
static void hold(int slot, int on)
{
    struct {
        const char *uuid;
        int hold;
    } a = {rt_slot_uuid(slot), on};
    (void)rt_mutate(-1, set_holder, &a);
}

/* Whether another used set than `except` still registers `slot`. */
static int held_elsewhere(const struct event_set *except, int slot)
{
    for (int i = 0; i < MAX_SETS; i++) {
        const struct event_set *s = &g_sets[i];
        if (!s->used || s == except)
            continue;
        for (int k = 0; k < s->n; k++)
            if (s->slots[k] == slot)
                return 1;
    }
    return 0;
}

static void release(struct event_set *s)
{
    s->used = 0;
    for (int k = 0; k < s->n; k++)
        if (!held_elsewhere(s, s->slots[k]))
            hold(s->slots[k], 0);
    s->n = 0;
}

void events_release_all(void)
{
    for (int i = 0; i < MAX_SETS; i++)
        if (g_sets[i].used)
            release(&g_sets[i]);
}

static struct event_set *set_of(nvmlEventSet_t h)
{
    const char *p = (const char *)h, *base = (const char *)g_sets;
    if (!p || p < base || p >= base + sizeof(g_sets) ||
        (size_t)(p - base) % sizeof(struct event_set) != 0)
        return NULL;
    struct event_set *s = (struct event_set *)(void *)h;
    return s->used ? s : NULL;
}

static nvmlReturn_t create_impl(nvmlEventSet_t *out)
{
    nvmlReturn_t rc = rt_enter("nvmlEventSetCreate", NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_SETS; i++)
        if (!g_sets[i].used) {
            memset(&g_sets[i], 0, sizeof(g_sets[i]));
            g_sets[i].used = 1;
            *out = (nvmlEventSet_t)(void *)&g_sets[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_MEMORY;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(create_impl(set)); }

static nvmlReturn_t free_impl(nvmlEventSet_t h)
{
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    struct event_set *s = set_of(h);
    if (!s)
        return NVML_ERROR_INVALID_ARGUMENT;
    release(s);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(free_impl(set)); }

static nvmlReturn_t supported_impl(nvmlDevice_t d, unsigned long long *types)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceGetSupportedEventTypes", &r);
    if (rc == NVML_SUCCESS && !types)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *types = SUPPORTED_EVENTS;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    LOCKED(supported_impl(d, types));
}

static nvmlReturn_t register_impl(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t h)
{
    struct dev_ref r;
    nvmlReturn_t rc = rt_gpu(d, "nvmlDeviceRegisterEvents", &r);
    if (rc != NVML_SUCCESS)
        return rc;
    struct event_set *s = set_of(h);
    if (!s)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < s->n; i++)
        if (s->slots[i] == r.slot) {
            s->masks[i] |= types;
            return NVML_SUCCESS;
        }
    if (s->n == MAX_GPUS)
        return NVML_ERROR_MEMORY;
    s->slots[s->n] = r.slot;
    s->masks[s->n++] = types;
    hold(r.slot, 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                          nvmlEventSet_t set)
{
    LOCKED(register_impl(d, types, set));
}

static nvmlReturn_t pop_xid(struct state *st, struct gpu_state *g, void *arg)
{
    (void)st;
    if (g->nxid == 0)
        return NVML_ERROR_NOT_FOUND;
    *(unsigned long long *)arg = g->xid[0];
    memmove(&g->xid[0], &g->xid[1], sizeof(g->xid[0]) * (size_t)(g->nxid - 1));
    g->nxid--;
    return NVML_SUCCESS;
}

/* One poll: NVML_SUCCESS with *data filled, NVML_ERROR_TIMEOUT if nothing. */
static nvmlReturn_t poll_once(nvmlEventSet_t h, nvmlEventData_t *data)
{
    nvmlReturn_t rc = rt_enter("nvmlEventSetWait_v2", NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    struct event_set *s = set_of(h);
    if (!s || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    int lost = 0;
    for (int i = 0; i < s->n; i++) {
        struct gpu_state *g = state_gpu(&g_state, rt_slot_uuid(s->slots[i]));
        if (!g || g->lost) {
            lost = 1;
            continue;
        }
        if (!(s->masks[i] & nvmlEventTypeXidCriticalError) || g->nxid == 0)
            continue;
        unsigned long long xid = 0;
        if (rt_mutate(s->slots[i], pop_xid, &xid) != NVML_SUCCESS)
            continue;
        *data = (nvmlEventData_t){rt_gpu_handle(s->slots[i]), nvmlEventTypeXidCriticalError,
                                  xid, 0xFFFFFFFFu, 0xFFFFFFFFu};
        return NVML_SUCCESS;
    }
    return lost ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_TIMEOUT;
}

/* An inotify descriptor on the state file's directory; -1 without one. */
static int watch_state(void)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", rt_state_path());
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0)
        return -1;
    if (inotify_add_watch(fd, dirname(dir), IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) <
        0) {
        close(fd);
        return -1;
    }
    return fd;
}

static nvmlReturn_t wait_impl(nvmlEventSet_t h, nvmlEventData_t *data, unsigned timeout_ms)
{
    struct timespec start, now, nap = {0, 20 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    int fd = watch_state(); /* before the first look: no change after it is missed */
    nvmlReturn_t rc;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        rc = poll_once(h, data);
        pthread_mutex_unlock(&g_mu);
        if (rc != NVML_ERROR_TIMEOUT)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed >= (long)timeout_ms)
            break;
        if (fd < 0) {
            nanosleep(&nap, NULL);
            continue;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)((long)timeout_ms - elapsed)) > 0) {
            char buf[4096];
            while (read(fd, buf, sizeof(buf)) > 0) {
            }
        }
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeout_ms)
{
    return wait_impl(set, data, timeout_ms);
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data,
                                  unsigned int timeout_ms)
{
    nvmlEventData_t full;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = wait_impl(set, &full, timeout_ms);
    if (rc == NVML_SUCCESS)
        *data = (nvmlEventData_v1_t){full.device, full.eventType, full.eventData};
    return rc;
}
