/* kiln bench attention and moe: FLOP counts, the balanced routing, and the memory estimates,
 * exposed for tests/test_bench_kernels.c. Conventions in docs/bench-profile.md. */
#ifndef KILN_BENCH_KERNEL_FORMULAS_H
#define KILN_BENCH_KERNEL_FORMULAS_H

#include <stdint.h>

/* ---- attention (src/bench/attention.c) ---- */

/* Visible (query, key) pairs of one causal sequence of T tokens: key s is visible from query p iff
 * s <= p and (window == 0 or s > p - window). window 0 or >= T: T(T+1)/2; else
 * W(W+1)/2 + (T-W)W. */
double kiln_attn_pairs(int64_t T, int64_t window);
/* Forward FLOPs: QK^T and PV, 2 multiply-adds per visible pair and channel each:
 * 4 * B * H * D * pairs(T, window) (causal, no window: 4*B*H*D*T(T+1)/2). Softmax not counted. */
double kiln_attn_flops_fwd(int64_t B, int64_t H, int64_t D, int64_t T, int64_t window);
/* FlashAttention's convention: backward = 2.5 x forward (dV, dP, dQ, dK and the recomputed QK^T),
 * forward + backward = 3.5 x forward. */
#define KILN_ATTN_BWD_FACTOR 2.5
#define KILN_ATTN_FWD_BWD_FACTOR 3.5
double kiln_attn_flops_fwd_bwd(int64_t B, int64_t H, int64_t D, int64_t T, int64_t window);
/* Bytes the benchmark allocates for one shape: q, out, dq, dout [B,T,H,D]; k, v, dk, dv [B,T,KV,D];
 * the saved probabilities [B,H,T,T]; all f32. */
double kiln_attn_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

/* ---- moe (src/bench/moe.c) ---- */

/* Forward FLOPs of the experts over tokens*top_k routed slots: gate_up [hidden -> 2*inter] is
 * 2*hidden*2*inter per slot, down [inter -> hidden] 2*inter*hidden: 6*tokens*top_k*hidden*inter.
 * Backward: dX and dW of both linears, each as many FLOPs as the forward GEMM: 2x forward.
 * Forward + backward: 18*tokens*top_k*hidden*inter. SwiGLU, gather and scatter not counted. */
double kiln_moe_flops_fwd(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter);
double kiln_moe_flops_fwd_bwd(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter);
/* Balanced random routing from `seed`: slot (n, j) of token n goes to
 * expert perm_e[(perm_t[n]*top_k + j) mod experts] with random permutations perm_t of the tokens and
 * perm_e of the experts. Every expert gets floor or ceil of tokens*top_k/experts slots and a token's
 * top_k experts are distinct (needs 1 <= top_k <= experts). choice is [tokens*top_k]. Returns -1 on
 * bad arguments or out of memory. */
int kiln_moe_route(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, uint64_t seed);
/* Skewed random routing from `seed` (src/bench/moe_gpu.c): each slot picks expert perm_e[r] with
 * probability proportional to 1/(r+1) (Zipf over a random ranking of the experts), a token's top_k
 * experts distinct. Returns -1 on bad arguments or out of memory. */
int kiln_moe_route_skewed(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, uint64_t seed);
/* Concentrated random routing from `seed` (src/bench/moe_gpu.c): one random expert gets each slot with
 * probability `share`, the others uniformly the rest, a token's top_k experts distinct. Returns -1 on bad
 * arguments. */
int kiln_moe_route_concentrated(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, double share,
                                uint64_t seed);
/* Bytes the benchmark allocates for one shape: weights and their gradients
 * (experts * 3 * hidden * inter, twice), token activations x, out, dout, dx [tokens, hidden], slot
 * activations xe, ye, dye, dxe [S, hidden], gu, dgu [S, 2*inter], act, dact [S, inter] with
 * S = tokens*top_k; f32, plus the routing tables. */
double kiln_moe_bytes(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k);

#endif
