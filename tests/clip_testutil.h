/* A tiny random HF-layout CLIP directory written by the tests themselves (config.json,
 * preprocessor_config.json, tokenizer.json in CLIP's pipeline, model.safetensors), so the CLIP code,
 * `kiln cis embed` and the CIS pipeline can be tested without the GPU-made fixtures. Weights are
 * normal(0, 1/sqrt(fan_in)) from a seed; layer norms are 1 + noise so every op matters. */
#ifndef KILN_CLIP_TESTUTIL_H
#define KILN_CLIP_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/dtype.h"
#include "kiln/rng.h"
#include "kiln/safetensors.h"

typedef struct {
    int text_hidden, text_layers, text_heads, text_inter, max_pos;
    int vis_hidden, vis_layers, vis_heads, vis_inter, image_size, patch_size;
    int proj_dim;
    const char *act;      /* "quick_gelu" or "gelu" */
    int bf16;             /* weights stored as BF16 */
    int shortest_edge;    /* preprocessor: resize, then crop image_size */
    int64_t eos_token_id; /* text_config.eos_token_id: 0 = the tokenizer's <|endoftext|>; 2 = legacy argmax */
} clip_test_cfg;

static const clip_test_cfg clip_test_default = {32, 2, 4, 64, 77, 32, 2, 4, 48, 32, 8, 16, "quick_gelu", 0, 36, 0};

/* GPT-2's byte -> code point map (CLIP's byte-level alphabet) */
static unsigned clip_test_byte_cp(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (unsigned)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256u + (unsigned)n;
}

static void clip_test_utf8(unsigned cp, char *out) {
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

/* merges of the tiny vocabulary: (a, b) pairs, in rank order */
static const char *const clip_test_merges[][2] = {
    {"t", "h"}, {"th", "e</w>"}, {"a", "n"}, {"an", "d</w>"}, {"o", "f</w>"}, {"p", "h"}, {"ph", "o"},
    {"pho", "t"}, {"phot", "o</w>"}, {"c", "a"}, {"ca", "t</w>"}, {"i", "n"}, {"in", "g</w>"},
};
#define CLIP_TEST_NMERGES ((int)(sizeof clip_test_merges / sizeof clip_test_merges[0]))
/* ids: 0..255 bytes, 256..511 bytes + "</w>", then one per merge, then <|startoftext|>, <|endoftext|> */
#define CLIP_TEST_VOCAB (512 + CLIP_TEST_NMERGES + 2)
#define CLIP_TEST_BOS (512 + CLIP_TEST_NMERGES)
#define CLIP_TEST_EOS (512 + CLIP_TEST_NMERGES + 1)

static int clip_test_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int clip_test_write_tokenizer(const char *path) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap), ch[4];
#define PUT(...) (n += (size_t)snprintf(b + n, cap - n, __VA_ARGS__))
    PUT("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
        "{\"id\":%d,\"content\":\"<|startoftext|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":true,\"special\":true},"
        "{\"id\":%d,\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":false,\"special\":true}],",
        CLIP_TEST_BOS, CLIP_TEST_EOS);
    PUT("\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Replace\",\"pattern\":"
        "{\"Regex\":\"\\\\s+\"},\"content\":\" \"},{\"type\":\"Lowercase\"}]},");
    PUT("\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"<\\\\|startoftext\\\\|>|<\\\\|endoftext\\\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\\\p{L}]+|[\\\\p{N}]|"
        "[^\\\\s\\\\p{L}\\\\p{N}]+\"},\"behavior\":\"Removed\",\"invert\":true},{\"type\":\"ByteLevel\","
        "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}]},");
    PUT("\"post_processor\":{\"type\":\"RobertaProcessing\",\"sep\":[\"<|endoftext|>\",%d],\"cls\":"
        "[\"<|startoftext|>\",%d],\"trim_offsets\":false,\"add_prefix_space\":false},",
        CLIP_TEST_EOS, CLIP_TEST_BOS);
    PUT("\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},");
    PUT("\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<|endoftext|>\",\"continuing_subword_prefix\":"
        "\"\",\"end_of_word_suffix\":\"</w>\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
        "\"vocab\":{");
    for (int i = 0; i < 512; i++) {
        clip_test_utf8(clip_test_byte_cp(i % 256), ch);
        const char *esc = !strcmp(ch, "\"") ? "\\\"" : !strcmp(ch, "\\") ? "\\\\" : ch;
        PUT("\"%s%s\":%d,", esc, i >= 256 ? "</w>" : "", i);
    }
    for (int i = 0; i < CLIP_TEST_NMERGES; i++)
        PUT("\"%s%s\":%d,", clip_test_merges[i][0], clip_test_merges[i][1], 512 + i);
    PUT("\"<|startoftext|>\":%d,\"<|endoftext|>\":%d},\"merges\":[", CLIP_TEST_BOS, CLIP_TEST_EOS);
    for (int i = 0; i < CLIP_TEST_NMERGES; i++)
        PUT("%s\"%s %s\"", i ? "," : "", clip_test_merges[i][0], clip_test_merges[i][1]);
    PUT("]}}\n");
#undef PUT
    int rc = n < cap ? clip_test_write_text(path, b) : -1;
    free(b);
    return rc;
}

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[4];
    float *data;
    uint16_t *half;
} clip_test_tensor;

static void clip_test_fill(clip_test_tensor *t, kiln_rng *r, const char *name, int ndim, int64_t a, int64_t b,
                           int64_t c, int64_t d) {
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    int64_t s[4] = {a, b, c, d}, numel = 1, fan_in = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = s[i], numel *= s[i], fan_in *= i ? s[i] : 1;
    t->data = malloc(sizeof(float) * (size_t)numel);
    t->half = NULL;
    int is_norm = strstr(name, "norm") || strstr(name, "layrnorm");
    for (int64_t i = 0; i < numel; i++) {
        double z = kiln_rng_normal(r);
        if (!strcmp(name, "logit_scale")) t->data[i] = 2.0f;
        else if (is_norm && strstr(name, "weight")) t->data[i] = (float)(1 + 0.2 * z);
        else if (strstr(name, "bias")) t->data[i] = (float)(0.1 * z);
        else if (ndim == 1) t->data[i] = (float)(0.5 * z);
        else t->data[i] = (float)(z / sqrt((double)fan_in));
    }
}

/* Write the directory; returns 0 on success. */
static int clip_test_make_dir(const char *dir, const clip_test_cfg *c, uint64_t seed) {
    char path[1024], buf[4096];
    int G = c->image_size / c->patch_size;
    int64_t eos_cfg = c->eos_token_id ? c->eos_token_id : CLIP_TEST_EOS;
    snprintf(buf, sizeof buf,
             "{\"architectures\":[\"CLIPModel\"],\"model_type\":\"clip\",\"projection_dim\":%d,\"logit_scale_init_value\":2.6592,"
             "\"text_config\":{\"model_type\":\"clip_text_model\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"max_position_embeddings\":%d,\"hidden_act\":\"%s\","
             "\"vocab_size\":%d,\"bos_token_id\":%d,\"eos_token_id\":%lld,\"pad_token_id\":%d,\"layer_norm_eps\":1e-05},"
             "\"vision_config\":{\"model_type\":\"clip_vision_model\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"image_size\":%d,\"patch_size\":%d,\"hidden_act\":\"%s\","
             "\"layer_norm_eps\":1e-05}}\n",
             c->proj_dim, c->text_hidden, c->text_inter, c->text_layers, c->text_heads, c->max_pos, c->act, CLIP_TEST_VOCAB,
             CLIP_TEST_BOS, (long long)eos_cfg, CLIP_TEST_EOS, c->vis_hidden, c->vis_inter, c->vis_layers, c->vis_heads,
             c->image_size, c->patch_size, c->act);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (clip_test_write_text(path, buf)) return -1;
    snprintf(buf, sizeof buf,
             "{\"crop_size\":{\"height\":%d,\"width\":%d},\"do_center_crop\":true,\"do_convert_rgb\":true,\"do_normalize\":true,"
             "\"do_rescale\":true,\"do_resize\":true,\"image_mean\":[0.48145466,0.4578275,0.40821073],"
             "\"image_processor_type\":\"CLIPImageProcessor\",\"image_std\":[0.26862954,0.26130258,0.27577711],"
             "\"resample\":3,\"rescale_factor\":0.00392156862745098,\"size\":{\"shortest_edge\":%d}}\n",
             c->image_size, c->image_size, c->shortest_edge);
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    if (clip_test_write_text(path, buf)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (clip_test_write_tokenizer(path)) return -1;

    int nt = 0, cap = 64 + 16 * (c->text_layers + c->vis_layers);
    clip_test_tensor *t = calloc((size_t)cap, sizeof *t);
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    char n[128];
#define T(name, nd, a, b, cc, d) clip_test_fill(&t[nt++], &r, name, nd, a, b, cc, d)
    T("logit_scale", 0, 0, 0, 0, 0);
    T("text_model.embeddings.token_embedding.weight", 2, CLIP_TEST_VOCAB, c->text_hidden, 0, 0);
    T("text_model.embeddings.position_embedding.weight", 2, c->max_pos, c->text_hidden, 0, 0);
    for (int tower = 0; tower < 2; tower++) {
        const char *pre = tower ? "vision_model" : "text_model";
        int H = tower ? c->vis_hidden : c->text_hidden, I = tower ? c->vis_inter : c->text_inter;
        int L = tower ? c->vis_layers : c->text_layers;
        if (tower) {
            T("vision_model.embeddings.class_embedding", 1, H, 0, 0, 0);
            T("vision_model.embeddings.patch_embedding.weight", 4, H, 3, c->patch_size, c->patch_size);
            T("vision_model.embeddings.position_embedding.weight", 2, G * G + 1, H, 0, 0);
            T("vision_model.pre_layrnorm.weight", 1, H, 0, 0, 0);
            T("vision_model.pre_layrnorm.bias", 1, H, 0, 0, 0);
        }
        for (int l = 0; l < L; l++) {
            static const char *const sq[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
            for (int k = 0; k < 4; k++) {
                snprintf(n, sizeof n, "%s.encoder.layers.%d.self_attn.%s.weight", pre, l, sq[k]);
                T(n, 2, H, H, 0, 0);
                snprintf(n, sizeof n, "%s.encoder.layers.%d.self_attn.%s.bias", pre, l, sq[k]);
                T(n, 1, H, 0, 0, 0);
            }
            for (int k = 1; k <= 2; k++) {
                snprintf(n, sizeof n, "%s.encoder.layers.%d.layer_norm%d.weight", pre, l, k);
                T(n, 1, H, 0, 0, 0);
                snprintf(n, sizeof n, "%s.encoder.layers.%d.layer_norm%d.bias", pre, l, k);
                T(n, 1, H, 0, 0, 0);
            }
            snprintf(n, sizeof n, "%s.encoder.layers.%d.mlp.fc1.weight", pre, l);
            T(n, 2, I, H, 0, 0);
            snprintf(n, sizeof n, "%s.encoder.layers.%d.mlp.fc1.bias", pre, l);
            T(n, 1, I, 0, 0, 0);
            snprintf(n, sizeof n, "%s.encoder.layers.%d.mlp.fc2.weight", pre, l);
            T(n, 2, H, I, 0, 0);
            snprintf(n, sizeof n, "%s.encoder.layers.%d.mlp.fc2.bias", pre, l);
            T(n, 1, H, 0, 0, 0);
        }
        if (tower) {
            T("vision_model.post_layernorm.weight", 1, H, 0, 0, 0);
            T("vision_model.post_layernorm.bias", 1, H, 0, 0, 0);
            T("visual_projection.weight", 2, c->proj_dim, H, 0, 0);
        } else {
            T("text_model.final_layer_norm.weight", 1, H, 0, 0, 0);
            T("text_model.final_layer_norm.bias", 1, H, 0, 0, 0);
            T("text_projection.weight", 2, c->proj_dim, H, 0, 0);
        }
    }
#undef T
    kiln_st_entry *e = calloc((size_t)nt, sizeof *e);
    for (int i = 0; i < nt; i++) {
        int64_t numel = 1;
        for (int k = 0; k < t[i].ndim; k++) numel *= t[i].shape[k];
        e[i].name = t[i].name;
        e[i].ndim = t[i].ndim;
        e[i].shape = t[i].shape;
        if (c->bf16) {
            t[i].half = malloc(sizeof(uint16_t) * (size_t)numel);
            for (int64_t k = 0; k < numel; k++) t[i].half[k] = kiln_f32_to_bf16(t[i].data[k]);
            e[i].dtype = KILN_DT_BF16;
            e[i].data = t[i].half;
        } else {
            e[i].dtype = KILN_DT_F32;
            e[i].data = t[i].data;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    kiln_error *err = kiln_st_write(path, e, (size_t)nt, NULL);
    int rc = err ? -1 : 0;
    if (err) {
        fprintf(stderr, "clip_test_make_dir: %s\n", kiln_error_msg(err));
        kiln_error_free(err);
    }
    for (int i = 0; i < nt; i++) {
        free(t[i].data);
        free(t[i].half);
    }
    free(t);
    free(e);
    return rc;
}

#endif
