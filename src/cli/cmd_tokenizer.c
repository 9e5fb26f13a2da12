/* kiln tokenizer train|encode|decode: HF tokenizer.json BPE tokenizers from the command line.
 *
 *   kiln tokenizer train --vocab N --input FILE... --out tokenizer.json [--special TOKEN]...
 *   kiln tokenizer encode --tokenizer T (--text STR | --file F)     prints ids as 1,2,3
 *   kiln tokenizer decode --tokenizer T --ids 1,2,3                  prints the text */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/fsutil.h"
#include "kiln/tokenizer.h"

static const char usage[] =
    "usage: kiln tokenizer train --vocab N --input FILE... --out tokenizer.json [--special TOKEN]...\n"
    "                            [--threads N] [--min-frequency N]\n"
    "       kiln tokenizer encode --tokenizer tokenizer.json (--text STR | --file FILE)\n"
    "       kiln tokenizer decode --tokenizer tokenizer.json --ids 1,2,3\n\n"
    "Byte-level BPE training and exact HF `tokenizers` encoding/decoding of tokenizer.json BPE models\n"
    "(GPT-2 / Llama-3 byte-level, SentencePiece-style with byte fallback such as Gemma).\n\n"
    "train    learns a byte-level BPE (GPT-2 regex, as HF's ByteLevelBPETokenizer) from the files, read\n"
    "         line by line; writes a tokenizer.json that HF `tokenizers` loads\n"
    "  --vocab N          vocabulary size, special tokens and the 256 byte symbols included (so at least\n"
    "                     256 + the special tokens)\n"
    "  --input FILE...    UTF-8 text files (several after one --input, or --input repeated)\n"
    "  --out FILE         where to write tokenizer.json (atomically)\n"
    "  --special TOKEN    a special token, not empty, ids 0.. in order (repeatable; default <|endoftext|>)\n"
    "  --threads N        threads for counting words (default: all cores)\n"
    "  --min-frequency N  stop when the most frequent pair is rarer than N, N >= 0 (default 0)\n"
    "encode   prints the ids of the text, comma-separated (no special tokens are added)\n"
    "  --tokenizer FILE   a tokenizer.json\n"
    "  --text STR | --file FILE   the text, given or read from a file (bytes as they are)\n"
    "decode   prints the text of the ids (special tokens kept), then a newline\n"
    "  --tokenizer FILE   a tokenizer.json\n"
    "  --ids LIST         comma-separated ids\n";

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "kiln tokenizer: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see kiln tokenizer --help)\n");
    return 2;
}

static int train(int argc, char **argv) {
    const char *out = NULL;
    int64_t vocab = 0, threads = 0, minf = 0;
    int have_vocab = 0;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    const char **special = calloc((size_t)argc + 2, sizeof *special);
    size_t ninputs = 0, nspecial = 0;
    int rc = 0;
    kiln_error *e = NULL;
    if (!inputs || !special) {
        free(inputs);
        free(special);
        return cli_fail("tokenizer", kiln_errorf(KILN_ENOMEM, "out of memory"));
    }
    for (int i = 1; i < argc && !rc && !e; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--input")) {
            int k = i + 1;
            while (k < argc && strncmp(argv[k], "--", 2) != 0) inputs[ninputs++] = argv[k++];
            if (k == i + 1) rc = usage_error("%s needs at least one file", a);
            i = k - 1;
            continue;
        }
        int is_value = !strcmp(a, "--vocab") || !strcmp(a, "--out") || !strcmp(a, "--special") ||
                       !strcmp(a, "--threads") || !strcmp(a, "--min-frequency");
        if (!is_value) {
            rc = usage_error("unknown option '%s'", a);
            break;
        }
        if (i + 1 >= argc) {
            rc = usage_error("%s needs a value", a);
            break;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--vocab")) {
            e = cli_int("--vocab", v, &vocab);
            have_vocab = 1;
        } else if (!strcmp(a, "--out")) {
            out = v;
        } else if (!strcmp(a, "--special")) {
            /* an empty one would be dropped, and with it the default <|endoftext|> it replaces */
            if (!*v) e = kiln_errorf(KILN_EINVAL, "--special: a special token cannot be empty");
            special[nspecial++] = v;
        } else if (!strcmp(a, "--threads")) {
            e = cli_int("--threads", v, &threads);
        } else {
            e = cli_int("--min-frequency", v, &minf);
        }
    }
    if (!rc && !e && (!have_vocab || !ninputs || !out)) rc = usage_error("%s", "train needs --vocab, --input and --out");
    if (!rc && !e && vocab < 1) e = kiln_errorf(KILN_EINVAL, "--vocab: must be at least 1, got %lld", (long long)vocab);
    if (!rc && !e && minf < 0)
        e = kiln_errorf(KILN_EINVAL, "--min-frequency: must be at least 0, got %lld", (long long)minf);
    if (!rc && !e && (threads < 0 || threads > 4096))
        e = kiln_errorf(KILN_EINVAL, "--threads: must be between 0 and 4096, got %lld", (long long)threads);
    if (!rc && !e) {
        if (!nspecial) special[nspecial++] = "<|endoftext|>";
        kiln_bpe_train_opts o = {.vocab_size = vocab, .special = special, .threads = (int)threads,
                                 .min_frequency = minf};
        e = kiln_tokenizer_train_bpe(inputs, ninputs, &o, out);
        if (!e) {
            kiln_tokenizer *t = NULL;
            e = kiln_tokenizer_load(out, &t);
            if (!e) printf("wrote %s: vocabulary of %lld tokens\n", out, (long long)kiln_tokenizer_vocab_size(t));
            kiln_tokenizer_free(t);
        }
    }
    free(inputs);
    free(special);
    if (e) return cli_fail("tokenizer", e);
    return rc;
}

/* --tokenizer/--text/--file/--ids, whichever the subcommand takes. */
static int parse_common(int argc, char **argv, const char *allowed, const char **tok, const char **text,
                        const char **file, const char **ids) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], **dst = NULL;
        if (!strcmp(a, "--tokenizer")) dst = tok;
        else if (!strcmp(a, "--text") && strstr(allowed, "text")) dst = text;
        else if (!strcmp(a, "--file") && strstr(allowed, "file")) dst = file;
        else if (!strcmp(a, "--ids") && strstr(allowed, "ids")) dst = ids;
        if (!dst) return usage_error("unknown option '%s'", a);
        if (i + 1 >= argc) return usage_error("%s needs a value", a);
        *dst = argv[++i];
    }
    if (!*tok) return usage_error("%s", "--tokenizer is required");
    return 0;
}

static int encode(int argc, char **argv) {
    const char *tok = NULL, *text = NULL, *file = NULL, *unused = NULL;
    int rc = parse_common(argc, argv, "text file", &tok, &text, &file, &unused);
    if (rc) return rc;
    if (!text == !file) return usage_error("%s", "encode needs exactly one of --text and --file");
    char *data = NULL;
    size_t len = text ? strlen(text) : 0;
    kiln_tokenizer *t = NULL;
    int64_t *ids = NULL;
    size_t n = 0;
    kiln_error *e = file ? kiln_read_file(file, &data, &len) : NULL;
    if (!e) e = kiln_tokenizer_load(tok, &t);
    if (!e) e = kiln_tokenizer_encode(t, file ? data : text, len, &ids, &n);
    if (e && file) e = kiln_error_wrap(e, "%s", file);
    if (!e) {
        for (size_t i = 0; i < n; i++) printf(i ? ",%lld" : "%lld", (long long)ids[i]);
        printf("\n");
    }
    free(ids);
    free(data);
    kiln_tokenizer_free(t);
    return e ? cli_fail("tokenizer", e) : 0;
}

/* "1,2,3" (spaces allowed around ids; empty means no ids). */
static kiln_error *parse_ids(const char *s, int64_t **ids, size_t *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids) return kiln_errorf(KILN_ENOMEM, "--ids: out of memory");
    const char *p = s;
    while (*p == ' ') p++;
    if (!*p) return NULL;
    for (size_t k = 0;; k++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        const char *q = end;
        while (*q == ' ') q++;
        if (end == p || errno || (*q && *q != ',')) {
            free(*ids);
            *ids = NULL;
            return kiln_errorf(KILN_EINVAL, "--ids: item %zu ('%.*s') is not an integer", k + 1,
                               (int)strcspn(p, ","), p);
        }
        (*ids)[(*n)++] = v;
        if (!*q) return NULL;
        p = q + 1;
        while (*p == ' ') p++;
    }
}

static int decode(int argc, char **argv) {
    const char *tok = NULL, *ids_s = NULL, *u1 = NULL, *u2 = NULL;
    int rc = parse_common(argc, argv, "ids", &tok, &u1, &u2, &ids_s);
    if (rc) return rc;
    if (!ids_s) return usage_error("%s", "decode needs --ids");
    int64_t *ids = NULL;
    size_t n = 0, len = 0;
    char *text = NULL;
    kiln_tokenizer *t = NULL;
    kiln_error *e = parse_ids(ids_s, &ids, &n);
    if (!e) e = kiln_tokenizer_load(tok, &t);
    if (!e) e = kiln_tokenizer_decode(t, ids, n, &text, &len);
    if (!e) {
        fwrite(text, 1, len, stdout);
        printf("\n");
    }
    free(text);
    free(ids);
    kiln_tokenizer_free(t);
    return e ? cli_fail("tokenizer", e) : 0;
}

static int cmd(int argc, char **argv) {
    if (argc < 2) return usage_error("%s", "expected a subcommand: train, encode or decode");
    if (!strcmp(argv[1], "train")) return train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "encode")) return encode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "decode")) return decode(argc - 1, argv + 1);
    return usage_error("unknown subcommand '%s' (train, encode, decode)", argv[1]);
}

const kiln_cmd kiln_cmd_tokenizer = {"tokenizer", "train, encode and decode HF tokenizer.json BPE tokenizers", cmd,
                                     usage};
