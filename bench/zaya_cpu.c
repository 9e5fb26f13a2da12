/* CPU throughput of the ZAYA reference path: forward and forward+backward tokens/s for a
 * ~20M-parameter config (a baseline for later work). Prints a table and one JSON line.
 * usage: kiln_bench_zaya_cpu [--batch B] [--seq T] [--iters N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/zaya.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t B = 4, T = 256, iters = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) B = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoll(argv[i + 1]);
    }
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 8192;
    c.hidden_size = 256;
    c.num_layers = 6;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_experts = 8;
    c.moe_intermediate = 512;
    c.router_hidden = 64;
    c.pad_token_id = 0;
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    kiln_error *e = kiln_zaya_create(&c, &m);
    if (!e) e = kiln_zaya_acts_create(m, B, T, &a);
    if (e) {
        fprintf(stderr, "bench: %s\n", kiln_error_msg(e));
        return 1;
    }
    kiln_zaya_init_random(m, 1);
    /* favour experts evenly, as a balanced router would: random routing from random weights */
    for (int64_t l = 0; l < c.num_layers; l++) m->balancing[l * (c.num_experts + 1) + c.num_experts] = -1.0f;
    int64_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 7919) % c.vocab_size;
    double loss = 0;
    kiln_zaya_forward(m, a, ids, NULL, &loss); /* warm-up */
    kiln_zaya_backward(m, a, ids);
    double t0 = now();
    for (int64_t i = 0; i < iters; i++) kiln_zaya_forward(m, a, ids, NULL, &loss);
    double fwd = (now() - t0) / iters;
    t0 = now();
    for (int64_t i = 0; i < iters; i++) {
        kiln_zaya_forward(m, a, ids, NULL, &loss);
        kiln_zaya_backward(m, a, ids);
    }
    double fb = (now() - t0) / iters;
    double ntok = (double)(B * T);
    printf("# ZAYA CPU reference path: %.1fM parameters, hidden %lld, %lld layers, %lld experts, batch %lld x seq %lld\n",
           m->numel / 1e6, (long long)c.hidden_size, (long long)c.num_layers, (long long)c.num_experts, (long long)B,
           (long long)T);
    printf("%-20s %12s %12s\n", "pass", "ms/step", "tokens/s");
    printf("%-20s %12.1f %12.0f\n", "forward", fwd * 1e3, ntok / fwd);
    printf("%-20s %12.1f %12.0f\n", "forward+backward", fb * 1e3, ntok / fb);
    printf("{\"bench\":\"zaya_cpu\",\"params\":%zu,\"batch\":%lld,\"seq\":%lld,\"fwd_tokens_per_s\":%.1f,"
           "\"fwdbwd_tokens_per_s\":%.1f,\"loss\":%.4f}\n",
           m->numel, (long long)B, (long long)T, ntok / fwd, ntok / fb, loss);
    free(ids);
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
    return 0;
}
