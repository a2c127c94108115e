/* gpu-workload: the lab's stand-in for a tenant's CUDA job. It uses the GPU through the
 * CUDA driver API (libcuda.so.1, which the toolkit hook mounts into the container) the
 * way a framework does: it allocates device memory along a profile, runs kernels of a
 * given intensity, honours the framework cap the platform sets (GPUPLATFORM_VRAM_LIMIT_MB)
 * when it is a cooperative program, and dies with PyTorch's out-of-memory message when an
 * allocation fails. Any quota is enforced outside it: by a MIG device's size, the quota
 * library preloaded in front of libcuda, or a full card. Host RAM and processes are the
 * kernel's (cgroup) business.
 *
 * Chosen by environment (the tenant's launch sets it):
 *   WORKLOAD_PROFILE     steady | ramp | leak | burst | oom | idle | bandwidth
 *   WORKLOAD_MB          memory at start (MiB)          WORKLOAD_RATE_MB_PER_MIN  growth
 *   WORKLOAD_PEAK_MB     ramp's ceiling                 WORKLOAD_STEP_MB  allocation size
 *   WORKLOAD_BURST_MB / _PERIOD_S / _BURST_S             burst: extra MiB, every, for
 *   WORKLOAD_SM_UTIL / WORKLOAD_MEM_UTIL                 kernel intensity (percent)
 *   WORKLOAD_IDLE_FROM_S / WORKLOAD_IDLE_UNTIL_S         no kernels in that window
 *   WORKLOAD_EXIT_AFTER_S / WORKLOAD_EXIT_CODE           finish on its own
 *   WORKLOAD_COOPERATIVE 1/0 (default: steady, idle, oom honour the framework cap)
 *   WORKLOAD_HOST_MB     host RAM to allocate and touch at start
 *   WORKLOAD_VMM_MB      device memory taken at start through cuMemCreate (the virtual
 *                        memory API NCCL's pools use), which a cuMemAlloc quota misses
 *   WORKLOAD_PROBE_MB    every tick, also allocate this much for a moment and print
 *                        "probe <unix time> ok|refused": a neighbour that keeps asking for
 *                        memory inside its quota, whose refusals measure a harm's length */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MIB (1024ULL * 1024ULL)
#define TICK_MS 100
#define MAX_BLOCKS 65536

CUresult cuInit(unsigned int);
CUresult cuDeviceGetName(char *, int, int);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuEmuRun(unsigned int, unsigned int, unsigned int);
CUresult cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);

static double num(const char *name, double fallback) {
    char key[64];
    snprintf(key, sizeof key, "WORKLOAD_%s", name);
    const char *v = getenv(key);
    if (!v || !*v) return fallback;
    char *end;
    double d = strtod(v, &end);
    return end == v ? fallback : d;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *profile = "steady";
static double base_mb, rate, peak_mb, burst_mb, period_s, burst_s, idle_from, idle_until;
static int sm, mem;
static CUdeviceptr blocks[MAX_BLOCKS];
static unsigned long long sizes[MAX_BLOCKS];
static int nblocks;
static unsigned long long held; /* bytes */

static int in_burst(double t) {
    if (strcmp(profile, "burst")) return 0;
    double phase = t - period_s * (double)(long long)(t / period_s);
    return phase >= period_s - burst_s;
}

static double demand(double t) {
    if (!strcmp(profile, "ramp") || !strcmp(profile, "leak") || !strcmp(profile, "oom")) {
        double d = base_mb + rate * t / 60.0;
        if (!strcmp(profile, "ramp") && peak_mb > 0 && d > peak_mb) d = peak_mb > base_mb ? peak_mb : base_mb;
        return d;
    }
    if (!strcmp(profile, "burst")) return base_mb + (in_burst(t) ? burst_mb : 0.0);
    return base_mb;
}

static void oom_exit(double wanted_mb, const char *device) {
    size_t f = 0, total = 0;
    cuMemGetInfo_v2(&f, &total);
    fprintf(stderr,
            "Traceback (most recent call last):\n"
            "  File \"/app/main.py\", line 42, in <module>\n"
            "    block = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f MiB. "
            "GPU 0 has a total capacity of %.2f GiB of which %.2f GiB is free. "
            "Process %d has %.2f GiB memory in use (%s).\n",
            wanted_mb, (double)total / (1024.0 * MIB), (double)f / (1024.0 * MIB), (int)getpid(),
            (double)held / (1024.0 * MIB), device);
    exit(1);
}

static void probe(double mb) {
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    CUdeviceptr ptr;
    CUresult r = cuMemAlloc_v2(&ptr, (size_t)(mb * (double)MIB));
    printf("gpu-workload: probe %.3f %s\n", (double)wall.tv_sec + (double)wall.tv_nsec / 1e9,
           r == 0 ? "ok" : "refused");
    if (r == 0) cuMemFree_v2(ptr);
}
int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(stderr, NULL, _IOLBF, 0);
    const char *p = getenv("WORKLOAD_PROFILE");
    static const char *known[] = {"steady", "ramp", "leak", "burst", "oom", "idle", "bandwidth"};
    for (size_t i = 0; p && i < sizeof known / sizeof *known; i++)
        if (!strcmp(p, known[i])) profile = known[i];
    if (p && *p && strcmp(p, profile))
        fprintf(stderr, "gpu-workload: unknown profile '%s', using steady\n", p);
    struct { const char *name; double mb, rate, sm, mem; } d[] = {
        {"steady", 2048, 0, 60, 25}, {"ramp", 1024, 1024, 70, 30}, {"leak", 1024, 256, 40, 15},
        {"burst", 2048, 0, 50, 20}, {"oom", 1024, 2048, 80, 40}, {"idle", 1024, 0, 0, 0},
        {"bandwidth", 2048, 0, 60, 90}};
    size_t k = 0;
    while (strcmp(d[k].name, profile)) k++;
    base_mb = num("MB", d[k].mb);
    rate = num("RATE_MB_PER_MIN", d[k].rate);
    peak_mb = num("PEAK_MB", !strcmp(profile, "ramp") ? base_mb * 4 : 0);
    burst_mb = num("BURST_MB", 4096);
    period_s = num("PERIOD_S", 60);
    if (period_s < 1) period_s = 1;
    burst_s = num("BURST_S", 10);
    sm = (int)num("SM_UTIL", d[k].sm);
    mem = (int)num("MEM_UTIL", d[k].mem);
    idle_from = num("IDLE_FROM_S", -1);
    idle_until = num("IDLE_UNTIL_S", -1);
    double exit_after = num("EXIT_AFTER_S", -1);
    int exit_code = (int)num("EXIT_CODE", 0);
    double step_mb = num("STEP_MB", 256);
    double probe_mb = num("PROBE_MB", 0);
    if (step_mb < 1) step_mb = 1;
    const char *coop_env = getenv("WORKLOAD_COOPERATIVE");
    int cooperative = coop_env && *coop_env
                          ? (!strcmp(coop_env, "1") || !strcasecmp(coop_env, "true"))
                          : (!strcmp(profile, "steady") || !strcmp(profile, "idle") ||
                             !strcmp(profile, "oom"));
    const char *cap_env = getenv("GPUPLATFORM_VRAM_LIMIT_MB");
    double cap_mb = cap_env && *cap_env ? strtod(cap_env, NULL) : 0;

    double host_mb = num("HOST_MB", 0);
    if (host_mb > 0) {
        printf("gpu-workload: touching %.0f MiB of host RAM\n", host_mb);
        for (double done = 0; done < host_mb; done += 16) {
            char *chunk = malloc(16 * MIB);
            if (!chunk) break;
            memset(chunk, 1, 16 * MIB);
        }
    }

    if (cuInit(0) != 0) {
        fprintf(stderr, "Traceback (most recent call last):\n"
                        "  File \"/app/main.py\", line 3, in <module>\n"
                        "    torch.cuda.init()\n"
                        "RuntimeError: CUDA error: no CUDA-capable device is detected\n");
        return 1;
    }
    char device[96] = "";
    cuDeviceGetName(device, sizeof device, 0);
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo_v2(&free_b, &total_b);
    printf("gpu-workload: profile=%s base=%.0fMiB device=\"%s\" total=%lluMiB free=%lluMiB "
           "framework_cap=%s%.0f%s cooperative=%s\n",
           profile, base_mb, device, (unsigned long long)(total_b / MIB),
           (unsigned long long)(free_b / MIB), cap_mb > 0 ? "" : "none(", cap_mb,
           cap_mb > 0 ? "MiB" : ")", cooperative ? "yes" : "no");

    double vmm_mb = num("VMM_MB", 0);
    if (vmm_mb > 0) {
        unsigned long long handle;
        if (cuMemCreate(&handle, (size_t)(vmm_mb * (double)MIB), NULL, 0) != 0) oom_exit(vmm_mb, device);
        printf("gpu-workload: %.0f MiB in a cuMemCreate pool\n", vmm_mb);
    }
    double start = now_s(), last_log = -1e9;
    int holding_logged = 0;
    for (;;) {
        double t = now_s() - start;
        if (exit_after >= 0 && t >= exit_after) {
            printf("gpu-workload: finished after %.0f s, releasing %llu MiB\n", t, held / MIB);
            return exit_code;
        }
        double want = demand(t);
        if (cooperative && cap_mb > 0 && want > cap_mb) {
            if (!strcmp(profile, "oom")) oom_exit(want - (double)held / MIB, device);
            if (!holding_logged) {
                printf("gpu-workload: wants %.0f MiB, holding at the framework cap %.0f MiB\n", want, cap_mb);
                holding_logged = 1;
            }
            want = cap_mb;
        }
        unsigned long long want_b = (unsigned long long)(want * (double)MIB);
        while (held + MIB <= want_b && nblocks < MAX_BLOCKS) {
            unsigned long long chunk = want_b - held;
            if (chunk > (unsigned long long)(step_mb * MIB)) chunk = (unsigned long long)(step_mb * MIB);
            CUdeviceptr ptr;
            CUresult r = cuMemAlloc_v2(&ptr, chunk);
            if (r == 0) {
                blocks[nblocks] = ptr;
                sizes[nblocks++] = chunk;
                held += chunk;
                continue;
            }
            if (r != CUDA_ERROR_OUT_OF_MEMORY) {
                fprintf(stderr, "RuntimeError: CUDA error: unspecified launch failure (%d)\n", r);
                return 1;
            }
            if (!cooperative || !strcmp(profile, "oom")) oom_exit((double)chunk / MIB, device);
            if (!holding_logged) {
                printf("gpu-workload: allocation refused at %llu MiB (wanted %.0f MiB), holding\n",
                       held / MIB, want);
                holding_logged = 1;
            }
            break;
        }
        /* free while what stays still covers the demand: back to base after a burst */
        while (nblocks > 0 && held - sizes[nblocks - 1] >= want_b) {
            nblocks--;
            cuMemFree_v2(blocks[nblocks]);
            held -= sizes[nblocks];
        }
        if (probe_mb > 0) probe(probe_mb);
        if (t - last_log >= 10) {
            printf("gpu-workload: t=%.0fs holding %llu MiB\n", t, held / MIB);
            last_log = t;
        }
        int idle = idle_from >= 0 && t >= idle_from && (idle_until < 0 || t < idle_until);
        int s = in_burst(t) ? (sm > 95 ? sm : 95) : sm, m = in_burst(t) ? (mem > 60 ? mem : 60) : mem;
        if (!idle && (s > 0 || m > 0)) {
            CUresult r = cuEmuRun((unsigned)s, (unsigned)m, TICK_MS);
            if (r != 0) { /* the device is gone (Xid 79): every CUDA call fails from now on */
                fprintf(stderr, "RuntimeError: CUDA error: unspecified launch failure (%d)\n", r);
                return 1;
            }
        } else {
            struct timespec ts = {0, TICK_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}
