/* kiln size: hardware-aware sizing of ZAYA-style MoE and dense transformers.
 *
 * Three layers, one file each under src/sizing/:
 *  - shape.c    a model shape (ZAYA or dense) and its exact parameter counts (the same walk as
 *               kiln's parameter table, so counts equal what kiln allocates);
 *  - cost.c     FLOPs per token, memory per GPU (ZeRO-1), KV cache;
 *  - hw.c       hardware profiles (built-in JSON under data/profiles/, files, and `kiln bench`
 *               measurements merged in) and the time of a GEMM / attention / collective on them;
 *  - predict.c  step time, throughput and inference latency of one shape on one profile;
 *  - search.c   candidate shapes for a parameter budget, ranked, with the rules and evidence.
 * Conventions are in docs/sizing.md. */
#ifndef KILN_SIZING_H
#define KILN_SIZING_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "kiln/error.h"
#include "kiln/zaya.h"

/* ---------------- shapes and parameter counts (shape.c) ---------------- */

typedef enum { KILN_ARCH_ZAYA = 0, KILN_ARCH_DENSE = 1 } kiln_size_arch;

typedef struct {
    kiln_size_arch arch;
    int64_t vocab, hidden, layers;
    int64_t heads, kv_heads, head_dim;
    /* ZAYA: MoE block and CCA */
    int64_t experts, top_k, expert_inter, router_hidden, cca_time0, cca_time1;
    /* dense: SwiGLU width */
    int64_t ffn;
    int64_t sliding_window, sliding_layers; /* layers with a window (0: none) */
    int tied, attention_bias, lm_head_bias;
} kiln_size_shape;

/* Defaults of a candidate ZAYA shape (ZAYA1-8B's: router 256, CCA kernels 2/2, tied). */
void kiln_size_shape_zaya_default(kiln_size_shape *s);
void kiln_size_shape_from_zaya(const kiln_zaya_config *c, kiln_size_shape *s);
/* A ZAYA config of this shape (arch must be ZAYA); other fields take HF defaults. */
kiln_error *kiln_size_shape_to_zaya(const kiln_size_shape *s, kiln_zaya_config *c);
kiln_error *kiln_size_shape_validate(const kiln_size_shape *s);
/* One-line description: "zaya h2048 L40 q8x128 kv2 E16 k1 I2048 V262272". */
void kiln_size_shape_str(const kiln_size_shape *s, char *buf, size_t cap);

typedef struct {
    int64_t total, active;         /* all parameters; those one token uses (top_k experts) */
    int64_t embedding;             /* the embedding table, plus an untied lm_head and its bias */
    int64_t total_nonembed, active_nonembed;
    int64_t experts_total;         /* expert weights, all experts */
    int64_t muon, adamw;           /* with Muon on: the optimizer split of src/train/optim.c */
    int64_t attn_per_layer, router_per_layer, expert_one, mlp_dense_per_layer; /* per layer */
} kiln_size_params;

void kiln_size_count(const kiln_size_shape *s, kiln_size_params *p);

/* ---------------- FLOPs and memory (cost.c) ---------------- */

/* Mean keys visible to a query over a sequence of T with window W (0: none): causal masking. */
double kiln_size_visible_keys(int64_t T, int64_t W);

typedef struct {
    double gemm;      /* forward GEMM FLOPs per token (linear layers incl. lm_head, active experts) */
    double attn;      /* forward attention FLOPs per token (QK^T and PV over visible keys) */
    double conv;      /* forward CCA convolution FLOPs per token */
    double fwd;       /* gemm + attn + conv */
    double bwd;       /* 2x GEMMs and convs, 2.5x attention (FlashAttention's recomputing backward) */
    double recompute; /* one more forward when activations are recomputed, else 0 */
    double train;     /* fwd + bwd + recompute */
} kiln_size_flops;

void kiln_size_flops_per_token(const kiln_size_shape *s, int64_t seq, int recompute, kiln_size_flops *f);

typedef struct {
    int64_t gpus;        /* data-parallel degree G (ZeRO-1) */
    int64_t micro_batch; /* sequences per GPU per micro-batch */
    int64_t seq;
    int muon;            /* Muon for hidden matrices (1 momentum) else AdamW everywhere (2 states) */
    int recompute;       /* full activation recomputation: keep only each layer's input */
    int weight_bytes;    /* 2: bf16 weights with an fp32 master copy sharded by ZeRO-1; 4: fp32 weights, no master */
    int grad_bytes;      /* 4: fp32 gradients (kiln's flat buffer), 2: bf16 */
    int ns_precision;    /* Muon's Newton-Schulz GEMMs on the GPU: 0 fp32, 1 tf32, 2 bf16 (kiln_ns_precision; default 2) */
} kiln_size_train;

typedef struct {
    double weights, grads, master, optim, activations, logits, total; /* bytes per GPU */
} kiln_size_memory;

void kiln_size_train_default(kiln_size_train *t);
void kiln_size_memory_train(const kiln_size_shape *s, const kiln_size_train *t, kiln_size_memory *m);

typedef struct {
    double kv;          /* K and V caches (CCA: the compressed KV heads), bytes */
    double conv_state;  /* the last (k0-1)+(k1-1) convolution inputs per layer, bytes */
    double vprev;       /* the last delayed-value projection per layer, bytes */
    double total;
} kiln_size_kv;

/* What kiln's decoder keeps for `batch` sequences of `capacity` positions, elements of `bytes`. */
void kiln_size_kv_cache(const kiln_size_shape *s, int64_t batch, int64_t capacity, double bytes, kiln_size_kv *k);

/* ---------------- hardware profiles (hw.c) ---------------- */

#define KILN_HW_MAX_POINTS 512

typedef struct { int64_t m, n, k; double tflops; } kiln_hw_gemm_point;
typedef struct { int64_t head_dim; double fwd_eff, bwd_eff; } kiln_hw_attn_point;
/* hosts: how many hosts the ranks ran on (kiln bench comm's records say; 0 when unknown: then a record over more
 * ranks than gpus_per_node is taken to cross nodes) */
typedef struct { int64_t bytes; double busbw_gbs; int64_t ranks, hosts; } kiln_hw_comm_point;

/* Timed kernels of kiln's own (kiln bench attention / moe --device cuda, the membw copy sweep) and, for op
 * classes no kiln bench times, how their measured time in a calibration run of `kiln train --device cuda`
 * compares with the model's (bench/size_validate.sh). */
typedef struct { int64_t batch, seq, heads, kv_heads, head_dim, window; double fwd_us, bwd_us; } kiln_hw_attn_timed;
typedef struct { int64_t tokens, hidden, inter, experts, top_k; double fwd_us, bwd_us; } kiln_hw_moe_timed;
typedef struct { double bytes, gbs; } kiln_hw_bw_point;     /* bytes moved by one kernel (read + written) */
/* measured time / the model's time of one op class, or of a group of them (kiln_size_op_group), on a
 * calibration shape (kernel_rates) */
typedef struct { char cls[48]; double scale; } kiln_hw_rate;

typedef struct {
    char name[64], device[128], source[256], notes[512];
    int64_t sm_count, tile_m, tile_n, head_dim_tile, gpus_per_node;
    double peak_bf16, peak_fp8, peak_fp32;  /* TFLOP/s, dense */
    double gemm_efficiency;                 /* large-GEMM fraction of peak when no GEMM is measured */
    double mem_gib, mem_peak_gbs, mem_gbs;  /* capacity; datasheet and achieved bandwidth (GB/s) */
    double intra_busbw_gbs, inter_busbw_gbs, comm_latency_us;
    char compute_source[256], memory_source[256], interconnect_source[256], gemm_source[256],
        attention_source[256];
    int ngemm, nattn, nrs, nag;
    kiln_hw_gemm_point gemm[KILN_HW_MAX_POINTS];
    kiln_hw_attn_point attn[64];
    kiln_hw_comm_point rs[KILN_HW_MAX_POINTS], ag[KILN_HW_MAX_POINTS]; /* reduce-scatter, all-gather */
    /* optional measured tables (sections attention_timed, moe_timed, membw_sweep, kernel_rates) */
    double runtime_gib; /* memory.runtime_gib: what the CUDA runtime itself holds (context, cuBLAS workspaces) */
    char timed_source[256];
    int nattn_t, nmoe_t, nbw, nrate;
    kiln_hw_attn_timed attn_t[64];
    kiln_hw_moe_timed moe_t[64];
    kiln_hw_bw_point bw[64];
    kiln_hw_rate rate[32];
} kiln_hw_profile;

/* Names of the built-in profiles (NULL-terminated): data/profiles/<name>.json compiled in. */
const char *const *kiln_hw_builtin_names(void);
/* A built-in name, or a path to a profile JSON ({"kiln_hw_profile": 1, ...}). */
kiln_error *kiln_hw_profile_load(const char *name_or_path, kiln_hw_profile *p);
kiln_error *kiln_hw_profile_parse(const char *text, const char *ctx, kiln_hw_profile *p);
/* Add the measurements of a `kiln bench` profile (sections gemm bf16, comm reduce_scatter /
 * all_gather, membw on the GPU, attention): they replace the profile's tables of the same kind. */
kiln_error *kiln_hw_profile_merge_bench(kiln_hw_profile *p, const char *path);

/* How a GEMM time was predicted, for --explain and evidence. */
typedef struct {
    int64_t tile_m, tile_n;                    /* the tile chosen for this shape */
    double tile_eff;                           /* its efficiency relative to the profile's tile */
    double tiles, waves, tile_util, wave_util; /* tile and wave quantization */
    double base_eff;                           /* measured (interpolated) efficiency before quantization */
    double tflops;                             /* predicted achieved rate */
    int memory_bound;
} kiln_hw_gemm_why;

/* Seconds for C[M,N] = A[M,K] B[K,N] in bf16 (why nullable). */
double kiln_hw_gemm_time(const kiln_hw_profile *p, int64_t m, int64_t n, int64_t k, kiln_hw_gemm_why *why);
/* `groups` independent GEMMs of one shape in one launch (the experts' grouped GEMM): their tiles
 * share the waves. */
double kiln_hw_gemm_time_grouped(const kiln_hw_profile *p, double groups, int64_t m, int64_t n, int64_t k,
                                 kiln_hw_gemm_why *why);
/* Efficiency of the attention kernel at head dim D (pass 0 forward, 1 backward), including the
 * head-dim tile padding. */
double kiln_hw_attn_eff(const kiln_hw_profile *p, int64_t head_dim, int backward);
/* Seconds for a reduce-scatter (0) or all-gather (1) of `bytes` (the full buffer) over g ranks. Measured comm
 * records count only for jobs on their side of the node boundary (gpus_per_node): a measurement inside one
 * node does not stand for a job across nodes, nor the reverse; otherwise the intra-/inter-node figure. */
double kiln_hw_comm_time(const kiln_hw_profile *p, int all_gather, double bytes, int64_t g);
/* Where kiln_hw_comm_time's bus bandwidth for g GPUs comes from, in words (--explain); returns whether from
 * measured records. */
int kiln_hw_comm_source(const kiln_hw_profile *p, int64_t g, char *buf, size_t n);

/* ---------------- predictions (predict.c) ---------------- */

typedef struct {
    int64_t seq;            /* training sequence length and inference context */
    int64_t tokens_per_step;
    kiln_size_train train;
} kiln_size_setup;

void kiln_size_setup_default(kiln_size_setup *u);
/* The tokens of one optimizer step as predicted: a whole number of micro-batches on every GPU, at least
 * tokens_per_step (more where gpus x micro_batch x seq does not divide it: with --gpus 2048 at micro-batch 1 x
 * 4096, 8388608 for the default 4194304). *micro_batches (nullable): the micro-batches per step (grad_accum). */
int64_t kiln_size_step_tokens(const kiln_size_setup *u, int64_t *micro_batches);

typedef struct {
    kiln_size_params params;
    kiln_size_flops flops;
    kiln_size_memory mem;
    int64_t grad_accum;
    double t_gemm, t_attn, t_mem, t_micro; /* seconds per micro-batch: GEMMs, attention, memory-bound ops */
    double t_optim, t_comm, t_step;        /* seconds per optimizer step */
    double tokens_per_s;                   /* per GPU */
    double mfu;                            /* model FLOPs (6N + attention) / peak */
    double t_expert_gemm, expert_tflops, attn_tflops;
    double prefill_tokens_per_s;           /* batch 1, a prompt of seq tokens */
    double decode_ms_b1, decode_ms_b64;    /* per step (one token per sequence), cache of seq tokens */
    double kv_gib_b64;                     /* KV cache of 64 sequences of seq tokens, bf16 */
    int fits;                              /* training memory fits the device */
} kiln_size_pred;

kiln_error *kiln_size_predict(const kiln_size_shape *s, const kiln_hw_profile *p, const kiln_size_setup *u,
                              kiln_size_pred *r);

/* ---------------- kiln's CUDA trainer (trainer_mem.c, step_cuda.c) ---------------- */

/* What `kiln train --device cuda` allocates on one GPU, in the categories of its memory report, from the
 * shape alone: the parameter table's tensors padded to 64 elements (src/models/zaya_cuda.c), the
 * activation arena and backward scratch laid out as zaya_cuda.c lays them out (256-byte pieces). */
typedef struct {
    int64_t numel_padded;  /* the device parameter layout */
    double params;         /* f32 master + bf16 copy + balancing biases */
    double grads;          /* f32, the padded layout */
    double optim;          /* this rank's optimizer state (AdamW m, v; Muon momentum), f32 */
    double muon_work;      /* Muon's update buffer (the largest Muon tensor), not in the report */
    double activations;    /* the arena for (micro-batch, seq) */
    double scratch;        /* the backward scratch */
    double pool;           /* the ops' stream-ordered temporaries: cuDNN's attention backward workspace */
    double runtime;        /* the profile's memory.runtime_gib: CUDA context, cuBLAS workspaces */
    double total;          /* the device's peak in use */
} kiln_size_cuda_memory;

/* ZAYA shapes only (the CUDA trainer trains ZAYA). runtime_bytes: the profile's runtime figure. */
kiln_error *kiln_size_cuda_memory_train(const kiln_size_shape *s, const kiln_size_train *t, double runtime_bytes,
                                        kiln_size_cuda_memory *m);
/* cuDNN's attention backward workspace as the trainer would allocate it for this shape (from the
 * environment the trainer reads: KILN_ATTENTION, KILN_CUDNN_WORKSPACE_MB); 0 when kiln's kernels run. */
double kiln_size_cuda_attention_workspace(const kiln_size_shape *s, int64_t batch, int64_t seq);
/* The arena and scratch bytes alone (exposed for tests). */
void kiln_size_cuda_arena(const kiln_size_shape *s, int64_t batch, int64_t seq, int recompute, double *arena,
                          double *scratch);

/* One op class of the trainer's per-op profile (KILN_CUDA_PROFILE=1), with the same name. */
#define KILN_SIZE_MAX_CLASSES 24
typedef struct {
    char cls[48];
    char group[32]; /* GEMMs, attention, experts, CCA convolutions, memory-bound ops, optimizer, outside */
    double ms;      /* predicted per optimizer step (all micro-batches) */
    double work;    /* FLOPs or bytes per step, as the model counts them */
    int bytes;      /* work is bytes (memory-bound) rather than FLOPs */
    char how[96];   /* which table it came from */
} kiln_size_op_class;

typedef struct {
    int n;
    kiln_size_op_class c[KILN_SIZE_MAX_CLASSES];
    double ms_ops;   /* sum of the classes */
    double ms_step;  /* + ZeRO-1 collectives */
    double tokens_per_s;
    int64_t grad_accum;
} kiln_size_cuda_step;

/* The step of `kiln train --device cuda` by op class: GEMMs from the profile's GEMM table (exact shapes
 * first), attention and experts from its timed kernels (else the efficiency model), memory-bound ops as
 * bytes over the membw sweep's bandwidth at that size; a class with a calibration scale (kernel_rates)
 * is the model's time times that scale. */
kiln_error *kiln_size_cuda_step_predict(const kiln_size_shape *s, const kiln_hw_profile *p, const kiln_size_setup *u,
                                        kiln_size_cuda_step *r);

/* The group of an op class of the trainer's profile, by its name (also for classes the model does not
 * have, e.g. a fused kernel's new class): "GEMMs", "attention", "experts", "CCA convolutions", "optimizer"
 * (with the gradient norm and the bf16 weight copy), "outside the profiled ops" or "memory-bound ops". */
const char *kiln_size_op_group(const char *cls);

/* The prediction as `kiln size predict` prints it (the trainer's report's wording) and as JSON. */
void kiln_size_cuda_print(FILE *f, const kiln_size_cuda_step *st, const kiln_size_cuda_memory *m);
cJSON *kiln_size_cuda_json(const kiln_size_cuda_step *st, const kiln_size_cuda_memory *m);

/* ---------------- search (search.c) ---------------- */

typedef enum { KILN_RANK_BALANCED = 0, KILN_RANK_TRAIN = 1, KILN_RANK_DECODE = 2 } kiln_size_rank_by;

#define KILN_SIZE_MAX_LIST 32
typedef struct { int n; int64_t v[KILN_SIZE_MAX_LIST]; } kiln_size_list;

typedef struct {
    double total, active;   /* non-embedding parameter budget (dense: active = total) */
    double tolerance;       /* relative, on both */
    int64_t vocab;          /* padded up to a multiple of 128 */
    kiln_size_arch arch;
    kiln_size_shape base;   /* fields not enumerated (router width, CCA kernels, tying, biases, windows) */
    kiln_size_setup setup;
    kiln_size_rank_by rank_by;
    double min_aspect, max_aspect; /* hidden / layers band */
    /* the values enumerated; cca: query compression hidden/(heads*head_dim); widths: expert width
     * (ZAYA) or SwiGLU width (dense; empty: 8/3, 3, 3.5 and 4 x hidden rounded up to 256) */
    kiln_size_list hiddens, head_dims, cca, kv_heads, experts, top_k, widths;
} kiln_size_budget;

void kiln_size_budget_default(kiln_size_budget *b, kiln_size_arch arch);
/* "64,96,128" into a list; errors name the flag. */
kiln_error *kiln_size_parse_list(const char *flag, const char *s, kiln_size_list *l);

typedef struct {
    kiln_size_shape shape;
    kiln_size_pred pred;
    double score; /* lower is better; 1 = the best of every criterion */
    char why[6][400]; /* the rule and evidence behind each choice */
    int nwhy;
} kiln_size_candidate;

typedef struct {
    kiln_size_candidate *c; /* ranked, best first */
    int64_t n;
    int64_t enumerated, rejected_budget, rejected_aspect, rejected_memory;
    int64_t vocab; /* padded */
} kiln_size_result;

kiln_error *kiln_size_search(const kiln_size_budget *b, const kiln_hw_profile *p, kiln_size_result *r);
void kiln_size_result_free(kiln_size_result *r);
/* Rank of a shape among the result (0-based), -1 when it is not a candidate. */
int64_t kiln_size_find(const kiln_size_result *r, const kiln_size_shape *s);
/* Fill c->why with the rules and the measured evidence for the candidate's choices. */
void kiln_size_explain_candidate(const kiln_hw_profile *p, const kiln_size_budget *b, kiln_size_candidate *c);
/* The rules (--explain). */
void kiln_size_print_rules(FILE *f, const kiln_hw_profile *p, const kiln_size_budget *b);

/* A self-contained HTML page (html.c): a scatter of every candidate, the leaders' micro-batch time by
 * kind of work, the ranked table with the evidence; ref is the reference's rank or -1. Atomic. */
kiln_error *kiln_size_write_html(const char *path, const kiln_hw_profile *p, const kiln_size_budget *b,
                                 const kiln_size_result *r, int top, int64_t ref);

/* JSON for tools (cost.c/predict.c numbers of one candidate). */
cJSON *kiln_size_candidate_json(const kiln_size_candidate *c);
cJSON *kiln_size_profile_json(const kiln_hw_profile *p);

/* "8.3B", "760M", "1.5e9", "12000" -> count; errors name the flag. */
kiln_error *kiln_size_parse_count(const char *flag, const char *s, double *out);

#endif
