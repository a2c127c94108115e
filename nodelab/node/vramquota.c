/* The lab node's software VRAM quota library, a HAMi-core stand-in: preloaded into a
 * container (LD_PRELOAD), it intercepts the CUDA driver's allocation calls and refuses
 * an allocation that would take the container past CUDA_DEVICE_MEMORY_LIMIT(_0), with
 * the CUDA out-of-memory result the job would get from a full card. cuMemGetInfo reports
 * the quota as the device's size, so engines that size themselves from the device see
 * the slice. Like HAMi-core it keeps the container's usage in a shared accounting file
 * (CUDA_DEVICE_MEMORY_SHARED_CACHE, default /run/vramquota/usage: "pid bytes" a line,
 * under flock; the toolkit hook mounts it from the host, where the node's sampler reads
 * it), counts cuMemAlloc only (cuMemCreate, NCCL's pools, passes uncounted, HAMi#1196),
 * and switches itself off when CUDA_DISABLE_CONTROL=true is in the environment
 * (HAMi#723): the platform must never let a tenant set either. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <unistd.h>

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

static const char *cache_path(void) {
    const char *p = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    return p && *p ? p : "/run/vramquota/usage";
}

/* Under the file's lock: what the container's other live processes hold (bytes), and
 * with `write`, this process's line replaced by `mine`. -1 when there is no file. */
static long long shared(int write, unsigned long long mine) {
    int fd = open(cache_path(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX) != 0) {
        close(fd);
        return -1;
    }
    char buf[16384], out[16384];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    long long others = 0;
    size_t len = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        long pid = 0;
        unsigned long long bytes = 0;
        if (sscanf(line, "%ld %llu", &pid, &bytes) != 2 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) continue; /* a process that died */
        others += (long long)bytes;
        len += (size_t)snprintf(out + len, sizeof out - len, "%ld %llu\n", pid, bytes);
        if (len >= sizeof out - 64) break;
    }
    if (write) {
        len += (size_t)snprintf(out + len, sizeof out - len, "%ld %llu\n", (long)getpid(), mine);
        if (pwrite(fd, out, len, 0) == (ssize_t)len) (void)ftruncate(fd, (off_t)len);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return others;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult (*real)(CUdeviceptr *, size_t) = next("cuMemAlloc_v2");
    setup();
    long long others = shared(0, 0);
    unsigned long long held = used + (others > 0 ? (unsigned long long)others : 0);
    if (enforcing && held + bytesize > limit) {
        fprintf(stderr,
                "[vramquota] refused %llu MiB: %llu of %llu MiB in use (device memory limit)\n",
                (unsigned long long)bytesize / MIB, held / MIB, limit / MIB);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytesize);
    if (r == CUDA_SUCCESS && nblocks < MAX_BLOCKS) {
        blocks[nblocks].ptr = *dptr;
        blocks[nblocks].size = bytesize;
        nblocks++;
        used += bytesize;
        shared(1, used);
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
                shared(1, used);
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
        long long others = shared(0, 0);
        unsigned long long held = used + (others > 0 ? (unsigned long long)others : 0);
        unsigned long long room = limit > held ? limit - held : 0;
        t = (size_t)limit;
        f = f < room ? f : (size_t)room;
    }
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return r;
}
