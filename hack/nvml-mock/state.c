/*
 * state.c - reading and writing the mock's JSON state file.
 *
 * Schema (version 1), shared with fabric/simhost which writes it:
 *   {"version": 1, "driver_version": "580.82.07", "nvml_version": "13.580.82.07",
 *    "cuda_driver_version": 13000,
 *    "gpus": [{"uuid", "model", "serial", "pci_bus_id", "minor",
 *              "mig_current", "mig_pending", "lost", "compute_mode" (0 when absent),
 *              "xid_queue": [79], "processes": [4242] (PIDs running on it),
 *              "process_utilization": [{"pid": 4242, "sm": 30, "mem": 5}]
 *                 (nvmlDeviceGetProcessUtilization: processes.c),
 *              "holders": [4243] (PIDs with an event set on it open: events.c),
 *              "recovery_action" (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0 when
 *              absent, -1: the field is not supported), "row_remap_pending",
 *              "row_remap_failure" (false when absent), "ecc_uncorrected"
 *              (volatile count, 0 when absent; recovery.c), "reset_failure"
 *              (a message: the host's nvidia-smi --gpu-reset fails with it),
 *              "utilization", "memory_utilization" (percent, 0 when absent),
 *              "util_busy", "util_since" (the level's integral: utilization.c),
 *              "gpu_instances": [{"id", "profile_id", "start", "size",
 *                 "utilization", "util_busy", "util_since",
 *                 "compute_instances": [{"id", "profile_id", "start", "size", "uuid"}]}]}],
 *    "failures": [{"function", "error" (name or code), "remaining" (-1 = always), "gpu"}]}
 * Writers replace the file atomically (write to a temporary, fsync, rename);
 * callers hold the lock file "<state>.lock" (see runtime.c).
 */
#include "json.h"
#include "nvml_mock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
    int code;
    const char *name;
} ERRORS[] = {
    {NVML_SUCCESS, "SUCCESS"},
    {NVML_ERROR_UNINITIALIZED, "UNINITIALIZED"},
    {NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT"},
    {NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED"},
    {NVML_ERROR_NO_PERMISSION, "NO_PERMISSION"},
    {NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED"},
    {NVML_ERROR_NOT_FOUND, "NOT_FOUND"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED"},
    {NVML_ERROR_TIMEOUT, "TIMEOUT"},
    {NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"},
    {NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED"},
    {NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM"},
    {NVML_ERROR_IN_USE, "IN_USE"},
    {NVML_ERROR_MEMORY, "MEMORY"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH"},
    {NVML_ERROR_INVALID_STATE, "INVALID_STATE"},
    {NVML_ERROR_UNKNOWN, "UNKNOWN"},
};

int error_from_name(const char *name)
{
    if (strncmp(name, "NVML_ERROR_", 11) == 0)
        name += 11;
    for (size_t i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (strcmp(ERRORS[i].name, name) == 0)
            return ERRORS[i].code;
    return NVML_ERROR_UNKNOWN;
}

const char *error_name(int code)
{
    for (size_t i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (ERRORS[i].code == code)
            return ERRORS[i].name;
    return "UNKNOWN";
}

static unsigned uint_of(const struct json *o, const char *k, unsigned d)
{
    return (unsigned)json_num(o, k, d);
}

static void load_util(const struct json *j, struct util_state *u)
{
    u->level = uint_of(j, "utilization", 0);
    u->busy = json_num(j, "util_busy", 0);
    u->since = json_num(j, "util_since", 0);
}

static void write_util(FILE *f, const struct util_state *u)
{
    fprintf(f, "\"utilization\": %u, \"util_busy\": %.0f, \"util_since\": %.0f", u->level,
            u->busy, u->since);
}

static void load_gi(const struct json *j, struct gi_state *gi)
{
    load_util(j, &gi->util);
    gi->id = uint_of(j, "id", 0);
    gi->profile_id = uint_of(j, "profile_id", 0);
    gi->start = uint_of(j, "start", 0);
    gi->size = uint_of(j, "size", 0);
    struct json *cis = json_get(j, "compute_instances");
    for (struct json *c = cis ? cis->child : NULL; c && gi->nci < MAX_CIS; c = c->next) {
        struct ci_state *ci = &gi->ci[gi->nci++];
        ci->id = uint_of(c, "id", 0);
        ci->profile_id = uint_of(c, "profile_id", 0);
        ci->start = uint_of(c, "start", 0);
        ci->size = uint_of(c, "size", 0);
        copy_str(ci->uuid, sizeof(ci->uuid), json_str(c, "uuid", ""));
    }
}

static int load_gpu(const struct json *j, struct gpu_state *g)
{
    copy_str(g->uuid, sizeof(g->uuid), json_str(j, "uuid", ""));
    copy_str(g->model, sizeof(g->model), json_str(j, "model", ""));
    copy_str(g->serial, sizeof(g->serial), json_str(j, "serial", ""));
    copy_str(g->bus_id, sizeof(g->bus_id), json_str(j, "pci_bus_id", ""));
    g->m = model_find(g->model);
    if (!g->m || !g->uuid[0]) {
        fprintf(stderr, "nvml-mock: GPU '%s' has unknown model '%s'\n", g->uuid, g->model);
        return -1;
    }
    g->minor = uint_of(j, "minor", 0);
    g->mig_current = (int)json_num(j, "mig_current", 0);
    g->mig_pending = (int)json_num(j, "mig_pending", g->mig_current);
    g->lost = json_bool(j, "lost", 0);
    g->compute_mode = uint_of(j, "compute_mode", 0);
    struct json *x = json_get(j, "xid_queue");
    for (struct json *e = x ? x->child : NULL; e && g->nxid < MAX_XIDS; e = e->next)
        g->xid[g->nxid++] = (unsigned long long)e->num;
    struct json *ps = json_get(j, "processes");
    for (struct json *e = ps ? ps->child : NULL; e && g->nproc < MAX_PROCS; e = e->next)
        g->pid[g->nproc++] = (unsigned int)e->num;
    struct json *pu = json_get(j, "process_utilization");
    for (struct json *e = pu ? pu->child : NULL; e && g->nputil < MAX_PROCS; e = e->next) {
        g->putil[g->nputil].pid = uint_of(e, "pid", 0);
        g->putil[g->nputil].sm = uint_of(e, "sm", 0);
        g->putil[g->nputil++].mem = uint_of(e, "mem", 0);
    }
    struct json *hs = json_get(j, "holders");
    for (struct json *e = hs ? hs->child : NULL; e && g->nholder < MAX_PROCS; e = e->next)
        g->holder[g->nholder++] = (unsigned int)e->num;
    g->recovery_action = (int)json_num(j, "recovery_action", 0);
    g->remap_pending = json_bool(j, "row_remap_pending", 0);
    g->remap_failure = json_bool(j, "row_remap_failure", 0);
    g->ecc_uncorrected = (unsigned long long)json_num(j, "ecc_uncorrected", 0);
    copy_str(g->reset_failure, sizeof(g->reset_failure), json_str(j, "reset_failure", ""));
    load_util(j, &g->util);
    g->mem_util = uint_of(j, "memory_utilization", 0);
    struct json *gis = json_get(j, "gpu_instances");
    for (struct json *e = gis ? gis->child : NULL; e && g->ngi < MAX_GIS; e = e->next)
        load_gi(e, &g->gi[g->ngi++]);
    return 0;
}

static void load_failure(const struct json *j, struct failure *f)
{
    copy_str(f->function, sizeof(f->function), json_str(j, "function", ""));
    copy_str(f->gpu, sizeof(f->gpu), json_str(j, "gpu", ""));
    struct json *e = json_get(j, "error");
    if (e && e->type == J_STR)
        f->error = error_from_name(e->str);
    else
        f->error = e ? (int)e->num : NVML_ERROR_UNKNOWN;
    f->remaining = (int)json_num(j, "remaining", 1);
}

int state_load(const char *path, struct state *out)
{
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "nvml-mock: cannot open state %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    size_t got = text ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!text)
        return NVML_ERROR_MEMORY;
    text[got] = '\0';
    char err[128];
    struct json *root = json_parse(text, err, sizeof(err));
    free(text);
    if (!root || root->type != J_OBJ) {
        fprintf(stderr, "nvml-mock: bad state %s: %s\n", path, err);
        json_free(root);
        return NVML_ERROR_UNKNOWN;
    }
    copy_str(out->driver_version, sizeof(out->driver_version),
             json_str(root, "driver_version", "580.82.07"));
    copy_str(out->nvml_version, sizeof(out->nvml_version),
             json_str(root, "nvml_version", "13.580.82.07"));
    out->cuda_version = (int)json_num(root, "cuda_driver_version", 13000);
    int rc = NVML_SUCCESS;
    struct json *gpus = json_get(root, "gpus");
    for (struct json *g = gpus ? gpus->child : NULL; g && out->ngpu < MAX_GPUS; g = g->next)
        if (load_gpu(g, &out->gpu[out->ngpu++]) != 0)
            rc = NVML_ERROR_UNKNOWN;
    struct json *fails = json_get(root, "failures");
    for (struct json *e = fails ? fails->child : NULL; e && out->nfail < MAX_FAILURES;
         e = e->next)
        load_failure(e, &out->fail[out->nfail++]);
    json_free(root);
    return rc;
}

static void write_ci(FILE *f, const struct ci_state *ci, int last)
{
    fprintf(f, "{\"id\": %u, \"profile_id\": %u, \"start\": %u, \"size\": %u, \"uuid\": ",
            ci->id, ci->profile_id, ci->start, ci->size);
    json_write_str(f, ci->uuid);
    fputs(last ? "}" : "}, ", f);
}

static void write_gpu(FILE *f, const struct gpu_state *g, int last)
{
    fputs("    {\"uuid\": ", f);
    json_write_str(f, g->uuid);
    fputs(", \"model\": ", f);
    json_write_str(f, g->model);
    fputs(", \"serial\": ", f);
    json_write_str(f, g->serial);
    fputs(", \"pci_bus_id\": ", f);
    json_write_str(f, g->bus_id);
    fprintf(f, ", \"minor\": %u, \"mig_current\": %d, \"mig_pending\": %d, \"lost\": %s,",
            g->minor, g->mig_current, g->mig_pending, g->lost ? "true" : "false");
    fprintf(f, " \"compute_mode\": %u,", g->compute_mode);
    fputs("\n     \"xid_queue\": [", f);
    for (int i = 0; i < g->nxid; i++)
        fprintf(f, "%s%llu", i ? ", " : "", g->xid[i]);
    fputs("], \"processes\": [", f);
    for (int i = 0; i < g->nproc; i++)
        fprintf(f, "%s%u", i ? ", " : "", g->pid[i]);
    fputs("], \"process_utilization\": [", f);
    for (int i = 0; i < g->nputil; i++)
        fprintf(f, "%s{\"pid\": %u, \"sm\": %u, \"mem\": %u}", i ? ", " : "",
                g->putil[i].pid, g->putil[i].sm, g->putil[i].mem);
    fputs("], \"holders\": [", f);
    for (int i = 0; i < g->nholder; i++)
        fprintf(f, "%s%u", i ? ", " : "", g->holder[i]);
    fprintf(f, "],\n     \"recovery_action\": %d, \"row_remap_pending\": %s, "
               "\"row_remap_failure\": %s, \"ecc_uncorrected\": %llu,",
            g->recovery_action, g->remap_pending ? "true" : "false",
            g->remap_failure ? "true" : "false", g->ecc_uncorrected);
    if (g->reset_failure[0]) {
        fputs(" \"reset_failure\": ", f);
        json_write_str(f, g->reset_failure);
        fputs(",", f);
    }
    fputs("\n     ", f);
    write_util(f, &g->util);
    fprintf(f, ", \"memory_utilization\": %u,", g->mem_util);
    fputs("\n     \"gpu_instances\": [", f);
    for (int i = 0; i < g->ngi; i++) {
        const struct gi_state *gi = &g->gi[i];
        fprintf(f, "\n       {\"id\": %u, \"profile_id\": %u, \"start\": %u, \"size\": %u, ",
                gi->id, gi->profile_id, gi->start, gi->size);
        write_util(f, &gi->util);
        fputs(", \"compute_instances\": [", f);
        for (int c = 0; c < gi->nci; c++)
            write_ci(f, &gi->ci[c], c == gi->nci - 1);
        fputs(i == g->ngi - 1 ? "]}" : "]},", f);
    }
    fputs(last ? "]}\n" : "]},\n", f);
}

int state_save(const char *path, const struct state *st)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return NVML_ERROR_OPERATING_SYSTEM;
    fputs("{\"version\": 1, \"driver_version\": ", f);
    json_write_str(f, st->driver_version);
    fputs(", \"nvml_version\": ", f);
    json_write_str(f, st->nvml_version);
    fprintf(f, ", \"cuda_driver_version\": %d,\n  \"gpus\": [\n", st->cuda_version);
    for (int i = 0; i < st->ngpu; i++)
        write_gpu(f, &st->gpu[i], i == st->ngpu - 1);
    fputs("  ],\n  \"failures\": [", f);
    for (int i = 0; i < st->nfail; i++) {
        const struct failure *fl = &st->fail[i];
        fputs(i ? ",\n    {\"function\": " : "\n    {\"function\": ", f);
        json_write_str(f, fl->function);
        fputs(", \"error\": ", f);
        if (fl->error == NVML_ERROR_UNKNOWN || strcmp(error_name(fl->error), "UNKNOWN") != 0)
            json_write_str(f, error_name(fl->error));
        else
            fprintf(f, "%d", fl->error);
        fprintf(f, ", \"remaining\": %d", fl->remaining);
        if (fl->gpu[0]) {
            fputs(", \"gpu\": ", f);
            json_write_str(f, fl->gpu);
        }
        fputs("}", f);
    }
    fputs("]}\n", f);
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return NVML_ERROR_OPERATING_SYSTEM;
    }
    return NVML_SUCCESS;
}

struct gpu_state *state_gpu(struct state *st, const char *uuid)
{
    for (int i = 0; i < st->ngpu; i++)
        if (strcmp(st->gpu[i].uuid, uuid) == 0)
            return &st->gpu[i];
    return NULL;
}
