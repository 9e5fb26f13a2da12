/* The texts of a run and the judge's contrast sets (see textset.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/hash.h"
#include "textset.h"

/* Texts are interned through an open-addressing table (ids in insertion order, so the
 * embedding order is deterministic). */
typedef struct {
    int *slot; /* text id + 1, 0 = empty */
    size_t cap;
} table;

static int intern(cis_textset *ts, table *tb, const char *prefix, const char *s) {
    char buf[2048];
    snprintf(buf, sizeof buf, "%s%s", prefix, s);
    uint64_t h = kiln_fnv1a64(KILN_FNV1A64_INIT, buf, strlen(buf));
    if ((size_t)(ts->ntext + 1) * 2 > tb->cap) { /* grow and rehash */
        size_t cap = tb->cap ? tb->cap * 2 : 1024;
        int *ns = calloc(cap, sizeof *ns);
        if (!ns) return -1;
        for (int i = 0; i < ts->ntext; i++) {
            uint64_t hi = kiln_fnv1a64(KILN_FNV1A64_INIT, ts->text[i], strlen(ts->text[i]));
            size_t k = hi & (cap - 1);
            while (ns[k]) k = (k + 1) & (cap - 1);
            ns[k] = i + 1;
        }
        free(tb->slot);
        tb->slot = ns, tb->cap = cap;
    }
    size_t k = h & (tb->cap - 1);
    for (; tb->slot[k]; k = (k + 1) & (tb->cap - 1))
        if (!strcmp(ts->text[tb->slot[k] - 1], buf)) return tb->slot[k] - 1;
    char **nt = realloc(ts->text, (size_t)(ts->ntext + 1) * sizeof *nt);
    if (!nt) return -1;
    ts->text = nt;
    if (!(ts->text[ts->ntext] = cis_strdup(buf))) return -1;
    tb->slot[k] = ts->ntext + 1;
    return ts->ntext++;
}

static int add_unique(int *v, int *n, int x) {
    for (int i = 0; i < *n; i++)
        if (v[i] == x) return 0;
    v[(*n)++] = x;
    return 1;
}

kiln_error *cis_textset_build(const kiln_cis_suite *s, cis_textset *ts) {
    memset(ts, 0, sizeof *ts);
    kiln_error *oom = NULL;
    table tb = {NULL, 0};
    ts->pc = calloc((size_t)s->n, sizeof *ts->pc);
    ts->context = malloc((size_t)s->n * sizeof *ts->context);
    ts->generic_context = malloc((size_t)s->n * sizeof *ts->generic_context);
    int absence = intern(ts, &tb, "", CIS_ABSENCE_TEXT);
    if (!ts->pc || !ts->context || !ts->generic_context || absence < 0) goto nomem;
    for (int i = 0; i < s->n; i++) {
        const kiln_cis_prompt *p = &s->p[i];
        if ((ts->context[i] = intern(ts, &tb, "", p->context)) < 0) goto nomem;
        ts->generic_context[i] = p->generic_context ? intern(ts, &tb, "", p->generic_context) : -1;
        if (p->generic_context && ts->generic_context[i] < 0) goto nomem;
        if (!(ts->pc[i] = calloc((size_t)p->ncomp, sizeof **ts->pc))) goto nomem;
        for (int c = 0; c < p->ncomp; c++) {
            cis_comp_texts *ct = &ts->pc[i][c];
            ct->generic = -1;
            if ((ct->text = intern(ts, &tb, "a photo of ", p->comp[c].phrase)) < 0) goto nomem;
            /* at most: generic, absence, one equivalent per other prompt */
            if (!(ct->contrast = malloc((size_t)(s->n + 2) * sizeof *ct->contrast))) goto nomem;
            if (p->comp[c].generic) {
                if ((ct->generic = intern(ts, &tb, "a photo of ", p->comp[c].generic)) < 0) goto nomem;
                if (ct->generic != ct->text) add_unique(ct->contrast, &ct->ncontrast, ct->generic);
            }
            add_unique(ct->contrast, &ct->ncontrast, absence);
            /* other cultures' equivalents: the component in the same position of the same
             * category's scenes (scenes list their components in the same order of salience) */
            for (int j = 0; j < s->n; j++) {
                const kiln_cis_prompt *q = &s->p[j];
                if (strcmp(q->category, p->category) || !strcmp(q->culture, p->culture) || q->ncomp <= c) continue;
                int t = intern(ts, &tb, "a photo of ", q->comp[c].phrase);
                if (t < 0) goto nomem;
                if (t != ct->text) add_unique(ct->contrast, &ct->ncontrast, t);
            }
        }
    }
    free(tb.slot);
    return NULL;
nomem:
    free(tb.slot);
    oom = kiln_errorf(KILN_ENOMEM, "out of memory building the judge's texts");
    cis_textset_free(ts, s);
    return oom;
}

void cis_textset_free(cis_textset *ts, const kiln_cis_suite *s) {
    for (int i = 0; ts->pc && i < s->n; i++) {
        if (!ts->pc[i]) continue;
        for (int c = 0; c < s->p[i].ncomp; c++) free(ts->pc[i][c].contrast);
        free(ts->pc[i]);
    }
    for (int i = 0; i < ts->ntext; i++) free(ts->text[i]);
    free(ts->text), free(ts->pc), free(ts->context), free(ts->generic_context);
    memset(ts, 0, sizeof *ts);
}
