// ZAYA's QK norm (head vectors to L2 norm `scale`, times the per-KV-head temperature) and partial RoPE
// (HF rotate-half), forward and backward, separately (the CPU ops' twins) and fused in one pass. Head dims
// that are multiples of 32 up to 256 (ZAYA's 128): four vectors a warp side by side, eight lanes each (the g8
// kernels); other dims up to QK_BATCH_DIM four a warp one after another, wider ones one a warp; RoPE's pairs
// (i, i + rot_dim/2) meet in shared memory. The temperature's gradient is one value per vector, then a
// fixed-order sum per head: deterministic.
#include <stdlib.h>

#include "ops_common.cuh"
#include "launch.cuh"

#define WARPS 4

// norm? then rope? of one head vector v staged in shared memory (sh: dim floats; ss: this lane's sum of squares of
// its elements), stored as bf16 at yv; inv[v] saved when norm. Both forward kernels run exactly this, so they give
// the same bits.
template <bool NORM, bool ROPE, int V>
static __device__ __forceinline__ void qk_fwd_vec(bf16 *yv, float *sh, float ss, int64_t v, float *inv, const float *temp,
                                                  const float *inv_freq, int64_t t, int64_t heads, int64_t dim,
                                                  int64_t half, int64_t pos0, float scale, float eps, int lane) {
    if (NORM) {
        ss = warp_sum(ss);
        const double nrm = sqrt((double)ss), iv = 1.0 / (nrm > eps ? nrm : (double)eps);
        if (lane == 0 && inv) inv[v] = (float)iv;
        const float f = (float)(scale * iv * (temp ? temp[v % heads] : 1.0f));
        for (int64_t j = lane * V; j < dim; j += 32 * V)
#pragma unroll
            for (int k = 0; k < V; k++) sh[j + k] *= f;
    }
    __syncwarp();
    if (ROPE) {
        const float pos = (float)(pos0 + (v / heads) % t);
        for (int64_t i = lane; i < half; i += 32) {
            const float ang = pos * inv_freq[i], c = cosf(ang), s = sinf(ang);
            const float x1 = sh[i], x2 = sh[i + half];
            sh[i] = x1 * c - x2 * s;
            sh[i + half] = x2 * c + x1 * s;
        }
        __syncwarp();
    }
    for (int64_t j = lane * V; j < dim; j += 32 * V) {
        float o[V];
#pragma unroll
        for (int k = 0; k < V; k++) o[k] = sh[j + k];
        stv<V>(yv, j, o);
    }
}

// dx = norm'(rope⁻¹(dy)) of one head vector v whose dy is staged in shared memory (sh, rotated in place); ldx(j, xe)
// loads x's elements j .. j+V-1 (from global memory or from a staged copy). dtp[v] = the vector's term of dtemp.
// Both backward kernels run exactly this, so they give the same bits.
template <bool NORM, bool ROPE, int V, typename LX>
static __device__ __forceinline__ void qk_bwd_vec(bf16 *dxv, float *dtp, float *sh, LX ldx, int64_t v,
                                                  const float *temp, const float *inv, const float *inv_freq, int64_t t,
                                                  int64_t heads, int64_t dim, int64_t half, int64_t pos0, float scale,
                                                  float eps, int lane) {
    float o[V], xe[V];
    if (ROPE) { // the rotation's adjoint: rotate by the opposite angle
        const float pos = (float)(pos0 + (v / heads) % t);
        for (int64_t i = lane; i < half; i += 32) {
            const float ang = pos * inv_freq[i], c = cosf(ang), s = -sinf(ang);
            const float g1 = sh[i], g2 = sh[i + half];
            sh[i] = g1 * c - g2 * s;
            sh[i + half] = g2 * c + g1 * s;
        }
        __syncwarp();
    }
    if (NORM) {
        float dot = 0;
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
            ldx(j, xe);
#pragma unroll
            for (int k = 0; k < V; k++) dot += sh[j + k] * xe[k];
        }
        dot = warp_sum(dot);
        const double iv = inv[v], tt = temp ? temp[v % heads] : 1.0;
        if (dtp && lane == 0) dtp[v] = (float)(scale * iv * dot);
        const float f = (float)(scale * iv * tt);
        const int clamped = (1.0 / iv) <= eps;
        const float c = clamped ? 0.0f : (float)(dot * iv * iv);
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
            ldx(j, xe);
#pragma unroll
            for (int k = 0; k < V; k++) o[k] = f * (sh[j + k] - c * xe[k]);
            stv<V>(dxv, j, o);
        }
    } else {
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
#pragma unroll
            for (int k = 0; k < V; k++) o[k] = sh[j + k];
            stv<V>(dxv, j, o);
        }
    }
}

// y (may equal x) = rope?(norm?(x)); inv saved when norm. Lane-owned elements j = lane*V + 32*V*k (V = 4:
// 8-byte accesses), staged in shared memory; RoPE's pairs are rotated in place there, then stored.
template <bool NORM, bool ROPE, int V>
static __global__ void qk_fwd_kernel(bf16 *y, float *inv, const bf16 *x, const float *temp, const float *inv_freq,
                                     int64_t rows, int64_t t, int64_t heads, int64_t dim, int64_t rot_dim,
                                     int64_t pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *sh = shm + w * dim, e[V];
    const int64_t nvec = rows * heads, half = rot_dim / 2;
    for (int64_t v = blockIdx.x * (int64_t)WARPS + w; v < nvec; v += (int64_t)gridDim.x * WARPS) {
        const bf16 *xv = x + v * dim;
        __syncwarp();
        float ss = 0;
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
            ldv<V>(xv, j, e);
#pragma unroll
            for (int k = 0; k < V; k++) sh[j + k] = e[k], ss += e[k] * e[k];
        }
        qk_fwd_vec<NORM, ROPE, V>(y + v * dim, sh, ss, v, inv, temp, inv_freq, t, heads, dim, half, pos0, scale, eps,
                                  lane);
    }
}

// dx = norm'(rope⁻¹(dy)); dtp[v] = this vector's term of dtemp (NULL: not wanted)
template <bool NORM, bool ROPE, int V>
static __global__ void qk_bwd_kernel(bf16 *dx, float *dtp, const bf16 *dy, const bf16 *x, const float *temp,
                                     const float *inv, const float *inv_freq, int64_t rows, int64_t t, int64_t heads,
                                     int64_t dim, int64_t rot_dim, int64_t pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *sh = shm + w * dim, e[V];
    const int64_t nvec = rows * heads, half = rot_dim / 2;
    for (int64_t v = blockIdx.x * (int64_t)WARPS + w; v < nvec; v += (int64_t)gridDim.x * WARPS) {
        const bf16 *gv = dy + v * dim, *xv = NORM ? x + v * dim : x; // x may be NULL without the norm
        __syncwarp();
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
            ldv<V>(gv, j, e);
#pragma unroll
            for (int k = 0; k < V; k++) sh[j + k] = e[k];
        }
        __syncwarp();
        qk_bwd_vec<NORM, ROPE, V>(
            dx + v * dim, dtp, sh, [&](int64_t j, float (&xe)[V]) { ldv<V>(xv, j, xe); }, v, temp, inv, inv_freq, t,
            heads, dim, half, pos0, scale, eps, lane);
    }
}

// The same two kernels over NV head vectors a warp at a time (dim <= QK_BATCH_DIM): the NV vectors' loads issued
// together, then each vector's arithmetic exactly as above (the same values in the same order: the same bits).
// One vector a warp leaves a single load in flight per warp behind a chain of dependent steps (the load, a warp
// sum, f64 square root and division, sin/cos, the store): ~2 us a vector, 131k query vectors a layer at the
// [cuda] shape, so the kernels ran at a quarter of their bytes' rate. The backward stages x too (read once).
#define QK_NV 4
#define QK_BATCH_DIM 256

// Elements j..j+V-1 of the QK_NV vectors from v0 on into their rows of sh: all the loads first, then the stores
// (a vector past nvec is neither read nor used; its row of sh is left as it was)
template <int V>
static __device__ __forceinline__ void qk_stage_nv(float *sh, const bf16 *src, int64_t v0, int64_t nvec, int64_t dim,
                                                   int64_t j) {
    float e[QK_NV][V];
#pragma unroll
    for (int n = 0; n < QK_NV; n++)
        if (v0 + n < nvec) ldv<V>(src + (v0 + n) * dim, j, e[n]);
#pragma unroll
    for (int n = 0; n < QK_NV; n++)
        if (v0 + n < nvec)
#pragma unroll
            for (int k = 0; k < V; k++) sh[n * dim + j + k] = e[n][k];
}

template <bool NORM, bool ROPE, int V>
static __global__ void qk_fwd_nv_kernel(bf16 *y, float *inv, const bf16 *x, const float *temp, const float *inv_freq,
                                        int64_t rows, int64_t t, int64_t heads, int64_t dim, int64_t rot_dim,
                                        int64_t pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *shw = shm + w * QK_NV * dim;
    const int64_t nvec = rows * heads, half = rot_dim / 2;
    for (int64_t v0 = (blockIdx.x * (int64_t)WARPS + w) * QK_NV; v0 < nvec; v0 += (int64_t)gridDim.x * WARPS * QK_NV) {
        __syncwarp();
        for (int64_t j = lane * V; j < dim; j += 32 * V) qk_stage_nv<V>(shw, x, v0, nvec, dim, j);
        for (int n = 0; n < QK_NV && v0 + n < nvec; n++) {
            const int64_t v = v0 + n;
            float *sh = shw + n * dim, ss = 0;
            if (NORM)
                for (int64_t j = lane * V; j < dim; j += 32 * V)
#pragma unroll
                    for (int k = 0; k < V; k++) ss += sh[j + k] * sh[j + k];
            qk_fwd_vec<NORM, ROPE, V>(y + v * dim, sh, ss, v, inv, temp, inv_freq, t, heads, dim, half, pos0, scale,
                                      eps, lane);
        }
    }
}

template <bool NORM, bool ROPE, int V>
static __global__ void qk_bwd_nv_kernel(bf16 *dx, float *dtp, const bf16 *dy, const bf16 *x, const float *temp,
                                        const float *inv, const float *inv_freq, int64_t rows, int64_t t, int64_t heads,
                                        int64_t dim, int64_t rot_dim, int64_t pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *shw = shm + w * 2 * QK_NV * dim, *shx = shw + QK_NV * dim;
    const int64_t nvec = rows * heads, half = rot_dim / 2;
    for (int64_t v0 = (blockIdx.x * (int64_t)WARPS + w) * QK_NV; v0 < nvec; v0 += (int64_t)gridDim.x * WARPS * QK_NV) {
        __syncwarp();
        for (int64_t j = lane * V; j < dim; j += 32 * V) {
            qk_stage_nv<V>(shw, dy, v0, nvec, dim, j);
            if (NORM) qk_stage_nv<V>(shx, x, v0, nvec, dim, j);
        }
        __syncwarp();
        for (int n = 0; n < QK_NV && v0 + n < nvec; n++) {
            const int64_t v = v0 + n;
            const float *xs = shx + n * dim;
            qk_bwd_vec<NORM, ROPE, V>(
                dx + v * dim, dtp, shw + n * dim,
                [&](int64_t j, float (&xe)[V]) {
#pragma unroll
                    for (int k = 0; k < V; k++) xe[k] = xs[j + k];
                },
                v, temp, inv, inv_freq, t, heads, dim, half, pos0, scale, eps, lane);
        }
    }
}

// Head dims that are multiples of 32 up to 256 (ZAYA's 128): four head vectors a warp side by side, eight lanes
// each (lane l8 of a group owns the 4-element chunks l8*4 + 32 j, 8-byte accesses). The nv kernels above walk
// their four vectors one after another, each through the whole dependent chain (a 32-lane sum, an f64 square
// root and division, 64-bit index divisions, sin/cos): at the [cuda] shape they issued ~3x the instructions
// their bytes need and ran at ~1 TB/s. Here the four chains run in the same instructions, the sums take three
// shuffles, and the indices are 32-bit (nvec < 2^31). The same formulas; sums in another order (not the bits
// of the nv kernels). The RoPE pairs meet in shared memory, rows padded by 8 floats (no bank conflicts).
#define G8_PAD 8
static int aligned8(const void *p) { return ((uintptr_t)p & 7) == 0; }
template <int E> static __device__ __forceinline__ void g8_load(float (&e)[E], const bf16 *p, int l8, bool ok) {
#pragma unroll
    for (int j = 0; j < E / 4; j++) {
        if (ok) ldv<4>(p, l8 * 4 + 32 * j, e + 4 * j);
        else e[4 * j] = e[4 * j + 1] = e[4 * j + 2] = e[4 * j + 3] = 0.0f;
    }
}
template <int E> static __device__ __forceinline__ void g8_store(bf16 *p, const float (&e)[E], int l8) {
#pragma unroll
    for (int j = 0; j < E / 4; j++) stv<4>(p, l8 * 4 + 32 * j, e + 4 * j);
}
static __device__ __forceinline__ float g8_sum(float v) { // over the 8 lanes of a group
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 4);
}
// RoPE on the vector's first rot_dim = 2 half elements (through sh) at position pos; SIGN -1: the adjoint
template <int E, int SIGN>
static __device__ __forceinline__ void g8_rope(float (&e)[E], float *sh, const float *inv_freq, float pos, int half,
                                               int l8) {
#pragma unroll
    for (int j = 0; j < E / 4; j++) stv<4>(sh, l8 * 4 + 32 * j, e + 4 * j);
    __syncwarp();
    for (int i = l8; i < half; i += 8) {
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        if (SIGN < 0) s = -s;
        const float x1 = sh[i], x2 = sh[i + half];
        sh[i] = x1 * c - x2 * s;
        sh[i + half] = x2 * c + x1 * s;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < E / 4; j++) ldv<4>(sh, l8 * 4 + 32 * j, e + 4 * j);
    __syncwarp(); // the next vector's staging overwrites sh
}

template <bool NORM, bool ROPE, int E>
static __global__ void __launch_bounds__(32 * WARPS)
    qk_fwd_g8_kernel(bf16 *y, float *inv, const bf16 *x, const float *temp, const float *inv_freq, int nvec, int t,
                     int heads, int half, int pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    constexpr int dim = 8 * E;
    const int lane = threadIdx.x & 31, l8 = lane & 7;
    float *sh = shm + (threadIdx.x >> 3) * (dim + G8_PAD);
    for (int v0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * 4; v0 < nvec; v0 += gridDim.x * WARPS * 4) {
        const int v = v0 + (lane >> 3);
        const bool ok = v < nvec;
        float e[E];
        g8_load<E>(e, x + (int64_t)v * dim, l8, ok);
        if (NORM) {
            float ss = 0;
#pragma unroll
            for (int k = 0; k < E; k++) ss += e[k] * e[k];
            ss = g8_sum(ss);
            const double nrm = sqrt((double)ss), iv = 1.0 / (nrm > eps ? nrm : (double)eps);
            if (ok && l8 == 0 && inv) inv[v] = (float)iv;
            const float f = (float)(scale * iv * (temp && ok ? temp[v % heads] : 1.0f));
#pragma unroll
            for (int k = 0; k < E; k++) e[k] *= f;
        }
        if (ROPE) g8_rope<E, 1>(e, sh, inv_freq, (float)(pos0 + (v / heads) % t), half, l8);
        if (ok) g8_store<E>(y + (int64_t)v * dim, e, l8);
    }
}

template <bool NORM, bool ROPE, int E>
static __global__ void __launch_bounds__(32 * WARPS)
    qk_bwd_g8_kernel(bf16 *dx, float *dtp, const bf16 *dy, const bf16 *x, const float *temp, const float *inv,
                     const float *inv_freq, int nvec, int t, int heads, int half, int pos0, float scale, float eps) {
    pdl_wait();
    extern __shared__ __align__(16) float shm[];
    constexpr int dim = 8 * E;
    const int lane = threadIdx.x & 31, l8 = lane & 7;
    float *sh = shm + (threadIdx.x >> 3) * (dim + G8_PAD);
    for (int v0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * 4; v0 < nvec; v0 += gridDim.x * WARPS * 4) {
        const int v = v0 + (lane >> 3);
        const bool ok = v < nvec;
        float e[E], xe[E];
        g8_load<E>(e, dy + (int64_t)v * dim, l8, ok);
        if (NORM) g8_load<E>(xe, x + (int64_t)v * dim, l8, ok); // both loads in flight before the rotation
        if (ROPE) g8_rope<E, -1>(e, sh, inv_freq, (float)(pos0 + (v / heads) % t), half, l8);
        if (NORM) {
            float dot = 0;
#pragma unroll
            for (int k = 0; k < E; k++) dot += e[k] * xe[k];
            dot = g8_sum(dot);
            const double iv = ok ? inv[v] : 1.0, tt = temp && ok ? temp[v % heads] : 1.0;
            if (dtp && ok && l8 == 0) dtp[v] = (float)(scale * iv * dot);
            const float f = (float)(scale * iv * tt);
            const float c = (1.0 / iv) <= eps ? 0.0f : (float)(dot * iv * iv);
#pragma unroll
            for (int k = 0; k < E; k++) e[k] = f * (e[k] - c * xe[k]);
        }
        if (ok) g8_store<E>(dx + (int64_t)v * dim, e, l8);
    }
}

// the grouped kernels' head dims (multiples of 32 up to 256) and index range
static int qk_g8(int64_t nvec, int64_t t, int64_t heads, int64_t dim, int64_t pos0, const void *a, const void *b,
                 const void *c) {
    return dim % 32 == 0 && dim <= 256 && nvec < 2147483647 - 64 && t < 2147483647 && heads < 2147483647 &&
           pos0 >= 0 && pos0 + t < 2147483647 && aligned8(a) && aligned8(b) && (!c || aligned8(c));
}
static size_t g8_smem(bool rope, int64_t dim) { return rope ? WARPS * 4 * (size_t)(dim + G8_PAD) * sizeof(float) : 0; }
#define G8_DIMS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

// Other head vectors up to QK_BATCH_DIM go four a warp (the nv kernels); wider ones (up to 2048) one a warp: four
// at 2048 would stage 4 warps x 4 vectors x 2048 floats (x2 backward: 256 KB) in a block's shared memory.
static int qk_batch(int64_t dim) { return dim <= QK_BATCH_DIM; }

static kiln_error *check_shape(const char *op, int64_t heads, int64_t dim, int64_t rot_dim) {
    if (dim > 2048 || rot_dim > dim || rot_dim < 0 || heads <= 0)
        return kiln_errorf(KILN_EINVAL, "%s: unsupported head shape (heads %lld, dim %lld, rot_dim %lld)", op,
                           (long long)heads, (long long)dim, (long long)rot_dim);
    return NULL;
}

template <bool NORM, bool ROPE>
static kiln_error *qk_fwd(const char *op, bf16 *y, float *inv, const bf16 *x, const float *temp, const float *inv_freq,
                          int64_t rows, int64_t t, int64_t heads, int64_t dim, int64_t rot_dim, int64_t pos0,
                          float scale, float eps, void *stream) {
    kiln_error *err = NULL;
    if (rows <= 0 || dim <= 0) return NULL;
    KILN_TRY(check_shape(op, heads, dim, rot_dim));
    if (qk_g8(rows * heads, t > 0 ? t : 1, heads, dim, pos0, y, x, NULL)) {
        const int nvec = (int)(rows * heads);
        switch (dim / 32) {
#define G8_FWD(X)                                                                                                     \
    case X:                                                                                                           \
        kiln_launch(qk_fwd_g8_kernel<NORM, ROPE, 4 * X>, grid_for((nvec + 3) / 4, WARPS), 32 * WARPS,                 \
                    g8_smem(ROPE, dim), (cudaStream_t)stream, y, inv, x, temp, inv_freq, nvec,                        \
                    (int)(t > 0 ? t : 1), (int)heads, (int)(rot_dim / 2), (int)pos0, scale, eps);                     \
        break;
            G8_DIMS(G8_FWD)
#undef G8_FWD
        }
    } else if (qk_batch(dim) && dim % 4 == 0 && aligned8(y) && aligned8(x))
        kiln_launch(qk_fwd_nv_kernel<NORM, ROPE, 4>, grid_for((rows * heads + QK_NV - 1) / QK_NV, WARPS), 32 * WARPS,
                    WARPS * QK_NV * dim * sizeof(float), (cudaStream_t)stream, y, inv, x, temp, inv_freq, rows,
                    t > 0 ? t : 1, heads, dim, rot_dim, pos0, scale, eps);
    else if (qk_batch(dim))
        kiln_launch(qk_fwd_nv_kernel<NORM, ROPE, 1>, grid_for((rows * heads + QK_NV - 1) / QK_NV, WARPS), 32 * WARPS,
                    WARPS * QK_NV * dim * sizeof(float), (cudaStream_t)stream, y, inv, x, temp, inv_freq, rows,
                    t > 0 ? t : 1, heads, dim, rot_dim, pos0, scale, eps);
    else if (dim % 4 == 0 && aligned8(y) && aligned8(x))
        kiln_launch(qk_fwd_kernel<NORM, ROPE, 4>, grid_for(rows * heads, WARPS), 32 * WARPS,
                    WARPS * dim * sizeof(float), (cudaStream_t)stream, y, inv, x, temp, inv_freq, rows, t > 0 ? t : 1,
                    heads, dim, rot_dim, pos0, scale, eps);
    else
        kiln_launch(qk_fwd_kernel<NORM, ROPE, 1>, grid_for(rows * heads, WARPS), 32 * WARPS,
                    WARPS * dim * sizeof(float), (cudaStream_t)stream, y, inv, x, temp, inv_freq, rows, t > 0 ? t : 1,
                    heads, dim, rot_dim, pos0, scale, eps);
    LAUNCH_CHECK(op);
done:
    return err;
}

template <bool NORM, bool ROPE>
static kiln_error *qk_bwd(const char *op, bf16 *dx, float *dt, const bf16 *dy, const bf16 *x, const float *temp,
                          const float *inv, const float *inv_freq, int64_t rows, int64_t t, int64_t heads, int64_t dim,
                          int64_t rot_dim, int64_t pos0, float scale, float eps, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *dtp = NULL;
    if (rows <= 0 || dim <= 0) return NULL;
    KILN_TRY(check_shape(op, heads, dim, rot_dim));
    if (NORM && dt) CUDA_TRY(kiln_ops_scratch((void **)&dtp, (size_t)(rows * heads) * sizeof(float), st));
    if (qk_g8(rows * heads, t > 0 ? t : 1, heads, dim, pos0, dx, dy, NORM ? x : NULL)) {
        const int nvec = (int)(rows * heads);
        switch (dim / 32) {
#define G8_BWD(X)                                                                                                     \
    case X:                                                                                                           \
        kiln_launch(qk_bwd_g8_kernel<NORM, ROPE, 4 * X>, grid_for((nvec + 3) / 4, WARPS), 32 * WARPS,                 \
                    g8_smem(ROPE, dim), st, dx, dtp, dy, x, temp, inv, inv_freq, nvec, (int)(t > 0 ? t : 1),          \
                    (int)heads, (int)(rot_dim / 2), (int)pos0, scale, eps);                                           \
        break;
            G8_DIMS(G8_BWD)
#undef G8_BWD
        }
    } else if (qk_batch(dim) && dim % 4 == 0 && aligned8(dx) && aligned8(dy) && aligned8(x))
        kiln_launch(qk_bwd_nv_kernel<NORM, ROPE, 4>, grid_for((rows * heads + QK_NV - 1) / QK_NV, WARPS), 32 * WARPS,
                    WARPS * 2 * QK_NV * dim * sizeof(float), st, dx, dtp, dy, x, temp, inv, inv_freq, rows,
                    t > 0 ? t : 1, heads, dim, rot_dim, pos0, scale, eps);
    else if (qk_batch(dim))
        kiln_launch(qk_bwd_nv_kernel<NORM, ROPE, 1>, grid_for((rows * heads + QK_NV - 1) / QK_NV, WARPS), 32 * WARPS,
                    WARPS * 2 * QK_NV * dim * sizeof(float), st, dx, dtp, dy, x, temp, inv, inv_freq, rows,
                    t > 0 ? t : 1, heads, dim, rot_dim, pos0, scale, eps);
    else if (dim % 4 == 0 && aligned8(dx) && aligned8(dy) && aligned8(x))
        kiln_launch(qk_bwd_kernel<NORM, ROPE, 4>, grid_for(rows * heads, WARPS), 32 * WARPS,
                    WARPS * dim * sizeof(float), st, dx, dtp, dy, x, temp, inv, inv_freq, rows, t > 0 ? t : 1, heads,
                    dim, rot_dim, pos0, scale, eps);
    else
        kiln_launch(qk_bwd_kernel<NORM, ROPE, 1>, grid_for(rows * heads, WARPS), 32 * WARPS,
                    WARPS * dim * sizeof(float), st, dx, dtp, dy, x, temp, inv, inv_freq, rows, t > 0 ? t : 1, heads,
                    dim, rot_dim, pos0, scale, eps);
    LAUNCH_CHECK(op);
    if (dtp) CUDA_TRY(colsum_add(dt, dtp, rows, heads, st));
done:
    if (dtp) cudaFreeAsync(dtp, st);
    return err;
}

extern "C" kiln_error *kiln_l2norm_scale_forward_cuda(kiln_bf16 *y, float *inv, const kiln_bf16 *x, const float *t,
                                                      int64_t rows, int64_t heads, int64_t dim, float scale, float eps,
                                                      void *stream) {
    return qk_fwd<true, false>("l2norm_scale forward", (bf16 *)y, inv, (const bf16 *)x, t, NULL, rows, 1, heads, dim,
                               0, 0, scale, eps, stream);
}
extern "C" kiln_error *kiln_l2norm_scale_backward_cuda(kiln_bf16 *dx, float *dt, const kiln_bf16 *dy,
                                                       const kiln_bf16 *x, const float *t, const float *inv,
                                                       int64_t rows, int64_t heads, int64_t dim, float scale,
                                                       float eps, void *stream) {
    return qk_bwd<true, false>("l2norm_scale backward", (bf16 *)dx, dt, (const bf16 *)dy, (const bf16 *)x, t, inv,
                               NULL, rows, 1, heads, dim, 0, 0, scale, eps, stream);
}
extern "C" kiln_error *kiln_rope_forward_cuda(kiln_bf16 *x, const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                                              int64_t dim, int64_t rot_dim, int64_t pos0, void *stream) {
    return qk_fwd<false, true>("rope forward", (bf16 *)x, NULL, (const bf16 *)x, NULL, inv_freq, b * t, t, heads, dim,
                               rot_dim, pos0, 1.0f, 0.0f, stream);
}
extern "C" kiln_error *kiln_rope_backward_cuda(kiln_bf16 *dx, const float *inv_freq, int64_t b, int64_t t,
                                               int64_t heads, int64_t dim, int64_t rot_dim, int64_t pos0,
                                               void *stream) {
    return qk_bwd<false, true>("rope backward", (bf16 *)dx, NULL, (const bf16 *)dx, NULL, NULL, NULL, inv_freq, b * t,
                               t, heads, dim, rot_dim, pos0, 1.0f, 0.0f, stream);
}
extern "C" kiln_error *kiln_qk_norm_rope_forward_cuda(kiln_bf16 *y, float *inv, const kiln_bf16 *x, const float *temp,
                                                      const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                                                      int64_t dim, int64_t rot_dim, int64_t pos0, float scale,
                                                      float eps, void *stream) {
    return qk_fwd<true, true>("qk_norm_rope forward", (bf16 *)y, inv, (const bf16 *)x, temp, inv_freq, b * t, t,
                              heads, dim, rot_dim, pos0, scale, eps, stream);
}
extern "C" kiln_error *kiln_qk_norm_rope_backward_cuda(kiln_bf16 *dx, float *dtemp, const kiln_bf16 *dy,
                                                       const kiln_bf16 *x, const float *temp, const float *inv,
                                                       const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                                                       int64_t dim, int64_t rot_dim, int64_t pos0, float scale,
                                                       float eps, void *stream) {
    return qk_bwd<true, true>("qk_norm_rope backward", (bf16 *)dx, dtemp, (const bf16 *)dy, (const bf16 *)x, temp, inv,
                              inv_freq, b * t, t, heads, dim, rot_dim, pos0, scale, eps, stream);
}
