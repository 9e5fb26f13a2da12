// ZAYA's residual joins fused with the RMSNorm that reads them (src/models/zaya_cuda.c's glue):
//   forward:  y = (a + ab)*as + (x + xb)*xs (f32, the residual stream), then ln = rmsnorm(y) in bf16 in the
//             same pass over the row (the two scale_shift calls, a bf16 -> f32 cast and the norm were four);
//   backward: the adjoint of that join and norm together with y's other consumer, the next join
//             z = ... + (y + upb)*ups: g = dz*ups + rmsnorm_bwd(dln), then da (bf16, the projection's output
//             gradient) = g*as and dx = g*xs, written; the seven per-channel gradients (up's shift and scale,
//             the norm weight, the join's four) as per-chunk partials summed in a fixed order (no atomics);
//             and the norm's backward where y came from a join whose first input gets its gradient in the same
//             pass (kiln_norm_join_backward_cuda: a layer's ln1 with the previous layer's MLP join, the final
//             norm with the last one, the first ln1 with the input scale).
// One block walks whole rows, each thread holding its columns (NV units of V) in registers between the
// row's reduction and its outputs, so every input is read once. Rows of up to 4096 columns with 16-byte
// accesses (the model's) go through the *_pipe kernels: a ring of PS row stages in shared memory filled by
// cp.async, so that the next PS-1 rows' loads are in flight while a row is reduced (one row in flight per block
// left the backward at ~2 TB/s); the backward recomputes the join's output from its inputs (read anyway)
// instead of reading it; every weight gradient's partials are summed in one launch (colsum_add_multi).
// Rows the ring does not take (wider than 4096 columns: the f32 rmsnorm's up to 16384; widths not a multiple
// of 4 or unaligned rows) go through fwd_kernel, bwd_kernel and nj_bwd_kernel: the same arithmetic, one row in
// flight per block.
#include "ops_common.cuh"
#include "launch.cuh"

namespace rn {
enum { MAXNV = 8, THREADS = 512, NPART = 7, PS = 3, PIPE_NV = 2 };

// The join's output as the forward stores it, rounded explicitly (no contraction left to the compiler), so
// that the backward's recomputation gives the same bits: (a + ab)*as, then + (x + xb)*xs as one fused
// multiply-add.
static __device__ __forceinline__ float join_first(float a, float ab, float as) { return __fmul_rn(__fadd_rn(a, ab), as); }
static __device__ __forceinline__ float join_add(float y, float x, float xb, float xs) {
    return __fmaf_rn(__fadd_rn(x, xb), xs, y);
}

// A thread's units: unit k covers columns (threadIdx.x + k*blockDim.x)*V .. +V-1. The plain kernels read a row
// from global memory and the *_pipe kernels from a ring stage; both run the helpers below on it, so the two give
// the same bits.
template <int V> static __device__ __forceinline__ int unit_col(int k) { return (threadIdx.x + k * blockDim.x) * V; }

// v = a per-channel vector's units (zeros where src is NULL or past d)
template <int V, int NV> static __device__ __forceinline__ void ld_chan(float (&v)[NV][V], const float *src, int d) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int j = unit_col<V>(k);
#pragma unroll
        for (int q = 0; q < V; q++) v[k][q] = 0.0f;
        if (src && j < d) ldv<V>(src, j, v[k]);
    }
}

template <int NP, int V, int NV> static __device__ __forceinline__ void zero_acc(float (&acc)[NP][NV][V]) {
#pragma unroll
    for (int i = 0; i < NP; i++)
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int q = 0; q < V; q++) acc[i][k][q] = 0.0f;
}

// this block's partials: part [NP][chunks][d], row blockIdx.x of each
template <int NP, int V, int NV>
static __device__ __forceinline__ void store_parts(float *part, const float (&acc)[NP][NV][V], int64_t chunks, int d) {
#pragma unroll
    for (int i = 0; i < NP; i++)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<V>(k);
            if (j < d) stv<V>(part + ((int64_t)i * chunks + blockIdx.x) * d, j, acc[i][k]);
        }
}

// unit j of the join y = (a + ab)*as + (x + xb)*xs of one row (ar, xr: its a and x; as NULL: y is a itself, bit
// for bit, which kiln_rmsnorm_forward_cuda runs; hx false: no second term, xr unread)
// GA: a is gate * ar (the experts' combine for top-1 routing, its one rounding: gate * ye added to a zero sum)
template <typename TA, int V, bool GA = false>
static __device__ __forceinline__ void join_unit(float (&yv)[V], const TA *ar, const float *ab, const float *as, bool hx,
                                                 const float *xr, const float *xb, const float *xs, int j,
                                                 float ga = 0.0f) {
    float bv[V], sv[V];
    ldv<V>(ar, j, yv);
    if (GA)
#pragma unroll
        for (int q = 0; q < V; q++) yv[q] = __fmaf_rn(ga, yv[q], 0.0f);
    if (as) {
        ldv<V>(as, j, sv);
        if (ab) ldv<V>(ab, j, bv);
        else
#pragma unroll
            for (int q = 0; q < V; q++) bv[q] = 0.0f;
#pragma unroll
        for (int q = 0; q < V; q++) yv[q] = join_first(yv[q], bv[q], sv[q]);
    }
    if (hx) {
        float xv[V];
        ldv<V>(xr, j, xv), ldv<V>(xs, j, sv);
        if (xb) ldv<V>(xb, j, bv);
        else
#pragma unroll
            for (int q = 0; q < V; q++) bv[q] = 0.0f;
#pragma unroll
        for (int q = 0; q < V; q++) yv[q] = join_add(yv[q], xv[q], bv[q], sv[q]);
    }
}

// the forward's row r (ar, xr: its a and x): the join of every unit (stored to y when given), then
// ln = w * (y * rstd) (when ln is given). The outputs' null tests are on the kernel's own arguments: tests on
// derived row pointers cost the ring kernel ~15% (session 14).
template <typename TA, int V, int NV, bool GA = false>
static __device__ __forceinline__ void fwd_row(float *y, bf16 *ln, float *rstd, int64_t r, const TA *ar,
                                               const float *ab, const float *as, bool hx, const float *xr,
                                               const float *xb, const float *xs, const float *w, int d, float eps,
                                               float *sh, float ga = 0.0f) {
    float yv[NV][V], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int j = unit_col<V>(k);
        if (j >= d) continue;
        join_unit<TA, V, GA>(yv[k], ar, ab, as, hx, xr, xb, xs, j, ga);
        if (y) stv<V>(y + r * d, j, yv[k]);
#pragma unroll
        for (int q = 0; q < V; q++) ss += yv[k][q] * yv[k][q];
    }
    if (!ln) return;
    ss = block_sum(ss, sh);
    const float rs = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));
    if (rstd && threadIdx.x == 0) rstd[r] = rs;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int j = unit_col<V>(k);
        if (j >= d) continue;
        float wv[V], ov[V];
        ldv<V>(w, j, wv);
#pragma unroll
        for (int q = 0; q < V; q++) ov[q] = wv[q] * (yv[k][q] * rs);
        stv<V>(ln + r * d, j, ov);
    }
}

// the norm backward's first pass over a unit: this thread's part of sum(g * w * y), and dw's partial g * y * rstd
template <int V>
static __device__ __forceinline__ void norm_dot_unit(float &dot, float (&dw)[V], const float (&gv)[V],
                                                     const float (&wv)[V], const float (&yv)[V], float rs) {
#pragma unroll
    for (int q = 0; q < V; q++) {
        dot += gv[q] * wv[q] * yv[q];
        dw[q] = __fadd_rn(dw[q], __fmul_rn(gv[q], __fmul_rn(yv[q], rs)));
    }
}

// The residual-norm backward's per-channel vectors, held in registers for a whole chunk of rows
template <int V, int NV> struct bwd_chan {
    float w[NV][V], us[NV][V], ub[NV][V], as[NV][V], ab[NV][V], xs[NV][V], xb[NV][V];
};
template <int V, int NV>
static __device__ __forceinline__ void ld_bwd_chan(bwd_chan<V, NV> &c, const kiln_residual_norm_bwd &p, int d) {
    ld_chan<V, NV>(c.w, p.w, d), ld_chan<V, NV>(c.us, p.ups, d), ld_chan<V, NV>(c.as, p.as, d);
    ld_chan<V, NV>(c.xs, p.xs, d), ld_chan<V, NV>(c.ub, p.upb, d), ld_chan<V, NV>(c.ab, p.ab, d);
    ld_chan<V, NV>(c.xb, p.xb, d);
}

// unit k of the residual-norm backward's output pass (c: the norm's dot term): g = dup*ups + rmsnorm_bwd(dln),
// da = g*as and dx = g*xs stored at column j of dar / dxr, six partials (dw's is the first pass's) accumulated.
// part indices: 0 dupb, 1 dups, 2 dw, 3 dab, 4 das, 5 dxb, 6 dxs.
template <int V, int NV>
static __device__ __forceinline__ void bwd_unit(float (&acc)[NPART][NV][V], const bwd_chan<V, NV> &ch, int k,
                                                const float (&du)[V], const float (&av)[V], const float (&xv)[V],
                                                const float (&yv)[V], const float (&gv)[V], float rs, float c,
                                                bf16 *dar, float *dxr, int j) {
    float dav[V], dxv[V];
#pragma unroll
    for (int q = 0; q < V; q++) {
        const float gu = __fmul_rn(du[q], ch.us[k][q]);
        acc[0][k][q] = __fadd_rn(acc[0][k][q], gu);
        acc[1][k][q] = __fadd_rn(acc[1][k][q], __fmul_rn(du[q], __fadd_rn(yv[q], ch.ub[k][q])));
        const float g = gu + (rs * gv[q] * ch.w[k][q] - c * yv[q]);
        dav[q] = __fmul_rn(g, ch.as[k][q]);
        dxv[q] = __fmul_rn(g, ch.xs[k][q]);
        acc[3][k][q] = __fadd_rn(acc[3][k][q], dav[q]);
        acc[4][k][q] = __fadd_rn(acc[4][k][q], __fmul_rn(g, __fadd_rn(av[q], ch.ab[k][q])));
        acc[5][k][q] = __fadd_rn(acc[5][k][q], dxv[q]);
        acc[6][k][q] = __fadd_rn(acc[6][k][q], __fmul_rn(g, __fadd_rn(xv[q], ch.xb[k][q])));
    }
    stv<V>(dar, j, dav);
    stv<V>(dxr, j, dxv);
}

// unit k of the norm-join backward's output pass: g = gin + rmsnorm_bwd(dln) and da = g*as stored at column j of
// goutr / dar; partials 1 dab, 2 das accumulated (0, dw, is the first pass's)
template <int V, int NV>
static __device__ __forceinline__ void nj_unit(float (&acc)[3][NV][V], int k, const float (&gi)[V],
                                               const float (&av)[V], const float (&yv)[V], const float (&gv)[V],
                                               const float (&wv)[V], const float (&asv)[V], const float (&abv)[V],
                                               float rs, float c, float *goutr, float *dar, int j) {
    float gt[V], dav[V];
#pragma unroll
    for (int q = 0; q < V; q++) {
        gt[q] = gi[q] + (rs * gv[q] * wv[q] - c * yv[q]);
        dav[q] = __fmul_rn(gt[q], asv[q]);
        acc[1][k][q] = __fadd_rn(acc[1][k][q], dav[q]);
        acc[2][k][q] = __fadd_rn(acc[2][k][q], __fmul_rn(gt[q], __fadd_rn(av[q], abv[q])));
    }
    stv<V>(goutr, j, gt);
    stv<V>(dar, j, dav);
}

// the norm's dot term after the block's sum: c = sum(g * w * y) * rstd^3 / d
static __device__ __forceinline__ float norm_c_of(float dot, float rs, int d) { return dot * rs * rs * rs / (float)d; }
static __device__ __forceinline__ float norm_c(float dot, float rs, int d, float *sh) {
    return norm_c_of(block_sum(dot, sh), rs, d);
}

template <typename TA, int V, int NV>
static __global__ void __launch_bounds__(THREADS)
    fwd_kernel(float *y, bf16 *ln, float *rstd, const TA *a, const float *ab, const float *as, const float *x,
               const float *xb, const float *xs, const float *w, int64_t n, int d, float eps) {
    pdl_wait();
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x)
        fwd_row<TA, V, NV>(y, ln, rstd, r, a + r * d, ab, as, x != NULL, x ? x + r * d : x, xb, xs, w, d, eps, sh);
}

// block c: rows [c*rows_per, ...); part [NPART][chunks][d] (bwd_unit's order). The per-channel vectors stay in
// registers for the whole chunk; a row's five inputs are loaded together before its reduction, so each row costs
// one memory latency.
template <int V, int NV>
static __global__ void __launch_bounds__(THREADS) bwd_kernel(kiln_residual_norm_bwd p, float *part, int64_t n, int d,
                                                             int64_t rows_per, int64_t chunks) {
    pdl_wait();
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    const bf16 *dln = (const bf16 *)p.dln, *a = (const bf16 *)p.a;
    float acc[NPART][NV][V];
    bwd_chan<V, NV> ch;
    zero_acc(acc);
    ld_bwd_chan(ch, p, d);
    for (int64_t r = r0; r < r1; r++) {
        const float rs = p.rstd[r];
        float yv[NV][V], gv[NV][V], du[NV][V], av[NV][V], xv[NV][V], dot = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<V>(k);
            if (j >= d) continue;
            ldv<V>(p.y + r * d, j, yv[k]), ldv<V>(p.dup + r * d, j, du[k]);
            if (p.dln_f32) ldv<V>(p.dln_f32 + r * d, j, gv[k]);
            else ldv<V>(dln + r * d, j, gv[k]);
            ldv<V>(a + r * d, j, av[k]), ldv<V>(p.x + r * d, j, xv[k]);
            norm_dot_unit<V>(dot, acc[2][k], gv[k], ch.w[k], yv[k], rs);
        }
        const float c = norm_c(dot, rs, d, sh);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<V>(k);
            if (j < d) bwd_unit<V, NV>(acc, ch, k, du[k], av[k], xv[k], yv[k], gv[k], rs, c, (bf16 *)p.da + r * d,
                                       p.dx + r * d, j);
        }
    }
    store_parts(part, acc, chunks, d);
}

// The backward of an RMSNorm ln = rmsnorm(y) over a join's output y = (a + ab)*as + ..., for the join's
// first input: g = gin + rmsnorm_bwd(dln) (gin nullable: 0) written to gout; da = g*as written; partials
// [3][chunks][d]: 0 dw, 1 dab, 2 das. Same row walk as bwd_kernel.
template <int V, int NV>
static __global__ void __launch_bounds__(THREADS) nj_bwd_kernel(kiln_norm_join_bwd p, float *part, int64_t n, int d,
                                                                int64_t rows_per, int64_t chunks) {
    pdl_wait();
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    const bf16 *dln = (const bf16 *)p.dln;
    float acc[3][NV][V], wv[NV][V], asv[NV][V], abv[NV][V];
    zero_acc(acc);
    ld_chan(wv, p.w, d), ld_chan(asv, p.as, d), ld_chan(abv, p.ab, d);
    for (int64_t r = r0; r < r1; r++) {
        const float rs = p.rstd[r];
        float yv[NV][V], gv[NV][V], gi[NV][V], av[NV][V], dot = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<V>(k);
            if (j >= d) continue;
            ldv<V>(p.y + r * d, j, yv[k]), ldv<V>(dln + r * d, j, gv[k]), ldv<V>(p.a + r * d, j, av[k]);
            if (p.gin) ldv<V>(p.gin + r * d, j, gi[k]);
            else
#pragma unroll
                for (int q = 0; q < V; q++) gi[k][q] = 0.0f;
            norm_dot_unit<V>(dot, acc[0][k], gv[k], wv[k], yv[k], rs);
        }
        const float c = norm_c(dot, rs, d, sh);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<V>(k);
            if (j < d)
                nj_unit<V, NV>(acc, k, gi[k], av[k], yv[k], gv[k], wv[k], asv[k], abv[k], rs, c, p.gout + r * d,
                               p.da + r * d, j);
        }
    }
    store_parts(part, acc, chunks, d);
}

// ---- the pipelined kernels (V = 4: 16-byte f32 / 8-byte bf16 units; d % 4 == 0, rows 16-byte aligned) ----

static inline int round16(int64_t b) { return (int)((b + 15) / 16 * 16); }

// Forward: rows r = blockIdx.x + i*gridDim.x of a resident grid; a stage holds the row's x (f32, when given)
// then a (TA). Three blocks per SM (at most 42 registers a thread). GA: row r of a is gate[r] * a[slot[r]] (a: the
// experts' outputs ye, one slot a token; slot -1: zeros), the combine's product formed here instead of read.
template <typename TA, int NV, bool GA = false>
static __global__ void __launch_bounds__(THREADS, 3)
    fwd_pipe_kernel(float *y, bf16 *ln, float *rstd, const TA *a, const float *ab, const float *as, const float *x,
                    const float *xb, const float *xs, const float *w, int64_t n, int d, float eps, int stage,
                    const int32_t *slot = NULL, const float *gate = NULL) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char ring[];
    __shared__ float sh[32];
    const int64_t G = gridDim.x;
    const int ao = x ? d * 4 : 0; // byte offset of a in a stage (x at 0)
    auto load = [&](int64_t r, int s) {
        if (r < n) {
            unsigned char *b = ring + (size_t)s * stage;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int j = unit_col<4>(k);
                if (j >= d) continue;
                if (x) cp_async<16>(b + (size_t)j * 4, x + r * d + j);
                if (GA) {
                    const int32_t sr = slot[r]; // a skipped token's a: zero-filled, nothing read
                    cp_async_zf<4 * sizeof(TA)>(b + ao + (size_t)j * sizeof(TA), a + (sr >= 0 ? (int64_t)sr * d + j : 0),
                                                sr < 0);
                } else {
                    cp_async<4 * sizeof(TA)>(b + ao + (size_t)j * sizeof(TA), a + r * d + j);
                }
            }
        }
        __pipeline_commit(); // empty groups too: the count of groups stays one per row
    };
    int64_t r = blockIdx.x;
#pragma unroll
    for (int s = 0; s < PS - 1; s++) load(r + s * G, s);
    for (int i = 0; r < n; r += G, i++) {
        load(r + (PS - 1) * G, (i + PS - 1) % PS);
        __pipeline_wait_prior(PS - 1); // this row's group is complete
        const unsigned char *b = ring + (size_t)(i % PS) * stage;
        const float ga = GA ? (slot[r] >= 0 ? gate[r] : 0.0f) : 0.0f; // a skipped token's gate is not its own
        fwd_row<TA, 4, NV, GA>(y, ln, rstd, r, (const TA *)(b + ao), ab, as, x != NULL, (const float *)b, xb, xs, w, d,
                               eps, sh, ga);
    }
}

// The norm's dot terms of R rows summed over the block together, one barrier for all R (sh: [2][R][32],
// half `half` this call; the caller alternates halves, so a warp writing this call's half cannot overwrite the
// half a slower warp still reads from the previous call). Each row's sum in block_sum's order: the same bits.
template <int R>
static __device__ __forceinline__ void block_sum_rows(float (&v)[R], float *sh, int half) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *h = sh + half * R * 32;
#pragma unroll
    for (int u = 0; u < R; u++) v[u] = warp_sum(v[u]);
    if (lane == 0)
#pragma unroll
        for (int u = 0; u < R; u++) h[u * 32 + w] = v[u];
    __syncthreads();
#pragma unroll
    for (int u = 0; u < R; u++) v[u] = warp_sum(lane < nw ? h[u * 32 + lane] : 0.0f);
}

// bwd_pipe_kernel's ring: PS stages of one row each, rows taken R at a time. Every load commits one
// group (empty ones too), so after the prologue's PS - R and the R committed before a step's wait, waiting
// until PS - R groups are pending leaves the step's R rows complete. A thread reads only the columns it
// loaded, so the ring itself needs no barrier: a stage is refilled by the thread that read it a step before.
// R = 2 gives the block's 16 warps two rows of independent work between barriers: the backward runs one block
// an SM, so with one row a step each row's reduction left the SM waiting at a barrier (66% of the copy rate at
// the model's width, session 20; two rows a step: 75%, session 21).

// Backward of the join + norm + the next join's side (bwd_kernel's outputs and arithmetic), block c over rows
// [c*rows_per, ...). A stage: dup f32, x f32, dln (f32 or bf16), a bf16. y is not read: it is the join of a and
// x, recomputed with the forward's roundings (p.y is left unread). Its registers (the seven partials and seven
// per-channel vectors) allow one block per SM, so its ring is deep (PS = 6 with R = 2 where it fits: four rows,
// ~100 KB at the model's width, in flight per SM, while two are reduced).
// DM, dln's form: 0 bf16, 1 f32, 2 (DLN_PAIR) two bf16 gradients summed in f32 as the stage is read: the experts'
// input gradient gathered from its slot-order rows (dln_rows[dln_slot[r]], top-1) + dln_add (the router's), so
// neither the [n,d] f32 combine nor the f32 read-add-write of the router's GEMM exists (session 26).
enum { DLN_BF16 = 0, DLN_F32 = 1, DLN_PAIR = 2 };
template <int NV, int DM, int PS, int R>
static __global__ void __launch_bounds__(THREADS) bwd_pipe_kernel(kiln_residual_norm_bwd p, float *part, int64_t n,
                                                                  int d, int64_t rows_per, int64_t chunks, int stage) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char ring[];
    __shared__ float sh[2 * R * 32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    const int xo = d * 4, go = d * 8, ao = d * 8 + d * (DM == DLN_BF16 ? 2 : 4);
    auto load = [&](int64_t r, int s) {
        if (r < r1) {
            unsigned char *b = ring + (size_t)s * stage;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int j = unit_col<4>(k);
                if (j >= d) continue;
                cp_async<16>(b + (size_t)j * 4, p.dup + r * d + j);
                cp_async<16>(b + xo + (size_t)j * 4, p.x + r * d + j);
                if constexpr (DM == DLN_F32) {
                    cp_async<16>(b + go + (size_t)j * 4, p.dln_f32 + r * d + j);
                } else if constexpr (DM == DLN_PAIR) { // the gathered row, then the added one (zeros where absent)
                    const int32_t sr = p.dln_slot[r];
                    cp_async_zf<8>(b + go + (size_t)j * 2,
                                   (const bf16 *)p.dln_rows + (sr >= 0 ? (int64_t)sr * d + j : 0), sr < 0);
                    cp_async_zf<8>(b + go + (size_t)(d + j) * 2, (const bf16 *)p.dln_add + (p.dln_add ? r * d + j : 0),
                                   !p.dln_add);
                } else {
                    cp_async<8>(b + go + (size_t)j * 2, (const bf16 *)p.dln + r * d + j);
                }
                cp_async<8>(b + ao + (size_t)j * 2, (const bf16 *)p.a + r * d + j);
            }
        }
        __pipeline_commit();
    };
#pragma unroll
    for (int s = 0; s < PS - R; s++) load(r0 + s, s);
    float acc[NPART][NV][4];
    bwd_chan<4, NV> ch;
    zero_acc(acc);
    ld_bwd_chan(ch, p, d);
    int i = 0;
    for (int64_t r = r0; r < r1; r += R, i += R) {
        float rs[R], yv[R][NV][4], gv[R][NV][4], dot[R];
#pragma unroll
        for (int u = 0; u < R; u++) {
            load(r + PS - R + u, (i + PS - R + u) % PS);
            rs[u] = r + u < r1 ? p.rstd[r + u] : 0.0f;
        }
        __pipeline_wait_prior(PS - R);
#pragma unroll
        for (int u = 0; u < R; u++) {
            dot[u] = 0.0f;
            if (r + u >= r1) continue; // the chunk's last step may hold fewer rows (uniform over the block)
            const unsigned char *b = ring + (size_t)((i + u) % PS) * stage;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int j = unit_col<4>(k);
                if (j >= d) continue;
                float av[4], xv[4];
                if constexpr (DM == DLN_F32) {
                    ldv<4>((const float *)(b + go), j, gv[u][k]);
                } else if constexpr (DM == DLN_PAIR) {
                    float gr[4], ga[4];
                    ldv<4>((const bf16 *)(b + go), j, gr), ldv<4>((const bf16 *)(b + go) + d, j, ga);
#pragma unroll
                    for (int q = 0; q < 4; q++) gv[u][k][q] = __fadd_rn(gr[q], ga[q]);
                } else {
                    ldv<4>((const bf16 *)(b + go), j, gv[u][k]);
                }
                ldv<4>((const bf16 *)(b + ao), j, av), ldv<4>((const float *)(b + xo), j, xv);
#pragma unroll
                for (int q = 0; q < 4; q++)
                    yv[u][k][q] = join_add(join_first(av[q], ch.ab[k][q], ch.as[k][q]), xv[q], ch.xb[k][q], ch.xs[k][q]);
                norm_dot_unit<4>(dot[u], acc[2][k], gv[u][k], ch.w[k], yv[u][k], rs[u]);
            }
        }
        block_sum_rows<R>(dot, sh, (i / R) & 1);
#pragma unroll
        for (int u = 0; u < R; u++) {
            if (r + u >= r1) continue;
            const unsigned char *b = ring + (size_t)((i + u) % PS) * stage;
            const float c = norm_c_of(dot[u], rs[u], d);
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int j = unit_col<4>(k);
                if (j >= d) continue;
                float du[4], av[4], xv[4];
                ldv<4>((const float *)b, j, du), ldv<4>((const bf16 *)(b + ao), j, av);
                ldv<4>((const float *)(b + xo), j, xv);
                bwd_unit<4, NV>(acc, ch, k, du, av, xv, yv[u][k], gv[u][k], rs[u], c, (bf16 *)p.da + (r + u) * d,
                                p.dx + (r + u) * d, j);
            }
        }
    }
    store_parts(part, acc, chunks, d);
}

// The norm + join backward (nj_bwd_kernel's outputs and arithmetic) through the ring. A stage: y f32, a f32
// (GA: the gathered bf16 row, p.a_rows[p.a_slot[r]], times p.a_gate[r] as the forward's fwd_pipe_kernel<.., true>
// formed it), gin f32 (when given), dln bf16.
template <int NV, bool GA = false>
static __global__ void __launch_bounds__(THREADS) nj_pipe_kernel(kiln_norm_join_bwd p, float *part, int64_t n, int d,
                                                                 int64_t rows_per, int64_t chunks, int stage) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char ring[];
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    const int ao = d * 4, io = ao + d * (GA ? 2 : 4), go = p.gin ? io + d * 4 : io;
    auto load = [&](int64_t r, int s) {
        if (r < r1) {
            unsigned char *b = ring + (size_t)s * stage;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int j = unit_col<4>(k);
                if (j >= d) continue;
                cp_async<16>(b + (size_t)j * 4, p.y + r * d + j);
                if (GA) {
                    const int32_t sr = p.a_slot[r];
                    cp_async_zf<8>(b + ao + (size_t)j * 2, (const bf16 *)p.a_rows + (sr >= 0 ? (int64_t)sr * d + j : 0),
                                   sr < 0);
                } else {
                    cp_async<16>(b + ao + (size_t)j * 4, p.a + r * d + j);
                }
                if (p.gin) cp_async<16>(b + io + (size_t)j * 4, p.gin + r * d + j);
                cp_async<8>(b + go + (size_t)j * 2, (const bf16 *)p.dln + r * d + j);
            }
        }
        __pipeline_commit();
    };
#pragma unroll
    for (int s = 0; s < PS - 1; s++) load(r0 + s, s);
    float acc[3][NV][4], wv[NV][4], asv[NV][4], abv[NV][4];
    zero_acc(acc);
    ld_chan(wv, p.w, d), ld_chan(asv, p.as, d), ld_chan(abv, p.ab, d);
    int i = 0;
    for (int64_t r = r0; r < r1; r++, i++) {
        load(r + PS - 1, (i + PS - 1) % PS);
        const float rs = p.rstd[r];
        __pipeline_wait_prior(PS - 1);
        const unsigned char *b = ring + (size_t)(i % PS) * stage;
        const float ga = GA ? (p.a_slot[r] >= 0 ? p.a_gate[r] : 0.0f) : 0.0f;
        float yv[NV][4], gv[NV][4], dot = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<4>(k);
            if (j >= d) continue;
            ldv<4>((const float *)b, j, yv[k]), ldv<4>((const bf16 *)(b + go), j, gv[k]);
            norm_dot_unit<4>(dot, acc[0][k], gv[k], wv[k], yv[k], rs);
        }
        const float c = norm_c(dot, rs, d, sh);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = unit_col<4>(k);
            if (j >= d) continue;
            float av[4], gi[4];
            if (GA) {
                ldv<4>((const bf16 *)(b + ao), j, av);
#pragma unroll
                for (int q = 0; q < 4; q++) av[q] = __fmaf_rn(ga, av[q], 0.0f);
            } else {
                ldv<4>((const float *)(b + ao), j, av);
            }
            if (p.gin) ldv<4>((const float *)(b + io), j, gi);
            else
#pragma unroll
                for (int q = 0; q < 4; q++) gi[q] = 0.0f;
            nj_unit<4, NV>(acc, k, gi, av, yv[k], gv[k], wv[k], asv[k], abv[k], rs, c, p.gout + r * d, p.da + r * d, j);
        }
    }
    store_parts(part, acc, chunks, d);
}

// dynamic shared memory must be allowed per kernel (and device: set at every launch) whenever it and the
// kernel's static shared memory together pass the default 48 KB: so always, for the ring's exact size (a
// 48 KB ring plus the forward's 128 static bytes failed to launch at d = 2048 with x, f32 a: run r23);
// the ring wants shared memory, not L1, so the carveout prefers shared memory (several blocks' rings per SM)
template <typename K> static cudaError_t allow_smem(K kernel, size_t bytes) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e;
}

// units per thread and threads per block for a row of d columns, V per unit (NV 0: too wide)
static void shape_for(int64_t d, int V, int *threads, int *nv) {
    const int64_t units = (d + V - 1) / V;
    *threads = units >= THREADS ? THREADS : (int)((units + 31) / 32 * 32);
    const int64_t need = (units + *threads - 1) / *threads;
    *nv = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= MAXNV ? MAXNV : 0;
}

template <typename TA, int V>
static void launch_fwd(int nv, int grid, int threads, cudaStream_t st, float *y, bf16 *ln, float *rstd, const TA *a,
                       const float *ab, const float *as, const float *x, const float *xb, const float *xs,
                       const float *w, int64_t n, int d, float eps) {
    switch (nv) {
    case 1: kiln_launch(fwd_kernel<TA, V, 1>, grid, threads, 0, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d,
                        eps); break;
    case 2: kiln_launch(fwd_kernel<TA, V, 2>, grid, threads, 0, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d,
                        eps); break;
    case 4: kiln_launch(fwd_kernel<TA, V, 4>, grid, threads, 0, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d,
                        eps); break;
    default: kiln_launch(fwd_kernel<TA, V, MAXNV>, grid, threads, 0, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d,
                         eps); break;
    }
}
template <int V>
static void launch_nj(int nv, int grid, int threads, cudaStream_t st, const kiln_norm_join_bwd &p, float *part,
                      int64_t n, int d, int64_t rows_per, int64_t chunks) {
    switch (nv) {
    case 1: kiln_launch(nj_bwd_kernel<V, 1>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    case 2: kiln_launch(nj_bwd_kernel<V, 2>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    case 4: kiln_launch(nj_bwd_kernel<V, 4>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    default: kiln_launch(nj_bwd_kernel<V, MAXNV>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    }
}
template <int V>
static void launch_bwd(int nv, int grid, int threads, cudaStream_t st, const kiln_residual_norm_bwd &p, float *part,
                       int64_t n, int d, int64_t rows_per, int64_t chunks) {
    switch (nv) {
    case 1: kiln_launch(bwd_kernel<V, 1>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    case 2: kiln_launch(bwd_kernel<V, 2>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    case 4: kiln_launch(bwd_kernel<V, 4>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    default: kiln_launch(bwd_kernel<V, MAXNV>, grid, threads, 0, st, p, part, n, d, rows_per, chunks); break;
    }
}

// the pipelined kernels' launches (nv: units per thread, 1 or 2)
template <typename TA, int NV, bool GA = false>
static cudaError_t fwd_pipe_nv(int threads, cudaStream_t st, float *y, bf16 *ln, float *rstd, const TA *a,
                               const float *ab, const float *as, const float *x, const float *xb, const float *xs,
                               const float *w, int64_t n, int d, float eps, const int32_t *slot = NULL,
                               const float *gate = NULL) {
    const int stage = round16((int64_t)d * ((x ? 4 : 0) + (int)sizeof(TA)));
    const size_t smem = (size_t)PS * stage;
    auto kern = fwd_pipe_kernel<TA, NV, GA>;
    cudaError_t e = allow_smem(kern, smem);
    if (e != cudaSuccess) return e;
    kiln_launch(kern, resident_grid(kern, threads, smem, n), threads, smem, st, y, ln, rstd, a, ab, as, x, xb, xs, w,
                n, d, eps, stage, slot, gate);
    return cudaGetLastError();
}
template <typename TA, bool GA = false>
static cudaError_t fwd_pipe(int nv, int threads, cudaStream_t st, float *y, bf16 *ln, float *rstd, const TA *a,
                            const float *ab, const float *as, const float *x, const float *xb, const float *xs,
                            const float *w, int64_t n, int d, float eps, const int32_t *slot = NULL,
                            const float *gate = NULL) {
    return nv == 1 ? fwd_pipe_nv<TA, 1, GA>(threads, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d, eps, slot, gate)
                   : fwd_pipe_nv<TA, 2, GA>(threads, st, y, ln, rstd, a, ab, as, x, xb, xs, w, n, d, eps, slot, gate);
}
template <int NV, int DM, int S, int R>
static cudaError_t bwd_pipe_s(int threads, cudaStream_t st, const kiln_residual_norm_bwd &p, float *part, int64_t n,
                              int d, int64_t rows_per, int64_t chunks, int stage) {
    const size_t smem = (size_t)S * stage;
    auto kern = bwd_pipe_kernel<NV, DM, S, R>;
    cudaError_t e = allow_smem(kern, smem);
    if (e != cudaSuccess) return e;
    kiln_launch(kern, (int)chunks, threads, smem, st, p, part, n, d, rows_per, chunks, stage);
    return cudaGetLastError();
}
// The backward's ring: two rows a step in PS2 stages where one unit a thread leaves the registers for it (NV 2
// would spill) and the stages fit; else one row a step in BWD_PS stages, else PS. Deeper rings gave nothing:
// with two rows a step, 6 or 8 stages ran alike (session 21), as did 3 to 6 for the forward and 3 to 7 for the
// norm + join backward (which stays at one row a step: two gave it nothing).
enum { BWD_PS = 5, PS2 = 6, RING_MAX = 200 * 1024 };
template <int NV, int DM>
static cudaError_t bwd_pipe_nv(int threads, cudaStream_t st, const kiln_residual_norm_bwd &p, float *part, int64_t n,
                               int d, int64_t rows_per, int64_t chunks) {
    const int stage = round16((int64_t)d * (4 + 4 + (DM == DLN_BF16 ? 2 : 4) + 2));
    if constexpr (NV == 1)
        if ((int64_t)PS2 * stage <= RING_MAX)
            return bwd_pipe_s<NV, DM, PS2, 2>(threads, st, p, part, n, d, rows_per, chunks, stage);
    return (int64_t)BWD_PS * stage <= RING_MAX
               ? bwd_pipe_s<NV, DM, BWD_PS, 1>(threads, st, p, part, n, d, rows_per, chunks, stage)
               : bwd_pipe_s<NV, DM, PS, 1>(threads, st, p, part, n, d, rows_per, chunks, stage);
}
template <int DM>
static cudaError_t bwd_pipe(int nv, int threads, cudaStream_t st, const kiln_residual_norm_bwd &p, float *part,
                            int64_t n, int d, int64_t rows_per, int64_t chunks) {
    return nv == 1 ? bwd_pipe_nv<1, DM>(threads, st, p, part, n, d, rows_per, chunks)
                   : bwd_pipe_nv<2, DM>(threads, st, p, part, n, d, rows_per, chunks);
}
template <int NV, bool GA>
static cudaError_t nj_pipe_nv(int threads, cudaStream_t st, const kiln_norm_join_bwd &p, float *part, int64_t n, int d,
                              int64_t rows_per, int64_t chunks) {
    const int stage = round16((int64_t)d * (4 + (GA ? 2 : 4) + (p.gin ? 4 : 0) + 2));
    const size_t smem = (size_t)PS * stage;
    auto kern = nj_pipe_kernel<NV, GA>;
    cudaError_t e = allow_smem(kern, smem);
    if (e != cudaSuccess) return e;
    kiln_launch(kern, (int)chunks, threads, smem, st, p, part, n, d, rows_per, chunks, stage);
    return cudaGetLastError();
}
// chunks of rows for the pipelined backward: ~264 (two per SM of an H200; a fixed count, so that the weight
// gradients' bits do not depend on the device), each long enough that its ring's start is a small part of it
enum { PIPE_CHUNKS = 264 };
} // namespace rn

using namespace rn;

extern "C" kiln_error *kiln_residual_norm_forward_cuda(float *y, kiln_bf16 *ln, float *rstd, const float *a,
                                                       const kiln_bf16 *a_bf16, const float *ab, const float *as,
                                                       const float *x, const float *xb, const float *xs,
                                                       const float *w, int64_t n, int64_t d, float eps,
                                                       void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || d <= 0) return NULL;
    if ((!a) == (!a_bf16) || (x && (!xs || !as)) || (ab && !as) || (ln && !w))
        return kiln_errorf(KILN_EINVAL, "residual_norm forward: exactly one of a / a_bf16, as with ab or x, xs with x "
                                        "and w with ln are required");
    const int vec = d % 4 == 0 && aligned16(y) && aligned16(ln) && aligned16(a) && aligned16(a_bf16) &&
                    aligned16(ab) && aligned16(as) && aligned16(x) && aligned16(xb) && aligned16(xs) && aligned16(w);
    int threads, nv;
    shape_for(d, vec ? 4 : 1, &threads, &nv);
    if (!nv)
        return kiln_errorf(KILN_EINVAL, "residual_norm forward: rows of %lld columns exceed %d", (long long)d,
                           (vec ? 4 : 1) * THREADS * MAXNV);
    if (vec && nv <= PIPE_NV) {
        const cudaError_t e =
            a_bf16 ? fwd_pipe<bf16>(nv, threads, st, y, (bf16 *)ln, rstd, (const bf16 *)a_bf16, ab, as, x, xb, xs, w, n, (int)d, eps)
                   : fwd_pipe<float>(nv, threads, st, y, (bf16 *)ln, rstd, a, ab, as, x, xb, xs, w, n, (int)d, eps);
        if (e != cudaSuccess)
            return kiln_errorf(KILN_EIO, "residual_norm forward: kernel launch failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    const int grid = (int)(n < 1048576 ? n : 1048576);
    if (a_bf16) {
        if (vec) launch_fwd<bf16, 4>(nv, grid, threads, st, y, (bf16 *)ln, rstd, (const bf16 *)a_bf16, ab, as, x, xb, xs, w, n, (int)d, eps);
        else launch_fwd<bf16, 1>(nv, grid, threads, st, y, (bf16 *)ln, rstd, (const bf16 *)a_bf16, ab, as, x, xb, xs, w, n, (int)d, eps);
    } else {
        if (vec) launch_fwd<float, 4>(nv, grid, threads, st, y, (bf16 *)ln, rstd, a, ab, as, x, xb, xs, w, n, (int)d, eps);
        else launch_fwd<float, 1>(nv, grid, threads, st, y, (bf16 *)ln, rstd, a, ab, as, x, xb, xs, w, n, (int)d, eps);
    }
    LAUNCH_CHECK("residual_norm forward");
done:
    return err;
}

// d % 8: the norm + join backward's stage keeps the gathered bf16 row between two f32 ones, 16-byte aligned
extern "C" int kiln_residual_norm_gather_ok(int64_t d) { return d > 0 && d % 8 == 0 && d <= 4 * THREADS * PIPE_NV; }

extern "C" kiln_error *kiln_residual_norm_forward_gather_cuda(float *y, kiln_bf16 *ln, float *rstd, const kiln_bf16 *rows,
                                                              const int32_t *slot, const float *gate, const float *ab,
                                                              const float *as, const float *x, const float *xb,
                                                              const float *xs, const float *w, int64_t n, int64_t d,
                                                              float eps, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || d <= 0) return NULL;
    if (!rows || !slot || !gate || (x && (!xs || !as)) || (ab && !as) || (ln && !w))
        return kiln_errorf(KILN_EINVAL, "residual_norm forward (gathered a): rows, slot and gate, as with ab or x, xs "
                                        "with x and w with ln are required");
    if (!kiln_residual_norm_gather_ok(d) || !(aligned16(y) && aligned16(ln) && aligned16(rows) && aligned16(ab) &&
                                              aligned16(as) && aligned16(x) && aligned16(xb) && aligned16(xs) &&
                                              aligned16(w)))
        return kiln_errorf(KILN_EUNSUPPORTED, "residual_norm forward (gathered a): rows of at most %d columns, a "
                           "multiple of 8, 16-byte aligned (d = %lld)", 4 * THREADS * PIPE_NV, (long long)d);
    int threads, nv;
    shape_for(d, 4, &threads, &nv);
    const cudaError_t e = fwd_pipe<bf16, true>(nv, threads, st, y, (bf16 *)ln, rstd, (const bf16 *)rows, ab, as, x, xb,
                                                xs, w, n, (int)d, eps, slot, gate);
    if (e != cudaSuccess)
        return kiln_errorf(KILN_EIO, "residual_norm forward (gathered a): kernel launch failed: %s",
                           cudaGetErrorString(e));
    return NULL;
}

extern "C" kiln_error *kiln_residual_norm_backward_cuda(const kiln_residual_norm_bwd *p, int64_t n, int64_t d,
                                                        void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *part = NULL;
    if (n <= 0 || d <= 0) return NULL;
    if (!p->y || (p->dln != NULL) + (p->dln_f32 != NULL) + (p->dln_rows != NULL) != 1 ||
        (p->dln_rows && !p->dln_slot) || !p->w || !p->rstd || !p->dup || !p->ups || !p->a || !p->as || !p->x ||
        !p->xs || !p->da || !p->dx)
        return kiln_errorf(KILN_EINVAL, "residual_norm backward: y, exactly one of dln / dln_f32 / dln_rows (with "
                                        "dln_slot), w, rstd, dup, ups, a, as, x, xs, da and dx are required");
    const int vec = d % 4 == 0 && aligned16(p->y) && aligned16(p->dln) && aligned16(p->dln_f32) && aligned16(p->w) &&
                    aligned16(p->dln_rows) && aligned16(p->dln_add) && aligned16(p->dup) &&
                    aligned16(p->upb) && aligned16(p->ups) && aligned16(p->a) && aligned16(p->ab) &&
                    aligned16(p->as) && aligned16(p->x) && aligned16(p->xb) && aligned16(p->xs) &&
                    aligned16(p->da) && aligned16(p->dx);
    int threads, nv;
    shape_for(d, vec ? 4 : 1, &threads, &nv);
    if (!nv)
        return kiln_errorf(KILN_EINVAL, "residual_norm backward: rows of %lld columns exceed %d", (long long)d,
                           (vec ? 4 : 1) * THREADS * MAXNV);
    {
        const int pipe = vec && nv <= PIPE_NV;
        if (p->dln_rows && (!pipe || !kiln_residual_norm_gather_ok(d)))
            return kiln_errorf(KILN_EUNSUPPORTED, "residual_norm backward: a gathered dln (dln_rows) needs rows of the "
                                                  "16-byte ring kernel (d %% 8 == 0, at most 4096, aligned), not d = %lld",
                               (long long)d);
        const int64_t rows_per = chunk_rows(n, pipe ? PIPE_CHUNKS : 512), chunks = (n + rows_per - 1) / rows_per;
        CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(NPART * chunks * d) * sizeof(float), st));
        if (pipe) {
            const int di = (int)d;
            CUDA_TRY(p->dln_rows  ? bwd_pipe<DLN_PAIR>(nv, threads, st, *p, part, n, di, rows_per, chunks)
                     : p->dln_f32 ? bwd_pipe<DLN_F32>(nv, threads, st, *p, part, n, di, rows_per, chunks)
                                  : bwd_pipe<DLN_BF16>(nv, threads, st, *p, part, n, di, rows_per, chunks));
        } else if (vec) launch_bwd<4>(nv, (int)chunks, threads, st, *p, part, n, (int)d, rows_per, chunks);
        else launch_bwd<1>(nv, (int)chunks, threads, st, *p, part, n, (int)d, rows_per, chunks);
        LAUNCH_CHECK("residual_norm backward");
        float *outs[NPART] = {p->dupb, p->dups, p->dw, p->dab, p->das, p->dxb, p->dxs};
        CUDA_TRY(colsum_add_multi(outs, NPART, part, chunks, d, st));
    }
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}

extern "C" kiln_error *kiln_norm_join_backward_cuda(const kiln_norm_join_bwd *p, int64_t n, int64_t d, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *part = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int ga = p->a_rows != NULL;
    if (!p->gout || !p->dln || !p->y || !p->w || !p->rstd || (!p->a) == !ga || (ga && (!p->a_slot || !p->a_gate)) ||
        !p->as || !p->da)
        return kiln_errorf(KILN_EINVAL, "norm_join backward: gout, dln, y, w, rstd, exactly one of a / a_rows (with "
                                        "a_slot and a_gate), as and da are required");
    const int vec = d % 4 == 0 && aligned16(p->gin) && aligned16(p->gout) && aligned16(p->dln) && aligned16(p->y) &&
                    aligned16(p->w) && aligned16(p->a) && aligned16(p->ab) && aligned16(p->as) && aligned16(p->da) &&
                    aligned16(p->a_rows);
    int threads, nv;
    shape_for(d, vec ? 4 : 1, &threads, &nv);
    if (!nv)
        return kiln_errorf(KILN_EINVAL, "norm_join backward: rows of %lld columns exceed %d", (long long)d,
                           (vec ? 4 : 1) * THREADS * MAXNV);
    if (ga && !(vec && nv <= PIPE_NV && kiln_residual_norm_gather_ok(d)))
        return kiln_errorf(KILN_EUNSUPPORTED, "norm_join backward: a gathered from a_rows needs rows of at most %d "
                           "columns, a multiple of 8, 16-byte aligned (d = %lld)", 4 * THREADS * PIPE_NV, (long long)d);
    {
        const int pipe = vec && nv <= PIPE_NV;
        const int64_t rows_per = chunk_rows(n, pipe ? PIPE_CHUNKS : 512), chunks = (n + rows_per - 1) / rows_per;
        CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(3 * chunks * d) * sizeof(float), st));
        if (pipe)
            CUDA_TRY(ga ? (nv == 1 ? nj_pipe_nv<1, true>(threads, st, *p, part, n, (int)d, rows_per, chunks)
                                   : nj_pipe_nv<2, true>(threads, st, *p, part, n, (int)d, rows_per, chunks))
                        : (nv == 1 ? nj_pipe_nv<1, false>(threads, st, *p, part, n, (int)d, rows_per, chunks)
                                   : nj_pipe_nv<2, false>(threads, st, *p, part, n, (int)d, rows_per, chunks)));
        else if (vec) launch_nj<4>(nv, (int)chunks, threads, st, *p, part, n, (int)d, rows_per, chunks);
        else launch_nj<1>(nv, (int)chunks, threads, st, *p, part, n, (int)d, rows_per, chunks);
        LAUNCH_CHECK("norm_join backward");
        float *outs[3] = {p->dw, p->dab, p->das};
        CUDA_TRY(colsum_add_multi(outs, 3, part, chunks, d, st));
    }
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}
