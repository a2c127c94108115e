/* The lab node's software VRAM quota library, a HAMi-core stand-in: preloaded into a
 * container (LD_PRELOAD), it intercepts the CUDA driver's allocation calls and refuses
 * an allocation that would take the process past CUDA_DEVICE_MEMORY_LIMIT(_0), with the
 * CUDA out-of-memory result the job would get from a full card. cuMemGetInfo reports the
 * quota as the device's size, so engines that size themselves from the device see the
 * slice. Like HAMi-core it counts cuMemAlloc only (cuMemCreate passes untouched) and it
 * switches itself off when CUDA_DISABLE_CONTROL=true is in the environment (HAMi#723):
 * the platform must never let a tenant set that. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MIB (1024ULL * 1024ULL)
#define MAX_BLOCKS 65536

static int ready;
static int enforcing;
static unsigned long long limit, used;
static struct {
    CUdeviceptr ptr;
    unsigned long long size;
} blocks[MAX_BLOCKS];
static int nblocks;

static unsigned long long parse_size(const char *v) {
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    switch (end && *end ? *end : 0) {
    case 'k': case 'K': return n * 1024ULL;
    case 'm': case 'M': return n * MIB;
    case 'g': case 'G': return n * 1024ULL * MIB;
    default: return n * MIB; /* HAMi reads a bare number as MiB */
    }
}

static void setup(void) {
    if (ready) return;
    ready = 1;
    const char *off = getenv("CUDA_DISABLE_CONTROL");
    const char *v = getenv("CUDA_DEVICE_MEMORY_LIMIT_0");
    if (!v || !*v) v = getenv("CUDA_DEVICE_MEMORY_LIMIT");
    if (off && !strcasecmp(off, "true")) {
        fprintf(stderr, "[vramquota] CUDA_DISABLE_CONTROL=true: not enforcing\n");
        return;
    }
    if (v && *v) {
        limit = parse_size(v);
        enforcing = limit > 0;
        fprintf(stderr, "[vramquota] device memory limit %llu MiB\n", limit / MIB);
    }
}

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult (*real)(CUdeviceptr *, size_t) = next("cuMemAlloc_v2");
    setup();
    if (enforcing && used + bytesize > limit) {
        fprintf(stderr,
                "[vramquota] refused %llu MiB: %llu of %llu MiB in use (device memory limit)\n",
                (unsigned long long)bytesize / MIB, used / MIB, limit / MIB);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytesize);
    if (r == CUDA_SUCCESS && nblocks < MAX_BLOCKS) {
        blocks[nblocks].ptr = *dptr;
        blocks[nblocks].size = bytesize;
        nblocks++;
        used += bytesize;
    }
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult (*real)(CUdeviceptr) = next("cuMemFree_v2");
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS) {
        for (int i = nblocks - 1; i >= 0; i--) {
            if (blocks[i].ptr == dptr) {
                used -= blocks[i].size;
                blocks[i] = blocks[--nblocks];
                break;
            }
        }
    }
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CUresult (*real)(size_t *, size_t *) = next("cuMemGetInfo_v2");
    size_t f = 0, t = 0;
    CUresult r = real(&f, &t);
    setup();
    if (r == CUDA_SUCCESS && enforcing) {
        unsigned long long room = limit > used ? limit - used : 0;
        t = (size_t)limit;
        f = f < room ? f : (size_t)room;
    }
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return r;
}
