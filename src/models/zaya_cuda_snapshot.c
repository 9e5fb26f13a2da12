/* The CUDA trainer's checkpoint snapshot and its stream to the shard file
 * (include/kiln/zaya_cuda_snapshot.h). */
#include <stdlib.h>
#include <string.h>

#include "kiln/cuda.h"
#include "kiln/zaya_cuda_snapshot.h"

#ifndef KILN_HAVE_CUDA

#define NOCUDA return kiln_errorf(KILN_EINVAL, "the checkpoint snapshot on CUDA: kiln was built without CUDA")
kiln_error *kiln_zaya_cuda_snap_create(kiln_zaya_cuda *g, kiln_zaya_cuda_opt *o, const kiln_zaya *m,
                                       const kiln_opt_param *op, int first, int last, size_t chunk_bytes,
                                       kiln_zaya_cuda_snap **out) {
    (void)g, (void)o, (void)m, (void)op, (void)first, (void)last, (void)chunk_bytes;
    *out = NULL;
    NOCUDA;
}
void kiln_zaya_cuda_snap_free(kiln_zaya_cuda_snap *s) { (void)s; }
kiln_error *kiln_zaya_cuda_snap_take(kiln_zaya_cuda_snap *s, int copy, kiln_snap_place place) {
    (void)s, (void)copy, (void)place;
    NOCUDA;
}
const char *kiln_zaya_cuda_snap_where(const kiln_zaya_cuda_snap *s) { (void)s; return "none"; }
uint64_t kiln_zaya_cuda_snap_bytes(const kiln_zaya_cuda_snap *s) { (void)s; return 0; }
kiln_error *kiln_zaya_cuda_snap_read_begin(kiln_zaya_cuda_snap *s) { (void)s; NOCUDA; }
kiln_error *kiln_zaya_cuda_snap_read(void *s, const void **data, size_t *len) {
    (void)s, (void)data, (void)len;
    NOCUDA;
}
void kiln_zaya_cuda_snap_read_end(kiln_zaya_cuda_snap *s) { (void)s; }

#else

#include <cuda_runtime.h>

#define SNAP_CU(call, what)                                                                                       \
    do {                                                                                                          \
        cudaError_t ce_ = (call);                                                                                 \
        if (ce_ != cudaSuccess)                                                                                   \
            return kiln_errorf(KILN_EIO, "checkpoint snapshot: %s: %s (%s)", (what), cudaGetErrorString(ce_), #call); \
    } while (0)

/* One piece of the file's data section: `n` floats at float offset `off` of block 0 (the owned
 * parameters in the device layout, padding between tensors included) or block 1 (the optimizer state). */
typedef struct {
    int block;
    size_t off, n;
} seg;

typedef enum { AT_NONE = 0, AT_LIVE, AT_DEVICE, AT_PINNED, AT_PAGEABLE } snap_at;

struct kiln_zaya_cuda_snap {
    kiln_zaya_cuda *g;
    kiln_zaya_cuda_opt *o;
    int dev;
    size_t param_off; /* device offset of the first owned tensor */
    size_t nparam;    /* floats of block 0 */
    size_t nstate;    /* floats of block 1 */
    seg *segs;
    int nsegs;
    uint64_t total; /* bytes of the stream */
    size_t chunk;
    cudaStream_t copy_st, d2h_st;
    cudaEvent_t ready, copied, landed[2];
    float *dsnap; /* device snapshot: block 0 then block 1 */
    float *hsnap; /* host snapshot (pinned or pageable), the same layout */
    int hsnap_pinned;
    unsigned char *pin[2]; /* the stream's pinned chunks */
    snap_at at;
    /* the reader */
    const unsigned char *base[2]; /* the blocks of the snapshot being read */
    int on_device;
    int cur_seg;
    size_t cur_off;            /* bytes into segs[cur_seg] */
    uint64_t issued, returned; /* chunks (device) */
    size_t chunk_len[2];
    uint64_t nchunks, handed; /* bytes handed out */
};

static kiln_error *chunks_alloc(kiln_zaya_cuda_snap *s);

kiln_error *kiln_zaya_cuda_snap_create(kiln_zaya_cuda *g, kiln_zaya_cuda_opt *o, const kiln_zaya *m,
                                       const kiln_opt_param *op, int first, int last, size_t chunk_bytes,
                                       kiln_zaya_cuda_snap **out) {
    *out = NULL;
    kiln_zaya_cuda_snap *s = calloc(1, sizeof *s);
    if (!s) return kiln_errorf(KILN_ENOMEM, "checkpoint snapshot");
    s->g = g, s->o = o;
    s->chunk = chunk_bytes ? (chunk_bytes + 3) / 4 * 4 : (size_t)256 << 20;
    s->param_off = kiln_zaya_cuda_param_offset(g, first);
    s->nparam = kiln_zaya_cuda_param_offset(g, last) - s->param_off;
    s->segs = calloc((size_t)(2 * (last - first) + 1), sizeof *s->segs);
    kiln_error *e = s->segs ? NULL : kiln_errorf(KILN_ENOMEM, "checkpoint snapshot");
    for (int t = first; !e && t < last; t++) {
        const size_t n = (size_t)m->params[t].numel, ns = (size_t)kiln_optim_state_numel(&op[t]);
        s->segs[s->nsegs++] = (seg){0, kiln_zaya_cuda_param_offset(g, t) - s->param_off, n};
        s->segs[s->nsegs++] = (seg){1, s->nstate, ns};
        s->nstate += ns;
        s->total += 4 * (uint64_t)(n + ns);
    }
    /* a small model needs no more than its own size (a multiple of 4 bytes) */
    if (s->chunk > s->total) s->chunk = s->total ? (size_t)s->total : 4;
    if (!e && s->nstate != kiln_zaya_cuda_opt_state_numel(o))
        e = kiln_errorf(KILN_EINVAL, "checkpoint snapshot: %zu optimizer-state floats for tensors %d..%d, the optimizer "
                        "holds %zu", s->nstate, first, last - 1, kiln_zaya_cuda_opt_state_numel(o));
    cudaError_t ce = cudaGetDevice(&s->dev);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&s->copy_st, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&s->d2h_st, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming);
    /* the writer's thread sleeps on these rather than spinning a core */
    for (int i = 0; i < 2 && ce == cudaSuccess; i++)
        ce = cudaEventCreateWithFlags(&s->landed[i], cudaEventDisableTiming | cudaEventBlockingSync);
    if (!e && ce != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "checkpoint snapshot: streams and events: %s", cudaGetErrorString(ce));
    /* pinning 2 x 256 MiB takes ~0.1-0.2 s: here rather than in the first save (retried there if it fails) */
    if (!e) kiln_error_free(chunks_alloc(s));
    if (e) {
        kiln_zaya_cuda_snap_free(s);
        return e;
    }
    *out = s;
    return NULL;
}

void kiln_zaya_cuda_snap_free(kiln_zaya_cuda_snap *s) {
    if (!s) return;
    if (s->copy_st) cudaStreamSynchronize(s->copy_st);
    if (s->d2h_st) cudaStreamSynchronize(s->d2h_st);
    cudaFree(s->dsnap);
    if (s->hsnap_pinned) cudaFreeHost(s->hsnap);
    else free(s->hsnap);
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(s->pin[i]);
        if (s->landed[i]) cudaEventDestroy(s->landed[i]);
    }
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->copied) cudaEventDestroy(s->copied);
    if (s->copy_st) cudaStreamDestroy(s->copy_st);
    if (s->d2h_st) cudaStreamDestroy(s->d2h_st);
    free(s->segs);
    free(s);
}

const char *kiln_zaya_cuda_snap_where(const kiln_zaya_cuda_snap *s) {
    static const char *const names[] = {"none", "live", "device", "pinned host", "pageable host"};
    return names[s->at];
}

uint64_t kiln_zaya_cuda_snap_bytes(const kiln_zaya_cuda_snap *s) { return s->total; }

/* The stream's two pinned chunks, once. */
static kiln_error *chunks_alloc(kiln_zaya_cuda_snap *s) {
    for (int i = 0; i < 2; i++)
        if (!s->pin[i]) {
            cudaError_t ce = cudaHostAlloc((void **)&s->pin[i], s->chunk, cudaHostAllocDefault);
            if (ce != cudaSuccess) {
                s->pin[i] = NULL;
                return kiln_errorf(KILN_ENOMEM, "checkpoint snapshot: %.0f MiB of pinned host memory: %s",
                                   (double)s->chunk / 1048576, cudaGetErrorString(ce));
            }
        }
    return NULL;
}

/* Host memory for a host snapshot, kept for the next saves: pinned if it can be, else (place
 * allowing) pageable. */
static kiln_error *host_alloc(kiln_zaya_cuda_snap *s, kiln_snap_place place) {
    const size_t bytes = (s->nparam + s->nstate + 1) * sizeof(float);
    if (s->hsnap && (s->hsnap_pinned || place != KILN_SNAP_PINNED)) return NULL;
    free(s->hsnap);
    s->hsnap = NULL;
    s->hsnap_pinned = 0;
    if (place != KILN_SNAP_PAGEABLE && cudaHostAlloc((void **)&s->hsnap, bytes, cudaHostAllocDefault) == cudaSuccess) {
        s->hsnap_pinned = 1;
        return NULL;
    }
    s->hsnap = NULL;
    cudaGetLastError(); /* a failed allocation is not a sticky error: clear it */
    if (place == KILN_SNAP_PINNED)
        return kiln_errorf(KILN_ENOMEM, "checkpoint snapshot: %.2f GB of pinned host memory", (double)bytes / 1e9);
    s->hsnap = malloc(bytes);
    if (!s->hsnap) return kiln_errorf(KILN_ENOMEM, "checkpoint snapshot: %.2f GB of host memory", (double)bytes / 1e9);
    return NULL;
}

/* Room on the device for the copy, with 1 GiB to spare for the ops' pool (AUTO); kept for the next
 * saves. */
static int device_alloc(kiln_zaya_cuda_snap *s, kiln_snap_place place) {
    if (s->dsnap) return 1;
    const size_t bytes = (s->nparam + s->nstate + 1) * sizeof(float);
    size_t free_b = 0, total_b = 0;
    if (place == KILN_SNAP_AUTO &&
        (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + ((size_t)1 << 30))) {
        cudaGetLastError();
        return 0;
    }
    if (cudaMalloc((void **)&s->dsnap, bytes) != cudaSuccess) {
        cudaGetLastError();
        s->dsnap = NULL;
        return 0;
    }
    return 1;
}

kiln_error *kiln_zaya_cuda_snap_take(kiln_zaya_cuda_snap *s, int copy, kiln_snap_place place) {
    KILN_TRY(kiln_zaya_cuda_master_f32(s->g)); /* split masters joined (the next step splits them again) */
    cudaStream_t model = (cudaStream_t)kiln_zaya_cuda_stream(s->g);
    const float *pw = kiln_zaya_cuda_params(s->g) + s->param_off, *ps = kiln_zaya_cuda_opt_state(s->o);
    const size_t pb = s->nparam * sizeof(float), sb = s->nstate * sizeof(float);
    s->at = AT_NONE;
    /* everything queued so far on the model's stream (the optimizer step) comes before the copy */
    SNAP_CU(cudaEventRecord(s->ready, model), "ordering after the optimizer step");
    if (!copy) {
        KILN_TRY(chunks_alloc(s));
        s->base[0] = (const unsigned char *)pw, s->base[1] = (const unsigned char *)ps;
        s->at = AT_LIVE;
        return NULL;
    }
    SNAP_CU(cudaStreamWaitEvent(s->copy_st, s->ready, 0), "ordering after the optimizer step");
    if ((place == KILN_SNAP_AUTO || place == KILN_SNAP_DEVICE) && device_alloc(s, place)) {
        KILN_TRY(chunks_alloc(s));
        SNAP_CU(cudaMemcpyAsync(s->dsnap, pw, pb, cudaMemcpyDeviceToDevice, s->copy_st), "parameters to the device copy");
        SNAP_CU(cudaMemcpyAsync(s->dsnap + s->nparam, ps, sb, cudaMemcpyDeviceToDevice, s->copy_st),
                "optimizer state to the device copy");
        SNAP_CU(cudaEventRecord(s->copied, s->copy_st), "device copy");
        /* the next step's updates wait for the copy; the host does not */
        SNAP_CU(cudaStreamWaitEvent(model, s->copied, 0), "device copy before the next step");
        s->base[0] = (const unsigned char *)s->dsnap, s->base[1] = (const unsigned char *)(s->dsnap + s->nparam);
        s->at = AT_DEVICE;
        return NULL;
    }
    if (place == KILN_SNAP_DEVICE)
        return kiln_errorf(KILN_ENOMEM, "checkpoint snapshot: no room on the device for %.2f GB",
                           (double)(pb + sb) / 1e9);
    KILN_TRY(host_alloc(s, place));
    SNAP_CU(cudaMemcpyAsync(s->hsnap, pw, pb, cudaMemcpyDeviceToHost, s->copy_st), "parameters to the host copy");
    SNAP_CU(cudaMemcpyAsync(s->hsnap + s->nparam, ps, sb, cudaMemcpyDeviceToHost, s->copy_st),
            "optimizer state to the host copy");
    SNAP_CU(cudaStreamSynchronize(s->copy_st), "host copy");
    s->base[0] = (const unsigned char *)s->hsnap, s->base[1] = (const unsigned char *)(s->hsnap + s->nparam);
    s->at = s->hsnap_pinned ? AT_PINNED : AT_PAGEABLE;
    return NULL;
}

/* Queue the D2H copies of the next chunk of the stream into pinned buffer k % 2. */
static kiln_error *fill_chunk(kiln_zaya_cuda_snap *s, uint64_t k) {
    unsigned char *dst = s->pin[k % 2];
    const uint64_t left = s->total - k * s->chunk;
    const size_t want = left < s->chunk ? (size_t)left : s->chunk;
    size_t got = 0;
    while (got < want) {
        const seg *g = &s->segs[s->cur_seg];
        const size_t bytes = g->n * sizeof(float), take = bytes - s->cur_off < want - got ? bytes - s->cur_off : want - got;
        if (take)
            SNAP_CU(cudaMemcpyAsync(dst + got, s->base[g->block] + g->off * sizeof(float) + s->cur_off, take,
                                    cudaMemcpyDeviceToHost, s->d2h_st),
                    "a chunk to pinned host memory");
        got += take;
        s->cur_off += take;
        if (s->cur_off == bytes) s->cur_seg++, s->cur_off = 0;
    }
    s->chunk_len[k % 2] = want;
    SNAP_CU(cudaEventRecord(s->landed[k % 2], s->d2h_st), "a chunk to pinned host memory");
    return NULL;
}

kiln_error *kiln_zaya_cuda_snap_read_begin(kiln_zaya_cuda_snap *s) {
    if (s->at == AT_NONE) return kiln_errorf(KILN_EINVAL, "checkpoint snapshot: nothing was taken");
    SNAP_CU(cudaSetDevice(s->dev), "the writer thread's device");
    s->cur_seg = 0, s->cur_off = 0, s->issued = s->returned = s->handed = 0;
    s->nchunks = (s->total + s->chunk - 1) / s->chunk;
    s->on_device = s->at == AT_LIVE || s->at == AT_DEVICE;
    if (!s->on_device) return NULL;
    SNAP_CU(cudaStreamWaitEvent(s->d2h_st, s->at == AT_DEVICE ? s->copied : s->ready, 0), "the snapshot before the stream");
    if (s->nchunks) {
        KILN_TRY(fill_chunk(s, 0));
        s->issued = 1;
    }
    return NULL;
}

kiln_error *kiln_zaya_cuda_snap_read(void *ctx, const void **data, size_t *len) {
    kiln_zaya_cuda_snap *s = ctx;
    *data = NULL, *len = 0;
    if (s->handed >= s->total) return NULL;
    if (!s->on_device) { /* host snapshot: straight from it, a chunk at most at a time */
        const seg *g = &s->segs[s->cur_seg];
        while (s->cur_off == g->n * sizeof(float)) g = &s->segs[++s->cur_seg], s->cur_off = 0;
        const size_t bytes = g->n * sizeof(float), take = bytes - s->cur_off < s->chunk ? bytes - s->cur_off : s->chunk;
        *data = s->base[g->block] + g->off * sizeof(float) + s->cur_off;
        *len = take;
        s->cur_off += take;
        s->handed += take;
        return NULL;
    }
    const uint64_t k = s->returned;
    SNAP_CU(cudaEventSynchronize(s->landed[k % 2]), "a chunk to pinned host memory");
    /* the other buffer held chunk k-1, which the caller is done with: the next chunk goes there while
     * this one is written */
    if (s->issued < s->nchunks) {
        KILN_TRY(fill_chunk(s, s->issued));
        s->issued++;
    }
    *data = s->pin[k % 2];
    *len = s->chunk_len[k % 2];
    s->returned++;
    s->handed += *len;
    return NULL;
}

void kiln_zaya_cuda_snap_read_end(kiln_zaya_cuda_snap *s) {
    if (s && s->d2h_st) cudaStreamSynchronize(s->d2h_st);
}

#endif
