// The experts' grouped GEMM (kiln_grouped_gemm_cuda): one projection of every expert over the rows that the
// dispatch permuted into expert order, in one of several ways ("paths") that bench/moe_gpu.sh measures
// against one dense GEMM of the same total size:
//   grouped     cuBLAS's cublasGemmGroupedBatchedEx, one call (per-expert cublasGemmEx where it refuses)
//   lt_loop     one cuBLASLt GEMM per expert on the caller's stream
//   lt_streams  the same GEMMs spread over side streams (fork/join with events): a per-expert GEMM of the
//               [cuda] layer is ~one wave of tiles, so alone it pays its fill and tail; several at once
//               fill each other's gaps
//   lt_chunks   forward and input gradients as ONE pointer-array batched cuBLASLt GEMM over equal chunks of
//               rows (an expert's last chunk ends at its last row, overlapping the one before it: those
//               rows are computed twice from the same inputs by the same kernel, so both writes carry the
//               same bits); weight gradients as lt_loop
//   lt_mixed    forward and input gradients as lt_chunks but without overlap: each expert's rows past its
//               last full chunk are a GEMM of their own on a side stream, filling the batched GEMM's tail;
//               an expert with KILN_GROUPED_SOLO rows or more (default 8192) is one GEMM, not chunks;
//               weight gradients as lt_streams, except where every expert has the same row count (balanced
//               routing): then ONE strided-batched GEMM over the experts (KILN_GROUPED_DW_BATCH=0: as lt_streams)
// Every path computes each output element in exactly one GEMM (no split across calls, no atomics), so a
// path gives the same bits on every run. KILN_GROUPED_TUNE=1 times the cuBLASLt heuristic's candidates for
// each large plan once and keeps the fastest: still the same bits run after run within a process, but two
// processes may pick different algorithms (last-bit differences), so it is off by default.
//
// The row counts change every step, and the cuBLASLt heuristic costs tens of microseconds, more than a
// small GEMM: plans are cached per *bucket* of row counts (8 buckets per octave; the fixed sizes and every
// leading dimension exact) and the matrix layouts are set to the true sizes before each call; where
// cuBLASLt refuses the bucket's algorithm for the true sizes, an exact plan is made.
#include <cublas_v2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "experts_dw_wg.h"
#include "gemm_lt.h"
#include "kiln/cuda_ops.h"
#include "kiln/log.h"
#include "launch.cuh"

namespace {

enum { P_GROUPED, P_LT_LOOP, P_LT_CHUNKS, P_LT_STREAMS, P_LT_MIXED, NPATHS };
const char *const path_names[NPATHS + 1] = {"grouped", "lt_loop", "lt_chunks", "lt_streams", "lt_mixed", NULL};
// The default: forward/dX batched over chunks (0.83-0.91 of dense in GPU run r8, as lt_chunks) and dW on
// side streams. Should it fail on a call that overwrites its output (a cuBLASLt refusal), the process falls
// back to cuBLAS's grouped call with a warning; paths chosen explicitly report their errors.
const int DEFAULT_PATH = P_LT_MIXED;
const char *const PATH_LIST = "grouped, lt_loop, lt_chunks, lt_streams, lt_mixed";

// 8 side streams: lt_mixed's per-expert remainders (~128 rows: 16 tiles each) run as 8 GEMMs at once, ~the
// machine's 132 SMs, in the batched GEMM's tail
enum { MAX_STREAMS = 8, DEFAULT_STREAMS = 8, DEFAULT_CHUNK = 256, MAX_PLANS = 512, TUNE_CANDS = 8 };
// lt_mixed: an expert with at least KILN_GROUPED_SOLO rows is one GEMM of its own, not chunks (see chunked;
// 0 = never, the default until it has run in the trainer: its op test passed on the H200, run r23). 8192 rows =
// half the [cuda] benchmark's tokens is the intended setting: only the concentrated routing of the first ~200
// steps reaches it; the spread routing after (busiest expert ~5000 rows) keeps the batched chunks.
enum { DEFAULT_SOLO = 0 };
const double TUNE_MIN_FLOPS = 2e9; // smaller GEMMs keep the heuristic's first choice
const size_t WS_BYTES = 32u << 20;

// One lock for the host side of every call: the plan table, the lazily created handles, streams, events
// and workspaces (slot 0 for the caller's stream, 1..MAX_STREAMS for the side streams: GEMMs running at
// the same time must not share a workspace).
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
int g_path_set = -1; // kiln_grouped_gemm_set_path; -1: the environment's choice
int g_default_failed; // the default path failed once: the process uses P_GROUPED instead
cublasHandle_t g_blas;
int g_grouped_f32_refused; // this cuBLAS has no grouped kernel with f32 C for bf16 inputs
void *g_ws[MAX_STREAMS + 1];
cudaStream_t g_side[MAX_STREAMS];
cudaEvent_t g_fork, g_join[MAX_STREAMS];
int g_defer;                 // the call in progress leaves its side streams running (kiln_grouped_gemm_cuda_async)
int g_pending[MAX_STREAMS];  // side stream i has work no stream has waited for yet (its g_join[i] marks the end)
long g_tune; // KILN_GROUPED_TUNE=1: time the heuristic's candidates once per large plan, keep the fastest; 2: every plan (tests)
void *g_tune_c;           // a scratch C for timing accumulating GEMMs (their real C must not change)
size_t g_tune_c_bytes;

kiln_error *env_int(const char *name, long lo, long hi, long def, long mult, long *out) {
    const char *v = getenv(name);
    char *end = NULL;
    *out = def;
    if (!v || !*v) return NULL;
    const long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi || x % mult)
        return kiln_errorf(KILN_EINVAL, "%s='%s': expected an integer in %ld..%ld%s", name, v, lo, hi,
                           mult > 1 ? ", a multiple of 64" : "");
    *out = x;
    return NULL;
}

kiln_error *path_lookup(const char *name, int *out) {
    for (int i = 0; i < NPATHS; i++)
        if (!strcmp(name, path_names[i])) {
            *out = i;
            return NULL;
        }
    return kiln_errorf(KILN_EINVAL, "grouped GEMM path '%s': expected one of %s", name, PATH_LIST);
}

// the path in effect: kiln_grouped_gemm_set_path's, else KILN_GROUPED_GEMM's (read on every call so a test
// or a benchmark can switch it), else the default (*is_default, nullable, says so)
kiln_error *path_now(int *out, int *is_default = NULL) {
    if (is_default) *is_default = 0;
    if (g_path_set >= 0) {
        *out = g_path_set;
        return NULL;
    }
    const char *v = getenv("KILN_GROUPED_GEMM");
    if (!v || !*v) {
        *out = g_default_failed ? P_GROUPED : DEFAULT_PATH;
        if (is_default) *is_default = !g_default_failed;
        return NULL;
    }
    kiln_error *err = path_lookup(v, out);
    return err ? kiln_error_wrap(err, "environment variable KILN_GROUPED_GEMM") : NULL;
}

// ---- cuBLASLt plans (src/cuda/gemm_lt.h) ----

kiln_lt_plan g_plans[MAX_PLANS];
uint64_t g_hashes[MAX_PLANS];
kiln_lt_cache g_cache = {g_plans, g_hashes, 0, MAX_PLANS};

// 16-row steps up to 64, then 8 steps per power of two: 1000 -> 1024, 1100 -> 1152, 4779 -> 5120
int64_t bucket(int64_t x) {
    if (x <= 64) return (x + 15) / 16 * 16;
    int64_t p = 64;
    while (p * 2 <= x) p *= 2;
    const int64_t step = p / 8;
    return (x + step - 1) / step * step;
}

uint32_t align_of(uintptr_t bits) { return kiln_lt_align((const void *)bits); }

// batch > 0: pointer-array batched (the A, B, C arguments of the call are device arrays of pointers); exact:
// the sizes are the call's own (the key's tag), else a bucket's
kiln_error *plan_get(int64_t m, int64_t n, int64_t k, int64_t batch, int ta, int tb, int c_f32, int exact,
                     const uint32_t align[3], kiln_lt_plan **out) {
    kiln_error *err = NULL;
    kiln_lt_plan p;
    kiln_lt_key key = kiln_lt_key_make(m, n, k, ta, tb, c_f32, align);
    key.batch = batch, key.mode = batch > 0 ? KILN_LT_PTR_ARRAY : KILN_LT_SINGLE, key.tag = exact;
    if ((*out = kiln_lt_cache_find(&g_cache, &key))) return NULL;
    if ((err = kiln_lt_plan_create(&p, &key, WS_BYTES, TUNE_CANDS))) return err;
    if (!p.ncand) {
        kiln_lt_plan_destroy(&p);
        return kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no bf16 algorithm for %lldx%lldx%lld (batch %lld)",
                           (long long)m, (long long)n, (long long)k, (long long)batch);
    }
    *out = kiln_lt_cache_add(&g_cache, &p);
    return NULL;
}

// KILN_GROUPED_TUNE=1: time each candidate on this call's inputs (3 calls after 1 warm-up) and keep the fastest.
// A GEMM that overwrites C runs on its own C (the real call rewrites it); one that accumulates runs on a
// scratch C. Host-synchronizing, once per plan.
kiln_error *tune(kiln_lt_plan *p, int slot, void *c, const void *a, const void *b, float beta, cudaStream_t st) {
    kiln_error *err = NULL;
    const size_t cbytes = (size_t)(p->cm * p->cn) * (p->key.c_f32 ? 4 : 2);
    p->tuned = 1;
    if (beta != 0.0f) {
        if (p->cbatch > 0) return NULL; // no scratch for pointer arrays (the chunks never accumulate)
        if (g_tune_c_bytes < cbytes) {
            if (g_tune_c) CUDA_TRY(cudaFree(g_tune_c));
            g_tune_c = NULL, g_tune_c_bytes = 0;
            CUDA_TRY(cudaMalloc(&g_tune_c, cbytes));
            CUDA_TRY(cudaMemsetAsync(g_tune_c, 0, cbytes, st)); // on st: the legacy stream would not order it before the tuning
            g_tune_c_bytes = cbytes;
        }
        c = g_tune_c;
    }
    err = kiln_lt_plan_tune(p, c, a, b, beta, g_ws[slot], WS_BYTES, st);
done:
    return err;
}

// row-major C[m,n] = op(A) op(B) (+ C when beta = 1) on `st` with workspace `slot`; batch > 0: a, b, c are
// device arrays of batch pointers, each aligned to align[]. Called with g_lock held.
kiln_error *lt_gemm(int slot, void *c, int c_f32, const void *a, const void *b, int64_t m, int64_t n, int64_t k,
                    int ta, int tb, float beta, int64_t batch, const uint32_t align[3], cudaStream_t st) {
    kiln_error *err = NULL;
    kiln_lt_plan *p = NULL;
    cublasStatus_t s;
    if (!g_ws[slot]) CUDA_TRY(cudaMalloc(&g_ws[slot], WS_BYTES));
    // only the sizes routing changes are bucketed (rows: m, or k for TN; the batch): they set no leading dimension
    if ((err = plan_get(ta ? m : bucket(m), n, ta ? bucket(k) : k, batch > 0 ? bucket(batch) : 0, ta, tb, c_f32, 0, align,
                        &p)))
        goto done;
    if ((err = kiln_lt_plan_resize(p, m, n, k, batch))) goto done;
    if (g_tune && !p->tuned && (g_tune == 2 || 2.0 * (double)m * n * k * (batch > 0 ? batch : 1) >= TUNE_MIN_FLOPS) &&
        (err = tune(p, slot, c, a, b, beta, st)))
        goto done;
    s = kiln_lt_plan_run(p, NULL, c, a, b, beta, g_ws[slot], WS_BYTES, st);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) { // the bucket's algorithm does not fit
        if ((err = plan_get(m, n, k, batch, ta, tb, c_f32, 1, align, &p))) goto done;
        if ((err = kiln_lt_plan_resize(p, m, n, k, batch))) goto done;
        s = kiln_lt_plan_run(p, NULL, c, a, b, beta, g_ws[slot], WS_BYTES, st);
    }
    CUBLAS_TRY(s);
done:
    if (err)
        err = kiln_error_wrap(err, "cuBLASLt GEMM %lldx%lldx%lld%s (%c%c, C %s)", (long long)m, (long long)n, (long long)k,
                              batch > 0 ? " batched" : "", ta ? 'T' : 'N', tb ? 'T' : 'N', c_f32 ? "f32" : "bf16");
    return err;
}

// The weight gradients (TN) of experts that all have the same row count me (balanced routing) as ONE
// strided-batched GEMM: C_e[m,n] (+)= A_eᵀ B_e with A_e, B_e the expert's rows, one launch whose tiles cover
// every expert (no per-expert wave tail). *ran = 0 where cuBLASLt has no algorithm for it (the caller runs
// the per-expert GEMMs instead). Called with g_lock held.
kiln_error *dw_strided(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, int64_t E, int64_t m, int64_t n,
                       int64_t me, float beta, int *ran, cudaStream_t st) {
    kiln_error *err = NULL;
    kiln_lt_plan *p = NULL;
    const size_t ce = c_f32 ? 4 : 2;
    const uint32_t al[3] = {align_of((uintptr_t)b | (uintptr_t)(me * n * 2)), align_of((uintptr_t)a | (uintptr_t)(me * m * 2)),
                            align_of((uintptr_t)c | (uintptr_t)((size_t)(m * n) * ce))};
    kiln_lt_key key = kiln_lt_key_make(m, n, me, 1, 0, c_f32, al);
    cublasStatus_t s;
    *ran = 0;
    key.mode = KILN_LT_STRIDED, key.batch = E, key.stride[0] = me * m, key.stride[1] = me * n, key.stride[2] = m * n;
    if (!g_ws[0]) CUDA_TRY(cudaMalloc(&g_ws[0], WS_BYTES));
    if (!(p = kiln_lt_cache_find(&g_cache, &key))) {
        kiln_lt_plan q;
        if ((err = kiln_lt_plan_create(&q, &key, WS_BYTES, TUNE_CANDS))) goto done;
        if (!q.ncand) {
            kiln_lt_plan_destroy(&q);
            return NULL;
        }
        p = kiln_lt_cache_add(&g_cache, &q);
    }
    if (g_tune && !p->tuned && (err = tune(p, 0, c, a, b, beta, st))) goto done;
    s = kiln_lt_plan_run(p, NULL, c, a, b, beta, g_ws[0], WS_BYTES, st);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) return NULL;
    CUBLAS_TRY(s);
    *ran = 1;
done:
    return err ? kiln_error_wrap(err, "strided-batched dW (%lld experts of %lld rows)", (long long)E, (long long)me) : NULL;
}

// ---- per-expert GEMMs ----

struct job {
    void *c;
    const void *a, *b;
    int64_t m, n, k;
    int ta, tb;
    uint32_t align[3];
    size_t zero; // > 0: not a GEMM but clearing these bytes of c (an expert without rows, its dW written)
};

job make_job(void *c, const void *a, const void *b, int64_t m, int64_t n, int64_t k, int ta, int tb) {
    job j = {c, a, b, m, n, k, ta, tb, {align_of((uintptr_t)b), align_of((uintptr_t)a), align_of((uintptr_t)c)}, 0};
    return j;
}

job zero_job(void *c, size_t bytes) {
    job j = {c, NULL, NULL, 0, 0, 0, 0, 0, {0, 0, 0}, bytes};
    return j;
}

// one job on stream st with workspace `slot` (called with g_lock held)
kiln_error *job_run(const job *j, int c_f32, float beta, int slot, cudaStream_t st) {
    kiln_error *err = NULL;
    if (j->zero) {
        CUDA_TRY(cudaMemsetAsync(j->c, 0, j->zero, st));
        return NULL;
    }
    return lt_gemm(slot, j->c, c_f32, j->a, j->b, j->m, j->n, j->k, j->ta, j->tb, beta, 0, j->align, st);
done:
    return kiln_error_wrap(err, "clearing an empty expert's weight gradient");
}

kiln_error *side_streams(int ns) {
    kiln_error *err = NULL;
    if (!g_fork) CUDA_TRY(cudaEventCreateWithFlags(&g_fork, cudaEventDisableTiming));
    for (int i = 0; i < ns; i++) {
        if (!g_side[i]) CUDA_TRY(cudaStreamCreateWithFlags(&g_side[i], cudaStreamNonBlocking));
        if (!g_join[i]) CUDA_TRY(cudaEventCreateWithFlags(&g_join[i], cudaEventDisableTiming));
        if (!g_ws[1 + i]) CUDA_TRY(cudaMalloc(&g_ws[1 + i], WS_BYTES));
    }
done:
    return err;
}

// A pointer-array batched GEMM for run_jobs to launch on the caller's stream (see chunked)
struct batched_call {
    void **dc;
    const void *const *da, *const *db;
    int64_t batch, m, n, k;
    int tb;
    uint32_t align[3];
};

// The jobs one after the other on st (ns <= 1), or spread over ns side streams, largest first onto the least
// loaded one, while the main jobs `mj` (solo experts, nmj of them) and then `bc` (nullable) run on st: the side
// streams start after everything before on st, and st continues after all of them.
kiln_error *run_jobs(const job *js, int nj, int c_f32, float beta, int ns, const job *mj, int nmj, const batched_call *bc,
                     cudaStream_t st) {
    kiln_error *err = NULL;
    int *order = NULL, forked = 0;
    double load[MAX_STREAMS] = {0};
    if (ns > nj) ns = nj;
    if (ns <= 1) {
        for (int i = 0; i < nmj && !err; i++)
            err = lt_gemm(0, mj[i].c, c_f32, mj[i].a, mj[i].b, mj[i].m, mj[i].n, mj[i].k, mj[i].ta, mj[i].tb, beta, 0,
                          mj[i].align, st);
        if (bc && !err)
            err = lt_gemm(0, (void *)bc->dc, c_f32, (const void *)bc->da, (const void *)bc->db, bc->m, bc->n, bc->k, 0,
                          bc->tb, 0.0f, bc->batch, bc->align, st);
        for (int i = 0; i < nj && !err; i++) err = job_run(&js[i], c_f32, beta, 0, st);
        return err;
    }
    if ((err = side_streams(ns))) goto done;
    if (!(order = (int *)malloc((size_t)nj * sizeof *order))) {
        err = kiln_errorf(KILN_ENOMEM, "%d expert GEMMs", nj);
        goto done;
    }
    for (int i = 0; i < nj; i++) order[i] = i;
    for (int i = 1; i < nj; i++) // insertion sort by work, largest first (stable: ties keep expert order)
        for (int j = i; j > 0; j--) {
            const job *x = &js[order[j - 1]], *y = &js[order[j]];
            if ((double)x->m * x->n * x->k >= (double)y->m * y->n * y->k) break;
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    // the fork is marked before the main jobs, but the side streams are told to wait for it only after those are
    // queued: where the host is late (the forward's first GEMM waits on it), the GPU starts on them sooner
    CUDA_TRY(cudaEventRecord(g_fork, st));
    for (int i = 0; i < nmj && !err; i++)
        err = lt_gemm(0, mj[i].c, c_f32, mj[i].a, mj[i].b, mj[i].m, mj[i].n, mj[i].k, mj[i].ta, mj[i].tb, beta, 0,
                      mj[i].align, st);
    if (!err && bc)
        err = lt_gemm(0, (void *)bc->dc, c_f32, (const void *)bc->da, (const void *)bc->db, bc->m, bc->n, bc->k, 0, bc->tb,
                      0.0f, bc->batch, bc->align, st);
    for (int i = 0; i < ns; i++) CUDA_TRY(cudaStreamWaitEvent(g_side[i], g_fork, 0));
    forked = 1;
    if (err) goto done;
    for (int i = 0; i < nj && !err; i++) {
        const job *j = &js[order[i]];
        int s = 0;
        for (int q = 1; q < ns; q++)
            if (load[q] < load[s]) s = q;
        load[s] += (double)j->m * j->n * j->k;
        err = job_run(j, c_f32, beta, 1 + s, g_side[s]);
    }
done:
    if (forked && g_defer && !err) { // the caller joins later (kiln_grouped_gemm_join)
        for (int i = 0; i < ns; i++) {
            const cudaError_t e1 = cudaEventRecord(g_join[i], g_side[i]);
            if (e1 != cudaSuccess) {
                err = kiln_errorf(KILN_EIO, "marking side stream %d: %s", i, cudaGetErrorString(e1));
                break;
            }
            g_pending[i] = 1;
        }
        forked = err != NULL; // on an error, join now
    }
    if (forked) // join even after an error: nothing later on st may overtake the side streams
        for (int i = 0; i < ns; i++) {
            g_pending[i] = 0; // st waits for everything queued on side stream i so far
            cudaError_t e1 = cudaEventRecord(g_join[i], g_side[i]), e2 = cudaStreamWaitEvent(st, g_join[i], 0);
            if (!err && (e1 != cudaSuccess || e2 != cudaSuccess))
                err = kiln_errorf(KILN_EIO, "joining side stream %d: %s", i,
                                  cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
        }
    free(order);
    return err;
}

// ---- device pointer arrays, written by a kernel whose argument carries them (stream-ordered; a pageable
// host-to-device copy may wait for the device) ----

enum { PTR_PACK = 480 };
struct ptr_pack {
    const void *v[PTR_PACK];
    int n, off;
};
__global__ void put_ptrs_kernel(void **d, const ptr_pack pk) {
    pdl_wait();
    for (int i = threadIdx.x; i < pk.n; i += blockDim.x) d[pk.off + i] = (void *)pk.v[i];
}
kiln_error *put_ptrs(void **d, const void *const *h, int64_t n, cudaStream_t st) {
    kiln_error *err = NULL;
    ptr_pack pk;
    for (int64_t o = 0; o < n; o += PTR_PACK) {
        pk.n = (int)(n - o < PTR_PACK ? n - o : PTR_PACK), pk.off = (int)o;
        memcpy(pk.v, h + o, (size_t)pk.n * sizeof *h);
        kiln_launch(put_ptrs_kernel, 1, 128, 0, st, d, pk);
        CUDA_TRY(cudaGetLastError());
    }
done:
    return err;
}

// NT/NN over the experts' chunks of `ch` rows as ONE batched GEMM (see the top of the file); experts with
// fewer rows than a chunk are per-expert jobs, on side streams alongside the batched GEMM when ns > 1.
// Experts with at least `solo` rows (solo > 0) are not chunked: each is one GEMM on st, before the batched one.
// Chunks cost a big expert ~9% against one GEMM over its rows (GPU run of session 4: 256-row chunks at 0.91 of
// the dense rate for gate_up forward, 0.86-0.88 for down), and from init the router sends ~98% of a layer's
// tokens to one expert for the first ~200 steps (run r17): that expert's GEMM is then the dense GEMM itself.
kiln_error *chunked(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs, int64_t E,
                    int64_t n, int64_t k, int tb, int64_t ch, int64_t solo, int ns, cudaStream_t st) {
    kiln_error *err = NULL;
    const size_t ce = c_f32 ? 4 : 2;
    int64_t nch = 0, i = 0;
    int nj = 0, nmj = 0;
    uintptr_t bits = 0;
    // with side streams, an expert's rows past its last full chunk are a GEMM of their own there, running
    // in the batched GEMM's tail; without them, the last chunk overlaps the one before it
    const int tails = ns > 1;
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e];
        if (me >= ch && !(solo > 0 && me >= solo)) nch += tails ? me / ch : (me + ch - 1) / ch;
    }
    const void **h = (const void **)malloc((size_t)(3 * nch + 1) * sizeof *h);
    job *js = (job *)malloc((size_t)(2 * E) * sizeof *js), *mj = js + E;
    void **d = NULL;
    if (!h || !js) {
        err = kiln_errorf(KILN_ENOMEM, "chunked GEMM: %lld chunks", (long long)nch);
        goto done;
    }
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e], o = offs[e];
        if (!me) continue;
        if (me < ch) {
            js[nj++] = make_job((char *)c + (size_t)(o * n) * ce, a + o * k, b + e * n * k, me, n, k, 0, tb);
            continue;
        }
        if (solo > 0 && me >= solo) {
            mj[nmj++] = make_job((char *)c + (size_t)(o * n) * ce, a + o * k, b + e * n * k, me, n, k, 0, tb);
            continue;
        }
        const int64_t full = tails ? me / ch * ch : me;
        for (int64_t r = 0; r < full; r += ch, i++) {
            const int64_t s0 = o + (r + ch <= me ? r : me - ch);
            h[i] = a + s0 * k, h[nch + i] = b + e * n * k, h[2 * nch + i] = (char *)c + (size_t)(s0 * n) * ce;
            bits |= (uintptr_t)h[i] | (uintptr_t)h[nch + i] | (uintptr_t)h[2 * nch + i];
        }
        if (full < me)
            js[nj++] = make_job((char *)c + (size_t)((o + full) * n) * ce, a + (o + full) * k, b + e * n * k, me - full, n,
                                k, 0, tb);
    }
    if (nch) {
        const uint32_t al = align_of(bits | (uintptr_t)(k * 2) | (uintptr_t)(n * 2) | (uintptr_t)(n * ce));
        CUDA_TRY(cudaMallocAsync((void **)&d, (size_t)(3 * nch) * sizeof *d, st));
        if ((err = put_ptrs(d, h, 3 * nch, st))) goto done;
        const batched_call bc = {d + 2 * nch, (const void *const *)d, (const void *const *)(d + nch), nch, ch, n, k, tb,
                                 {al, al, al}};
        err = run_jobs(js, nj, c_f32, 0.0f, ns, mj, nmj, &bc, st);
    } else {
        err = run_jobs(js, nj, c_f32, 0.0f, ns, mj, nmj, NULL, st);
    }
done:
    if (d) cudaFreeAsync(d, st);
    free(h), free(js);
    return err ? kiln_error_wrap(err, "chunked GEMM (%lld chunks of %lld rows)", (long long)nch, (long long)ch) : NULL;
}

// ---- cuBLAS's grouped call ----

kiln_error *blas_handle(cudaStream_t st) {
    kiln_error *err = NULL;
    if (!g_blas) CUBLAS_TRY(cublasCreate(&g_blas));
    CUBLAS_TRY(cublasSetStream(g_blas, st));
done:
    return err;
}

kiln_error *grouped(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs, int64_t E,
                    int64_t m, int64_t n, int64_t k, int tn, int nt, int accumulate, int *looped, cudaStream_t st) {
    kiln_error *err = NULL;
    const size_t ce = c_f32 ? 4 : 2;
    int G = 0, odd = 0;
    cublasOperation_t *ta = (cublasOperation_t *)malloc((size_t)E * sizeof *ta);
    cublasOperation_t *tb = (cublasOperation_t *)malloc((size_t)E * sizeof *tb);
    int *mm = (int *)malloc((size_t)E * 7 * sizeof(int));
    float *alpha = (float *)malloc((size_t)E * 2 * sizeof(float));
    const void **ptrs = (const void **)malloc((size_t)E * 3 * sizeof *ptrs);
    int *nv, *kv, *lda, *ldb, *ldc, *gs;
    float *beta;
    void **dptrs = NULL;
    if (!ta || !tb || !mm || !alpha || !ptrs) {
        err = kiln_errorf(KILN_ENOMEM, "grouped GEMM: %lld experts", (long long)E);
        goto done;
    }
    nv = mm + E, kv = mm + 2 * E, lda = mm + 3 * E, ldb = mm + 4 * E, ldc = mm + 5 * E, gs = mm + 6 * E;
    beta = alpha + E;
    // row-major C[M,N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our B
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e], o = offs[e];
        if (!me) continue;
        const int64_t M = tn ? m : me, K = tn ? me : k; // the row-major problem C[M,n] = op(A)[M,K] op(B)[K,n]
        const int tra = tn, trb = nt;
        const void *A = tn ? (const void *)(a + o * m) : (const void *)(a + o * k);
        const void *B = tn ? (const void *)(b + o * n) : (const void *)(b + e * n * k);
        void *C = tn ? (char *)c + (size_t)(e * m * n) * ce : (char *)c + (size_t)(o * n) * ce;
        ta[G] = trb ? CUBLAS_OP_T : CUBLAS_OP_N;
        tb[G] = tra ? CUBLAS_OP_T : CUBLAS_OP_N;
        mm[G] = (int)n, nv[G] = (int)M, kv[G] = (int)K;
        lda[G] = (int)(trb ? K : n);
        ldb[G] = (int)(tra ? M : K);
        ldc[G] = (int)n;
        gs[G] = 1;
        alpha[G] = 1.0f, beta[G] = accumulate ? 1.0f : 0.0f;
        ptrs[G] = B, ptrs[E + G] = A, ptrs[2 * E + G] = C;
        odd |= (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) & 15) || ((size_t)lda[G] * 2 & 15) ||
               ((size_t)ldb[G] * 2 & 15) || ((size_t)ldc[G] * ce & 15);
        G++;
    }
    if (!G) goto done;
    if ((err = blas_handle(st))) goto done;
    {
        const cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
        const void **pa = ptrs, **pb = ptrs + E;
        void **pc = (void **)(ptrs + 2 * E);
        cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
        // cuBLAS cannot look at pointers that live on the device: it assumes them aligned as far as the leading
        // dimensions allow (weights 2 bytes into a flat buffer faulted with "misaligned address"). Such groups
        // take the per-expert path below, whose cublasGemmEx sees each pointer.
        if (!odd && !(c_f32 && g_grouped_f32_refused)) {
            CUDA_TRY(cudaMallocAsync((void **)&dptrs, (size_t)G * 3 * sizeof *dptrs, st));
            if ((err = put_ptrs(dptrs, pa, G, st)) || (err = put_ptrs(dptrs + G, pb, G, st)) ||
                (err = put_ptrs(dptrs + 2 * G, (const void *const *)pc, G, st)))
                goto done;
            s = cublasGemmGroupedBatchedEx(g_blas, ta, tb, mm, nv, kv, alpha, (const void *const *)dptrs, CUDA_R_16BF, lda,
                                           (const void *const *)(dptrs + G), CUDA_R_16BF, ldb, beta, dptrs + 2 * G, ct,
                                           ldc, G, gs, CUBLAS_COMPUTE_32F);
        }
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
            // unaligned, or no grouped kernel for the combination (cuBLAS 13.1 has none for bf16 in, f32 out):
            // one GEMM per expert
            if (!odd && c_f32) g_grouped_f32_refused = 1; // asked once per process
            if (looped) *looped = 1;
            for (int g = 0; g < G; g++)
                CUBLAS_TRY(cublasGemmEx(g_blas, ta[g], tb[g], mm[g], nv[g], kv[g], &alpha[g], pa[g], CUDA_R_16BF, lda[g],
                                        pb[g], CUDA_R_16BF, ldb[g], &beta[g], pc[g], ct, ldc[g], CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
        } else {
            CUBLAS_TRY(s);
        }
    }
done:
    if (dptrs) cudaFreeAsync(dptrs, st);
    free(ta), free(tb), free(mm), free(alpha), free(ptrs);
    return err;
}

} // namespace

extern "C" const char *const *kiln_grouped_gemm_paths(void) { return path_names; }

extern "C" kiln_error *kiln_grouped_gemm_set_path(const char *name) {
    int p = -1;
    if (name) {
        kiln_error *err = path_lookup(name, &p);
        if (err) return err;
    }
    pthread_mutex_lock(&g_lock);
    g_path_set = p;
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

extern "C" kiln_error *kiln_grouped_gemm_path(const char **name) {
    int p = DEFAULT_PATH;
    pthread_mutex_lock(&g_lock);
    kiln_error *err = path_now(&p);
    pthread_mutex_unlock(&g_lock);
    *name = err ? NULL : path_names[p];
    return err;
}

// ---- the weight gradients on wgmma (experts_dw_wg.cu) ----

// KILN_GROUPED_DW=wg: lt_mixed's bf16 weight gradients as one persistent wgmma kernel (experts_dw_wg.cu) instead of
// a cuBLASLt GEMM an expert on the side streams; lt (the default until it has been measured in the trainer): the
// latter. Read at each call, as the other switches.
static int dw_wg_wanted(void) {
    const char *v = getenv("KILN_GROUPED_DW");
    return v && !strcmp(v, "wg");
}

// One launch for every expert's C_e (KILN_GROUPED_DW_CTAS: its grid, 0 = one CTA an SM). Deferred (g_defer)
// with side streams, it runs on the next side stream in turn and is joined later, so that the caller's stream goes
// on as with the per-expert GEMMs (the two projections' kernels then also fill each other's last round); else on
// st. Called with g_lock held.
static kiln_error *dw_wg(void *c, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs, int64_t E, int64_t m,
                         int64_t n, int accumulate, double *sq, int ns, cudaStream_t st) {
    static int next; // the side stream of the next deferred launch
    kiln_error *err = NULL;
    long ctas = 0;
    if ((err = env_int("KILN_GROUPED_DW_CTAS", 0, 1 << 20, 0, 1, &ctas))) return err;
    if (!g_defer || ns <= 1)
        return kiln_experts_dw_wg((kiln_bf16 *)c, a, b, offs, E, m, n, accumulate, (int)ctas, sq, st);
    const int i = next++ % ns;
    if ((err = side_streams(i + 1))) return err;
    CUDA_TRY(cudaEventRecord(g_fork, st));
    CUDA_TRY(cudaStreamWaitEvent(g_side[i], g_fork, 0));
    err = kiln_experts_dw_wg((kiln_bf16 *)c, a, b, offs, E, m, n, accumulate, (int)ctas, sq, g_side[i]);
    { // joined later (kiln_grouped_gemm_join); after an error, now: nothing later on st may overtake it
        const cudaError_t e1 = cudaEventRecord(g_join[i], g_side[i]);
        if (e1 != cudaSuccess && !err) err = kiln_errorf(KILN_EIO, "marking side stream %d: %s", i, cudaGetErrorString(e1));
        if (!err) g_pending[i] = 1;
        else cudaStreamWaitEvent(st, g_join[i], 0);
    }
done:
    return err;
}

// kiln_grouped_gemm_cuda, and with defer its _async twin (side streams left running); sq (TN, written bf16 C): the
// experts' sums of squares where the wgmma kernel runs, *sq_done = 1 then
static kiln_error *grouped_gemm(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs,
                                int64_t E, int64_t m, int64_t n, int64_t k, const char *layout, int accumulate,
                                int *looped, int defer, double *sq, int *sq_done, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int tn = layout && !strcmp(layout, "TN"), nt = layout && !strcmp(layout, "NT"),
              nn = layout && !strcmp(layout, "NN");
    const size_t ce = c_f32 ? 4 : 2;
    int path = DEFAULT_PATH, locked = 0, nj = 0, is_default = 0, ran = 0; // ran: a cuBLASLt path started
    int zero_jobs = 0, wg = 0;
    long ns = DEFAULT_STREAMS, ch = DEFAULT_CHUNK, dwb = 1, solo = DEFAULT_SOLO;
    job *js = NULL;
    if (looped) *looped = 0;
    if (sq_done) *sq_done = 0;
    if (accumulate < KILN_GG_WRITE || accumulate > KILN_GG_WRITE_KEEP_EMPTY)
        return kiln_errorf(KILN_EINVAL, "grouped GEMM: accumulate %d, expected 0 (=), 1 (+=) or 2 (=, empty experts "
                           "kept)", accumulate);
    // keep_empty: an expert without rows is the caller's to treat as zero (TN), its C_e left as it is
    const int keep_empty = accumulate == KILN_GG_WRITE_KEEP_EMPTY;
    accumulate = accumulate == KILN_GG_ADD;
    if (!(tn || nt || nn))
        return kiln_errorf(KILN_EINVAL, "grouped GEMM: layout '%s', expected NT, NN or TN", layout ? layout : "(null)");
    if (E < 1 || m < 0 || n < 1 || (!tn && k < 1) || (tn && m < 1) || n > INT32_MAX || k > INT32_MAX || m > INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "grouped GEMM %s: E=%lld m=%lld n=%lld k=%lld", layout, (long long)E,
                           (long long)m, (long long)n, (long long)k);
    for (int64_t e = 0; e < E; e++)
        if (offs[e + 1] < offs[e] || offs[e] < 0)
            return kiln_errorf(KILN_EINVAL, "grouped GEMM %s: expert %lld's offsets %d..%d decrease", layout,
                               (long long)e, offs[e], offs[e + 1]);
    pthread_mutex_lock(&g_lock);
    locked = 1;
    g_defer = defer;
    if ((err = path_now(&path, &is_default)) ||
        (err = env_int("KILN_GROUPED_STREAMS", 1, MAX_STREAMS, DEFAULT_STREAMS, 1, &ns)) ||
        (err = env_int("KILN_GROUPED_CHUNK", 64, 4096, DEFAULT_CHUNK, 64, &ch)) ||
        (err = env_int("KILN_GROUPED_TUNE", 0, 2, 0, 1, &g_tune)) ||
        (err = env_int("KILN_GROUPED_DW_BATCH", 0, 1, 1, 1, &dwb)) ||
        (err = env_int("KILN_GROUPED_SOLO", 0, INT32_MAX, DEFAULT_SOLO, 1, &solo)))
        goto done;
    // an expert without rows: its weight gradient is an empty sum. Where the GEMMs run on side streams the clearing
    // does too (a job of its own), beside the other experts' GEMMs, and with defer beside whatever the caller's
    // stream does next: under concentrated routing most experts may be empty, 48 MB of f32 each at the [cuda] size.
    // the weight gradients (bf16) as one persistent wgmma kernel where KILN_GROUPED_DW=wg and it takes the shape
    if (tn && !c_f32 && path == P_LT_MIXED && dw_wg_wanted()) {
        static int said; // once a process: a request the kernel does not take, so that no timing is misread
        wg = kiln_experts_dw_wg_ok(E, offs[E], m, n, a, b, c);
        if (!wg && !said)
            said = 1, kiln_log(KILN_LOG_WARN, "KILN_GROUPED_DW=wg: the wgmma kernel does not take %lld experts of %lld x "
                               "%lld (or this device): cuBLASLt instead", (long long)E, (long long)m, (long long)n);
    }
    zero_jobs = !wg && tn && !accumulate && !keep_empty && (path == P_LT_STREAMS || path == P_LT_MIXED) && ns > 1;
    if (tn && !accumulate && !keep_empty && !zero_jobs)
        for (int64_t e = 0; e < E; e++)
            if (offs[e + 1] == offs[e])
                CUDA_TRY(cudaMemsetAsync((char *)c + (size_t)(e * m * n) * ce, 0, (size_t)(m * n) * ce, st));
    if (path == P_GROUPED) {
        err = grouped(c, c_f32, a, b, offs, E, m, n, k, tn, nt, accumulate, looped, st);
        goto done;
    }
    ran = 1; // from here on an error is the GEMM's own, not the configuration's
    if (wg) {
        if (!(err = dw_wg(c, a, b, offs, E, m, n, accumulate, accumulate ? NULL : sq, (int)ns, st)) && sq && sq_done)
            *sq_done = !accumulate;
        goto done;
    }
    // the chunks overwrite their overlap, so they cannot accumulate
    if ((path == P_LT_CHUNKS || path == P_LT_MIXED) && !tn && !accumulate) {
        err = chunked(c, c_f32, a, b, offs, E, n, k, nt, ch, path == P_LT_MIXED ? solo : 0, path == P_LT_MIXED ? (int)ns : 0,
                      st);
        goto done;
    }
    if (tn && path == P_LT_MIXED && dwb) {
        // equal row counts (balanced routing): one strided-batched GEMM for every expert's dW
        const int64_t me = offs[1] - offs[0];
        int eq = me > 0 && E > 1, done_b = 0;
        for (int64_t e = 1; e < E && eq; e++) eq = offs[e + 1] - offs[e] == me;
        if (eq && (err = dw_strided(c, c_f32, a + offs[0] * m, b + offs[0] * n, E, m, n, me, accumulate ? 1.0f : 0.0f,
                                    &done_b, st)))
            goto done;
        if (done_b) goto done;
    }
    if (!(js = (job *)malloc((size_t)E * sizeof *js))) {
        err = kiln_errorf(KILN_ENOMEM, "grouped GEMM: %lld experts", (long long)E);
        goto done;
    }
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e], o = offs[e];
        if (!me && zero_jobs) js[nj++] = zero_job((char *)c + (size_t)(e * m * n) * ce, (size_t)(m * n) * ce);
        if (!me) continue;
        if (tn) js[nj++] = make_job((char *)c + (size_t)(e * m * n) * ce, a + o * m, b + o * n, m, n, me, 1, 0);
        else js[nj++] = make_job((char *)c + (size_t)(o * n) * ce, a + o * k, b + e * n * k, me, n, k, 0, nt);
    }
    if (looped) *looped = 1;
    err = run_jobs(js, nj, c_f32, accumulate ? 1.0f : 0.0f, path == P_LT_STREAMS || path == P_LT_MIXED ? (int)ns : 0,
                   NULL, 0, NULL, st);
done:
    if (err && ran && is_default && path != P_GROUPED && !accumulate) {
        // a runtime failure of the default path (never a bad setting: that is reported); the output is
        // overwritten whole, so the call can be redone another way
        kiln_log(KILN_LOG_WARN, "grouped GEMM: the default path %s failed (%s); cuBLAS's grouped call from now on",
                 path_names[path], kiln_error_msg(err));
        kiln_error_free(err);
        g_default_failed = 1, path = P_GROUPED;
        if (looped) *looped = 0;
        for (int64_t e = 0; zero_jobs && e < E && !err; e++) // the empty experts' clearing was one of the jobs
            if (offs[e + 1] == offs[e]) {
                const cudaError_t ce0 = cudaMemsetAsync((char *)c + (size_t)(e * m * n) * ce, 0, (size_t)(m * n) * ce, st);
                if (ce0 != cudaSuccess)
                    err = kiln_errorf(KILN_EIO, "clearing expert %lld's weight gradient: %s", (long long)e,
                                      cudaGetErrorString(ce0));
            }
        if (!err) err = grouped(c, c_f32, a, b, offs, E, m, n, k, tn, nt, accumulate, looped, st);
    }
    g_defer = 0;
    if (locked) pthread_mutex_unlock(&g_lock);
    free(js);
    if (err)
        err = kiln_error_wrap(err, "grouped GEMM %s (%lld experts, m=%lld n=%lld k=%lld, C %s, path %s)", layout,
                              (long long)E, (long long)m, (long long)n, (long long)k, c_f32 ? "f32" : "bf16",
                              path_names[path]);
    return err;
}

extern "C" kiln_error *kiln_grouped_gemm_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b,
                                              const int32_t *offs, int64_t E, int64_t m, int64_t n, int64_t k,
                                              const char *layout, int accumulate, int *looped, void *stream) {
    return grouped_gemm(c, c_f32, a, b, offs, E, m, n, k, layout, accumulate, looped, 0, NULL, NULL, stream);
}

extern "C" kiln_error *kiln_grouped_gemm_cuda_async(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b,
                                                    const int32_t *offs, int64_t E, int64_t m, int64_t n, int64_t k,
                                                    const char *layout, int accumulate, void *stream) {
    return grouped_gemm(c, c_f32, a, b, offs, E, m, n, k, layout, accumulate, NULL, 1, NULL, NULL, stream);
}

extern "C" kiln_error *kiln_grouped_gemm_dw_sq_cuda_async(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b,
                                                          const int32_t *offs, int64_t E, int64_t m, int64_t n,
                                                          int accumulate, double *sq, int *sq_done, void *stream) {
    return grouped_gemm(c, c_f32, a, b, offs, E, m, n, 0, "TN", accumulate, NULL, 1, sq, sq_done, stream);
}

extern "C" kiln_error *kiln_grouped_gemm_join(void *stream) {
    kiln_error *err = NULL;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (g_pending[i]) {
            CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, g_join[i], 0));
            g_pending[i] = 0;
        }
done:
    pthread_mutex_unlock(&g_lock);
    return err ? kiln_error_wrap(err, "joining the grouped GEMMs' side streams") : NULL;
}
