/* safetensors reader (mmap + full validation) and writer (atomic).
 * See include/kiln/safetensors.h for the format.
 *
 * The reader trusts nothing in the file: every size, offset and name is
 * checked before a pointer into the mapping is handed out, and every error
 * names the file, the tensor and the numbers involved. The layout rules are
 * the reference implementation's (huggingface/safetensors): 100 MB header
 * cap, UTF-8 JSON object, byte ranges that tile the data buffer exactly.
 * We are stricter where it is lenient (duplicate names, unknown fields in a
 * tensor entry are errors here) and lenient in one spot it is not: cJSON
 * keeps numbers as doubles, so a dim written as 4.0 or 4e0 reads as 4.
 * The writer produces the same bytes as the reference for the same order.
 */
#include "kiln/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"

/* Tensor bytes are little-endian and handed out without swapping. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln assumes a little-endian host"
#endif

/* Largest integer a double (cJSON's number type) holds exactly. Offsets and
 * dims beyond it cannot be read faithfully; no real file gets near it. */
#define MAX_EXACT_INT 9007199254740992.0 /* 2^53 */

typedef struct {
    char *path;
    void *map;       /* whole file, PROT_READ; NULL until mapped */
    size_t map_len;
    size_t first;    /* this file's tensors are st->tensors[first, first+count) */
    size_t count;
} st_file;

typedef struct {
    char *key, *value;
} st_meta;

struct kiln_st {
    st_file *files;
    size_t nfiles;
    kiln_st_tensor *tensors; /* file order: by file, then by data offset */
    size_t ntensors;
    const kiln_st_tensor **by_name; /* sorted by name, for kiln_st_find */
    st_meta *meta;                  /* the first file's __metadata__, sorted by key */
    size_t nmeta;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static kiln_error *oom(const char *path) { return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path); }

/* "[2,3,4]" into buf (large enough for KILN_ST_MAX_DIMS 20-digit dims). */
#define SHAPE_BUF 200
static const char *fmt_shape(const int64_t *shape, int ndim, char *buf) {
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < ndim && k < SHAPE_BUF - 24; i++)
        k += (size_t)snprintf(buf + k, SHAPE_BUF - k, i ? ",%" PRId64 : "%" PRId64, shape[i]);
    buf[k++] = ']';
    buf[k] = 0;
    return buf;
}

/* Room for kiln_json_describe: 1.5, "F32", array... */
#define DESC_BUF 64

/* A JSON number that is a non-negative integer we can represent exactly. */
static int json_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MAX_EXACT_INT) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* a*b into *out; returns 1 on overflow (the checks the C standard lacks). */
static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a && b > UINT64_MAX / a) return 1;
    *out = a * b;
    return 0;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return 1;
    *out = a + b;
    return 0;
}

/* Position of the first byte that is not well-formed UTF-8 (overlong forms,
 * surrogates and code points past U+10FFFF are ill-formed), or len if none. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) n = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            if (c == 0xe0) lo = 0xa0;      /* no overlongs */
            if (c == 0xed) hi = 0x9f;      /* no surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            if (c == 0xf0) lo = 0x90;      /* no overlongs */
            if (c == 0xf4) hi = 0x8f;      /* <= U+10FFFF */
        } else
            return i;
        if (n >= len - i) return i; /* sequence cut off by the end */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= n; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
        i += n + 1;
    }
    return len;
}

/* ------------------------------------------------------------------------ */
/* Reading: one tensor entry of the header                                   */
/* ------------------------------------------------------------------------ */

/* A tensor while its file is being validated: the public record plus its
 * byte range in the data buffer and its position in the header. */
typedef struct {
    kiln_st_tensor t;
    uint64_t begin, end;
    size_t header_index;
} pending;

static kiln_error *parse_shape(const char *path, const char *name, const cJSON *js, pending *p) {
    char desc[DESC_BUF];
    if (!cJSON_IsArray(js))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': shape must be an array, got %s", path, name,
                           kiln_json_describe(js, desc, DESC_BUF));
    int ndim = cJSON_GetArraySize(js);
    if (ndim > KILN_ST_MAX_DIMS)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': shape has %d dimensions, at most %d are supported", path,
                           name, ndim, KILN_ST_MAX_DIMS);
    p->t.ndim = ndim;
    uint64_t numel = 1;
    int overflow = 0, i = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_u64(d, &v))
            return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': shape[%d] must be a non-negative integer, got %s",
                               path, name, i, kiln_json_describe(d, desc, DESC_BUF));
        p->t.shape[i] = (int64_t)v;
        if (mul_u64(numel, v, &numel) || numel > (uint64_t)INT64_MAX) overflow = 1;
    }
    char sb[SHAPE_BUF];
    if (overflow)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': shape %s has more elements than fit in 64 bits", path,
                           name, fmt_shape(p->t.shape, ndim, sb));
    p->t.numel = (int64_t)numel;
    return NULL;
}

static kiln_error *parse_offsets(const char *path, const char *name, const cJSON *jo, pending *p) {
    char d0[DESC_BUF], d1[DESC_BUF];
    if (cJSON_IsArray(jo) && cJSON_GetArraySize(jo) != 2)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': data_offsets must be [begin, end], got %d numbers", path,
                           name, cJSON_GetArraySize(jo));
    if (!cJSON_IsArray(jo))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': data_offsets must be an array [begin, end], got %s", path,
                           name, kiln_json_describe(jo, d0, DESC_BUF));
    const cJSON *b = jo->child, *e = b->next;
    if (!json_u64(b, &p->begin) || !json_u64(e, &p->end))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': data_offsets must be non-negative integers, got [%s,%s]",
                           path, name, kiln_json_describe(b, d0, DESC_BUF), kiln_json_describe(e, d1, DESC_BUF));
    if (p->begin > p->end)
        return kiln_errorf(KILN_EFORMAT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] end before they begin", path,
                           name, p->begin, p->end);
    return NULL;
}

/* Validate one "name": {dtype, shape, data_offsets} entry against a data
 * buffer of buf_len bytes. On success p->t.name is a malloc'd copy. */
static kiln_error *parse_tensor(const char *path, const cJSON *node, size_t buf_len, pending *p) {
    const char *name = node->string;
    char desc[DESC_BUF];
    if (!cJSON_IsObject(node))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': entry must be a JSON object, got %s", path, name,
                           kiln_json_describe(node, desc, DESC_BUF));
    /* Exactly these three fields, each once: anything else means the file was
     * written by something we do not understand. */
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *c = node->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0          ? &jd
                             : strcmp(c->string, "shape") == 0        ? &js
                             : strcmp(c->string, "data_offsets") == 0 ? &jo
                                                                      : NULL;
        if (!slot) return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': unknown field '%s'", path, name, c->string);
        if (*slot) return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': field '%s' appears twice", path, name, c->string);
        *slot = c;
    }
    const char *absent = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
    if (absent) return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': missing field '%s'", path, name, absent);

    if (!cJSON_IsString(jd))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': dtype must be a string, got %s", path, name,
                           kiln_json_describe(jd, desc, DESC_BUF));
    p->t.dtype = kiln_dtype_from_name(jd->valuestring);
    if (p->t.dtype == KILN_DT_INVALID)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name, jd->valuestring);
    KILN_TRY(parse_shape(path, name, js, p));
    KILN_TRY(parse_offsets(path, name, jo, p));

    char sb[SHAPE_BUF];
    uint64_t need, have = p->end - p->begin;
    if (mul_u64((uint64_t)p->t.numel, kiln_dtype_size(p->t.dtype), &need))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s': %s shape %s has more bytes than fit in 64 bits", path, name,
                           kiln_dtype_name(p->t.dtype), fmt_shape(p->t.shape, p->t.ndim, sb));
    if (need != have)
        return kiln_errorf(KILN_EFORMAT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64
                           " bytes but %s shape %s needs %" PRIu64,
                           path, name, p->begin, p->end, have, kiln_dtype_name(p->t.dtype),
                           fmt_shape(p->t.shape, p->t.ndim, sb), need);
    if (p->end > buf_len)
        return kiln_errorf(KILN_EFORMAT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                           "] extend past the end of the data buffer (%zu bytes)",
                           path, name, p->begin, p->end, buf_len);
    p->t.nbytes = (size_t)need;
    p->t.name = strdup(name);
    if (!p->t.name) return oom(path);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Reading: __metadata__                                                     */
/* ------------------------------------------------------------------------ */

static int cmp_meta(const void *a, const void *b) {
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

static void free_meta(st_meta *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(m[i].key);
        free(m[i].value);
    }
    free(m);
}

/* {"key": "value", ...}: string values only, keys unique. */
static kiln_error *parse_metadata(const char *path, const cJSON *node, st_meta **out, size_t *nout) {
    char desc[DESC_BUF];
    *out = NULL;
    *nout = 0;
    if (!cJSON_IsObject(node))
        return kiln_errorf(KILN_EFORMAT, "%s: __metadata__ must be an object of strings, got %s", path,
                           kiln_json_describe(node, desc, DESC_BUF));
    size_t n = (size_t)cJSON_GetArraySize(node);
    st_meta *m = calloc(n ? n : 1, sizeof *m);
    if (!m) return oom(path);
    size_t k = 0;
    for (const cJSON *c = node->child; c; c = c->next, k++) {
        if (!cJSON_IsString(c)) {
            free_meta(m, k);
            return kiln_errorf(KILN_EFORMAT, "%s: __metadata__ key '%s' must have a string value, got %s", path,
                               c->string, kiln_json_describe(c, desc, DESC_BUF));
        }
        m[k].key = strdup(c->string);
        m[k].value = strdup(c->valuestring);
        if (!m[k].key || !m[k].value) {
            free_meta(m, k + 1);
            return oom(path);
        }
    }
    qsort(m, n, sizeof *m, cmp_meta);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(m[i - 1].key, m[i].key) == 0) {
            kiln_error *e = kiln_errorf(KILN_EFORMAT, "%s: __metadata__ key '%s' appears twice", path, m[i].key);
            free_meta(m, n);
            return e;
        }
    }
    *out = m;
    *nout = n;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Reading: one file                                                          */
/* ------------------------------------------------------------------------ */

static int cmp_offsets(const void *a, const void *b) {
    const pending *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->header_index < y->header_index ? -1 : x->header_index > y->header_index;
}

/* The reference library's rule: sorted by offset, each tensor starts exactly
 * where the previous one ended, and the last ends at the end of the buffer.
 * So no overlaps, no holes, no trailing garbage. */
static kiln_error *check_coverage(const char *path, const pending *p, size_t n, size_t buf_len) {
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].begin < pos)
            return kiln_errorf(KILN_EFORMAT,
                               "%s: tensor '%s' data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor '%s' [%" PRIu64
                               ",%" PRIu64 "]",
                               path, p[i].t.name, p[i].begin, p[i].end, p[i - 1].t.name, p[i - 1].begin, p[i - 1].end);
        if (p[i].begin > pos) {
            if (i == 0)
                return kiln_errorf(KILN_EFORMAT,
                                   "%s: hole in the data buffer: bytes [0,%" PRIu64
                                   ") belong to no tensor (before tensor '%s')",
                                   path, p[i].begin, p[i].t.name);
            return kiln_errorf(KILN_EFORMAT,
                               "%s: hole in the data buffer: bytes [%" PRIu64 ",%" PRIu64
                               ") belong to no tensor (between tensor '%s' and tensor '%s')",
                               path, pos, p[i].begin, p[i - 1].t.name, p[i].t.name);
        }
        pos = p[i].end;
    }
    if (pos != buf_len)
        return kiln_errorf(KILN_EFORMAT,
                           "%s: data buffer is %zu bytes but the tensors cover only [0,%" PRIu64
                           "): %" PRIu64 " trailing bytes belong to no tensor",
                           path, buf_len, pos, (uint64_t)buf_len - pos);
    return NULL;
}

/* Bytes of the JSON header that JSON forbids anyway (raw control characters)
 * or that are not UTF-8, reported with their position in the file. */
static kiln_error *check_header_bytes(const char *path, const unsigned char *h, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned c = h[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return kiln_errorf(KILN_EFORMAT, "%s: header has control byte 0x%02x at file byte %zu", path, c, 8 + i);
    }
    size_t bad = utf8_invalid_at(h, len);
    if (bad < len)
        return kiln_errorf(KILN_EFORMAT, "%s: header is not valid UTF-8 at file byte %zu (byte 0x%02x)", path, 8 + bad,
                           h[bad]);
    return NULL;
}

/* Parse and validate the header of the mapped file f, appending its tensors
 * (in offset order) to st. */
static kiln_error *parse_file(kiln_st *st, st_file *f, int keep_metadata) {
    const char *path = f->path;
    const unsigned char *bytes = f->map;
    size_t size = f->map_len;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    if (hlen > KILN_ST_MAX_HEADER)
        return kiln_errorf(KILN_EFORMAT, "%s: header length %" PRIu64 " exceeds the limit of %u bytes", path, hlen,
                           KILN_ST_MAX_HEADER);
    if (hlen > size - 8)
        return kiln_errorf(KILN_EFORMAT,
                           "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes, so at most %zu)",
                           path, hlen, size, size - 8);
    const char *hdr = (const char *)bytes + 8;
    KILN_TRY(check_header_bytes(path, (const unsigned char *)hdr, (size_t)hlen));

    cJSON *root;
    kiln_error *e = kiln_json_parse(hdr, (size_t)hlen, NULL, &root);
    if (e) return kiln_error_wrap(e, "%s: header", path);
    size_t buf_len = size - 8 - (size_t)hlen;
    const unsigned char *buf = bytes + 8 + hlen;

    char desc[DESC_BUF];
    pending *p = NULL;
    size_t np = 0;
    st_meta *meta = NULL;
    size_t nmeta = 0;
    int seen_meta = 0;
    if (!cJSON_IsObject(root)) {
        e = kiln_errorf(KILN_EFORMAT, "%s: header must be a JSON object, got %s", path,
                        kiln_json_describe(root, desc, DESC_BUF));
        goto done;
    }
    size_t nkeys = (size_t)cJSON_GetArraySize(root);
    p = calloc(nkeys ? nkeys : 1, sizeof *p);
    if (!p) {
        e = oom(path);
        goto done;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (seen_meta) {
                e = kiln_errorf(KILN_EFORMAT, "%s: __metadata__ appears twice", path);
                goto done;
            }
            seen_meta = 1;
            if ((e = parse_metadata(path, c, &meta, &nmeta))) goto done;
            continue;
        }
        p[np].header_index = np;
        if ((e = parse_tensor(path, c, buf_len, &p[np]))) goto done;
        p[np].t.file = path;
        p[np].t.data = buf + p[np].begin;
        np++;
    }
    qsort(p, np, sizeof *p, cmp_offsets);
    if ((e = check_coverage(path, p, np, buf_len))) goto done;

    kiln_st_tensor *grown = realloc(st->tensors, (st->ntensors + np + 1) * sizeof *grown);
    if (!grown) {
        e = oom(path);
        goto done;
    }
    st->tensors = grown;
    f->first = st->ntensors;
    f->count = np;
    for (size_t i = 0; i < np; i++) st->tensors[st->ntensors++] = p[i].t;
    np = 0; /* names now belong to st */
    if (keep_metadata) {
        st->meta = meta;
        st->nmeta = nmeta;
        meta = NULL;
        nmeta = 0;
    }
done:
    for (size_t i = 0; i < np; i++) free((void *)p[i].t.name);
    free(p);
    free_meta(meta, nmeta);
    cJSON_Delete(root);
    return e;
}

/* Map path and append its tensors to st. The file is registered in st first
 * so that kiln_st_close cleans up whatever happens. */
static kiln_error *load_file(kiln_st *st, const char *path) {
    st_file *files = realloc(st->files, (st->nfiles + 1) * sizeof *files);
    if (!files) return oom(path);
    st->files = files;
    st_file *f = &st->files[st->nfiles];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return oom(path);
    st->nfiles++;

    int fd;
    uint64_t fsize;
    KILN_TRY(kiln_open_regular(path, &fd, &fsize));
    size_t size = (size_t)fsize;
    if (size < 8) {
        close(fd);
        if (size == 0)
            return kiln_errorf(KILN_EFORMAT, "%s: file is empty (0 bytes); expected an 8-byte header length", path);
        return kiln_errorf(KILN_EFORMAT, "%s: file is only %zu bytes, too short for the 8-byte header length", path,
                           size);
    }
    /* MAP_PRIVATE + PROT_READ: pages are loaded on first touch, so opening a
     * 100 GB checkpoint costs only the header. (If another process truncates
     * the file while it is mapped, touching the lost pages raises SIGBUS;
     * that is the price of zero-copy and is true of every mmap reader.) */
    KILN_TRY(kiln_mmap_close(fd, path, size, &f->map));
    f->map_len = size;
    return parse_file(st, f, st->nfiles == 1);
}

/* ------------------------------------------------------------------------ */
/* The name index                                                             */
/* ------------------------------------------------------------------------ */

static int cmp_by_name(const void *a, const void *b) {
    const kiln_st_tensor *x = *(const kiln_st_tensor *const *)a, *y = *(const kiln_st_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x < y ? -1 : x > y; /* same name: keep file order, for the message */
}

/* Sort pointers by name for kiln_st_find, rejecting duplicate names. */
static kiln_error *build_index(kiln_st *st) {
    st->by_name = malloc((st->ntensors + 1) * sizeof *st->by_name);
    if (!st->by_name) return oom(st->nfiles ? st->files[0].path : "safetensors");
    for (size_t i = 0; i < st->ntensors; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, st->ntensors, sizeof *st->by_name, cmp_by_name);
    for (size_t i = 1; i < st->ntensors; i++) {
        const kiln_st_tensor *a = st->by_name[i - 1], *b = st->by_name[i];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file) return kiln_errorf(KILN_EFORMAT, "%s: duplicate tensor name '%s'", a->file, a->name);
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is also in %s", a->file, a->name, b->file);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Public reader API                                                          */
/* ------------------------------------------------------------------------ */

void kiln_st_close(kiln_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->ntensors; i++) free((void *)st->tensors[i].name);
    for (size_t i = 0; i < st->nfiles; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_len);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->tensors);
    free(st->by_name);
    free_meta(st->meta, st->nmeta);
    free(st);
}

kiln_error *kiln_st_open(const char *path, kiln_st **out) {
    *out = NULL;
    kiln_st *st = calloc(1, sizeof *st);
    if (!st) return oom(path);
    kiln_error *e = load_file(st, path);
    if (!e) e = build_index(st);
    if (e) {
        kiln_st_close(st);
        return e;
    }
    *out = st;
    return NULL;
}

size_t kiln_st_count(const kiln_st *st) { return st->ntensors; }

const kiln_st_tensor *kiln_st_at(const kiln_st *st, size_t i) { return i < st->ntensors ? &st->tensors[i] : NULL; }

static int cmp_find(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const kiln_st_tensor *const *)elem)->name);
}

const kiln_st_tensor *kiln_st_find(const kiln_st *st, const char *name) {
    if (!st->ntensors) return NULL;
    const kiln_st_tensor *const *hit = bsearch(name, st->by_name, st->ntensors, sizeof *st->by_name, cmp_find);
    return hit ? *hit : NULL;
}

static int cmp_meta_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const st_meta *)elem)->key);
}

const char *kiln_st_metadata(const kiln_st *st, const char *key) {
    if (!st->nmeta) return NULL;
    const st_meta *m = bsearch(key, st->meta, st->nmeta, sizeof *st->meta, cmp_meta_key);
    return m ? m->value : NULL;
}

/* ------------------------------------------------------------------------ */
/* Sharded directories                                                        */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *tensor, *shard; /* point into the index's cJSON tree */
    int seen;                   /* found in its shard */
} map_entry;

static int cmp_map_entry(const void *a, const void *b) {
    return strcmp(((const map_entry *)a)->tensor, ((const map_entry *)b)->tensor);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A shard must live next to the index: no directories, no way out. */
static int plain_file_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Read weight_map into a name-sorted array, checking every entry. */
static kiln_error *read_weight_map(const char *index, const cJSON *root, map_entry **out, size_t *nout) {
    char desc[DESC_BUF];
    *out = NULL;
    *nout = 0;
    if (!cJSON_IsObject(root))
        return kiln_errorf(KILN_EFORMAT, "%s: must be a JSON object, got %s", index,
                           kiln_json_describe(root, desc, DESC_BUF));
    const cJSON *wm;
    KILN_TRY(kiln_json_get_object(root, "weight_map", &wm, 1, index));
    size_t n = (size_t)cJSON_GetArraySize(wm);
    if (n == 0) return kiln_errorf(KILN_EFORMAT, "%s: weight_map is empty", index);
    map_entry *m = calloc(n, sizeof *m);
    if (!m) return oom(index);
    size_t k = 0;
    for (const cJSON *c = wm->child; c; c = c->next, k++) {
        if (!cJSON_IsString(c)) {
            free(m);
            return kiln_errorf(KILN_EFORMAT, "%s: weight_map['%s'] must be a shard file name, got %s", index,
                               c->string, kiln_json_describe(c, desc, DESC_BUF));
        }
        if (!plain_file_name(c->valuestring)) {
            kiln_error *e = kiln_errorf(KILN_EFORMAT,
                                        "%s: weight_map['%s']: shard '%s' must be a plain file name in the same "
                                        "directory (no '/', not '.' or '..')",
                                        index, c->string, c->valuestring);
            free(m);
            return e;
        }
        m[k].tensor = c->string;
        m[k].shard = c->valuestring;
    }
    qsort(m, n, sizeof *m, cmp_map_entry);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(m[i - 1].tensor, m[i].tensor) == 0) {
            kiln_error *e = kiln_errorf(KILN_EFORMAT, "%s: weight_map lists tensor '%s' twice", index, m[i].tensor);
            free(m);
            return e;
        }
    }
    *out = m;
    *nout = n;
    return NULL;
}

/* Open every distinct shard once (sorted by name), then cross-check the map
 * against the shards' contents in both directions. */
static kiln_error *open_sharded(const char *dir, const char *index, kiln_st **out) {
    cJSON *root = NULL;
    map_entry *map = NULL;
    size_t nmap = 0;
    const char **shards = NULL;
    kiln_st *st = NULL;
    kiln_error *e = kiln_json_parse_file(index, &root);
    if (e) goto done;
    if ((e = read_weight_map(index, root, &map, &nmap))) goto done;

    shards = malloc(nmap * sizeof *shards);
    st = calloc(1, sizeof *st);
    if (!shards || !st) {
        e = oom(index);
        goto done;
    }
    for (size_t i = 0; i < nmap; i++) shards[i] = map[i].shard;
    qsort(shards, nmap, sizeof *shards, cmp_str);
    size_t nshards = 0;
    for (size_t i = 0; i < nmap; i++)
        if (nshards == 0 || strcmp(shards[nshards - 1], shards[i]) != 0) shards[nshards++] = shards[i];

    for (size_t s = 0; s < nshards && !e; s++) {
        char *path = kiln_path_join(dir, shards[s]);
        if (!path) {
            e = oom(index);
            break;
        }
        struct stat sb;
        if (stat(path, &sb) != 0 && errno == ENOENT)
            e = kiln_errorf(KILN_ENOTFOUND, "%s: weight_map names shard '%s', but %s does not exist", index, shards[s],
                            path);
        else
            e = load_file(st, path);
        free(path);
    }
    if (e) goto done;

    /* Shard -> map: every tensor of shard s is listed, and listed as in s. */
    for (size_t s = 0; s < nshards; s++) {
        const st_file *f = &st->files[s];
        for (size_t i = f->first; i < f->first + f->count; i++) {
            map_entry key = {.tensor = st->tensors[i].name};
            map_entry *m = bsearch(&key, map, nmap, sizeof *map, cmp_map_entry);
            if (!m) {
                e = kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' in shard '%s' is not listed in weight_map", index,
                                key.tensor, shards[s]);
                goto done;
            }
            if (strcmp(m->shard, shards[s]) != 0) {
                e = kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is in shard '%s' but weight_map maps it to '%s'", index,
                                key.tensor, shards[s], m->shard);
                goto done;
            }
            m->seen = 1;
        }
    }
    /* Map -> shard: every listed tensor was found where the map says. */
    for (size_t i = 0; i < nmap; i++) {
        if (!map[i].seen) {
            e = kiln_errorf(KILN_EFORMAT, "%s: weight_map maps tensor '%s' to shard '%s', which does not contain it",
                            index, map[i].tensor, map[i].shard);
            goto done;
        }
    }
    e = build_index(st);
done:
    if (e) {
        kiln_st_close(st);
        st = NULL;
    }
    free(shards);
    free(map);
    cJSON_Delete(root);
    *out = st;
    return e;
}

kiln_error *kiln_st_open_dir(const char *dir, kiln_st **out) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return kiln_errorf(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: cannot open model directory: %s", dir,
                           strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return kiln_errorf(KILN_EINVAL, "%s: not a directory", dir);
    char *index = kiln_path_join(dir, "model.safetensors.index.json");
    char *single = kiln_path_join(dir, "model.safetensors");
    kiln_error *e = NULL;
    if (!index || !single) {
        e = oom(dir);
    } else if (stat(index, &sb) == 0) {
        e = open_sharded(dir, index, out);
    } else if (errno != ENOENT) {
        e = kiln_errorf(KILN_EIO, "%s: %s", index, strerror(errno));
    } else if (stat(single, &sb) == 0) {
        e = kiln_st_open(single, out);
    } else if (errno != ENOENT) {
        e = kiln_errorf(KILN_EIO, "%s: %s", single, strerror(errno));
    } else {
        e = kiln_errorf(KILN_ENOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(index);
    free(single);
    return e;
}

/* ------------------------------------------------------------------------ */
/* Typed copies out of the mapping                                            */
/* ------------------------------------------------------------------------ */

/* float8 decoders (OCP FP8, as in torch.float8_e4m3fn / float8_e5m2). */
static float f8_e5m2_to_f32(uint8_t b) { return kiln_f16_to_f32((uint16_t)(b << 8)); } /* = top byte of f16 */

static float f8_e4m3_to_f32(uint8_t b) {
    /* bias 7, no infinities; S.1111.111 is NaN */
    float sign = (b & 0x80) ? -1.0f : 1.0f;
    int exp = (b >> 3) & 0xf, man = b & 7;
    if (exp == 0xf && man == 7) return kiln_bf16_to_f32(0x7fc0);
    if (exp == 0) return sign * (float)man * 0x1p-9f;
    return sign * (float)(8 + man) * ldexpf(1.0f, exp - 10);
}

static const char *tfile(const kiln_st_tensor *t) { return t->file ? t->file : "(tensor)"; }

static kiln_error *check_count(const kiln_st_tensor *t, size_t n) {
    if ((uint64_t)t->numel != (uint64_t)n)
        return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': has %" PRId64 " elements but the caller expects %zu",
                           tfile(t), t->name, t->numel, n);
    return NULL;
}

/* Element i of type T from possibly unaligned bytes: memcpy is the portable
 * unaligned load (compilers turn it into a plain mov). */
#define DEFINE_LOAD(T, fn)                                              \
    static inline T fn(const void *p, size_t i) {                       \
        T v;                                                            \
        memcpy(&v, (const unsigned char *)p + i * sizeof v, sizeof v);  \
        return v;                                                       \
    }
DEFINE_LOAD(double, ld_f64)
DEFINE_LOAD(int64_t, ld_i64)
DEFINE_LOAD(int32_t, ld_i32)
DEFINE_LOAD(int16_t, ld_i16)
DEFINE_LOAD(int8_t, ld_i8)
DEFINE_LOAD(uint64_t, ld_u64)
DEFINE_LOAD(uint32_t, ld_u32)
DEFINE_LOAD(uint16_t, ld_u16)
DEFINE_LOAD(uint8_t, ld_u8)

kiln_error *kiln_st_read_f32(const kiln_st_tensor *t, float *dst, size_t n) {
    KILN_TRY(check_count(t, n));
    const void *p = t->data;
    switch (t->dtype) {
    case KILN_DT_F32: if (n) memcpy(dst, p, n * sizeof(float)); break;
    case KILN_DT_F64: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_f64(p, i); break;
    case KILN_DT_F16: for (size_t i = 0; i < n; i++) dst[i] = kiln_f16_to_f32(ld_u16(p, i)); break;
    case KILN_DT_BF16: for (size_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_f32(ld_u16(p, i)); break;
    case KILN_DT_F8_E4M3: for (size_t i = 0; i < n; i++) dst[i] = f8_e4m3_to_f32(ld_u8(p, i)); break;
    case KILN_DT_F8_E5M2: for (size_t i = 0; i < n; i++) dst[i] = f8_e5m2_to_f32(ld_u8(p, i)); break;
    case KILN_DT_I64: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_i64(p, i); break;
    case KILN_DT_I32: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_i32(p, i); break;
    case KILN_DT_I16: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_i16(p, i); break;
    case KILN_DT_I8: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_i8(p, i); break;
    case KILN_DT_U64: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_u64(p, i); break;
    case KILN_DT_U32: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_u32(p, i); break;
    case KILN_DT_U16: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_u16(p, i); break;
    case KILN_DT_U8: for (size_t i = 0; i < n; i++) dst[i] = (float)ld_u8(p, i); break;
    case KILN_DT_BOOL: for (size_t i = 0; i < n; i++) dst[i] = ld_u8(p, i) ? 1.0f : 0.0f; break;
    default:
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: tensor '%s': cannot convert dtype %s to F32", tfile(t), t->name,
                           kiln_dtype_name(t->dtype));
    }
    return NULL;
}

kiln_error *kiln_st_read_i64(const kiln_st_tensor *t, int64_t *dst, size_t n) {
    switch (t->dtype) {
    case KILN_DT_I64: case KILN_DT_I32: case KILN_DT_I16: case KILN_DT_I8:
    case KILN_DT_U64: case KILN_DT_U32: case KILN_DT_U16: case KILN_DT_U8: case KILN_DT_BOOL:
        break;
    default:
        return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': dtype %s is not an integer type", tfile(t), t->name,
                           kiln_dtype_name(t->dtype));
    }
    KILN_TRY(check_count(t, n));
    const void *p = t->data;
    switch (t->dtype) {
    case KILN_DT_I64: if (n) memcpy(dst, p, n * sizeof(int64_t)); break;
    case KILN_DT_I32: for (size_t i = 0; i < n; i++) dst[i] = ld_i32(p, i); break;
    case KILN_DT_I16: for (size_t i = 0; i < n; i++) dst[i] = ld_i16(p, i); break;
    case KILN_DT_I8: for (size_t i = 0; i < n; i++) dst[i] = ld_i8(p, i); break;
    case KILN_DT_U32: for (size_t i = 0; i < n; i++) dst[i] = ld_u32(p, i); break;
    case KILN_DT_U16: for (size_t i = 0; i < n; i++) dst[i] = ld_u16(p, i); break;
    case KILN_DT_U8: case KILN_DT_BOOL: for (size_t i = 0; i < n; i++) dst[i] = ld_u8(p, i); break;
    case KILN_DT_U64:
        for (size_t i = 0; i < n; i++) {
            uint64_t v = ld_u64(p, i);
            if (v > (uint64_t)INT64_MAX)
                return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': element %zu is %" PRIu64 ", beyond the int64 range",
                                   tfile(t), t->name, i, v);
            dst[i] = (int64_t)v;
        }
        break;
    default: break;
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                     */
/* ------------------------------------------------------------------------ */

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const kiln_st_entry *const *)a)->name, (*(const kiln_st_entry *const *)b)->name);
}

static kiln_error *check_utf8(const char *path, const char *what, const char *s) {
    size_t len = strlen(s), bad = utf8_invalid_at((const unsigned char *)s, len);
    if (bad < len) return kiln_errorf(KILN_EINVAL, "%s: %s '%s' is not valid UTF-8 (byte %zu)", path, what, s, bad);
    return NULL;
}

/* Check every entry before writing a byte and compute each one's size. */
static kiln_error *check_entries(const char *path, const kiln_st_entry *entries, size_t n, uint64_t *sizes,
                                  int need_data) {
    for (size_t i = 0; i < n; i++) {
        const kiln_st_entry *en = &entries[i];
        if (!en->name) return kiln_errorf(KILN_EINVAL, "%s: tensor #%zu has no name", path, i);
        const char *name = en->name;
        KILN_TRY(check_utf8(path, "tensor name", name));
        if (strcmp(name, "__metadata__") == 0)
            return kiln_errorf(KILN_EINVAL, "%s: '__metadata__' is reserved and cannot name a tensor", path);
        if (kiln_dtype_size(en->dtype) == 0)
            return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': invalid dtype %d", path, name, (int)en->dtype);
        if (en->ndim < 0 || en->ndim > KILN_ST_MAX_DIMS)
            return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': ndim %d is outside [0,%d]", path, name, en->ndim,
                               KILN_ST_MAX_DIMS);
        if (en->ndim > 0 && !en->shape)
            return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': ndim is %d but shape is NULL", path, name, en->ndim);
        uint64_t bytes = kiln_dtype_size(en->dtype);
        int overflow = 0;
        for (int d = 0; d < en->ndim; d++) {
            if (en->shape[d] < 0)
                return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': shape[%d] is %" PRId64 ", must be non-negative", path,
                                   name, d, en->shape[d]);
            if (mul_u64(bytes, (uint64_t)en->shape[d], &bytes)) overflow = 1;
        }
        /* The reader keeps numel in an int64 and offsets must stay exact in a
         * double (2^53), so that is the real limit on a tensor's size. */
        char sb[SHAPE_BUF];
        if (overflow || (double)bytes > MAX_EXACT_INT)
            return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': shape %s is too large", path, name,
                               fmt_shape(en->shape, en->ndim, sb));
        if (need_data && !en->data && bytes > 0)
            return kiln_errorf(KILN_EINVAL, "%s: tensor '%s': data is NULL but %s shape %s needs %" PRIu64 " bytes",
                               path, name, kiln_dtype_name(en->dtype), fmt_shape(en->shape, en->ndim, sb), bytes);
        sizes[i] = bytes;
    }
    /* Duplicates: sort pointers by name and compare neighbours. */
    const kiln_st_entry **sorted = malloc((n + 1) * sizeof *sorted);
    if (!sorted) return oom(path);
    for (size_t i = 0; i < n; i++) sorted[i] = &entries[i];
    qsort(sorted, n, sizeof *sorted, cmp_entry_name);
    kiln_error *e = NULL;
    for (size_t i = 1; i < n && !e; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            e = kiln_errorf(KILN_EINVAL, "%s: duplicate tensor name '%s'", path, sorted[i]->name);
    free(sorted);
    return e;
}

/* "[a,b,...]" as raw JSON, so integers are written exactly (cJSON would
 * print large doubles in exponent notation, which readers reject). */
static cJSON *raw_int_array(const uint64_t *v, int n) {
    char buf[SHAPE_BUF];
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < n; i++) k += (size_t)snprintf(buf + k, sizeof buf - k, i ? ",%" PRIu64 : "%" PRIu64, v[i]);
    buf[k++] = ']';
    buf[k] = 0;
    return cJSON_CreateRaw(buf);
}

/* The JSON header text (malloc'd by cJSON; free with cJSON_free). */
static kiln_error *build_header(const char *path, const kiln_st_entry *entries, size_t n, const uint64_t *sizes,
                                const char *const *metadata, char **out) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    kiln_error *e = NULL;
    if (ok && metadata && metadata[0]) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (size_t i = 0; ok && metadata[i]; i += 2) {
            if (!metadata[i + 1]) {
                e = kiln_errorf(KILN_EINVAL, "%s: metadata key '%s' has no value", path, metadata[i]);
                break;
            }
            if ((e = check_utf8(path, "metadata key", metadata[i])) ||
                (e = check_utf8(path, "metadata value", metadata[i + 1])))
                break;
            if (cJSON_GetObjectItemCaseSensitive(m, metadata[i])) {
                e = kiln_errorf(KILN_EINVAL, "%s: metadata key '%s' given twice", path, metadata[i]);
                break;
            }
            ok = cJSON_AddStringToObject(m, metadata[i], metadata[i + 1]) != NULL;
        }
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && !e && i < n; i++) {
        const kiln_st_entry *en = &entries[i];
        uint64_t dims[KILN_ST_MAX_DIMS], range[2] = {offset, offset + sizes[i]};
        for (int d = 0; d < en->ndim; d++) dims[d] = (uint64_t)en->shape[d];
        cJSON *t = cJSON_AddObjectToObject(root, en->name);
        cJSON *shape = raw_int_array(dims, en->ndim), *offs = raw_int_array(range, 2);
        ok = t && shape && offs && cJSON_AddStringToObject(t, "dtype", kiln_dtype_name(en->dtype));
        /* AddItem takes ownership only when it succeeds. */
        if (ok && cJSON_AddItemToObject(t, "shape", shape)) shape = NULL;
        else ok = 0;
        if (ok && cJSON_AddItemToObject(t, "data_offsets", offs)) offs = NULL;
        else ok = 0;
        cJSON_Delete(shape);
        cJSON_Delete(offs);
        offset += sizes[i];
    }
    if (ok && !e) {
        *out = kiln_json_print(root, 0);
        ok = *out != NULL;
    }
    cJSON_Delete(root);
    if (!ok && !e) e = oom(path);
    return e;
}

/* The data section from a source: exactly `total` bytes, in pieces of any size. */
static kiln_error *write_from_source(kiln_atomic_file *f, const char *path, uint64_t total, kiln_st_source src,
                                     void *ctx) {
    for (uint64_t done = 0; done < total;) {
        const void *p = NULL;
        size_t len = 0;
        KILN_TRY(src(ctx, &p, &len));
        if (len == 0 || !p)
            return kiln_errorf(KILN_EIO, "%s: the data ended at byte %" PRIu64 " of %" PRIu64, path, done, total);
        if (len > total - done)
            return kiln_errorf(KILN_EINVAL, "%s: %zu bytes of data at byte %" PRIu64 " go past the end (%" PRIu64 ")",
                               path, len, done, total);
        KILN_TRY(kiln_atomic_write(f, p, len));
        done += len;
    }
    return NULL;
}

static kiln_error *st_write(const char *path, const kiln_st_entry *entries, size_t n, const char *const *metadata,
                            kiln_st_source src, void *ctx) {
    uint64_t *sizes = malloc((n + 1) * sizeof *sizes);
    if (!sizes) return oom(path);
    char *json = NULL;
    unsigned char *head = NULL;
    kiln_error *e = check_entries(path, entries, n, sizes, src == NULL);
    uint64_t total = 0;
    for (size_t i = 0; !e && i < n; i++)
        if (add_u64(total, sizes[i], &total) || (double)total > MAX_EXACT_INT)
            e = kiln_errorf(KILN_EINVAL, "%s: tensors add up to more than 2^53 bytes", path);
    if (!e) e = build_header(path, entries, n, sizes, metadata, &json);
    if (e) goto done;

    /* Pad with spaces (still valid JSON) so the data starts 8-byte aligned:
     * then a mapped F64/I64 tensor at an aligned offset is aligned in memory. */
    size_t jlen = strlen(json);
    size_t hlen = jlen + (8 - (8 + jlen) % 8) % 8;
    if (hlen > KILN_ST_MAX_HEADER) {
        e = kiln_errorf(KILN_EINVAL, "%s: header would be %zu bytes, over the %u-byte limit", path, hlen,
                        KILN_ST_MAX_HEADER);
        goto done;
    }
    head = malloc(8 + hlen);
    if (!head) {
        e = oom(path);
        goto done;
    }
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(head + 8, json, jlen);
    memset(head + 8 + jlen, ' ', hlen - jlen);

    kiln_atomic_file f;
    if ((e = kiln_atomic_begin_sized(&f, path, 8 + (uint64_t)hlen + total))) goto done;
    e = kiln_atomic_write(&f, head, 8 + hlen);
    if (!e && src) e = write_from_source(&f, path, total, src, ctx);
    for (size_t i = 0; !e && !src && i < n; i++)
        if (sizes[i]) e = kiln_atomic_write(&f, entries[i].data, (size_t)sizes[i]);
    if (e)
        kiln_atomic_abort(&f);
    else
        e = kiln_atomic_commit(&f);
done:
    free(head);
    if (json) cJSON_free(json);
    free(sizes);
    return e;
}

kiln_error *kiln_st_write(const char *path, const kiln_st_entry *entries, size_t n, const char *const *metadata) {
    return st_write(path, entries, n, metadata, NULL, NULL);
}

kiln_error *kiln_st_write_stream(const char *path, const kiln_st_entry *entries, size_t n,
                                 const char *const *metadata, kiln_st_source src, void *ctx) {
    if (!src) return kiln_errorf(KILN_EINVAL, "%s: no data source", path);
    return st_write(path, entries, n, metadata, src, ctx);
}
