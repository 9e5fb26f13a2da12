/* Shared pieces of the kiln command line: each subcommand is one file cmd_<name>.c. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stdint.h>

#include "kiln/error.h"
#include "kiln/zaya.h"

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
    const char *usage;                 /* printed by `kiln <cmd> --help` */
} kiln_cmd;

extern const kiln_cmd kiln_cmd_logits, kiln_cmd_generate, kiln_cmd_diff, kiln_cmd_train, kiln_cmd_data,
    kiln_cmd_tokenizer, kiln_cmd_bench, kiln_cmd_ckpt, kiln_cmd_run, kiln_cmd_size;

/* kiln cis (cmd_cis.c) and its embed subcommand (cmd_cis_embed.c) */
extern const kiln_cmd kiln_cmd_cis;
int cis_embed_main(int argc, char **argv);

/* Print "kiln <cmd>: <message>" for an error, free it, return the exit status 1. */
int cli_fail(const char *cmd, kiln_error *e);
/* True if argv has -h or --help. */
int cli_wants_help(int argc, char **argv);
/* Parse helpers: the error names the flag. */
kiln_error *cli_int(const char *flag, const char *s, int64_t *out);
/* cli_int within lo..hi (the error says so): for values stored in an int */
kiln_error *cli_int_in(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
kiln_error *cli_double(const char *flag, const char *s, double *out);

/* input_ids [B,T] (I64 or I32) from a safetensors file, as int64. */
kiln_error *cli_read_input_ids(const char *path, int64_t **ids, int64_t *B, int64_t *T);
/* Token ids must index the model's vocabulary; the error names [b, t]. */
kiln_error *cli_check_ids(const kiln_zaya *m, const char *what, const int64_t *ids, int64_t B, int64_t T);

#endif
