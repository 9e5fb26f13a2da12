/* Byte-level BPE training, the algorithm of HF's BpeTrainer behind a ByteLevel pre-tokenizer
 * (GPT-2 regex, add_prefix_space false), as ByteLevelBPETokenizer.train(files) runs it:
 *
 *  1. every file is read line by line (each line keeps its "\n"), each line split by the GPT-2
 *     regex, and the pieces counted (on several threads, one word table each, then summed);
 *  2. the vocabulary starts with the special tokens, then the 256 byte-level characters sorted by
 *     code point;
 *  3. while the vocabulary is smaller than vocab_size, the pair of adjacent symbols with the
 *     highest count is merged (ties: the smaller pair of ids), counts are updated incrementally
 *     from the words that held the pair, and stale queue entries are re-queued with their current
 *     count, exactly as tokenizers' trainer does (including its quirks, so the merges agree).
 *
 * The result is a tokenizer.json written atomically. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/progress.h"
#include "heap.h"
#include "tokenizer_internal.h"

/* ---------------------------------------------------------------- 1. counting words */

typedef struct {
    const char *data;
    size_t start, end; /* whole lines */
} chunk;

typedef struct {
    const chunk *chunks;
    size_t nchunks, next;
    pthread_mutex_t mu;
} chunk_queue;

typedef struct {
    chunk_queue *q;
    kiln_strmap words; /* word bytes (pointing into the file data) -> count */
    int oom;
} counter;

static void count_text(counter *c, const char *s, size_t len) {
    size_t pos = 0;
    while (pos < len && !c->oom) {
        size_t e = kiln_scan_gpt2(s, len, pos);
        int64_t *slot;
        int r = kiln_strmap_put(&c->words, s + pos, e - pos, 0, &slot);
        if (r < 0) c->oom = 1;
        else (*slot)++;
        pos = e;
    }
}

static void *count_worker(void *arg) {
    counter *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->q->mu);
        size_t k = c->q->next++;
        pthread_mutex_unlock(&c->q->mu);
        if (k >= c->q->nchunks || c->oom) break;
        const chunk *ch = &c->q->chunks[k];
        size_t i = ch->start;
        while (i < ch->end && !c->oom) {
            const char *nl = memchr(ch->data + i, '\n', ch->end - i);
            size_t e = nl ? (size_t)(nl - ch->data) + 1 : ch->end;
            count_text(c, ch->data + i, e - i);
            i = e;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- 3. the merge queue */

typedef struct {
    int64_t count;
    uint32_t a, b;
    int32_t *pos; /* word indices */
    size_t npos;
} qentry;

/* HF's Merge ordering: higher count first, then the smaller (a, b). */
static int q_before(const void *p, const void *q) {
    const qentry *x = p, *y = q;
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

/* pair -> list of word indices (deduplicated: words are visited in runs) */
typedef struct {
    int32_t *v;
    size_t n, cap;
} ilist;

typedef struct {
    kiln_u64map index; /* pair -> index into lists */
    ilist *lists;
    uint64_t *pairs;
    size_t n, cap;
} where_map;

static int where_add(where_map *w, uint64_t pair, int32_t word) {
    uint64_t *slot;
    int r = kiln_u64map_put(&w->index, pair, w->n, &slot);
    if (r < 0) return -1;
    if (r == 1) {
        if (w->n == w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 256;
            ilist *l = realloc(w->lists, cap * sizeof *l);
            if (l) w->lists = l;
            uint64_t *p = realloc(w->pairs, cap * sizeof *p);
            if (p) w->pairs = p;
            if (!l || !p) return -1;
            w->cap = cap;
        }
        w->lists[w->n] = (ilist){0};
        w->pairs[w->n] = pair;
        w->n++;
    }
    ilist *l = &w->lists[*slot];
    if (l->n && l->v[l->n - 1] == word) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = word;
    return 0;
}

static void where_reset(where_map *w) {
    for (size_t i = 0; i < w->n; i++) free(w->lists[i].v);
    w->n = 0;
    kiln_u64map_free(&w->index);
}

static void where_free(where_map *w) {
    where_reset(w);
    free(w->lists);
    free(w->pairs);
}

/* ---------------------------------------------------------------- the vocabulary */

typedef struct {
    char **tok;   /* id -> token string (byte-level characters, or a special token as given) */
    size_t *len;
    size_t n, cap;
    kiln_strmap map; /* token -> id (keys are tok[]) */
} vocab;

/* The id of s, adding it if new. -1 when out of memory. */
static int64_t vocab_add(vocab *v, const char *s, size_t len) {
    int64_t *id = kiln_strmap_get(&v->map, s, len);
    if (id) return *id;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        char **t = realloc(v->tok, cap * sizeof *t);
        if (t) v->tok = t;
        size_t *l = realloc(v->len, cap * sizeof *l);
        if (l) v->len = l;
        if (!t || !l) return -1;
        v->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, s, len);
    copy[len] = 0;
    if (kiln_strmap_put(&v->map, copy, len, (int64_t)v->n, NULL) < 0) {
        free(copy);
        return -1;
    }
    v->tok[v->n] = copy;
    v->len[v->n] = len;
    return (int64_t)v->n++;
}

static void vocab_free(vocab *v) {
    for (size_t i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    kiln_strmap_free(&v->map);
}

/* ---------------------------------------------------------------- JSON output */

/* A JSON string as serde_json writes it. */
static int json_str(kiln_buf *b, const char *s, size_t len) {
    if (kiln_buf_putc(b, '"')) return -1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
        }
        if (e ? kiln_buf_put(b, e, strlen(e)) : kiln_buf_putc(b, (char)c)) return -1;
    }
    return kiln_buf_putc(b, '"');
}

static int puts_(kiln_buf *b, const char *s) { return kiln_buf_put(b, s, strlen(s)); }

static kiln_error *write_json(const char *out_path, const vocab *v, size_t nspecial, const uint64_t *merges,
                              size_t nmerges) {
    kiln_buf b = {0};
    int rc = puts_(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    char num[64];
    for (size_t i = 0; i < nspecial && !rc; i++) {
        snprintf(num, sizeof num, "%s\n    {\"id\": %zu, \"content\": ", i ? "," : "", i);
        rc = puts_(&b, num) || json_str(&b, v->tok[i], v->len[i]) ||
             puts_(&b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                       "\"special\": true}");
    }
    if (!rc)
        rc = puts_(&b, nspecial ? "\n  ],\n" : "],\n") ||
             puts_(&b, "  \"normalizer\": null,\n"
                       "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
                       "true, \"use_regex\": true},\n"
                       "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": "
                       "false, \"use_regex\": true},\n"
                       "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                       "\"use_regex\": true},\n"
                       "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
                       "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                       "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
                       "    \"vocab\": {");
    for (size_t i = 0; i < v->n && !rc; i++) {
        rc = puts_(&b, i ? ",\n      " : "\n      ") || json_str(&b, v->tok[i], v->len[i]);
        snprintf(num, sizeof num, ": %zu", i);
        if (!rc) rc = puts_(&b, num);
    }
    if (!rc) rc = puts_(&b, "\n    },\n    \"merges\": [");
    for (size_t i = 0; i < nmerges && !rc; i++) {
        uint32_t a = (uint32_t)(merges[i] >> 32), c = (uint32_t)merges[i];
        rc = puts_(&b, i ? ",\n      [" : "\n      [") || json_str(&b, v->tok[a], v->len[a]) || puts_(&b, ", ") ||
             json_str(&b, v->tok[c], v->len[c]) || puts_(&b, "]");
    }
    if (!rc) rc = puts_(&b, nmerges ? "\n    ]\n  }\n}\n" : "]\n  }\n}\n");
    kiln_error *e = rc ? kiln_errorf(KILN_ENOMEM, "%s: out of memory", out_path)
                       : kiln_write_file_atomic(out_path, b.p, b.n);
    kiln_buf_free(&b);
    return e;
}

/* ---------------------------------------------------------------- training */

typedef struct {
    /* inputs */
    char **data;
    size_t *size;
    size_t nfiles;
    /* words */
    const char **wptr;
    size_t *wlen;
    int64_t *wcount;
    size_t nwords;
    int32_t *sym;     /* all words' symbols back to back */
    size_t *woff, *wn; /* per word: offset into sym, current length */
    vocab voc;
    kiln_u64map pair_counts; /* pair -> count (int64 stored as uint64) */
    kiln_heap q; /* of qentry */
    where_map where;
    uint64_t *merges; /* (a << 32 | b) in order */
    size_t nmerges, merges_cap;
} trainer;

static void trainer_free(trainer *t) {
    for (size_t i = 0; i < t->nfiles; i++) free(t->data ? t->data[i] : NULL);
    free(t->data);
    free(t->size);
    free(t->wptr);
    free(t->wlen);
    free(t->wcount);
    free(t->sym);
    free(t->woff);
    free(t->wn);
    vocab_free(&t->voc);
    kiln_u64map_free(&t->pair_counts);
    for (size_t i = 0; i < t->q.n; i++) free(((qentry *)kiln_heap_at(&t->q, i))->pos);
    kiln_heap_free(&t->q);
    where_free(&t->where);
    free(t->merges);
}

static inline int64_t *pc_get(trainer *t, uint64_t pair) { return (int64_t *)kiln_u64map_get(&t->pair_counts, pair); }

static int pc_add(trainer *t, uint64_t pair, int64_t d) {
    uint64_t *slot;
    if (kiln_u64map_put(&t->pair_counts, pair, 0, &slot) < 0) return -1;
    *slot = (uint64_t)((int64_t)*slot + d);
    return 0;
}

/* A change of `d` occurrences of (a, b) in word w. */
static int change(trainer *t, uint32_t a, uint32_t b, int d, int32_t w) {
    uint64_t pair = ((uint64_t)a << 32) | b;
    if (pc_add(t, pair, d * t->wcount[w])) return -1;
    return d > 0 ? where_add(&t->where, pair, w) : 0;
}

/* tokenizers' trainer Word::merge on word w: replace each (a, b) left to right by id. */
static int merge_word(trainer *t, int32_t w, uint32_t a, uint32_t b, uint32_t id) {
    int32_t *s = t->sym + t->woff[w];
    size_t n = t->wn[w], j = 0, r = 0;
    while (r < n) {
        if ((uint32_t)s[r] == a && r + 1 < n && (uint32_t)s[r + 1] == b) {
            if (j > 0) {
                if (change(t, (uint32_t)s[j - 1], a, -1, w) || change(t, (uint32_t)s[j - 1], id, 1, w)) return -1;
            }
            if (r + 2 < n) {
                if (change(t, b, (uint32_t)s[r + 2], -1, w) || change(t, id, (uint32_t)s[r + 2], 1, w)) return -1;
            }
            s[j++] = (int32_t)id;
            r += 2;
        } else {
            s[j++] = s[r++];
        }
    }
    t->wn[w] = j;
    return 0;
}

static kiln_error *read_inputs(trainer *t, const char *const *files, size_t nfiles) {
    t->nfiles = nfiles;
    t->data = calloc(nfiles, sizeof *t->data);
    t->size = calloc(nfiles, sizeof *t->size);
    if (!t->data || !t->size) return kiln_errorf(KILN_ENOMEM, "train: out of memory");
    for (size_t i = 0; i < nfiles; i++) {
        KILN_TRY(kiln_read_file(files[i], &t->data[i], &t->size[i]));
        size_t ok = kiln_utf8_valid_prefix(t->data[i], t->size[i]);
        if (ok != t->size[i]) {
            size_t line = 1;
            for (size_t k = 0; k < ok; k++) line += t->data[i][k] == '\n';
            return kiln_errorf(KILN_EINVAL, "%s: line %zu is not valid UTF-8 (byte %zu)", files[i], line, ok);
        }
    }
    return NULL;
}

static kiln_error *count_words(trainer *t, int threads) {
    /* chunks of about 1 MiB, ending at line ends */
    size_t nch = 0, cap = 64;
    chunk *ch = malloc(cap * sizeof *ch);
    if (!ch) return kiln_errorf(KILN_ENOMEM, "train: out of memory");
    for (size_t f = 0; f < t->nfiles; f++) {
        size_t i = 0, n = t->size[f];
        while (i < n) {
            size_t e = i + (1u << 20) < n ? i + (1u << 20) : n;
            if (e < n) {
                const char *nl = memchr(t->data[f] + e, '\n', n - e);
                e = nl ? (size_t)(nl - t->data[f]) + 1 : n;
            }
            if (nch == cap) {
                chunk *c2 = realloc(ch, (cap *= 2) * sizeof *ch);
                if (!c2) {
                    free(ch);
                    return kiln_errorf(KILN_ENOMEM, "train: out of memory");
                }
                ch = c2;
            }
            ch[nch++] = (chunk){t->data[f], i, e};
            i = e;
        }
    }
    if (threads < 1) {
        long np = sysconf(_SC_NPROCESSORS_ONLN);
        threads = np > 0 ? (int)np : 1;
    }
    if ((size_t)threads > nch) threads = nch ? (int)nch : 1;
    chunk_queue q = {ch, nch, 0, PTHREAD_MUTEX_INITIALIZER};
    counter *cs = calloc((size_t)threads, sizeof *cs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    kiln_error *e = NULL;
    if (!cs || !th) e = kiln_errorf(KILN_ENOMEM, "train: out of memory");
    int started = 0;
    for (int i = 0; i < threads && !e; i++) {
        cs[i].q = &q;
        if (kiln_strmap_init(&cs[i].words, 1 << 16)) {
            e = kiln_errorf(KILN_ENOMEM, "train: out of memory");
            break;
        }
        if (i > 0 && pthread_create(&th[i], NULL, count_worker, &cs[i]) != 0) {
            e = kiln_errorf(KILN_EIO, "train: cannot start a thread");
            break;
        }
        started = i + 1;
    }
    if (!e && started) count_worker(&cs[0]);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    /* sum the tables into the first */
    for (int i = 0; i < started && !e; i++)
        if (cs[i].oom) e = kiln_errorf(KILN_ENOMEM, "train: out of memory");
    for (int i = 1; i < started && !e; i++) {
        for (size_t k = 0; k < cs[i].words.cap && !e; k++) {
            const kiln_strmap_slot *s = &cs[i].words.slots[k];
            if (!s->used) continue;
            int64_t *slot;
            if (kiln_strmap_put(&cs[0].words, s->key, s->len, 0, &slot) < 0) e = kiln_errorf(KILN_ENOMEM, "train");
            else *slot += s->value;
        }
    }
    if (!e && started) {
        const kiln_strmap *m = &cs[0].words;
        t->wptr = malloc((m->n + 1) * sizeof *t->wptr);
        t->wlen = malloc((m->n + 1) * sizeof *t->wlen);
        t->wcount = malloc((m->n + 1) * sizeof *t->wcount);
        if (!t->wptr || !t->wlen || !t->wcount) e = kiln_errorf(KILN_ENOMEM, "train: out of memory");
        for (size_t k = 0; k < m->cap && !e; k++) {
            if (!m->slots[k].used) continue;
            t->wptr[t->nwords] = m->slots[k].key;
            t->wlen[t->nwords] = m->slots[k].len;
            t->wcount[t->nwords] = m->slots[k].value;
            t->nwords++;
        }
    }
    for (int i = 0; cs && i < threads; i++) kiln_strmap_free(&cs[i].words);
    free(cs);
    free(th);
    free(ch);
    return e;
}

kiln_error *kiln_tokenizer_train_bpe(const char *const *files, size_t nfiles, const kiln_bpe_train_opts *o,
                                     const char *out_path) {
    if (!o || o->vocab_size < 1) return kiln_errorf(KILN_EINVAL, "train: vocab_size must be >= 1");
    if (nfiles == 0) return kiln_errorf(KILN_EINVAL, "train: no input files");
    if (o->vocab_size > INT32_MAX) return kiln_errorf(KILN_EINVAL, "train: vocab_size %lld is too large",
                                                      (long long)o->vocab_size);
    if (o->min_frequency < 0)
        return kiln_errorf(KILN_EINVAL, "train: min_frequency %lld must be at least 0", (long long)o->min_frequency);
    /* an empty special token would be no token at all: refused rather than dropped, since giving one replaces the
     * default <|endoftext|> and the caller would lose both */
    for (size_t i = 0; o->special && o->special[i]; i++)
        if (!*o->special[i]) return kiln_errorf(KILN_EINVAL, "train: special token %zu is empty", i + 1);
    trainer t;
    memset(&t, 0, sizeof t);
    t.q = kiln_heap_make(sizeof(qentry), 1024, q_before);
    kiln_error *e = NULL;
#define OOM_IF(cond)                                                   \
    do {                                                               \
        if (!e && (cond)) e = kiln_errorf(KILN_ENOMEM, "train: out of memory"); \
    } while (0)

    /* 2. the initial vocabulary: special tokens, then the byte-level alphabet by code point (built before the
     * inputs are read, which it does not depend on, so that a vocab_size below it fails at once) */
    size_t nspecial = 0;
    for (size_t i = 0; !e && o->special && o->special[i]; i++) {
        const char *s = o->special[i];
        size_t before = t.voc.n;
        OOM_IF(vocab_add(&t.voc, s, strlen(s)) < 0);
        if (t.voc.n > before) nspecial = t.voc.n;
    }
    int64_t byte_sym[256];
    int order[256];
    for (int b = 0; b < 256; b++) order[b] = b;
    for (int i = 1; i < 256; i++) /* insertion sort of the bytes by their code point */
        for (int j = i; j > 0 && kiln_bytelevel_cp[order[j - 1]] > kiln_bytelevel_cp[order[j]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int k = 0; k < 256 && !e; k++) {
        size_t l;
        const char *u = kiln_bytelevel_utf8((unsigned char)order[k], &l);
        byte_sym[order[k]] = vocab_add(&t.voc, u, l);
        OOM_IF(byte_sym[order[k]] < 0);
    }
    /* every byte needs its symbol, so the vocabulary cannot be smaller than this: asking for less would
     * quietly give this many tokens anyway */
    if (!e && (size_t)o->vocab_size < t.voc.n)
        e = kiln_errorf(KILN_EINVAL, "train: vocab_size %lld is below the minimum %zu: the byte-level alphabet's 256 "
                        "symbols and %zu special token(s) come first", (long long)o->vocab_size, t.voc.n, nspecial);
    if (!e) e = read_inputs(&t, files, nfiles);
    if (!e) e = count_words(&t, o->threads);

    /* words as symbol ids; pair counts and where each pair occurs */
    size_t total = 0;
    for (size_t w = 0; !e && w < t.nwords; w++) total += t.wlen[w];
    if (!e) {
        t.sym = malloc((total + 1) * sizeof *t.sym);
        t.woff = malloc((t.nwords + 1) * sizeof *t.woff);
        t.wn = malloc((t.nwords + 1) * sizeof *t.wn);
        OOM_IF(!t.sym || !t.woff || !t.wn);
        OOM_IF(kiln_u64map_init(&t.pair_counts, 1 << 16) || kiln_u64map_init(&t.where.index, 1 << 16));
    }
    for (size_t w = 0, off = 0; !e && w < t.nwords; w++) {
        t.woff[w] = off;
        t.wn[w] = t.wlen[w];
        for (size_t k = 0; k < t.wlen[w]; k++) t.sym[off + k] = (int32_t)byte_sym[(unsigned char)t.wptr[w][k]];
        for (size_t k = 0; k + 1 < t.wlen[w] && !e; k++) {
            uint64_t pair = ((uint64_t)(uint32_t)t.sym[off + k] << 32) | (uint32_t)t.sym[off + k + 1];
            OOM_IF(pc_add(&t, pair, t.wcount[w]) || where_add(&t.where, pair, (int32_t)w));
        }
        off += t.wlen[w];
    }
    for (size_t i = 0; !e && i < t.where.n; i++) {
        int64_t c = *pc_get(&t, t.where.pairs[i]);
        ilist *l = &t.where.lists[i];
        if (c > 0) {
            OOM_IF(kiln_heap_push(&t.q, &(qentry){c, (uint32_t)(t.where.pairs[i] >> 32), (uint32_t)t.where.pairs[i],
                                                  l->v, l->n}));
            if (!e) l->v = NULL;
        }
    }
    if (!e) where_reset(&t.where);

    /* 3. merges */
    kiln_progress prog;
    size_t target = (size_t)o->vocab_size > t.voc.n ? (size_t)o->vocab_size - t.voc.n : 0;
    const int started = !e; /* no progress line after an error (a vocab_size below the minimum, a bad input) */
    if (started) kiln_progress_start(&prog, "bpe merges", target, "merge");
    kiln_buf nt = {0};
    while (!e && (int64_t)t.voc.n < o->vocab_size && t.q.n) {
        qentry top;
        kiln_heap_pop(&t.q, &top);
        uint64_t pair = ((uint64_t)top.a << 32) | top.b;
        int64_t cur = *pc_get(&t, pair);
        if (top.count != cur) {
            top.count = cur;
            OOM_IF(kiln_heap_push(&t.q, &top));
            if (e) free(top.pos);
            continue;
        }
        if (top.count < 1 || o->min_frequency > top.count) {
            free(top.pos);
            break;
        }
        nt.n = 0;
        OOM_IF(kiln_buf_put(&nt, t.voc.tok[top.a], t.voc.len[top.a]) ||
               kiln_buf_put(&nt, t.voc.tok[top.b], t.voc.len[top.b]));
        int64_t id = e ? -1 : vocab_add(&t.voc, nt.p, nt.n);
        OOM_IF(id < 0);
        if (!e && t.nmerges == t.merges_cap) {
            size_t cap = t.merges_cap ? t.merges_cap * 2 : 1024;
            uint64_t *m = realloc(t.merges, cap * sizeof *m);
            OOM_IF(!m);
            if (m) {
                t.merges = m;
                t.merges_cap = cap;
            }
        }
        if (!e) t.merges[t.nmerges++] = pair;
        if (!e) OOM_IF(kiln_u64map_init(&t.where.index, 64));
        for (size_t i = 0; i < top.npos && !e; i++)
            OOM_IF(merge_word(&t, top.pos[i], top.a, top.b, (uint32_t)id));
        free(top.pos);
        for (size_t i = 0; i < t.where.n && !e; i++) {
            int64_t c = *pc_get(&t, t.where.pairs[i]);
            ilist *l = &t.where.lists[i];
            if (c > 0) {
                OOM_IF(kiln_heap_push(&t.q, &(qentry){c, (uint32_t)(t.where.pairs[i] >> 32),
                                                      (uint32_t)t.where.pairs[i], l->v, l->n}));
                if (!e) l->v = NULL;
            }
        }
        where_reset(&t.where);
        kiln_progress_update(&prog, t.nmerges);
    }
    if (started) kiln_progress_finish(&prog);
    kiln_buf_free(&nt);

    /* a pair merged twice keeps its last rank (HF collects the merges into a map) */
    if (!e) {
        kiln_u64map last;
        OOM_IF(kiln_u64map_init(&last, t.nmerges));
        for (size_t i = 0; i < t.nmerges && !e; i++) {
            uint64_t *slot;
            OOM_IF(kiln_u64map_put(&last, t.merges[i], i, &slot) < 0);
            if (!e) *slot = i;
        }
        size_t n = 0;
        for (size_t i = 0; i < t.nmerges && !e; i++)
            if (*kiln_u64map_get(&last, t.merges[i]) == i) t.merges[n++] = t.merges[i];
        if (!e) t.nmerges = n;
        kiln_u64map_free(&last);
    }
    if (!e) e = write_json(out_path, &t.voc, nspecial, t.merges, t.nmerges);
    trainer_free(&t);
    if (e) return kiln_error_wrap(e, "training a BPE tokenizer for %s", out_path);
    return NULL;
}
