// AdamW and Muon's pointwise pieces on the device, the same arithmetic as src/train/optim.c element for
// element: explicit round-to-nearest intrinsics where the C code rounds (nvcc would otherwise fuse
// multiply-adds), f64 where it computes in f64, so that CPU and GPU steps agree to the last bit or two.
//
// AdamW is one launch for all of a rank's tensors (kiln_adamw_multi): a device table of the tensors and a
// work list of fixed chunks of 4096 elements, 4 consecutive elements per thread with 16-byte accesses where the
// addresses allow (two such groups at a time in the default launch over bf16 gradients: adamw_chunk), the
// gradient's scale (the mean over micro-batches and ranks, and the clip) applied on the way in, the bf16 copy
// written on the way out: w, g, m, v read once, w, m, v, bf16 w written once (30 bytes a parameter, the least
// this update can move); with zero_g, zeros written over the gradient as it is read (34
// bytes: the trainer's separate 4-byte zeroing pass folded in), except in tensors whose next writer overwrites
// them (keep_g: the experts' weights, 91% of the [cuda] model's parameters, whose weight gradients the first
// backward after a zeroing writes with beta = 0). The element arithmetic never depends on how
// the work is laid out, so every variant below gives the same bits (GPU test gpu_ops_adamw_variants).
//
// Where the time went (session 6, read from the code and ptxas, not yet from a GPU run): at 1764M parameters the
// step took 14.83 ms (r17) against 13.77 in session 4, with no change to its arithmetic or launch. What changed
// was registers: the zeroing, compiled into the one kernel as a run-time branch, took it from 58 to 72 registers
// a thread (ptxas -v), so 3 blocks of 256 threads fit on an SM instead of 4; and a thread that holds its loads in
// registers has nothing in flight while it does the element's f64 arithmetic, so what is in flight on an SM is
// set by how many threads fit. Measured on the H200 (run r23, 1764M parameters, read-only step; copy bound 12.41
// ms): chunks 13.80 ms (1.11x; hints 13.93), persistent 16.02 (hints 17.39), staged 16.70 (hints 19.43). So the
// register fix alone (14.83 -> 13.80) is the default; the persistent and staged launches and the evict-first hints
// all lost, and stay only behind the switches below. Kernels here:
//   - the staged kernel (KILN_ADAMW_GRID=staged): each thread copies its next two tiles' g, w, m, v into
//     shared memory with cp.async (which holds no registers) before it computes the current tile, so one tile's
//     loads per thread are always in flight whatever the occupancy; persistent (as many blocks as fit, each
//     walking the work list with a stride of the grid: no block launch or table lookup between chunks);
//   - the direct kernel (KILN_ADAMW_GRID=chunks, the default: a block a chunk, session 4's launch; =persistent: the
//     next chunk's entry loaded while the current one is updated), loads in registers;
//   - the zeroing a template parameter in both (ptxas: 60-72 registers, the staged kernel 64; no spills);
//   - streaming cache hints (KILN_ADAMW_HINTS=1): loads and stores evict-first (__ldcs/__stcs, cp.async with an
//     evict-first policy), since nothing is read twice; slower on the H200 (above).
// The zeroing step (zero_g) cost the direct kernel 2.4 ms more than its 0.6 GB of zeros (r23: 16.25 ms), so the
// one-rank trainer zeroes with memsets instead (kiln_zaya_cuda_grads_zero_added).
// Split weights (kiln_adamw_multi_set_split, session 25): the bf16-gradient tensors' f32 weights held as their bf16
// copy + their low 16 bits (kiln_f32_split), so the update reads and writes 4 bytes of weight instead of reading 4 and
// writing 6 (26 bytes a parameter with a bf16 gradient instead of 28): 12.76 -> 12.22 ms at the [cuda] size.
#include <stdlib.h>
#include <string.h>

#include "ops_common.cuh"
#include "launch.cuh"

namespace {

enum { AW_THREADS = 256, AW_CHUNK = 4096 }; // 4 elements a thread, 4 passes a chunk
// the staged kernel: blocks of 128 threads (at 65-72 registers, 7 blocks = 28 warps fit on an SM where 3 of 256 do: 24),
// a tile is one pass of the block, the copies run two tiles ahead (2 x 64 bytes a thread in flight: ~128 KB an SM)
enum { AWS_THREADS = 128, AW_TILE = 4 * AWS_THREADS, AW_STAGES = 3 };

struct adamw_seg {
    int64_t off, soff, n; // element offset of w, g, bf16 w; of m in the state (v follows at soff + n); count
    int decay, flags;     // flags: 1 = m, 2 = v at a 16-byte offset in the state; 4 = w/g at a 16-byte offset;
                          // 8 = keep the gradient (a zeroing step leaves it: its next writer overwrites it);
                          // 16 = the gradient is bf16: the n elements from bf16 element 2 off of g (the first
                          // half of its f32 slot), 8-byte aligned
    int zbit1, zper;      // zbit1 > 0 (bf16 gradients): chunk c's gradient is zero, unread, where bit
                          // zbit1 - 1 + c / zper of the zero mask is set (an expert without rows: zper chunks)
};
static_assert((int)AW_CHUNK == (int)KILN_ADAMW_CHUNK, "the header's chunk is the kernels'");

struct adamw_args {
    const adamw_seg *segs;
    const int2 *work; // {tensor, chunk} per work item; NULL: one tensor (`one`), item c = chunk c
    int nwork;        // work items of this launch (work[0 .. nwork)): at most INT32_MAX (create checks)
    adamw_seg one;
    float *w, *state;
    float *g; // written only by the zeroing kernels
    bf16 *wb;
    double b1, one_b1, b2, one_b2, c1, c2, eps, lr;
    float wd, gscale;
    int vec, vec_state; // the bases allow vector accesses (w, g, bf16 w / the state)
    const uint32_t *zmask; // the zero mask (kiln_adamw_multi_set_zero_mask; NULL: none)
    const bf16 *zeros;     // AW_CHUNK bf16 zeros, read instead of a zero chunk's gradient (from L2)
};

// whether work item {s, c}'s bf16 gradient is zero by the mask (one load a chunk)
__device__ __forceinline__ bool adamw_zero_chunk(const adamw_args &k, const adamw_seg &s, int c) {
    return s.zbit1 && k.zmask && mask_bit(k.zmask, s.zbit1 - 1 + c / s.zper);
}

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

// loads and stores, streaming (CS: evict-first in L1 and L2) or plain
template <bool CS> __device__ __forceinline__ float4 ldf4(const float *p) {
    if constexpr (CS) return __ldcs((const float4 *)p);
    else return *(const float4 *)p;
}
template <bool CS> __device__ __forceinline__ float ldf1(const float *p) {
    if constexpr (CS) return __ldcs(p);
    else return *p;
}
template <bool CS> __device__ __forceinline__ void stf4(float *p, float4 v) {
    if constexpr (CS) __stcs((float4 *)p, v);
    else *(float4 *)p = v;
}
template <bool CS> __device__ __forceinline__ void stf1(float *p, float v) {
    if constexpr (CS) __stcs(p, v);
    else *p = v;
}

// 4 elements at p[i] (cnt of them in the tensor): one 16-byte access when V = 4 and all 4 are there
template <int V, bool CS> __device__ __forceinline__ void ld4(const float *p, int i, int cnt, float *o) {
    if (V == 4 && cnt == 4) {
        const float4 q = ldf4<CS>(p + i);
        o[0] = q.x, o[1] = q.y, o[2] = q.z, o[3] = q.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = j < cnt ? ldf1<CS>(p + i + j) : 0.0f;
    }
}
template <int V, bool CS> __device__ __forceinline__ void st4(float *p, int i, int cnt, const float *o) {
    if (V == 4 && cnt == 4) {
        stf4<CS>(p + i, make_float4(o[0], o[1], o[2], o[3]));
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < cnt) stf1<CS>(p + i + j, o[j]);
    }
}
template <int V, bool CS> __device__ __forceinline__ void st4_bf16(bf16 *p, int i, int cnt, const float *o) {
    if (V == 4 && cnt == 4) {
        uint2 q;
        *(__nv_bfloat162 *)&q.x = __floats2bfloat162_rn(o[0], o[1]);
        *(__nv_bfloat162 *)&q.y = __floats2bfloat162_rn(o[2], o[3]);
        if constexpr (CS) __stcs((uint2 *)(p + i), q);
        else *(uint2 *)(p + i) = q;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < cnt) p[i + j] = __float2bfloat16_rn(o[j]);
    }
}

// 4 bf16 gradient elements at p[i] (cnt of them in the tensor) as floats: one 8-byte access when all 4 are there
__device__ __forceinline__ void ld4_gbf16(const bf16 *p, int i, int cnt, float *o) {
    if (cnt == 4) {
        const uint2 q = *(const uint2 *)(p + i);
        const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&q.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&q.y);
        o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = j < cnt ? __bfloat162float(p[i + j]) : 0.0f;
    }
}

// Split masters (kiln_adamw_multi_set_split, kiln_f32_split_cuda): an f32 weight held as hi, its bf16 copy (rounded
// to nearest, ties toward zero), and lo, its low 16 bits, which a chunk of AW_CHUNK elements keeps in the first half
// of its own f32 slots. kiln_f32_split / kiln_f32_join (src/base/dtype.c), the same integer steps.
__device__ __forceinline__ void f32_split(float f, unsigned short &hi, unsigned short &lo) {
    const unsigned u = __float_as_uint(f);
    const unsigned short top = (unsigned short)(u >> 16);
    lo = (unsigned short)u;
    hi = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)(top | 0x0040u) : (unsigned short)(top + (lo > 0x8000u));
}
__device__ __forceinline__ float f32_join(unsigned short hi, unsigned short lo) {
    const bool nan = (hi & 0x7f80u) == 0x7f80u && (hi & 0x007fu);
    const unsigned short top = nan ? hi : (unsigned short)(hi - (lo > 0x8000u));
    return __uint_as_float((unsigned)top << 16 | lo);
}
// 4 split weights at hb[i], lo[i] (cnt of them): one 8-byte access each when V = 4 and all 4 are there
template <int V, bool CS>
__device__ __forceinline__ void ld4_split(const unsigned short *hb, const unsigned short *lo, int i, int cnt, float *o) {
    if (V == 4 && cnt == 4) {
        uint2 h, l;
        if constexpr (CS) h = __ldcs((const uint2 *)(hb + i)), l = __ldcs((const uint2 *)(lo + i));
        else h = *(const uint2 *)(hb + i), l = *(const uint2 *)(lo + i);
        o[0] = f32_join((unsigned short)h.x, (unsigned short)l.x), o[1] = f32_join((unsigned short)(h.x >> 16), (unsigned short)(l.x >> 16));
        o[2] = f32_join((unsigned short)h.y, (unsigned short)l.y), o[3] = f32_join((unsigned short)(h.y >> 16), (unsigned short)(l.y >> 16));
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = j < cnt ? f32_join(hb[i + j], lo[i + j]) : 0.0f;
    }
}
template <int V, bool CS>
__device__ __forceinline__ void st4_split(unsigned short *hb, unsigned short *lo, int i, int cnt, const float *o) {
    unsigned short h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; j++) f32_split(o[j], h[j], l[j]);
    if (V == 4 && cnt == 4) {
        const uint2 hv = make_uint2(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16),
                    lv = make_uint2(l[0] | (unsigned)l[1] << 16, l[2] | (unsigned)l[3] << 16);
        if constexpr (CS) __stcs((uint2 *)(hb + i), hv), __stcs((uint2 *)(lo + i), lv);
        else *(uint2 *)(hb + i) = hv, *(uint2 *)(lo + i) = lv;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < cnt) hb[i + j] = h[j], lo[i + j] = l[j];
    }
}

// A group: elements i .. i+cnt-1 (cnt <= 4) of a chunk whose w, m, v, g (gb: as bf16) and bf16 w start at the
// pointers given (SP: w split, its low halves where w points, its high halves the bf16 w). Its loads, then its
// update and stores (apart, so that a thread can load several groups first).
struct aw_group {
    float g[4], w[4], m[4], v[4];
};
template <int VW, int VM, int VV, bool CS, bool GB, bool SP = false>
__device__ __forceinline__ void aw_group_load(aw_group &e, const bf16 *gb, const float *w, const float *m,
                                              const float *v, const float *g, const bf16 *wb, int i, int cnt) {
    if constexpr (GB) ld4_gbf16(gb, i, cnt, e.g);
    else ld4<VW, CS>(g, i, cnt, e.g);
    if constexpr (SP) ld4_split<VW, CS>((const unsigned short *)wb, (const unsigned short *)w, i, cnt, e.w);
    else ld4<VW, CS>(w, i, cnt, e.w);
    ld4<VM, CS>(m, i, cnt, e.m);
    ld4<VV, CS>(v, i, cnt, e.v);
}
template <int VW, int VM, int VV, bool CS, bool SP = false>
__device__ __forceinline__ void aw_group_update(const adamw_args &k, aw_group &e, float *w, float *m, float *v,
                                                bf16 *wb, float wd, int i, int cnt) {
#pragma unroll
    for (int j = 0; j < 4; j++) adamw_elem(k, wd, e.g[j], e.m[j], e.v[j], e.w[j]);
    if constexpr (SP) st4_split<VW, CS>((unsigned short *)wb, (unsigned short *)w, i, cnt, e.w);
    else st4<VW, CS>(w, i, cnt, e.w);
    st4<VM, CS>(m, i, cnt, e.m);
    st4<VV, CS>(v, i, cnt, e.v);
    if (!SP && wb) st4_bf16<VW, CS>(wb, i, cnt, e.w);
}

// elements [c0, c1) of tensor s (at most a chunk: 32-bit indices from the chunk's start, fewer registers); GB: the
// gradient is bf16 (a template parameter: a run-time branch in the loop cost the kernel 12 registers, a block an SM).
// U > 1: U groups of 4 a thread at a time while all U are whole, every group's loads issued before any arithmetic.
// A thread holds its loads in registers until it computes, so what is in flight on an SM is its threads x the
// bytes of the groups they load together: a bf16-gradient group is 56 bytes (64 with f32 gradients), and with one
// group a thread the bf16 launch ran at 3.65 TB/s in the step (session 20's trace). Two (58 -> 64 registers: still
// 4 blocks an SM) took the step's AdamW from 13.66 to 13.07-13.10 ms (session 21). The read-only step only, and
// only over bf16 gradients: with f32 ones two groups take 88 registers, half the blocks an SM, the same bytes.
// SP: the weights are split (w points at the chunk's low halves, wb at their high halves; wb is never NULL then).
// zc (GB): the chunk's gradient is zero (the zero mask): read from k.zeros instead.
template <int VW, int VM, int VV, bool ZG, bool CS, bool GB = false, int U = 1, bool SP = false>
__device__ __forceinline__ void adamw_chunk(const adamw_args &k, const adamw_seg &s, int64_t c0, int64_t c1,
                                            bool zc = false) {
    float *w = k.w + s.off + c0, *m = k.state + s.soff + c0, *v = m + s.n, *g = k.g + s.off + c0;
    // GB: the gradient's bf16 elements (unread otherwise)
    const bf16 *gb = zc ? k.zeros : (const bf16 *)k.g + 2 * s.off + c0;
    bf16 *wb = k.wb ? k.wb + s.off + c0 : NULL;
    const float wd = s.decay ? k.wd : 0.0f;
    const int len = (int)(c1 - c0);
    constexpr int S = 4 * AW_THREADS; // a pass of the block
    int i = 4 * (int)threadIdx.x;
    if constexpr (U > 1) {
        static_assert(!ZG, "several groups a thread: the read-only step only");
        for (; i + (U - 1) * S + 4 <= len; i += U * S) {
            aw_group e[U];
#pragma unroll
            for (int u = 0; u < U; u++) aw_group_load<VW, VM, VV, CS, GB, SP>(e[u], gb, w, m, v, g, wb, i + u * S, 4);
#pragma unroll
            for (int u = 0; u < U; u++) aw_group_update<VW, VM, VV, CS, SP>(k, e[u], w, m, v, wb, wd, i + u * S, 4);
        }
    }
    for (; i < len; i += S) { // U = 1: every group; U > 1: the chunk's last (fewer than U whole ones, a partial one)
        const int cnt = len - i < 4 ? len - i : 4;
        aw_group e;
        aw_group_load<VW, VM, VV, CS, GB, SP>(e, gb, w, m, v, g, wb, i, cnt);
        if (ZG && !(s.flags & 8)) { // a plain store: zeros from the zero register (the .cs form wants 4 registers of 0)
            const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            st4<VW, false>(g, i, cnt, zero);
        }
        aw_group_update<VW, VM, VV, CS, SP>(k, e, w, m, v, wb, wd, i, cnt);
    }
}

__device__ __forceinline__ int2 adamw_item(const adamw_args &k, int c) {
    return k.work ? __ldg(&k.work[c]) : make_int2(0, c);
}

// Work items blockIdx.x, + gridDim.x, ...: one each when the grid has a block per item, a stride of the grid
// when it is persistent. The next item's entry is loaded before the current one is updated. GB: every item's
// gradient is bf16 (the table's bf16-gradient tensors are a work list and a launch of their own: the branch
// inside one kernel cost it 12 registers, a block an SM).
// SP (with GB only): the bf16-gradient tensors' weights are split (adamw_split_kernel), with vector accesses
// throughout (SPV: every split tensor and the state aligned; the host checks) or none.
template <bool ZG, bool CS, bool GB, int U, bool SP, bool SPV = false>
__device__ __forceinline__ void adamw_multi_body(const adamw_args &k) {
    const unsigned nwork = (unsigned)k.nwork;
    unsigned c = blockIdx.x; // c + gridDim.x < 2^32: both are below 2^31
    if (c >= nwork) return;
    int2 wk = adamw_item(k, (int)c);
    for (;;) {
        const unsigned cn = c + gridDim.x;
        const int2 wn = cn < nwork ? adamw_item(k, (int)cn) : wk;
        const adamw_seg s = k.work ? k.segs[wk.x] : k.one;
        const int64_t c0 = (int64_t)wk.y * AW_CHUNK, c1 = c0 + AW_CHUNK < s.n ? c0 + AW_CHUNK : s.n;
        // the alignment is uniform over the item: one branch picks the vector width of each stream
        const bool vw = k.vec && (s.flags & 4), vm = vw && k.vec_state && (s.flags & 1),
                   vv = vw && k.vec_state && (s.flags & 2);
        if constexpr (SP) { // one path only: with both, ptxas held to 64 registers spilled 84 bytes, not 12
            const bool zc = adamw_zero_chunk(k, s, wk.y);
            if constexpr (SPV) adamw_chunk<4, 4, 4, ZG, CS, true, U, true>(k, s, c0, c1, zc);
            else adamw_chunk<1, 1, 1, ZG, CS, true, U, true>(k, s, c0, c1, zc);
        } else if constexpr (GB) { // the scalar path where w or the state is not vector-aligned
            const bool zc = adamw_zero_chunk(k, s, wk.y);
            if (vm && vv) adamw_chunk<4, 4, 4, ZG, CS, true, U>(k, s, c0, c1, zc);
            else adamw_chunk<1, 1, 1, ZG, CS, true, U>(k, s, c0, c1, zc);
        } else if (vm && vv) adamw_chunk<4, 4, 4, ZG, CS, false, U>(k, s, c0, c1);
        else if (vm) adamw_chunk<4, 4, 1, ZG, CS, false, U>(k, s, c0, c1);
        else if (vv) adamw_chunk<4, 1, 4, ZG, CS, false, U>(k, s, c0, c1);
        else if (vw) adamw_chunk<4, 1, 1, ZG, CS, false, U>(k, s, c0, c1);
        else adamw_chunk<1, 1, 1, ZG, CS, false, U>(k, s, c0, c1);
        if (cn >= nwork) break;
        c = cn, wk = wn;
    }
}
template <bool ZG, bool CS, bool GB, int U = 1>
__global__ void __launch_bounds__(AW_THREADS) adamw_multi_kernel(const adamw_args k) {
    pdl_wait();
    adamw_multi_body<ZG, CS, GB, U, false>(k);
}
// Split weights, held to 64 registers (4 blocks an SM, as the f32 weights' kernel): left alone, ptxas gives the
// two-group vector kernel 80 (3 blocks an SM). At 64 it spills 12 bytes and took 12.22 ms at the [cuda] size against
// the f32 weights' 12.76 (session 25 r3); with the scalar path in the same kernel it spilled 84 and took 12.95 (r2).
template <bool CS, int U, bool SPV>
__global__ void __launch_bounds__(AW_THREADS, 4) adamw_split_kernel(const adamw_args k) {
    pdl_wait();
    adamw_multi_body<false, CS, true, U, true, SPV>(k);
}

// ---- the staged kernel: loads through shared memory, two tiles ahead ----
// The direct kernel above keeps its loads in registers, so a thread has nothing in flight while it does the
// element's f64 arithmetic, and what is in flight on an SM depends on how many threads fit (its registers).
// Here each thread copies its next tiles' g, w, m, v (4 x 16 bytes each) into shared memory with cp.async, which
// holds no registers, before it computes the current one: the loads of a tile or two per thread are always in
// flight, whatever the occupancy. A thread reads back only what it copied itself, so no barrier is needed,
// only its own cp.async.wait_group. The arithmetic is adamw_elem's: the same bits.

// A position in the block's sequence of tiles: work item c (blockIdx.x, + gridDim.x, ...), tile `sub` of it.
struct aw_pos {
    unsigned c;
    int sub, len;           // tile; elements of the item (at most a chunk)
    int64_t off, moff, n;   // the item's first element in w, g, bf16 w; in the state (m; v at + n)
    int64_t gb;             // a bf16 gradient's: its first element's index in g read as bf16
    int flags;              // 1 decay, 2 w/g/bf16 w vector-aligned, 4 m, 8 v, 16 keep the gradient, 32 bf16 gradient,
                            // 64 a zero bf16 gradient (the zero mask: k.zeros read instead)
};

__device__ __forceinline__ void aw_pos_item(const adamw_args &k, aw_pos &q, unsigned c) {
    q.c = c, q.sub = 0;
    if (c >= (unsigned)k.nwork) { // past the block's last item: nothing to copy or compute
        q.len = 0, q.off = q.moff = q.n = q.gb = 0, q.flags = 0;
        return;
    }
    const int2 wk = adamw_item(k, (int)c);
    const adamw_seg s = k.work ? k.segs[wk.x] : k.one;
    const int64_t c0 = (int64_t)wk.y * AW_CHUNK;
    q.len = (int)(s.n - c0 < AW_CHUNK ? s.n - c0 : AW_CHUNK);
    q.off = s.off + c0, q.moff = s.soff + c0, q.n = s.n, q.gb = 2 * s.off + c0;
    const bool vw = k.vec && (s.flags & 4);
    q.flags = (s.decay ? 1 : 0) | (vw ? 2 : 0) | (vw && k.vec_state && (s.flags & 1) ? 4 : 0) |
              (vw && k.vec_state && (s.flags & 2) ? 8 : 0) | (s.flags & 8 ? 16 : 0) | (s.flags & 16 ? 32 : 0) |
              (s.flags & 16 && adamw_zero_chunk(k, s, wk.y) ? 64 : 0);
}
__device__ __forceinline__ void aw_pos_next(const adamw_args &k, aw_pos &q) {
    if (++q.sub * AW_TILE >= q.len) aw_pos_item(k, q, q.c + gridDim.x);
}

// 4 floats (cnt of them real) from global src into shared dst: one 16-byte copy (the rest zero-filled) or one a float
template <bool CS>
__device__ __forceinline__ void aw_cp4(float *dst, const float *src, int cnt, bool vec, uint64_t pol) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (vec) {
        if constexpr (CS)
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d), "l"(src),
                         "r"(4 * cnt), "l"(pol) : "memory");
        else
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(4 * cnt) : "memory");
    } else {
        for (int j = 0; j < cnt; j++)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d + 4 * j), "l"(src + j) : "memory");
    }
}

template <bool CS>
__device__ __forceinline__ void aw_issue(const adamw_args &k, const aw_pos &q, float4 (*sm)[AWS_THREADS], uint64_t pol) {
    if (q.c < (unsigned)k.nwork) {
        const int e = q.sub * AW_TILE + 4 * (int)threadIdx.x;
        const int cnt = q.len - e < 4 ? q.len - e : 4;
        if (cnt > 0) {
            float *d = (float *)&sm[0][threadIdx.x];
            const int stride = 4 * AWS_THREADS; // floats between the streams' rows
            if (q.flags & 32) { // 4 bf16 (8 bytes; those past cnt zero-filled)
                const unsigned ds = (unsigned)__cvta_generic_to_shared(d);
                const bf16 *src = q.flags & 64 ? k.zeros + e : (const bf16 *)k.g + q.gb + e;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(ds), "l"(src), "r"(2 * cnt) : "memory");
            } else {
                aw_cp4<CS>(d, k.g + q.off + e, cnt, q.flags & 2, pol);
            }
            aw_cp4<CS>(d + stride, k.w + q.off + e, cnt, q.flags & 2, pol);
            aw_cp4<CS>(d + 2 * stride, k.state + q.moff + e, cnt, q.flags & 4, pol);
            aw_cp4<CS>(d + 3 * stride, k.state + q.moff + q.n + e, cnt, q.flags & 8, pol);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory"); // an empty group past the end keeps the count
}

template <bool CS> __device__ __forceinline__ void aw_st(float *p, int cnt, bool vec, const float *o) {
    if (vec && cnt == 4) {
        stf4<CS>(p, make_float4(o[0], o[1], o[2], o[3]));
    } else {
        for (int j = 0; j < cnt; j++) stf1<CS>(p + j, o[j]);
    }
}

template <bool ZG, bool CS>
__device__ __forceinline__ void aw_consume(const adamw_args &k, const aw_pos &q, float4 (*sm)[AWS_THREADS]) {
    const int e = q.sub * AW_TILE + 4 * (int)threadIdx.x;
    const int cnt = q.len - e < 4 ? q.len - e : 4;
    if (cnt <= 0) return;
    const float4 a = sm[0][threadIdx.x], b = sm[1][threadIdx.x], c = sm[2][threadIdx.x], d = sm[3][threadIdx.x];
    float gv[4] = {a.x, a.y, a.z, a.w}, wv[4] = {b.x, b.y, b.z, b.w}, mv[4] = {c.x, c.y, c.z, c.w},
          vv[4] = {d.x, d.y, d.z, d.w};
    if (q.flags & 32) { // the first 8 bytes hold 4 bf16
        const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&a.x), hi = __bfloat1622float2(*(const __nv_bfloat162 *)&a.y);
        gv[0] = lo.x, gv[1] = lo.y, gv[2] = hi.x, gv[3] = hi.y;
    }
    const bool vw = q.flags & 2;
    if (ZG && !(q.flags & 16)) {
        const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        aw_st<false>(k.g + q.off + e, cnt, vw, zero);
    }
    const float wd = (q.flags & 1) ? k.wd : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) adamw_elem(k, wd, gv[j], mv[j], vv[j], wv[j]);
    aw_st<CS>(k.w + q.off + e, cnt, vw, wv);
    aw_st<CS>(k.state + q.moff + e, cnt, q.flags & 4, mv);
    aw_st<CS>(k.state + q.moff + q.n + e, cnt, q.flags & 8, vv);
    if (k.wb) {
        if (vw) st4_bf16<4, CS>(k.wb + q.off, e, cnt, wv);
        else st4_bf16<1, CS>(k.wb + q.off, e, cnt, wv);
    }
}

template <bool ZG, bool CS> __global__ void __launch_bounds__(AWS_THREADS) adamw_staged_kernel(const adamw_args k) {
    pdl_wait();
    __shared__ float4 sm[AW_STAGES][4][AWS_THREADS]; // [stage][g, w, m, v][thread]: 24 KB
    uint64_t pol = 0;
    if constexpr (CS) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    aw_pos qp, qc; // the next tile to copy, the next to compute
    aw_pos_item(k, qp, blockIdx.x);
    qc = qp;
#pragma unroll
    for (int s = 0; s < AW_STAGES - 1; s++) {
        aw_issue<CS>(k, qp, sm[s], pol);
        aw_pos_next(k, qp);
    }
    for (int s = 0; qc.c < (unsigned)k.nwork; s = s + 1 == AW_STAGES ? 0 : s + 1) {
        // into the stage computed last time round: this thread has read it (its values were used)
        aw_issue<CS>(k, qp, sm[s == 0 ? AW_STAGES - 1 : s - 1], pol);
        aw_pos_next(k, qp);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(AW_STAGES - 1) : "memory"); // this tile's copies landed
        aw_consume<ZG, CS>(k, qc, sm[s]);
        aw_pos_next(k, qc);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
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

// KILN_ADAMW_GRID: chunks (default: the direct kernel, a block a chunk, session 4's geometry) | persistent (the
// direct kernel, persistent) | staged (the staged kernel, persistent); KILN_ADAMW_HINTS=0 (default) | 1 (streaming
// loads and stores). Read at each step, so that one process can time each (the GPU test); every one gives the
// same bits.
enum { AW_STAGED, AW_PERSISTENT, AW_CHUNKS };
struct adamw_variant {
    int grid, hints;
};
kiln_error *adamw_variant_get(adamw_variant *v) {
    const char *gr = getenv("KILN_ADAMW_GRID"), *hi = getenv("KILN_ADAMW_HINTS");
    v->grid = AW_CHUNKS, v->hints = 0; // the fastest on the H200 (r23): see the file's head
    if (gr && *gr) {
        if (!strcmp(gr, "chunks")) v->grid = AW_CHUNKS;
        else if (!strcmp(gr, "persistent")) v->grid = AW_PERSISTENT;
        else if (!strcmp(gr, "staged")) v->grid = AW_STAGED;
        else return kiln_errorf(KILN_EINVAL, "KILN_ADAMW_GRID=%s: expected staged, persistent or chunks", gr);
    }
    if (hi && *hi) {
        if (!strcmp(hi, "0")) v->hints = 0;
        else if (!strcmp(hi, "1")) v->hints = 1;
        else return kiln_errorf(KILN_EINVAL, "KILN_ADAMW_HINTS=%s: expected 0 or 1", hi);
    }
    return NULL;
}

// The blocks of kernel f that fit on the device at once (0 if the runtime cannot say: then a block an item).
// Cached per kernel (several host threads may drive GPUs: atomic): the grid only sets how the items are shared
// out, never what is computed.
template <typename F> int64_t adamw_resident(F f, int threads, bool staged, int64_t *cache) {
    const int64_t have = __atomic_load_n(cache, __ATOMIC_RELAXED);
    if (have) return have;
    int dev = 0, sms = 0, per = 0;
    // the staged kernel's blocks are bound by shared memory as much as by registers: ask for all of it (the L1
    // left beside it holds the work table; the streams bypass L1)
    if (staged && cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess)
        cudaGetLastError();
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, f, threads, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    __atomic_store_n(cache, (int64_t)sms * per, __ATOMIC_RELAXED);
    return (int64_t)sms * per;
}

// SP: split weights (spv: with vector accesses)
template <bool ZG, bool CS, bool GB, bool SP = false>
kiln_error *adamw_launch_t(const adamw_args &k, int grid_kind, bool spv, cudaStream_t st) {
    kiln_error *err = NULL;
    static int64_t res_direct, res_staged;
    if (SP && grid_kind == AW_STAGED) // the staged kernel copies f32 weights: it has no split form
        return kiln_errorf(KILN_EINVAL, "adamw step: KILN_ADAMW_GRID=staged does not take split weights "
                           "(KILN_SPLIT_MASTER=0 keeps them f32)");
    if (grid_kind == AW_STAGED) { // one kernel for both gradient types (a run-time flag: 62-64 registers either way)
        const int64_t r = adamw_resident(adamw_staged_kernel<ZG, CS>, AWS_THREADS, true, &res_staged);
        kiln_launch(adamw_staged_kernel<ZG, CS>, (unsigned)(r > 0 && r < k.nwork ? r : k.nwork), AWS_THREADS, 0, st,
                    k);
    } else {
        if constexpr (SP) {
            // the default (a block a chunk, no hints, every stream aligned): two groups a thread
            if constexpr (!CS)
                if (grid_kind == AW_CHUNKS && spv) {
                    kiln_launch(adamw_split_kernel<CS, 2, true>, (unsigned)k.nwork, AW_THREADS, 0, st, k);
                    LAUNCH_CHECK("adamw step");
                    return NULL;
                }
            static int64_t res_vec, res_scalar;
            const int64_t r = grid_kind != AW_PERSISTENT ? 0
                              : spv ? adamw_resident(adamw_split_kernel<CS, 1, true>, AW_THREADS, false, &res_vec)
                                    : adamw_resident(adamw_split_kernel<CS, 1, false>, AW_THREADS, false, &res_scalar);
            const unsigned grid = (unsigned)(r > 0 && r < k.nwork ? r : k.nwork);
            if (spv) kiln_launch(adamw_split_kernel<CS, 1, true>, grid, AW_THREADS, 0, st, k);
            else kiln_launch(adamw_split_kernel<CS, 1, false>, grid, AW_THREADS, 0, st, k);
        } else {
            const int64_t r =
                grid_kind == AW_PERSISTENT ? adamw_resident(adamw_multi_kernel<ZG, CS, GB>, AW_THREADS, false, &res_direct) : 0;
            // the default (a block a chunk, no hints) over bf16 gradients: two groups a thread (adamw_chunk)
            if constexpr (GB && !ZG && !CS)
                if (grid_kind == AW_CHUNKS) {
                    kiln_launch(adamw_multi_kernel<ZG, CS, GB, 2>, (unsigned)k.nwork, AW_THREADS, 0, st, k);
                    LAUNCH_CHECK("adamw step");
                    return NULL;
                }
            kiln_launch(adamw_multi_kernel<ZG, CS, GB>, (unsigned)(r > 0 && r < k.nwork ? r : k.nwork), AW_THREADS, 0,
                        st, k);
        }
    }
    LAUNCH_CHECK("adamw step");
done:
    return err;
}

// k.nwork items (at least one), all with f32 gradients or (gb) all with bf16 ones (sp: and split weights, spv: all
// of them and the state aligned for vector accesses)
kiln_error *adamw_launch(const adamw_args &k, bool zg, bool gb, bool sp, bool spv, const adamw_variant &v,
                         cudaStream_t st) {
    if (gb && sp)
        return v.hints ? adamw_launch_t<false, true, true, true>(k, v.grid, spv, st)
                       : adamw_launch_t<false, false, true, true>(k, v.grid, spv, st);
    if (gb)
        return v.hints ? adamw_launch_t<false, true, true>(k, v.grid, false, st)
                       : adamw_launch_t<false, false, true>(k, v.grid, false, st);
    if (zg)
        return v.hints ? adamw_launch_t<true, true, false>(k, v.grid, false, st)
                       : adamw_launch_t<true, false, false>(k, v.grid, false, st);
    return v.hints ? adamw_launch_t<false, true, false>(k, v.grid, false, st)
                   : adamw_launch_t<false, false, false>(k, v.grid, false, st);
}

} // namespace

// Two work lists: the chunks of the tensors with f32 gradients (list 0) and of those with bf16 ones (list 1),
// each in tensor order; a step launches each list's chunks of its tensors.
struct kiln_adamw_multi {
    adamw_seg *segs;    // device
    int2 *work[2];      // device
    int64_t blocks[2];  // work items (chunks) of each list
    int count;
    int64_t *first[2];  // host: tensor i's chunks in list l are work[l][first[l][i] .. first[l][i + 1])
    int split;          // the bf16-gradient tensors' weights are split (kiln_adamw_multi_set_split)
    int gb_vec;         // every bf16-gradient tensor's w, m and v at 16-byte offsets
    const uint32_t *zmask; // kiln_adamw_multi_set_zero_mask's
    bf16 *zeros;        // AW_CHUNK zeros (device) where a tensor has a zero mask bit
};

extern "C" void kiln_adamw_multi_set_split(kiln_adamw_multi *p, int on) { p->split = on != 0; }
extern "C" void kiln_adamw_multi_set_zero_mask(kiln_adamw_multi *p, const uint32_t *mask) { p->zmask = mask; }

extern "C" void kiln_adamw_multi_free(kiln_adamw_multi *p) {
    if (!p) return;
    cudaFree(p->segs);
    cudaFree(p->zeros);
    for (int l = 0; l < 2; l++) cudaFree(p->work[l]), free(p->first[l]);
    free(p);
}

extern "C" kiln_error *kiln_adamw_multi_create(const kiln_adamw_tensor *t, int count, kiln_adamw_multi **out) {
    kiln_error *err = NULL;
    kiln_adamw_multi *p = (kiln_adamw_multi *)calloc(1, sizeof *p);
    adamw_seg *hs = (adamw_seg *)calloc((size_t)count + 1, sizeof *hs);
    int2 *hw = NULL;
    int64_t blocks = 0;
    *out = NULL;
    if (!p || !hs || !(p->first[0] = (int64_t *)calloc((size_t)count + 1, sizeof(int64_t))) ||
        !(p->first[1] = (int64_t *)calloc((size_t)count + 1, sizeof(int64_t)))) {
        err = kiln_errorf(KILN_ENOMEM, "adamw: a table of %d tensors", count);
        goto done;
    }
    p->count = count;
    p->gb_vec = 1;
    for (int i = 0; i < count; i++) {
        if (t[i].n < 0 || t[i].off < 0 || t[i].soff < 0) {
            err = kiln_errorf(KILN_EINVAL, "adamw: tensor %d: offset %lld, state offset %lld, %lld elements", i,
                              (long long)t[i].off, (long long)t[i].soff, (long long)t[i].n);
            goto done;
        }
        if (t[i].g_bf16 && (!t[i].keep_g || t[i].off % 4)) {
            err = kiln_errorf(KILN_EINVAL, "adamw: tensor %d: a bf16 gradient must be kept by a zeroing step (keep_g: its "
                              "writer overwrites it) and start at an offset that is a multiple of 4 (%lld)", i,
                              (long long)t[i].off);
            goto done;
        }
        if (t[i].zbit1 && (t[i].zbit1 < 0 || !t[i].g_bf16 || t[i].zn <= 0 || t[i].zn % AW_CHUNK || t[i].n % t[i].zn ||
                           t[i].zn / AW_CHUNK > INT32_MAX)) {
            err = kiln_errorf(KILN_EINVAL, "adamw: tensor %d: zero-mask groups (bit %d) of %lld elements: they need a bf16 "
                              "gradient, a whole number of chunks of %d each and a whole number of them in its %lld",
                              i, t[i].zbit1 - 1, (long long)t[i].zn, AW_CHUNK, (long long)t[i].n);
            goto done;
        }
        hs[i].off = t[i].off, hs[i].soff = t[i].soff, hs[i].n = t[i].n, hs[i].decay = t[i].decay != 0;
        hs[i].zbit1 = t[i].zbit1, hs[i].zper = t[i].zbit1 ? (int)(t[i].zn / AW_CHUNK) : 1;
        if (t[i].zbit1 && !p->zeros) {
            CUDA_TRY(cudaMalloc((void **)&p->zeros, AW_CHUNK * sizeof(bf16)));
            CUDA_TRY(cudaMemset(p->zeros, 0, AW_CHUNK * sizeof(bf16)));
        }
        hs[i].flags = (t[i].soff % 4 == 0 ? 1 : 0) | ((t[i].soff + t[i].n) % 4 == 0 ? 2 : 0) | (t[i].off % 4 == 0 ? 4 : 0) |
                      (t[i].keep_g ? 8 : 0) | (t[i].g_bf16 ? 16 : 0);
        blocks += (t[i].n + AW_CHUNK - 1) / AW_CHUNK;
        if (t[i].g_bf16 && hs[i].flags % 8 != 7) p->gb_vec = 0;
    }
    if (blocks > INT32_MAX) {
        err = kiln_errorf(KILN_EINVAL, "adamw: %lld chunks of %d elements is too many", (long long)blocks, AW_CHUNK);
        goto done;
    }
    if (!(hw = (int2 *)malloc((size_t)(blocks + 1) * sizeof *hw))) {
        err = kiln_errorf(KILN_ENOMEM, "adamw: a work list of %lld chunks", (long long)blocks);
        goto done;
    }
    CUDA_TRY(cudaMalloc((void **)&p->segs, ((size_t)count + 1) * sizeof *hs));
    CUDA_TRY(cudaMemcpy(p->segs, hs, (size_t)count * sizeof *hs, cudaMemcpyHostToDevice));
    for (int l = 0; l < 2; l++) {
        int64_t nb = 0;
        for (int i = 0; i < count; i++) {
            p->first[l][i] = nb;
            if ((t[i].g_bf16 != 0) != l) continue;
            for (int64_t c = 0; c * AW_CHUNK < t[i].n; c++) hw[nb++] = make_int2(i, (int)c);
        }
        p->first[l][count] = nb;
        p->blocks[l] = nb;
        CUDA_TRY(cudaMalloc((void **)&p->work[l], (size_t)(nb + 1) * sizeof *hw));
        if (nb) CUDA_TRY(cudaMemcpy(p->work[l], hw, (size_t)nb * sizeof *hw, cudaMemcpyHostToDevice));
    }
    // the tables' copies (and the zeros' memset) ran on the legacy stream, which a non-blocking stream's step
    // does not wait for, and a copy from pageable memory may return before its data lands
    CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
done:
    free(hs);
    free(hw);
    if (err) kiln_adamw_multi_free(p);
    else *out = p;
    return err;
}

extern "C" kiln_error *kiln_adamw_multi_step_range_cuda(const kiln_adamw_multi *p, int t0, int t1, float *w, float *g,
                                                        float *state, float gscale, const kiln_optim_hparams *hp,
                                                        double lr, int64_t t, kiln_bf16 *w_bf16, int zero_g,
                                                        int64_t max_blocks, void *stream) {
    kiln_error *err = NULL;
    adamw_args k;
    adamw_variant v;
    memset(&k, 0, sizeof k);
    if (t0 < 0 || t1 > p->count || t0 > t1)
        return kiln_errorf(KILN_EINVAL, "adamw step: tensors %d..%d of a table of %d", t0, t1 - 1, p->count);
    KILN_TRY(adamw_variant_get(&v));
    if (p->first[0][t1] == p->first[0][t0] && p->first[1][t1] == p->first[1][t0]) return NULL;
    if (p->first[1][t1] > p->first[1][t0] && ((uintptr_t)g & 7))
        return kiln_errorf(KILN_EINVAL, "adamw step: bf16 gradients need an 8-byte aligned gradient buffer");
    if (p->first[1][t1] > p->first[1][t0] && p->split && (!w_bf16 || ((uintptr_t)w_bf16 & 1)))
        return kiln_errorf(KILN_EINVAL, "adamw step: split weights need their bf16 copy (the step's w_bf16)");
    KILN_TRY(adamw_args_init(&k, hp, lr, t, gscale));
    k.segs = p->segs;
    k.w = w, k.g = g, k.state = state, k.wb = (bf16 *)w_bf16;
    k.vec = aligned16(w) && aligned16(g) && ((uintptr_t)w_bf16 & 7) == 0;
    k.vec_state = aligned16(state);
    k.zmask = p->zmask, k.zeros = p->zeros;
    // each list's chunks of these tensors, as in the whole launch: each element sees the same arithmetic. At most
    // max_blocks chunks a launch: a launch's blocks not yet running wait in the block scheduler, where a stream
    // beside this one (of greater priority or not) finds them ahead of its own
    for (int l = 0; l < 2 && !err; l++) {
        const int64_t b0 = p->first[l][t0], nb = p->first[l][t1] - b0, step = max_blocks > 0 ? max_blocks : nb;
        for (int64_t b = 0; b < nb && !err; b += step) {
            k.work = p->work[l] + b0 + b;
            k.nwork = (int)(nb - b < step ? nb - b : step);
            err = adamw_launch(k, zero_g != 0, l == 1, l == 1 && p->split, k.vec && k.vec_state && p->gb_vec, v,
                               (cudaStream_t)stream);
        }
    }
    if (err) err = kiln_error_wrap(err, "adamw step (tensors %d..%d)", t0, t1 - 1);
    return err;
}

extern "C" kiln_error *kiln_adamw_multi_step_cuda(const kiln_adamw_multi *p, float *w, const float *g, float *state,
                                                  float gscale, const kiln_optim_hparams *hp, double lr, int64_t t,
                                                  kiln_bf16 *w_bf16, void *stream) {
    // g: read only (no zeroing)
    return kiln_adamw_multi_step_range_cuda(p, 0, p->count, w, (float *)g, state, gscale, hp, lr, t, w_bf16, 0, 0, stream);
}

namespace {
// Split masters' layout changes, a block a chunk of AW_CHUNK elements (AdamW's chunks: a chunk's low halves lie in
// its own slots), 16 elements a thread. TO_SPLIT: w f32 -> hi into hb, lo into the chunk's first half; else the
// reverse (hb only read). A chunk's reads and writes overlap, so every thread's reads come before the barrier and
// every write after it; no other block touches the chunk.
template <bool TO_SPLIT>
__global__ void __launch_bounds__(AW_THREADS) f32_split_kernel(float *w, unsigned short *hb, int64_t n) {
    pdl_wait();
    constexpr int P = AW_CHUNK / (4 * AW_THREADS);
    const int64_t c0 = (int64_t)blockIdx.x * AW_CHUNK;
    const int len = (int)(n - c0 < AW_CHUNK ? n - c0 : AW_CHUNK);
    float *wc = w + c0;
    unsigned short *lo = (unsigned short *)wc, *hc = hb + c0;
    float x[P][4];
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int i = 4 * (int)threadIdx.x + p * 4 * AW_THREADS, cnt = len - i < 4 ? (len - i > 0 ? len - i : 0) : 4;
        if constexpr (TO_SPLIT) ld4<4, false>(wc, i, cnt, x[p]);
        else ld4_split<4, false>(hc, lo, i, cnt, x[p]);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int i = 4 * (int)threadIdx.x + p * 4 * AW_THREADS, cnt = len - i < 4 ? (len - i > 0 ? len - i : 0) : 4;
        if constexpr (TO_SPLIT) st4_split<4, false>(hc, lo, i, cnt, x[p]);
        else st4<4, false>(wc, i, cnt, x[p]);
    }
}

template <bool TO_SPLIT> kiln_error *f32_split_launch(float *w, kiln_bf16 *w_bf16, int64_t n, void *stream) {
    kiln_error *err = NULL;
    const char *what = TO_SPLIT ? "split weights (f32 -> bf16 + low halves)" : "split weights (bf16 + low halves -> f32)";
    if (n <= 0) return NULL;
    if (((uintptr_t)w & 15) || ((uintptr_t)w_bf16 & 7))
        return kiln_errorf(KILN_EINVAL, "%s: the f32 weights must be 16-byte aligned and their bf16 copy 8-byte "
                           "aligned", what);
    if ((n + AW_CHUNK - 1) / AW_CHUNK > INT32_MAX) return kiln_errorf(KILN_EINVAL, "%s: %lld elements", what, (long long)n);
    kiln_launch(f32_split_kernel<TO_SPLIT>, (unsigned)((n + AW_CHUNK - 1) / AW_CHUNK), AW_THREADS, 0,
                (cudaStream_t)stream, w, (unsigned short *)w_bf16, n);
    LAUNCH_CHECK(what);
done:
    return err;
}

} // namespace

extern "C" kiln_error *kiln_f32_split_cuda(float *w, kiln_bf16 *w_bf16, int64_t n, void *stream) {
    return f32_split_launch<true>(w, w_bf16, n, stream);
}
extern "C" kiln_error *kiln_f32_join_cuda(float *w, const kiln_bf16 *w_bf16, int64_t n, void *stream) {
    return f32_split_launch<false>(w, (kiln_bf16 *)w_bf16, n, stream);
}

// the gradient multiplied by gscale on the way in (f32, the rounding of the separate scale pass it replaces)
static __global__ void muon_momentum_kernel(float *m, float *u, const float *g, int64_t n, float mu, float gscale) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = __fmul_rn(g[i], gscale), mi = __fadd_rn(__fmul_rn(mu, m[i]), gi);
        m[i] = mi;
        u[i] = __fadd_rn(gi, __fmul_rn(mu, mi)); // Nesterov
    }
}

#define NRM_CHUNK 65536
// grid (chunks, mats): part[mat * chunks + chunk] = sum of squares over the chunk, in f64
static __global__ void muon_sumsq_kernel(double *part, const float *u, int64_t mn, int64_t chunks) {
    pdl_wait();
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
    pdl_wait();
    const int64_t mat = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (mat >= mats) return;
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[mat * chunks + c];
    inv[mat] = (float)(1.0 / (sqrt(s) + 1e-7));
}
static __global__ void muon_scale_kernel(float *u, const float *inv, int64_t mn) {
    pdl_wait();
    const float f = inv[blockIdx.y];
    float *um = u + blockIdx.y * mn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < mn; i += (int64_t)gridDim.x * blockDim.x)
        um[i] = __fmul_rn(um[i], f);
}

static __global__ void muon_update_kernel(float *w, const float *u, int64_t n, float wd, float lrs, bf16 *wb) {
    pdl_wait();
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
    if ((n + AW_CHUNK - 1) / AW_CHUNK > INT32_MAX) return kiln_errorf(KILN_EINVAL, "adamw step: %lld elements", (long long)n);
    k.nwork = (int)((n + AW_CHUNK - 1) / AW_CHUNK);
    k.w = w, k.g = (float *)g, k.state = state, k.wb = (bf16 *)w_bf16; // g: read only
    k.vec = aligned16(w) && aligned16(g) && ((uintptr_t)w_bf16 & 7) == 0;
    k.vec_state = aligned16(state) && aligned16(state + n);
    adamw_variant v;
    KILN_TRY(adamw_variant_get(&v));
    err = adamw_launch(k, false, false, false, false, v, (cudaStream_t)stream);
    if (err) err = kiln_error_wrap(err, "adamw step");
    return err;
}

extern "C" kiln_error *kiln_muon_momentum_scaled_cuda(float *state, float *u, const float *g, int64_t n,
                                                      const kiln_optim_hparams *hp, float gscale, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    kiln_launch(muon_momentum_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, state, u, g, n,
                (float)hp->muon_momentum, gscale);
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
    kiln_launch(muon_sumsq_kernel, dim3((unsigned)chunks, (unsigned)mats), 256, 0, st, part, u, mn, chunks);
    LAUNCH_CHECK("muon normalize (sums)");
    kiln_launch(muon_inv_kernel, (int)((mats + 127) / 128), 128, 0, st, inv, part, mats, chunks);
    LAUNCH_CHECK("muon normalize (norms)");
    kiln_launch(muon_scale_kernel, dim3((unsigned)bx, (unsigned)mats), 256, 0, st, u, inv, mn);
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
    kiln_launch(muon_update_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, w, u, n, wd, lrs, (bf16 *)w_bf16);
    LAUNCH_CHECK("muon update");
done:
    return err;
}
