/* Images: PNG/JPEG decoding with PIL's convert("RGB") rules (files written here with libpng and
 * libjpeg, so every rule is checked without fixtures), corrupt and truncated files, crop, atomic
 * PNG save, and the PIL-equivalent bicubic resize against a naive float64 reference. The fixture
 * test compares against PIL's own decoding of the committed images. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "kiln/image.h"
#include "kiln/rng.h"
#include "kiln/safetensors.h"
#include "test.h"

/* ---- writers for test files ---- */

static void write_png(const char *path, int w, int h, int ctype, int depth, const uint8_t *data, const png_color *pal,
                      int npal, const uint8_t *trns, int ntrns) {
    FILE *f = fopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        test_fail(__FILE__, __LINE__, "libpng failed writing %s", path);
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, w, h, depth, ctype, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (pal) png_set_PLTE(png, info, pal, npal);
    if (trns) png_set_tRNS(png, info, trns, ntrns, NULL);
    png_write_info(png, info);
    int ch = ctype == PNG_COLOR_TYPE_RGB ? 3 : ctype == PNG_COLOR_TYPE_RGBA ? 4 : ctype == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
    size_t rowbytes = ((size_t)w * ch * depth + 7) / 8;
    for (int y = 0; y < h; y++) png_write_row(png, (png_const_bytep)(data + rowbytes * y));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static void write_jpeg(const char *path, int w, int h, int comps, J_COLOR_SPACE cs, const uint8_t *data, int quality) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    c.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&c);
    FILE *f = fopen(path, "wb");
    jpeg_stdio_dest(&c, f);
    c.image_width = w;
    c.image_height = h;
    c.input_components = comps;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(data + (size_t)c.next_scanline * w * comps);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static uint8_t *random_bytes(size_t n, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(kiln_rng_u64(&r) >> 56);
    return b;
}

/* ---- PNG conversion rules ---- */

TEST(image_png_rgb_roundtrip_and_crop) {
    const char *p = test_join(test_tmpdir(), "a.png");
    kiln_image img = {.width = 13, .height = 7, .rgb = random_bytes(13 * 7 * 3, 1)};
    CHECK_OK(kiln_image_save_png(p, &img));
    kiln_image back;
    CHECK_OK(kiln_image_load(p, &back));
    CHECK(back.width == 13 && back.height == 7);
    CHECK(back.rgb && memcmp(back.rgb, img.rgb, 13 * 7 * 3) == 0);
    kiln_image c;
    CHECK_OK(kiln_image_crop(&back, 2, 3, 5, 4, &c));
    CHECK(c.width == 5 && c.height == 4);
    for (int y = 0; y < 4; y++)
        CHECK(memcmp(c.rgb + y * 5 * 3, img.rgb + ((y + 3) * 13 + 2) * 3, 15) == 0);
    kiln_image bad;
    CHECK_ERR(kiln_image_crop(&back, 10, 0, 5, 4, &bad), "not inside the 13x7 image");
    CHECK_ERR(kiln_image_crop(&back, 0, 0, 0, 4, &bad), "w=0");
    kiln_image_free(&c);
    kiln_image_free(&back);
    free(img.rgb);
}

TEST(image_png_alpha_dropped_gray_replicated) {
    const char *dir = test_tmpdir();
    int w = 9, h = 5, n = w * h;
    uint8_t *rgba = random_bytes((size_t)n * 4, 2), *la = random_bytes((size_t)n * 2, 3), *g = random_bytes(n, 4);
    write_png(test_join(dir, "rgba.png"), w, h, PNG_COLOR_TYPE_RGBA, 8, rgba, NULL, 0, NULL, 0);
    write_png(test_join(dir, "la.png"), w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, la, NULL, 0, NULL, 0);
    write_png(test_join(dir, "g.png"), w, h, PNG_COLOR_TYPE_GRAY, 8, g, NULL, 0, NULL, 0);
    kiln_image a, b, c;
    CHECK_OK(kiln_image_load(test_join(dir, "rgba.png"), &a));
    CHECK_OK(kiln_image_load(test_join(dir, "la.png"), &b));
    CHECK_OK(kiln_image_load(test_join(dir, "g.png"), &c));
    int bad = 0;
    for (int i = 0; i < n && a.rgb && b.rgb && c.rgb; i++) {
        for (int k = 0; k < 3; k++) {
            bad += a.rgb[3 * i + k] != rgba[4 * i + k]; /* alpha dropped, not composited */
            bad += b.rgb[3 * i + k] != la[2 * i];
            bad += c.rgb[3 * i + k] != g[i];
        }
    }
    CHECK_MSG(bad == 0, "%d channel values differ from PIL's convert('RGB') rule", bad);
    kiln_image_free(&a);
    kiln_image_free(&b);
    kiln_image_free(&c);
    free(rgba);
    free(la);
    free(g);
}

TEST(image_png_palette_lowbit_16bit) {
    const char *dir = test_tmpdir();
    int w = 8, h = 4, n = w * h;
    png_color pal[4] = {{10, 20, 30}, {200, 100, 0}, {0, 255, 7}, {1, 2, 3}};
    uint8_t trns[4] = {0, 128, 255, 9};
    uint8_t idx[32], packed2[8 * 4 / 4];
    for (int i = 0; i < n; i++) idx[i] = (uint8_t)((i * 7) % 4);
    write_png(test_join(dir, "p.png"), w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, pal, 4, trns, 4);
    /* 2-bit gray, packed MSB first: levels 0,85,170,255 */
    for (int i = 0; i < n / 4; i++)
        packed2[i] = (uint8_t)(idx[4 * i] << 6 | idx[4 * i + 1] << 4 | idx[4 * i + 2] << 2 | idx[4 * i + 3]);
    write_png(test_join(dir, "g2.png"), w, h, PNG_COLOR_TYPE_GRAY, 2, packed2, NULL, 0, NULL, 0);
    /* 16-bit gray: PIL clips at 255; 16-bit RGB: PIL keeps the high byte */
    uint8_t g16[64], rgb16[8 * 4 * 6];
    for (int i = 0; i < n; i++) {
        unsigned v = (unsigned)(i * 37 % 700);
        g16[2 * i] = (uint8_t)(v >> 8);
        g16[2 * i + 1] = (uint8_t)v;
        for (int k = 0; k < 3; k++) {
            unsigned u = (unsigned)((i * 2000 + k * 999) % 65536);
            rgb16[6 * i + 2 * k] = (uint8_t)(u >> 8);
            rgb16[6 * i + 2 * k + 1] = (uint8_t)u;
        }
    }
    write_png(test_join(dir, "g16.png"), w, h, PNG_COLOR_TYPE_GRAY, 16, g16, NULL, 0, NULL, 0);
    write_png(test_join(dir, "rgb16.png"), w, h, PNG_COLOR_TYPE_RGB, 16, rgb16, NULL, 0, NULL, 0);
    kiln_image p, g2, a16, b16;
    CHECK_OK(kiln_image_load(test_join(dir, "p.png"), &p));
    CHECK_OK(kiln_image_load(test_join(dir, "g2.png"), &g2));
    CHECK_OK(kiln_image_load(test_join(dir, "g16.png"), &a16));
    CHECK_OK(kiln_image_load(test_join(dir, "rgb16.png"), &b16));
    int bad = 0;
    for (int i = 0; i < n && p.rgb && g2.rgb && a16.rgb && b16.rgb; i++) {
        const png_color *c = &pal[idx[i]];
        bad += p.rgb[3 * i] != c->red || p.rgb[3 * i + 1] != c->green || p.rgb[3 * i + 2] != c->blue;
        bad += g2.rgb[3 * i] != idx[i] * 85 || g2.rgb[3 * i + 2] != idx[i] * 85;
        unsigned v = (unsigned)(i * 37 % 700);
        bad += a16.rgb[3 * i] != (v > 255 ? 255 : v) || a16.rgb[3 * i + 1] != a16.rgb[3 * i];
        for (int k = 0; k < 3; k++) bad += b16.rgb[3 * i + k] != rgb16[6 * i + 2 * k];
    }
    CHECK_MSG(bad == 0, "%d pixels differ from PIL's conversions", bad);
    kiln_image_free(&p);
    kiln_image_free(&g2);
    kiln_image_free(&a16);
    kiln_image_free(&b16);
}

TEST(image_bad_files_name_the_file) {
    const char *dir = test_tmpdir();
    const char *p = test_join(dir, "ok.png");
    kiln_image img = {.width = 31, .height = 17, .rgb = random_bytes(31 * 17 * 3, 5)};
    CHECK_OK(kiln_image_save_png(p, &img));
    size_t n = 0;
    uint8_t *b = read_all(p, &n);
    const char *t = test_join(dir, "trunc.png");
    write_all(t, b, n / 2);
    kiln_image out;
    CHECK_ERR(kiln_image_load(t, &out), "trunc.png: corrupt PNG");
    CHECK(out.rgb == NULL);
    b[n / 2] ^= 0x5a; /* inside IDAT: the CRC no longer matches */
    const char *c = test_join(dir, "flip.png");
    write_all(c, b, n);
    CHECK_ERR(kiln_image_load(c, &out), "flip.png: corrupt PNG");
    const char *x = test_join(dir, "text.png");
    write_all(x, (const uint8_t *)"hello world", 11);
    CHECK_ERR(kiln_image_load(x, &out), "text.png: not a PNG or JPEG");
    write_all(x, b, 0);
    CHECK_ERR(kiln_image_load(x, &out), "text.png: empty file");
    CHECK_ERR(kiln_image_load(test_join(dir, "missing.jpg"), &out), "missing.jpg");
    /* JPEG cut in half: PIL raises "image file is truncated"; so do we */
    uint8_t *px = random_bytes(40 * 30 * 3, 6);
    const char *j = test_join(dir, "ok.jpg");
    write_jpeg(j, 40, 30, 3, JCS_RGB, px, 90);
    free(b);
    b = read_all(j, &n);
    const char *jt = test_join(dir, "trunc.jpg");
    write_all(jt, b, n / 2);
    CHECK_ERR(kiln_image_load(jt, &out), "trunc.jpg: truncated JPEG");
    write_all(jt, b, 200);
    CHECK_ERR(kiln_image_load(jt, &out), "trunc.jpg:");
    CHECK_OK(kiln_image_load(j, &out));
    kiln_image_free(&out);
    CHECK_ERR(kiln_image_save_png(test_join(dir, "nodir/x.png"), &img), "nodir/x.png");
    free(b);
    free(px);
    free(img.rgb);
}

/* ---- JPEG ---- */

TEST(image_jpeg_gray_rgb_cmyk) {
    const char *dir = test_tmpdir();
    int w = 16, h = 16, n = w * h;
    /* flat colours survive JPEG almost exactly, so the colour conversion is what we test */
    uint8_t g[256], rgb[256 * 3], cmyk[256 * 4];
    for (int i = 0; i < n; i++) {
        g[i] = 77;
        rgb[3 * i] = 200, rgb[3 * i + 1] = 60, rgb[3 * i + 2] = 120;
        /* libjpeg stores what it is given; Adobe-style files hold inverted CMYK */
        cmyk[4 * i] = 255 - 40, cmyk[4 * i + 1] = 255 - 100, cmyk[4 * i + 2] = 255 - 220, cmyk[4 * i + 3] = 255 - 30;
    }
    write_jpeg(test_join(dir, "g.jpg"), w, h, 1, JCS_GRAYSCALE, g, 100);
    write_jpeg(test_join(dir, "rgb.jpg"), w, h, 3, JCS_RGB, rgb, 100);
    write_jpeg(test_join(dir, "cmyk.jpg"), w, h, 4, JCS_CMYK, cmyk, 100);
    kiln_image a, b, c;
    CHECK_OK(kiln_image_load(test_join(dir, "g.jpg"), &a));
    CHECK_OK(kiln_image_load(test_join(dir, "rgb.jpg"), &b));
    CHECK_OK(kiln_image_load(test_join(dir, "cmyk.jpg"), &c));
    if (!a.rgb || !b.rgb || !c.rgb) return;
    CHECK(c.width == 16 && c.height == 16);
    /* PIL: C,M,Y,K = (40,100,220,30) -> nk = 225, r = nk - c*nk/255 */
    int want[3] = {225 - (40 * 225 + 127) / 255, 225 - (100 * 225 + 127) / 255, 225 - (220 * 225 + 127) / 255};
    for (int k = 0; k < 3; k++) {
        CHECK_NEAR(a.rgb[3 * 100 + k], 77, 1);
        CHECK_NEAR(b.rgb[3 * 100 + k], rgb[k], 2);
        CHECK_NEAR(c.rgb[3 * 100 + k], want[k], 2);
    }
    kiln_image_free(&a);
    kiln_image_free(&b);
    kiln_image_free(&c);
}

/* ---- resize ---- */

static double cubic(double x) {
    x = fabs(x);
    if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
    if (x < 2) return ((-0.5 * x + 2.5) * x - 4) * x + 2;
    return 0;
}

/* The textbook definition in float64: the kernel stretched by the downscale factor, taps clipped
 * to the image and renormalised, rounding to 8 bits after each pass. */
static void naive_resize_1d(const double *in, int n_in, int stride_in, double *out, int n_out, int stride_out) {
    double scale = (double)n_in / n_out, fs = scale < 1 ? 1 : scale, support = 2 * fs;
    for (int o = 0; o < n_out; o++) {
        double center = (o + 0.5) * scale, sum = 0, wsum = 0;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > n_in) hi = n_in;
        for (int i = lo; i < hi; i++) {
            double wt = cubic((i - center + 0.5) / fs);
            sum += wt * in[(size_t)i * stride_in];
            wsum += wt;
        }
        double v = floor(sum / wsum + 0.5);
        out[(size_t)o * stride_out] = v < 0 ? 0 : v > 255 ? 255 : v;
    }
}

static void check_resize(int w0, int h0, int w1, int h1, uint64_t seed) {
    kiln_image src = {.width = w0, .height = h0, .rgb = random_bytes((size_t)w0 * h0 * 3, seed)};
    /* smooth it a little so the data looks like a picture, not only noise */
    for (int i = 3; i < w0 * h0 * 3; i++) src.rgb[i] = (uint8_t)((src.rgb[i] + src.rgb[i - 3]) / 2);
    kiln_image dst;
    CHECK_OK(kiln_image_resize_bicubic(&src, w1, h1, &dst));
    double *a = malloc(sizeof(double) * w0 * h0 * 3), *t = malloc(sizeof(double) * w1 * h0 * 3),
           *r = malloc(sizeof(double) * w1 * h1 * 3);
    for (int i = 0; i < w0 * h0 * 3; i++) a[i] = src.rgb[i];
    for (int y = 0; y < h0; y++)
        for (int c = 0; c < 3; c++)
            if (w1 != w0) naive_resize_1d(a + (size_t)y * w0 * 3 + c, w0, 3, t + (size_t)y * w1 * 3 + c, w1, 3);
            else for (int x = 0; x < w0; x++) t[((size_t)y * w1 + x) * 3 + c] = a[((size_t)y * w0 + x) * 3 + c];
    for (int x = 0; x < w1 * 3; x++)
        if (h1 != h0) naive_resize_1d(t + x, h0, w1 * 3, r + x, h1, w1 * 3);
        else for (int y = 0; y < h0; y++) r[(size_t)y * w1 * 3 + x] = t[(size_t)y * w1 * 3 + x];
    int maxd = 0, ndiff = 0;
    for (int i = 0; i < w1 * h1 * 3 && dst.rgb; i++) {
        int d = abs((int)dst.rgb[i] - (int)r[i]);
        if (d > maxd) maxd = d;
        ndiff += d != 0;
    }
    /* fixed-point weights may flip a rounding now and then, never more */
    CHECK_MSG(maxd <= 1 && ndiff * 50 <= w1 * h1 * 3, "%dx%d -> %dx%d: max |diff| %d, %d of %d values differ", w0, h0, w1,
              h1, maxd, ndiff, w1 * h1 * 3);
    free(a);
    free(t);
    free(r);
    kiln_image_free(&dst);
    free(src.rgb);
}

TEST(image_resize_bicubic_matches_naive_reference) {
    check_resize(97, 61, 53, 32, 11);  /* shrink both ways (antialiased) */
    check_resize(20, 12, 53, 32, 12);  /* enlarge */
    check_resize(150, 25, 192, 32, 13); /* enlarge one axis, other wider */
    check_resize(45, 83, 32, 59, 14);  /* portrait */
    check_resize(40, 40, 40, 17, 15);  /* vertical pass only */
    check_resize(40, 40, 7, 40, 16);   /* horizontal pass only */
    check_resize(640, 480, 298, 224, 17); /* a CLIP-sized shrink by 2.1x */
}

TEST(image_resize_constant_stays_constant) {
    kiln_image src = {.width = 37, .height = 23, .rgb = malloc(37 * 23 * 3)};
    for (int i = 0; i < 37 * 23; i++) src.rgb[3 * i] = 0, src.rgb[3 * i + 1] = 128, src.rgb[3 * i + 2] = 255;
    kiln_image dst;
    CHECK_OK(kiln_image_resize_bicubic(&src, 11, 50, &dst));
    int bad = 0;
    for (int i = 0; i < 11 * 50 && dst.rgb; i++) bad += dst.rgb[3 * i] != 0 || dst.rgb[3 * i + 1] != 128 || dst.rgb[3 * i + 2] != 255;
    CHECK_MSG(bad == 0, "%d pixels changed", bad);
    kiln_image_free(&dst);
    kiln_image same;
    CHECK_OK(kiln_image_resize_bicubic(&src, 37, 23, &same));
    CHECK(same.rgb && memcmp(same.rgb, src.rgb, 37 * 23 * 3) == 0);
    CHECK_ERR(kiln_image_resize_bicubic(&src, 0, 5, &dst), "empty");
    kiln_image_free(&same);
    free(src.rgb);
}

/* ---- fixtures: PIL's decoding of the committed images ---- */

TEST(image_fixture_matches_pil_decoding) {
    const char *dec = test_src_path("tests/fixtures/clip/images/decoded.safetensors");
    kiln_st *st = NULL;
    kiln_error *e = kiln_st_open(dec, &st);
    if (e) {
        test_fail(__FILE__, __LINE__, "CLIP fixtures missing (run tests/fixtures/clip/make_clip_fixtures.py on the GPU machine): %s",
                  kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    CHECK(kiln_st_count(st) >= 12);
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/clip/images/%s", t->name);
        kiln_image img;
        kiln_error *le = kiln_image_load(test_src_path(rel), &img);
        if (le) {
            test_fail(__FILE__, __LINE__, "%s: %s", t->name, kiln_error_msg(le));
            kiln_error_free(le);
            continue;
        }
        CHECK_MSG(t->ndim == 3 && t->shape[0] == img.height && t->shape[1] == img.width && t->shape[2] == 3,
                  "%s: size %dx%d, PIL %lldx%lld", t->name, img.width, img.height, (long long)t->shape[1],
                  (long long)t->shape[0]);
        if (t->ndim == 3 && t->shape[0] == img.height && t->shape[1] == img.width) {
            const uint8_t *ref = t->data;
            int maxd = 0;
            for (size_t k = 0; k < (size_t)img.width * img.height * 3; k++) {
                int d = abs((int)ref[k] - (int)img.rgb[k]);
                if (d > maxd) maxd = d;
            }
            /* PNG is exact; JPEG is exact with the same libjpeg-turbo, and a different IDCT build may
             * move a value by a few levels */
            int tol = strstr(t->name, ".png") ? 0 : 3;
            CHECK_MSG(maxd <= tol, "%s: max |kiln - PIL| = %d (tolerance %d)", t->name, maxd, tol);
        }
        kiln_image_free(&img);
    }
    kiln_st_close(st);
}
