/* JPEG through libjpeg(-turbo) with its default decoder settings (ISLOW DCT, fancy upsampling),
 * which is what PIL uses, converted as PIL's Image.open(p).convert("RGB") would:
 *  - 1 component: gray replicated to R=G=B;
 *  - 3 components: libjpeg's YCbCr (or Adobe RGB) to RGB;
 *  - 4 components (CMYK, or YCCK which libjpeg turns into CMYK): PIL reads them as "CMYK;I", i.e.
 *    inverted as Photoshop/Adobe writes them, then cmyk2rgb: c' = nk - c*nk/255 with nk = 255 - k,
 *    in Pillow's integer arithmetic;
 *  - EXIF orientation is not applied (neither PIL's open nor HF's processor apply it).
 * A file that ends early is an error, as in PIL; libjpeg's other warnings (extraneous bytes...) are
 * not, as in PIL. Errors come back by longjmp from libjpeg's error_exit. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image_internal.h"

#ifdef KILN_HAVE_JPEG
#include <jerror.h>
#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jmp;
    char msg[JMSG_LENGTH_MAX];
    int truncated;
} jpeg_err;

static void on_error_exit(j_common_ptr cinfo) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jmp, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
        e->truncated = 1;
        (*cinfo->err->format_message)(cinfo, e->msg);
    }
}

static inline uint8_t muldiv255(unsigned a, unsigned b) {
    unsigned t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

kiln_error *kiln_jpeg_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out) {
    struct jpeg_decompress_struct cinfo;
    jpeg_err err;
    memset(&err, 0, sizeof err);
    uint8_t *volatile row = NULL;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_error_exit;
    err.mgr.emit_message = on_message;
    if (setjmp(err.jmp)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        kiln_image_free(out);
        return kiln_errorf(KILN_EFORMAT, "%s: corrupt JPEG: %s", path, err.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    int comps = cinfo.num_components;
    if (comps == 1)
        cinfo.out_color_space = JCS_GRAYSCALE;
    else if (comps == 3)
        cinfo.out_color_space = JCS_RGB;
    else if (comps == 4)
        cinfo.out_color_space = JCS_CMYK;
    else {
        jpeg_destroy_decompress(&cinfo);
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: JPEG with %d color components is not supported (1, 3 or 4)", path,
                           comps);
    }
    jpeg_start_decompress(&cinfo);
    kiln_error *e = kiln_image_alloc(out, cinfo.output_width, cinfo.output_height, path);
    if (e) {
        jpeg_destroy_decompress(&cinfo);
        return e;
    }
    int oc = cinfo.output_components;
    int w = (int)cinfo.output_width;
    if (oc != 3) {
        row = malloc((size_t)w * oc);
        if (!row) {
            jpeg_destroy_decompress(&cinfo);
            kiln_image_free(out);
            return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
        }
    }
    while (cinfo.output_scanline < cinfo.output_height && !err.truncated) {
        uint8_t *dst = out->rgb + (size_t)cinfo.output_scanline * w * 3;
        JSAMPROW r = oc == 3 ? dst : row;
        if (jpeg_read_scanlines(&cinfo, &r, 1) != 1) break;
        if (oc == 1) {
            for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = row[x];
        } else if (oc == 4) {
            for (int x = 0; x < w; x++) {
                const uint8_t *p = row + 4 * x;
                unsigned nk = p[3]; /* inverted K: 255 - (255 - k) */
                for (int c = 0; c < 3; c++) {
                    unsigned cc = 255u - p[c];
                    int v = (int)nk - muldiv255(cc, nk);
                    dst[3 * x + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            }
        }
    }
    if (err.truncated || cinfo.output_scanline < cinfo.output_height) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        kiln_image_free(out);
        return kiln_errorf(KILN_EFORMAT, "%s: truncated JPEG (%s)", path, err.msg[0] ? err.msg : "data ends early");
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    if (err.truncated) {
        kiln_image_free(out);
        return kiln_errorf(KILN_EFORMAT, "%s: truncated JPEG (%s)", path, err.msg);
    }
    return NULL;
}

#else

kiln_error *kiln_jpeg_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out) {
    (void)data;
    (void)len;
    (void)out;
    return kiln_errorf(KILN_EUNSUPPORTED, "%s: kiln was built without libjpeg (install libjpeg-dev and rebuild)", path);
}

#endif
