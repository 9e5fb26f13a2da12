// AdamW and Muon's pointwise pieces on the device, the same arithmetic as src/train/optim.c element for
// element: explicit round-to-nearest intrinsics where the C code rounds (nvcc would otherwise fuse
// multiply-adds), f64 where it computes in f64, so that CPU and GPU steps agree to the last bit or two.
//
// AdamW is one launch for all of a rank's tensors (kiln_adamw_multi): a device table of the tensors and a
// work list of fixed chunks (one block each), 4 consecutive elements per thread with 16-byte loads where
// the addresses allow, the gradient's scale (the mean over micro-batches and ranks, and the clip) applied
// on the way in, the bf16 copy written on the way out: w, g, m, v read once, w, m, v, bf16 w written once
// (30 bytes a parameter, the least this update can move). The overlapped step (one rank) runs the work list in
// slices, one launch each, and writes zeros over the gradient it read (34 bytes a parameter: the 4 of the
// separate zeroing pass it replaces).
#include <stdlib.h>

#include "ops_common.cuh"

namespace {

enum { AW_THREADS = 256, AW_CHUNK = 4096 }; // 4 elements a thread, 4 passes a block

struct adamw_seg {
    int64_t off, soff, n; // element offset of w, g, bf16 w; of m in the state (v follows at soff + n); count
    int decay, flags;     // flags: 1 = m, 2 = v at a 16-byte offset in the state; 4 = w/g at a 16-byte offset
};

struct adamw_args {
    const adamw_seg *segs;
    const int2 *work; // {tensor, chunk} per block; NULL: one tensor (`one`), block b = chunk b
    adamw_seg one;
    float *w, *state;
    const float *g;
    float *gz; // non-NULL (= g): each gradient element is overwritten with 0 once read
    bf16 *wb;
    double b1, one_b1, b2, one_b2, c1, c2, eps, lr;
    float wd, gscale;
    int vec, vec_state; // the bases allow vector accesses (w, g, bf16 w / the state)
};

// one element: kiln_adamw_step's expression with its roundings, the gradient scaled first in f32. The
// kernel is bound by memory, not by the f64 units: dividing by the bias corrections through a host
// reciprocal (3 f64 operations instead of __ddiv_rn's ~10) gave the same bits and the same time on the H200.
__device__ __forceinline__ void adamw_elem(const adamw_args &k, float wd, float gf, float &m, float &v, float &w) {
    const double gi = (double)__fmul_rn(gf, k.gscale);
    const float mi = (float)__dadd_rn(__dmul_rn(k.b1, (double)m), __dmul_rn(k.one_b1, gi));
    const float vi = (float)__dadd_rn(__dmul_rn(k.b2, (double)v), __dmul_rn(__dmul_rn(k.one_b2, gi), gi));
    m = mi, v = vi;
    const double upd = __ddiv_rn(__ddiv_rn((double)mi, k.c1), __dadd_rn(__dsqrt_rn(__ddiv_rn((double)vi, k.c2)), k.eps));
    const float t = __fsub_rn(w, __fmul_rn(wd, w));
    w = (float)__dsub_rn((double)t, __dmul_rn(k.lr, upd));
}

template <int V> __device__ __forceinline__ void ld4(const float *p, int64_t i, int cnt, float *o) {
    if (V == 4 && cnt == 4) {
        ldv<4>(p, i, o);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = j < cnt ? p[i + j] : 0.0f;
    }
}
template <int V> __device__ __forceinline__ void st4(float *p, int64_t i, int cnt, const float *o) {
    if (V == 4 && cnt == 4) {
        stv<4>(p, i, o);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < cnt) p[i + j] = o[j];
    }
}

template <int VW, int VM, int VV>
__device__ __forceinline__ void adamw_chunk(const adamw_args &k, const adamw_seg &s, int64_t c0, int64_t c1) {
    float *w = k.w + s.off, *m = k.state + s.soff, *v = m + s.n;
    const float *g = k.g + s.off;
    bf16 *wb = k.wb ? k.wb + s.off : NULL;
    const float wd = s.decay ? k.wd : 0.0f;
    for (int64_t i = c0 + 4 * (int64_t)threadIdx.x; i < c1; i += 4 * AW_THREADS) {
        const int cnt = c1 - i < 4 ? (int)(c1 - i) : 4;
        float gv[4], wv[4], mv[4], vv[4];
        ld4<VW>(g, i, cnt, gv);
        if (k.gz) {
            const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            st4<VW>(k.gz + s.off, i, cnt, zero);
        }
        ld4<VW>(w, i, cnt, wv);
        ld4<VM>(m, i, cnt, mv);
        ld4<VV>(v, i, cnt, vv);
#pragma unroll
        for (int j = 0; j < 4; j++) adamw_elem(k, wd, gv[j], mv[j], vv[j], wv[j]);
        st4<VW>(w, i, cnt, wv);
        st4<VM>(m, i, cnt, mv);
        st4<VV>(v, i, cnt, vv);
        if (wb) {
            if (VW == 4 && cnt == 4) {
                stv<4>(wb, i, wv);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j < cnt) wb[i + j] = __float2bfloat16_rn(wv[j]);
            }
        }
    }
}

__global__ void __launch_bounds__(AW_THREADS) adamw_multi_kernel(const adamw_args k) {
    const int2 wk = k.work ? k.work[blockIdx.x] : make_int2(0, (int)blockIdx.x);
    const adamw_seg s = k.work ? k.segs[wk.x] : k.one;
    const int64_t c0 = (int64_t)wk.y * AW_CHUNK, c1 = c0 + AW_CHUNK < s.n ? c0 + AW_CHUNK : s.n;
    // the alignment is uniform over the block: one branch picks the vector width of each stream
    const bool vw = k.vec && (s.flags & 4), vm = vw && k.vec_state && (s.flags & 1),
               vv = vw && k.vec_state && (s.flags & 2);
    if (vm && vv) adamw_chunk<4, 4, 4>(k, s, c0, c1);
    else if (vm) adamw_chunk<4, 4, 1>(k, s, c0, c1);
    else if (vv) adamw_chunk<4, 1, 4>(k, s, c0, c1);
    else if (vw) adamw_chunk<4, 1, 1>(k, s, c0, c1);
    else adamw_chunk<1, 1, 1>(k, s, c0, c1);
}

kiln_error *adamw_args_init(adamw_args *k, const kiln_optim_hparams *hp, double lr, int64_t t, float gscale) {
    if (t < 1) return kiln_errorf(KILN_EINVAL, "adamw step: step %lld (steps count from 1)", (long long)t);
    k->b1 = hp->beta1, k->b2 = hp->beta2, k->one_b1 = 1 - hp->beta1, k->one_b2 = 1 - hp->beta2;
    k->c1 = 1.0 - pow(hp->beta1, (double)t), k->c2 = 1.0 - pow(hp->beta2, (double)t);
    k->eps = hp->eps, k->lr = lr;
    k->wd = (float)(lr * hp->weight_decay); // a tensor without decay uses 0
    k->gscale = gscale;
    return NULL;
}

kiln_error *adamw_launch(const adamw_args &k, int64_t blocks, cudaStream_t st) {
    kiln_error *err = NULL;
    adamw_multi_kernel<<<(unsigned)blocks, AW_THREADS, 0, st>>>(k);
    LAUNCH_CHECK("adamw step");
done:
    return err;
}

} // namespace

struct kiln_adamw_multi {
    adamw_seg *segs; // device
    int2 *work;      // device
    int64_t blocks;
    int count;
    int64_t *first; // host: tensor i's chunks are work[first[i] .. first[i + 1])
};

extern "C" void kiln_adamw_multi_free(kiln_adamw_multi *p) {
    if (!p) return;
    cudaFree(p->segs);
    cudaFree(p->work);
    free(p->first);
    free(p);
}

extern "C" kiln_error *kiln_adamw_multi_create(const kiln_adamw_tensor *t, int count, kiln_adamw_multi **out) {
    kiln_error *err = NULL;
    kiln_adamw_multi *p = (kiln_adamw_multi *)calloc(1, sizeof *p);
    adamw_seg *hs = (adamw_seg *)calloc((size_t)count + 1, sizeof *hs);
    int2 *hw = NULL;
    int64_t blocks = 0;
    *out = NULL;
    if (!p || !hs || !(p->first = (int64_t *)calloc((size_t)count + 1, sizeof *p->first))) {
        err = kiln_errorf(KILN_ENOMEM, "adamw: a table of %d tensors", count);
        goto done;
    }
    p->count = count;
    for (int i = 0; i < count; i++) {
        if (t[i].n < 0 || t[i].off < 0 || t[i].soff < 0) {
            err = kiln_errorf(KILN_EINVAL, "adamw: tensor %d: offset %lld, state offset %lld, %lld elements", i,
                              (long long)t[i].off, (long long)t[i].soff, (long long)t[i].n);
            goto done;
        }
        hs[i].off = t[i].off, hs[i].soff = t[i].soff, hs[i].n = t[i].n, hs[i].decay = t[i].decay != 0;
        hs[i].flags = (t[i].soff % 4 == 0 ? 1 : 0) | ((t[i].soff + t[i].n) % 4 == 0 ? 2 : 0) | (t[i].off % 4 == 0 ? 4 : 0);
        blocks += (t[i].n + AW_CHUNK - 1) / AW_CHUNK;
    }
    if (blocks > INT32_MAX) {
        err = kiln_errorf(KILN_EINVAL, "adamw: %lld chunks of %d elements is too many", (long long)blocks, AW_CHUNK);
        goto done;
    }
    if (!(hw = (int2 *)malloc((size_t)(blocks + 1) * sizeof *hw))) {
        err = kiln_errorf(KILN_ENOMEM, "adamw: a work list of %lld chunks", (long long)blocks);
        goto done;
    }
    blocks = 0;
    for (int i = 0; i < count; i++) {
        p->first[i] = blocks;
        for (int64_t c = 0; c * AW_CHUNK < t[i].n; c++) hw[blocks++] = make_int2(i, (int)c);
    }
    p->first[count] = blocks;
    p->blocks = blocks;
    CUDA_TRY(cudaMalloc((void **)&p->segs, ((size_t)count + 1) * sizeof *hs));
    CUDA_TRY(cudaMalloc((void **)&p->work, (size_t)(blocks + 1) * sizeof *hw));
    CUDA_TRY(cudaMemcpy(p->segs, hs, (size_t)count * sizeof *hs, cudaMemcpyHostToDevice));
    if (blocks) CUDA_TRY(cudaMemcpy(p->work, hw, (size_t)blocks * sizeof *hw, cudaMemcpyHostToDevice));
done:
    free(hs);
    free(hw);
    if (err) kiln_adamw_multi_free(p);
    else *out = p;
    return err;
}

extern "C" kiln_error *kiln_adamw_multi_step_cuda(const kiln_adamw_multi *p, float *w, const float *g, float *state,
                                                  float gscale, const kiln_optim_hparams *hp, double lr, int64_t t,
                                                  kiln_bf16 *w_bf16, void *stream) {
    kiln_error *err = NULL;
    adamw_args k;
    memset(&k, 0, sizeof k);
    if (!p->blocks) return NULL;
    KILN_TRY(adamw_args_init(&k, hp, lr, t, gscale));
    k.segs = p->segs, k.work = p->work;
    k.w = w, k.g = g, k.state = state, k.wb = (bf16 *)w_bf16;
    k.vec = aligned16(w) && aligned16(g) && ((uintptr_t)w_bf16 & 7) == 0;
    k.vec_state = aligned16(state);
    err = adamw_launch(k, p->blocks, (cudaStream_t)stream);
    if (err) err = kiln_error_wrap(err, "adamw step");
    return err;
}

extern "C" kiln_error *kiln_adamw_multi_step_range_cuda(const kiln_adamw_multi *p, int t0, int t1, float *w, float *g,
                                                        float *state, float gscale, const kiln_optim_hparams *hp,
                                                        double lr, int64_t t, kiln_bf16 *w_bf16, int zero_g,
                                                        int64_t max_blocks, void *stream) {
    kiln_error *err = NULL;
    adamw_args k;
    memset(&k, 0, sizeof k);
    if (t0 < 0 || t1 > p->count || t0 > t1)
        return kiln_errorf(KILN_EINVAL, "adamw step: tensors %d..%d of a table of %d", t0, t1 - 1, p->count);
    const int64_t b0 = p->first[t0], nb = p->first[t1] - b0;
    if (!nb) return NULL;
    KILN_TRY(adamw_args_init(&k, hp, lr, t, gscale));
    // the same blocks as the whole launch's, from work[b0]: each element sees the same arithmetic
    k.segs = p->segs;
    k.w = w, k.g = g, k.gz = zero_g ? g : NULL, k.state = state, k.wb = (bf16 *)w_bf16;
    k.vec = aligned16(w) && aligned16(g) && ((uintptr_t)w_bf16 & 7) == 0;
    k.vec_state = aligned16(state);
    // at most max_blocks a launch: a launch's blocks not yet running wait in the block scheduler, where a
    // stream beside this one (of greater priority or not) finds them ahead of its own
    const int64_t step = max_blocks > 0 ? max_blocks : nb;
    for (int64_t b = 0; b < nb && !err; b += step) {
        k.work = p->work + b0 + b;
        err = adamw_launch(k, nb - b < step ? nb - b : step, (cudaStream_t)stream);
    }
    if (err) err = kiln_error_wrap(err, "adamw step (tensors %d..%d)", t0, t1 - 1);
    return err;
}

// the gradient multiplied by gscale on the way in (f32, the rounding of the separate scale pass it replaces)
static __global__ void muon_momentum_kernel(float *m, float *u, const float *g, int64_t n, float mu, float gscale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = __fmul_rn(g[i], gscale), mi = __fadd_rn(__fmul_rn(mu, m[i]), gi);
        m[i] = mi;
        u[i] = __fadd_rn(gi, __fmul_rn(mu, mi)); // Nesterov
    }
}

#define NRM_CHUNK 65536
// grid (chunks, mats): part[mat * chunks + chunk] = sum of squares over the chunk, in f64
static __global__ void muon_sumsq_kernel(double *part, const float *u, int64_t mn, int64_t chunks) {
    __shared__ double sh[32];
    const int64_t mat = blockIdx.y, c = blockIdx.x, i0 = c * NRM_CHUNK, i1 = i0 + NRM_CHUNK < mn ? i0 + NRM_CHUNK : mn;
    const float *um = u + mat * mn;
    double s = 0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += (double)um[i] * um[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[mat * chunks + c] = s;
}
// one thread per matrix: inv = 1 / (|u|_F + 1e-7), the chunks summed in order
static __global__ void muon_inv_kernel(float *inv, const double *part, int64_t mats, int64_t chunks) {
    const int64_t mat = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (mat >= mats) return;
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[mat * chunks + c];
    inv[mat] = (float)(1.0 / (sqrt(s) + 1e-7));
}
static __global__ void muon_scale_kernel(float *u, const float *inv, int64_t mn) {
    const float f = inv[blockIdx.y];
    float *um = u + blockIdx.y * mn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < mn; i += (int64_t)gridDim.x * blockDim.x)
        um[i] = __fmul_rn(um[i], f);
}

static __global__ void muon_update_kernel(float *w, const float *u, int64_t n, float wd, float lrs, bf16 *wb) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float wi = w[i];
        const float nw = __fsub_rn(__fsub_rn(wi, __fmul_rn(wd, wi)), __fmul_rn(lrs, u[i]));
        w[i] = nw;
        if (wb) wb[i] = __float2bfloat16_rn(nw);
    }
}

extern "C" kiln_error *kiln_adamw_step_cuda(float *w, const float *g, float *state, int64_t n,
                                            const kiln_optim_hparams *hp, double lr, int64_t t, int decay,
                                            kiln_bf16 *w_bf16, void *stream) {
    kiln_error *err = NULL;
    adamw_args k;
    memset(&k, 0, sizeof k);
    if (n <= 0) return NULL;
    KILN_TRY(adamw_args_init(&k, hp, lr, t, 1.0f));
    k.one.n = n, k.one.decay = decay != 0, k.one.flags = 1 | 2 | 4;
    k.w = w, k.g = g, k.state = state, k.wb = (bf16 *)w_bf16;
    k.vec = aligned16(w) && aligned16(g) && ((uintptr_t)w_bf16 & 7) == 0;
    k.vec_state = aligned16(state) && aligned16(state + n);
    err = adamw_launch(k, (n + AW_CHUNK - 1) / AW_CHUNK, (cudaStream_t)stream);
    if (err) err = kiln_error_wrap(err, "adamw step");
    return err;
}

extern "C" kiln_error *kiln_muon_momentum_scaled_cuda(float *state, float *u, const float *g, int64_t n,
                                                      const kiln_optim_hparams *hp, float gscale, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    muon_momentum_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(state, u, g, n, (float)hp->muon_momentum,
                                                                           gscale);
    LAUNCH_CHECK("muon momentum");
done:
    return err;
}

extern "C" kiln_error *kiln_muon_momentum_cuda(float *state, float *u, const float *g, int64_t n,
                                               const kiln_optim_hparams *hp, void *stream) {
    return kiln_muon_momentum_scaled_cuda(state, u, g, n, hp, 1.0f, stream);
}

extern "C" kiln_error *kiln_muon_normalize_cuda(float *u, const kiln_opt_param *p, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t mn = p->rows * p->cols, mats = p->mats, chunks = (mn + NRM_CHUNK - 1) / NRM_CHUNK;
    double *part = NULL;
    float *inv = NULL;
    int64_t bx = (mn + 255) / 256;
    if (mn <= 0 || mats <= 0) return NULL;
    if (mats > 65535 || chunks > 65535)
        return kiln_errorf(KILN_EINVAL, "muon normalize: %lld matrices of %lld elements", (long long)mats, (long long)mn);
    if (bx > 4096) bx = 4096;
    CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(mats * chunks) * sizeof(double), st));
    CUDA_TRY(kiln_ops_scratch((void **)&inv, (size_t)mats * sizeof(float), st));
    muon_sumsq_kernel<<<dim3((unsigned)chunks, (unsigned)mats), 256, 0, st>>>(part, u, mn, chunks);
    LAUNCH_CHECK("muon normalize (sums)");
    muon_inv_kernel<<<(int)((mats + 127) / 128), 128, 0, st>>>(inv, part, mats, chunks);
    LAUNCH_CHECK("muon normalize (norms)");
    muon_scale_kernel<<<dim3((unsigned)bx, (unsigned)mats), 256, 0, st>>>(u, inv, mn);
    LAUNCH_CHECK("muon normalize (scale)");
done:
    if (part) cudaFreeAsync(part, st);
    if (inv) cudaFreeAsync(inv, st);
    return err;
}

extern "C" kiln_error *kiln_muon_update_cuda(float *w, const float *u, const kiln_opt_param *p,
                                             const kiln_optim_hparams *hp, double lr, kiln_bf16 *w_bf16, void *stream) {
    kiln_error *err = NULL;
    const int64_t n = p->mats * p->rows * p->cols;
    const float scale = (float)(0.2 * sqrt((double)(p->rows > p->cols ? p->rows : p->cols)));
    const float wd = p->decay ? (float)(lr * hp->weight_decay) : 0.0f;
    const float lrs = (float)lr * scale; // the CPU's ((float)lr * scale) * u[i], left to right
    if (n <= 0) return NULL;
    muon_update_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(w, u, n, wd, lrs, (bf16 *)w_bf16);
    LAUNCH_CHECK("muon update");
done:
    return err;
}
