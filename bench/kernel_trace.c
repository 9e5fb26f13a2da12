// A kernel timeline of any CUDA process, without Nsight Systems (the GPU machine has none): a library the CUDA
// driver loads through CUDA_INJECTION64_PATH, which records every kernel, memset and memcpy with CUPTI's
// activity API (GPU timestamps, stream, grid) and writes them as CSV when the process exits.
//
//   CUDA_INJECTION64_PATH=libkiln_kernel_trace.so KILN_TRACE_OUT=trace.csv ./build-gpu/kiln train ...
//
// bench/kernel_trace.sh builds it against the CUPTI it finds and runs bench/kernel_trace_report.py on the CSV.
// Why this and not the trainer's own per-op table (CUDA events around each op): the events serialise the
// streams and add their own gaps, so they cannot show what overlaps or where the GPU sits idle; CUPTI's
// records are taken by the hardware and leave the launches as they were.
//
// CUPTI's record structs carry a version in their name (CUpti_ActivityKernel9, ...); the records CUPTI hands out
// are its newest, so the build passes the newest names its header declares (KT_KERNEL, KT_MEMCPY, KT_MEMSET).
// The fields read here exist in every version.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KT_KERNEL
#error "define KT_KERNEL (the newest CUpti_ActivityKernelN of the CUPTI header); bench/kernel_trace.sh does"
#endif
#ifndef KT_MEMCPY
#error "define KT_MEMCPY (the newest CUpti_ActivityMemcpyN); bench/kernel_trace.sh does"
#endif
#ifndef KT_MEMSET
#error "define KT_MEMSET (the newest CUpti_ActivityMemsetN); bench/kernel_trace.sh does"
#endif

enum { KT_BUF = 16 << 20 };

static FILE *g_out;
static unsigned long long g_dropped;

static void report(const char *what, CUptiResult r) {
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kernel_trace: %s: %s\n", what, s ? s : "unknown CUPTI error");
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

// One line a record: kind, start and end (ns, CUPTI's clock: the GPU's records are converted to it), stream
// (an API call's host thread), correlation id (a launch's and its API call's are equal), then per kind: a
// kernel's grid and block sizes, registers and dynamic shared memory, and its (mangled) name last, since it is
// the one field that may hold commas once demangled; a memset's or memcpy's bytes; an API call's name.
static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (g_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const KT_KERNEL *k = (const KT_KERNEL *)r;
            fprintf(g_out, "kernel,%llu,%llu,%u,%u,%d,%d,%d,%d,%d,%d,%u,%d,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->correlationId, k->gridX, k->gridY, k->gridZ,
                    k->blockX, k->blockY, k->blockZ, (unsigned)k->registersPerThread, k->dynamicSharedMemory,
                    k->name ? k->name : "?");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const KT_MEMSET *m = (const KT_MEMSET *)r;
            fprintf(g_out, "memset,%llu,%llu,%u,%u,%llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId, m->correlationId, (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const KT_MEMCPY *m = (const KT_MEMCPY *)r;
            fprintf(g_out, "memcpy%u,%llu,%llu,%u,%u,%llu\n", (unsigned)m->copyKind, (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->correlationId, (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *name = NULL;
            cuptiGetCallbackName(r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                       : CUPTI_CB_DOMAIN_DRIVER_API,
                                 a->cbid, &name);
            fprintf(g_out, "api,%llu,%llu,%u,%u,%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    a->threadId, a->correlationId, name ? name : "?");
            break;
        }
        default:
            break;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
    free(buf);
}

static void finish(void) {
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS) report("flush at exit", r);
    if (!g_out) return;
    if (g_dropped) fprintf(stderr, "kernel_trace: CUPTI dropped %llu records\n", g_dropped);
    // the data is a measurement's by-product: a failed close is reported, there is nothing to keep safe
    if (fclose(g_out) != 0) perror("kernel_trace: closing the trace");
    g_out = NULL;
}

// The entry point the CUDA driver calls when CUDA_INJECTION64_PATH names this library
int InitializeInjection(void) {
    const char *path = getenv("KILN_TRACE_OUT");
    if (!path || !*path) path = "kiln_trace.csv";
    g_out = fopen(path, "w");
    if (!g_out) {
        perror(path);
        return 0;
    }
    fprintf(g_out, "kind,start_ns,end_ns,stream,correlation,...\n");
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        report("registering the buffer callbacks", r);
        return 0;
    }
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                        CUPTI_ACTIVITY_KIND_MEMCPY};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if ((r = cuptiActivityEnable(kinds[i])) != CUPTI_SUCCESS) report("enabling an activity kind", r);
    // KILN_TRACE_API=1: the host's CUDA runtime and driver calls too (their start and end on the host), to see
    // what the host was doing during the GPU's idle gaps; it adds its own cost to every call
    const char *api = getenv("KILN_TRACE_API");
    if (api && !strcmp(api, "1"))
        for (int k = 0; k < 2; k++)
            if ((r = cuptiActivityEnable(k ? CUPTI_ACTIVITY_KIND_DRIVER : CUPTI_ACTIVITY_KIND_RUNTIME)) != CUPTI_SUCCESS)
                report("enabling API records", r);
    atexit(finish);
    return 1;
}
