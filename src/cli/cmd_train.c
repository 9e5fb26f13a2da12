/* kiln train [--config FILE] [--resume] ...
 * With no config, the built-in default: a generated story corpus, a byte-level BPE tokenizer
 * trained on it, token shards, and a small ZAYA model trained on two CPU cores in minutes.
 * Under mpirun every rank runs this; rank 0 prepares the default data while the others wait. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"

static const char usage[] =
    "usage: kiln train [--config FILE] [options]\n\n"
    "Trains a ZAYA model: data parallel with ZeRO-1 when started under mpirun (mpirun -np N kiln train ...),\n"
    "Muon for hidden matrices and AdamW for the rest, expert load balancing by feedback control,\n"
    "sharded checkpoints every run.ckpt_every steps. Without --config it runs the built-in default:\n"
    "it writes a generated story corpus, trains a tokenizer and prepares shards under runs/default/\n"
    "(once), then trains a ~2M-parameter model there; `kiln generate --model runs/default/model\n"
    "--prompt \"Anna\"` samples from it afterwards.\n\n"
    "  --config FILE     JSON config (sections model, data, optim, balance, run); see --help-config\n"
    "  --resume          continue from the newest valid checkpoint in run.out_dir/ckpt\n"
    "  --data DIR        override data.dir\n"
    "  --out DIR         override run.out_dir\n"
    "  --steps N         override run.steps (N >= 0; 0 saves the initial model)\n"
    "  --stop-after N    stop after N >= 1 steps of this run, with a checkpoint (resume later)\n"
    "  --device D        cpu or cuda: overrides run.device (cuda: one GPU per rank, NCCL between ranks,\n"
    "                    bf16 activations and GEMMs, f32 master weights, gradients and optimizer state)\n"
    "  --recompute       cuda: activation recomputation (sets run.recompute)\n"
    "  --quiet           no progress lines (metrics.jsonl is still written)\n"
    "  --help-config     every config field with its default and meaning\n\n"
    "Ctrl-C saves a checkpoint at the end of the current step and exits; --resume continues exactly.\n";

static volatile int interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

/* The default run's data: corpus -> tokenizer -> shards, each step skipped when its output exists.
 * The model's vocabulary is then set to the tokenizer's (BPE stops early on a small corpus). */
static kiln_error *prepare_default(kiln_train_config *c) {
    char corpus[1200], tok[1200], index[1200];
    const char *root = "runs/default";
    if (mkdir("runs", 0755) && errno != EEXIST) return kiln_errorf(KILN_EIO, "runs: cannot create: %s", strerror(errno));
    if (mkdir(root, 0755) && errno != EEXIST) return kiln_errorf(KILN_EIO, "%s: cannot create: %s", root, strerror(errno));
    snprintf(corpus, sizeof corpus, "%s/corpus.jsonl", root);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", root);
    snprintf(index, sizeof index, "%s/index.json", c->data_dir);
    if (!exists(corpus)) {
        printf("writing the built-in corpus to %s\n", corpus);
        KILN_TRY(kiln_default_corpus_write(corpus, 20000, 1));
    }
    if (!exists(tok)) {
        printf("training a byte-level BPE tokenizer (%lld tokens) on it -> %s\n", (long long)c->model.vocab_size, tok);
        const char *files[] = {corpus};
        const char *special[] = {"<|endoftext|>", NULL};
        kiln_bpe_train_opts o = {c->model.vocab_size, special, 0, 0};
        KILN_TRY(kiln_tokenizer_train_bpe(files, 1, &o, tok));
    }
    if (!exists(index)) {
        printf("tokenizing it into shards -> %s\n", c->data_dir);
        const char *inputs[] = {corpus};
        kiln_data_prepare_opts o = {tok, inputs, 1, c->data_dir, 0, 0, 0.02};
        KILN_TRY(kiln_data_prepare(&o));
    }
    kiln_data_index *ix = NULL;
    KILN_TRY(kiln_data_index_read(c->data_dir, &ix));
    c->model.vocab_size = ix->vocab_size;
    kiln_data_index_free(ix);
    return NULL;
}

/* Put the data's tokenizer beside the saved model, so `kiln generate --prompt` finds it. */
static kiln_error *copy_tokenizer(const kiln_train_config *c) {
    kiln_data_index *ix = NULL;
    KILN_TRY(kiln_data_index_read(c->data_dir, &ix));
    char *text = NULL, *dst = NULL, model[1200];
    size_t len = 0;
    snprintf(model, sizeof model, "%s/model", c->out_dir);
    kiln_error *e = NULL;
    /* only once the run has finished and saved its model */
    if (ix->tokenizer_path && access(ix->tokenizer_path, R_OK) == 0 && access(model, F_OK) == 0) {
        e = kiln_read_file(ix->tokenizer_path, &text, &len);
        if (!e) e = (dst = kiln_path_join(model, "tokenizer.json")) ? kiln_write_file_atomic(dst, text, len)
                                                                     : kiln_errorf(KILN_ENOMEM, "%s", model);
    }
    free(text);
    free(dst);
    kiln_data_index_free(ix);
    return e;
}

static int cmd(int argc, char **argv) {
    const char *config = NULL, *data = NULL, *out = NULL, *device = NULL;
    int64_t steps = -1;
    int recompute = 0;
    kiln_train_opts o = {0, 0, &interrupted, 0};
    kiln_error *e = NULL;
    for (int i = 1; i < argc && !e; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--resume")) { o.resume = 1; continue; }
        if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
        if (!strcmp(a, "--recompute")) { recompute = 1; continue; }
        if (!strcmp(a, "--help-config")) { kiln_train_config_print_help(stdout); return 0; }
        if (i + 1 >= argc) { e = kiln_errorf(KILN_EINVAL, "%s needs a value (see kiln train --help)", a); break; }
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--device")) device = v;
        /* the range run.steps has in a config (up to 2^53: the largest integer its JSON holds exactly, and the
         * checkpoints' manifests hold the config as JSON); a negative value used to be taken for "not given" */
        else if (!strcmp(a, "--steps")) e = cli_int_in(a, v, 0, (int64_t)1 << 53, &steps);
        else if (!strcmp(a, "--stop-after")) {
            /* 0 is kiln_train_opts' "no stop", and a run cannot stop before its first step: --stop-after 0 (or
             * less) would silently train to the end */
            e = cli_int(a, v, &o.stop_after);
            if (!e && o.stop_after < 1)
                e = kiln_errorf(KILN_EINVAL, "--stop-after must be >= 1 (steps this run trains before it stops with a "
                                "checkpoint), got %lld", (long long)o.stop_after);
        }
        else e = kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln train --help)", a);
    }
    if (!e && device && strcmp(device, "cpu") && strcmp(device, "cuda"))
        e = kiln_errorf(KILN_EINVAL, "--device '%s': expected cpu or cuda", device);
    kiln_train_config c;
    kiln_train_config_default(&c);
    if (!e && config) e = kiln_train_config_load(config, &c);
    if (!e && data) snprintf(c.data_dir, sizeof c.data_dir, "%s", data);
    if (!e && out) snprintf(c.out_dir, sizeof c.out_dir, "%s", out);
    if (!e && steps >= 0) c.steps = steps;
    if (!e && device) snprintf(c.device, sizeof c.device, "%s", device);
    if (!e && recompute) c.recompute = 1;
    if (e) return cli_fail("train", e);

    /* KILN_COMM=staged: the device buffers' collectives through host memory over MPI (comm_staged.c), which
     * lets several ranks share one GPU; else NCCL */
    const char *kc = getenv("KILN_COMM");
    if (kc && *kc && strcmp(kc, "nccl") && strcmp(kc, "staged"))
        return cli_fail("train", kiln_errorf(KILN_EINVAL, "KILN_COMM=%s: expected nccl (the default) or staged", kc));
    kiln_comm *comm = NULL;
    e = kiln_comm_init(&argc, &argv, &comm);
    if (e) return cli_fail("train", e);
    if (!strcmp(c.device, "cuda") && kc && !strcmp(kc, "staged")) {
        kiln_comm *st = NULL;
        e = kiln_comm_staged_from(comm, &st);
        if (e) {
            comm->finalize(comm);
            return cli_fail("train", e);
        }
        comm = st;
    } else if (!strcmp(c.device, "cuda")) { /* NCCL over the ranks, one GPU each; one rank can do without it */
        kiln_comm *nccl = NULL;
        e = kiln_comm_nccl_from(comm, &nccl);
        if (!e) comm = nccl;
        else if (comm->size == 1) {
            fprintf(stderr, "kiln train: NCCL unavailable (%s); one GPU needs no collectives\n", kiln_error_msg(e));
            kiln_error_free(e);
            e = NULL;
        } else {
            comm->finalize(comm);
            return cli_fail("train", e);
        }
    }
    if (!config && !data) { /* the built-in default run */
        kiln_error *pe = comm->rank == 0 ? prepare_default(&c) : NULL;
        double bad = pe ? 1 : 0;
        e = comm->allreduce_sum_f64(comm, &bad, 1);
        if (!e && bad > 0) e = pe ? pe : kiln_errorf(KILN_EIO, "preparing the default data failed on rank 0");
        else kiln_error_free(pe);
        if (!e) e = comm->broadcast(comm, &c.model.vocab_size, sizeof c.model.vocab_size, 0);
    }
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit becomes a write error (EFBIG), not a kill */
    double loss = 0;
    if (!e) e = kiln_train(&c, &o, comm, &loss);
    if (!e && comm->rank == 0 && !interrupted) e = copy_tokenizer(&c);
    int rank = comm->rank;
    comm->finalize(comm);
    if (e) {
        fprintf(stderr, "kiln train (rank %d): error: %s\n", rank, kiln_error_msg(e));
        kiln_error_free(e);
        return 1;
    }
    return interrupted ? 130 : 0;
}

const kiln_cmd kiln_cmd_train = {"train", "train a ZAYA model (built-in default with no arguments)", cmd, usage};
