/* kiln data prepare: input files -> documents -> token ids -> train/val shards + index.json.
 *
 * An ordered pipeline: the calling thread reads documents into a ring, `threads` workers take
 * them in order and encode them (JSON parsing of .jsonl lines included), and the calling thread
 * appends finished documents to the shards strictly in input order. Reading, encoding and writing
 * overlap, and the output is the same bytes whatever the number of threads.
 * See docs/data-format.md. */
#include "kiln/data.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/progress.h"
#include "kiln/tokenizer.h"

#define DEFAULT_SHARD_TOKENS (64LL * 1024 * 1024)
#define RING_BYTES_PER_THREAD ((size_t)8 << 20) /* text read ahead, per worker */
#define RING_DOCS 65536                         /* documents read ahead, at most */
#define MAX_THREADS 256
#define CLAIM_DOCS 64                           /* documents a worker takes at once, at most */
#define CLAIM_BYTES ((size_t)64 << 10)          /* ... and text bytes, at most (at least one doc) */
#define PUBLISH_DOCS 256                        /* the reader hands documents over in groups */

static kiln_error *oom(const char *what) { return kiln_errorf(KILN_ENOMEM, "%s: out of memory", what); }

int kiln_data_is_val_doc(uint64_t i, double f) {
    if (!(f > 0)) return 0;
    /* V(n) = ceil((n-1) f): val documents among the first n; document i is val when V grows at i+1.
     * The epsilon keeps products such as 10 * 0.1 from rounding up past an integer. */
    double a = ceil((double)i * f - 1e-9), b = i ? ceil((double)(i - 1) * f - 1e-9) : 0;
    return i > 0 && a > b;
}

/* ---- documents from the input files ---- */

typedef struct {
    char *text;     /* a whole file, or a raw .jsonl line (the worker parses it) */
    size_t len;
    size_t file;    /* input index */
    int64_t line;   /* 1-based line of a .jsonl file, 0 for a whole file */
    uint64_t bytes; /* input bytes this document accounts for (progress) */
    size_t ring_bytes; /* what it counts against the ring's byte budget */
    /* set by the worker */
    void *tokens;   /* n tokens, packed to the shards' token width */
    size_t n;
    kiln_error *err;
    int done;
} doc;

typedef struct {
    const kiln_data_prepare_opts *o;
    size_t file;   /* next input (or the open .jsonl) */
    FILE *f;       /* the open .jsonl, or NULL */
    int64_t line;
    char *buf;
    size_t cap;
} doc_reader;

static int is_jsonl(const char *path) {
    size_t n = strlen(path);
    return n >= 6 && !strcmp(path + n - 6, ".jsonl");
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The control character (below 0x20) a line's "\u0000" escapes can stand in for while cJSON parses it, or -1.
 *
 * Why: cJSON decodes "\u0000" into a NUL byte inside its NUL-terminated valuestring and keeps no length, so
 * everything after the first NUL would be lost (strlen stops there). A control character that occurs nowhere
 * in the line (neither raw nor as an escape) can only come out of the decoded text where we put it: the
 * line is parsed again with every "\u0000" rewritten to it, and it is turned back into NUL in the text.
 * Bytes below 0x20 come out of cJSON only from such bytes or escapes (\b \t \n \f \r are never chosen;
 * any other escape decodes to 0x20 or above). *nul: whether the line has a "\u0000" escape at all. */
static int nul_stand_in(const char *line, size_t len, int *nul) {
    int used[32] = {0};
    *nul = 0;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)line[i];
        if (c < 32) {
            used[c] = 1;
        } else if (c == '\\' && i + 1 < len) { /* an escape: its letter is not a quote or another escape */
            if (line[i + 1] == 'u' && i + 5 < len) {
                int v = 0;
                for (int k = 2; k < 6 && v >= 0; k++) v = hexval(line[i + k]) < 0 ? -1 : v * 16 + hexval(line[i + k]);
                if (v >= 0 && v < 32) used[v] = 1;
                if (v == 0) *nul = 1;
            }
            i++;
        }
    }
    for (int c = 1; c < 32; c++)
        if (!used[c] && c != '\b' && c != '\t' && c != '\n' && c != '\f' && c != '\r') return c;
    return -1;
}

/* The document in one .jsonl line: an object whose "text" is a string. The text keeps escaped NULs
 * ("\u0000"), as a plain text file keeps its NUL bytes. */
static kiln_error *jsonl_doc(const char *line, size_t len, const char *ctx, char **text, size_t *tlen) {
    /* JSON has no raw NUL (control characters are escaped in strings); cJSON would cut the text there */
    const char *raw = memchr(line, 0, len);
    if (raw)
        return kiln_errorf(KILN_EFORMAT, "%s: a raw NUL byte at column %zu: JSON Lines input must escape it as "
                           "\\u0000 (plain text files keep NUL bytes as they are)", ctx, (size_t)(raw - line) + 1);
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse(line, len, ctx, &root)); /* the line as written: errors quote it faithfully */
    int nul = 0;
    const int alt = nul_stand_in(line, len, &nul);
    char *copy = NULL;
    kiln_error *e = NULL;
    if (nul && alt < 0) {
        e = kiln_errorf(KILN_EFORMAT, "%s: the line escapes NUL (\\u0000) and uses every other control character "
                        "too, so kiln cannot keep the NULs of its text: a NUL in the text of JSON Lines input is not "
                        "supported here (a plain text file keeps it)", ctx);
    } else if (nul) { /* parse it again with the stand-in for NUL (nul_stand_in says why) */
        copy = malloc(len + 1);
        if (!copy) e = oom(ctx);
        else copy[len] = 0;
        for (size_t i = 0; copy && i < len; i++) {
            copy[i] = line[i];
            if (line[i] == '\\' && i + 1 < len) { /* escapes are copied whole: the u0000 after "\\\\" is text */
                i++;
                copy[i] = line[i];
                if (line[i] == 'u' && i + 4 < len && !memcmp(line + i + 1, "0000", 4)) {
                    memcpy(copy + i + 1, "00", 2);
                    copy[i + 3] = "0123456789abcdef"[alt >> 4];
                    copy[i + 4] = "0123456789abcdef"[alt & 15];
                    i += 4;
                }
            }
        }
        if (copy) {
            cJSON_Delete(root);
            root = NULL;
            e = kiln_json_parse(copy, len, ctx, &root);
        }
    }
    const char *s = NULL;
    if (!e && !cJSON_IsObject(root))
        e = kiln_errorf(KILN_EFORMAT, "%s: expected a JSON object with a \"text\" field, got %s", ctx,
                        kiln_json_type_name(root));
    else if (!e)
        e = kiln_json_get_string(root, "text", &s, NULL, 1, ctx);
    if (!e) {
        *tlen = strlen(s);
        *text = malloc(*tlen + 1);
        if (!*text) e = oom(ctx);
        else memcpy(*text, s, *tlen + 1);
        for (size_t i = 0; !e && nul && i < *tlen; i++)
            if ((*text)[i] == (char)alt) (*text)[i] = 0;
    }
    free(copy);
    cJSON_Delete(root);
    return e;
}

/* The next document, or d->text == NULL at the end of the inputs: a whole non-empty file, or a
 * non-blank line of a .jsonl file. Bytes of blank lines are added to *skipped. */
static kiln_error *next_doc(doc_reader *r, doc *d, uint64_t *skipped) {
    memset(d, 0, sizeof *d);
    for (;;) {
        if (r->file >= r->o->ninputs) return NULL;
        const char *path = r->o->inputs[r->file];
        if (!is_jsonl(path)) {
            char *text = NULL;
            size_t len = 0;
            KILN_TRY(kiln_read_file(path, &text, &len));
            r->file++;
            if (len == 0) {
                free(text);
                continue;
            }
            *d = (doc){.text = text, .len = len, .file = r->file - 1, .bytes = len};
            return NULL;
        }
        if (!r->f) {
            r->f = fopen(path, "rb");
            if (!r->f) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
            r->line = 0;
        }
        errno = 0;
        ssize_t got = getline(&r->buf, &r->cap, r->f);
        if (got < 0) {
            int bad = ferror(r->f), err = errno;
            fclose(r->f);
            r->f = NULL;
            if (bad) return kiln_errorf(KILN_EIO, "%s: read failed after line %" PRId64 ": %s", path, r->line,
                                        strerror(err ? err : EIO));
            r->file++;
            continue;
        }
        r->line++;
        if (blank(r->buf, (size_t)got)) {
            *skipped += (uint64_t)got;
            continue;
        }
        char *line = malloc((size_t)got + 1);
        if (!line) return oom(path);
        memcpy(line, r->buf, (size_t)got + 1);
        *d = (doc){.text = line, .len = (size_t)got, .file = r->file, .line = r->line, .bytes = (uint64_t)got};
        return NULL;
    }
}

static void reader_close(doc_reader *r) {
    if (r->f) fclose(r->f);
    free(r->buf);
}

/* ---- the pipeline ---- */

typedef struct {
    const kiln_tokenizer *tok;
    const char *const *inputs;
    int64_t eos, vocab;
    uint32_t tb; /* token width of the shards */
    doc *ring;
    size_t cap;                 /* slots; document seq lives in ring[seq % cap] */
    uint64_t head, claim, tail; /* read up to head, claimed by workers up to claim, appended up to tail */
    int eof, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, finished; /* work: a document to claim (or the end); finished: a document done */
} pipeline;

/* A document's tokens (plus eos), packed to width tb; a .jsonl line is parsed first. Empty text
 * gives no tokens at all. Errors start with the document's name ("file" or "file:line"). */
static kiln_error *encode_doc(const pipeline *p, doc *d) {
    char name[1200];
    if (d->line) snprintf(name, sizeof name, "%s:%" PRId64, p->inputs[d->file], d->line);
    else snprintf(name, sizeof name, "%s", p->inputs[d->file]);
    if (d->line) {
        char *text = NULL;
        size_t len = 0;
        KILN_TRY(jsonl_doc(d->text, d->len, name, &text, &len));
        free(d->text);
        d->text = text;
        d->len = len;
        if (len == 0) return NULL;
    }
    int64_t *ids = NULL;
    size_t n = 0;
    kiln_error *e = kiln_tokenizer_encode(p->tok, d->text, d->len, &ids, &n);
    if (e) return kiln_error_wrap(e, "%s", name);
    for (size_t i = 0; i < n && !e; i++)
        if (ids[i] < 0 || ids[i] >= p->vocab)
            e = kiln_errorf(KILN_EINVAL, "%s: the tokenizer returned id %" PRId64 " outside its vocabulary (size %"
                            PRId64 ") at token %zu", name, ids[i], p->vocab, i);
    if (!e && p->eos >= 0) {
        int64_t *more = realloc(ids, (n + 1) * sizeof *ids);
        if (!more) e = oom(name);
        else (ids = more)[n++] = p->eos;
    }
    if (e) {
        free(ids);
        return e;
    }
    /* pack in place: token i goes to bytes [i*tb, (i+1)*tb), below the int64 still to be read */
    unsigned char *out = (unsigned char *)ids;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, out + i * sizeof v, sizeof v);
        if (p->tb == 2) {
            uint16_t t = (uint16_t)v;
            memcpy(out + 2 * i, &t, 2);
        } else {
            uint32_t t = (uint32_t)v;
            memcpy(out + 4 * i, &t, 4);
        }
    }
    d->tokens = ids;
    d->n = n;
    return NULL;
}

/* Workers claim runs of consecutive documents (up to CLAIM_DOCS documents or CLAIM_BYTES of
 * text) so that short documents do not cost a lock round trip each. */
static void *worker(void *arg) {
    pipeline *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->claim == p->head && !p->eof) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop || p->claim == p->head) break;
        uint64_t first = p->claim, end = first;
        size_t bytes = 0;
        while (end < p->head && end - first < CLAIM_DOCS && bytes < CLAIM_BYTES) bytes += p->ring[end++ % p->cap].len;
        p->claim = end;
        pthread_mutex_unlock(&p->mu);
        for (uint64_t s = first; s < end; s++) {
            doc *d = &p->ring[s % p->cap];
            d->err = encode_doc(p, d);
            free(d->text); /* the text is not needed once encoded */
            d->text = NULL;
        }
        pthread_mutex_lock(&p->mu);
        for (uint64_t s = first; s < end; s++) p->ring[s % p->cap].done = 1;
        pthread_cond_signal(&p->finished);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the shards of one split ---- */

typedef struct {
    const char *name; /* "train" or "val" */
    const char *out_dir;
    uint64_t vocab, cap; /* tokens per shard */
    uint32_t tb;
    unsigned char *buf;  /* the current shard's tokens */
    uint64_t n, buf_cap; /* tokens in buf, tokens buf can hold */
    uint64_t *starts, nstarts, starts_cap;
    kiln_data_shard_info *shards;
    size_t nshards, shards_cap;
    uint64_t tokens, documents;
} split_writer;

static kiln_error *flush_shard(split_writer *w) {
    if (w->n == 0) return NULL;
    char name[64];
    snprintf(name, sizeof name, "%s_%06zu.bin", w->name, w->nshards);
    if (w->nshards == w->shards_cap) {
        size_t nc = w->shards_cap ? 2 * w->shards_cap : 16;
        kiln_data_shard_info *s = realloc(w->shards, nc * sizeof *s);
        if (!s) return oom(w->out_dir);
        w->shards = s;
        w->shards_cap = nc;
    }
    char *path = kiln_path_join(w->out_dir, name), *file = strdup(name);
    uint64_t checksum = 0;
    kiln_error *e = !path || !file ? oom(w->out_dir)
                                   : kiln_shard_write_ex(path, w->buf, w->n, w->starts, w->nstarts, w->vocab, &checksum);
    free(path);
    if (e) {
        free(file);
        return e;
    }
    w->shards[w->nshards++] = (kiln_data_shard_info){file, w->n, w->nstarts, checksum};
    w->n = 0;
    w->nstarts = 0;
    return NULL;
}

static kiln_error *reserve(split_writer *w, uint64_t tokens, uint64_t starts) {
    if (tokens > w->buf_cap) {
        uint64_t nc = w->buf_cap ? w->buf_cap : 4096;
        while (nc < tokens) nc *= 2;
        if (nc > w->cap) nc = w->cap;
        unsigned char *b = realloc(w->buf, (size_t)(nc * w->tb));
        if (!b) return oom(w->out_dir);
        w->buf = b;
        w->buf_cap = nc;
    }
    if (starts > w->starts_cap) {
        uint64_t nc = w->starts_cap ? 2 * w->starts_cap : 1024;
        uint64_t *s = realloc(w->starts, (size_t)nc * sizeof *s);
        if (!s) return oom(w->out_dir);
        w->starts = s;
        w->starts_cap = nc;
    }
    return NULL;
}

/* Append a document of n packed tokens. A shard is cut before a document that does not fit, so
 * documents stay whole, unless the document alone is larger than a shard: then it fills shards
 * to the brim and its tail starts the next one (which then begins with a continuation). */
static kiln_error *add_doc(split_writer *w, const unsigned char *tokens, uint64_t n) {
    if (w->n > 0 && w->n + n > w->cap) KILN_TRY(flush_shard(w));
    KILN_TRY(reserve(w, w->n, w->nstarts + 1));
    w->starts[w->nstarts++] = w->n;
    w->documents++;
    w->tokens += n;
    while (n > 0) {
        if (w->n == w->cap) KILN_TRY(flush_shard(w));
        uint64_t take = n < w->cap - w->n ? n : w->cap - w->n;
        KILN_TRY(reserve(w, w->n + take, 0));
        memcpy(w->buf + w->n * w->tb, tokens, (size_t)(take * w->tb));
        w->n += take;
        tokens += take * w->tb;
        n -= take;
    }
    return NULL;
}

static void split_free(split_writer *w) {
    free(w->buf);
    free(w->starts);
    for (size_t i = 0; i < w->nshards; i++) free(w->shards[i].file);
    free(w->shards);
}

/* Remove name_<k>.bin for k >= first: shards a previous, larger run left behind. */
static void remove_stale(const char *out_dir, const char *name, size_t first) {
    for (size_t k = first;; k++) {
        char file[64];
        snprintf(file, sizeof file, "%s_%06zu.bin", name, k);
        char *path = kiln_path_join(out_dir, file);
        int gone = !path || unlink(path) != 0;
        free(path);
        if (gone) return;
    }
}

/* mkdir -p */
static kiln_error *make_dirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return oom(dir);
    kiln_error *e = NULL;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            e = kiln_errorf(KILN_EIO, "%s: cannot create directory %s: %s", dir, p, strerror(errno));
        else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            e = kiln_errorf(KILN_EIO, "%s: %s is not a directory", dir, p);
        *s = c;
        if (e || !c) break;
    }
    free(p);
    return e;
}

/* ---- the whole job ---- */

typedef struct {
    const kiln_data_prepare_opts *o;
    kiln_tokenizer *tok;
    int64_t vocab, eos;
    char *tok_abs;
    uint64_t tok_hash;
    uint64_t input_bytes;
    int threads;
    split_writer sw[2]; /* train, val */
    doc_reader rd;
    uint64_t ndoc; /* documents numbered so far */
} job;

static kiln_error *check_opts(const kiln_data_prepare_opts *o) {
    if (!o->tokenizer_path || !o->out_dir)
        return kiln_errorf(KILN_EINVAL, "data prepare: a tokenizer and an output directory are required");
    if (o->ninputs == 0 || !o->inputs) return kiln_errorf(KILN_EINVAL, "data prepare: no input files");
    if (o->shard_tokens < 0)
        return kiln_errorf(KILN_EINVAL, "data prepare: shard_tokens must be >= 1 (0: the default), got %" PRId64,
                           o->shard_tokens);
    if (o->threads < 0) return kiln_errorf(KILN_EINVAL, "data prepare: threads must be >= 0, got %d", o->threads);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return kiln_errorf(KILN_EINVAL, "data prepare: val_fraction must be in [0, 1), got %g", o->val_fraction);
    return NULL;
}

static kiln_error *setup(job *j) {
    const kiln_data_prepare_opts *o = j->o;
    for (size_t i = 0; i < o->ninputs; i++) {
        struct stat sb;
        if (stat(o->inputs[i], &sb) != 0)
            return kiln_errorf(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: cannot open: %s", o->inputs[i],
                               strerror(errno));
        if (!S_ISREG(sb.st_mode)) return kiln_errorf(KILN_EINVAL, "%s: not a regular file", o->inputs[i]);
        j->input_bytes += (uint64_t)sb.st_size;
    }
    uint64_t size = 0;
    KILN_TRY(kiln_fnv1a64_file(o->tokenizer_path, &j->tok_hash, &size));
    KILN_TRY(kiln_tokenizer_load(o->tokenizer_path, &j->tok));
    j->vocab = kiln_tokenizer_vocab_size(j->tok);
    if (j->vocab < 1 || j->vocab > ((int64_t)1 << 32))
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: vocabulary size %" PRId64 " is outside 1..2^32", o->tokenizer_path,
                           j->vocab);
    static const char *const eos_names[] = {"<|endoftext|>", "<eos>", "</s>"};
    j->eos = -1;
    for (size_t i = 0; i < 3 && j->eos < 0; i++) j->eos = kiln_tokenizer_token_id(j->tok, eos_names[i]);
    if (j->eos >= j->vocab)
        return kiln_errorf(KILN_EFORMAT, "%s: end-of-text token id %" PRId64 " is outside the vocabulary (size %" PRId64
                           ")", o->tokenizer_path, j->eos, j->vocab);
    j->tok_abs = realpath(o->tokenizer_path, NULL);
    if (!j->tok_abs) j->tok_abs = strdup(o->tokenizer_path);
    if (!j->tok_abs) return oom(o->tokenizer_path);

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    j->threads = o->threads ? o->threads : ncpu > 0 ? (int)ncpu : 1;
    if (j->threads > MAX_THREADS) j->threads = MAX_THREADS;
    const char *names[2] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        split_writer *w = &j->sw[s];
        w->name = names[s];
        w->out_dir = o->out_dir;
        w->vocab = (uint64_t)j->vocab;
        w->tb = kiln_shard_token_bytes(w->vocab);
        w->cap = o->shard_tokens ? (uint64_t)o->shard_tokens : (uint64_t)DEFAULT_SHARD_TOKENS;
    }
    j->rd.o = o;

    KILN_TRY(make_dirs(o->out_dir));
    /* Without index.json the directory is "being written": the loader will not read it. */
    char *ix = kiln_path_join(o->out_dir, "index.json");
    if (!ix) return oom(o->out_dir);
    int rc = unlink(ix), err = errno;
    kiln_error *e = rc != 0 && err != ENOENT
                        ? kiln_errorf(KILN_EIO, "%s: cannot remove the old index: %s", ix, strerror(err)) : NULL;
    free(ix);
    return e;
}

static void doc_free(doc *d) {
    free(d->text);
    free(d->tokens);
    kiln_error_free(d->err);
    memset(d, 0, sizeof *d);
}

/* Append one encoded document (the calling thread, in input order). */
static kiln_error *consume(job *j, doc *d) {
    if (d->err) {
        kiln_error *e = d->err;
        d->err = NULL;
        return e;
    }
    if (d->n == 0) return NULL; /* empty text */
    split_writer *w = &j->sw[kiln_data_is_val_doc(j->ndoc, j->o->val_fraction)];
    j->ndoc++;
    return add_doc(w, d->tokens, d->n);
}

/* The calling thread keeps the ring full of documents read ahead (up to RING_DOCS documents and
 * RING_BYTES_PER_THREAD x threads bytes of text), and appends the oldest one as soon as a worker
 * has finished it. Errors come out in input order: a document that cannot be read ends the input,
 * after the documents before it (one of which may fail to encode) have been appended. */
static kiln_error *run(job *j, kiln_progress *prog) {
    pipeline p = {.tok = j->tok, .inputs = j->o->inputs, .eos = j->eos, .vocab = j->vocab,
                  .tb = kiln_shard_token_bytes((uint64_t)j->vocab)};
    p.cap = RING_DOCS;
    p.ring = calloc(p.cap, sizeof *p.ring);
    if (!p.ring) return oom(j->o->out_dir);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.work, NULL);
    pthread_cond_init(&p.finished, NULL);
    pthread_t tid[MAX_THREADS];
    int nt = 0;
    kiln_error *e = NULL, *read_err = NULL;
    for (int t = 0; t < j->threads; t++)
        if (pthread_create(&tid[nt], NULL, worker, &p) == 0) nt++;
    if (nt == 0) e = kiln_errorf(KILN_EIO, "data prepare: cannot start a worker thread");

    const size_t max_bytes = RING_BYTES_PER_THREAD * (size_t)j->threads;
    size_t ring_bytes = 0; /* only this thread changes it */
    uint64_t done = 0, nread = 0; /* nread: documents in the ring, published (head) or not yet */
    while (!e) {
        /* top up: only this thread reads the input, fills slots [head, nread) and publishes them */
        while (!p.eof && nread - p.tail < p.cap && ring_bytes < max_bytes) {
            doc *d = &p.ring[nread % p.cap];
            read_err = next_doc(&j->rd, d, &done);
            int end = read_err || !d->text;
            if (!end) {
                d->ring_bytes = d->len;
                ring_bytes += d->len;
                nread++;
            }
            if (end || nread - p.head >= PUBLISH_DOCS) {
                pthread_mutex_lock(&p.mu);
                p.head = nread;
                p.eof = end;
                pthread_cond_broadcast(&p.work);
                pthread_mutex_unlock(&p.mu);
            }
        }
        if (nread != p.head) {
            pthread_mutex_lock(&p.mu);
            p.head = nread;
            pthread_cond_broadcast(&p.work);
            pthread_mutex_unlock(&p.mu);
        }
        if (p.tail == p.head) break; /* everything read has been appended: the end */
        /* append the finished documents at the tail, in order */
        uint64_t ready = p.tail;
        pthread_mutex_lock(&p.mu);
        while (!p.ring[p.tail % p.cap].done) pthread_cond_wait(&p.finished, &p.mu);
        while (ready < p.head && p.ring[ready % p.cap].done) ready++;
        pthread_mutex_unlock(&p.mu);
        for (uint64_t s = p.tail; s < ready; s++) {
            doc *d = &p.ring[s % p.cap]; /* finished documents are this thread's alone */
            if (!e) e = consume(j, d);
            done += d->bytes;
            ring_bytes -= d->ring_bytes;
            doc_free(d);
        }
        kiln_progress_update(prog, done);
        pthread_mutex_lock(&p.mu);
        p.tail = ready;
        pthread_mutex_unlock(&p.mu);
    }

    pthread_mutex_lock(&p.mu);
    p.stop = 1;
    pthread_cond_broadcast(&p.work);
    pthread_mutex_unlock(&p.mu);
    for (int t = 0; t < nt; t++) pthread_join(tid[t], NULL);
    for (uint64_t s = p.tail; s < nread; s++) doc_free(&p.ring[s % p.cap]);
    free(p.ring);
    pthread_cond_destroy(&p.finished);
    pthread_cond_destroy(&p.work);
    pthread_mutex_destroy(&p.mu);
    if (e) {
        kiln_error_free(read_err);
        return e;
    }
    return read_err;
}

static kiln_error *finish(job *j) {
    KILN_TRY(flush_shard(&j->sw[0]));
    KILN_TRY(flush_shard(&j->sw[1]));
    if (j->ndoc == 0)
        return kiln_errorf(KILN_EINVAL, "data prepare: the %zu input file%s hold no text", j->o->ninputs,
                           j->o->ninputs == 1 ? "" : "s");
    kiln_data_split_info sp[2];
    for (int s = 0; s < 2; s++)
        sp[s] = (kiln_data_split_info){(char *)j->sw[s].name, j->sw[s].tokens, j->sw[s].documents, j->sw[s].nshards,
                                       j->sw[s].shards};
    kiln_data_index ix = {KILN_DATA_INDEX_VERSION, j->tok_abs, j->tok_hash, j->vocab, j->eos,
                          kiln_shard_token_bytes((uint64_t)j->vocab), 2, sp};
    KILN_TRY(kiln_data_index_write(j->o->out_dir, &ix));
    for (int s = 0; s < 2; s++) remove_stale(j->o->out_dir, j->sw[s].name, j->sw[s].nshards);
    return NULL;
}

kiln_error *kiln_data_prepare(const kiln_data_prepare_opts *o) {
    KILN_TRY(check_opts(o));
    job j = {.o = o};
    kiln_error *e = setup(&j);
    if (!e) {
        kiln_progress p;
        kiln_progress_start(&p, "tokenize", j.input_bytes, "bytes");
        e = run(&j, &p);
        kiln_progress_finish(&p);
    }
    if (!e) e = finish(&j);
    reader_close(&j.rd);
    for (int s = 0; s < 2; s++) split_free(&j.sw[s]);
    free(j.tok_abs);
    kiln_tokenizer_free(j.tok);
    return e;
}
