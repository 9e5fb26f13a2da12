// Can the optimizer's memory-bound step run beside the forward's GEMMs on a share of the SMs? (issue [cuda],
// docs/perf.md "session 19"). A standalone measurement, not part of kiln: an AdamW-shaped stream (bf16 gradient,
// f32 m, v, w read; m, v, w and a bf16 copy of w written: 28 bytes an element) and a cuBLASLt bf16 GEMM
// (16384 x 8192 x 2048, the trainer's projection sizes), each alone and together:
//   - the stream over all SMs, by plain 16-byte loads and by TMA bulk copies through shared memory, against a
//     device copy of the same bytes (cudaMemcpyAsync);
//   - the stream on k blocks (one an SM) and the GEMM told to use the other SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET),
//     alone and on two streams at once, and what the pair saves against running both one after the other on all SMs.
// Build and run: bench/sm_partition.sh on the GPU machine.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "sm_partition: %s at line %d\n", cudaGetErrorString(e_), __LINE__);                        \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
#define LK(x)                                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "sm_partition: cuBLASLt status %d at line %d\n", (int)s_, __LINE__);                       \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

typedef __nv_bfloat16 bf16;

// one AdamW-shaped update of 8 elements held in registers (constant hyperparameters: the bytes are the point)
static __device__ __forceinline__ void upd8(uint4 &gq, float *m, float *v, float *w) {
    const bf16 *g = (const bf16 *)&gq;
    bf16 o[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float x = __bfloat162float(g[k]);
        m[k] = 0.9f * m[k] + 0.1f * x;
        v[k] = 0.95f * v[k] + 0.05f * x * x;
        w[k] -= 1e-4f * (m[k] * rsqrtf(v[k] + 1e-16f) + 0.1f * w[k]);
        o[k] = __float2bfloat16_rn(w[k]);
    }
    gq = *(uint4 *)o;
}

// plain loads: a thread 8 consecutive elements an iteration, grid-stride
__global__ void stream_plain(const bf16 *__restrict__ g, float *__restrict__ m, float *__restrict__ v,
                             float *__restrict__ w, bf16 *__restrict__ wb, long n8) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        uint4 gq = ((const uint4 *)g)[i];
        float mm[8], vv[8], ww[8];
        *(float4 *)mm = ((float4 *)m)[2 * i], *(float4 *)(mm + 4) = ((float4 *)m)[2 * i + 1];
        *(float4 *)vv = ((float4 *)v)[2 * i], *(float4 *)(vv + 4) = ((float4 *)v)[2 * i + 1];
        *(float4 *)ww = ((float4 *)w)[2 * i], *(float4 *)(ww + 4) = ((float4 *)w)[2 * i + 1];
        upd8(gq, mm, vv, ww);
        ((float4 *)m)[2 * i] = *(float4 *)mm, ((float4 *)m)[2 * i + 1] = *(float4 *)(mm + 4);
        ((float4 *)v)[2 * i] = *(float4 *)vv, ((float4 *)v)[2 * i + 1] = *(float4 *)(vv + 4);
        ((float4 *)w)[2 * i] = *(float4 *)ww, ((float4 *)w)[2 * i + 1] = *(float4 *)(ww + 4);
        ((uint4 *)wb)[i] = gq;
    }
}

// TMA bulk copies: tiles of TE elements (g 4 KB, m/v/w 8 KB each) through STAGES shared-memory slots; one thread
// issues a slot's four loads (one mbarrier) and, after the block updated it in place, its four stores
#define TE 2048
#define SLOT 32768
static __device__ __forceinline__ uint32_t su32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
template <int STAGES>
__global__ void __launch_bounds__(256) stream_bulk(const bf16 *g, float *m, float *v, float *w, bf16 *wb, long ntiles) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t *full = (uint64_t *)(sm + STAGES * SLOT);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(su32(&full[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](long t, int s) {
        unsigned char *b = sm + s * SLOT;
        const uint32_t bar = su32(&full[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(4096 + 3 * 8192)
                     : "memory");
        const void *src[4] = {g + t * TE, m + t * TE, v + t * TE, w + t * TE};
        const uint32_t off[4] = {0, 4096, 12288, 20480}, bytes[4] = {4096, 8192, 8192, 8192};
        for (int a = 0; a < 4; a++)
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    su32(b + off[a])),
                "l"(src[a]), "r"(bytes[a]), "r"(bar)
                : "memory");
    };
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++)
            if (blockIdx.x + (long)s * gridDim.x < ntiles) issue(blockIdx.x + (long)s * gridDim.x, s);
    long it = 0;
    for (long t = blockIdx.x; t < ntiles; t += gridDim.x, it++) {
        const int s = (int)(it % STAGES);
        const uint32_t bar = su32(&full[s]), par = (uint32_t)((it / STAGES) & 1);
        uint32_t done;
        do {
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         "selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar), "r"(par)
                         : "memory");
        } while (!done);
        unsigned char *b = sm + s * SLOT;
        const int e = threadIdx.x * 8;
        float *mm = (float *)(b + 4096) + e, *vv = (float *)(b + 12288) + e, *ww = (float *)(b + 20480) + e;
        uint4 gq = *(uint4 *)(b + 2 * e);
        upd8(gq, mm, vv, ww);       // in place in the slot
        *(uint4 *)(b + 2 * e) = gq; // the bf16 copy over the gradient's place
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            void *dst[4] = {wb + t * TE, m + t * TE, v + t * TE, w + t * TE};
            const uint32_t off[4] = {0, 4096, 12288, 20480}, bytes[4] = {4096, 8192, 8192, 8192};
            for (int a = 0; a < 4; a++)
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst[a]),
                             "r"(su32(b + off[a])), "r"(bytes[a])
                             : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            // the previous slot's stores have read it (this one's may still be reading): refill that one, so
            // that STAGES - 1 slots stay loading or loaded
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            const long tp = t - gridDim.x + (long)STAGES * gridDim.x;
            if (it > 0 && tp < ntiles) issue(tp, (int)((it - 1) % STAGES));
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct gemm_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
static const size_t WS = 64 << 20;

// row-major C[M,N] = A[M,K] B[N,K]^T; sms > 0: the heuristic told to plan for that many SMs
static int plan_gemm(cublasLtHandle_t lt, gemm_plan *p, int M, int N, int K, int sms) {
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    if (sms > 0) LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
    LK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
    LK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, M, K));
    LK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    cublasLtMatmulHeuristicResult_t h;
    int got = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &got));
    cublasLtMatmulPreferenceDestroy(pref);
    if (!got) {
        fprintf(stderr, "sm_partition: no cuBLASLt algorithm\n");
        return 1;
    }
    p->algo = h.algo;
    return 0;
}

int main(int argc, char **argv) {
    const long n = (argc > 1 ? atol(argv[1]) : 1024) << 20; // stream elements (default 1 Gi: 28 GiB touched a pass)
    const int M = 16384, N = 8192, K = 2048, NG = 30;
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    void *ws;
    bf16 *A, *B, *C, *g, *wb;
    float *m, *v, *w;
    CK(cudaMalloc(&ws, WS));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&B, (size_t)N * K * 2));
    CK(cudaMalloc(&C, (size_t)M * N * 2));
    CK(cudaMemset(A, 0x3c, (size_t)M * K * 2));
    CK(cudaMemset(B, 0x3c, (size_t)N * K * 2));
    CK(cudaMalloc(&g, n * 2));
    CK(cudaMalloc(&wb, n * 2));
    CK(cudaMalloc(&m, n * 4));
    CK(cudaMalloc(&v, n * 4));
    CK(cudaMalloc(&w, n * 4));
    CK(cudaMemset(g, 0, n * 2));
    CK(cudaMemset(m, 0, n * 4));
    CK(cudaMemset(v, 0, n * 4));
    CK(cudaMemset(w, 0, n * 4));
    cudaStream_t s1, s2;
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, lo));
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    const double gbytes = 28.0 * n / 1e9, gflop = 2.0 * M * N * K / 1e9;
    float ms;
    const size_t bulk_smem = 6 * SLOT + 64;
    CK(cudaFuncSetAttribute(stream_bulk<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bulk_smem));
    int occ_plain, occ_bulk;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_plain, stream_plain, 256, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_bulk, stream_bulk<6>, 256, bulk_smem));

    printf("# the stream alone, all %d SMs (%.1f GB a pass)\n", nsm, gbytes);
    for (int round = 0; round < 2; round++) {
        CK(cudaEventRecord(e0, s1));
        CK(cudaMemcpyAsync(m, w, n * 4, cudaMemcpyDeviceToDevice, s1));
        CK(cudaMemcpyAsync(v, w, n * 4, cudaMemcpyDeviceToDevice, s1));
        CK(cudaMemcpyAsync(w, m, n * 4, cudaMemcpyDeviceToDevice, s1));
        CK(cudaMemcpyAsync(wb, g, n * 2, cudaMemcpyDeviceToDevice, s1));
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double copy = ms;
        CK(cudaEventRecord(e0, s1));
        stream_plain<<<nsm * occ_plain, 256, 0, s1>>>(g, m, v, w, wb, n / 8);
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double plain = ms;
        CK(cudaEventRecord(e0, s1));
        stream_bulk<6><<<nsm * occ_bulk, 256, bulk_smem, s1>>>(g, m, v, w, wb, n / TE);
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("round %d: device copy %.0f GB/s, plain loads %.0f GB/s, TMA bulk %.0f GB/s\n", round,
               gbytes / copy * 1e3, gbytes / plain * 1e3, gbytes / ms * 1e3);
    }

    gemm_plan full;
    if (plan_gemm(lt, &full, M, N, K, 0)) return 1;
    const float al = 1, be = 0;
    for (int i = 0; i < 3; i++)
        LK(cublasLtMatmul(lt, full.op, &al, B, full.la, A, full.lb, &be, C, full.lc, C, full.lc, &full.algo, ws, WS,
                          s1));
    CK(cudaEventRecord(e0, s1));
    for (int i = 0; i < NG; i++)
        LK(cublasLtMatmul(lt, full.op, &al, B, full.la, A, full.lb, &be, C, full.lc, C, full.lc, &full.algo, ws, WS,
                          s1));
    CK(cudaEventRecord(e1, s1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double tg_full = ms / NG;
    CK(cudaEventRecord(e0, s2));
    stream_bulk<6><<<nsm * occ_bulk, 256, bulk_smem, s2>>>(g, m, v, w, wb, n / TE);
    CK(cudaEventRecord(e1, s2));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double ts_full = ms;
    printf("# GEMM %dx%dx%d on all SMs: %.3f ms (%.0f TFLOP/s)\n", M, N, K, tg_full, gflop / tg_full);
    printf("# the stream (TMA bulk) on k blocks, the GEMM planned for the other SMs; together on two streams\n");
    printf("%4s %10s %10s %12s %12s %12s %12s %9s\n", "k", "GEMM ms", "x all-SM", "stream GB/s", "both: GEMMs",
           "both: stream", "serial ms", "saved ms");
    const int ks[] = {8, 16, 24, 32, 48, 64};
    for (int ki = 0; ki < (int)(sizeof ks / sizeof *ks); ki++) {
        const int k = ks[ki];
        gemm_plan p;
        if (plan_gemm(lt, &p, M, N, K, nsm - k)) return 1;
        for (int i = 0; i < 3; i++)
            LK(cublasLtMatmul(lt, p.op, &al, B, p.la, A, p.lb, &be, C, p.lc, C, p.lc, &p.algo, ws, WS, s1));
        CK(cudaEventRecord(e0, s1));
        for (int i = 0; i < NG; i++)
            LK(cublasLtMatmul(lt, p.op, &al, B, p.la, A, p.lb, &be, C, p.lc, C, p.lc, &p.algo, ws, WS, s1));
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double tg = ms / NG;
        CK(cudaEventRecord(e0, s2));
        stream_bulk<6><<<k, 256, bulk_smem, s2>>>(g, m, v, w, wb, n / TE);
        CK(cudaEventRecord(e1, s2));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double ts = ms;
        int ng = (int)(ts / tg) + 1;
        ng = ng > 300 ? 300 : ng;
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0, s1));
        CK(cudaStreamWaitEvent(s2, e0, 0));
        stream_bulk<6><<<k, 256, bulk_smem, s2>>>(g, m, v, w, wb, n / TE);
        CK(cudaEventRecord(e2, s2));
        for (int i = 0; i < ng; i++)
            LK(cublasLtMatmul(lt, p.op, &al, B, p.la, A, p.lb, &be, C, p.lc, C, p.lc, &p.algo, ws, WS, s1));
        CK(cudaEventRecord(e1, s1));
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        float msg, mss;
        CK(cudaEventElapsedTime(&msg, e0, e1));
        CK(cudaEventElapsedTime(&mss, e0, e2));
        const double serial = ng * tg_full + ts_full, both = msg > mss ? msg : mss;
        printf("%4d %10.3f %10.2f %12.0f %9.2f ms %9.0f GB/s %12.2f %9.2f\n", k, tg, tg / tg_full, gbytes / ts * 1e3,
               msg, gbytes / mss * 1e3, serial, serial - both);
        cublasLtMatmulDescDestroy(p.op);
    }
    return 0;
}
