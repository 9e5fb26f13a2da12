// The linear layers of CLIP's vision tower on the GPU through cuBLASLt: y[n,out] = x[n,in] wᵀ + b, x and w
// bf16, f32 accumulation, y bf16 (the qkv and fc1 projections) or y added in (the out and fc2 projections
// write straight into the residual stream, bf16 or f32 (KILN_CLIP_RESIDUAL): C = D, beta = 1, so the
// residual add is the GEMM's epilogue instead of a pass over the stream, rounded once to the stream's type).
// The bias is the BIAS epilogue, in y's type. Where cuBLASLt has
// no fused algorithm for a shape, the plan says so and a row-broadcast kernel adds the bias after.
// Plans (descriptors + the heuristic's algorithm, src/cuda/gemm_lt.h) are built once per shape and kept: a
// tower repeats four shapes per chunk size. One plan table for the process and a workspace per stream, behind a
// lock (the model is used by one thread at a time on CUDA: include/kiln/clip.h). KILN_CLIP_GEMM_TUNE=1 times the heuristic's
// first 16 candidates once per plan (on the call's inputs, into a scratch output: 3 calls each) and keeps the
// fastest; KILN_CLIP_GEMM_TUNE=sustained times each for ~0.2 s instead, long enough for a power-capped GPU to
// settle at the clock that candidate's power draw allows (a tower's steady state), so the pick is the one with
// the most FLOPs per joule there; KILN_CLIP_GEMM_TUNE_LOG=1 prints every candidate's time to stderr;
// KILN_CLIP_GEMM_TUNE=cached makes the sustained pick of each large shape once per machine and keeps it in the
// tuning cache (cplan_cached). Off by default: timed picks may differ between processes (last-bit differences)
// and cost ~8 s at a process's first L/14 call; session 15 saw no gain in the tower, session 17 +0.5% (3,371
// against 3,353 img/s, docs/perf.md).
#include <cuda_bf16.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clip_ops.h"
#include "cuda_check.h"
#include "gemm_lt.h"
#include "gemm_tc.h"
#include "kiln/log.h"
#include "kiln/tune_cache.h"
#include "launch.cuh"

namespace {

enum { MAX_CPLANS = 128, TUNE_MAX = 16 };

// Plans are src/cuda/gemm_lt.h's: row-major y[n,out] = x[n,in] wᵀ is its C[m,n] = A Bᵀ with m = n rows,
// A = x, B = w (NT). The key's tag is 2 * accumulate + (a bias was asked for); key.bias says whether the plan
// has the bias epilogue (its `user` flag too: "fused").
const size_t CWS_BYTES = 32u << 20;
pthread_mutex_t c_lock = PTHREAD_MUTEX_INITIALIZER;
// One workspace per stream: GEMMs in flight on two streams at once (the tower's two chunks) must not share one.
// Up to CWS_MAX streams; past that the device is waited for (a stream seen before may be destroyed by now) and
// the oldest entry's workspace goes to the new stream.
enum { CWS_MAX = 8 };
struct cws_entry {
    cudaStream_t st;
    void *ws;
};
cws_entry c_wss[CWS_MAX];
int n_cws, next_evict;

kiln_error *cws_for(cudaStream_t st, void **ws) {
    kiln_error *err = NULL;
    void *p = NULL;
    cws_entry *e = NULL;
    for (int i = 0; i < n_cws; i++)
        if (c_wss[i].st == st) {
            *ws = c_wss[i].ws;
            return NULL;
        }
    if (n_cws < CWS_MAX) {
        CUDA_TRY(cudaMalloc(&p, CWS_BYTES));
        c_wss[n_cws].st = st, c_wss[n_cws].ws = p, n_cws++;
        *ws = p;
        return NULL;
    }
    e = &c_wss[next_evict];
    next_evict = (next_evict + 1) % CWS_MAX;
    CUDA_TRY(cudaDeviceSynchronize());
    e->st = st;
    *ws = e->ws;
done:
    return err;
}
kiln_lt_plan c_plans[MAX_CPLANS];
uint64_t c_hashes[MAX_CPLANS];
kiln_lt_cache c_cache = {c_plans, c_hashes, 0, MAX_CPLANS};

kiln_lt_key ckey(int64_t n, int64_t in, int64_t out, int y_f32, int bias, int acc, int fused, const uint32_t align[3]) {
    kiln_lt_key key = kiln_lt_key_make(n, out, in, 0, 1, y_f32, align);
    key.bias = fused, key.bias_f32 = fused && y_f32, key.tag = 2 * acc + bias;
    return key;
}

kiln_error *cplan_get(int64_t n, int64_t in, int64_t out, int y_f32, int bias, int acc, const uint32_t align[3],
                      kiln_lt_plan **res) {
    kiln_error *err = NULL;
    kiln_lt_plan p;
    kiln_lt_key key = ckey(n, in, out, y_f32, bias, acc, bias, align);
    memset(&p, 0, sizeof p);
    if ((*res = kiln_lt_cache_find(&c_cache, &key))) return NULL;
    if (bias) { // a bias plan cuBLASLt had no fused algorithm for
        const kiln_lt_key k0 = ckey(n, in, out, y_f32, bias, acc, 0, align);
        if ((*res = kiln_lt_cache_find(&c_cache, &k0))) return NULL;
    }
    if ((err = kiln_lt_plan_create(&p, &key, CWS_BYTES, TUNE_MAX))) goto done;
    if (!p.ncand && bias) { // no fused algorithm: the plain GEMM, a kernel adds the bias
        kiln_lt_plan_destroy(&p);
        key = ckey(n, in, out, y_f32, bias, acc, 0, align);
        if ((err = kiln_lt_plan_create(&p, &key, CWS_BYTES, TUNE_MAX))) goto done;
    }
    if (!p.ncand) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no bf16 algorithm for %lldx%lldx%lld (y %s)", (long long)n,
                          (long long)out, (long long)in, y_f32 ? "f32" : "bf16");
        goto done;
    }
    p.user = p.key.bias; // fused
    *res = kiln_lt_cache_add(&c_cache, &p);
done:
    kiln_lt_plan_destroy(&p);
    return err;
}

// 0 off, 1 a few calls a candidate, 2 sustained, 3 cached (cplan_cached)
int tune_on(void) {
    const char *e = getenv("KILN_CLIP_GEMM_TUNE");
    return !(e && *e && strcmp(e, "0")) ? 0 : !strcmp(e, "sustained") ? 2 : !strcmp(e, "cached") ? 3 : 1;
}

// the fastest candidate on this call's inputs: 1 warm-up + 3 timed runs each (sustained: ~0.2 s at 600
// TFLOP/s) into a scratch output (so an accumulating call's y is untouched); a candidate that fails is skipped
kiln_error *cplan_tune(kiln_lt_plan *p, const void *w, const void *x, const void *bias, void *ws, cudaStream_t st,
                       int sustained) {
    kiln_error *err = NULL;
    void *ys = NULL;
    p->tuned = 1;
    if (p->ncand < 2) return NULL;
    CUDA_TRY(cudaMalloc(&ys, (size_t)(p->key.m * p->key.n) * (p->key.c_f32 ? 4 : 2)));
    if (bias && p->user && (err = kiln_lt_plan_set_bias(p, bias))) goto done;
    {
        const double flop = 2.0 * (double)p->key.m * (double)p->key.n * (double)p->key.k;
        const int calls = sustained ? (int)fmin(20000.0, fmax(3.0, 0.2 * 600e12 / flop)) : 3;
        const char *lg = getenv("KILN_CLIP_GEMM_TUNE_LOG");
        err = kiln_lt_plan_tune_n(p, ys, x, w, 0.0f, ws, CWS_BYTES, st, calls, lg && *lg && strcmp(lg, "0") ? stderr : NULL);
    }
done:
    if (ys) cudaFree(ys);
    return err;
}

// The tuning cache's key of a plan: this GPU (name, SMs, compute capability), cuBLASLt's version and everything
// the heuristic's candidate list depends on (the plan's key; the workspace is always CWS_BYTES), with the list's
// length. The value is the index of the sustained pick in that list.
void cache_key(const kiln_lt_plan *p, char *key, size_t cap) {
    cudaDeviceProp prop;
    int dev = 0;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) cudaGetLastError();
    for (char *s = prop.name; *s; s++)
        if (*s == '\t' || *s == '\n' || *s == '|') *s = ' ';
    const kiln_lt_key *k = &p->key;
    snprintf(key, cap, "clip_gemm 1|%s|%d SMs|sm_%d%d|cublasLt %zu|%lld %lld %lld %d %d %d %d %d %u %u %u|%d", prop.name,
             prop.multiProcessorCount, prop.major, prop.minor, cublasLtGetVersion(), (long long)k->m, (long long)k->n,
             (long long)k->k, k->ta, k->tb, k->c_f32, k->bias, k->tag, k->align[0], k->align[1], k->align[2], p->ncand);
}

void cache_warn(kiln_error *e) {
    static int warned;
    if (!warned) {
        warned = 1;
        kiln_log(KILN_LOG_WARN, "CLIP GEMM tuning cache: %s (the picks are timed again)", kiln_error_msg(e));
    }
    kiln_error_free(e);
}

// KILN_CLIP_GEMM_TUNE=cached: a large shape's sustained pick (>= 1e10 FLOP a call: L/14's and B/32's chunks), made
// once per machine and kept in the tuning cache (include/kiln/tune_cache.h, file clip_gemm_tune.txt), so later
// processes skip the ~0.2 s a candidate and make the same pick (the same bits); smaller shapes keep the
// heuristic's first. A cache that cannot be read or written costs a warning and the timing, never the call.
kiln_error *cplan_cached(kiln_lt_plan *p, const void *w, const void *x, const void *bias, void *ws, cudaStream_t st) {
    const double flop = 2.0 * (double)p->key.m * (double)p->key.n * (double)p->key.k;
    char key[512], *path = NULL;
    long idx = -1;
    int found = 0;
    kiln_error *err = NULL, *e;
    p->tuned = 1;
    if (p->ncand < 2 || flop < 1e10) return NULL;
    cache_key(p, key, sizeof key);
    e = kiln_tune_cache_path("clip_gemm_tune.txt", &path);
    if (!e) e = kiln_tune_cache_get(path, key, &idx, &found);
    if (e) cache_warn(e), found = 0;
    if (found && idx >= 0 && idx < p->ncand) {
        p->algo = p->cand[idx];
        free(path);
        return NULL;
    }
    kiln_log(KILN_LOG_INFO, "timing cuBLASLt's %d candidates for %lldx%lldx%lld on this GPU (once: kept in %s)", p->ncand,
             (long long)p->key.m, (long long)p->key.n, (long long)p->key.k, path ? path : "no cache");
    err = cplan_tune(p, w, x, bias, ws, st, 1);
    idx = -1;
    for (int i = 0; i < p->ncand && !err; i++)
        if (!memcmp(&p->algo, &p->cand[i], sizeof p->algo)) idx = i;
    if (!err && path && idx >= 0 && (e = kiln_tune_cache_put(path, key, idx))) cache_warn(e);
    free(path);
    return err;
}

// y[r, :] += b (the bias when no fused algorithm exists)
template <typename Y> __global__ void add_bias_rows(Y *y, const Y *b, int64_t n, int64_t out) {
    pdl_wait();
    const int64_t total = n * out;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        if constexpr (sizeof(Y) == 4) y[i] += b[i % out];
        else y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(b[i % out]));
    }
}

// KILN_CLIP_GEMM, read at every call (tests switch it): 1 "own" (fc1 + quick_gelu as one own GEMM: the default
// where the device is a Hopper, sm_90, the own GEMM's only target), 0 "cublaslt" (cuBLASLt, then a quick_gelu
// pass), 2 "own-all" (fc1 as with "own", and every CLIP projection the own GEMM takes through it: bf16 out with
// or without the bias; f32 out accumulated with an f32 bias; the rest through cuBLASLt). Why fc1 by default: the
// quick_gelu pass over the 4096-wide activations is gone, and the own deferred tile runs fc1 + quick_gelu at 643-654
// TFLOP/s against cuBLASLt + the pass's 530-539 (session 11; docs/perf.md): ViT-L/14's tower +5% over cuBLASLt.
int hopper(void) {
    static int h = -1;
    if (h < 0) {
        int dev = 0, major = 0;
        h = cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9;
        cudaGetLastError();
    }
    return h;
}
int own_mode(void) {
    const char *e = getenv("KILN_CLIP_GEMM");
    if (e && !strcmp(e, "own-all")) return 2;
    if (e && !strcmp(e, "own")) return 1;
    if (e && !strcmp(e, "cublaslt")) return 0;
    return hopper();
}
int own_fits(const void *y, const void *x, const void *w, const void *bias, int64_t in, int64_t out, int y_f32,
             int accumulate) {
    const int al = !(((uintptr_t)y | (uintptr_t)x | (uintptr_t)w) & 15) && !((uintptr_t)bias & 7);
    return al && in % 64 == 0 && out % 128 == 0 && (y_f32 ? accumulate && bias : !accumulate);
}

} // namespace

extern "C" kiln_error *kiln_clip_linear_cuda(void *y, int y_f32, const kiln_bf16 *x, const kiln_bf16 *w,
                                             const void *bias, int64_t n, int64_t in, int64_t out, int accumulate,
                                             void *stream) {
    kiln_error *err = NULL;
    kiln_lt_plan *p = NULL;
    const float beta = accumulate ? 1.0f : 0.0f;
    const uint32_t al[3] = {kiln_lt_align(w), kiln_lt_align(x), kiln_lt_align(y)};
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || out <= 0) return NULL;
    if (in <= 0) return kiln_errorf(KILN_EINVAL, "CLIP linear (CUDA): %lld inputs", (long long)in);
    if (own_mode() == 2 && own_fits(y, x, w, bias, in, out, y_f32, accumulate)) {
        err = kiln_gemm_tc_cuda(n, out, in, x, in, w, in, y, out,
                                y_f32 ? KILN_GEMM_TC_BIAS_ADD_F32 : bias ? KILN_GEMM_TC_BIAS : KILN_GEMM_TC_NONE, bias,
                                y_f32, stream);
        return err ? kiln_error_wrap(err, "CLIP linear %lldx%lldx%lld (CUDA, KILN_CLIP_GEMM=own-all)", (long long)n,
                                     (long long)out, (long long)in)
                   : NULL;
    }
    void *ws = NULL;
    int tm;
    pthread_mutex_lock(&c_lock);
    if ((err = cws_for(st, &ws))) goto done;
    if ((err = cplan_get(n, in, out, y_f32, bias != NULL, accumulate, al, &p))) goto done;
    if (!p->tuned && (tm = tune_on()) &&
        (err = tm == 3 ? cplan_cached(p, w, x, bias, ws, st) : cplan_tune(p, w, x, bias, ws, st, tm == 2)))
        goto done;
    if (bias && p->user && (err = kiln_lt_plan_set_bias(p, bias))) goto done;
    CUBLAS_TRY(kiln_lt_plan_run(p, NULL, y, x, w, beta, ws, CWS_BYTES, st));
    if (bias && !p->user) {
        const int64_t total = n * out, blocks = (total + 255) / 256;
        const int g = (int)(blocks < 1048576 ? blocks : 1048576);
        if (y_f32) kiln_launch(add_bias_rows<float>, g, 256, 0, st, (float *)y, (const float *)bias, n, out);
        else kiln_launch(add_bias_rows<__nv_bfloat16>, g, 256, 0, st, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)bias,
                         n, out);
        CUDA_TRY(cudaGetLastError());
    }
done:
    pthread_mutex_unlock(&c_lock);
    return err ? kiln_error_wrap(err, "CLIP linear %lldx%lldx%lld (CUDA)", (long long)n, (long long)out, (long long)in)
               : NULL;
}

extern "C" int kiln_clip_gemm_own(void) { return own_mode() != 0; }

// fc1 + quick_gelu as one pass over the output: kiln's own Hopper GEMM (gemm_tc.cu) with the bias and quick_gelu
// in its epilogue (cuBLASLt's epilogues have no quick_gelu). Its default tile rounds the bias-added pre-activation
// to bf16 before quick_gelu, as cuBLASLt + the separate pass does.
extern "C" kiln_error *kiln_clip_linear_quick_gelu_cuda(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w,
                                                        const kiln_bf16 *bias, int64_t n, int64_t in, int64_t out,
                                                        void *stream) {
    kiln_error *err;
    if (n <= 0 || out <= 0) return NULL;
    err = kiln_gemm_tc_cuda(n, out, in, x, in, w, in, y, out, KILN_GEMM_TC_BIAS_QUICK_GELU, bias, 0, stream);
    return err ? kiln_error_wrap(err, "CLIP linear + quick_gelu %lldx%lldx%lld (CUDA, KILN_CLIP_GEMM=own)", (long long)n,
                                 (long long)out, (long long)in)
               : NULL;
}
