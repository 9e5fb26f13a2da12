/* kiln data prepare --tokenizer T --input FILE... --out DIR [--shard-tokens N] [--threads N] [--val-fraction F]
 * kiln data inspect DIR
 *
 * prepare tokenizes text into token shards (docs/data-format.md); inspect lists a prepared
 * directory and verifies every shard against its checksum and index.json. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/data.h"

static const char usage[] =
    "usage: kiln data prepare --tokenizer FILE --input FILE... --out DIR [options]\n"
    "       kiln data inspect DIR\n\n"
    "prepare: tokenizes text files into token shards for `kiln train`: DIR/train_000000.bin, ...,\n"
    "DIR/val_000000.bin, ... and DIR/index.json (format: docs/data-format.md). A .jsonl input holds\n"
    "one document per line (its \"text\" field); any other file is one document. Every document\n"
    "ends with the tokenizer's end-of-text token (<|endoftext|>, <eos> or </s>) when it has one.\n"
    "The output is the same for any number of threads.\n\n"
    "  --tokenizer FILE     HF tokenizer.json\n"
    "  --input FILE...      input files (several after one --input, or --input repeated)\n"
    "  --out DIR            output directory (created if missing)\n"
    "  --shard-tokens N     tokens per shard, about (default 67108864); shards are cut between\n"
    "                       documents, unless one document is larger than a shard\n"
    "  --threads N          tokenizer threads (default: all cores)\n"
    "  --val-fraction F     fraction of documents held out for validation, 0 <= F < 1 (default\n"
    "                       0.01); every 1/F-th document, starting with the second\n\n"
    "inspect: prints the splits, shards, token and document counts and the vocabulary of DIR, and\n"
    "verifies every shard (checksum, token ids, counts against index.json). Exit 1 if any fails.\n";

static int usage_error(kiln_error *e) {
    fprintf(stderr, "kiln data: error: %s\n", kiln_error_msg(e));
    kiln_error_free(e);
    return 2;
}

static int prepare(int argc, char **argv) {
    kiln_data_prepare_opts o = {0};
    o.val_fraction = 0.01;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) return cli_fail("data", kiln_errorf(KILN_ENOMEM, "out of memory"));
    size_t ninputs = 0;
    kiln_error *e = NULL;
    int usage_err = 0;
    for (int i = 1; i < argc && !e; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--input")) {
            int k = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) inputs[ninputs++] = argv[++i], k++;
            if (!k) e = kiln_errorf(KILN_EINVAL, "--input needs at least one file");
        } else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--out") || !strcmp(a, "--shard-tokens") ||
                   !strcmp(a, "--threads") || !strcmp(a, "--val-fraction")) {
            if (!has_value) {
                e = kiln_errorf(KILN_EINVAL, "%s needs a value", a);
                break;
            }
            const char *v = argv[++i];
            int64_t n = 0;
            if (!strcmp(a, "--tokenizer")) o.tokenizer_path = v;
            else if (!strcmp(a, "--out")) o.out_dir = v;
            else if (!strcmp(a, "--val-fraction")) e = cli_double(a, v, &o.val_fraction);
            else if (!(e = cli_int(a, v, &n))) {
                if (!strcmp(a, "--shard-tokens")) {
                    if (n < 1) e = kiln_errorf(KILN_EINVAL, "--shard-tokens must be >= 1, got %" PRId64, n);
                    o.shard_tokens = n;
                } else {
                    if (n < 1 || n > 4096) e = kiln_errorf(KILN_EINVAL, "--threads must be in 1..4096, got %" PRId64, n);
                    o.threads = (int)n;
                }
            }
        } else {
            e = kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln data --help)", a);
        }
    }
    usage_err = e != NULL;
    if (!e && (!o.tokenizer_path || !o.out_dir || !ninputs)) {
        e = kiln_errorf(KILN_EINVAL, "data prepare needs --tokenizer, --input and --out (see kiln data --help)");
        usage_err = 1;
    }
    if (!e && !(o.val_fraction >= 0 && o.val_fraction < 1)) {
        e = kiln_errorf(KILN_EINVAL, "--val-fraction must be in [0, 1), got %g", o.val_fraction);
        usage_err = 1;
    }
    if (!e) {
        o.inputs = inputs;
        o.ninputs = ninputs;
        e = kiln_data_prepare(&o);
    }
    int rc = 0;
    if (e) rc = usage_err ? usage_error(e) : cli_fail("data", e);
    else printf("wrote %s/index.json\n", o.out_dir);
    if (!rc) {
        /* print the summary, as inspect would, without re-verifying */
        kiln_data_index *ix = NULL;
        if (!kiln_data_index_read(o.out_dir, &ix)) {
            for (size_t s = 0; s < ix->nsplits; s++)
                printf("  %-5s %zu shards, %" PRIu64 " tokens, %" PRIu64 " documents\n", ix->splits[s].name,
                       ix->splits[s].nshards, ix->splits[s].tokens, ix->splits[s].documents);
            kiln_data_index_free(ix);
        }
    }
    free(inputs);
    return rc;
}

static int inspect(const char *dir) {
    kiln_data_index *ix = NULL;
    kiln_error *e = kiln_data_index_read(dir, &ix);
    if (e) return cli_fail("data", e);
    printf("%s: index version %" PRId64 ", vocab %" PRId64 " (u%u tokens), eos id ", dir, ix->version,
           ix->vocab_size, 8 * ix->token_bytes);
    if (ix->eos_id >= 0) printf("%" PRId64 "\n", ix->eos_id);
    else printf("none\n");
    uint64_t h = 0, size = 0;
    kiln_error *te = kiln_fnv1a64_file(ix->tokenizer_path, &h, &size);
    printf("tokenizer %s (fnv1a64 %016" PRIx64 "): %s\n", ix->tokenizer_path, ix->tokenizer_checksum,
           te ? "not found here" : h == ix->tokenizer_checksum ? "matches" : "CHANGED since the shards were made");
    kiln_error_free(te);
    size_t nbad = 0, nall = 0;
    for (size_t s = 0; s < ix->nsplits; s++) {
        const kiln_data_split_info *sp = &ix->splits[s];
        printf("split %s: %zu shards, %" PRIu64 " tokens, %" PRIu64 " documents\n", sp->name, sp->nshards, sp->tokens,
               sp->documents);
        for (size_t k = 0; k < sp->nshards; k++) {
            const kiln_data_shard_info *si = &sp->shards[k];
            kiln_shard sh;
            e = kiln_data_open_shard(dir, ix, si, &sh);
            printf("  %-20s %12" PRIu64 " tokens %10" PRIu64 " documents  fnv1a64 %016" PRIx64 "  %s\n", si->file,
                   si->tokens, si->documents, si->checksum, e ? "FAILED" : "ok");
            fflush(stdout);
            nall++;
            if (e) {
                nbad++;
                fprintf(stderr, "kiln data: error: %s\n", kiln_error_msg(e));
                kiln_error_free(e);
            } else {
                kiln_shard_close(&sh);
            }
        }
    }
    kiln_data_index_free(ix);
    if (nbad) {
        fprintf(stderr, "kiln data: error: %zu of %zu shards failed verification\n", nbad, nall);
        return 1;
    }
    printf("all %zu shards verified\n", nall);
    return 0;
}

static int cmd(int argc, char **argv) {
    if (argc < 2)
        return usage_error(kiln_errorf(KILN_EINVAL, "expected a subcommand: prepare or inspect (see kiln data --help)"));
    if (!strcmp(argv[1], "prepare")) return prepare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "inspect")) {
        if (argc != 3) return usage_error(kiln_errorf(KILN_EINVAL, "usage: kiln data inspect DIR"));
        return inspect(argv[2]);
    }
    return usage_error(kiln_errorf(KILN_EINVAL, "unknown subcommand '%s': expected prepare or inspect", argv[1]));
}

const kiln_cmd kiln_cmd_data = {"data", "tokenize text into training shards; inspect and verify them", cmd, usage};
