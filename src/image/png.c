/* PNG through libpng, converted as PIL's Image.open(p).convert("RGB") would:
 *  - alpha (RGBA, gray+alpha, tRNS) is dropped, never composited;
 *  - gray is replicated to R=G=B; 1/2/4-bit gray is scaled to 0..255 (x255, x85, x17);
 *  - palettes are expanded;
 *  - 16-bit RGB / RGBA / gray+alpha keep the high byte (PIL's "RGB;16B" raw modes);
 *  - 16-bit gray without alpha opens in PIL as "I;16" and converts to RGB by clipping at 255
 *    (I16_RGB in Pillow's Convert.c), so values >= 256 become 255 - odd, but that is the reference;
 *  - gAMA/iCCP/sRGB are ignored, as PIL ignores them.
 * libpng reports errors by longjmp; everything allocated before setjmp is released on that path. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image_internal.h"
#include "kiln/fsutil.h"

#ifdef KILN_HAVE_PNG
#include <png.h>

typedef struct {
    jmp_buf jmp;
    char msg[200];
    const uint8_t *data;
    size_t len, pos;
} png_ctx;

static void on_error(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    longjmp(c->jmp, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* benign (e.g. unknown chunks, iCCP profile quirks): PIL ignores them too */
}

static void read_mem(png_structp png, png_bytep out, png_size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) png_error(png, "file is truncated");
    memcpy(out, c->data + c->pos, n);
    c->pos += n;
}

kiln_error *kiln_png_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out) {
    png_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.data = data;
    ctx.len = len;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, on_error, on_warning);
    if (!png) return kiln_errorf(KILN_ENOMEM, "%s: libpng could not start", path);
    png_infop info = png_create_info_struct(png);
    /* volatile: modified after setjmp and read after a longjmp back */
    uint8_t *volatile rows_buf = NULL;
    png_bytep *volatile rows = NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return kiln_errorf(KILN_ENOMEM, "%s: libpng could not start", path);
    }
    if (setjmp(ctx.jmp)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(rows_buf);
        free(rows);
        kiln_image_free(out);
        return kiln_errorf(KILN_EFORMAT, "%s: corrupt PNG: %s", path, ctx.msg);
    }
    png_set_read_fn(png, &ctx, read_mem);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int depth = png_get_bit_depth(png, info), ctype = png_get_color_type(png, info);
    int gray16 = (ctype == PNG_COLOR_TYPE_GRAY && depth == 16);
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16 && !gray16) png_set_strip_16(png);
    /* tRNS can become an alpha channel during expansion; PIL drops it either way */
    if ((ctype & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
    if (!gray16 && (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    size_t want = gray16 ? (size_t)w * 2 : (size_t)w * 3;
    if (rowbytes != want) png_error(png, "unexpected row layout after conversion");
    kiln_error *e = kiln_image_alloc(out, w, h, path);
    if (e) {
        png_destroy_read_struct(&png, &info, NULL);
        return e;
    }
    rows_buf = gray16 ? malloc(rowbytes * h) : NULL;
    rows = malloc(sizeof(png_bytep) * h);
    if (!rows || (gray16 && !rows_buf)) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = gray16 ? rows_buf + rowbytes * y : out->rgb + (size_t)w * 3 * y;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    if (gray16) {
        for (size_t i = 0; i < (size_t)w * h; i++) {
            unsigned v = ((unsigned)rows_buf[2 * i] << 8) | rows_buf[2 * i + 1];
            uint8_t b = v > 255 ? 255 : (uint8_t)v;
            out->rgb[3 * i] = out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = b;
        }
    }
    png_destroy_read_struct(&png, &info, NULL);
    free(rows_buf);
    free(rows);
    return NULL;
}

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    int oom;
} mem_out;

static void write_mem(png_structp png, png_bytep d, png_size_t n) {
    mem_out *m = png_get_io_ptr(png);
    if (m->oom) return;
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + n) cap *= 2;
        uint8_t *nb = realloc(m->buf, cap);
        if (!nb) {
            m->oom = 1;
            return;
        }
        m->buf = nb;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, d, n);
    m->len += n;
}

static void flush_mem(png_structp png) { (void)png; }

kiln_error *kiln_image_save_png(const char *path, const kiln_image *img) {
    if (!img || !img->rgb || img->width <= 0 || img->height <= 0)
        return kiln_errorf(KILN_EINVAL, "%s: no image to save", path);
    png_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    mem_out m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, on_error, on_warning);
    if (!png) return kiln_errorf(KILN_ENOMEM, "%s: libpng could not start", path);
    png_infop info = png_create_info_struct(png);
    png_bytep *volatile rows = NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return kiln_errorf(KILN_ENOMEM, "%s: libpng could not start", path);
    }
    if (setjmp(ctx.jmp)) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        free(m.buf);
        return kiln_errorf(KILN_EIO, "%s: PNG encoding failed: %s", path, ctx.msg);
    }
    png_set_write_fn(png, &m, write_mem, flush_mem);
    png_set_IHDR(png, info, (png_uint_32)img->width, (png_uint_32)img->height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    rows = malloc(sizeof(png_bytep) * (size_t)img->height);
    if (!rows) png_error(png, "out of memory");
    for (int y = 0; y < img->height; y++) rows[y] = img->rgb + (size_t)y * img->width * 3;
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    if (m.oom) {
        free(m.buf);
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory encoding the PNG", path);
    }
    kiln_error *e = kiln_write_file_atomic(path, m.buf, m.len);
    free(m.buf);
    return e;
}

#else

kiln_error *kiln_png_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out) {
    (void)data;
    (void)len;
    (void)out;
    return kiln_errorf(KILN_EUNSUPPORTED, "%s: kiln was built without libpng (install libpng-dev and rebuild)", path);
}

kiln_error *kiln_image_save_png(const char *path, const kiln_image *img) {
    (void)img;
    return kiln_errorf(KILN_EUNSUPPORTED, "%s: kiln was built without libpng (install libpng-dev and rebuild)", path);
}

#endif
