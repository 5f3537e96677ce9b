/*
 * models.c - the GPU models the mock can simulate, with their facts.
 *
 * Placements are identical across A100, H100 and H200 (8 memory slots, 7
 * compute slices); names, memory and SM counts differ per model. Figures are
 * MiB as NVML reports them (see ARCHITECTURE.md section 6). The H200's MIG
 * memory, SM and engine figures are what a real H200 reported (driver
 * 580.159.04, hack/gpu_probe.py; README.md, "Checked against a real GPU"): 16384 MiB
 * for 1g.18gb, not the 18432 that section 6 gives. The L40S exists
 * so that MIG calls on a GPU without MIG can be exercised.
 */
#include "nvml_mock.h"

#include <string.h>

/* enum, id, compute slices, memory slots, max, starts, nstarts */
#define P_1G 0, 19, 1, 1, 7, {0, 1, 2, 3, 4, 5, 6}, 7
#define P_1G_ME 7, 20, 1, 1, 1, {0, 1, 2, 3, 4, 5, 6}, 7
#define P_1G_2X 9, 15, 1, 2, 4, {0, 2, 4, 6}, 4
#define P_2G 1, 14, 2, 2, 3, {0, 2, 4}, 3
#define P_3G 2, 9, 3, 4, 2, {0, 4}, 2
#define P_4G 3, 5, 4, 4, 1, {0}, 1
#define P_7G 4, 0, 7, 8, 1, {0}, 1

/* name, memory MiB, SMs, CE, DEC, ENC, JPEG, OFA */
#define AMPERE(n1, n1me, n1x2, n2, n3, n4, n7, m1, m2, m3, m7)                        \
    {                                                                                  \
        {P_1G, n1, m1, 14, 1, 0, 0, 0, 0}, {P_1G_ME, n1me, m1, 14, 1, 1, 0, 1, 1},     \
            {P_1G_2X, n1x2, m2, 14, 1, 1, 0, 0, 0}, {P_2G, n2, m2, 28, 2, 1, 0, 0, 0}, \
            {P_3G, n3, m3, 42, 3, 2, 0, 0, 0}, {P_4G, n4, m3, 56, 4, 2, 0, 0, 0},      \
            {P_7G, n7, m7, 98, 7, 5, 0, 1, 1},                                         \
    }
#define HOPPER(n1, n1me, n1x2, n2, n3, n4, n7, m1, m2, m3, m7)                         \
    {                                                                                  \
        {P_1G, n1, m1, 16, 1, 1, 0, 1, 0}, {P_1G_ME, n1me, m1, 16, 1, 1, 0, 1, 1},     \
            {P_1G_2X, n1x2, m2, 26, 1, 1, 0, 1, 0}, {P_2G, n2, m2, 32, 2, 2, 0, 2, 0}, \
            {P_3G, n3, m3, 60, 3, 3, 0, 3, 0}, {P_4G, n4, m3, 64, 4, 4, 0, 4, 0},      \
            {P_7G, n7, m7, 132, 8, 7, 0, 7, 1},                                        \
    }

static const struct model MODELS[] = {
    {"A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", NVML_DEVICE_ARCH_AMPERE, 8, 0,
     NVML_BRAND_NVIDIA, 40960, 0x20B010DE, 0x134F10DE, 108, 1, 1,
     AMPERE("MIG 1g.5gb", "MIG 1g.5gb+me", "MIG 1g.10gb", "MIG 2g.10gb", "MIG 3g.20gb",
            "MIG 4g.20gb", "MIG 7g.40gb", 4864, 9856, 19968, 40192)},
    {"A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", NVML_DEVICE_ARCH_AMPERE, 8, 0,
     NVML_BRAND_NVIDIA, 81920, 0x20B210DE, 0x147F10DE, 108, 1, 1,
     AMPERE("MIG 1g.10gb", "MIG 1g.10gb+me", "MIG 1g.20gb", "MIG 2g.20gb", "MIG 3g.40gb",
            "MIG 4g.40gb", "MIG 7g.80gb", 9856, 19968, 40192, 80384)},
    {"H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", NVML_DEVICE_ARCH_HOPPER, 9, 0,
     NVML_BRAND_NVIDIA, 81559, 0x233010DE, 0x16C110DE, 132, 1, 0,
     HOPPER("MIG 1g.10gb", "MIG 1g.10gb+me", "MIG 1g.20gb", "MIG 2g.20gb", "MIG 3g.40gb",
            "MIG 4g.40gb", "MIG 7g.80gb", 9984, 20096, 40448, 81152)},
    {"H200-SXM5-141GB", "NVIDIA H200", NVML_DEVICE_ARCH_HOPPER, 9, 0, NVML_BRAND_NVIDIA,
     143771, 0x233510DE, 0x18BE10DE, 132, 1, 0,
     HOPPER("MIG 1g.18gb", "MIG 1g.18gb+me", "MIG 1g.35gb", "MIG 2g.35gb", "MIG 3g.71gb",
            "MIG 4g.71gb", "MIG 7g.141gb", 16384, 33280, 71424, 143360)},
    {"L40S", "NVIDIA L40S", NVML_DEVICE_ARCH_ADA, 8, 9, NVML_BRAND_NVIDIA, 46068,
     0x26B910DE, 0x185110DE, 142, 0, 0, {{0}}},
};

const struct model *model_find(const char *key)
{
    for (size_t i = 0; i < sizeof(MODELS) / sizeof(MODELS[0]); i++)
        if (strcmp(MODELS[i].key, key) == 0)
            return &MODELS[i];
    return NULL;
}

const struct gi_profile *model_profile_by_enum(const struct model *m, unsigned int e)
{
    if (!m->mig_capable)
        return NULL;
    for (int i = 0; i < GI_PROFILE_KINDS; i++)
        if (m->profiles[i].enum_value == e)
            return &m->profiles[i];
    return NULL;
}

const struct gi_profile *model_profile_by_id(const struct model *m, unsigned int id)
{
    if (!m->mig_capable)
        return NULL;
    for (int i = 0; i < GI_PROFILE_KINDS; i++)
        if (m->profiles[i].id == id)
            return &m->profiles[i];
    return NULL;
}
