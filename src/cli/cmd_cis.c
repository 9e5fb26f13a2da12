/* kiln cis <prompts|score|report|calibrate|embed>: the Component Inclusion Score audit of
 * text-to-image models (docs/cis.md). */
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kiln/cis.h"
#include "kiln/json.h"

static const char usage[] =
    "usage: kiln cis <command> [options]\n\n"
    "  prompts    --suite S --images-per-prompt K [--models a,b] [--out worklist.jsonl]\n"
    "             the generation worklist: one line per image (prompt id, prompt, model, seed, suggested\n"
    "             path); generate the images at those paths and the worklist is the run manifest\n"
    "  score      --suite S --manifest M --clip DIR --out RUN/ [--resume] [--labels L [--labels-as-judge]]\n"
    "             [--crops 1,2,3] [--threads N] [--bootstrap 2000] [--permutations 10000] [--seed 0]\n"
    "             [--threshold 0.5] [--chunk 16] [--cluster prompt|scene|culture|image]\n"
    "             [--detections D.jsonl [--detector-threshold 0.5]]\n"
    "             judge every component of every image with CLIP (whole image and overlapping crop grids),\n"
    "             then CIS per image and aggregates with bootstrap CIs, the Western/non-Western gap with a\n"
    "             permutation test, fragility, misalignment, grounding entropy, embedding superposition.\n"
    "             --cluster: the unit the bootstrap and the permutations move (default prompt: a prompt's\n"
    "             images count as one unit; scene or culture are stricter; image treats images as independent)\n"
    "             --detections: an object detector's output over the images (JSONL image, class, score), checked\n"
    "             against the components' COCO classes beside the CLIP judge\n"
    "             Results are written every --chunk images: Ctrl-C keeps them and --resume continues.\n"
    "             Exit 1 when some items could not be scored (each error is recorded in RUN/scores.json)\n"
    "  calibrate  RUN/ --labels L [--labels-as-judge]\n"
    "             choose the threshold maximising Youden's J on human labels (JSONL: image, component,\n"
    "             present), report the judge's accuracy, precision, recall and Cohen's kappa, re-aggregate\n"
    "  report     RUN/ --out report.html\n"
    "             HTML report with SVG charts and example images per culture\n"
    "  embed      --clip DIR (--images FILE_LIST | --texts FILE) --out OUT.safetensors\n"
    "             CLIP embeddings (image_embeds / text_embeds [N,D], projected, L2-normalised, F32)\n\n"
    "Formats: docs/cis-format.md; the method and every output file: docs/cis.md.\n";

static volatile int stop_flag;
/* The first Ctrl-C asks the run to stop where its results are safe (after the current image, or
 * between aggregates); a second one kills at once (the default action: the results written so far
 * are complete files, and the shell sees the SIGINT). signal() keeps a handler installed on Linux,
 * so without this a second Ctrl-C would only set the flag again. */
static void on_sigint(int sig) {
    if (stop_flag) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_flag = 1;
}

static int need_arg(int i, int argc, const char *flag) {
    if (i + 1 >= argc) {
        fprintf(stderr, "kiln cis: %s needs a value\n", flag);
        return 0;
    }
    return 1;
}

/* Whether `out` is the same file as `in` (both existing): an output written over one of the command's inputs. */
static int same_file(const char *out, const char *in) {
    struct stat a, b;
    return !stat(out, &a) && !stat(in, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int cmd_prompts(int argc, char **argv) {
    const char *suite = NULL, *out = "worklist.jsonl", *models = NULL;
    int64_t k = 0;
    for (int i = 1; i < argc; i++) {
        kiln_error *e = NULL;
        if (!strcmp(argv[i], "--suite") && need_arg(i, argc, argv[i])) suite = argv[++i];
        else if (!strcmp(argv[i], "--out") && need_arg(i, argc, argv[i])) out = argv[++i];
        else if (!strcmp(argv[i], "--models") && need_arg(i, argc, argv[i])) models = argv[++i];
        else if (!strcmp(argv[i], "--images-per-prompt") && need_arg(i, argc, argv[i])) e = cli_int(argv[i], argv[i + 1], &k), i++;
        else {
            fprintf(stderr, "kiln cis prompts: unknown or incomplete option '%s'\n\n%s", argv[i], usage);
            return 2;
        }
        if (e) return cli_fail("cis prompts", e);
    }
    if (!suite || k < 1 || k > 100000) {
        fprintf(stderr, "kiln cis prompts: --suite and --images-per-prompt K (1..100000) are required\n");
        return 2;
    }
    if (same_file(out, suite)) {
        fprintf(stderr, "kiln cis prompts: --out %s is the suite itself: the worklist would replace it\n", out);
        return 2;
    }
    char *mcopy = models ? strdup(models) : NULL;
    const char *names[256];
    int nm = 0;
    /* every name checked here, before the worklist is written: an empty, repeated or 257th name would
     * otherwise be dropped silently (strtok skips empty fields) or give a worklist that score rejects */
    for (char *t = mcopy, *end; t; t = end ? end + 1 : NULL) {
        end = strchr(t, ',');
        if (end) *end = 0;
        const char *why = !*t ? "is empty" : nm == 256 ? "is one more than the 256 models allowed" : NULL;
        for (int j = 0; j < nm && !why; j++)
            if (!strcmp(names[j], t)) why = "is given twice";
        if (why) {
            fprintf(stderr, "kiln cis prompts: --models: model %d ('%s') %s\n", nm + 1, t, why);
            free(mcopy);
            return 2;
        }
        names[nm++] = t;
    }
    kiln_cis_suite s;
    kiln_error *e = kiln_cis_suite_load(suite, &s);
    if (!e) {
        e = kiln_cis_worklist_write(&s, (int)k, nm ? names : NULL, nm, out);
        if (!e)
            printf("wrote %s: %d prompts x %lld images x %d models = %lld images to generate\n", out, s.n, (long long)k,
                   nm ? nm : 1, (long long)s.n * k * (nm ? nm : 1));
        kiln_cis_suite_free(&s);
    }
    free(mcopy);
    return e ? cli_fail("cis prompts", e) : 0;
}

static const char *str_of(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsString(v) ? v->valuestring : "?";
}
static double num_of(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* v as %.*f, or "n/a" where the number does not exist (a precision without positives, a CI of one cluster).
 * buf: 48 bytes. */
static const char *nx(char *buf, double v, int prec) {
    if (isnan(v)) return "n/a";
    snprintf(buf, 48, "%.*f", prec, v);
    return buf;
}

/* A readable summary of RUN/scores.json. */
static void print_summary(const char *run_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/scores.json", run_dir);
    cJSON *s = NULL;
    kiln_error *e = kiln_json_parse_file(path, &s);
    if (e) {
        kiln_error_free(e);
        return;
    }
    const cJSON *x;
    const char *unit = str_of(s, "cluster"); /* the unit the aggregation used (image for runs before the field) */
    printf("%-22s %6s %7s  %s (resampling %ss)\n", "culture", "n", "CIS", "95% CI", unit);
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(s, "cis")) {
        const char *by = str_of(x, "by");
        if (strcmp(by, "culture") && strcmp(by, "group") && strcmp(by, "all")) continue;
        if (isnan(num_of(x, "lo"))) /* one cluster: nothing to resample */
            printf("%-22s %6.0f %7.3f  (one %s: no CI)\n", str_of(x, "level"), num_of(x, "n"), num_of(x, "mean"),
                   unit);
        else
            printf("%-22s %6.0f %7.3f  [%.3f, %.3f]\n", str_of(x, "level"), num_of(x, "n"), num_of(x, "mean"),
                   num_of(x, "lo"), num_of(x, "hi"));
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(s, "gap")) {
        printf("gap western - non_western (%s=%s): %.3f, permutation p = %.4g%s\n", str_of(x, "by"), str_of(x, "level"),
               num_of(x, "gap"), num_of(x, "p"),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "exact")) ? " (exact)" : "");
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(s, "model_diff")) {
        if (!(num_of(x, "pairs") > 0)) { /* say why, not "nan over 0 pairs" */
            printf("model %s - %s: no pairs: no (prompt, seed) cell was scored for both (different seeds?)\n",
                   str_of(x, "a"), str_of(x, "b"));
            continue;
        }
        char f0[48], f1[48], f2[48];
        printf("model %s - %s: %s [%s, %s] over %.0f pairs, paired p = %.4g%s\n", str_of(x, "a"), str_of(x, "b"),
               nx(f0, num_of(x, "diff"), 3), nx(f1, num_of(x, "lo"), 3), nx(f2, num_of(x, "hi"), 3), num_of(x, "pairs"),
               num_of(x, "p"), cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "exact")) ? " (exact)" : "");
    }
    const cJSON *cal = cJSON_GetObjectItemCaseSensitive(s, "calibration");
    if (cal) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(cal, "agreement");
        char f0[48], f1[48], f2[48], f3[48];
        printf("labels: %.0f pairs; threshold %.4f; judge accuracy %s precision %s recall %s kappa %s\n",
               num_of(cal, "pairs"), num_of(s, "threshold"), nx(f0, num_of(a, "accuracy"), 3),
               nx(f1, num_of(a, "precision"), 3), nx(f2, num_of(a, "recall"), 3), nx(f3, num_of(a, "kappa"), 3));
        const cJSON *cv = cJSON_GetObjectItemCaseSensitive(cal, "agreement_cross_validated");
        if (cJSON_IsObject(cv))
            printf("  out of sample (%.0f folds of %ss): accuracy %s precision %s recall %s kappa %s\n",
                   num_of(cv, "folds"), str_of(cv, "fold_unit"), nx(f0, num_of(cv, "accuracy"), 3),
                   nx(f1, num_of(cv, "precision"), 3), nx(f2, num_of(cv, "recall"), 3), nx(f3, num_of(cv, "kappa"), 3));
    }
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(s, "detector");
    if (cJSON_IsObject(det)) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(det, "clip_vs_detector");
        printf("detector: %.0f components with a COCO class (%.0f detection images not in the run); the judge agrees "
               "with it on %.3f, kappa %.3f\n", num_of(det, "pairs"), num_of(det, "unmatched_images"),
               num_of(a, "accuracy"), num_of(a, "kappa"));
        if (num_of(det, "images") > 0 && num_of(det, "images") == num_of(det, "unmatched_images"))
            fprintf(stderr, "warning: no detection names an image of this run: image paths must be written as in the "
                            "manifest\n");
    }
    printf("all numbers: %s/scores.json, summary.csv, images.csv, components.csv, superposition.csv\n", run_dir);
    cJSON_Delete(s);
}

static int cmd_score(int argc, char **argv) {
    kiln_cis_score_opts o;
    kiln_cis_score_opts_default(&o);
    int64_t v;
    double d;
    for (int i = 1; i < argc; i++) {
        kiln_error *e = NULL;
        const char *a = argv[i];
        if (!strcmp(a, "--resume")) o.resume = 1;
        else if (!strcmp(a, "--labels-as-judge")) o.labels_as_judge = 1;
        else if (!need_arg(i, argc, a)) return 2;
        else if (!strcmp(a, "--suite")) o.suite = argv[++i];
        else if (!strcmp(a, "--manifest")) o.manifest = argv[++i];
        else if (!strcmp(a, "--clip")) o.clip_dir = argv[++i];
        else if (!strcmp(a, "--out")) o.out_dir = argv[++i];
        else if (!strcmp(a, "--labels")) o.labels = argv[++i];
        else if (!strcmp(a, "--crops")) o.grids = argv[++i];
        else if (!strcmp(a, "--detections")) o.detections = argv[++i];
        else if (!strcmp(a, "--detector-threshold")) {
            if (!(e = cli_double(a, argv[++i], &d))) {
                if (!(d >= 0 && d <= 1)) {
                    fprintf(stderr, "kiln cis score: --detector-threshold must be in [0, 1]\n");
                    return 2;
                }
                o.det_threshold = d;
            }
        } else if (!strcmp(a, "--cluster")) {
            o.cluster = argv[++i];
            if (!kiln_cis_cluster_unit_known(o.cluster)) {
                fprintf(stderr, "kiln cis score: --cluster '%s': expected image, prompt, scene or culture\n",
                        o.cluster);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            if (!(e = cli_int_in(a, argv[++i], 1, 4096, &v))) omp_set_num_threads((int)v);
        } else if (!strcmp(a, "--bootstrap")) {
            if (!(e = cli_int_in(a, argv[++i], 1, INT32_MAX, &v))) o.boot = (int)v;
        } else if (!strcmp(a, "--permutations")) {
            if (!(e = cli_int_in(a, argv[++i], 1, INT32_MAX, &v))) o.perm = (int)v;
        } else if (!strcmp(a, "--chunk")) {
            if (!(e = cli_int_in(a, argv[++i], 1, INT32_MAX, &v))) o.chunk = (int)v;
        } else if (!strcmp(a, "--seed")) {
            /* up to 2^53 - 1: run.json keeps the seed as a JSON number, exact only that far */
            if (!(e = cli_int_in(a, argv[++i], 0, 9007199254740991LL, &v))) o.seed = (uint64_t)v;
        } else if (!strcmp(a, "--threshold")) {
            if (!(e = cli_double(a, argv[++i], &d))) {
                if (!(d >= 0 && d <= 1)) {
                    fprintf(stderr, "kiln cis score: --threshold must be in [0, 1]\n");
                    return 2;
                }
                o.threshold = d;
            }
        } else {
            fprintf(stderr, "kiln cis score: unknown option '%s'\n\n%s", a, usage);
            return 2;
        }
        if (e) return cli_fail("cis score", e);
    }
    if (!o.suite || !o.manifest || !o.clip_dir || !o.out_dir) {
        fprintf(stderr, "kiln cis score: --suite, --manifest, --clip and --out are required\n");
        return 2;
    }
    if (o.labels_as_judge && !o.labels) {
        fprintf(stderr, "kiln cis score: --labels-as-judge needs --labels\n");
        return 2;
    }
    o.stop = &stop_flag;
    signal(SIGINT, on_sigint);
    int nscored, nerr;
    kiln_error *e = kiln_cis_score(&o, &nscored, &nerr);
    signal(SIGINT, SIG_DFL);
    if (e) {
        int interrupted = stop_flag; /* Ctrl-C while scoring or aggregating: 130, as a shell reports it */
        cli_fail("cis score", e);
        return interrupted ? 130 : 1;
    }
    print_summary(o.out_dir);
    printf("%d images scored, %d could not be scored%s\n", nscored, nerr,
           nerr ? " (errors per item in scores.json \"errors\" and images.csv; fix them and run again with --resume)" : "");
    return nerr ? 1 : 0;
}

static int cmd_calibrate(int argc, char **argv) {
    kiln_cis_score_opts o;
    kiln_cis_score_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--labels") && need_arg(i, argc, argv[i])) o.labels = argv[++i];
        else if (!strcmp(argv[i], "--labels-as-judge")) o.labels_as_judge = 1;
        else if (argv[i][0] != '-' && !o.out_dir) o.out_dir = argv[i];
        else {
            fprintf(stderr, "kiln cis calibrate: unexpected '%s'\n\n%s", argv[i], usage);
            return 2;
        }
    }
    if (!o.out_dir || !o.labels) {
        fprintf(stderr, "kiln cis calibrate: RUN/ and --labels are required\n");
        return 2;
    }
    kiln_error *e = kiln_cis_aggregate(&o);
    if (e) return cli_fail("cis calibrate", e);
    print_summary(o.out_dir);
    return 0;
}

static int cmd_report(int argc, char **argv) {
    const char *run = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && need_arg(i, argc, argv[i])) out = argv[++i];
        else if (argv[i][0] != '-' && !run) run = argv[i];
        else {
            fprintf(stderr, "kiln cis report: unexpected '%s'\n\n%s", argv[i], usage);
            return 2;
        }
    }
    if (!run || !out) {
        fprintf(stderr, "kiln cis report: RUN/ and --out report.html are required\n");
        return 2;
    }
    /* the page written over the run's own files (scores.json and the rest) would lose the results it shows */
    static const char *const mine[] = {"scores.json", "run.json", "suite.jsonl", "manifest.jsonl", "labels.jsonl",
                                       "detections.jsonl", "images.csv", "summary.csv", "components.csv"};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) {
        char in[4200];
        snprintf(in, sizeof in, "%s/%s", run, mine[i]);
        if (same_file(out, in)) {
            fprintf(stderr, "kiln cis report: --out %s is the run's %s: the report would replace it\n", out, mine[i]);
            return 2;
        }
    }
    kiln_error *e = kiln_cis_report(run, out);
    if (e) return cli_fail("cis report", e);
    printf("wrote %s\n", out);
    return 0;
}

static int cmd(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "prompts")) return cmd_prompts(argc - 1, argv + 1);
    if (!strcmp(sub, "score")) return cmd_score(argc - 1, argv + 1);
    if (!strcmp(sub, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(sub, "report")) return cmd_report(argc - 1, argv + 1);
    if (!strcmp(sub, "embed")) return cis_embed_main(argc - 1, argv + 1); /* src/cli/cmd_cis_embed.c */
    fprintf(stderr, "kiln cis: unknown command '%s'\n\n%s", sub, usage);
    return 2;
}

const kiln_cmd kiln_cmd_cis = {"cis", "Component Inclusion Score audit of text-to-image models", cmd, usage};
