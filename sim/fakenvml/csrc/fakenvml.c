// fakenvml: a fake libnvidia-ml.so.1 for tests. It exports NVML's C
// functions, with the prototypes of NVIDIA's nvml.h (compiled against
// go-nvml's copy of it), and answers from a node file named by the
// environment variable FAKENVML_NODE. The file is re-read whenever it
// changes, so a test can make a GPU fall off the bus, hang, or raise an XID
// while the exporter runs.
//
// Node file: one "key=value" per line, '#' starts a comment line. A key that
// is absent makes the function answer NVML_ERROR_NOT_SUPPORTED, as a driver
// does for a feature the device lacks. The Go package next to this file
// writes it (fakenvml.Node; node.go's encode functions name every key), and
// each function below says which keys it reads.
//
// Behaviour switches, per device prefix P ("gpu.N." or "gpu.N.mig.M.") or
// global (no prefix):
//   P lost=1              every call on the device answers GPU_IS_LOST
//   P ret.<symbol>=CODE   that function answers CODE (NOT_SUPPORTED, NO_PERMISSION, ...)
//   P block.<symbol>=MS   that function blocks MS milliseconds, or "forever"
//                         (until the key is removed from the file)
//   P block.all=...       every function on the device blocks; without a
//                         prefix, every function on every device (a GPU hung
//                         in the kernel driver holding a driver-wide lock)
//
// Driver life cycle (global keys):
//   driver_generation=N   the loaded driver; when it changes under an
//                         initialised library (a reload, an upgrade) every
//                         call answers UNINITIALIZED and every event set is
//                         gone until nvmlInit is called again
//   driver_unloaded=1     no kernel module: nvmlInit answers
//                         DRIVER_NOT_LOADED, an initialised library is
//                         torn down as on a reload
// MIG device handles name the compute instance they were issued for: once
// it is destroyed (its slot empty, or holding an instance created since) the
// handle answers INVALID_ARGUMENT, and nvmlDeviceGetMigDeviceHandleByIndex
// must be asked again, as with the driver (see migHandle).
// Events are raised when the library first sees them in the file (on the
// next call of any thread): each set registered for the GPU and type at
// that moment gets its own copy; with no such set the event is lost, as
// NVML keeps no history. A burst (burst.N) is a storm of one event: from
// when the library first reads the line, one falls due every interval, and
// each nvmlEventSetWait delivers the next one due (to every set registered
// for the GPU and type then) before it looks at its queue. So a burst
// arrives at most at its rate and no faster than the process waits,
// whatever the machine's load, and which sets get each event depends only
// on the order of the process's calls.
// Which symbols exist is decided at link time by a version script (one per
// driver branch): a missing symbol is really missing, and dlsym fails.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nvml.h"

#define MAX_GPUS 16
#define MAX_MIG 8   // MIG devices (compute instances) per GPU
#define MAX_GI 16   // GPU instance IDs per GPU
#define MAX_CI 8    // compute instance IDs per GPU instance
#define MAX_SETS 16 // event sets
#define MAGIC 0x6e766d6cu

// ---- key/value store ------------------------------------------------------

struct kvent {
    char *key, *val;
};

static struct {
    char *buf;
    struct kvent *ent;
    size_t n;
} store;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initCount;
static char nodePath[4096];
static struct stat nodeStat;
static FILE *traceFile;
static unsigned long long nextEvent; // index of the next event.N to raise
#define MAX_BURSTS 8
// burst.N = gpu type data count intervalUs, started when first read.
static struct {
    unsigned long long v[5];
    struct timespec start;
    unsigned long long sent;
} bursts[MAX_BURSTS];
static unsigned nextBurst; // index of the next burst.N to start
static unsigned long long initGeneration; // driver_generation when nvmlInit succeeded
static void afterLoad(void);
static void raiseEvent(const unsigned long long v[5], int n);

static int kvcmp(const void *a, const void *b) {
    return strcmp(((const struct kvent *)a)->key, ((const struct kvent *)b)->key);
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
    return s;
}

// load parses path into the store. On error it says why on stderr and
// leaves the store as it was.
static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fakenvml: cannot open node file %s (FAKENVML_NODE): %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return -1;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t len = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!buf) return -1;
    buf[len] = 0;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    struct kvent *ent = calloc(lines, sizeof *ent);
    if (!ent) {
        free(buf);
        return -1;
    }
    size_t n = 0;
    int lineNo = 0;
    for (char *line = buf, *next; line; line = next) {
        lineNo++;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *l = trim(line);
        if (!*l || *l == '#') continue;
        char *eq = strchr(l, '=');
        if (!eq) {
            fprintf(stderr, "fakenvml: %s:%d: want key=value, got %.60s\n", path, lineNo, l);
            free(ent);
            free(buf);
            return -1;
        }
        *eq = 0;
        ent[n].key = trim(l);
        ent[n].val = trim(eq + 1);
        n++;
    }
    qsort(ent, n, sizeof *ent, kvcmp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(ent[i - 1].key, ent[i].key) == 0) {
            fprintf(stderr, "fakenvml: %s: key %s appears twice\n", path, ent[i].key);
            free(ent);
            free(buf);
            return -1;
        }
    }
    free(store.buf);
    free(store.ent);
    store.buf = buf;
    store.ent = ent;
    store.n = n;
    nodeStat = st;
    return 0;
}

// reload re-reads the node file if it changed (writers replace it by rename).
static void reload(void) {
    struct stat st;
    if (!nodePath[0] || stat(nodePath, &st) != 0) return;
    if (st.st_ino == nodeStat.st_ino && st.st_size == nodeStat.st_size &&
        st.st_mtim.tv_sec == nodeStat.st_mtim.tv_sec && st.st_mtim.tv_nsec == nodeStat.st_mtim.tv_nsec)
        return;
    if (load(nodePath) != 0) {
        nodeStat = st; // said once; keep the old node until the file changes again
        return;
    }
    afterLoad();
}

static const char *get(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *get(const char *fmt, ...) {
    char key[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    struct kvent k = {key, NULL};
    struct kvent *e = bsearch(&k, store.ent, store.n, sizeof *store.ent, kvcmp);
    return e ? e->val : NULL;
}

static int parseU64(const char *v, unsigned long long *out) {
    if (!v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v) return 0;
    *out = x;
    return 1;
}

static int getU64(unsigned long long *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int getU64(unsigned long long *out, const char *fmt, ...) {
    char key[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    return parseU64(get("%s", key), out);
}

// parseList reads up to max unsigned numbers separated by spaces, ':' or ','.
static int parseList(const char *v, unsigned long long *out, int max) {
    int n = 0;
    while (v && *v && n < max) {
        while (*v == ' ' || *v == ':' || *v == ',') v++;
        if (!*v) break;
        char *end;
        out[n] = strtoull(v, &end, 0);
        if (end == v) break;
        n++;
        v = end;
    }
    return n;
}

static const struct {
    const char *name;
    nvmlReturn_t code;
} codes[] = {
    {"SUCCESS", NVML_SUCCESS},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"TIMEOUT", NVML_ERROR_TIMEOUT},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
    {"NO_DATA", NVML_ERROR_NO_DATA},
    {"UNKNOWN", NVML_ERROR_UNKNOWN},
};

static nvmlReturn_t parseCode(const char *v) {
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(v, codes[i].name) == 0) return codes[i].code;
    unsigned long long x;
    if (parseU64(v, &x)) return (nvmlReturn_t)x;
    return NVML_ERROR_UNKNOWN;
}

// ---- handles --------------------------------------------------------------

struct nvmlDevice_st {
    unsigned magic;
    int gpu, mig; // mig < 0: the whole GPU
    // A MIG device handle names the compute instance it was issued for
    // ("gi ci uuid" of its slot then): see migHandle.
    char ident[160];
};
struct nvmlGpuInstance_st {
    unsigned magic;
    int gpu, id;
};
struct nvmlComputeInstance_st {
    unsigned magic;
    int gpu, gi, id;
};
#define MAX_QUEUED 256
struct nvmlEventSet_st {
    unsigned magic;
    int used;
    unsigned long long mask[MAX_GPUS];
    // Events raised while the set was registered, not yet waited for.
    unsigned long long queue[MAX_QUEUED][5];
    int queued[MAX_QUEUED];
    unsigned head, tail;
};

#define MIG_HANDLES 16 // handles issued per MIG slot before one is reused
static struct nvmlDevice_st devs[MAX_GPUS][1];
static struct nvmlDevice_st migDevs[MAX_GPUS][MAX_MIG][MIG_HANDLES];
static unsigned migIssued[MAX_GPUS][MAX_MIG]; // the slot's newest handle
static struct nvmlGpuInstance_st gis[MAX_GPUS][MAX_GI];
static struct nvmlComputeInstance_st cis[MAX_GPUS][MAX_GI][MAX_CI];
static struct nvmlEventSet_st sets[MAX_SETS];

__attribute__((constructor)) static void setup(void) {
    for (int g = 0; g < MAX_GPUS; g++) {
        devs[g][0] = (struct nvmlDevice_st){MAGIC, g, -1, ""};
        for (int m = 0; m < MAX_MIG; m++)
            for (int h = 0; h < MIG_HANDLES; h++) migDevs[g][m][h] = (struct nvmlDevice_st){MAGIC, g, m, ""};
        for (int i = 0; i < MAX_GI; i++) {
            gis[g][i] = (struct nvmlGpuInstance_st){MAGIC, g, i};
            for (int c = 0; c < MAX_CI; c++) cis[g][i][c] = (struct nvmlComputeInstance_st){MAGIC, g, i, c};
        }
    }
}

#define IN(arr, p) ((const void *)(p) >= (const void *)(arr) && (const void *)(p) < (const void *)((char *)(arr) + sizeof(arr)))

static nvmlDevice_t gpuHandle(int gpu) { return (nvmlDevice_t){&devs[gpu][0]}; }
// migIdent writes what identifies the compute instance in a MIG slot now
// ("" for an empty slot).
static void migIdent(int gpu, int mig, char *out, size_t n) {
    const char *gi = get("gpu.%d.mig.%d.gi", gpu, mig), *ci = get("gpu.%d.mig.%d.ci", gpu, mig),
               *uuid = get("gpu.%d.mig.%d.uuid", gpu, mig);
    if (!gi) {
        *out = 0;
        return;
    }
    snprintf(out, n, "%s %s %s", gi, ci ? ci : "-", uuid ? uuid : "-");
}

// migHandle issues the handle of the compute instance in a MIG slot. nvml.h
// (nvmlDeviceGetMigDeviceHandleByIndex): "If the compute instance is
// destroyed either explicitly or by destroying, resetting or unbinding the
// parent GPU instance or the GPU device itself the MIG device handle would
// remain invalid and must be requested again using this API. Handles may be
// reused and their properties can change in the process." So a handle
// issued for an instance since destroyed answers INVALID_ARGUMENT (what
// every device function answers for an invalid device) even once a new
// instance fills its slot: the new instance gets a handle of its own when
// asked for again. Handles are reused after MIG_HANDLES instances in one
// slot, as the driver may.
static nvmlDevice_t migHandle(int gpu, int mig) {
    char id[sizeof migDevs[0][0][0].ident];
    migIdent(gpu, mig, id, sizeof id);
    struct nvmlDevice_st *h = &migDevs[gpu][mig][migIssued[gpu][mig]];
    if (strcmp(h->ident, id) != 0) {
        migIssued[gpu][mig] = (migIssued[gpu][mig] + 1) % MIG_HANDLES;
        h = &migDevs[gpu][mig][migIssued[gpu][mig]];
        snprintf(h->ident, sizeof h->ident, "%s", id);
    }
    return (nvmlDevice_t){h};
}

// migCurrent: the instance a MIG handle was issued for still exists.
static int migCurrent(const struct nvmlDevice_st *d) {
    char id[sizeof d->ident];
    migIdent(d->gpu, d->mig, id, sizeof id);
    return *id && strcmp(id, d->ident) == 0;
}

static unsigned deviceCount(void) {
    unsigned long long n = 0;
    getU64(&n, "device_count");
    return n > MAX_GPUS ? MAX_GPUS : (unsigned)n;
}

// ---- call entry -----------------------------------------------------------

static void trace(const char *fn, int gpu, int mig) {
    if (traceFile) {
        fprintf(traceFile, "%s %d %d\n", fn, gpu, mig);
        fflush(traceFile);
    }
}

static void sleepMS(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// blockKey finds a block.<fn> or block.all setting for the call.
static const char *blockKey(const char *fn, int gpu, int mig) {
    const char *v = NULL;
    if (gpu >= 0 && mig >= 0) {
        if (!(v = get("gpu.%d.mig.%d.block.%s", gpu, mig, fn))) v = get("gpu.%d.mig.%d.block.all", gpu, mig);
    }
    if (!v && gpu >= 0) {
        if (!(v = get("gpu.%d.block.%s", gpu, fn))) v = get("gpu.%d.block.all", gpu);
    }
    if (!v) v = get("block.%s", fn);
    if (!v) v = get("block.all");
    return v;
}

// enter runs under mu: it blocks (releasing mu) if the node file says so,
// then returns the answer the file forces for this call, or NVML_SUCCESS.
static nvmlReturn_t enter(const char *fn, int gpu, int mig) {
    reload();
    trace(fn, gpu, mig);
    if (initCount == 0 && strcmp(fn, "nvmlInit") != 0) return NVML_ERROR_UNINITIALIZED; // the driver went away

    for (;;) {
        const char *b = blockKey(fn, gpu, mig);
        if (!b) break;
        if (strcmp(b, "forever") == 0) {
            pthread_mutex_unlock(&mu);
            sleepMS(20);
            pthread_mutex_lock(&mu);
            reload();
            continue;
        }
        unsigned long long ms;
        if (parseU64(b, &ms)) {
            pthread_mutex_unlock(&mu);
            sleepMS((long)ms);
            pthread_mutex_lock(&mu);
            reload();
        }
        break;
    }
    const char *v = NULL;
    if (gpu >= 0 && mig >= 0) v = get("gpu.%d.mig.%d.ret.%s", gpu, mig, fn);
    if (!v && gpu >= 0) v = get("gpu.%d.ret.%s", gpu, fn);
    if (!v) v = get("ret.%s", fn);
    if (v) return parseCode(v);
    if (gpu >= 0 && get("gpu.%d.lost", gpu)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define RETURN(r)                  \
    do {                           \
        nvmlReturn_t r__ = (r);    \
        pthread_mutex_unlock(&mu); \
        return r__;                \
    } while (0)

// SYS_ENTER starts a function that needs no device.
#define SYS_ENTER()                                          \
    pthread_mutex_lock(&mu);                                 \
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);    \
    {                                                        \
        nvmlReturn_t e__ = enter(__func__, -1, -1);          \
        if (e__ != NVML_SUCCESS) RETURN(e__);                \
    }

// DEV_ENTER starts a device function: d is the device, P its key prefix.
#define DEV_ENTER(h_) DEV_ENTER_FN(h_, __func__)
#define DEV_ENTER_FN(h_, fn)                                                     \
    pthread_mutex_lock(&mu);                                                     \
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);                        \
    struct nvmlDevice_st *d = (h_).handle;                                        \
    if (!(IN(devs, d) || IN(migDevs, d)) || d->magic != MAGIC ||                \
        (unsigned)d->gpu >= deviceCount())                                       \
        RETURN(NVML_ERROR_INVALID_ARGUMENT);                                     \
    char P[48];                                                                  \
    if (d->mig < 0)                                                              \
        snprintf(P, sizeof P, "gpu.%d.", d->gpu);                                \
    else                                                                         \
        snprintf(P, sizeof P, "gpu.%d.mig.%d.", d->gpu, d->mig);                 \
    {                                                                            \
        nvmlReturn_t e__ = enter(fn, d->gpu, d->mig);                            \
        if (e__ != NVML_SUCCESS) RETURN(e__);                                    \
    }                                                                            \
    /* after enter: the node file as of this call */                            \
    if (d->mig >= 0 && !migCurrent(d)) RETURN(NVML_ERROR_INVALID_ARGUMENT);

#define NEED(p) \
    if (!(p)) RETURN(NVML_ERROR_INVALID_ARGUMENT)

// U64 reads key P<key> into *out (as type T) or answers NOT_SUPPORTED.
#define U64(out, T, ...)                                          \
    do {                                                          \
        unsigned long long v__;                                   \
        if (!getU64(&v__, __VA_ARGS__)) RETURN(NVML_ERROR_NOT_SUPPORTED); \
        *(out) = (T)v__;                                          \
    } while (0)

static nvmlReturn_t copyString(const char *v, char *buf, unsigned int length) {
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(v) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, v);
    return NVML_SUCCESS;
}

// ---- init and system ------------------------------------------------------

static nvmlReturn_t doInit(void) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) {
        const char *p = getenv("FAKENVML_NODE");
        if (!p || !*p) {
            fprintf(stderr, "fakenvml: FAKENVML_NODE is not set: point it at a node file (see sim/fakenvml)\n");
            RETURN(NVML_ERROR_DRIVER_NOT_LOADED);
        }
        snprintf(nodePath, sizeof nodePath, "%s", p);
        memset(&nodeStat, 0, sizeof nodeStat);
        if (load(nodePath) != 0) RETURN(NVML_ERROR_DRIVER_NOT_LOADED);
        nextEvent = 0; // events already in the file were raised with no set: lost
        nextBurst = 0;
        afterLoad();
        const char *t = getenv("FAKENVML_TRACE");
        if (t && *t && !traceFile) traceFile = fopen(t, "a");
    }
    nvmlReturn_t r = enter("nvmlInit", -1, -1);
    if (r == NVML_SUCCESS && get("driver_unloaded")) r = NVML_ERROR_DRIVER_NOT_LOADED;
    if (r == NVML_SUCCESS) {
        if (initCount == 0) {
            initGeneration = 0;
            getU64(&initGeneration, "driver_generation");
        }
        initCount++;
    }
    RETURN(r);
}

nvmlReturn_t nvmlInit(void) { return doInit(); }
nvmlReturn_t nvmlInit_v2(void) { return doInit(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return doInit();
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    trace(__func__, -1, -1);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    initCount--;
    RETURN(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_NO_DATA: return "No data";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS_ENTER();
    RETURN(copyString(get("driver_version"), version, length));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS_ENTER();
    RETURN(copyString(get("nvml_version"), version, length));
}

static nvmlReturn_t cudaVersion(const char *fn, int *v) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t e = enter(fn, -1, -1);
    if (e != NVML_SUCCESS) RETURN(e);
    NEED(v);
    U64(v, int, "cuda_driver_version");
    RETURN(NVML_SUCCESS);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cudaVersion(__func__, v); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cudaVersion(__func__, v); }

static nvmlReturn_t getCount(const char *fn, unsigned int *n) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t e = enter(fn, -1, -1);
    if (e != NVML_SUCCESS) RETURN(e);
    NEED(n);
    *n = deviceCount();
    RETURN(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return getCount(__func__, n); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return getCount(__func__, n); }

static nvmlReturn_t byIndex(const char *fn, unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    NEED(device);
    if (index >= deviceCount()) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t e = enter(fn, (int)index, -1);
    // A lost GPU still has a handle; its calls fail. (An answer forced on
    // this function by ret.<symbol> is given as it is.)
    int lostOnly = e == NVML_ERROR_GPU_IS_LOST && get("gpu.%u.lost", index) && !get("gpu.%u.ret.%s", index, fn);
    if (e != NVML_SUCCESS && !lostOnly) RETURN(e);
    *device = gpuHandle((int)index);
    RETURN(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return byIndex(__func__, i, d); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return byIndex(__func__, i, d); }

static nvmlReturn_t byKey(const char *fn, const char *key, const char *want, nvmlDevice_t *device) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    NEED(want && device);
    nvmlReturn_t e = enter(fn, -1, -1);
    if (e != NVML_SUCCESS) RETURN(e);
    unsigned n = deviceCount();
    for (unsigned g = 0; g < n; g++) {
        const char *v = get("gpu.%u.%s", g, key);
        if (v && strcasecmp(v, want) == 0) {
            *device = gpuHandle((int)g);
            RETURN(NVML_SUCCESS);
        }
        if (strcmp(key, "uuid") == 0) {
            for (int m = 0; m < MAX_MIG; m++) {
                v = get("gpu.%u.mig.%d.uuid", g, m);
                if (v && strcmp(v, want) == 0) {
                    *device = migHandle((int)g, m);
                    RETURN(NVML_SUCCESS);
                }
            }
        }
    }
    RETURN(NVML_ERROR_NOT_FOUND);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) { return byKey(__func__, "uuid", uuid, d); }
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *s, nvmlDevice_t *d) { return byKey(__func__, "serial", s, d); }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) { return byKey(__func__, "pci.bus_id", b, d); }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d) { return byKey(__func__, "pci.bus_id", b, d); }

// ---- identity -------------------------------------------------------------

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER(device);
    RETURN(copyString(get("%sname", P), name, length));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER(device);
    RETURN(copyString(get("%suuid", P), uuid, length));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEV_ENTER(device);
    RETURN(copyString(get("%sserial", P), serial, length));
}

nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *part, unsigned int length) {
    DEV_ENTER(device);
    RETURN(copyString(get("%sboard_part_number", P), part, length));
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length) {
    DEV_ENTER(device);
    RETURN(copyString(get("%svbios_version", P), version, length));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_ENTER(device);
    NEED(minor);
    U64(minor, unsigned int, "%sminor", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER(device);
    NEED(index);
    if (d->mig < 0) {
        *index = (unsigned)d->gpu;
        RETURN(NVML_SUCCESS);
    }
    U64(index, unsigned int, "%sindex", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int *id) {
    DEV_ENTER(device);
    NEED(id);
    U64(id, unsigned int, "%sboard_id", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    DEV_ENTER(device);
    NEED(arch);
    U64(arch, nvmlDeviceArchitecture_t, "gpu.%d.architecture", d->gpu);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *brand) {
    DEV_ENTER(device);
    NEED(brand);
    U64(brand, nvmlBrandType_t, "gpu.%d.brand", d->gpu);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_ENTER(device);
    NEED(major && minor);
    unsigned long long v[2];
    if (parseList(get("gpu.%d.cuda_compute_capability", d->gpu), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *major = (int)v[0];
    *minor = (int)v[1];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    DEV_ENTER(device);
    NEED(mode);
    U64(mode, nvmlEnableState_t, "%spersistence_mode", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    DEV_ENTER(device);
    NEED(mode);
    U64(mode, nvmlComputeMode_t, "%scompute_mode", P);
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t pciInfo(const char *fn, nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER_FN(device, fn);
    NEED(pci);
    // MIG devices answer with their parent's PCI identity.
    const char *bus = get("gpu.%d.pci.bus_id", d->gpu);
    if (!bus) RETURN(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus);
    unsigned dom = 0, b = 0, dv = 0;
    sscanf(bus, "%x:%x:%x", &dom, &b, &dv);
    pci->domain = dom;
    pci->bus = b;
    pci->device = dv;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", dom, b, dv);
    unsigned long long v;
    if (getU64(&v, "gpu.%d.pci.device_id", d->gpu)) pci->pciDeviceId = (unsigned)v;
    if (getU64(&v, "gpu.%d.pci.subsystem_id", d->gpu)) pci->pciSubSystemId = (unsigned)v;
    RETURN(NVML_SUCCESS);
}
// The three versions share one layout; v1 and v2 fill less of it on real
// drivers, which no caller here relies on.
#define PCI_FN(name)                                                 \
    nvmlReturn_t name(nvmlDevice_t device, nvmlPciInfo_t *pci) {     \
        return pciInfo(#name, device, pci);                          \
    }
PCI_FN(nvmlDeviceGetPciInfo)
PCI_FN(nvmlDeviceGetPciInfo_v2)
PCI_FN(nvmlDeviceGetPciInfo_v3)

// ---- memory and utilization -----------------------------------------------

// memory reads P memory.{total,reserved,used}: used excludes reserved, as
// in nvmlMemory_v2_t.
static int memory(const char *P, unsigned long long *total, unsigned long long *reserved, unsigned long long *used) {
    *reserved = 0;
    if (!getU64(total, "%smemory.total", P) || !getU64(used, "%smemory.used", P)) return 0;
    getU64(reserved, "%smemory.reserved", P);
    return 1;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    DEV_ENTER(device);
    NEED(mem);
    unsigned long long total, reserved, used;
    if (!memory(P, &total, &reserved, &used)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    // v1 counts the driver's reserved memory as used.
    mem->total = total;
    mem->used = used + reserved;
    mem->free = total - mem->used;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    DEV_ENTER(device);
    NEED(mem);
    if (mem->version != nvmlMemory_v2) RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, reserved, used;
    if (!memory(P, &total, &reserved, &used)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = total - reserved - used;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    DEV_ENTER(device);
    NEED(bar1);
    unsigned long long v[2];
    if (parseList(get("%sbar1", P), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    bar1->bar1Total = v[0];
    bar1->bar1Used = v[1];
    bar1->bar1Free = v[0] - v[1];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_ENTER(device);
    NEED(u);
    unsigned long long v[2];
    if (parseList(get("%sutilization", P), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    u->gpu = (unsigned)v[0];
    u->memory = (unsigned)v[1];
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t codecUtil(const char *fn, const char *key, nvmlDevice_t device, unsigned int *u, unsigned int *period) {
    DEV_ENTER_FN(device, fn);
    NEED(u && period);
    unsigned long long v[2];
    if (parseList(get("%s%s", P, key), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *u = (unsigned)v[0];
    *period = (unsigned)v[1];
    RETURN(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *p) {
    return codecUtil(__func__, "encoder_utilization", device, u, p);
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *p) {
    return codecUtil(__func__, "decoder_utilization", device, u, p);
}

// ---- clocks, power, temperature ---------------------------------------------

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(device);
    NEED(clock);
    U64(clock, unsigned int, "%sclock.%d", P, (int)type);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    DEV_ENTER(device);
    NEED(clock);
    U64(clock, unsigned int, "%sclock_max.%d", P, (int)type);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t type, nvmlClockId_t id, unsigned int *mhz) {
    DEV_ENTER(device);
    NEED(mhz);
    const char *k = id == NVML_CLOCK_ID_CUSTOMER_BOOST_MAX ? "clock_max" : "clock";
    U64(mhz, unsigned int, "%s%s.%d", P, k, (int)type);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEV_ENTER(device);
    NEED(power);
    U64(power, unsigned int, "%spower.usage", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    NEED(limit);
    U64(limit, unsigned int, "%spower.limit", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    NEED(limit);
    U64(limit, unsigned int, "%spower.enforced_limit", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER(device);
    NEED(limit);
    U64(limit, unsigned int, "%spower.default_limit", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit, unsigned int *maxLimit) {
    DEV_ENTER(device);
    NEED(minLimit && maxLimit);
    unsigned long long v[2];
    if (parseList(get("%spower.limit_constraints", P), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *minLimit = (unsigned)v[0];
    *maxLimit = (unsigned)v[1];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    DEV_ENTER(device);
    NEED(energy);
    U64(energy, unsigned long long, "%senergy", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *p) {
    DEV_ENTER(device);
    NEED(p);
    U64(p, nvmlPstates_t, "%spstate", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *p) {
    DEV_ENTER(device);
    NEED(p);
    U64(p, nvmlPstates_t, "%spstate", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEV_ENTER(device);
    NEED(speed);
    U64(speed, unsigned int, "%sfan_speed", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    DEV_ENTER(device);
    NEED(temp);
    U64(temp, unsigned int, "%stemperature.%d", P, (int)sensor);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *t) {
    DEV_ENTER(device);
    NEED(t);
    if (t->version != nvmlTemperature_v1) RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    U64(&t->temperature, int, "%stemperature.%d", P, (int)t->sensorType);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t th, unsigned int *temp) {
    DEV_ENTER(device);
    NEED(temp);
    U64(temp, unsigned int, "%stemperature_threshold.%d", P, (int)th);
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t reasons(const char *fn, const char *key, nvmlDevice_t device, unsigned long long *r) {
    DEV_ENTER_FN(device, fn);
    NEED(r);
    U64(r, unsigned long long, "%s%s", P, key);
    RETURN(NVML_SUCCESS);
}
// The event and throttle names are one driver function under two names
// (R535 renamed it); a branch's version script decides which exist.
#define REASONS_FN(name, key) \
    nvmlReturn_t name(nvmlDevice_t device, unsigned long long *r) { return reasons(#name, key, device, r); }
REASONS_FN(nvmlDeviceGetCurrentClocksThrottleReasons, "clocks_event_reasons")
REASONS_FN(nvmlDeviceGetCurrentClocksEventReasons, "clocks_event_reasons")
REASONS_FN(nvmlDeviceGetSupportedClocksThrottleReasons, "supported_clocks_event_reasons")
REASONS_FN(nvmlDeviceGetSupportedClocksEventReasons, "supported_clocks_event_reasons")

// ---- PCIe -----------------------------------------------------------------

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.gen", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.width", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.max_gen", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.max_width", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.throughput.%d", P, (int)counter);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *v) {
    DEV_ENTER(device);
    NEED(v);
    U64(v, unsigned int, "%spcie.replay", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEV_ENTER(device);
    NEED(node);
    U64(node, unsigned int, "%snuma_node", P);
    RETURN(NVML_SUCCESS);
}

// ---- ECC, row remapping, retired pages --------------------------------------

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEV_ENTER(device);
    NEED(current && pending);
    unsigned long long v[2];
    if (parseList(get("%secc.mode", P), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *current = (nvmlEnableState_t)v[0];
    *pending = (nvmlEnableState_t)v[1];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t et, nvmlEccCounterType_t ct, unsigned long long *n) {
    DEV_ENTER(device);
    NEED(n);
    U64(n, unsigned long long, "%secc.%d.%d", P, (int)et, (int)ct);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t et, nvmlEccCounterType_t ct,
                                             nvmlMemoryLocation_t loc, unsigned long long *n) {
    DEV_ENTER(device);
    NEED(n);
    U64(n, unsigned long long, "%secc.%d.%d.%d", P, (int)et, (int)ct, (int)loc);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failed) {
    DEV_ENTER(device);
    NEED(corr && unc && pending && failed);
    unsigned long long v[4];
    if (parseList(get("%sremapped_rows", P), v, 4) != 4) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *corr = (unsigned)v[0];
    *unc = (unsigned)v[1];
    *pending = (unsigned)v[2];
    *failed = (unsigned)v[3];
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t device, nvmlRowRemapperHistogramValues_t *h) {
    DEV_ENTER(device);
    NEED(h);
    unsigned long long v[5];
    if (parseList(get("%sremapper_histogram", P), v, 5) != 5) RETURN(NVML_ERROR_NOT_SUPPORTED);
    h->max = (unsigned)v[0];
    h->high = (unsigned)v[1];
    h->partial = (unsigned)v[2];
    h->low = (unsigned)v[3];
    h->none = (unsigned)v[4];
    RETURN(NVML_SUCCESS);
}

#define MAX_PAGES 512
static nvmlReturn_t retired(const char *fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                            unsigned long long *addresses, unsigned long long *timestamps);
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                                       unsigned long long *addresses) {
    return retired(__func__, device, cause, count, addresses, NULL);
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                                          unsigned long long *addresses, unsigned long long *timestamps) {
    return retired(__func__, device, cause, count, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    DEV_ENTER(device);
    NEED(pending);
    U64(pending, nvmlEnableState_t, "%sretired_pages.pending", P);
    RETURN(NVML_SUCCESS);
}

// ---- NVLink ---------------------------------------------------------------

static int linkOK(const char *P, unsigned int link) {
    unsigned long long n;
    return getU64(&n, "%snvlink.count", P) && link < n;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    DEV_ENTER(device);
    NEED(active);
    unsigned long long n;
    if (!getU64(&n, "%snvlink.count", P)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (link >= n) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    U64(active, nvmlEnableState_t, "%snvlink.%u.state", P, link);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, nvmlNvLinkErrorCounter_t c,
                                             unsigned long long *v) {
    DEV_ENTER(device);
    NEED(v);
    if (!linkOK(P, link)) RETURN(get("%snvlink.count", P) ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    U64(v, unsigned long long, "%snvlink.%u.error.%d", P, link, (int)c);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    DEV_ENTER(device);
    NEED(pci);
    if (!linkOK(P, link)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    const char *bus = get("%snvlink.%u.remote_bus_id", P, link);
    if (!bus) RETURN(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus);
    RETURN(NVML_SUCCESS);
}

// ---- field values -----------------------------------------------------------

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    DEV_ENTER(device);
    NEED(values && count > 0);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        f->latencyUsec = 0;
        const char *v = get("%sfield.%u@%u", P, f->fieldId, f->scopeId);
        if (!v) v = get("%sfield.%u", P, f->fieldId);
        const char *r = get("%sfield.%u.ret", P, f->fieldId);
        unsigned long long x, max;
        if (getU64(&max, "field_max") && f->fieldId >= max) {
            f->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; // a field this driver's header does not know
        } else if (r) {
            f->nvmlReturn = parseCode(r);
        } else if (parseU64(v, &x)) {
            f->nvmlReturn = NVML_SUCCESS;
            unsigned long long t = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            getU64(&t, "%sfield.%u.type", P, f->fieldId);
            f->valueType = (nvmlValueType_t)t;
            memset(&f->value, 0, sizeof f->value);
            switch (f->valueType) {
            case NVML_VALUE_TYPE_UNSIGNED_INT: f->value.uiVal = (unsigned)x; break;
            case NVML_VALUE_TYPE_SIGNED_INT: f->value.siVal = (int)x; break;
            default: f->value.ullVal = x; break;
            }
        } else {
            f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    RETURN(NVML_SUCCESS);
}

// ---- MIG ------------------------------------------------------------------

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    DEV_ENTER(device);
    NEED(current && pending);
    if (d->mig >= 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long v[2];
    if (parseList(get("%smig_mode", P), v, 2) != 2) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned)v[0];
    *pending = (unsigned)v[1];
    RETURN(NVML_SUCCESS);
}

static int migEnabled(int gpu) {
    unsigned long long v[2];
    return parseList(get("gpu.%d.mig_mode", gpu), v, 2) == 2 && v[0] == NVML_DEVICE_MIG_ENABLE;
}

// gip.<index> = id sliceCount instanceCount multiprocessorCount copyEngineCount
//               decoderCount encoderCount jpegCount ofaCount memorySizeMB isP2pSupported
struct gipInfo {
    unsigned long long id, slices, instances, mp, ce, dec, enc, jpeg, ofa, memMB, p2p;
};

static int gipByIndex(int gpu, unsigned index, struct gipInfo *g) {
    unsigned long long v[11] = {0};
    if (parseList(get("gpu.%d.gip.%u", gpu, index), v, 11) < 10) return 0;
    memcpy(g, v, sizeof *g);
    return 1;
}

// gipByID finds a profile by its ID (which need not equal its index).
static int gipByID(int gpu, unsigned id, struct gipInfo *g, unsigned *index) {
    for (unsigned i = 0; i < NVML_GPU_INSTANCE_PROFILE_COUNT; i++) {
        if (gipByIndex(gpu, i, g) && g->id == id) {
            if (index) *index = i;
            return 1;
        }
    }
    return 0;
}

#define PROFILE_INFO_BODY(TINFO)                                              \
    info->id = (unsigned)g.id;                                                \
    info->sliceCount = (unsigned)g.slices;                                    \
    info->instanceCount = (unsigned)g.instances;                              \
    info->multiprocessorCount = (unsigned)g.mp;                               \
    info->copyEngineCount = (unsigned)g.ce;                                   \
    info->decoderCount = (unsigned)g.dec;                                     \
    info->encoderCount = (unsigned)g.enc;                                     \
    info->jpegCount = (unsigned)g.jpeg;                                       \
    info->ofaCount = (unsigned)g.ofa;                                         \
    info->memorySizeMB = g.memMB;

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info) {
    DEV_ENTER(device);
    NEED(info);
    if (d->mig >= 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct gipInfo g;
    if (!gipByIndex(d->gpu, profile, &g)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    PROFILE_INFO_BODY(nvmlGpuInstanceProfileInfo_t)
    info->isP2pSupported = (unsigned)g.p2p;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info) {
    DEV_ENTER(device);
    NEED(info);
    if (d->mig >= 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct gipInfo g;
    if (!gipByIndex(d->gpu, profile, &g)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    const char *name = get("gpu.%d.gip.%u.name", d->gpu, profile);
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        PROFILE_INFO_BODY(nvmlGpuInstanceProfileInfo_v2_t)
        info->isP2pSupported = (unsigned)g.p2p;
        snprintf(info->name, sizeof info->name, "%s", name ? name : "");
    } else if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        {
            nvmlGpuInstanceProfileInfo_v3_t *info = v3;
            PROFILE_INFO_BODY(nvmlGpuInstanceProfileInfo_v3_t)
            snprintf(info->name, sizeof info->name, "%s", name ? name : "");
            unsigned long long caps = 0;
            getU64(&caps, "gpu.%d.gip.%u.capabilities", d->gpu, profile);
            info->capabilities = (unsigned)caps;
        }
    } else {
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    RETURN(NVML_SUCCESS);
}

// placements reads gip.<index>.placements = "start:size start:size ...".
static int placements(int gpu, unsigned index, nvmlGpuInstancePlacement_t *out, int max) {
    unsigned long long v[64];
    int n = parseList(get("gpu.%d.gip.%u.placements", gpu, index), v, 64) / 2;
    if (n > max) n = max;
    for (int i = 0; i < n; i++) out[i] = (nvmlGpuInstancePlacement_t){(unsigned)v[2 * i], (unsigned)v[2 * i + 1]};
    return n;
}

static nvmlReturn_t possiblePlacements(const char *fn, nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstancePlacement_t *out, unsigned int *count);
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                        nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return possiblePlacements(__func__, device, profileId, out, count);
}
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    return possiblePlacements(__func__, device, profileId, out, count);
}

// gi.<id> = profileId start size
static int giInfo(int gpu, int id, unsigned long long v[3]) {
    return id >= 0 && id < MAX_GI && parseList(get("gpu.%d.gi.%d", gpu, id), v, 3) == 3;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId, unsigned int *count) {
    DEV_ENTER(device);
    NEED(count);
    if (d->mig >= 0 || !migEnabled(d->gpu)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    struct gipInfo g;
    unsigned index;
    if (!gipByID(d->gpu, profileId, &g, &index)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    // Free placements for the profile, capped by its per-GPU instance limit.
    nvmlGpuInstancePlacement_t pl[32];
    int n = placements(d->gpu, index, pl, 32);
    unsigned long long used = 0, same = 0, v[3];
    for (int id = 0; id < MAX_GI; id++) {
        if (!giInfo(d->gpu, id, v)) continue;
        for (unsigned long long s = v[1]; s < v[1] + v[2] && s < 64; s++) used |= 1ULL << s;
        if (v[0] == profileId) same++;
    }
    unsigned free = 0;
    unsigned long long taken = used;
    for (int i = 0; i < n; i++) {
        unsigned long long m = 0;
        for (unsigned s = pl[i].start; s < pl[i].start + pl[i].size && s < 64; s++) m |= 1ULL << s;
        if (!(taken & m)) {
            free++;
            taken |= m;
        }
    }
    unsigned left = g.instances > same ? (unsigned)(g.instances - same) : 0;
    *count = free < left ? free : left;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *out, unsigned int *count) {
    DEV_ENTER(device);
    NEED(out && count);
    if (d->mig >= 0 || !migEnabled(d->gpu)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    struct gipInfo g;
    if (!gipByID(d->gpu, profileId, &g, NULL)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    unsigned long long v[3];
    for (int id = 0; id < MAX_GI && n < g.instances; id++) {
        if (giInfo(d->gpu, id, v) && v[0] == profileId) out[n++] = (nvmlGpuInstance_t){&gis[d->gpu][id]};
    }
    *count = n;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gi) {
    DEV_ENTER(device);
    NEED(gi);
    if (d->mig >= 0 || !migEnabled(d->gpu)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long v[3];
    if (!giInfo(d->gpu, (int)id, v)) RETURN(NVML_ERROR_NOT_FOUND);
    *gi = (nvmlGpuInstance_t){&gis[d->gpu][id]};
    RETURN(NVML_SUCCESS);
}

// GI_ENTER starts a GPU instance function; the instance must still exist.
#define GI_ENTER(h_)                                                                  \
    pthread_mutex_lock(&mu);                                                          \
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);                             \
    struct nvmlGpuInstance_st *gi = (h_).handle;                                      \
    if (!IN(gis, gi) || gi->magic != MAGIC) RETURN(NVML_ERROR_INVALID_ARGUMENT);      \
    {                                                                                 \
        nvmlReturn_t e__ = enter(__func__, gi->gpu, -1);                              \
        if (e__ != NVML_SUCCESS) RETURN(e__);                                         \
    }                                                                                 \
    unsigned long long giv[3];                                                        \
    if (!giInfo(gi->gpu, gi->id, giv)) RETURN(NVML_ERROR_INVALID_ARGUMENT);

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    GI_ENTER(gpuInstance);
    NEED(info);
    info->device = gpuHandle(gi->gpu);
    info->id = (unsigned)gi->id;
    info->profileId = (unsigned)giv[0];
    info->placement = (nvmlGpuInstancePlacement_t){(unsigned)giv[1], (unsigned)giv[2]};
    RETURN(NVML_SUCCESS);
}

// gi.<g>.cip.<index> = id sliceCount instanceCount multiprocessorCount sharedCE sharedDec sharedEnc sharedJpeg sharedOfa
static int cipByIndex(int gpu, int g, unsigned index, unsigned long long v[9]) {
    return parseList(get("gpu.%d.gi.%d.cip.%u", gpu, g, index), v, 9) == 9;
}

#define CI_PROFILE_BODY                                 \
    info->id = (unsigned)v[0];                          \
    info->sliceCount = (unsigned)v[1];                  \
    info->instanceCount = (unsigned)v[2];               \
    info->multiprocessorCount = (unsigned)v[3];         \
    info->sharedCopyEngineCount = (unsigned)v[4];       \
    info->sharedDecoderCount = (unsigned)v[5];          \
    info->sharedEncoderCount = (unsigned)v[6];          \
    info->sharedJpegCount = (unsigned)v[7];             \
    info->sharedOfaCount = (unsigned)v[8];

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile, nvmlComputeInstanceProfileInfo_t *info) {
    GI_ENTER(gpuInstance);
    NEED(info);
    (void)engProfile;
    unsigned long long v[9];
    if (!cipByIndex(gi->gpu, gi->id, profile, v)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    CI_PROFILE_BODY
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile, nvmlComputeInstanceProfileInfo_v2_t *info) {
    GI_ENTER(gpuInstance);
    NEED(info);
    (void)engProfile;
    unsigned long long v[9];
    if (!cipByIndex(gi->gpu, gi->id, profile, v)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (info->version != nvmlComputeInstanceProfileInfo_v2 && info->version != nvmlComputeInstanceProfileInfo_v3)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    CI_PROFILE_BODY
    const char *name = get("gpu.%d.gi.%d.cip.%u.name", gi->gpu, gi->id, profile);
    snprintf(info->name, sizeof info->name, "%s", name ? name : "");
    if (info->version == nvmlComputeInstanceProfileInfo_v3) ((nvmlComputeInstanceProfileInfo_v3_t *)info)->capabilities = 0;
    RETURN(NVML_SUCCESS);
}

// gi.<g>.ci.<id> = profileId start size
static int ciInfo(int gpu, int g, int id, unsigned long long v[3]) {
    return id >= 0 && id < MAX_CI && parseList(get("gpu.%d.gi.%d.ci.%d", gpu, g, id), v, 3) == 3;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *out, unsigned int *count) {
    GI_ENTER(gpuInstance);
    NEED(out && count);
    unsigned n = 0;
    unsigned long long v[3];
    for (int id = 0; id < MAX_CI; id++) {
        if (ciInfo(gi->gpu, gi->id, id, v) && v[0] == profileId) out[n++] = (nvmlComputeInstance_t){&cis[gi->gpu][gi->id][id]};
    }
    *count = n;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id, nvmlComputeInstance_t *ci) {
    GI_ENTER(gpuInstance);
    NEED(ci);
    unsigned long long v[3];
    if (!ciInfo(gi->gpu, gi->id, (int)id, v)) RETURN(NVML_ERROR_NOT_FOUND);
    *ci = (nvmlComputeInstance_t){&cis[gi->gpu][gi->id][id]};
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t ciGetInfo(const char *fn, nvmlComputeInstance_t handle, nvmlComputeInstanceInfo_t *info) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    struct nvmlComputeInstance_st *ci = handle.handle;
    if (!IN(cis, ci) || ci->magic != MAGIC) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t e = enter(fn, ci->gpu, -1);
    if (e != NVML_SUCCESS) RETURN(e);
    NEED(info);
    unsigned long long v[3];
    if (!ciInfo(ci->gpu, ci->gi, ci->id, v)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    info->device = gpuHandle(ci->gpu);
    info->gpuInstance = (nvmlGpuInstance_t){&gis[ci->gpu][ci->gi]};
    info->id = (unsigned)ci->id;
    info->profileId = (unsigned)v[0];
    info->placement = (nvmlComputeInstancePlacement_t){(unsigned)v[1], (unsigned)v[2]};
    RETURN(NVML_SUCCESS);
}
nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) { return ciGetInfo(__func__, ci, info); }
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) { return ciGetInfo(__func__, ci, info); }

// MIG device handles: mig.<m>.gi and mig.<m>.ci name the instances behind them.
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEV_ENTER(device);
    NEED(count);
    if (d->mig >= 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long n = 0;
    getU64(&n, "%smig_max", P);
    *count = n > MAX_MIG ? MAX_MIG : (unsigned)n;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    DEV_ENTER(device);
    NEED(mig);
    if (d->mig >= 0) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!migEnabled(d->gpu)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (index >= MAX_MIG) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!get("gpu.%d.mig.%u.gi", d->gpu, index)) RETURN(NVML_ERROR_NOT_FOUND);
    *mig = migHandle(d->gpu, (int)index);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device, nvmlDevice_t *parent) {
    DEV_ENTER(device);
    NEED(parent);
    if (d->mig < 0) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *parent = gpuHandle(d->gpu);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig) {
    DEV_ENTER(device);
    NEED(isMig);
    *isMig = d->mig >= 0;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEV_ENTER(device);
    NEED(id);
    if (d->mig < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    U64(id, unsigned int, "%sgi", P);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEV_ENTER(device);
    NEED(id);
    if (d->mig < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    U64(id, unsigned int, "%sci", P);
    RETURN(NVML_SUCCESS);
}

// attributes = multiprocessorCount sharedCE sharedDec sharedEnc sharedJpeg sharedOfa giSlices ciSlices memorySizeMB
static nvmlReturn_t attributes(const char *fn, nvmlDevice_t device, nvmlDeviceAttributes_t *a) {
    DEV_ENTER_FN(device, fn);
    NEED(a);
    unsigned long long v[9];
    if (parseList(get("%sattributes", P), v, 9) != 9) RETURN(NVML_ERROR_NOT_SUPPORTED);
    *a = (nvmlDeviceAttributes_t){(unsigned)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                                  (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], v[8]};
    RETURN(NVML_SUCCESS);
}
#define ATTR_FN(name) \
    nvmlReturn_t name(nvmlDevice_t device, nvmlDeviceAttributes_t *a) { return attributes(#name, device, a); }
ATTR_FN(nvmlDeviceGetAttributes)
ATTR_FN(nvmlDeviceGetAttributes_v2)

// ---- processes --------------------------------------------------------------

// processes.<kind> = pid:usedBytes:gi:ci ... (gi/ci 4294967295 off MIG)
#define MAX_PROCS 64
static int procList(const char *P, const char *kind, unsigned long long v[4 * MAX_PROCS]) {
    const char *s = get("%sprocesses.%s", P, kind);
    if (!s) return -1;
    return parseList(s, v, 4 * MAX_PROCS) / 4;
}

#define PROC_FN(name, kind, T, EXTRA)                                                   \
    nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, T *infos) {             \
        DEV_ENTER(device);                                                              \
        NEED(count);                                                                    \
        unsigned long long v[4 * MAX_PROCS];                                            \
        int n = procList(P, kind, v);                                                   \
        if (n < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);                                    \
        if (*count < (unsigned)n || (!infos && n > 0)) {                                \
            *count = (unsigned)n;                                                       \
            RETURN(NVML_ERROR_INSUFFICIENT_SIZE);                                       \
        }                                                                               \
        for (int i = 0; i < n; i++) {                                                   \
            memset(&infos[i], 0, sizeof infos[i]);                                      \
            infos[i].pid = (unsigned)v[4 * i];                                          \
            infos[i].usedGpuMemory = v[4 * i + 1];                                      \
            EXTRA                                                                       \
        }                                                                               \
        *count = (unsigned)n;                                                           \
        RETURN(NVML_SUCCESS);                                                           \
    }
#define PROC_IDS                                      \
    infos[i].gpuInstanceId = (unsigned)v[4 * i + 2];  \
    infos[i].computeInstanceId = (unsigned)v[4 * i + 3];

PROC_FN(nvmlDeviceGetComputeRunningProcesses, "compute", nvmlProcessInfo_v1_t, )
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v2, "compute", nvmlProcessInfo_v2_t, PROC_IDS)
PROC_FN(nvmlDeviceGetComputeRunningProcesses_v3, "compute", nvmlProcessInfo_t, PROC_IDS)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses, "graphics", nvmlProcessInfo_v1_t, )
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, "graphics", nvmlProcessInfo_v2_t, PROC_IDS)
PROC_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, "graphics", nvmlProcessInfo_t, PROC_IDS)
PROC_FN(nvmlDeviceGetMPSComputeRunningProcesses, "mps", nvmlProcessInfo_v1_t, )
PROC_FN(nvmlDeviceGetMPSComputeRunningProcesses_v2, "mps", nvmlProcessInfo_v2_t, PROC_IDS)
PROC_FN(nvmlDeviceGetMPSComputeRunningProcesses_v3, "mps", nvmlProcessInfo_t, PROC_IDS)

// process_utilization = pid:timestampUs:sm:mem:enc:dec:jpg:ofa ...
static int utilList(const char *P, unsigned long long v[8 * MAX_PROCS]) {
    const char *s = get("%sprocess_utilization", P);
    if (!s) return -1;
    return parseList(s, v, 8 * MAX_PROCS) / 8;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *out, unsigned int *count,
                                             unsigned long long lastSeen) {
    DEV_ENTER(device);
    NEED(count);
    unsigned long long v[8 * MAX_PROCS];
    int all = utilList(P, v);
    if (all < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    int n = 0;
    for (int i = 0; i < all; i++) n += v[8 * i + 1] > lastSeen;
    if (n == 0) {
        *count = 0;
        RETURN(NVML_ERROR_NOT_FOUND); // no samples since lastSeen, as the driver says
    }
    if (!out || *count < (unsigned)n) {
        *count = (unsigned)n;
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    int k = 0;
    for (int i = 0; i < all; i++) {
        unsigned long long *s = &v[8 * i];
        if (s[1] <= lastSeen) continue;
        out[k++] = (nvmlProcessUtilizationSample_t){(unsigned)s[0], s[1], (unsigned)s[2], (unsigned)s[3], (unsigned)s[4], (unsigned)s[5]};
    }
    *count = (unsigned)k;
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *info) {
    DEV_ENTER(device);
    NEED(info);
    if (info->version != nvmlProcessesUtilizationInfo_v1) RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long v[8 * MAX_PROCS];
    int all = utilList(P, v);
    if (all < 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    int n = 0;
    for (int i = 0; i < all; i++) n += v[8 * i + 1] > info->lastSeenTimeStamp;
    if (!info->procUtilArray || info->processSamplesCount < (unsigned)n) {
        info->processSamplesCount = (unsigned)n;
        RETURN(n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    int k = 0;
    for (int i = 0; i < all; i++) {
        unsigned long long *s = &v[8 * i];
        if (s[1] <= info->lastSeenTimeStamp) continue;
        info->procUtilArray[k++] = (nvmlProcessUtilizationInfo_v1_t){s[1], (unsigned)s[0], (unsigned)s[2], (unsigned)s[3],
                                                                     (unsigned)s[4], (unsigned)s[5], (unsigned)s[6], (unsigned)s[7]};
    }
    info->processSamplesCount = (unsigned)k;
    RETURN(NVML_SUCCESS);
}

// ---- events ---------------------------------------------------------------

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    SYS_ENTER();
    NEED(set);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!sets[i].used) {
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].magic = MAGIC;
            sets[i].used = 1;
            *set = (nvmlEventSet_t){&sets[i]};
            RETURN(NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_INSUFFICIENT_RESOURCES);
}

// supportedEvents: XIDs, and ECC events where ECC is on (nvml.h,
// nvmlDeviceRegisterEvents: "ECC events are available only on ECC-enabled
// devices"), unless supported_events says otherwise.
static unsigned long long supportedEvents(int gpu) {
    unsigned long long v = nvmlEventTypeXidCriticalError, mode[2];
    if (parseList(get("gpu.%d.ecc.mode", gpu), mode, 2) == 2 && mode[0] == NVML_FEATURE_ENABLED)
        v |= nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    getU64(&v, "gpu.%d.supported_events", gpu);
    return v;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    DEV_ENTER(device);
    NEED(types);
    *types = supportedEvents(d->gpu);
    RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    DEV_ENTER(device);
    struct nvmlEventSet_st *s = set.handle;
    if (!IN(sets, s) || s->magic != MAGIC || !s->used) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~supportedEvents(d->gpu)) RETURN(NVML_ERROR_NOT_SUPPORTED);
    s->mask[d->gpu] |= types;
    RETURN(NVML_SUCCESS);
}

// afterLoad runs under mu each time the node file was (re)read: a driver
// that went away uninitialises the library, and events new in the file are
// raised.
static void afterLoad(void) {
    if (initCount > 0) {
        unsigned long long gen = 0;
        getU64(&gen, "driver_generation");
        if (gen != initGeneration || get("driver_unloaded")) {
            trace("driver-reload", -1, -1);
            initCount = 0;
            for (int i = 0; i < MAX_SETS; i++) sets[i].used = 0;
        }
    }
    // event.<n> = gpu type data [gpuInstanceId computeInstanceId]: each set
    // registered for the GPU and type now gets a copy; with none it is lost.
    for (;;) {
        unsigned long long v[5];
        int n = parseList(get("event.%llu", nextEvent), v, 5);
        if (n < 3) break;
        nextEvent++;
        raiseEvent(v, n);
    }
    for (; nextBurst < MAX_BURSTS; nextBurst++) {
        if (parseList(get("burst.%u", nextBurst), bursts[nextBurst].v, 5) != 5) break;
        clock_gettime(CLOCK_MONOTONIC, &bursts[nextBurst].start);
        bursts[nextBurst].sent = 0;
    }
}

// raiseEvent delivers an event (v: gpu type data [gi ci], n of them given) to
// every set registered for its GPU and type now; with none it is lost.
static void raiseEvent(const unsigned long long v[5], int n) {
    int gpu = (int)v[0];
    int delivered = 0;
    for (int i = 0; gpu >= 0 && gpu < MAX_GPUS && i < MAX_SETS; i++) {
        struct nvmlEventSet_st *s = &sets[i];
        if (!s->used || !(s->mask[gpu] & v[1]) || s->tail - s->head >= MAX_QUEUED) continue;
        unsigned slot = s->tail++ % MAX_QUEUED;
        memcpy(s->queue[slot], v, 5 * sizeof v[0]);
        s->queued[slot] = n;
        delivered = 1;
    }
    if (!delivered) trace("event-lost", gpu, (int)v[2]);
}

// burstDue delivers, of each burst, the next event that fell due, if any.
static void burstDue(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (unsigned i = 0; i < nextBurst; i++) {
        unsigned long long *v = bursts[i].v, every = v[4] ? v[4] : 1;
        long long us = (long long)(now.tv_sec - bursts[i].start.tv_sec) * 1000000 +
                       (now.tv_nsec - bursts[i].start.tv_nsec) / 1000;
        unsigned long long due = us < 0 ? 1 : (unsigned long long)us / every + 1;
        if (due > v[3]) due = v[3];
        if (bursts[i].sent < due) {
            bursts[i].sent++;
            raiseEvent(v, 3);
        }
    }
}

// lostGPU says whether a GPU the set is registered for fell off the bus.
static int lostGPU(const struct nvmlEventSet_st *s) {
    for (int g = 0; g < MAX_GPUS; g++) {
        if (s->mask[g] && get("gpu.%d.lost", g)) return 1;
    }
    return 0;
}

// Events queued in the set come first, in order; then a lost GPU among those
// registered makes the wait answer GPU_IS_LOST (the set is no use until it
// is re-created without that GPU).
static nvmlReturn_t waitEvent(const char *fn, nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    pthread_mutex_lock(&mu);
    if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
    struct nvmlEventSet_st *s = set.handle;
    if (!IN(sets, s) || s->magic != MAGIC || !s->used) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    NEED(data);
    nvmlReturn_t e = enter(fn, -1, -1);
    if (e != NVML_SUCCESS) RETURN(e);
    long waited = 0;
    for (;;) {
        reload();
        if (initCount == 0) RETURN(NVML_ERROR_UNINITIALIZED);
        if (!s->used) RETURN(NVML_ERROR_INVALID_ARGUMENT); // freed under us
        burstDue();
        if (s->head != s->tail) {
            unsigned slot = s->head++ % MAX_QUEUED;
            unsigned long long *v = s->queue[slot];
            int n = s->queued[slot];
            memset(data, 0, sizeof *data);
            data->device = gpuHandle((int)v[0]);
            data->eventType = v[1];
            data->eventData = v[2];
            data->gpuInstanceId = n >= 4 ? (unsigned)v[3] : 0xFFFFFFFFu;
            data->computeInstanceId = n >= 5 ? (unsigned)v[4] : 0xFFFFFFFFu;
            RETURN(NVML_SUCCESS);
        }
        if (lostGPU(s)) RETURN(NVML_ERROR_GPU_IS_LOST);
        if (waited >= (long)timeoutms) RETURN(NVML_ERROR_TIMEOUT);
        long step = (long)timeoutms - waited < 10 ? (long)timeoutms - waited : 10;
        pthread_mutex_unlock(&mu);
        sleepMS(step);
        pthread_mutex_lock(&mu);
        waited += step;
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return waitEvent(__func__, set, data, timeoutms);
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return waitEvent(__func__, set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    SYS_ENTER();
    struct nvmlEventSet_st *s = set.handle;
    if (!IN(sets, s) || s->magic != MAGIC || !s->used) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    s->used = 0;
    RETURN(NVML_SUCCESS);
}

// ---- shared bodies declared above -------------------------------------------

static nvmlReturn_t possiblePlacements(const char *fn, nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    DEV_ENTER_FN(device, fn);
    NEED(count);
    if (d->mig >= 0) RETURN(NVML_ERROR_NOT_SUPPORTED);
    struct gipInfo g;
    unsigned index;
    if (!gipByID(d->gpu, profileId, &g, &index)) RETURN(NVML_ERROR_INVALID_ARGUMENT);
    nvmlGpuInstancePlacement_t pl[32];
    int n = placements(d->gpu, index, pl, 32);
    if (!out) {
        *count = (unsigned)n;
        RETURN(NVML_SUCCESS);
    }
    if (*count < (unsigned)n) {
        *count = (unsigned)n;
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    memcpy(out, pl, (size_t)n * sizeof *pl);
    *count = (unsigned)n;
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t retired(const char *fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                            unsigned long long *addresses, unsigned long long *timestamps) {
    DEV_ENTER_FN(device, fn);
    NEED(count);
    const char *s = get("%sretired_pages.%d", P, (int)cause);
    if (!s) RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long v[MAX_PAGES];
    int n = parseList(s, v, MAX_PAGES);
    if (*count < (unsigned)n || (!addresses && n > 0)) {
        *count = (unsigned)n;
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (int i = 0; i < n; i++) {
        addresses[i] = v[i];
        if (timestamps) timestamps[i] = 0;
    }
    *count = (unsigned)n;
    RETURN(NVML_SUCCESS);
}
