/* kiln logits --model DIR --input IN.safetensors --out OUT.safetensors [--grads] [--device cpu|cuda]
 *
 * The contract outside checks rely on: IN holds `input_ids` (I64 or I32, [B,T]); OUT holds
 * `logits` (F32 [B,T,V]), `loss` (F32 scalar: mean cross-entropy of predicting token t+1 from
 * positions 0..T-2) and with --grads `grad.<HF parameter name>` (F32) for every parameter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/safetensors.h"
#include "kiln/zaya.h"
#include "kiln/zaya_cuda.h"

static const char usage[] =
    "usage: kiln logits --model DIR --input IN.safetensors --out OUT.safetensors [--grads]\n"
    "                   [--device cpu|cuda]\n\n"
    "Runs a ZAYA model (a HF directory: config.json + safetensors) on the token ids in IN and\n"
    "writes its logits and loss, and with --grads the gradient of the loss for every parameter.\n\n"
    "  --model DIR    HF ZAYA model directory (single or sharded safetensors; F32/BF16/F16)\n"
    "  --input FILE   safetensors with `input_ids`, I64 or I32, shape [B,T]\n"
    "  --out FILE     output safetensors: `logits` F32 [B,T,V], `loss` F32 [] (mean next-token\n"
    "                 cross-entropy over positions 0..T-2), `grad.<name>` F32 with --grads\n"
    "  --grads        also compute and write parameter gradients\n"
    "  --device D     cpu (default: f32 throughout) or cuda (one GPU: bf16 activations and GEMM\n"
    "                 weights, f32 residual stream, master weights and gradients)\n";

/* Read input_ids [B,T] as int64, naming the file in errors. */
kiln_error *cli_read_input_ids(const char *path, int64_t **ids, int64_t *B, int64_t *T) {
    kiln_st *st = NULL;
    KILN_TRY(kiln_st_open(path, &st));
    kiln_error *e = NULL;
    const kiln_st_tensor *t = kiln_st_find(st, "input_ids");
    if (!t) e = kiln_errorf(KILN_ENOTFOUND, "%s: no tensor 'input_ids'", path);
    else if (t->dtype != KILN_DT_I64 && t->dtype != KILN_DT_I32)
        e = kiln_errorf(KILN_EFORMAT, "%s: tensor 'input_ids' has dtype %s, expected I64 or I32", path,
                        kiln_dtype_name(t->dtype));
    else if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] < 1)
        e = kiln_errorf(KILN_EFORMAT, "%s: tensor 'input_ids' must have shape [B,T] with B,T >= 1 (got %d dims)", path,
                        t->ndim);
    if (!e) {
        *B = t->shape[0];
        *T = t->shape[1];
        *ids = malloc((size_t)t->numel * sizeof(int64_t));
        e = *ids ? kiln_st_read_i64(t, *ids, (size_t)t->numel) : kiln_errorf(KILN_ENOMEM, "%s", path);
    }
    kiln_st_close(st);
    return e;
}

/* Token ids must index the vocabulary; name the bad one by [b, t]. */
kiln_error *cli_check_ids(const kiln_zaya *m, const char *what, const int64_t *ids, int64_t B, int64_t T) {
    for (int64_t i = 0; i < B * T; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return kiln_errorf(KILN_EINVAL, "%s: token id %lld at [%lld, %lld] is outside the vocabulary 0..%lld", what,
                               (long long)ids[i], (long long)(i / T), (long long)(i % T),
                               (long long)m->cfg.vocab_size - 1);
    return NULL;
}

/* The GPU path: the same numbers into host buffers (logits [B,T,V], m->g). */
static kiln_error *run_cuda(kiln_zaya *m, const int64_t *ids, int64_t B, int64_t T, int grads, float **logits,
                            double *loss) {
    kiln_zaya_cuda *g = NULL;
    KILN_TRY(kiln_zaya_cuda_create(m, B, T, 0, &g));
    kiln_error *e = kiln_zaya_cuda_forward(g, ids, loss);
    if (!e && !(*logits = malloc((size_t)(B * T * m->cfg.vocab_size) * sizeof(float))))
        e = kiln_errorf(KILN_ENOMEM, "logits");
    if (!e) e = kiln_zaya_cuda_logits(g, *logits);
    if (!e && grads) e = kiln_zaya_cuda_backward(g);
    if (!e && grads) e = kiln_zaya_grads_enable(m);
    if (!e && grads) e = kiln_zaya_cuda_download_grads(g, m->g);
    kiln_zaya_cuda_free(g);
    return e;
}

static kiln_error *run(const char *model_dir, const char *in, const char *out, int grads, int cuda) {
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    int64_t *ids = NULL, B = 0, T = 0;
    double loss = 0;
    float *cuda_logits = NULL;
    kiln_error *e = kiln_zaya_load_dir(model_dir, &m);
    if (!e) e = cli_read_input_ids(in, &ids, &B, &T);
    if (!e) e = cli_check_ids(m, in, ids, B, T);
    if (!e && cuda) e = run_cuda(m, ids, B, T, grads, &cuda_logits, &loss);
    if (!e && !cuda) e = kiln_zaya_acts_create_ex(m, B, T, grads, &a);
    if (!e && !cuda) e = kiln_zaya_forward(m, a, ids, NULL, &loss);
    if (!e && !cuda && grads) e = kiln_zaya_backward(m, a, ids);
    if (!e) {
        const int64_t V = m->cfg.vocab_size;
        int n = 2 + (grads ? m->nparams : 0);
        kiln_st_entry *ent = calloc((size_t)n, sizeof *ent);
        char(*names)[112] = calloc((size_t)n, sizeof *names);
        int64_t lshape[3] = {B, T, V};
        float lossf = (float)loss;
        if (!ent || !names) e = kiln_errorf(KILN_ENOMEM, "%s", out);
        else {
            ent[0] = (kiln_st_entry){"logits", KILN_DT_F32, 3, lshape, cuda ? cuda_logits : kiln_zaya_acts_logits(a)};
            ent[1] = (kiln_st_entry){"loss", KILN_DT_F32, 0, lshape, &lossf};
            for (int i = 0; grads && i < m->nparams; i++) {
                const kiln_param_info *p = &m->params[i];
                snprintf(names[i], sizeof names[i], "grad.%s", p->name);
                ent[2 + i] = (kiln_st_entry){names[i], KILN_DT_F32, p->ndim, p->shape, m->g + p->offset};
            }
            e = kiln_st_write(out, ent, (size_t)n, NULL);
        }
        free(ent);
        free(names);
    }
    if (!e) printf("loss %.6f  (batch %lld x %lld tokens) -> %s\n", loss, (long long)B, (long long)T, out);
    free(ids);
    free(cuda_logits);
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
    return e;
}

static int cmd(int argc, char **argv) {
    const char *model = NULL, *in = NULL, *out = NULL, *device = "cpu";
    int grads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--model")    ? &model
                           : !strcmp(a, "--input")  ? &in
                           : !strcmp(a, "--out")    ? &out
                           : !strcmp(a, "--device") ? &device
                                                    : NULL;
        if (dst) {
            if (i + 1 >= argc) return cli_fail("logits", kiln_errorf(KILN_EINVAL, "%s needs a value", a));
            *dst = argv[++i];
        } else if (!strcmp(a, "--grads")) {
            grads = 1;
        } else {
            return cli_fail("logits", kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln logits --help)", a));
        }
    }
    if (!model || !in || !out)
        return cli_fail("logits", kiln_errorf(KILN_EINVAL, "--model, --input and --out are required (see --help)"));
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return cli_fail("logits", kiln_errorf(KILN_EINVAL, "--device: '%s' is not cpu or cuda", device));
    kiln_error *e = run(model, in, out, grads, !strcmp(device, "cuda"));
    return e ? cli_fail("logits", e) : 0;
}

const kiln_cmd kiln_cmd_logits = {"logits", "run a ZAYA model on token ids: logits, loss, gradients", cmd, usage};
