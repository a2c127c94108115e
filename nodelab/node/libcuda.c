/* The emulated CUDA driver's user-space library (libcuda.so.1): the part of the driver
 * a CUDA job links against. It talks to the lab node's emulated GPU over the device
 * socket the toolkit hook mounted into the container, as the real library talks to the
 * kernel driver through /dev/nvidia*. One connection is one CUDA context: the emulated
 * GPU knows the process by the connection's peer credentials (its host PID) and frees
 * its memory when the connection closes, as the driver does at process exit.
 *
 * The entry points keep the CUDA driver API's names and result codes, so a quota library
 * preloaded in front of them (LD_PRELOAD) intercepts them as HAMi-core intercepts the
 * real ones. cuEmuRun is the one addition: "a kernel of this intensity runs for ms". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_UNKNOWN 999

/* Where the toolkit hook mounts the device, like /dev/nvidia0 for a real card. */
#define DEVICE_PATH "/dev/nvidia-emu0.sock"

static int dev_fd = -1;
static char dev_name[96];
static size_t dev_total;
static char rbuf[4096];
static size_t rlen;

static CUresult request(const char *line, char *reply, size_t size) {
    size_t n = strlen(line), off = 0;
    if (dev_fd < 0) return CUDA_ERROR_NOT_INITIALIZED;
    while (off < n) {
        ssize_t w = write(dev_fd, line + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CUDA_ERROR_UNKNOWN;
        off += (size_t)w;
    }
    for (;;) {
        char *nl = memchr(rbuf, '\n', rlen);
        if (nl) {
            size_t len = (size_t)(nl - rbuf);
            if (reply && size) {
                size_t c = len < size - 1 ? len : size - 1;
                memcpy(reply, rbuf, c);
                reply[c] = '\0';
            }
            memmove(rbuf, nl + 1, rlen - len - 1);
            rlen -= len + 1;
            return CUDA_SUCCESS;
        }
        if (rlen == sizeof rbuf) return CUDA_ERROR_UNKNOWN;
        ssize_t r = read(dev_fd, rbuf + rlen, sizeof rbuf - rlen);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CUDA_ERROR_UNKNOWN; /* the GPU went away */
        rlen += (size_t)r;
    }
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (dev_fd >= 0) return CUDA_SUCCESS;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, DEVICE_PATH, sizeof addr.sun_path - 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_NO_DEVICE;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return CUDA_ERROR_NO_DEVICE;
    }
    dev_fd = fd;
    char reply[256];
    if (request("hello\n", reply, sizeof reply) != CUDA_SUCCESS || strncmp(reply, "ok ", 3)) {
        close(dev_fd);
        dev_fd = -1;
        return CUDA_ERROR_NO_DEVICE;
    }
    /* "ok <total bytes> <name...>" */
    char *rest = NULL;
    dev_total = strtoull(reply + 3, &rest, 10);
    snprintf(dev_name, sizeof dev_name, "%s", rest && *rest ? rest + 1 : "GPU");
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 12040;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (dev_fd < 0) return CUDA_ERROR_NOT_INITIALIZED;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (dev_fd < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev_fd < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", dev_name);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (dev_fd < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = dev_total;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    char reply[128];
    CUresult r = request("info\n", reply, sizeof reply);
    if (r != CUDA_SUCCESS) return r;
    unsigned long long f = 0, t = 0;
    if (sscanf(reply, "ok %llu %llu", &f, &t) != 2) return CUDA_ERROR_UNKNOWN;
    if (free_bytes) *free_bytes = (size_t)f;
    if (total_bytes) *total_bytes = (size_t)t;
    return CUDA_SUCCESS;
}

static CUresult alloc(unsigned long long *out, size_t bytes) {
    char line[64], reply[128];
    if (!out || !bytes) return CUDA_ERROR_INVALID_VALUE;
    snprintf(line, sizeof line, "alloc %zu\n", bytes);
    CUresult r = request(line, reply, sizeof reply);
    if (r != CUDA_SUCCESS) return r;
    if (!strncmp(reply, "oom", 3)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (sscanf(reply, "ok %llu", out) != 1) return CUDA_ERROR_UNKNOWN;
    return CUDA_SUCCESS;
}

static CUresult release(unsigned long long handle) {
    char line[64], reply[64];
    snprintf(line, sizeof line, "free %llu\n", handle);
    CUresult r = request(line, reply, sizeof reply);
    if (r != CUDA_SUCCESS) return r;
    return strncmp(reply, "ok", 2) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return alloc(dptr, bytesize); }
CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr); }

/* The virtual memory management API (NCCL's pools use it): the same device memory,
 * through entry points a cuMemAlloc-only quota library does not see. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
                     unsigned long long flags) {
    (void)prop;
    (void)flags;
    return alloc(handle, size);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return release(handle); }

CUresult cuEmuRun(unsigned int sm_pct, unsigned int mem_pct, unsigned int ms) {
    char line[64], reply[32];
    snprintf(line, sizeof line, "run %u %u %u\n", sm_pct, mem_pct, ms);
    CUresult r = request(line, reply, sizeof reply);
    if (r != CUDA_SUCCESS) return r;
    if (strncmp(reply, "ok", 2)) return CUDA_ERROR_UNKNOWN; /* e.g. the GPU fell off the bus */
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return CUDA_SUCCESS;
}
