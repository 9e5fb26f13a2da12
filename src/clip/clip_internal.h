/* Internals of src/clip: the model struct shared by its files.
 *
 *   clip_config.c      config.json (text/vision towers) and preprocessor_config.json
 *   clip_model.c       loading a HF CLIPModel directory: weights (F32/F16/BF16) with shape checks
 *   clip_forward.c     the encoder layer and both towers; embed_texts / embed_images
 *   clip_preprocess.c  CLIPImageProcessor: shortest-side bicubic resize, center crop, rescale, normalize
 *   clip_cuda.c        the vision tower on the GPU (kiln_clip_set_device "cuda")
 *   clip_text.c        CLIP's text ids: tokenizer.json encode, truncation, <|startoftext|> ... <|endoftext|>
 *   clip_id.c          the model's identity (kiln_clip_id), hashed as the loader reads the weights
 */
#ifndef KILN_CLIP_INTERNAL_H
#define KILN_CLIP_INTERNAL_H

#include <stdint.h>

#include "kiln/clip.h"
#include "kiln/safetensors.h"
#include "kiln/tokenizer.h"

enum { CLIP_ACT_QUICK_GELU = 1, CLIP_ACT_GELU, CLIP_ACT_GELU_TANH };

typedef struct {
    int hidden, inter, layers, heads, act;
    double eps;
    int max_pos;                    /* text: max_position_embeddings */
    int64_t vocab, eos_token_id;    /* text */
    int image_size, patch_size, channels; /* vision */
} clip_tower_cfg;

typedef struct {
    int do_resize, resize_shortest, resize_h, resize_w; /* resize_shortest > 0, or resize_h x resize_w */
    int do_center_crop, crop_h, crop_w;
    int do_rescale, do_normalize;
    double rescale_factor, mean[3], std[3];
} clip_preproc_cfg;

typedef struct {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *o_w, *o_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} clip_layer;

struct kiln_clip {
    char *dir;
    clip_tower_cfg text, vision;
    clip_preproc_cfg pre;
    int proj_dim;
    float logit_scale; /* exp() of the stored value */
    /* text tower */
    const float *tok_emb, *tpos_emb, *final_ln_w, *final_ln_b, *text_proj;
    clip_layer *tl;
    /* vision tower */
    const float *class_emb, *patch_w, *vpos_emb, *pre_ln_w, *pre_ln_b, *post_ln_w, *post_ln_b, *vis_proj;
    clip_layer *vl;
    float *w; /* every weight above, f32, one allocation */
    size_t nw;
    kiln_tokenizer *tok;
    int64_t bos_id, eos_id;
    struct clip_gpu *gpu; /* the vision tower on the device (clip_cuda.c), or NULL: CPU */
    struct clip_cpu_bufs *cpu_bufs; /* the CPU vision tower's activations, kept between calls (clip_forward.c) */
    int cpu_bufs_busy;              /* a call is using them (atomic) */
    uint64_t weights_digest;        /* the weights' part of the identity (clip_id.c) */
    char id[32];                    /* kiln_clip_id: "xxh64:" + 16 hex digits */
};

kiln_error *kiln_clip_read_config(const char *path, clip_tower_cfg *text, clip_tower_cfg *vision, int *proj_dim);
kiln_error *kiln_clip_read_preproc(const char *path, clip_preproc_cfg *pre);
kiln_error *kiln_clip_load_weights(kiln_clip *m);
kiln_error *kiln_clip_load_text(kiln_clip *m);
/* ids of one text: [bos, tokens truncated to max_pos - 2, eos]; *ids malloc'd. */
kiln_error *kiln_clip_text_ids(const kiln_clip *m, const char *text, int64_t **ids, int *n);
/* Index of the token pooled for the text embedding, as HF 5.x picks it. */
int kiln_clip_eos_index(const kiln_clip *m, const int64_t *ids, int n);
/* clip_cuda.c: the GPU vision tower and its release (no-op without a device copy) */
kiln_error *kiln_clip_embed_images_cuda(kiln_clip *m, const float *pixels, int n, float *out, float *patches);
void kiln_clip_gpu_free(kiln_clip *m);
/* clip_id.c: tensor i of src (already checked: shape, F32/F16/BF16/F64) converted into dst[i] as f32, on
 * the OpenMP threads, piece by piece, each piece's bytes hashed as the conversion reads them;
 * *digest the weights' part of the identity. */
kiln_error *clip_id_load_tensors(const kiln_st_tensor *const *src, float *const *dst, size_t n, uint64_t *digest);
/* clip_id.c: m->id from m->weights_digest and the directory's .json/.txt files */
kiln_error *clip_id_finish(kiln_clip *m);
/* clip_forward.c: the CPU vision tower's kept activations */
void kiln_clip_cpu_free(kiln_clip *m);

#endif
