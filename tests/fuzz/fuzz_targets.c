/* kiln's fuzz targets (the contract is in fuzz_targets.h). Each is one parser and the invariants it promises. */
#include "fuzz_targets.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cis/cis_internal.h"
#include "ckpt/source.h"
#include "clip/clip_internal.h"
#include "ft/ft_internal.h"
#include "kiln/ckpt.h"
#include "kiln/cis.h"
#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/image.h"
#include "kiln/json.h"
#include "kiln/safetensors.h"
#include "kiln/sizing.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"
#include "kiln/zaya.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

/* ---- helpers ---- */

static int fail(const char *target, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz %s: invariant failed: ", target);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* an error is the expected answer to most inputs: dropped, but it must carry a message */
static int drop(const char *target, kiln_error *e) {
    if (!e) return 0;
    const char *m = kiln_error_msg(e);
    const int bad = !m || !*m;
    kiln_error_free(e);
    return bad ? fail(target, "an error without a message") : 0;
}

/* the bytes as a NUL-terminated string (the parsers of flags and configs take C strings) */
static char *cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return NULL;
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* A file of this process in a private temp folder (the parsers that take paths), removed at exit. */
static char tmp_dir[64];
static char tmp_paths[8][256];
/* a file, or a folder and what is in it */
static void remove_tree(const char *path) {
    if (!unlink(path)) return;
    DIR *d = opendir(path);
    if (d) {
        for (struct dirent *de; (de = readdir(d));) {
            char p[600];
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", path, de->d_name);
                remove_tree(p);
            }
        }
        closedir(d);
    }
    rmdir(path);
}
static void tmp_cleanup(void) {
    if (tmp_dir[0]) remove_tree(tmp_dir);
}
static int tmp_ready(void) {
    if (!tmp_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp_dir, sizeof tmp_dir, "%s/kiln-fuzz-XXXXXX", base && *base && strlen(base) < 40 ? base : "/tmp");
        if (!mkdtemp(tmp_dir)) {
            tmp_dir[0] = 0;
            return 0;
        }
        atexit(tmp_cleanup);
    }
    return 1;
}
static const char *tmp_file(int slot, const char *name, const void *data, size_t size) {
    if (!tmp_ready()) return NULL;
    snprintf(tmp_paths[slot], sizeof tmp_paths[slot], "%s/%s", tmp_dir, name);
    FILE *f = fopen(tmp_paths[slot], "wb");
    if (!f) return NULL;
    const int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) || !ok) return NULL;
    return tmp_paths[slot];
}

/* ---- safetensors: what the reader accepts, the writer writes back and the reader reads the same ---- */

static int fuzz_safetensors(const uint8_t *data, size_t size) {
    const char *T = "safetensors";
    const char *path = tmp_file(0, "in.safetensors", data, size);
    if (!path) return 0;
    kiln_st *st = NULL;
    kiln_error *e = kiln_st_open(path, &st);
    if (e) return drop(T, e);
    int rc = 0;
    const size_t n = kiln_st_count(st);
    kiln_st_entry *ent = calloc(n ? n : 1, sizeof *ent);
    float *f = NULL;
    int oom = !ent;
    for (size_t i = 0; i < n && !rc && !oom; i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        uint64_t numel = 1; /* unsigned: a shape [2^62, 2^62, 0] must not overflow here either */
        for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
        if (t->ndim < 0 || t->ndim > KILN_ST_MAX_DIMS || numel != (uint64_t)t->numel ||
            (size_t)t->numel * kiln_dtype_size(t->dtype) != t->nbytes)
            rc = fail(T, "tensor '%s': shape, numel %lld and %zu bytes disagree", t->name, (long long)t->numel, t->nbytes);
        else if (kiln_st_find(st, t->name) != t)
            rc = fail(T, "tensor '%s' is not found by its name", t->name);
        if (rc) break;
        /* every byte of every tensor is touched (the reader validated the ranges) */
        if (t->numel > 0 && t->numel <= (1 << 20)) {
            float *g = realloc(f, (size_t)t->numel * sizeof *f);
            if (!g) {
                oom = 1;
                break;
            }
            f = g;
            drop(T, kiln_st_read_f32(t, f, (size_t)t->numel));
        }
        ent[i] = (kiln_st_entry){t->name, t->dtype, t->ndim, t->shape, t->data};
    }
    if (!rc && !oom) {
        /* the writer takes what the reader accepted, and the reader gets the same tensors back */
        char out[128];
        snprintf(out, sizeof out, "%s/out.safetensors", tmp_dir);
        e = kiln_st_write(out, ent, n, NULL);
        if (e) {
            rc = fail(T, "the writer refused what the reader accepted: %s", kiln_error_msg(e));
            kiln_error_free(e);
        } else {
            kiln_st *st2 = NULL;
            e = kiln_st_open(out, &st2);
            if (e) {
                rc = fail(T, "the reader refused what the writer wrote: %s", kiln_error_msg(e));
                kiln_error_free(e);
            } else {
                if (kiln_st_count(st2) != n) rc = fail(T, "%zu tensors written, %zu read", n, kiln_st_count(st2));
                for (size_t i = 0; i < n && !rc; i++) {
                    const kiln_st_tensor *a = kiln_st_at(st, i), *b = kiln_st_find(st2, a->name);
                    if (!b || b->dtype != a->dtype || b->ndim != a->ndim || b->nbytes != a->nbytes ||
                        memcmp(b->shape, a->shape, (size_t)a->ndim * sizeof *a->shape) ||
                        (a->nbytes && memcmp(a->data, b->data, a->nbytes)))
                        rc = fail(T, "tensor '%s' differs after writing and reading", a->name);
                }
                kiln_st_close(st2);
            }
            unlink(out);
        }
    }
    free(f);
    free(ent);
    kiln_st_close(st);
    return rc;
}

/* ---- images: PNG and JPEG decoding (libpng, libjpeg behind kiln's checks) ---- */

static int fuzz_image(const uint8_t *data, size_t size) {
    const char *T = "image";
    const char *path = tmp_file(0, "in.img", data, size);
    if (!path) return 0;
    kiln_image img = {0};
    kiln_error *e = kiln_image_load(path, &img);
    if (e) return drop(T, e);
    int rc = 0;
    if (img.width <= 0 || img.height <= 0 || !img.rgb) rc = fail(T, "an empty image %dx%d accepted", img.width, img.height);
    else {
        /* a decoded image resizes (every pixel read: a short buffer shows under ASan) */
        kiln_image small = {0};
        e = kiln_image_resize_bicubic(&img, 7, 5, &small);
        if (e) rc = fail(T, "a decoded %dx%d image does not resize: %s", img.width, img.height, kiln_error_msg(e));
        kiln_error_free(e);
        kiln_image_free(&small);
    }
    kiln_image_free(&img);
    return rc;
}

/* ---- tokenizer.json: the loader, and the loaded tokenizer on a few texts ---- */

static int fuzz_tokenizer_json(const uint8_t *data, size_t size) {
    const char *T = "tokenizer_json";
    const char *path = tmp_file(0, "tokenizer.json", data, size);
    if (!path) return 0;
    kiln_tokenizer *tok = NULL;
    kiln_error *e = kiln_tokenizer_load(path, &tok);
    if (e) return drop(T, e);
    int rc = 0;
    static const char *texts[] = {"Hello world", " a  b\n\tc", "naïve café ☕ 東京", "<s></s><|endoftext|>", ""};
    const int64_t V = kiln_tokenizer_vocab_size(tok);
    for (size_t k = 0; k < sizeof texts / sizeof *texts && !rc; k++) {
        int64_t *ids = NULL;
        size_t n = 0;
        e = kiln_tokenizer_encode(tok, texts[k], strlen(texts[k]), &ids, &n);
        if (e) {
            drop(T, e);
            continue;
        }
        for (size_t i = 0; i < n && !rc; i++)
            if (ids[i] < 0 || ids[i] >= V) rc = fail(T, "id %lld outside the vocabulary of %lld", (long long)ids[i], (long long)V);
        char *back = NULL;
        size_t blen = 0;
        if (!rc) drop(T, kiln_tokenizer_decode(tok, ids, n, &back, &blen));
        free(back);
        free(ids);
    }
    kiln_tokenizer_free(tok);
    return rc;
}

/* ---- text through the committed tokenizers: ids in range, byte-level BPE decodes to the same bytes ---- */

static kiln_tokenizer *text_toks[4];
static int text_toks_loaded;
static int fuzz_tokenizer_text(const uint8_t *data, size_t size) {
    const char *T = "tokenizer_text";
    static const char *names[4] = {"gpt2", "llama3", "gemma", "metaspace"};
    if (!text_toks_loaded) {
        text_toks_loaded = 1;
        for (int i = 0; i < 4; i++) {
            char p[1024];
            snprintf(p, sizeof p, "%s/tests/fixtures/tokenizer/%s.json", KILN_SOURCE_DIR, names[i]);
            kiln_error *e = kiln_tokenizer_load(p, &text_toks[i]);
            if (e) {
                fprintf(stderr, "fuzz %s: %s\n", T, kiln_error_msg(e));
                kiln_error_free(e);
            }
        }
    }
    if (!size) return 0;
    const int which = data[0] % 4;
    kiln_tokenizer *tok = text_toks[which];
    if (!tok) return fail(T, "the %s fixture does not load", names[which]);
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    int64_t *ids = NULL;
    size_t n = 0;
    kiln_error *e = kiln_tokenizer_encode(tok, text, len, &ids, &n);
    if (e) return drop(T, e); /* invalid UTF-8 is refused */
    int rc = 0;
    const int64_t V = kiln_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n && !rc; i++)
        if (ids[i] < 0 || ids[i] >= V) rc = fail(T, "%s: id %lld outside the vocabulary", names[which], (long long)ids[i]);
    char *back = NULL;
    size_t blen = 0;
    if (!rc) {
        e = kiln_tokenizer_decode(tok, ids, n, &back, &blen);
        if (e) {
            rc = fail(T, "%s: the ids of a text do not decode: %s", names[which], kiln_error_msg(e));
            kiln_error_free(e);
        } else if (which < 2 && (blen != len || memcmp(back, text, len)))
            /* byte-level BPE is lossless: every accepted text comes back byte for byte */
            rc = fail(T, "%s: %zu bytes encoded to %zu ids decode to %zu other bytes", names[which], len, n, blen);
    }
    char **pieces = NULL;
    size_t np = 0;
    if (!rc) drop(T, kiln_tokenizer_pretokenize(tok, text, len, &pieces, &np));
    free(pieces);
    free(back);
    free(ids);
    return rc;
}

/* ---- configs: ZAYA config.json and the training config round-trip through their writers ---- */

/* A config's parser and writer: parse (from the defaults) into cfg, and cfg as text (malloc'd; NULL out of memory). */
typedef struct {
    const char *target;
    kiln_error *(*parse)(const char *text, const char *ctx, void *cfg);
    char *(*text)(const void *cfg);
    size_t size;                /* of the config struct (plain data: no pointers) */
    void (*unused)(void *cfg); /* clears what the config holds but nothing reads (nullable) */
} config_io;

/* Parsed, written back, parsed and written again: the same text, and the same config bytes (the writer leaves no field
 * out: both start from zeroed memory and take the same defaults, so equal fields are equal bytes). */
static int config_roundtrip(const config_io *io, const uint8_t *data, size_t size, void *c, void *c2) {
    char *s = cstr(data, size);
    if (!s) return 0;
    memset(c, 0, io->size);
    memset(c2, 0, io->size);
    kiln_error *e = io->parse(s, "fuzz", c);
    free(s);
    if (e) return drop(io->target, e);
    int rc = 0;
    char *a = io->text(c), *b = NULL;
    if (a && (e = io->parse(a, "fuzz (written back)", c2))) {
        rc = fail(io->target, "the config written back does not parse: %s\n%s", kiln_error_msg(e), a);
        kiln_error_free(e);
    } else if (a && (b = io->text(c2)) && strcmp(a, b)) {
        rc = fail(io->target, "written back, read and written again differs:\n%s\n%s", a, b);
    } else if (a) {
        if (io->unused) io->unused(c), io->unused(c2);
        if (memcmp(c, c2, io->size))
            rc = fail(io->target, "the config read back from its text differs from the one read first:\n%s", a);
    }
    free(a);
    free(b);
    return rc;
}

static kiln_error *zaya_parse(const char *text, const char *ctx, void *c) {
    kiln_zaya_config_default(c);
    return kiln_zaya_config_parse(text, ctx, c);
}
static char *zaya_text(const void *c) {
    cJSON *j = kiln_zaya_config_to_cjson(c);
    char *a = j ? kiln_json_print(j, 0) : NULL;
    cJSON_Delete(j);
    return a;
}
/* the RoPE settings of a layer type no layer has: read (a flat rope_parameters sets both types), never used, and
 * written back only for the types the layers have */
static void zaya_unused(void *cfg) {
    kiln_zaya_config *c = cfg;
    for (int t = 0; t < 2; t++) {
        int used = 0;
        for (int64_t l = 0; l < c->num_layers; l++) used |= c->layer_types[l] == t;
        if (!used) c->rope_theta[t] = c->partial_rotary[t] = 0;
    }
    /* and the types past the layer count (a longer layer_types given first) */
    if (c->num_layers >= 0 && c->num_layers < KILN_ZAYA_MAX_LAYERS)
        memset(c->layer_types + c->num_layers, 0, (size_t)(KILN_ZAYA_MAX_LAYERS - c->num_layers));
}
static int fuzz_zaya_config(const uint8_t *data, size_t size) {
    static const config_io io = {"zaya_config", zaya_parse, zaya_text, sizeof(kiln_zaya_config), zaya_unused};
    static kiln_zaya_config c, c2;
    return config_roundtrip(&io, data, size, &c, &c2);
}

static kiln_error *train_parse(const char *text, const char *ctx, void *c) {
    kiln_train_config_default(c);
    return kiln_train_config_parse(text, ctx, c);
}
static char *train_text(const void *c) { return kiln_train_config_to_json(c); }
/* the bytes after a string's end: a key given twice leaves the first value's tail there */
static void clear_tail(char *s, size_t cap) {
    const size_t n = strnlen(s, cap);
    memset(s + n, 0, cap - n);
}
static void train_unused(void *cfg) {
    kiln_train_config *c = cfg;
    zaya_unused(&c->model);
    clear_tail(c->data_dir, sizeof c->data_dir), clear_tail(c->ckpt_busy, sizeof c->ckpt_busy);
    clear_tail(c->out_dir, sizeof c->out_dir), clear_tail(c->skip_steps, sizeof c->skip_steps);
    clear_tail(c->device, sizeof c->device);
}
static int fuzz_train_config(const uint8_t *data, size_t size) {
    static const config_io io = {"train_config", train_parse, train_text, sizeof(kiln_train_config), train_unused};
    static kiln_train_config c, c2;
    return config_roundtrip(&io, data, size, &c, &c2);
}

static int fuzz_hw_profile(const uint8_t *data, size_t size) {
    char *s = cstr(data, size);
    if (!s) return 0;
    static kiln_hw_profile p;
    memset(&p, 0, sizeof p);
    kiln_error *e = kiln_hw_profile_parse(s, "fuzz", &p);
    free(s);
    return drop("hw_profile", e);
}

/* ---- kiln cis: the prompt suite (JSON Lines) and the run manifest ---- */

static int fuzz_cis_suite(const uint8_t *data, size_t size) {
    const char *T = "cis_suite";
    kiln_cis_suite s = {0};
    kiln_error *e = kiln_cis_suite_parse((const char *)data, size, "fuzz", &s);
    if (e) return drop(T, e);
    int rc = 0;
    for (int i = 0; i < s.n && !rc; i++) {
        const kiln_cis_prompt *p = &s.p[i];
        if (p->ncomp < 1 || !p->comp || !p->id || !p->prompt || !p->scene || !p->context)
            rc = fail(T, "prompt %d accepted without its components, id, prompt, scene or context", i);
        else if (kiln_cis_suite_find(&s, p->id) != i)
            rc = fail(T, "prompt id '%s' is not unique", p->id);
        for (int k = 0; k < p->ncomp && !rc; k++)
            if (!p->comp[k].phrase || !*p->comp[k].phrase) rc = fail(T, "prompt '%s': an empty component", p->id);
    }
    kiln_cis_suite_free(&s);
    return rc;
}

static int fuzz_cis_manifest(const uint8_t *data, size_t size) {
    const char *T = "cis_manifest";
    const char *path = tmp_file(0, "manifest.jsonl", data, size);
    if (!path) return 0;
    kiln_cis_manifest m = {0};
    kiln_error *e = kiln_cis_manifest_load(path, &m);
    if (e) return drop(T, e);
    int rc = 0;
    for (int i = 0; i < m.n && !rc; i++)
        if (!m.items[i].image || !m.items[i].path || !m.items[i].prompt_id || !m.items[i].model)
            rc = fail(T, "item %d accepted without its image, prompt id or model", i);
    kiln_cis_manifest_free(&m);
    return rc;
}

static int fuzz_cis_detections(const uint8_t *data, size_t size) {
    const char *T = "cis_detections";
    const char *path = tmp_file(0, "detections.jsonl", data, size);
    if (!path) return 0;
    cis_detections t;
    kiln_error *e = cis_detections_load(path, &t);
    if (e) return drop(T, e);
    int rc = 0;
    /* what is kept: one entry per (image, class), sorted, each found by its name at its score in [0, 1] */
    for (int i = 0; i < t.n && !rc; i++) {
        const cis_det *d = &t.d[i];
        if (!d->image || !*d->image || !d->cls || !*d->cls) rc = fail(T, "entry %d without its image or class", i);
        else if (!(d->score >= 0 && d->score <= 1)) rc = fail(T, "entry %d: score %g", i, d->score);
        else if (i && (strcmp(t.d[i - 1].image, d->image) > 0 ||
                       (!strcmp(t.d[i - 1].image, d->image) && strcmp(t.d[i - 1].cls, d->cls) >= 0)))
            rc = fail(T, "entries %d and %d out of order or repeated", i - 1, i);
        else if (cis_detections_score(&t, d->image, d->cls) != d->score) rc = fail(T, "entry %d not found by its name", i);
    }
    if (!rc && t.n > t.lines) rc = fail(T, "%d entries from %d lines", t.n, t.lines);
    cis_detections_free(&t);
    return rc;
}

/* ---- flags: step ranges, fault specs, kiln size's lists and counts, the judge's grids ---- */

static int fuzz_flags(const uint8_t *data, size_t size) {
    const char *T = "flags";
    if (!size) return 0;
    char *s = cstr(data + 1, size - 1);
    if (!s) return 0;
    int rc = 0;
    switch (data[0] % 5) {
    case 0: {
        kiln_step_ranges r = {0};
        kiln_error *e = kiln_step_ranges_parse(s, &r);
        if (!e) {
            /* formatted and parsed again: the same steps (checked at every bound and its neighbours) */
            char buf[4096];
            kiln_step_ranges r2 = {0};
            kiln_step_ranges_format(&r, buf, sizeof buf);
            if (strlen(buf) < sizeof buf - 1) {
                e = kiln_step_ranges_parse(buf, &r2);
                if (e) {
                    rc = fail(T, "step ranges '%s' formatted as '%s' do not parse: %s", s, buf, kiln_error_msg(e));
                    kiln_error_free(e);
                    e = NULL;
                }
                for (int i = 0; i < r.n && !rc; i++)
                    for (int64_t d = -1; d <= 1 && !rc; d++) {
                        const int64_t a = r.r[i].lo + d, b = r.r[i].hi + d;
                        if (kiln_step_ranges_contains(&r, a) != kiln_step_ranges_contains(&r2, a) ||
                            kiln_step_ranges_contains(&r, b) != kiln_step_ranges_contains(&r2, b))
                            rc = fail(T, "step ranges '%s' and their form '%s' differ near %lld", s, buf,
                                      (long long)r.r[i].lo);
                    }
            }
            kiln_step_ranges_free(&r2);
        }
        kiln_step_ranges_free(&r);
        if (!rc) rc = drop(T, e);
        break;
    }
    case 1: {
        kiln_faults f;
        memset(&f, 0, sizeof f);
        kiln_error *e = kiln_faults_parse(s, &f);
        if (!e && (f.n < 0 || f.n > (int)(sizeof f.f / sizeof *f.f))) rc = fail(T, "%d faults parsed", f.n);
        if (!rc) rc = drop(T, e);
        break;
    }
    case 2: {
        kiln_size_list l;
        memset(&l, 0, sizeof l);
        kiln_error *e = kiln_size_parse_list("--fuzz", s, &l);
        if (!e && (l.n < 0 || l.n > KILN_SIZE_MAX_LIST)) rc = fail(T, "a list of %d values parsed", l.n);
        if (!rc) rc = drop(T, e);
        break;
    }
    case 3: {
        double v = 0;
        kiln_error *e = kiln_size_parse_count("--fuzz", s, &v);
        if (!e && !(v > 0 && v <= 1e18)) rc = fail(T, "the count '%s' parsed as %g", s, v);
        if (!rc) rc = drop(T, e);
        break;
    }
    default: {
        int g[8], n = 0;
        kiln_error *e = kiln_cis_parse_grids(s, g, &n, 8);
        if (!e) {
            if (n < 1 || n > 8) rc = fail(T, "grids '%s' parsed as %d sizes", s, n);
            for (int i = 0; i < n && !rc; i++)
                if (g[i] < 1 || g[i] > 8) rc = fail(T, "grids '%s': a size %d", s, g[i]);
            kiln_cis_view v[1 + 4 + 9 + 16 + 25 + 36 + 49 + 64];
            if (!rc) {
                const int nv = kiln_cis_views(640, 480, g, n, v, (int)(sizeof v / sizeof *v));
                for (int i = 0; i < nv && !rc; i++)
                    if (v[i].x < 0 || v[i].y < 0 || v[i].w < 1 || v[i].h < 1 || v[i].x + v[i].w > 640 ||
                        v[i].y + v[i].h > 480)
                        rc = fail(T, "grids '%s': view %d outside the image", s, i);
            }
        }
        if (!rc) rc = drop(T, e);
    }
    }
    free(s);
    return rc;
}

/* ---- a sharded model directory: model.safetensors.index.json against the committed shards ---- */

static int fuzz_st_index(const uint8_t *data, size_t size) {
    const char *T = "st_index";
    if (!tmp_ready()) return 0;
    if (!tmp_paths[1][0]) /* the fixture's four shards, linked beside the index (slots 1-4) */
        for (int k = 1; k <= 4; k++) {
            snprintf(tmp_paths[k], sizeof tmp_paths[k], "%s/model-%05d-of-00004.safetensors", tmp_dir, k);
            char target[1024];
            snprintf(target, sizeof target, "%s/tests/fixtures/zaya/bf16_sharded/model-%05d-of-00004.safetensors",
                     KILN_SOURCE_DIR, k);
            if (symlink(target, tmp_paths[k])) return fail(T, "cannot link %s", target);
        }
    if (!tmp_file(0, "model.safetensors.index.json", data, size)) return 0;
    kiln_st *st = NULL;
    kiln_error *e = kiln_st_open_dir(tmp_dir, &st);
    if (e) return drop(T, e);
    int rc = 0;
    for (size_t i = 0; i < kiln_st_count(st) && !rc; i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        if (kiln_st_find(st, t->name) != t) rc = fail(T, "tensor '%s' is not found by its name", t->name);
    }
    kiln_st_close(st);
    return rc;
}

/* ---- a token data directory's index.json: read, written, read again and written the same ---- */

static int fuzz_data_index(const uint8_t *data, size_t size) {
    const char *T = "data_index";
    if (!tmp_file(0, "index.json", data, size)) return 0;
    kiln_data_index *ix = NULL;
    kiln_error *e = kiln_data_index_read(tmp_dir, &ix);
    if (e) return drop(T, e);
    int rc = 0;
    char sub[96];
    snprintf(sub, sizeof sub, "%s/w", tmp_dir);
    mkdir(sub, 0700);
    snprintf(tmp_paths[5], sizeof tmp_paths[5], "%s/index.json", sub);
    e = kiln_data_index_write(sub, ix);
    if (e) {
        rc = fail(T, "an index read does not write: %s", kiln_error_msg(e));
        kiln_error_free(e);
    } else {
        kiln_data_index *ix2 = NULL;
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        e = kiln_read_file(tmp_paths[5], &a, &na);
        if (!e) e = kiln_data_index_read(sub, &ix2);
        if (!e) e = kiln_data_index_write(sub, ix2);
        if (!e) e = kiln_read_file(tmp_paths[5], &b, &nb);
        if (e) {
            rc = fail(T, "the index written back does not read or write again: %s", kiln_error_msg(e));
            kiln_error_free(e);
        } else if (na != nb || memcmp(a, b, na))
            rc = fail(T, "written back, read and written again differs:\n%.*s\n%.*s", (int)na, a, (int)nb, b);
        free(a);
        free(b);
        kiln_data_index_free(ix2);
    }
    kiln_data_index_free(ix);
    unlink(tmp_paths[5]);
    rmdir(sub);
    return rc;
}

/* ---- a checkpoint's manifest.json beside the committed two-rank checkpoint (tests/fuzz/ckpt_step) ---- */

static int fuzz_ckpt_manifest(const uint8_t *data, size_t size) {
    const char *T = "ckpt_manifest";
    if (!tmp_ready()) return 0;
    char step[128], p[400];
    snprintf(step, sizeof step, "%s/step_00000002", tmp_dir);
    if (!tmp_paths[6][0]) { /* the shards linked, the marker written (slots 6, 7) */
        if (mkdir(step, 0700)) return fail(T, "cannot make %s", step);
        snprintf(tmp_paths[6], sizeof tmp_paths[6], "%s", step);
        for (int r = 0; r < 2; r++) {
            char target[1024];
            snprintf(target, sizeof target, "%s/tests/fuzz/ckpt_step/rank_%05d.safetensors", KILN_SOURCE_DIR, r);
            snprintf(p, sizeof p, "%s/rank_%05d.safetensors", step, r);
            if (symlink(target, p)) return fail(T, "cannot link %s", target);
        }
        snprintf(p, sizeof p, "%s/COMMITTED", step);
        FILE *f = fopen(p, "w");
        if (!f || fputs("ok\n", f) < 0 || fclose(f)) return fail(T, "cannot write %s", p);
    }
    snprintf(p, sizeof p, "%s/manifest.json", step);
    FILE *f = fopen(p, "wb");
    if (!f) return 0;
    const int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) || !ok) return 0;
    int rc = 0;
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        drop(T, kiln_ckpt_describe(step, devnull));
        fclose(devnull);
    }
    ckpt_src s;
    kiln_error *e = ckpt_src_open(step, NULL, &s);
    if (e) return drop(T, e);
    /* what opens is whole: every tensor's parameters and state in its owner's shard, at the table's sizes */
    for (int t = 0; t < s.table.nparams && !rc; t++) {
        const kiln_st_tensor *a = ckpt_src_tensor(&s, "param", t), *b = ckpt_src_tensor(&s, "opt", t);
        if (!a || !b || a->numel != s.table.params[t].numel || a->dtype != KILN_DT_F32)
            rc = fail(T, "tensor '%s' opened without its parameters or state", s.table.params[t].name);
    }
    ckpt_src_close(&s);
    return rc;
}

/* ---- CLIP: config.json (byte 0 even) or preprocessor_config.json (odd) ---- */

static int fuzz_clip_config(const uint8_t *data, size_t size) {
    const char *T = "clip_config";
    if (!size) return 0;
    const char *path = tmp_file(0, "config.json", data + 1, size - 1);
    if (!path) return 0;
    int rc = 0;
    if (data[0] % 2 == 0) {
        clip_tower_cfg tc, vc;
        int proj = 0;
        kiln_error *e = kiln_clip_read_config(path, &tc, &vc, &proj);
        if (e) return drop(T, e);
        const clip_tower_cfg *c[2] = {&tc, &vc};
        for (int i = 0; i < 2 && !rc; i++)
            if (c[i]->hidden < 1 || c[i]->heads < 1 || c[i]->hidden % c[i]->heads || c[i]->layers < 1 ||
                c[i]->inter < 1 || !(c[i]->eps >= 0 && isfinite(c[i]->eps)))
                rc = fail(T, "a %s tower accepted with hidden %d, heads %d, layers %d, inter %d, eps %g",
                          i ? "vision" : "text", c[i]->hidden, c[i]->heads, c[i]->layers, c[i]->inter, c[i]->eps);
        if (!rc && (vc.patch_size < 1 || vc.image_size < vc.patch_size || vc.image_size % vc.patch_size || proj < 1 ||
                    tc.vocab < 1))
            rc = fail(T, "accepted: image %d, patch %d, projection %d, vocab %lld", vc.image_size, vc.patch_size, proj,
                      (long long)tc.vocab);
    } else {
        clip_preproc_cfg p;
        kiln_error *e = kiln_clip_read_preproc(path, &p);
        if (e) return drop(T, e);
        if ((p.do_resize && !(p.resize_shortest > 0 || (p.resize_h > 0 && p.resize_w > 0))) ||
            (p.do_center_crop && !(p.crop_h > 0 && p.crop_w > 0)))
            rc = fail(T, "a resize or crop to nothing accepted");
        for (int i = 0; i < 3 && !rc; i++)
            if (!isfinite(p.mean[i]) || !isfinite(p.std[i]) || p.std[i] == 0 || !isfinite(p.rescale_factor))
                rc = fail(T, "mean %g, std %g, rescale %g accepted", p.mean[i], p.std[i], p.rescale_factor);
    }
    return rc;
}

/* ---- JSON itself (kiln_json_parse: cJSON behind kiln's depth, size and message rules) ---- */

static int fuzz_json(const uint8_t *data, size_t size) {
    cJSON *j = NULL;
    kiln_error *e = kiln_json_parse((const char *)data, size, "fuzz", &j);
    cJSON_Delete(j);
    return drop("json", e);
}

/* ---- kiln run's ft_state.json: parsed, written and parsed again to the same values ---- */

/* A small history (dense part of 64, windows of 8) so that inputs reach the anchors' budget and the dense part's
 * overflow into anchors. */
#define FT_HIST_WINDOW 8
#define FT_HIST_CAP 64

typedef struct {
    kiln_step_ranges skip;
    int64_t reject;
    ft_hist h;
} ft_state_vals;

/* 1 parsed, 0 refused (with a message), -1 an invariant broken */
static int ft_state_read(const char *T, const char *text, size_t len, ft_state_vals *v) {
    v->reject = -1;
    kiln_error *e = ft_hist_init(&v->h, FT_HIST_WINDOW, FT_HIST_CAP);
    if (e) return drop(T, e) ? -1 : 0;
    e = ft_state_parse(text, len, "ft_state.json", &v->skip, &v->reject, &v->h);
    if (e) return drop(T, e) ? -1 : 0;
    const ft_hist *h = &v->h;
    if (v->reject < 0 || h->n < 0 || h->n > FT_HIST_CAP || (h->n && h->from > h->step[0]))
        return fail(T, "reject_from %lld, %d history entries, complete from %lld", (long long)v->reject, h->n,
                    (long long)h->from);
    for (int i = 0; i < h->n; i++)
        if (h->step[i] < 1 || (i && h->step[i] <= h->step[i - 1]) || !isfinite(h->loss[i]))
            return fail(T, "history entry %d: step %lld, loss %g", i, (long long)h->step[i], h->loss[i]);
    int64_t held = 0;
    if (h->nanchor > FT_ANCHOR_MAX) return fail(T, "%d anchors", h->nanchor);
    for (int i = 0; i < h->nanchor; i++) {
        const ft_anchor *an = &h->anchor[i];
        if ((i && an->end <= h->anchor[i - 1].end) || an->n < 1 || an->n > FT_HIST_WINDOW || an->step[an->n - 1] > an->end)
            return fail(T, "anchor %d: end %lld, %d losses", i, (long long)an->end, an->n);
        for (int j = 0; j < an->n; j++)
            if (an->step[j] < 1 || (j && an->step[j] <= an->step[j - 1]) || !isfinite(an->loss[j]))
                return fail(T, "anchor %d, entry %d: step %lld, loss %g", i, j, (long long)an->step[j], an->loss[j]);
        held += an->n;
    }
    if (held != h->anchored || held > ft_hist_budget(FT_HIST_CAP))
        return fail(T, "the anchors hold %lld losses, counted %lld", (long long)held, (long long)h->anchored);
    /* every anchor is one of the rules': a checkpoint's among the newest FT_ANCHOR_CKPT_KEEP of those, or a round
     * step's within its reach of the newest step held */
    int64_t newest = h->n ? h->step[h->n - 1] : 0;
    if (h->nanchor && h->anchor[h->nanchor - 1].end > newest) newest = h->anchor[h->nanchor - 1].end;
    for (int i = h->nanchor - 1, ck = 0; i >= 0; i--) {
        const int mine = h->anchor[i].ckpt && ck < FT_ANCHOR_CKPT_KEEP;
        ck += h->anchor[i].ckpt;
        if (!mine && !ft_hist_keeps(h->anchor[i].end, newest))
            return fail(T, "anchor %d (step %lld%s) kept by no rule at step %lld", i, (long long)h->anchor[i].end,
                        h->anchor[i].ckpt ? ", a checkpoint's" : "", (long long)newest);
    }
    return 1;
}

/* b's step/loss[0..nb) are a's [0..na) less the steps of skipped windows, bit for bit (0), or a message (-1) */
static int ft_same_pairs(const char *T, const char *what, const kiln_step_ranges *skip, const int64_t *as,
                         const double *al, int na, const int64_t *bs, const double *bl, int nb, const char *text,
                         size_t n) {
    int k = 0;
    for (int i = 0; i < na; i++) {
        if (kiln_step_ranges_contains(skip, as[i])) continue;
        if (k >= nb || bs[k] != as[i] || memcmp(&bl[k], &al[i], sizeof(double)))
            return fail(T, "%s entry [%lld, %.17g] read back as entry %d of %d:\n%.*s", what, (long long)as[i], al[i], k,
                        nb, (int)n, text);
        k++;
    }
    if (k != nb) return fail(T, "%s: %d entries read back as %d", what, k, nb);
    return 0;
}

/* The text written from what was read reads back as the same values: the skip windows, reject_from, every entry of
 * the dense history outside a skipped window (those are left out on purpose), and every anchor with a loss outside
 * them, bit for bit, a checkpoint's as one. */
static int fuzz_ft_state(const uint8_t *data, size_t size) {
    const char *T = "ft_state";
    ft_state_vals a = {0}, b = {0};
    char *text = NULL;
    size_t n = 0;
    int rc = ft_state_read(T, (const char *)data, size, &a);
    if (rc == 1) {
        kiln_error *e = ft_state_format(&a.skip, a.reject, &a.h, &text, &n);
        if (e) {
            rc = fail(T, "a parsed state does not format: %s", kiln_error_msg(e));
            kiln_error_free(e);
        }
    }
    if (rc == 1) {
        const int r2 = ft_state_read(T, text, n, &b);
        if (r2 != 1) rc = r2 < 0 ? -1 : fail(T, "its own text is refused:\n%.*s", (int)n, text);
    }
    if (rc == 1) {
        char *sa = kiln_step_ranges_text(&a.skip), *sb = kiln_step_ranges_text(&b.skip);
        rc = 0;
        if (!sa || !sb || strcmp(sa, sb) || a.reject != b.reject)
            rc = fail(T, "skip '%s' / reject_from %lld read back as '%s' / %lld", sa ? sa : "?", (long long)a.reject,
                      sb ? sb : "?", (long long)b.reject);
        if (!rc)
            rc = ft_same_pairs(T, "history", &a.skip, a.h.step, a.h.loss, a.h.n, b.h.step, b.h.loss, b.h.n, text, n);
        int k = 0;
        for (int i = 0; !rc && i < a.h.nanchor; i++) {
            const ft_anchor *x = &a.h.anchor[i];
            int left = 0;
            for (int j = 0; j < x->n; j++) left += !kiln_step_ranges_contains(&a.skip, x->step[j]);
            if (!left) continue; /* a window all skipped is not written */
            if (k >= b.h.nanchor || b.h.anchor[k].end != x->end || b.h.anchor[k].ckpt != x->ckpt)
                rc = fail(T, "the anchor at step %lld%s read back as anchor %d of %d:\n%.*s", (long long)x->end,
                          x->ckpt ? " (a checkpoint's)" : "", k, b.h.nanchor, (int)n, text);
            else
                rc = ft_same_pairs(T, "anchor", &a.skip, x->step, x->loss, x->n, b.h.anchor[k].step, b.h.anchor[k].loss,
                                   b.h.anchor[k].n, text, n);
            k++;
        }
        if (!rc && k != b.h.nanchor) rc = fail(T, "%d anchors read back as %d", k, b.h.nanchor);
        free(sa), free(sb);
    }
    kiln_step_ranges_free(&a.skip), kiln_step_ranges_free(&b.skip);
    ft_hist_free(&a.h), ft_hist_free(&b.h);
    free(text);
    return rc < 0 ? -1 : 0;
}

const kiln_fuzz_target kiln_fuzz_targets[] = {
    {"safetensors", fuzz_safetensors, "a .safetensors file: opened, every tensor read, written back and compared"},
    {"image", fuzz_image, "a PNG or JPEG file: decoded and resized"},
    {"tokenizer_json", fuzz_tokenizer_json, "a tokenizer.json: loaded, then five texts encoded and decoded"},
    {"tokenizer_text", fuzz_tokenizer_text, "byte 0 picks a committed tokenizer, the rest is the text: ids in range, "
                                            "byte-level BPE decodes to the same bytes"},
    {"zaya_config", fuzz_zaya_config, "a ZAYA config.json: parsed, written back, parsed and written again the same"},
    {"train_config", fuzz_train_config, "a training config: parsed, written back, parsed and written again the same"},
    {"hw_profile", fuzz_hw_profile, "a kiln size hardware profile"},
    {"cis_suite", fuzz_cis_suite, "a CIS prompt suite (JSON Lines): every accepted prompt whole and unique"},
    {"cis_manifest", fuzz_cis_manifest, "a CIS run manifest (JSON Lines)"},
    {"cis_detections", fuzz_cis_detections, "an object detector's output for a CIS run (JSON Lines)"},
    {"flags", fuzz_flags, "byte 0 picks a flag parser (step ranges, faults, size lists, counts, grids); the rest is "
                          "the flag's value"},
    {"st_index", fuzz_st_index, "a sharded model's model.safetensors.index.json, over the committed shards"},
    {"data_index", fuzz_data_index, "a token data directory's index.json: read, written back, read and written again "
                                    "the same"},
    {"clip_config", fuzz_clip_config, "byte 0 picks CLIP's config.json (even) or preprocessor_config.json (odd): "
                                      "every accepted tower and preprocessing usable"},
    {"ckpt_manifest", fuzz_ckpt_manifest, "a checkpoint's manifest.json beside a committed two-rank checkpoint: "
                                          "verified, described and opened for conversion; what opens is whole"},
    {"ft_state", fuzz_ft_state, "kiln run's ft_state.json: parsed, written back and parsed to the same values"},
    {"json", fuzz_json, "JSON text through kiln_json_parse"},
    {NULL, NULL, NULL},
};

const kiln_fuzz_target *kiln_fuzz_find(const char *name) {
    for (const kiln_fuzz_target *t = kiln_fuzz_targets; t->name; t++)
        if (!strcmp(t->name, name)) return t;
    return NULL;
}
