/* The ZAYA causal language model (HF transformers' ZayaForCausalLM semantics) on the CPU.
 *
 * A model owns one contiguous f32 buffer of parameters (and, on demand, one of gradients),
 * laid out in the order of kiln_zaya_params(); the HF parameter names are kept so that
 * checkpoints, gradients and error messages speak the reference's language. The router's
 * balancing biases are a buffer, not a parameter: loaded and saved, never differentiated.
 */
#ifndef KILN_ZAYA_H
#define KILN_ZAYA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#define KILN_ZAYA_MAX_LAYERS 1024

typedef enum { KILN_LAYER_HYBRID = 0, KILN_LAYER_HYBRID_SLIDING = 1 } kiln_zaya_layer_type;

typedef struct {
    int64_t vocab_size, hidden_size, num_layers;
    int64_t num_heads, num_kv_heads, head_dim;
    int64_t num_experts, top_k, moe_intermediate, router_hidden;
    int64_t cca_time0, cca_time1;
    int64_t sliding_window;      /* 0: none */
    double rms_norm_eps;
    int tie_word_embeddings, attention_bias, lm_head_bias;
    int64_t pad_token_id;        /* -1: none */
    int64_t bos_token_id, eos_token_id; /* -1: none */
    double initializer_range;
    double rope_theta[2], partial_rotary[2]; /* per layer type */
    uint8_t layer_types[KILN_ZAYA_MAX_LAYERS];
    int model_type_required; /* parsing: "model_type" must be present (HF config.json) */
} kiln_zaya_config;

/* HF ZayaConfig defaults (ZAYA1-8B shape). */
void kiln_zaya_config_default(kiln_zaya_config *c);
/* Read config.json (HF layout). Unknown keys are ignored (HF writes many generic ones);
 * known keys with the wrong type, and invalid combinations, are errors naming the field. */
kiln_error *kiln_zaya_config_load(const char *path, kiln_zaya_config *c);
kiln_error *kiln_zaya_config_parse(const char *json_text, const char *ctx, kiln_zaya_config *c);
kiln_error *kiln_zaya_config_validate(const kiln_zaya_config *c, const char *ctx);
/* Overlay the fields of a parsed JSON object on c (as config.json does); for embedding a model
 * section in other configs. kiln_zaya_config_known_key says whether a key is one it reads. */
struct cJSON;
kiln_error *kiln_zaya_config_from_json(const struct cJSON *obj, const char *ctx, kiln_zaya_config *c);
int kiln_zaya_config_known_key(const char *key);
/* The config as the JSON object config.json holds (NULL when out of memory). */
struct cJSON *kiln_zaya_config_to_cjson(const kiln_zaya_config *c);
/* Write config.json that transformers loads as ZayaConfig (atomic). */
kiln_error *kiln_zaya_config_save(const kiln_zaya_config *c, const char *path);

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    int64_t numel;
    size_t offset; /* in floats, into kiln_zaya.w / .g */
} kiln_param_info;

/* Pointers into a parameter (or gradient) buffer, one set per layer. */
typedef struct {
    float *ln1, *ln2;
    float *attn_hs, *attn_hb, *attn_rs, *attn_rb; /* post_attention_residual_scale */
    float *mlp_hs, *mlp_hb, *mlp_rs, *mlp_rb;     /* post_mlp_residual_scale */
    float *wq, *bq, *wk, *bk, *wvc, *bvc, *wvd, *bvd, *wo, *bo;
    float *conv0_w, *conv0_b, *conv1_w, *conv1_b, *temp;
    float *r_down_w, *r_down_b, *r_state_scale; /* r_state_scale NULL on layer 0 */
    float *r_norm, *r_fc1_w, *r_fc1_b, *r_fc2_w, *r_fc2_b, *r_out_w;
    float *gate_up, *down; /* [E, 2I, H], [E, H, I] */
} kiln_zaya_layer_ptrs;

typedef struct {
    float *embed, *in_scale, *in_bias, *norm, *lm_head_w, *lm_head_b;
    kiln_zaya_layer_ptrs *layers;
} kiln_zaya_ptrs;

typedef struct kiln_zaya_acts kiln_zaya_acts;
typedef struct kiln_zaya_cache kiln_zaya_cache;

typedef struct {
    kiln_zaya_config cfg;
    int nparams;
    kiln_param_info *params;
    size_t numel;          /* total parameter count */
    float *w, *g;          /* parameters; gradients (NULL until kiln_zaya_grads_enable) */
    float *balancing;      /* [layers, E+1] */
    kiln_zaya_ptrs W, G;
    float *inv_freq[2];    /* per layer type */
    int64_t rot_dim[2];
} kiln_zaya;

kiln_error *kiln_zaya_create(const kiln_zaya_config *cfg, kiln_zaya **out);
void kiln_zaya_free(kiln_zaya *m);
/* HF's initialisation: normal(0, initializer_range) matrices, ones/zeros for norms, scales, biases. */
void kiln_zaya_init_random(kiln_zaya *m, uint64_t seed);
kiln_error *kiln_zaya_grads_enable(kiln_zaya *m); /* allocates and zeroes m->g */
void kiln_zaya_grads_zero(kiln_zaya *m);
const kiln_param_info *kiln_zaya_find_param(const kiln_zaya *m, const char *name);

/* Load a HF ZAYA directory: config.json + model.safetensors or a sharded index; F32/BF16/F16. */
kiln_error *kiln_zaya_load_dir(const char *dir, kiln_zaya **out);
/* Save as a HF directory (config.json + model.safetensors, F32), atomically per file. */
kiln_error *kiln_zaya_save_dir(const kiln_zaya *m, const char *dir);

/* Check token ids: 0 <= id < vocab; the error names the first bad position. */
kiln_error *kiln_zaya_check_ids(const kiln_zaya *m, const int64_t *ids, int64_t n);

/* Activations saved by a forward pass over B sequences of T tokens, for backward. */
kiln_error *kiln_zaya_acts_create(const kiln_zaya *m, int64_t B, int64_t T, kiln_zaya_acts **out);
/* The same; for_backward = 0 leaves out the attention probabilities (B*heads*T*T floats a layer),
 * for forward-only use. */
kiln_error *kiln_zaya_acts_create_ex(const kiln_zaya *m, int64_t B, int64_t T, int for_backward,
                                     kiln_zaya_acts **out);
void kiln_zaya_acts_free(kiln_zaya_acts *a);

/* Forward over ids [B,T] (the acts' shape). logits [B,T,V] (nullable: then not stored beyond
 * the acts). Returns the mean next-token loss in *loss (nullable). */
kiln_error *kiln_zaya_forward(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids, float *logits, double *loss);
/* Add the last forward's routing decisions to counts [layers, E+1] (last column: skip). */
void kiln_zaya_route_counts(const kiln_zaya *m, const kiln_zaya_acts *a, int64_t *counts);
/* The logits [B,T,V] of the last forward. */
const float *kiln_zaya_acts_logits(const kiln_zaya_acts *a);
/* Backward of the mean next-token loss of the last forward: accumulates into m->g. */
kiln_error *kiln_zaya_backward(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids);


/* Decoding with a cache of K/V, the CCA convolution history and the delayed-value state. */
kiln_error *kiln_zaya_cache_create(const kiln_zaya *m, int64_t B, int64_t capacity, kiln_zaya_cache **out);
void kiln_zaya_cache_free(kiln_zaya_cache *c);
int64_t kiln_zaya_cache_pos(const kiln_zaya_cache *c);
/* Feed T more tokens per sequence (ids [B,T]); logits [B,T,V] for them. */
kiln_error *kiln_zaya_decode(kiln_zaya *m, kiln_zaya_cache *c, const int64_t *ids, int64_t T, float *logits);

#endif
