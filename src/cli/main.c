/* kiln: one binary, one subcommand per job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <math.h>

#include "cli.h"

static const kiln_cmd *const commands[] = {&kiln_cmd_train, &kiln_cmd_run, &kiln_cmd_generate, &kiln_cmd_logits, &kiln_cmd_data, &kiln_cmd_tokenizer, &kiln_cmd_bench, &kiln_cmd_ckpt, &kiln_cmd_size, &kiln_cmd_cis, &kiln_cmd_diff};
#define NCMD (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "kiln: pretraining and auditing toolkit for mixture-of-experts language models\n\n"
               "usage: kiln <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < NCMD; i++) fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(f, "  %-10s %s\n\n", "help", "this text, or `kiln help <command>`");
    fprintf(f, "`kiln <command> --help` describes a command's options.\n");
}

int cli_fail(const char *cmd, kiln_error *e) {
    fprintf(stderr, "kiln %s: error: %s\n", cmd, kiln_error_msg(e));
    kiln_error_free(e);
    return 1;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) /* after "--": another command's arguments */
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

kiln_error *cli_int(const char *flag, const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return kiln_errorf(KILN_EINVAL, "%s: '%s' is not an integer", flag, s);
    *out = v;
    return NULL;
}

kiln_error *cli_int_in(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v = 0;
    KILN_TRY(cli_int(flag, s, &v));
    if (v < lo || v > hi)
        return kiln_errorf(KILN_EINVAL, "%s must be %lld..%lld, got %lld", flag, (long long)lo, (long long)hi, (long long)v);
    *out = v;
    return NULL;
}

kiln_error *cli_double(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* strtod also reads "nan" and "inf": no flag means either, and NaN fails every comparison (a --tol of nan
     * would pass any difference) */
    if (errno || end == s || *end || !isfinite(v)) return kiln_errorf(KILN_EINVAL, "%s: '%s' is not a number", flag, s);
    *out = v;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        if (argc >= 3 && !strcmp(argv[1], "help"))
            for (size_t i = 0; i < NCMD; i++)
                if (!strcmp(argv[2], commands[i]->name)) {
                    fputs(commands[i]->usage, stdout);
                    return 0;
                }
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < NCMD; i++)
        if (!strcmp(argv[1], commands[i]->name)) {
            /* `kiln bench <name> --help` and `kiln cis embed --help` are the subcommand's own help; elsewhere
             * --help anywhere wins */
            int sub_help = (!strcmp(argv[1], "bench") && argc > 2 && argv[2][0] != '-') ||
                           (!strcmp(argv[1], "cis") && argc > 2 && !strcmp(argv[2], "embed"));
            if (!sub_help && cli_wants_help(argc - 1, argv + 1)) {
                fputs(commands[i]->usage, stdout);
                return 0;
            }
            return commands[i]->run(argc - 1, argv + 1);
        }
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
