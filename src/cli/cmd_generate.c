/* kiln generate --model DIR --prompt-ids "1,2,3" [--max-new N --temperature T --top-k K --top-p P --seed S]
 * Decodes with the cache (K/V, CCA convolution history, delayed value), one token at a time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/rng.h"
#include "kiln/fsutil.h"
#include "kiln/sample.h"
#include "kiln/tokenizer.h"
#include "kiln/zaya.h"

static const char usage[] =
    "usage: kiln generate --model DIR (--prompt TEXT | --prompt-ids IDS) [options]\n\n"
    "Continues a prompt with a ZAYA model, decoding with a cache. With --prompt the text is encoded\n"
    "with the model's tokenizer (DIR/tokenizer.json, or --tokenizer) and the continuation printed as\n"
    "text; with --prompt-ids the whole sequence (prompt then new tokens) is printed as ids.\n\n"
    "  --model DIR          HF ZAYA model directory\n"
    "  --prompt TEXT        prompt text (needs a tokenizer)\n"
    "  --tokenizer FILE     tokenizer.json (default: DIR/tokenizer.json)\n"
    "  --prompt-ids IDS     comma-separated token ids, e.g. \"1,2,3\"\n"
    "  --max-new N          tokens to generate (default 32)\n"
    "  --temperature T      sampling temperature; 0 = greedy (default 1.0)\n"
    "  --top-k K            keep the K most likely tokens; 0 = off (default 0)\n"
    "  --top-p P            nucleus sampling mass; 1 = off (default 1.0)\n"
    "  --seed S             random seed (default 0)\n"
    "  --ignore-eos         do not stop at the model's eos_token_id\n";

static kiln_error *parse_ids(const char *s, int64_t **ids, int64_t *n) {
    int64_t cap = 16, k = 0;
    int64_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return kiln_errorf(KILN_ENOMEM, "--prompt-ids");
    const char *p = s;
    while (*p) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p) {
            free(v);
            return kiln_errorf(KILN_EINVAL, "--prompt-ids: expected an integer at character %lld of '%s'",
                               (long long)(p - s) + 1, s);
        }
        if (k == cap) {
            int64_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) { free(v); return kiln_errorf(KILN_ENOMEM, "--prompt-ids"); }
            v = nv;
        }
        v[k++] = x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) {
            free(v);
            return kiln_errorf(KILN_EINVAL, "--prompt-ids: unexpected '%c' at character %lld of '%s'", *p,
                               (long long)(p - s) + 1, s);
        }
    }
    if (!k) { free(v); return kiln_errorf(KILN_EINVAL, "--prompt-ids: no ids given"); }
    *ids = v;
    *n = k;
    return NULL;
}

typedef struct {
    const char *model, *prompt, *text, *tokenizer;
    int64_t max_new, seed;
    int ignore_eos;
    kiln_sample_opts so;
} gen_args;

static kiln_error *run(const gen_args *g) {
    kiln_zaya *m = NULL;
    kiln_zaya_cache *c = NULL;
    int64_t *ids = NULL, n = 0;
    float *logits = NULL;
    kiln_sample_cand *work = NULL;
    kiln_tokenizer *tok = NULL;
    kiln_error *e = kiln_zaya_load_dir(g->model, &m);
    if (!e && g->text) {
        char *tp = g->tokenizer ? NULL : kiln_path_join(g->model, "tokenizer.json");
        e = kiln_tokenizer_load(g->tokenizer ? g->tokenizer : tp, &tok);
        free(tp);
        size_t nn = 0;
        if (!e) e = kiln_tokenizer_encode(tok, g->text, strlen(g->text), &ids, &nn);
        n = (int64_t)nn;
        if (!e && n == 0) e = kiln_errorf(KILN_EINVAL, "--prompt: the text encodes to no tokens");
    } else if (!e) {
        e = parse_ids(g->prompt, &ids, &n);
    }
    /* --prompt's ids come from the tokenizer: one past the model's vocabulary means the two do not belong together */
    if (!e) e = cli_check_ids(m, g->text ? "--prompt (the tokenizer's ids)" : "--prompt-ids", ids, 1, n);
    if (!e) {
        const int64_t V = m->cfg.vocab_size;
        int64_t *all = realloc(ids, (size_t)(n + g->max_new) * sizeof *ids);
        logits = malloc((size_t)(n * V) * sizeof *logits);
        work = malloc((size_t)V * sizeof *work);
        if (!all || !logits || !work) e = kiln_errorf(KILN_ENOMEM, "generate");
        if (all) ids = all;
        if (!e) e = kiln_zaya_cache_create(m, 1, n + g->max_new, &c);
        if (!e) e = kiln_zaya_decode(m, c, ids, n, logits); /* prefill */
        kiln_rng rng;
        kiln_rng_seed(&rng, (uint64_t)g->seed);
        const float *last = logits + (n - 1) * V;
        /* with a tokenizer, only ids it can decode (a model's vocabulary may be padded past it) */
        int64_t Vs = tok && kiln_tokenizer_vocab_size(tok) < V ? kiln_tokenizer_vocab_size(tok) : V;
        for (int64_t i = 0; !e && i < g->max_new; i++) {
            int64_t next = kiln_sample(last, Vs, &g->so, &rng, work);
            ids[n++] = next;
            if (!g->ignore_eos && next == m->cfg.eos_token_id) break;
            if (i + 1 < g->max_new) {
                e = kiln_zaya_decode(m, c, &ids[n - 1], 1, logits);
                last = logits;
            }
        }
    }
    if (!e && tok) { /* the prompt and its continuation as text */
        char *text = NULL;
        size_t len = 0;
        int64_t shown = n;
        if (!g->ignore_eos && shown > 0 && ids[shown - 1] == m->cfg.eos_token_id) shown--; /* the stop, not text */
        e = kiln_tokenizer_decode(tok, ids, (size_t)shown, &text, &len);
        if (!e) printf("%s\n", text);
        free(text);
    } else if (!e) {
        for (int64_t i = 0; i < n; i++) printf(i ? ",%lld" : "%lld", (long long)ids[i]);
        printf("\n");
    }
    kiln_tokenizer_free(tok);
    free(ids);
    free(logits);
    free(work);
    kiln_zaya_cache_free(c);
    kiln_zaya_free(m);
    return e;
}

static int cmd(int argc, char **argv) {
    gen_args g = {NULL, NULL, NULL, NULL, 32, 0, 0, {1.0, 0, 1.0}};
    kiln_error *e = NULL;
    for (int i = 1; i < argc && !e; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ignore-eos")) { g.ignore_eos = 1; continue; }
        if (!v) { e = kiln_errorf(KILN_EINVAL, "%s needs a value (see kiln generate --help)", a); break; }
        i++;
        if (!strcmp(a, "--model")) g.model = v;
        else if (!strcmp(a, "--prompt-ids")) g.prompt = v;
        else if (!strcmp(a, "--prompt")) g.text = v;
        else if (!strcmp(a, "--tokenizer")) g.tokenizer = v;
        else if (!strcmp(a, "--max-new")) e = cli_int(a, v, &g.max_new);
        else if (!strcmp(a, "--temperature")) e = cli_double(a, v, &g.so.temperature);
        else if (!strcmp(a, "--top-k")) e = cli_int(a, v, &g.so.top_k);
        else if (!strcmp(a, "--top-p")) e = cli_double(a, v, &g.so.top_p);
        else if (!strcmp(a, "--seed")) e = cli_int(a, v, &g.seed);
        else e = kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln generate --help)", a);
    }
    if (!e && g.prompt && g.text) e = kiln_errorf(KILN_EINVAL, "give --prompt or --prompt-ids, not both");
    if (!e && (!g.model || !(g.prompt || g.text)))
        e = kiln_errorf(KILN_EINVAL, "--model and one of --prompt or --prompt-ids are required");
    if (!e && (g.max_new < 0 || g.max_new > 1000000)) e = kiln_errorf(KILN_EINVAL, "--max-new must be in 0..1000000");
    if (!e && g.so.top_k < 0) e = kiln_errorf(KILN_EINVAL, "--top-k must be >= 0");
    if (!e && !(g.so.temperature >= 0 && isfinite(g.so.temperature)))
        e = kiln_errorf(KILN_EINVAL, "--temperature %g: expected 0 (greedy) or a positive number", g.so.temperature);
    if (!e && !(g.so.top_p > 0 && g.so.top_p <= 1))
        e = kiln_errorf(KILN_EINVAL, "--top-p %g: expected a probability mass in (0, 1] (1 = off)", g.so.top_p);
    if (!e) e = run(&g);
    return e ? cli_fail("generate", e) : 0;
}

const kiln_cmd kiln_cmd_generate = {"generate", "continue a prompt of token ids with a ZAYA model", cmd, usage};
