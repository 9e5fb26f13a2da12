// CCA's causal convolution pair on the device (the semantics of src/nn/cca_conv.c): a depthwise Conv1d
// (kernel k0) into mid, then a grouped Conv1d (kernel k1) over mid, on the input left-padded by
// P = (k0-1)+(k1-1) steps from hist. The grouped stage and its gradients are small GEMMs per group on
// shared-memory tiles (f32 FMA; the channels per group are few for tensor cores to pay off at this size).
// Weight gradients are per-chunk partials (chunks of time steps within one sequence) summed in a fixed
// order: deterministic.
#include <stdlib.h>
#include <string.h>

#include "cca_conv_gemm.cuh"
#include "launch.cuh"

#define CHUNK_T 512  // time steps per partial sum of the weight gradients

// row u' (0 .. T+P-1) of the padded input, channel c
static __device__ __forceinline__ float xp_at(const bf16 *x, const bf16 *hist, int64_t b, int64_t u, int64_t c,
                                              int64_t T, int64_t C, int64_t P) {
    if (u >= P) return __bfloat162float(x[(b * T + (u - P)) * C + c]);
    return hist ? __bfloat162float(hist[(b * P + u) * C + c]) : 0.0f;
}

// mid[b,u,c] = b0[c] + sum_j w0[c,j] xp[b,u+j,c], u < M = T+k1-1: a row (b, u) per block iteration
static __global__ void dw_fwd_kernel(float *mid, const bf16 *x, const bf16 *hist, const float *w0, const float *b0,
                                     kiln_conv_shape s) {
    pdl_wait();
    const int64_t C = s.C, T = s.T, k0 = s.k0, P = (s.k0 - 1) + (s.k1 - 1), M = T + s.k1 - 1;
    for (int64_t row = blockIdx.x; row < s.B * M; row += gridDim.x) {
        const int64_t b = row / M, u = row - b * M;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = b0[c];
            for (int64_t j = 0; j < k0; j++) acc += w0[c * k0 + j] * xp_at(x, hist, b, u + j, c, T, C, P);
            mid[row * C + c] = acc;
        }
    }
}

// the grouped stage's tiles: GT x GT outputs, K in steps of GK (grp_gemm_kernel); WT x WT, steps of KT (dw1)
#define GT 64
#define GK 32
#define WT 64
#define KT 32

// element (r, c) of a shared tile, addressed as the kernel declares it: a 2D array (the SIMT kernels) or a flat
// buffer of pitch ld (the tensor-core kernels, whose operand tiles and epilogue tile share one buffer); one
// form for both changed the SIMT kernels' address arithmetic
template <int P> static __device__ __forceinline__ float &tile_at(float (*a)[P], int r, int c, int) { return a[r][c]; }
static __device__ __forceinline__ float &tile_at(float *a, int r, int c, int ld) { return a[r * ld + c]; }

// acc[p][q] += a[p] b[q]: the SIMT kernels' 4 x 4 outputs a thread, one K index
static __device__ __forceinline__ void outer4(float (&acc)[4][4], const float *a, const float *b) {
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[p][q] += a[p] * b[q];
}

// One (sequence, group) block of the grouped forward / input-gradient GEMM, shared by grp_gemm_kernel and
// tc::gemm_kernel (the same GT x GT tiles and GK steps of K): its place in the problem, and the staging of a K
// step into shared memory: A [GT x GK] at sa, B [GK x GT] at sw (pitches lda, ldb: tile_at), nt threads.
template <int MODE> struct grp_tile {
    int C, T, k1, M, cg, K, R, r0, n0;
    int64_t b, g0;
    const float *midb, *wg;
    const bf16 *dyb;
    __device__ __forceinline__ grp_tile(const float *mid, const bf16 *dy, const float *w1, const kiln_conv_shape &s) {
        C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = (int)(s.C / s.groups), K = cg * k1;
        R = MODE == 0 ? T : M, r0 = blockIdx.x * GT, n0 = blockIdx.y * GT;
        b = blockIdx.z / s.groups, g0 = (blockIdx.z % s.groups) * (int64_t)cg;
        midb = MODE == 0 ? mid + b * M * C + g0 : NULL;
        dyb = MODE == 1 ? dy + b * T * C + g0 : NULL;
        wg = w1 + g0 * cg * k1;
    }
    template <typename TA, typename TW>
    __device__ __forceinline__ void stage(int k0, int *tj, int *tc, TA sa, int lda, TW sw, int ldb, int nt) const {
        conv_k_table<GK>(tj, tc, k0, K, cg);
        for (int e = threadIdx.x; e < GT * GK; e += nt) { // A: K fastest (contiguous channels)
            const int rr = e / GK, kl = e % GK, r = r0 + rr, j = tj[kl], c = tc[kl];
            float v = 0.0f;
            if (r < R && j >= 0) {
                if (MODE == 0) v = midb[(r + j) * C + c];
                else if (r - j >= 0 && r - j < T) v = __bfloat162float(dyb[(r - j) * C + c]);
            }
            tile_at(sa, rr, kl, lda) = v;
        }
        for (int e = threadIdx.x; e < GT * GK; e += nt) {
            // forward: K fastest (w1[co, i, j] is contiguous in i); input: columns fastest (contiguous in ci)
            const int kl = MODE == 0 ? e % GK : e / GT, nl = MODE == 0 ? e / GK : e % GT;
            const int n = n0 + nl, j = tj[kl], c = tc[kl];
            float v = 0.0f;
            if (j >= 0 && n < cg) v = MODE == 0 ? wg[(n * cg + c) * k1 + j] : wg[(c * cg + n) * k1 + j];
            tile_at(sw, kl, nl, ldb) = v;
        }
    }
    // output (r, n) of this block: y (bf16, v with the bias) or dmid
    __device__ __forceinline__ void put(void *out, int r, int n, float v) const {
        if (MODE == 0) ((bf16 *)out + b * T * C + g0)[r * C + n] = __float2bfloat16_rn(v);
        else ((float *)out + b * M * C + g0)[r * C + n] = v;
    }
};

// One block of the grouped weight gradient, shared by grp_bwd_w_kernel and tc::dw1_kernel: a WT x WT tile
// (outputs co0.., columns col0.. in w1's (i, j) order) of group blockIdx.z over the steps [t0, t1) of chunk
// blockIdx.y, and the staging of KT steps of dy and of mid (shifted by each column's tap; pitch ld: tile_at).
struct dw1_tile {
    int C, T, k1, M, cg, nc, co0, col0, t0, t1;
    int64_t ne, chunk, b, g0;
    const bf16 *dyb;
    const float *midb;
    __device__ __forceinline__ dw1_tile(const bf16 *dy, const float *mid, const kiln_conv_shape &s,
                                        int64_t chunks_per_seq) {
        C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = (int)(s.C / s.groups), nc = cg * k1;
        ne = s.C * nc;
        const int col_tiles = (nc + WT - 1) / WT;
        co0 = (blockIdx.x / col_tiles) * WT, col0 = (blockIdx.x % col_tiles) * WT;
        chunk = blockIdx.y, b = chunk / chunks_per_seq;
        t0 = (int)(chunk % chunks_per_seq) * CHUNK_T, t1 = t0 + CHUNK_T < T ? t0 + CHUNK_T : T;
        g0 = (int64_t)blockIdx.z * cg;
        dyb = dy + b * T * C + g0;
        midb = mid + b * M * C + g0;
    }
    // moff[c]: column (i, j) of the tile -> offset of mid[t + j, g0 + i] from mid[t, g0] (-1 past nc)
    __device__ __forceinline__ void offsets(int *moff) const {
        if (threadIdx.x < WT) {
            const int col = col0 + threadIdx.x;
            moff[threadIdx.x] = col < nc ? (col % k1) * C + col / k1 : -1;
        }
    }
    template <typename TS>
    __device__ __forceinline__ void stage(int ts, const int *moff, TS sdy, TS smid, int ld, int nt) const {
        for (int e = threadIdx.x; e < KT * WT; e += nt) {
            const int kt = e / WT, c = e % WT, t = ts + kt, co = co0 + c, off = moff[c];
            tile_at(sdy, kt, c, ld) = t < t1 && co < cg ? __bfloat162float(dyb[t * C + co]) : 0.0f;
            tile_at(smid, kt, c, ld) = t < t1 && off >= 0 ? midb[t * C + off] : 0.0f;
        }
    }
};

// The grouped stage as one small GEMM per (sequence, group), K = (j, i) in the CPU's order (j outer):
//   forward (MODE 0):  y[t, co]    = b1[co] + sum_{j,i} mid[t+j, g0+i] w1[g0+co, i, j]        rows t < T
//   input   (MODE 1):  dmid[u, ci] = sum_{j,co} dy[u-j, g0+co] w1[g0+co, ci, j] (0 <= u-j < T)  rows u < M
// grid (row tiles of 64, column tiles of 64, B*groups); 256 threads, 4 x 4 outputs each (rows ty + 16p,
// columns tx + 16q: conflict-free shared reads), K staged 32 at a time. Indices within one (sequence,
// group) are 32-bit and K's (j, i) split comes from a table per step: integer division by a runtime value
// would cost more than the FMAs.
template <int MODE>
static __global__ void __launch_bounds__(256)
    grp_gemm_kernel(void *out, const float *mid, const bf16 *dy, const float *w1, const float *b1, kiln_conv_shape s) {
    pdl_wait();
    __shared__ float sa[GT][GK + 1];
    __shared__ float sw[GK][GT + 1];
    __shared__ int tj[GK], tc[GK];
    const grp_tile<MODE> g(mid, dy, w1, s);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int n = g.n0 + tx + 16 * q;
            acc[p][q] = MODE == 0 && n < g.cg ? b1[g.g0 + n] : 0.0f;
        }
    for (int k0 = 0; k0 < g.K; k0 += GK) {
        g.stage(k0, tj, tc, sa, 0, sw, 0, 256);
        __syncthreads();
#pragma unroll 8
        for (int kl = 0; kl < GK; kl++) {
            float av[4], wv[4];
#pragma unroll
            for (int p = 0; p < 4; p++) av[p] = sa[ty + 16 * p][kl];
#pragma unroll
            for (int q = 0; q < 4; q++) wv[q] = sw[kl][tx + 16 * q];
            outer4(acc, av, wv);
        }
        __syncthreads();
    }
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int r = g.r0 + ty + 16 * p, n = g.n0 + tx + 16 * q;
            if (r < g.R && n < g.cg) g.put(out, r, n, acc[p][q]);
        }
}

// dw1 of one group over one chunk is a small GEMM: [cg outputs] x [cg*k1 (i, j) columns] summed over
// the chunk's steps t of dy[b,t,co] mid[b,t+j,g0+i]. grid (output tiles, chunks, groups): a 64 x 64 tile
// per block, 4 x 4 per thread, steps staged 32 at a time in shared memory. part[chunk, e], e = (co, i, j).
static __global__ void __launch_bounds__(256)
    grp_bwd_w_kernel(float *part, const bf16 *dy, const float *mid, kiln_conv_shape s, int64_t chunks_per_seq) {
    pdl_wait();
    __shared__ __align__(16) float sdy[KT][WT];
    __shared__ __align__(16) float smid[KT][WT];
    __shared__ int moff[WT];
    const dw1_tile w(dy, mid, s, chunks_per_seq);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    w.offsets(moff);
    __syncthreads();
    float acc[4][4] = {};
    for (int ts = w.t0; ts < w.t1; ts += KT) {
        w.stage(ts, moff, sdy, smid, 0, 256);
        __syncthreads();
#pragma unroll 8
        for (int kt = 0; kt < KT; kt++) {
            const float4 a = *(const float4 *)&sdy[kt][ty * 4], m = *(const float4 *)&smid[kt][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, mv[4] = {m.x, m.y, m.z, m.w};
            outer4(acc, av, mv);
        }
        __syncthreads();
    }
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int co = w.co0 + ty * 4 + p, col = w.col0 + tx * 4 + q;
            if (co < w.cg && col < w.nc) part[w.chunk * w.ne + (w.g0 + co) * w.nc + col] = acc[p][q];
        }
}

// grid (column blocks, chunks): part[chunk, c] = sum over the chunk's rows of a[row, c]; rows of
// sequence b are b*rows_per_seq .. +rows_per_seq-1, chunked by CHUNK_T
template <typename TA>
static __global__ void chunk_colsum_kernel(float *part, const TA *a, int64_t rows_per_seq, int64_t C,
                                           int64_t chunks_per_seq) {
    pdl_wait();
    const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t chunk = blockIdx.y, b = chunk / chunks_per_seq, r0 = (chunk % chunks_per_seq) * CHUNK_T;
    const int64_t r1 = r0 + CHUNK_T < rows_per_seq ? r0 + CHUNK_T : rows_per_seq;
    float acc = 0;
    for (int64_t r = r0; r < r1; r++) acc += ld(a, (b * rows_per_seq + r) * C + c);
    part[chunk * C + c] = acc;
}

// grid (entry blocks, chunks): part[chunk, c*k0+j] = sum over u in the chunk of dmid[b,u,c] xp[b,u+j,c]
static __global__ void dw_bwd_w_kernel(float *part, const float *dmid, const bf16 *x, const bf16 *hist,
                                       kiln_conv_shape s, int64_t chunks_per_seq) {
    pdl_wait();
    const int64_t C = s.C, T = s.T, k0 = s.k0, P = (s.k0 - 1) + (s.k1 - 1), M = T + s.k1 - 1, ne = C * k0;
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= ne) return;
    const int64_t chunk = blockIdx.y, b = chunk / chunks_per_seq, u0 = (chunk % chunks_per_seq) * CHUNK_T;
    const int64_t u1 = u0 + CHUNK_T < M ? u0 + CHUNK_T : M;
    const int64_t c = e / k0, j = e % k0;
    float acc = 0;
    for (int64_t u = u0; u < u1; u++) acc += dmid[(b * M + u) * C + c] * xp_at(x, hist, b, u + j, c, T, C, P);
    part[chunk * ne + e] = acc;
}

// dx[b,t,c] = sum_j dmid[b, t+P-j, c] w0[c,j] over 0 <= t+P-j < M: a row (b, t) per block iteration
static __global__ void dw_bwd_data_kernel(bf16 *dx, const float *dmid, const float *w0, kiln_conv_shape s) {
    pdl_wait();
    const int64_t C = s.C, T = s.T, k0 = s.k0, P = (s.k0 - 1) + (s.k1 - 1), M = T + s.k1 - 1;
    for (int64_t row = blockIdx.x; row < s.B * T; row += gridDim.x) {
        const int64_t b = row / T, t = row - b * T;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0;
            for (int64_t j = 0; j < k0; j++) {
                const int64_t u = t + P - j;
                if (u >= 0 && u < M) acc += dmid[(b * M + u) * C + c] * w0[c * k0 + j];
            }
            dx[row * C + c] = __float2bfloat16_rn(acc);
        }
    }
}

#include "cca_conv_tc.cuh"

// KILN_CCA_CONV=tensor runs the grouped stage's GEMMs on tensor cores (3xTF32, cca_conv_tc.cuh), anything
// else on the SIMT f32 tiles above
static int use_tensor_cores(void) {
    const char *e = getenv("KILN_CCA_CONV");
    return e && !strcmp(e, "tensor");
}

static kiln_error *check_conv(const char *op, const kiln_conv_shape *s) {
    if (s->B <= 0 || s->T <= 0 || s->C <= 0 || s->groups <= 0 || s->k0 <= 0 || s->k1 <= 0 || s->C % s->groups)
        return kiln_errorf(KILN_EINVAL, "%s: bad shape B=%lld T=%lld C=%lld groups=%lld k0=%lld k1=%lld", op,
                           (long long)s->B, (long long)s->T, (long long)s->C, (long long)s->groups, (long long)s->k0,
                           (long long)s->k1);
    if ((s->T + s->k1) * s->C >= INT32_MAX || (s->C / s->groups) * s->C * s->k1 >= INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "%s: one sequence (T=%lld, C=%lld, k1=%lld) exceeds 32-bit indexing", op,
                           (long long)s->T, (long long)s->C, (long long)s->k1);
    if (s->B * s->groups > 65535 || s->groups > 65535)
        return kiln_errorf(KILN_EINVAL, "%s: %lld sequences x %lld groups exceed the launch grid", op, (long long)s->B,
                           (long long)s->groups);
    return NULL;
}

extern "C" kiln_error *kiln_cca_conv_forward_cuda(kiln_bf16 *y, float *mid, const kiln_bf16 *x, const kiln_bf16 *hist,
                                                  const float *w0, const float *b0, const float *w1, const float *b1,
                                                  const kiln_conv_shape *s, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    KILN_TRY(check_conv("cca_conv forward", s));
    {
        const int64_t M = s->T + s->k1 - 1, cg = s->C / s->groups;
        kiln_launch(dw_fwd_kernel, (int)(s->B * M < 65535 ? s->B * M : 65535), 256, 0, st, mid, (const bf16 *)x,
                    (const bf16 *)hist, w0, b0, *s);
        LAUNCH_CHECK("cca_conv forward (depthwise)");
        const dim3 grid((unsigned)((s->T + GT - 1) / GT), (unsigned)((cg + GT - 1) / GT), (unsigned)(s->B * s->groups));
        if (use_tensor_cores()) kiln_launch(tc::gemm_kernel<0>, grid, 128, 0, st, y, mid, NULL, w1, b1, *s);
        else kiln_launch(grp_gemm_kernel<0>, grid, 256, 0, st, y, mid, NULL, w1, b1, *s);
        LAUNCH_CHECK("cca_conv forward (grouped)");
    }
done:
    return err;
}

extern "C" kiln_error *kiln_cca_conv_backward_cuda(kiln_bf16 *dx, float *dw0, float *db0, float *dw1, float *db1,
                                                   float *dmid, const kiln_bf16 *dy, const kiln_bf16 *x,
                                                   const kiln_bf16 *hist, const float *mid, const float *w0,
                                                   const float *w1, const kiln_conv_shape *s, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *part = NULL;
    KILN_TRY(check_conv("cca_conv backward", s));
    {
        const int64_t B = s->B, T = s->T, C = s->C, k0 = s->k0, k1 = s->k1, M = T + k1 - 1, cg = C / s->groups;
        const int64_t cps_t = (T + CHUNK_T - 1) / CHUNK_T, cps_m = (M + CHUNK_T - 1) / CHUNK_T;
        const int64_t ne1 = C * cg * k1, ne0 = C * k0;
        const int tcore = use_tensor_cores();
        int64_t need = 0;
        if (dw1) need = B * cps_t * ne1;
        if (db1 && B * cps_t * C > need) need = B * cps_t * C;
        if (dw0 && B * cps_m * ne0 > need) need = B * cps_m * ne0;
        if (db0 && B * cps_m * C > need) need = B * cps_m * C;
        if (B * cps_m > 65535) return kiln_errorf(KILN_EINVAL, "cca_conv backward: %lld chunks", (long long)(B * cps_m));
        if (need) CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)need * sizeof(float), st));
        // grouped stage
        if (dw1) {
            const int64_t tiles = ((cg + WT - 1) / WT) * ((cg * k1 + WT - 1) / WT);
            const dim3 grid((unsigned)tiles, (unsigned)(B * cps_t), (unsigned)s->groups);
            if (tcore) kiln_launch(tc::dw1_kernel, grid, 128, 0, st, part, (const bf16 *)dy, mid, *s, cps_t);
            else kiln_launch(grp_bwd_w_kernel, grid, 256, 0, st, part, (const bf16 *)dy, mid, *s, cps_t);
            LAUNCH_CHECK("cca_conv backward (grouped weights)");
            CUDA_TRY(colsum_add(dw1, part, B * cps_t, ne1, st));
        }
        if (db1) {
            kiln_launch(chunk_colsum_kernel<bf16>, dim3((unsigned)((C + 255) / 256), (unsigned)(B * cps_t)), 256, 0,
                        st, part, (const bf16 *)dy, T, C, cps_t);
            LAUNCH_CHECK("cca_conv backward (grouped bias)");
            CUDA_TRY(colsum_add(db1, part, B * cps_t, C, st));
        }
        const dim3 grid((unsigned)((M + GT - 1) / GT), (unsigned)((cg + GT - 1) / GT), (unsigned)(B * s->groups));
        if (tcore) kiln_launch(tc::gemm_kernel<1>, grid, 128, 0, st, dmid, NULL, (const bf16 *)dy, w1, NULL, *s);
        else kiln_launch(grp_gemm_kernel<1>, grid, 256, 0, st, dmid, NULL, (const bf16 *)dy, w1, NULL, *s);
        LAUNCH_CHECK("cca_conv backward (grouped input)");
        // depthwise stage
        if (dw0) {
            kiln_launch(dw_bwd_w_kernel, dim3((unsigned)((ne0 + 255) / 256), (unsigned)(B * cps_m)), 256, 0, st, part,
                        dmid, (const bf16 *)x, (const bf16 *)hist, *s, cps_m);
            LAUNCH_CHECK("cca_conv backward (depthwise weights)");
            CUDA_TRY(colsum_add(dw0, part, B * cps_m, ne0, st));
        }
        if (db0) {
            kiln_launch(chunk_colsum_kernel<float>, dim3((unsigned)((C + 255) / 256), (unsigned)(B * cps_m)), 256, 0,
                        st, part, dmid, M, C, cps_m);
            LAUNCH_CHECK("cca_conv backward (depthwise bias)");
            CUDA_TRY(colsum_add(db0, part, B * cps_m, C, st));
        }
        if (dx) {
            kiln_launch(dw_bwd_data_kernel, (int)(B * T < 65535 ? B * T : 65535), 256, 0, st, (bf16 *)dx, dmid, w0,
                        *s);
            LAUNCH_CHECK("cca_conv backward (input)");
        }
    }
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}
