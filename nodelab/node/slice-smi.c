/* nvidia-smi inside a lab slice: the slice's own view of its device, as HAMi's containers
 * show it. It asks the CUDA driver library for the device's memory (cuMemGetInfo), so
 * where the node's quota library is preloaded (read-only /etc/ld.so.preload) the answer
 * is the library's: the total is the slice's quota and the used memory is what the
 * container's processes hold. On a MIG device it is the instance's memory, on a whole
 * card the card's. The node's own nvidia-smi (nodelab/node/nvidia-smi) sees every GPU;
 * this one cannot: the container has one device and no control socket.
 *
 *   nvidia-smi                         a short table
 *   nvidia-smi -L                      GPU 0: <name> (UUID: <the device the slice got>)
 *   nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free
 *              --format=csv[,noheader][,nounits]                                      */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define MIB (1024ULL * 1024ULL)
#define NA "[N/A]"

CUresult cuInit(unsigned int);
CUresult cuDeviceGetName(char *, int, int);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDriverGetVersion(int *);

static const char *FAILED =
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n";

struct view {
    char name[96];
    const char *uuid;
    unsigned long long total_mib, used_mib, free_mib;
};

static int usage(void) {
    printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
    return 2;
}

/* The device the toolkit gave the container (docker's --gpus sets it in the first
 * process's environment; the platform's login file sets it for logins). */
static const char *device_uuid(void) {
    const char *v = getenv("NVIDIA_VISIBLE_DEVICES");
    if (v && (!strncmp(v, "GPU-", 4) || !strncmp(v, "MIG-", 4)) && !strchr(v, ',')) return v;
    return NA;
}

static int read_view(struct view *v) {
    size_t free_b = 0, total_b = 0;
    if (cuInit(0) != 0 || cuDeviceGetName(v->name, sizeof v->name, 0) != 0 ||
        cuMemGetInfo_v2(&free_b, &total_b) != 0) {
        fputs(FAILED, stdout);
        return 9;
    }
    v->uuid = device_uuid();
    v->total_mib = total_b / MIB;
    v->free_mib = free_b / MIB;
    v->used_mib = total_b > free_b ? (total_b - free_b) / MIB : 0;
    return 0;
}

static int field(const struct view *v, const char *f, int units, char *out, size_t size) {
    const char *unit = units ? " MiB" : "";
    if (!strcmp(f, "index")) snprintf(out, size, "0");
    else if (!strcmp(f, "count")) snprintf(out, size, "1");
    else if (!strcmp(f, "name") || !strcmp(f, "gpu_name")) snprintf(out, size, "%s", v->name);
    else if (!strcmp(f, "uuid") || !strcmp(f, "gpu_uuid")) snprintf(out, size, "%s", v->uuid);
    else if (!strcmp(f, "memory.total")) snprintf(out, size, "%llu%s", v->total_mib, unit);
    else if (!strcmp(f, "memory.used")) snprintf(out, size, "%llu%s", v->used_mib, unit);
    else if (!strcmp(f, "memory.free")) snprintf(out, size, "%llu%s", v->free_mib, unit);
    else return -1;
    return 0;
}

static int query(const char *fields, const char *format) {
    char fmt[128], list[512], cell[160];
    int header = 1, units = 1, csv = 0;
    snprintf(fmt, sizeof fmt, "%s", format);
    for (char *t = strtok(fmt, ","); t; t = strtok(NULL, ",")) {
        if (!strcmp(t, "csv")) csv = 1;
        else if (!strcmp(t, "noheader")) header = 0;
        else if (!strcmp(t, "nounits")) units = 0;
        else csv = -1;
    }
    if (csv != 1) {
        printf("\"%s\" is not a valid format option.\n\n", format);
        return 2;
    }
    struct view v;
    snprintf(list, sizeof list, "%s", fields);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        if (field(&(struct view){.uuid = NA}, t, 0, cell, sizeof cell) != 0) {
            printf("Field \"%s\" is not a valid field to query.\n\n", t);
            return 2;
        }
    }
    int rc = read_view(&v);
    if (rc != 0) return rc;
    for (int pass = header ? 0 : 1; pass < 2; pass++) {
        snprintf(list, sizeof list, "%s", fields);
        const char *sep = "";
        for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
            if (pass == 0) {
                int mem = !strncmp(t, "memory.", 7);
                printf("%s%s%s", sep, t, mem ? " [MiB]" : "");
            } else {
                field(&v, t, units, cell, sizeof cell);
                printf("%s%s", sep, cell);
            }
            sep = ", ";
        }
        printf("\n");
    }
    return 0;
}

static int table(void) {
    struct view v;
    int rc = read_view(&v), version = 0;
    if (rc != 0) return rc;
    (void)cuDriverGetVersion(&version);
    char memory[64];
    snprintf(memory, sizeof memory, "%lluMiB / %lluMiB", v.used_mib, v.total_mib);
    printf("+-----------------------------------------------------------------------------+\n");
    printf("| NVIDIA-SMI (the slice's view)                      CUDA Version: %2d.%-8d |\n",
           version / 1000, version % 1000 / 10);
    printf("|-------------------------------------------+---------------------------------|\n");
    printf("| GPU  Name                                 |                    Memory-Usage |\n");
    printf("|   0  %-36.36s | %31s |\n", v.name, memory);
    printf("+-----------------------------------------------------------------------------+\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *fields = NULL, *format = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--query-gpu=", 12)) fields = a + 12;
        else if (!strcmp(a, "--query-gpu") && i + 1 < argc) fields = argv[++i];
        else if (!strncmp(a, "--format=", 9)) format = a + 9;
        else if (!strcmp(a, "--format") && i + 1 < argc) format = argv[++i];
        else if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus")) list = 1;
        else return usage();
    }
    if (list) {
        struct view v;
        int rc = read_view(&v);
        if (rc == 0) printf("GPU 0: %s (UUID: %s)\n", v.name, v.uuid);
        return rc;
    }
    if (fields || format) {
        if (!fields || !format) return usage();
        return query(fields, format);
    }
    return table();
}
