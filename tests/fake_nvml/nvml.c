/* A stand-in for NVIDIA's libnvidia-ml.so.1 with the calls tracklake's system metrics make
 * through pynvml, so that the official binding runs its real code on a machine without a GPU.
 * FAKE_NVML_GPUS sets the number of GPUs (default 2); FAKE_NVML_HANG=1 makes the utilisation
 * call block for ever, as a hung driver does. Values: GPU i is 40+i % busy, 1 GiB of 8 GiB used. */
#include <stdlib.h>
#include <unistd.h>

typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } memory_t;

static unsigned int count(void) {
    const char *n = getenv("FAKE_NVML_GPUS");
    return n ? (unsigned int)atoi(n) : 2;
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int result) { (void)result; return "fake NVML error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = count(); return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **handle) {
    if (i >= count()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *handle = (void *)(unsigned long)(i + 1);
    return 0;
}
static unsigned int index_of(void *handle) { return (unsigned int)(unsigned long)handle - 1; }
int nvmlDeviceGetUtilizationRates(void *handle, util_t *u) {
    const char *hang = getenv("FAKE_NVML_HANG");
    while (hang && hang[0] == '1') pause();
    u->gpu = 40 + index_of(handle);
    u->memory = 10;
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, memory_t *m) {
    (void)handle;
    m->total = 8ULL << 30;
    m->used = 1ULL << 30;
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *t) {
    (void)sensor;
    *t = 60 + index_of(handle);
    return 0;
}
int nvmlDeviceGetPowerUsage(void *handle, unsigned int *milliwatts) {
    (void)handle;
    *milliwatts = 250000;
    return 0;
}
int nvmlDeviceGetClockInfo(void *handle, int type, unsigned int *mhz) {
    (void)handle;
    *mhz = type == 2 ? 9000 : 1800; /* NVML_CLOCK_MEM is 2, NVML_CLOCK_SM 1 */
    return 0;
}
