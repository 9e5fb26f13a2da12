/* The identity of a loaded CLIP model (kiln_clip_id): a content hash that the loader computes as it
 * reads the weights, so it costs no second read of the files (`kiln cis score` records it in
 * run.json and a --resume with another model is refused; docs/cis-format.md, "CLIP identity").
 *
 *   weights  every tensor the model reads, in the parameter table's order: its name, dtype, shape
 *            and size, and the XXH64 of each 1 MiB piece of its bytes as stored in the file; the
 *            pieces are converted to f32 and hashed on the loader's threads, each piece hashed
 *            right after its conversion read it (in cache), 64 KiB at a time
 *   files    every regular *.json and *.txt file of the directory (config, preprocessor, tokenizer,
 *            ...) but the safetensors index, in name order: name, size and XXH64 of the contents
 *            (small files: a few MB)
 *   id       "xxh64:" + 16 hex digits of XXH64 over the files' part and the weights' digest
 *
 * The value depends on the bytes only: not on the thread count, the piece a thread took, how the
 * tensors are split into shards or ordered in a file, file times, or where the directory is. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clip/clip_internal.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"

#define PIECE ((size_t)1 << 20) /* bytes of a piece: part of the identity's definition */
#define STEP ((size_t)64 << 10) /* bytes converted, then hashed, at a time: cache-sized, not part of it */

static void put_u64(kiln_xxh64_state *s, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    kiln_xxh64_update(s, b, 8);
}

static void put_str(kiln_xxh64_state *s, const char *str) { kiln_xxh64_update(s, str, strlen(str) + 1); }

typedef struct {
    size_t tensor, piece;
} piece_job;

kiln_error *clip_id_load_tensors(const kiln_st_tensor *const *src, float *const *dst, size_t n, uint64_t *digest) {
    size_t npieces = 0;
    for (size_t i = 0; i < n; i++) npieces += (src[i]->nbytes + PIECE - 1) / PIECE;
    piece_job *job = malloc((npieces ? npieces : 1) * sizeof *job);
    uint64_t *ph = malloc((npieces ? npieces : 1) * sizeof *ph);
    if (!job || !ph) {
        free(job), free(ph);
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    }
    for (size_t i = 0, j = 0; i < n; i++)
        for (size_t k = 0; k * PIECE < src[i]->nbytes; k++) job[j++] = (piece_job){i, k};
    kiln_error *first = NULL;
    size_t first_at = npieces;
    /* pieces on threads: the f32 conversion and the hash share one read of the file's pages */
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t j = 0; j < npieces; j++) {
        const kiln_st_tensor *t = src[job[j].tensor];
        size_t esize = kiln_dtype_size(t->dtype), begin = job[j].piece * PIECE;
        size_t end = t->nbytes - begin < PIECE ? t->nbytes : begin + PIECE;
        kiln_xxh64_state s;
        kiln_xxh64_init(&s, 0);
        kiln_error *e = NULL;
        for (size_t at = begin; at < end && !e; at += STEP) {
            size_t len = end - at < STEP ? end - at : STEP;
            kiln_st_tensor part = *t;
            part.data = (const unsigned char *)t->data + at;
            part.nbytes = len;
            part.numel = (int64_t)(len / esize);
            e = kiln_st_read_f32(&part, dst[job[j].tensor] + at / esize, len / esize);
            kiln_xxh64_update(&s, part.data, len);
        }
        ph[j] = kiln_xxh64_digest(&s);
        if (e) {
#pragma omp critical(clip_id_error)
            {
                if (j < first_at) {
                    kiln_error_free(first);
                    first = e, first_at = j;
                } else {
                    kiln_error_free(e);
                }
            }
        }
    }
    if (!first) {
        kiln_xxh64_state s;
        kiln_xxh64_init(&s, 0);
        for (size_t i = 0, j = 0; i < n; i++) {
            const kiln_st_tensor *t = src[i];
            put_str(&s, t->name);
            put_str(&s, kiln_dtype_name(t->dtype));
            put_u64(&s, (uint64_t)t->ndim);
            for (int d = 0; d < t->ndim; d++) put_u64(&s, (uint64_t)t->shape[d]);
            put_u64(&s, (uint64_t)t->nbytes);
            for (size_t k = 0; k * PIECE < t->nbytes; k++) put_u64(&s, ph[j++]);
        }
        *digest = kiln_xxh64_digest(&s);
    }
    free(job), free(ph);
    return first;
}

/* *.json and *.txt but the safetensors index (model.safetensors.index.json): that only says which shard
 * holds which tensor, and the tensors are hashed by content */
static int is_id_file(const char *name) {
    const char *ext = strrchr(name, '.');
    size_t n = strlen(name), k = strlen(".safetensors.index.json");
    if (n >= k && !strcmp(name + n - k, ".safetensors.index.json")) return 0;
    return name[0] != '.' && ext && (!strcmp(ext, ".json") || !strcmp(ext, ".txt"));
}

kiln_error *clip_id_finish(kiln_clip *m) {
    char **names = NULL;
    size_t n = 0;
    kiln_error *e = kiln_dir_names(m->dir, is_id_file, &names, &n);
    if (e) return e;
    kiln_xxh64_state s;
    kiln_xxh64_init(&s, 0);
    for (size_t i = 0; i < n && !e; i++) {
        char *path = kiln_path_join(m->dir, names[i]);
        struct stat st;
        uint64_t h = 0, size = 0;
        if (!path) e = kiln_errorf(KILN_ENOMEM, "out of memory");
        else if (!stat(path, &st) && S_ISREG(st.st_mode) && !(e = kiln_xxh64_file(path, &h, &size))) {
            put_str(&s, names[i]);
            put_u64(&s, size);
            put_u64(&s, h);
        }
        free(path);
    }
    kiln_dir_names_free(names, n);
    if (e) return e;
    put_str(&s, "weights");
    put_u64(&s, m->weights_digest);
    snprintf(m->id, sizeof m->id, "xxh64:%016llx", (unsigned long long)kiln_xxh64_digest(&s));
    return NULL;
}

const char *kiln_clip_id(const kiln_clip *m) { return m->id; }
