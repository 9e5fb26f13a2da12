/* CLIP's short-sequence attention kernels (src/cuda/clip_attention.cu: one block per image and head, that head's
 * whole K and V in shared memory; wgmma at hd 64, mma.sync at hd 32) against the CPU reference kiln_mha_forward,
 * through kiln_mha_forward_cuda with KILN_CLIP_ATTN=own and =auto: q/k/v read in place from a fused [B·T, 3H]
 * projection, out [B·T, H]. Sequence lengths: L/14 (257: one row past 4 m64 tiles, split along the keys over the
 * warps), 256 (no remainder), B/32 (50: one m64 tile, rows past T on zeros), L/14-336 (577: 9 tiles and a row),
 * 17 and 1 (no m64 tile), 197, 289, 300, 40, 80, 100 (every kind of last key step: 16, 32, 48 keys or none, and
 * 1..32 or 33..63 rows past the last multiple of 64), 65 and 129 (one row past one or two tiles); odd head counts;
 * head dims 64, 32 and 128 (128: the streaming kernel); each kernel choice of KILN_CLIP_ATTN_SHORT_CFG (the
 * persistent one also with several items a block). Inputs of two magnitudes: the scores of the larger ones (standard
 * deviation ~20 after scaling) move the row maxima between key steps and between key slices, which the rescaling
 * and the slices' combination must get right. Tolerance as
 * tests/gpu/test_gpu_clip.c's attention: max |gpu - cpu| / max |cpu| <= 1e-2 (bf16 output, P rounded to bf16
 * before P·V). Shapes the kernels do not take must fall back to the streaming kernel with the same answers. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/clip_ops.h"
#include "gpu_testutil.h"
#include "kiln/nn.h"

/* one shape through kiln_mha_forward_cuda under the current environment; returns what ran (static string) */
static const char *short_case(kiln_rng *rng, int64_t B, int64_t T, int64_t heads, int64_t hd, float mag,
                              const char *label) {
    const int64_t H = heads * hd, stride = 3 * H;
    float *qkv = gt_rand(rng, B * T * stride, mag), *ref = malloc(sizeof(float) * B * T * H);
    gt_round_bf16(qkv, B * T * stride);
    const float scale = (float)(1.0 / sqrt((double)hd));
    CHECK(kiln_mha_forward(ref, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, scale, 0) == 0);
    kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)(B * T * H * 2));
    CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, 0, NULL));
    const char *ran = kiln_clip_attention_last_impl();
    float *got = gt_down_bf16(dout, B * T * H);
    char name[96];
    snprintf(name, sizeof name, "%s B=%lld T=%lld h=%lld hd=%lld x%g (%s)", label, (long long)B, (long long)T,
             (long long)heads, (long long)hd, (double)mag, ran);
    GT_CLOSE(name, got, ref, B * T * H, 1e-2);
    kiln_cuda_free(dq), kiln_cuda_free(dout);
    free(qkv), free(ref), free(got);
    return ran;
}

static const struct {
    int64_t B, T, heads, hd;
} short_shapes[] = {{2, 257, 3, 64}, {2, 256, 3, 64}, {3, 50, 5, 64},  {2, 577, 3, 64},  {2, 17, 3, 64},
                    {3, 1, 1, 64},   {2, 197, 5, 64}, {2, 289, 3, 64}, {2, 300, 1, 64},  {2, 40, 3, 64},
                    {2, 80, 3, 64},  {2, 100, 3, 64}, {2, 257, 3, 32}, {2, 50, 3, 32},   {2, 257, 3, 128},
                    {2, 65, 3, 64},  {2, 129, 3, 64}};

TEST(gpu_clip_attn_short_shapes) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 81);
    /* the default choice, one or two warpgroups forced, the persistent kernel (where it takes the shape: T = 256
     * and 257 here; the default choice elsewhere) with the keys past the last multiple of 64 in a step of their
     * own (its default) or folded into the first step (wgpx), the mma.sync kernel at hd 64 */
    static const char *const cfgs[] = {"", "wg", "wg2", "wgp", "wgpx", "mma"};
    const int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    setenv("KILN_CLIP_ATTN", "own", 1);
    for (int c = 0; c < ncfg; c++) {
        setenv("KILN_CLIP_ATTN_SHORT_CFG", cfgs[c], 1);
        for (size_t i = 0; i < sizeof short_shapes / sizeof short_shapes[0]; i++)
            for (int big = 0; big < 2; big++) {
                const int64_t hd = short_shapes[i].hd;
                const char *ran = short_case(&rng, short_shapes[i].B, short_shapes[i].T, short_shapes[i].heads, hd,
                                             big ? 8.0f : 2.0f, *cfgs[c] ? cfgs[c] : "default");
                /* every shape above fits in shared memory (the largest: T = 577 at hd 64, 151.5 KB); hd 128 is
                 * left to the streaming kernel */
                const char *want = hd == 128 ? "own" : "short";
                CHECK_MSG(!strcmp(ran, want), "%s T=%lld hd=%lld: ran %s, not %s", cfgs[c],
                          (long long)short_shapes[i].T, (long long)hd, ran, want);
            }
    }
    /* the persistent kernel with more items (images x heads) than SMs, so that each block runs several items
     * through both of its buffers, some blocks one item more than others: L/14's 257 tokens, T = 272 (the
     * longest tail it takes, 16 rows), 256 (no tail), 264 and 265 (8 and 9 keys past 256: the folded keys' two
     * widths, all or one of the second's valid); each way of running those keys */
    static const struct {
        int64_t B, T, heads;
    } many[] = {{40, 257, 16}, {23, 272, 12}, {29, 256, 11}, {21, 264, 9}, {19, 265, 10}};
    static const char *const pcfgs[] = {"wgp", "wgpx"};
    for (size_t c = 0; c < sizeof pcfgs / sizeof pcfgs[0]; c++) {
        setenv("KILN_CLIP_ATTN_SHORT_CFG", pcfgs[c], 1);
        for (size_t i = 0; i < sizeof many / sizeof many[0]; i++) {
            const char *r = short_case(&rng, many[i].B, many[i].T, many[i].heads, 64, 8.0f, pcfgs[c]);
            CHECK_MSG(!strcmp(r, "short"), "%s T=%lld ran %s", pcfgs[c], (long long)many[i].T, r);
        }
    }
    unsetenv("KILN_CLIP_ATTN_SHORT_CFG");
    /* K and V past shared memory (T = 1000 at hd 64: 252 KB) and KILN_CLIP_ATTN_SHORT=0: the streaming kernel */
    const char *ran = short_case(&rng, 1, 1000, 2, 64, 2.0f, "too long");
    CHECK_MSG(!strcmp(ran, "own"), "T=1000 ran %s, not the streaming kernel", ran);
    setenv("KILN_CLIP_ATTN_SHORT", "0", 1);
    ran = short_case(&rng, 2, 257, 3, 64, 2.0f, "SHORT=0");
    CHECK_MSG(!strcmp(ran, "own"), "KILN_CLIP_ATTN_SHORT=0 ran %s", ran);
    unsetenv("KILN_CLIP_ATTN_SHORT");
    /* auto: the short kernel where it is expected to beat cuDNN (T = 257, 50), cuDNN (or what cuDNN falls back
     * to) elsewhere (T = 256: cuDNN's tiles fit; T = 1000: too long) */
    setenv("KILN_CLIP_ATTN", "auto", 1);
    ran = short_case(&rng, 3, 257, 16, 64, 2.0f, "auto");
    CHECK_MSG(!strcmp(ran, "short"), "auto at T=257 ran %s", ran);
    ran = short_case(&rng, 3, 50, 12, 64, 2.0f, "auto");
    CHECK_MSG(!strcmp(ran, "short"), "auto at T=50 ran %s", ran);
    ran = short_case(&rng, 2, 256, 4, 64, 2.0f, "auto");
    CHECK_MSG(strcmp(ran, "short") != 0, "auto at T=256 ran the short kernel");
    ran = short_case(&rng, 1, 1000, 2, 64, 2.0f, "auto");
    CHECK_MSG(strcmp(ran, "short") != 0, "auto at T=1000 ran the short kernel");
    unsetenv("KILN_CLIP_ATTN");
}

/* Timings, printed and never asserted: cuDNN (KILN_CLIP_ATTN=cudnn), the short kernels (the default choice, one
 * or two warpgroups forced, the mma.sync kernel) and the streaming kernel (KILN_CLIP_ATTN_SHORT=0) at the bench's
 * chunk shapes (64 L/14 images at 224 and 336, 128 B/32 images), B/16's 197 tokens, and T = 256 beside 257.
 * Mean of 20 calls after 3 warm-ups; TFLOP/s of the 4·B·heads·T²·hd useful FLOPs. */
TEST(gpu_clip_attn_short_timing) {
    const struct {
        int64_t B, T, heads;
    } cs[] = {{64, 257, 16}, {64, 256, 16}, {128, 50, 12}, {64, 577, 16}, {64, 197, 12}};
    const struct {
        const char *attn, *cfg, *shrt, *label;
    } impls[] = {{"cudnn", NULL, NULL, "cudnn"},   {"own", NULL, NULL, "short"},  {"own", "wg", NULL, "short wg"},
                 {"own", "wg2", NULL, "short wg2"}, {"own", "wgp", NULL, "short wgp"}, {"own", "wgpx", NULL, "short wgpx"},
                 {"own", "mma", NULL, "short mma"},
                 {"own", NULL, "0", "streaming"}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 82);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t B = cs[c].B, T = cs[c].T, heads = cs[c].heads, hd = 64, H = heads * hd, stride = 3 * H;
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)(B * T * H * 2));
        const double fl = 4.0 * (double)B * heads * (double)T * T * hd;
        for (size_t i = 0; i < sizeof impls / sizeof impls[0]; i++) {
            setenv("KILN_CLIP_ATTN", impls[i].attn, 1);
            if (impls[i].cfg) setenv("KILN_CLIP_ATTN_SHORT_CFG", impls[i].cfg, 1);
            else unsetenv("KILN_CLIP_ATTN_SHORT_CFG");
            if (impls[i].shrt) setenv("KILN_CLIP_ATTN_SHORT", impls[i].shrt, 1);
            else unsetenv("KILN_CLIP_ATTN_SHORT");
            for (int r = 0; r < 3; r++)
                CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
            CHECK_OK(kiln_cuda_sync());
            const double t0 = gt_now_s();
            for (int r = 0; r < 20; r++)
                CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
            CHECK_OK(kiln_cuda_sync());
            const double ms = (gt_now_s() - t0) * 1e3 / 20;
            printf("    B=%lld T=%lld heads=%lld %-10s (ran %s): %.4f ms, %.0f TFLOP/s\n", (long long)B, (long long)T,
                   (long long)heads, impls[i].label, kiln_clip_attention_last_impl(), ms, fl / ms * 1e-9);
        }
        unsetenv("KILN_CLIP_ATTN"), unsetenv("KILN_CLIP_ATTN_SHORT_CFG"), unsetenv("KILN_CLIP_ATTN_SHORT");
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv);
    }
}
