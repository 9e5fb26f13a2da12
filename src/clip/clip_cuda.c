/* CLIP's vision tower on the GPU (kiln_clip_set_device(m, "cuda")): the weights go to the device once,
 * GEMM weights in bf16 (cuBLASLt, f32 accumulation: src/cuda/clip_gemm.cu), norms, class and position
 * embeddings in f32. The residual stream is bf16 by default, as transformers' CLIPModel in bf16 carries it
 * (KILN_CLIP_RESIDUAL=f32: an f32 stream; read at every call): the class/position assembly and pre_layrnorm
 * write it, the layernorms read it (statistics in f32), and the out/fc2 projections add into it as their
 * GEMM's epilogue (C = D, beta = 1, their biases in the stream's type, one rounding per add); one tower()
 * for both types (kiln_clip_dtype). Activations between ops are bf16; attention reads q/k/v in place from the
 * fused projection: kiln's short-sequence kernel (src/cuda/clip_attention.cu) where cuDNN's 128-row tiles
 * would pad T x T by 1.3x or more (L/14's 257 tokens, B/32's 50), else cuDNN's fused flash attention where
 * the library loads (src/cuda/attention_cudnn.cu), else kiln's kernels (KILN_CLIP_ATTN=auto|cudnn|own|gemm,
 * src/cuda/clip_ops.cu). Without patch embeddings (the image embeddings only) the last layer carries only
 * the class rows past its qkv GEMM: the class query's attention over every key (src/cuda/
 * clip_attention_cls.cu), the class rows of the stream gathered into [B, H], then the out projection, LN2
 * and the MLP on B rows (the same math, ~1/L of the tower less work). Pixels go up as f32 (the caller's, as
 * torch uploads them) and are rounded to bf16 by the patch kernel on the device.
 * Images run in chunks on two streams of the model's own, consecutive chunks on alternate streams with their
 * own activation buffers (image embeddings only; KILN_CLIP_STREAMS=N: 1 to 4), and one more for uploads: the
 * pixels of chunk c+1 travel while chunk c computes (two device slots, events between the streams). Pixels in
 * page-locked memory (kiln_clip_pixels_alloc) go up straight from the caller's buffer; pageable ones are
 * first copied into a page-locked slot by OpenMP threads; pixels already on the device are used in place.
 * Embeddings come back into a page-locked buffer and are copied out at the end, so the host never waits
 * for a chunk before queueing the next. Activation buffers are kept between calls (grown as needed).
 * KILN_CLIP_PROFILE=1 times every op class with CUDA events and prints the table on stderr;
 * KILN_CLIP_CHUNK=N sets the images per chunk. Texts stay on the CPU (short, few). Without CUDA, setting
 * the device says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/cuda.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime.h>
#include <math.h>
#include <time.h>

#include "cuda/clip_ops.h"
#include "kiln/cuda_ops.h"
#include "kiln/dtype.h"
#include "kiln/log.h"

typedef struct {
    kiln_bf16 *qkv_w, *qkv_b, *o_w, *fc1_w, *fc1_b, *fc2_w;
    /* the biases of the GEMMs that add into the residual stream, in its type: f32 or bf16 (the BIAS epilogue
     * takes the output's type) */
    float *o_b, *fc2_b;
    kiln_bf16 *o_b16, *fc2_b16;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} gpu_layer;

enum { P_UPLOAD, P_PATCH, P_LN, P_QKV, P_ATTN, P_OUT, P_FC1, P_ACT, P_FC2, P_POST, P_NCLASS, P_MAXEV = 8192 };
static const char *const prof_names[P_NCLASS] = {
    "upload wait", "patch embed", "layernorm", "qkv GEMM", "attention", "out GEMM + residual",
    "fc1 GEMM", "activation", "fc2 GEMM + residual", "post LN + proj + L2"};

/* one chunk's activations on the device and the stream that computes it */
enum { CLIP_LANES_MAX = 4 };
struct clip_lane {
    cudaStream_t st;
    void *x, *xc; /* the residual stream [N, H] and its class rows [B, H] (f32-sized) */
    float *nrm;
    kiln_bf16 *cols, *pe, *h, *qkv, *att, *f, *pr;
};

struct clip_gpu {
    gpu_layer *L;
    kiln_bf16 *patch_w, *proj;
    float *cls, *pos, *pre_w, *pre_b, *post_w, *post_b;
    void **allocs;
    int nallocs, cap;
    cudaStream_t st, cp;          /* compute (lane 0's), uploads */
    cudaEvent_t up[2], used[2];   /* per pixel slot: its upload landed; the patch kernel has read it */
    int64_t cap_imgs;             /* images per chunk the buffers below hold */
    kiln_clip_dtype res;          /* the residual stream's type for this call (KILN_CLIP_RESIDUAL) */
    struct clip_lane ln[CLIP_LANES_MAX]; /* chunks in flight at once (KILN_CLIP_STREAMS): lanes 1.. on demand */
    int nlanes;                   /* lanes whose buffers exist */
    float *px[2];                 /* device */
    float *stage[2];              /* page-locked pixels of one chunk (pageable callers) */
    float *hout, *hpatch;         /* page-locked embeddings: of a whole call (hout_n floats), of a chunk */
    size_t hout_n;
    int prof, nev;                /* KILN_CLIP_PROFILE */
    cudaEvent_t *ev;
    int *evc;
};

static kiln_error *cuda_err(cudaError_t s, const char *what) {
    return s == cudaSuccess ? NULL : kiln_errorf(KILN_EIO, "CLIP on CUDA: %s: %s", what, cudaGetErrorString(s));
}

static kiln_error *track(struct clip_gpu *g, void *p) {
    if (g->nallocs == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        void **v = realloc(g->allocs, sizeof(void *) * (size_t)cap);
        if (!v) {
            kiln_cuda_free(p);
            return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of host memory");
        }
        g->allocs = v;
        g->cap = cap;
    }
    g->allocs[g->nallocs++] = p;
    return NULL;
}

static kiln_error *up_f32(struct clip_gpu *g, const float *src, size_t n, float **dst) {
    void *p = NULL;
    KILN_TRY(kiln_cuda_alloc(&p, n * sizeof(float)));
    KILN_TRY(track(g, p));
    *dst = p;
    return kiln_cuda_copy(p, src, n * sizeof(float), KILN_CUDA_H2D);
}

/* src [rows, cols] as bf16 [rows, ld], the columns past cols zero */
static kiln_error *up_bf16_rows(struct clip_gpu *g, const float *src, size_t rows, size_t cols, size_t ld,
                                kiln_bf16 **dst) {
    const size_t n = rows * ld;
    uint16_t *h = calloc(n ? n : 1, sizeof(uint16_t));
    if (!h) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of host memory");
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < cols; i++) h[r * ld + i] = kiln_f32_to_bf16(src[r * cols + i]);
    void *p = NULL;
    kiln_error *e = kiln_cuda_alloc(&p, n * sizeof(uint16_t));
    if (!e) e = track(g, p);
    if (!e) e = kiln_cuda_copy(p, h, n * sizeof(uint16_t), KILN_CUDA_H2D);
    free(h);
    if (!e) *dst = p;
    return e;
}

static kiln_error *up_bf16(struct clip_gpu *g, const float *src, size_t n, kiln_bf16 **dst) {
    return up_bf16_rows(g, src, 1, n, n, dst);
}

/* the patch GEMM's K (3 p p) rounded up to 16: rows of 16-byte multiples, which cuBLASLt's fast kernels need (L/14:
 * 588 -> 592) */
static int64_t patch_ld(int64_t p) { return (3 * p * p + 15) / 16 * 16; }

/* wait for everything queued on the model's streams (both lanes', the uploads'); errors are the caller's to clear */
static void sync_streams(struct clip_gpu *g) {
    if (g->cp) cudaStreamSynchronize(g->cp);
    for (int i = 0; i < CLIP_LANES_MAX; i++)
        if (g->ln[i].st) cudaStreamSynchronize(g->ln[i].st);
}

/* a lane's activation buffers (its stream stays) */
static void lane_free(struct clip_lane *a) {
    kiln_cuda_free(a->x), kiln_cuda_free(a->xc), kiln_cuda_free(a->nrm), kiln_cuda_free(a->cols);
    kiln_cuda_free(a->pe), kiln_cuda_free(a->h), kiln_cuda_free(a->qkv), kiln_cuda_free(a->att);
    kiln_cuda_free(a->f), kiln_cuda_free(a->pr);
    a->x = a->xc = NULL;
    a->nrm = NULL;
    a->cols = a->pe = a->h = a->qkv = a->att = a->f = a->pr = NULL;
}

static void free_chunk_buffers(struct clip_gpu *g) {
    for (int i = 0; i < 2; i++) {
        kiln_cuda_free(g->px[i]);
        kiln_clip_pinned_free(g->stage[i]);
        g->px[i] = NULL, g->stage[i] = NULL;
    }
    for (int i = 0; i < CLIP_LANES_MAX; i++) lane_free(&g->ln[i]);
    kiln_clip_pinned_free(g->hpatch);
    g->hpatch = NULL;
    g->nlanes = 0;
    g->cap_imgs = 0;
}

void kiln_clip_gpu_free(kiln_clip *m) {
    struct clip_gpu *g = m->gpu;
    if (!g) return;
    sync_streams(g);
    free_chunk_buffers(g);
    kiln_clip_pinned_free(g->hout);
    for (int i = 0; i < g->nallocs; i++) kiln_cuda_free(g->allocs[i]);
    for (int i = 0; i < 2; i++) {
        if (g->up[i]) cudaEventDestroy(g->up[i]);
        if (g->used[i]) cudaEventDestroy(g->used[i]);
    }
    if (g->ev)
        for (int i = 0; i < P_MAXEV; i++)
            if (g->ev[i]) cudaEventDestroy(g->ev[i]);
    free(g->ev);
    free(g->evc);
    if (g->st) cudaStreamDestroy(g->st);
    for (int i = 1; i < CLIP_LANES_MAX; i++)
        if (g->ln[i].st) cudaStreamDestroy(g->ln[i].st);
    if (g->cp) cudaStreamDestroy(g->cp);
    free(g->allocs);
    free(g->L);
    free(g);
    m->gpu = NULL;
}

static kiln_error *upload(kiln_clip *m, struct clip_gpu *g) {
    const clip_tower_cfg *c = &m->vision;
    int64_t H = c->hidden, I = c->inter, p = c->patch_size, G = c->image_size / p, D = m->proj_dim;
    if (!(g->L = calloc((size_t)c->layers, sizeof *g->L))) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of memory");
    KILN_TRY(up_bf16_rows(g, m->patch_w, (size_t)H, (size_t)(3 * p * p), (size_t)patch_ld(p), &g->patch_w));
    KILN_TRY(up_bf16(g, m->vis_proj, (size_t)(D * H), &g->proj));
    KILN_TRY(up_f32(g, m->class_emb, (size_t)H, &g->cls));
    KILN_TRY(up_f32(g, m->vpos_emb, (size_t)((G * G + 1) * H), &g->pos));
    KILN_TRY(up_f32(g, m->pre_ln_w, (size_t)H, &g->pre_w));
    KILN_TRY(up_f32(g, m->pre_ln_b, (size_t)H, &g->pre_b));
    KILN_TRY(up_f32(g, m->post_ln_w, (size_t)H, &g->post_w));
    KILN_TRY(up_f32(g, m->post_ln_b, (size_t)H, &g->post_b));
    for (int l = 0; l < c->layers; l++) {
        const clip_layer *s = &m->vl[l];
        gpu_layer *d = &g->L[l];
        KILN_TRY(up_bf16(g, s->qkv_w, (size_t)(3 * H * H), &d->qkv_w));
        KILN_TRY(up_bf16(g, s->qkv_b, (size_t)(3 * H), &d->qkv_b));
        KILN_TRY(up_bf16(g, s->o_w, (size_t)(H * H), &d->o_w));
        KILN_TRY(up_f32(g, s->o_b, (size_t)H, &d->o_b));
        KILN_TRY(up_bf16(g, s->o_b, (size_t)H, &d->o_b16));
        KILN_TRY(up_bf16(g, s->fc1_w, (size_t)(I * H), &d->fc1_w));
        KILN_TRY(up_bf16(g, s->fc1_b, (size_t)I, &d->fc1_b));
        KILN_TRY(up_bf16(g, s->fc2_w, (size_t)(H * I), &d->fc2_w));
        KILN_TRY(up_f32(g, s->fc2_b, (size_t)H, &d->fc2_b));
        KILN_TRY(up_bf16(g, s->fc2_b, (size_t)H, &d->fc2_b16));
        KILN_TRY(up_f32(g, s->ln1_w, (size_t)H, &d->ln1_w));
        KILN_TRY(up_f32(g, s->ln1_b, (size_t)H, &d->ln1_b));
        KILN_TRY(up_f32(g, s->ln2_w, (size_t)H, &d->ln2_w));
        KILN_TRY(up_f32(g, s->ln2_b, (size_t)H, &d->ln2_b));
    }
    KILN_TRY(cuda_err(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking), "creating a stream"));
    g->ln[0].st = g->st;
    KILN_TRY(cuda_err(cudaStreamCreateWithFlags(&g->cp, cudaStreamNonBlocking), "creating a stream"));
    for (int i = 0; i < 2; i++) {
        KILN_TRY(cuda_err(cudaEventCreateWithFlags(&g->up[i], cudaEventDisableTiming), "creating an event"));
        KILN_TRY(cuda_err(cudaEventCreateWithFlags(&g->used[i], cudaEventDisableTiming), "creating an event"));
    }
    const char *pe = getenv("KILN_CLIP_PROFILE");
    if (pe && *pe && strcmp(pe, "0")) {
        if (!(g->ev = calloc(P_MAXEV, sizeof *g->ev)) || !(g->evc = calloc(P_MAXEV, sizeof *g->evc)))
            return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of memory");
        for (int i = 0; i < P_MAXEV; i++) KILN_TRY(cuda_err(cudaEventCreate(&g->ev[i]), "creating an event"));
        g->prof = 1;
    }
    return NULL;
}

kiln_error *kiln_clip_set_device(kiln_clip *m, const char *device) {
    if (!strcmp(device, "cpu")) {
        kiln_clip_gpu_free(m);
        return NULL;
    }
    if (strcmp(device, "cuda"))
        return kiln_errorf(KILN_EINVAL, "CLIP device \"%s\": expected \"cpu\" or \"cuda\"", device);
    if (m->gpu) return NULL;
    if (m->vision.act == CLIP_ACT_GELU_TANH)
        return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: hidden_act gelu_new/gelu_pytorch_tanh is not supported there");
    int n = 0;
    KILN_TRY(kiln_cuda_device_count(&n));
    if (n < 1) return kiln_errorf(KILN_ENOTFOUND, "CLIP on CUDA: no CUDA device");
    struct clip_gpu *g = calloc(1, sizeof *g);
    if (!g) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of memory");
    m->gpu = g;
    kiln_error *e = upload(m, g);
    if (e) {
        kiln_clip_gpu_free(m);
        return kiln_error_wrap(e, "uploading CLIP's vision tower");
    }
    return NULL;
}

kiln_error *kiln_clip_pixels_alloc(const kiln_clip *m, int64_t n, float **pixels) {
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1) * 3 * (size_t)m->vision.image_size * (size_t)m->vision.image_size;
    *pixels = NULL;
    if (m->gpu) return kiln_error_wrap(kiln_clip_pinned_alloc((void **)pixels, bytes), "pixels of %lld images", (long long)n);
    if (!(*pixels = malloc(bytes))) return kiln_errorf(KILN_ENOMEM, "out of memory for the pixels of %lld images", (long long)n);
    return NULL;
}

void kiln_clip_pixels_free(float *pixels) {
    struct cudaPointerAttributes a;
    if (!pixels) return;
    if (cudaPointerGetAttributes(&a, pixels) == cudaSuccess && a.type == cudaMemoryTypeHost) kiln_clip_pinned_free(pixels);
    else {
        cudaGetLastError(); /* a pointer CUDA does not know is not an error to keep */
        free(pixels);
    }
}

/* where the caller's pixels live: 0 pageable, 1 page-locked host, 2 device */
static int pixels_kind(const float *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost ? 1 : a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? 2 : 0;
}

/* images per chunk: about 32k token rows (GEMMs of that many rows run near their best), and two chunks or
 * more once there are 8k rows, so an upload overlaps a chunk's compute */
static int64_t chunk_images(int64_t n, int64_t T) {
    const char *e = getenv("KILN_CLIP_CHUNK");
    int64_t c;
    if (e && atoi(e) > 0) c = atoi(e);
    else {
        int64_t rows = n * T, nch = (rows + 32767) / 32768;
        if (nch < 2 && rows >= 8192) nch = 2;
        c = (n + nch - 1) / nch;
    }
    return c < n ? c : n;
}

/* Consecutive chunks on two streams, each with its own activations (the default; KILN_CLIP_STREAMS=N, 1 to
 * CLIP_LANES_MAX, read at every call), so one chunk's kernels fill the SMs the other's leave idle (a GEMM's
 * last wave, attention's, the memory-bound passes beside compute-bound ones). Same kernels on the same
 * shapes: the same bits as one stream. Costs a set of activation buffers a stream (~0.45 GB for L/14 at 64
 * images). */
static int clip_streams(void) {
    const char *e = getenv("KILN_CLIP_STREAMS");
    int n = e && *e ? atoi(e) : 2;
    return n < 1 ? 1 : n > CLIP_LANES_MAX ? CLIP_LANES_MAX : n;
}

static kiln_error *alloc_dev(void **p, size_t bytes) { return kiln_cuda_alloc(p, bytes ? bytes : 1); }

static kiln_error *ensure_buffers(kiln_clip *m, struct clip_gpu *g, int64_t Bm, int lanes, int need_stage) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G2 = (S / p) * (S / p), T = G2 + 1, H = c->hidden, I = c->inter,
            D = m->proj_dim, K = patch_ld(p), Nm = Bm * T;
    size_t per = (size_t)(3 * S * S);
    if (g->cap_imgs < Bm) {
        sync_streams(g);
        free_chunk_buffers(g);
        KILN_TRY(alloc_dev((void **)&g->px[0], sizeof(float) * per * (size_t)Bm));
        KILN_TRY(alloc_dev((void **)&g->px[1], sizeof(float) * per * (size_t)Bm));
        g->cap_imgs = Bm;
    }
    /* every lane holds cap_imgs images (a lane added later as large as the first) */
    Bm = g->cap_imgs, Nm = Bm * T;
    for (; g->nlanes < lanes; g->nlanes++) {
        struct clip_lane *a = &g->ln[g->nlanes];
        kiln_error *e = NULL;
        if (!a->st) e = cuda_err(cudaStreamCreateWithFlags(&a->st, cudaStreamNonBlocking), "creating a stream");
        if (!e) e = alloc_dev((void **)&a->cols, 2 * (size_t)(Bm * G2 * K));
        if (!e) e = alloc_dev((void **)&a->pe, 2 * (size_t)(Bm * G2 * H));
        if (!e) e = alloc_dev(&a->x, sizeof(float) * (size_t)(Nm * H));
        if (!e) e = alloc_dev(&a->xc, sizeof(float) * (size_t)(Bm * H));
        if (!e) e = alloc_dev((void **)&a->h, 2 * (size_t)(Nm * H));
        if (!e) e = alloc_dev((void **)&a->qkv, 2 * (size_t)(Nm * 3 * H));
        if (!e) e = alloc_dev((void **)&a->att, 2 * (size_t)(Nm * H));
        if (!e) e = alloc_dev((void **)&a->f, 2 * (size_t)(Nm * I));
        if (!e) e = alloc_dev((void **)&a->pr, 2 * (size_t)(Nm * D));
        if (!e) e = alloc_dev((void **)&a->nrm, sizeof(float) * (size_t)(Nm * D));
        if (!e) continue;
        lane_free(a);
        if (g->nlanes == 0) return e;
        /* no room for another set of activations: fewer streams (the caller sees g->nlanes) */
        kiln_log(KILN_LOG_DEBUG, "CLIP on CUDA: %d stream(s) of the %d asked: %s", g->nlanes, lanes, kiln_error_msg(e));
        kiln_error_free(e);
        cudaGetLastError();
        break;
    }
    if (need_stage && !g->stage[0]) {
        KILN_TRY(kiln_clip_pinned_alloc((void **)&g->stage[0], sizeof(float) * per * (size_t)g->cap_imgs));
        KILN_TRY(kiln_clip_pinned_alloc((void **)&g->stage[1], sizeof(float) * per * (size_t)g->cap_imgs));
    }
    return NULL;
}

static void mark(struct clip_gpu *g, int cls) {
    if (!g->prof || g->nev >= P_MAXEV) return;
    cudaEventRecord(g->ev[g->nev], g->st);
    g->evc[g->nev++] = cls;
}

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void prof_print(struct clip_gpu *g, int64_t n, int64_t Bm, int kind, double secs) {
    double ms[P_NCLASS] = {0}, tot = 0;
    for (int i = 0; i + 1 < g->nev; i++) {
        float t = 0;
        if (g->evc[i] >= 0 && cudaEventElapsedTime(&t, g->ev[i], g->ev[i + 1]) == cudaSuccess) {
            ms[g->evc[i]] += t;
            tot += t;
        }
    }
    static const char *const kinds[] = {"pageable", "page-locked", "device"};
    fprintf(stderr, "CLIP on CUDA: %lld images in chunks of %lld, pixels %s, %s residual stream: %.3f ms wall (%.1f images/s)%s\n",
            (long long)n, (long long)Bm, kinds[kind], g->res == KILN_CLIP_BF16 ? "bf16" : "f32", secs * 1e3, n / secs,
            g->nev >= P_MAXEV ? " (timeline cut short)" : "");
    for (int c = 0; c < P_NCLASS; c++) {
        char name[64];
        /* which attention ran (KILN_CLIP_ATTN: auto by default, the short-sequence kernel or cuDNN's) */
        if (c == P_ATTN) snprintf(name, sizeof name, "%s (%s)", prof_names[c], kiln_clip_attention_last_impl());
        else snprintf(name, sizeof name, "%s", prof_names[c]);
        if (ms[c] > 0) fprintf(stderr, "  %-22s %9.3f ms %5.1f%%\n", name, ms[c], tot > 0 ? 100 * ms[c] / tot : 0);
    }
    g->nev = 0;
}

/* the tower over one chunk of B images whose f32 pixels are at px (device), on lane a's stream and buffers;
 * leaves the pooled rows' embeddings in a->nrm ([B, D] f32), or every token's ([B*T, D]) when all_tokens. The
 * residual stream a->x is of type g->res; without all_tokens the last layer carries only the class rows past its
 * qkv GEMM, in a->xc ([B, H], the same type). */
static kiln_error *tower(kiln_clip *m, struct clip_gpu *g, struct clip_lane *a, const float *px, int64_t B, int slot,
                         int all_tokens) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G2 = (S / p) * (S / p), T = G2 + 1, H = c->hidden, I = c->inter,
            D = m->proj_dim, K = patch_ld(p), hd = H / c->heads, N = B * T;
    float scale = (float)(1.0 / sqrt((double)hd)), eps = (float)c->eps;
    const kiln_clip_dtype rt = g->res, bf = KILN_CLIP_BF16;
    const int rf = rt == KILN_CLIP_F32;
    const size_t es = rf ? sizeof(float) : sizeof(kiln_bf16);
    void *st = a->st;
    mark(g, P_PATCH);
    KILN_TRY(kiln_clip_patchify_f32_cuda(a->cols, K, px, B, S, p, st));
    if (slot >= 0) KILN_TRY(cuda_err(cudaEventRecord(g->used[slot], a->st), "recording an event"));
    KILN_TRY(kiln_clip_linear_cuda(a->pe, 0, a->cols, g->patch_w, NULL, B * G2, K, H, 0, st));
    KILN_TRY(kiln_clip_assemble_x_cuda(a->x, rt, a->pe, g->cls, g->pos, B, G2, H, st));
    KILN_TRY(kiln_clip_layernorm_cuda(a->x, rt, a->x, rt, H, g->pre_w, g->pre_b, N, H, eps, st));
    for (int l = 0; l < c->layers; l++) {
        const gpu_layer *L = &g->L[l];
        /* the last layer without patch embeddings: after the qkv GEMM (every row's keys and values), the
         * class rows only, r [nr, H] */
        const int cls = !all_tokens && l == c->layers - 1;
        void *r = cls ? a->xc : a->x;
        const int64_t nr = cls ? B : N;
        mark(g, P_LN);
        KILN_TRY(kiln_clip_layernorm_cuda(a->h, bf, a->x, rt, H, L->ln1_w, L->ln1_b, N, H, eps, st));
        mark(g, P_QKV);
        KILN_TRY(kiln_clip_linear_cuda(a->qkv, 0, a->h, L->qkv_w, L->qkv_b, N, H, 3 * H, 0, st));
        mark(g, P_ATTN);
        if (cls) {
            KILN_TRY(kiln_clip_attention_cls_cuda(a->att, a->qkv, a->qkv + H, a->qkv + 2 * H, B, T, c->heads, hd,
                                                  3 * H, H, scale, st));
            KILN_TRY(cuda_err(cudaMemcpy2DAsync(a->xc, (size_t)H * es, a->x, (size_t)(T * H) * es, (size_t)H * es,
                                                (size_t)B, cudaMemcpyDeviceToDevice, a->st),
                              "gathering the class rows"));
        } else
            KILN_TRY(kiln_mha_forward_cuda(a->att, a->qkv, a->qkv + H, a->qkv + 2 * H, B, T, c->heads, hd, 3 * H, H,
                                           scale, 0, st));
        mark(g, P_OUT);
        KILN_TRY(kiln_clip_linear_cuda(r, rf, a->att, L->o_w, rf ? (const void *)L->o_b : L->o_b16, nr, H, H, 1, st));
        mark(g, P_LN);
        KILN_TRY(kiln_clip_layernorm_cuda(a->h, bf, r, rt, H, L->ln2_w, L->ln2_b, nr, H, eps, st));
        mark(g, P_FC1);
        /* quick_gelu in fc1's epilogue, a GEMM of kiln's own (the default on Hopper, widths it takes;
         * KILN_CLIP_GEMM=cublaslt: cuBLASLt, then the pass) */
        if (c->act == CLIP_ACT_QUICK_GELU && kiln_clip_gemm_own() && H % 64 == 0 && I % 128 == 0)
            KILN_TRY(kiln_clip_linear_quick_gelu_cuda(a->f, a->h, L->fc1_w, L->fc1_b, nr, H, I, st));
        else {
            KILN_TRY(kiln_clip_linear_cuda(a->f, 0, a->h, L->fc1_w, L->fc1_b, nr, H, I, 0, st));
            mark(g, P_ACT);
            KILN_TRY(c->act == CLIP_ACT_QUICK_GELU ? kiln_quick_gelu_forward_cuda(a->f, a->f, nr * I, st)
                                                   : kiln_gelu_forward_cuda(a->f, a->f, nr * I, st));
        }
        mark(g, P_FC2);
        KILN_TRY(kiln_clip_linear_cuda(r, rf, a->f, L->fc2_w, rf ? (const void *)L->fc2_b : L->fc2_b16, nr, I, H, 1,
                                       st));
    }
    mark(g, P_POST);
    if (all_tokens) {
        /* every token through post_layernorm and the projection: row b*T is image b, the rest its patches */
        KILN_TRY(kiln_clip_layernorm_cuda(a->h, bf, a->x, rt, H, g->post_w, g->post_b, N, H, eps, st));
        KILN_TRY(kiln_clip_linear_cuda(a->pr, 0, a->h, g->proj, NULL, N, H, D, 0, st));
        KILN_TRY(kiln_l2_normalize_rows_cuda(a->nrm, a->pr, N, D, st));
    } else {
        /* only the class tokens: compact in a->xc after the last layer (every T-th row of x without layers) */
        const int cx = c->layers > 0;
        KILN_TRY(kiln_clip_layernorm_cuda(a->h, bf, cx ? a->xc : a->x, rt, cx ? H : T * H, g->post_w, g->post_b, B, H,
                                          eps, st));
        KILN_TRY(kiln_clip_linear_cuda(a->pr, 0, a->h, g->proj, NULL, B, H, D, 0, st));
        KILN_TRY(kiln_l2_normalize_rows_cuda(a->nrm, a->pr, B, D, st));
    }
    mark(g, -1);
    return NULL;
}

/* chunk b0..b0+B-1's pixels into device slot `slot` on the upload stream (pageable ones through a
 * page-locked slot), after the patch kernel of the chunk that used the slot before has read it */
static kiln_error *stage_upload(struct clip_gpu *g, const float *pixels, int kind, int64_t b0, int64_t B, size_t per,
                                int slot) {
    const float *src = pixels + (size_t)b0 * per;
    size_t bytes = sizeof(float) * per * (size_t)B;
    if (kind == 0) {
        KILN_TRY(cuda_err(cudaEventSynchronize(g->up[slot]), "waiting for an upload"));
        float *dst = g->stage[slot];
        int64_t nb = (int64_t)((bytes + (1 << 20) - 1) >> 20);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nb; i++) {
            size_t o = (size_t)i << 20, len = bytes - o < (1u << 20) ? bytes - o : (1u << 20);
            memcpy((char *)dst + o, (const char *)src + o, len);
        }
        src = dst;
    }
    KILN_TRY(cuda_err(cudaStreamWaitEvent(g->cp, g->used[slot], 0), "ordering an upload"));
    KILN_TRY(cuda_err(cudaMemcpyAsync(g->px[slot], src, bytes, cudaMemcpyHostToDevice, g->cp), "uploading pixels"));
    return cuda_err(cudaEventRecord(g->up[slot], g->cp), "recording an event");
}

/* KILN_CLIP_RESIDUAL, read at every call (the tests switch it): bf16 (the default: what transformers' CLIPModel
 * in bf16 carries) or f32 */
static kiln_error *residual_type(kiln_clip_dtype *t) {
    const char *e = getenv("KILN_CLIP_RESIDUAL");
    if (!e || !*e || !strcmp(e, "bf16")) *t = KILN_CLIP_BF16;
    else if (!strcmp(e, "f32")) *t = KILN_CLIP_F32;
    else return kiln_errorf(KILN_EINVAL, "KILN_CLIP_RESIDUAL=\"%s\": expected bf16 or f32", e);
    return NULL;
}

static kiln_error *embed(kiln_clip *m, struct clip_gpu *g, const float *pixels, int64_t n, float *out, float *patches) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G2 = (S / p) * (S / p), T = G2 + 1, D = m->proj_dim;
    size_t per = (size_t)(3 * S * S);
    int kind = pixels_kind(pixels);
    int64_t Bm = chunk_images(n, T), nch = (n + Bm - 1) / Bm;
    double t0 = g->prof ? wall() : 0;
    /* chunks in flight on as many streams as asked and there are chunks (image embeddings only: the patch
     * path copies each chunk out through one page-locked buffer; the profile's timeline is one stream's) */
    int nl = patches || g->prof ? 1 : clip_streams();
    if (nl > nch) nl = (int)nch;
    g->nev = 0;
    KILN_TRY(residual_type(&g->res));
    KILN_TRY(ensure_buffers(m, g, Bm, nl, kind == 0));
    if (g->nlanes < nl) nl = g->nlanes;
    if (!patches && g->hout_n < (size_t)(n * D)) {
        kiln_clip_pinned_free(g->hout);
        g->hout = NULL, g->hout_n = 0;
        KILN_TRY(kiln_clip_pinned_alloc((void **)&g->hout, sizeof(float) * (size_t)(n * D)));
        g->hout_n = (size_t)(n * D);
    }
    if (patches && !g->hpatch)
        KILN_TRY(kiln_clip_pinned_alloc((void **)&g->hpatch, sizeof(float) * (size_t)(g->cap_imgs * T * D)));
    if (kind != 2) KILN_TRY(stage_upload(g, pixels, kind, 0, n < Bm ? n : Bm, per, 0));
    for (int64_t ci = 0; ci < nch; ci++) {
        int64_t b0 = ci * Bm, B = n - b0 < Bm ? n - b0 : Bm;
        int slot = (int)(ci & 1);
        struct clip_lane *a = &g->ln[ci % nl]; /* with two lanes, lane = slot */
        const float *px = pixels + (size_t)b0 * per;
        if (kind != 2) {
            /* the next chunk's pixels travel while this one computes */
            if (ci + 1 < nch) {
                int64_t nb0 = b0 + Bm;
                KILN_TRY(stage_upload(g, pixels, kind, nb0, n - nb0 < Bm ? n - nb0 : Bm, per, slot ^ 1));
            }
            mark(g, P_UPLOAD);
            KILN_TRY(cuda_err(cudaStreamWaitEvent(a->st, g->up[slot], 0), "waiting for an upload"));
            px = g->px[slot];
        }
        KILN_TRY(tower(m, g, a, px, B, kind != 2 ? slot : -1, patches != NULL));
        if (patches) {
            KILN_TRY(cuda_err(cudaMemcpyAsync(g->hpatch, a->nrm, sizeof(float) * (size_t)(B * T * D),
                                              cudaMemcpyDeviceToHost, g->st), "downloading embeddings"));
            KILN_TRY(cuda_err(cudaStreamSynchronize(g->st), "computing embeddings"));
            for (int64_t b = 0; b < B; b++) {
                memcpy(out + (b0 + b) * D, g->hpatch + b * T * D, sizeof(float) * (size_t)D);
                memcpy(patches + (b0 + b) * G2 * D, g->hpatch + (b * T + 1) * D, sizeof(float) * (size_t)(G2 * D));
            }
        } else {
            KILN_TRY(cuda_err(cudaMemcpyAsync(g->hout + b0 * D, a->nrm, sizeof(float) * (size_t)(B * D),
                                              cudaMemcpyDeviceToHost, a->st), "downloading embeddings"));
        }
    }
    for (int i = 1; i < nl; i++) KILN_TRY(cuda_err(cudaStreamSynchronize(g->ln[i].st), "computing embeddings"));
    KILN_TRY(cuda_err(cudaStreamSynchronize(g->st), "computing embeddings"));
    if (!patches) memcpy(out, g->hout, sizeof(float) * (size_t)(n * D));
    if (g->prof) prof_print(g, n, Bm, kind, wall() - t0);
    return NULL;
}

kiln_error *kiln_clip_embed_images_cuda(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    struct clip_gpu *g = m->gpu;
    if (n <= 0) return NULL;
    kiln_error *e = embed(m, g, pixels, n, out, patches);
    if (e) {
        /* leave nothing in flight that reads the caller's buffers */
        sync_streams(g);
        cudaGetLastError();
        g->nev = 0;
    }
    return e ? kiln_error_wrap(e, "CLIP image embeddings on CUDA") : NULL;
}

#else

void kiln_clip_gpu_free(kiln_clip *m) { (void)m; }

kiln_error *kiln_clip_set_device(kiln_clip *m, const char *device) {
    (void)m;
    if (!strcmp(device, "cpu")) return NULL;
    if (strcmp(device, "cuda"))
        return kiln_errorf(KILN_EINVAL, "CLIP device \"%s\": expected \"cpu\" or \"cuda\"", device);
    return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: kiln was built without CUDA");
}

kiln_error *kiln_clip_embed_images_cuda(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    (void)m, (void)pixels, (void)n, (void)out, (void)patches;
    return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: kiln was built without CUDA");
}

kiln_error *kiln_clip_pixels_alloc(const kiln_clip *m, int64_t n, float **pixels) {
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1) * 3 * (size_t)m->vision.image_size * (size_t)m->vision.image_size;
    if (!(*pixels = malloc(bytes))) return kiln_errorf(KILN_ENOMEM, "out of memory for the pixels of %lld images", (long long)n);
    return NULL;
}

void kiln_clip_pixels_free(float *pixels) { free(pixels); }

#endif
