/* kiln cis embed: CLIP embeddings of images and/or texts into one safetensors file.
 *
 *   kiln cis embed --clip DIR (--images FILE_LIST | --texts FILE) --out OUT.safetensors
 *
 * image_embeds [N,D] and/or text_embeds [N,D], F32, projected and L2-normalised, rows in input
 * order. Every image is decoded first so all bad ones are reported together; nothing is written
 * unless every item embedded (the output is written atomically, so an old file stays intact). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/image.h"
#include "kiln/progress.h"
#include "kiln/safetensors.h"

static const char usage[] =
    "usage: kiln cis embed --clip DIR (--images FILE_LIST | --texts FILE) --out OUT.safetensors [--batch N]\n"
    "                      [--device cpu|cuda]\n\n"
    "CLIP embeddings with a HF CLIPModel directory (config.json, model.safetensors, tokenizer.json,\n"
    "preprocessor_config.json), computed as transformers does (CLIPImageProcessor, CLIPTokenizer with\n"
    "truncation to 77 tokens, get_image_features / get_text_features, then L2 normalisation).\n\n"
    "  --clip DIR         the CLIP model directory\n"
    "  --images FILE      a list of image paths (PNG or JPEG), one per line, relative to the current directory\n"
    "  --texts FILE       texts, one per line (UTF-8; a final newline does not start another text)\n"
    "  --out FILE         safetensors with image_embeds [N,D] and/or text_embeds [N,D] (F32), rows in input\n"
    "                     order; written atomically, only when every item succeeded\n"
    "  --batch N          images per forward pass (default 16)\n"
    "  --device D         where the image tower runs: cpu (default, f32) or cuda (bf16 on GPU 0; texts stay on\n"
    "                     the CPU)\n";

/* lines of a file (without \n or \r\n); a final newline ends the last line, it does not add one */
static kiln_error *read_lines(const char *path, char **buf, char ***lines, int *n) {
    size_t len;
    *lines = NULL;
    *n = 0;
    KILN_TRY(kiln_read_file(path, buf, &len));
    int cap = 16;
    char **v = malloc(sizeof(char *) * (size_t)cap);
    if (!v) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    char *p = *buf, *end = *buf + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        *e = 0;
        if (*n == cap) {
            char **nv = realloc(v, sizeof(char *) * (size_t)(cap *= 2));
            if (!nv) {
                free(v);
                return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
            }
            v = nv;
        }
        v[(*n)++] = p;
        p = e + 1;
    }
    *lines = v;
    return NULL;
}

static kiln_error *embed_images(kiln_clip *m, const char *list, int batch, float **out, int *n) {
    char *buf = NULL, **paths = NULL;
    *out = NULL;
    KILN_TRY(read_lines(list, &buf, &paths, n));
    kiln_error *e = NULL;
    int S = kiln_clip_image_size(m), D = kiln_clip_dim(m), N = *n, bad = 0;
    size_t per = (size_t)3 * S * S;
    /* page-locked on CUDA: the upload then runs straight from it, overlapped with compute */
    float *px = NULL, *emb = malloc(sizeof(float) * (size_t)(N ? N : 1) * D);
    e = kiln_clip_pixels_alloc(m, batch, &px);
    if (!e && (!px || !emb)) e = kiln_errorf(KILN_ENOMEM, "out of memory for %d images", N);
    if (!e && N == 0) e = kiln_errorf(KILN_EINVAL, "%s: no image paths", list);
    kiln_progress prog;
    if (!e) kiln_progress_start(&prog, "embed images", (uint64_t)N, "img");
    for (int b0 = 0; !e && b0 < N; b0 += batch) {
        int B = N - b0 < batch ? N - b0 : batch, ok = 1;
        kiln_error *errs[4096] = {0};
        /* decoding and resizing are per image and single-threaded: spread the batch over threads */
#pragma omp parallel for schedule(dynamic)
        for (int i = 0; i < B; i++) {
            kiln_image img;
            kiln_error *le = kiln_image_load(paths[b0 + i], &img);
            if (!le) le = kiln_clip_preprocess(m, &img, px + per * (size_t)i);
            kiln_image_free(&img);
            errs[i] = le;
        }
        for (int i = 0; i < B; i++) {
            if (!errs[i]) continue;
            /* report every bad item, keep going so the user sees them all at once */
            fprintf(stderr, "kiln cis embed: %s line %d: %s\n", list, b0 + i + 1, kiln_error_msg(errs[i]));
            kiln_error_free(errs[i]);
            bad++;
            ok = 0;
        }
        if (ok && !bad) e = kiln_clip_embed_images(m, px, B, emb + (size_t)b0 * D, NULL);
        kiln_progress_update(&prog, (uint64_t)(b0 + B));
    }
    if (N > 0 && px && emb) kiln_progress_finish(&prog);
    if (!e && bad) e = kiln_errorf(KILN_EINVAL, "%s: %d of %d images could not be read; nothing written", list, bad, N);
    kiln_clip_pixels_free(px);
    free(paths);
    free(buf);
    if (e) {
        free(emb);
        return e;
    }
    *out = emb;
    return NULL;
}

static kiln_error *embed_texts(kiln_clip *m, const char *file, float **out, int *n) {
    char *buf = NULL, **lines = NULL;
    *out = NULL;
    KILN_TRY(read_lines(file, &buf, &lines, n));
    int D = kiln_clip_dim(m), N = *n;
    kiln_error *e = NULL;
    float *emb = malloc(sizeof(float) * (size_t)(N ? N : 1) * D);
    if (!emb) e = kiln_errorf(KILN_ENOMEM, "out of memory for %d texts", N);
    if (!e && N == 0) e = kiln_errorf(KILN_EINVAL, "%s: no texts", file);
    if (!e) {
        kiln_progress prog;
        kiln_progress_start(&prog, "embed texts", (uint64_t)N, "text");
        for (int i = 0; i < N && !e; i += 64) {
            int k = N - i < 64 ? N - i : 64;
            e = kiln_clip_embed_texts(m, (const char *const *)lines + i, k, emb + (size_t)i * D);
            if (e) e = kiln_error_wrap(e, "%s line %d..%d", file, i + 1, i + k);
            kiln_progress_update(&prog, (uint64_t)(i + k));
        }
        kiln_progress_finish(&prog);
    }
    free(lines);
    free(buf);
    if (e) {
        free(emb);
        return e;
    }
    *out = emb;
    return NULL;
}

int cis_embed_main(int argc, char **argv) {
    const char *clip = NULL, *images = NULL, *texts = NULL, *out = NULL, *device = "cpu";
    int64_t batch = 16;
    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--clip") ? &clip : !strcmp(a, "--images") ? &images : !strcmp(a, "--texts") ? &texts
                         : !strcmp(a, "--out")  ? &out : !strcmp(a, "--device") ? &device : NULL;
        if (!dst && strcmp(a, "--batch")) {
            fprintf(stderr, "kiln cis embed: unknown option '%s'\n\n%s", a, usage);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kiln cis embed: %s needs a value\n", a);
            return 2;
        }
        if (dst) {
            *dst = argv[++i];
        } else {
            kiln_error *e = cli_int_in("--batch", argv[++i], 1, 4096, &batch);
            if (e) return cli_fail("cis embed", e);
        }
    }
    if (!clip || !out || (!images && !texts)) {
        fprintf(stderr, "kiln cis embed: --clip, --out and at least one of --images / --texts are required\n\n%s", usage);
        return 2;
    }
    kiln_clip *m = NULL;
    kiln_error *e = kiln_clip_load(clip, &m);
    if (!e && images) e = kiln_clip_set_device(m, device);
    float *ie = NULL, *te = NULL;
    int ni = 0, nt = 0;
    if (!e && images) e = embed_images(m, images, (int)batch, &ie, &ni);
    if (!e && texts) e = embed_texts(m, texts, &te, &nt);
    if (!e) {
        int64_t D = kiln_clip_dim(m), si[2] = {ni, D}, st[2] = {nt, D};
        kiln_st_entry ent[2];
        size_t k = 0;
        if (ie) ent[k++] = (kiln_st_entry){"image_embeds", KILN_DT_F32, 2, si, ie};
        if (te) ent[k++] = (kiln_st_entry){"text_embeds", KILN_DT_F32, 2, st, te};
        e = kiln_st_write(out, ent, k, NULL);
        if (!e)
            fprintf(stderr, "kiln cis embed: wrote %s%s%s to %s (D=%lld)\n", ie ? "image_embeds" : "",
                    ie && te ? " and " : "", te ? "text_embeds" : "", out, (long long)D);
    }
    free(ie);
    free(te);
    kiln_clip_free(m);
    return e ? cli_fail("cis embed", e) : 0;
}
