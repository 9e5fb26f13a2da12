/* kiln CLIP: HF CLIPModel (text and vision towers) in C, plus the image
 * preprocessing of CLIPImageProcessor and the CLIP BPE tokenizer, so that
 * embeddings match transformers on the same checkpoint directory.
 */
#ifndef KILN_CLIP_H
#define KILN_CLIP_H

#include <stdint.h>

#include "kiln/error.h"
#include "kiln/image.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_clip kiln_clip;

/* HF CLIPModel dir: config.json, model.safetensors, tokenizer files,
 * preprocessor_config.json. */
kiln_error *kiln_clip_load(const char *dir, kiln_clip **out);
void kiln_clip_free(kiln_clip *m);
int kiln_clip_dim(const kiln_clip *m);           /* projection_dim D */
int kiln_clip_image_size(const kiln_clip *m);    /* S */
int kiln_clip_grid(const kiln_clip *m);          /* patches per side G = S / patch_size */
float kiln_clip_logit_scale(const kiln_clip *m); /* exp(logit_scale) */
/* The model's identity: "xxh64:" + 16 hex digits, a content hash of the weights the model read (each
 * tensor's name, dtype, shape and bytes) and of the directory's .json and .txt files, computed by
 * kiln_clip_load as it reads them (no second read). The same bytes give the same id wherever the
 * directory is and however the safetensors are sharded; another checkpoint of the same shapes, sizes
 * and times does not. Format: docs/cis-format.md. */
const char *kiln_clip_id(const kiln_clip *m);
/* Where kiln_clip_embed_images runs: "cpu" (the default; f32, OpenBLAS) or "cuda" (device 0: the
 * vision tower's weights are uploaded once as bf16, activations bf16, the residual stream and every
 * reduction f32; freed with the model or by setting "cpu" again). Texts always run on the CPU.
 * On "cpu" the embed functions may be called from several threads at once; on "cuda" one at a time. */
kiln_error *kiln_clip_set_device(kiln_clip *m, const char *device);
/* -> pixels [3,S,S] exactly as CLIPImageProcessor would produce. */
kiln_error *kiln_clip_preprocess(const kiln_clip *m, const kiln_image *img, float *pixels);
/* out [n,D]: projected, L2-normalised text embeddings. */
kiln_error *kiln_clip_embed_texts(kiln_clip *m, const char *const *texts, int n, float *out);
/* out [n,D] projected + L2-normalised image embeds; patches NULL or [n, G*G, D]:
 * each patch token of the last hidden state through post_layernorm +
 * visual_projection, L2-normalised (for patch-level similarity maps). */
kiln_error *kiln_clip_embed_images(kiln_clip *m, const float *pixels, int n, float *out, float *patches);
/* Room for the pixels of n images ([n,3,S,S] f32) for kiln_clip_embed_images: page-locked host memory
 * when the model is on CUDA (the upload then runs at the link's speed, straight from it, overlapped
 * with compute), plain memory otherwise. Free with kiln_clip_pixels_free (either kind). On CUDA the
 * embed functions also take pixels in device memory, used in place. */
kiln_error *kiln_clip_pixels_alloc(const kiln_clip *m, int64_t n, float **pixels);
void kiln_clip_pixels_free(float *pixels);

#ifdef __cplusplus
}
#endif
#endif
