/* The lab node's software VRAM quota library, a HAMi-core stand-in: preloaded into a
 * container's processes, it intercepts the CUDA driver's allocation calls and refuses an
 * allocation that would take the container past its limit, with the CUDA out-of-memory
 * result the job would get from a full card. cuMemGetInfo reports the limit as the
 * device's size, so engines that size themselves from the device see the slice.
 *
 * Faithful to HAMi-core (the version the platform supports is pinned in
 * nodes/sampler.py, which reads these books) where the platform's defence depends on it:
 * - it reads its settings from the process's own environment: the limit
 *   (CUDA_DEVICE_MEMORY_LIMIT_0, else CUDA_DEVICE_MEMORY_LIMIT; a bare number is MiB),
 *   where its books live (CUDA_DEVICE_MEMORY_SHARED_CACHE, default /tmp/cudevshr.cache),
 *   and an off switch (CUDA_DISABLE_CONTROL=true): so anything the tenant runs can
 *   change them, and a process started without LD_PRELOAD never loads it;
 * - its books are HAMi-core's shared region (shared_region_t, major 1 minor 2): a
 *   mmapped file the container's processes share, one slot per process with its device
 *   memory, the first process to create it writing the limits it read;
 * - it counts cuMemAlloc and cuMemCreate (the virtual memory API NCCL's pools use).
 *
 * What the node adds, so that environment stops mattering: the toolkit hook writes the
 * container's limits into a read-only /overrideEnv (HAMi-core's own override file; its
 * lines replace the process's environment) and names the library in a read-only
 * /etc/ld.so.preload. Built with -DVRAMQUOTA_ENV_ONLY it ignores /overrideEnv, as
 * upstream HAMi-core does on the CUDA path: a node with that build can only be configured
 * by environment, which the preflight's probe finds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MIB (1024ULL * 1024ULL)
#define MAX_BLOCKS 65536

/* HAMi-core's shared region, field for field (src/multiprocess/multiprocess_memory_limit.h) */
#define REGION_MAGIC 19920718
#define REGION_MAJOR 1
#define REGION_MINOR 2
#define MAX_DEVICES 16
#define MAX_PROCS 1024
#define OVERRIDE_FILE "/overrideEnv"
#define DEFAULT_CACHE "/tmp/cudevshr.cache"

typedef struct {
    _Atomic uint64_t context_size;
    _Atomic uint64_t module_size;
    _Atomic uint64_t data_size;
    _Atomic uint64_t offset;
    _Atomic uint64_t total;
    uint64_t unused[3];
} device_memory_t;

typedef struct {
    _Atomic uint64_t dec_util;
    _Atomic uint64_t enc_util;
    _Atomic uint64_t sm_util;
    uint64_t unused[3];
} device_util_t;

typedef struct {
    _Atomic int32_t pid;
    _Atomic int32_t hostpid;
    device_memory_t used[MAX_DEVICES];
    _Atomic uint64_t monitorused[MAX_DEVICES];
    device_util_t device_util[MAX_DEVICES];
    _Atomic int32_t status;
    _Atomic uint64_t seqlock;
    uint64_t unused[2];
} proc_slot_t;

typedef struct {
    _Atomic int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    _Atomic int32_t sm_init_flag;
    _Atomic size_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[MAX_DEVICES][96];
    uint64_t limit[MAX_DEVICES];
    uint64_t sm_limit[MAX_DEVICES];
    proc_slot_t procs[MAX_PROCS];
    _Atomic int proc_num;
    _Atomic int utilization_switch;
    _Atomic int recent_kernel;
    int priority;
    _Atomic uint64_t last_kernel_time;
    sem_t sem_postinit;
} shared_region_t;

/* The offsets the node's sampler reads (nodes/sampler.py): a change here that moved
 * them would make the platform's second count silently wrong, so it fails the build. */
_Static_assert(offsetof(shared_region_t, limit) == 1600, "limit offset");
_Static_assert(offsetof(shared_region_t, procs) == 1856, "procs offset");
_Static_assert(sizeof(proc_slot_t) == 1960, "slot size");
_Static_assert(offsetof(proc_slot_t, used) + offsetof(device_memory_t, total) == 40, "total");
_Static_assert(offsetof(proc_slot_t, seqlock) == 1936, "seqlock offset");
_Static_assert(offsetof(shared_region_t, proc_num) == 2008896, "proc_num offset");
_Static_assert(sizeof(shared_region_t) == 2008952, "region size");

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int enforcing;
static unsigned long long limit;
static unsigned long long own; /* this process's count: the books when there are none */
static shared_region_t *region;
static int region_fd = -1;
static proc_slot_t *mine;
static struct {
    CUdeviceptr ptr;
    unsigned long long size;
} blocks[MAX_BLOCKS];
static int nblocks;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

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

/* HAMi-core's load_env_from_file: "NAME=value" lines, each replacing the environment's.
 * 1 when the node gave the settings. */
static int load_override(void) {
#ifdef VRAMQUOTA_ENV_ONLY
    return 0;
#else
    FILE *f = fopen(OVERRIDE_FILE, "re");
    if (!f) return 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '=');
        if (!eq) break;
        line[strcspn(line, "\n")] = '\0';
        *eq = '\0';
        setenv(line, eq + 1, 1);
    }
    fclose(f);
    return 1;
#endif
}

static void region_lock(void) {
    if (region_fd >= 0) (void)lockf(region_fd, F_LOCK, sizeof(shared_region_t));
}

static void region_unlock(void) {
    if (region_fd >= 0) (void)lockf(region_fd, F_ULOCK, sizeof(shared_region_t));
}

/* Open (creating and initialising if this is the first process) the container's books,
 * drop the slots of processes that died, and take a slot for this process. */
static void open_region(void) {
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (!path || !*path) path = DEFAULT_CACHE;
    mode_t old = umask(0);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    umask(old);
    if (fd < 0) {
        fprintf(stderr, "[vramquota] cannot open %s: %s\n", path, strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 ||
        (st.st_size < (off_t)sizeof(shared_region_t) && ftruncate(fd, sizeof(shared_region_t)) != 0)) {
        close(fd);
        return;
    }
    void *map = mmap(NULL, sizeof(shared_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return;
    }
    region = map;
    region_fd = fd;
    region_lock();
    if (atomic_load(&region->initialized_flag) != REGION_MAGIC) {
        region->major_version = REGION_MAJOR;
        region->minor_version = REGION_MINOR;
        region->device_num = 1;
        for (int d = 0; d < MAX_DEVICES; d++) {
            region->limit[d] = d == 0 ? limit : 0;
            region->sm_limit[d] = 100;
        }
        (void)sem_init(&region->sem, 1, 1);
        (void)sem_init(&region->sem_postinit, 1, 1);
        atomic_store(&region->proc_num, 0);
        atomic_store(&region->utilization_switch, 1);
        atomic_store(&region->recent_kernel, 2);
        region->priority = 1;
        atomic_store(&region->initialized_flag, REGION_MAGIC);
    } else if (region->limit[0] != limit) {
        /* HAMi-core logs the mismatch and keeps the region's (the first process's) */
        fprintf(stderr, "[vramquota] limit inconsistency: %llu MiB here, %llu MiB in the region\n",
                limit / MIB, (unsigned long long)region->limit[0] / MIB);
    }
    /* A slot is never moved (a live process keeps its pointer to it): this process takes
     * its own old slot, else the first whose process is gone, else a new one. */
    int n = atomic_load(&region->proc_num);
    if (n < 0 || n > MAX_PROCS) n = 0; /* written over from inside: start the books again */
    pid_t me = getpid();
    int free_slot = -1;
    for (int i = 0; i < n; i++) {
        int32_t pid = atomic_load(&region->procs[i].pid);
        if (pid == me || pid == 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
            if (pid == me || free_slot < 0) free_slot = i;
            if (pid == me) break;
        }
    }
    if (free_slot < 0 && n < MAX_PROCS) free_slot = n++;
    if (free_slot >= 0) {
        mine = &region->procs[free_slot];
        memset(mine, 0, sizeof *mine);
        atomic_store(&mine->pid, me);
        atomic_store(&mine->status, 1);
    }
    atomic_store(&region->proc_num, n);
    region_unlock();
}

static void setup(void) {
    int from_node = load_override();
    const char *off = getenv("CUDA_DISABLE_CONTROL");
    const char *v = getenv("CUDA_DEVICE_MEMORY_LIMIT_0");
    if (!v || !*v) v = getenv("CUDA_DEVICE_MEMORY_LIMIT");
    if (off && !strcasecmp(off, "true")) {
        fprintf(stderr, "[vramquota] CUDA_DISABLE_CONTROL=true: not enforcing\n");
        return;
    }
    if (v && *v) limit = parse_size(v);
    open_region();
    /* The region's limit is the first process's, as in HAMi-core; but the region is a
     * file the container can write, so where the node gave the limit, the node's holds. */
    if (!from_node && region && region->limit[0]) limit = region->limit[0];
    enforcing = limit > 0;
    if (enforcing) fprintf(stderr, "[vramquota] device memory limit %llu MiB\n", limit / MIB);
}

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

/* What the container's live processes hold, this one included (bytes). Without books
 * (none could be opened) this process's own count: the limit still holds for it. */
static unsigned long long held(void) {
    if (!region || !mine) return own;
    unsigned long long sum = 0;
    int n = atomic_load(&region->proc_num);
    for (int i = 0; i < n && i < MAX_PROCS; i++) {
        int32_t pid = atomic_load(&region->procs[i].pid);
        if (pid == 0 || (pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH)) continue;
        unsigned long long used = atomic_load(&region->procs[i].used[0].total);
        /* a count no card holds was written over from inside: it leaves no room */
        sum += used > (1ULL << 50) ? limit : used;
    }
    return sum;
}

/* This process's count, under the slot's seqlock (odd while a write is under way). */
static void book(long long delta) {
    own += (unsigned long long)delta;
    if (!mine) return;
    atomic_fetch_add(&mine->seqlock, 1);
    atomic_fetch_add(&mine->used[0].total, (uint64_t)delta);
    atomic_fetch_add(&mine->used[0].data_size, (uint64_t)delta);
    atomic_fetch_add(&mine->seqlock, 1);
}

/* Admit and book an allocation in one step under the books' lock (and this process's
 * mutex), so two processes or threads cannot both pass the check for the last room; the
 * caller gives it back with book(-bytes) when the driver then fails. Fails closed: no
 * room to remember the block is no allocation. */
static CUresult admit(size_t bytes) {
    (void)pthread_once(&once, setup);
    if (!enforcing) return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (nblocks >= MAX_BLOCKS) {
        pthread_mutex_unlock(&mu);
        fprintf(stderr, "[vramquota] refused: more than %d live allocations\n", MAX_BLOCKS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    region_lock();
    unsigned long long now = held();
    int room = now + bytes <= limit;
    if (room) book((long long)bytes);
    region_unlock();
    pthread_mutex_unlock(&mu);
    if (!room) {
        fprintf(stderr,
                "[vramquota] refused %llu MiB: %llu of %llu MiB in use (device memory limit)\n",
                (unsigned long long)bytes / MIB, now / MIB, limit / MIB);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Note an admitted allocation's block (booked already when enforcing). */
static void remember(CUdeviceptr ptr, size_t bytes) {
    pthread_mutex_lock(&mu);
    if (nblocks < MAX_BLOCKS) {
        blocks[nblocks].ptr = ptr;
        blocks[nblocks].size = bytes;
        nblocks++;
        if (!enforcing) book((long long)bytes);
    }
    pthread_mutex_unlock(&mu);
}

static void forget(CUdeviceptr ptr) {
    pthread_mutex_lock(&mu);
    for (int i = nblocks - 1; i >= 0; i--) {
        if (blocks[i].ptr == ptr) {
            book(-(long long)blocks[i].size);
            blocks[i] = blocks[--nblocks];
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult (*real)(CUdeviceptr *, size_t) = next("cuMemAlloc_v2");
    CUresult r = admit(bytesize);
    if (r != CUDA_SUCCESS) return r;
    r = real(dptr, bytesize);
    if (r == CUDA_SUCCESS) remember(*dptr, bytesize);
    else if (enforcing) book(-(long long)bytesize);
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult (*real)(CUdeviceptr) = next("cuMemFree_v2");
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS) forget(dptr);
    return r;
}

CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop,
                     unsigned long long flags) {
    CUresult (*real)(unsigned long long *, size_t, const void *, unsigned long long) =
        next("cuMemCreate");
    CUresult r = admit(size);
    if (r != CUDA_SUCCESS) return r;
    r = real(handle, size, prop, flags);
    if (r == CUDA_SUCCESS) remember(*handle, size);
    else if (enforcing) book(-(long long)size);
    return r;
}

CUresult cuMemRelease(unsigned long long handle) {
    CUresult (*real)(unsigned long long) = next("cuMemRelease");
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS) forget(handle);
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CUresult (*real)(size_t *, size_t *) = next("cuMemGetInfo_v2");
    size_t f = 0, t = 0;
    CUresult r = real(&f, &t);
    (void)pthread_once(&once, setup);
    if (r == CUDA_SUCCESS && enforcing) {
        region_lock();
        unsigned long long now = held();
        region_unlock();
        unsigned long long room = limit > now ? limit - now : 0;
        t = (size_t)limit;
        f = f < room ? f : (size_t)room;
    }
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return r;
}
