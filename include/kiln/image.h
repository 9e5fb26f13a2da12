/* kiln images: decoding PNG/JPEG into 8-bit RGB, the form every image
 * consumer in kiln (CLIP preprocessing, the CIS judge's crops, report
 * thumbnails) works on.
 *
 * Decoding follows what PIL's Image.open(p).convert("RGB") gives, since the
 * reference pipeline (HF CLIPImageProcessor) starts from that: alpha is
 * dropped (not composited), gray is replicated, palettes are expanded,
 * 16-bit samples are reduced to 8 bits, CMYK JPEGs are converted to RGB.
 * EXIF orientation is NOT applied (HF does not apply it either).
 */
#ifndef KILN_IMAGE_H
#define KILN_IMAGE_H

#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_image {
    int width, height;
    uint8_t *rgb; /* 8-bit RGB, row-major [height][width][3] */
} kiln_image;

/* PNG or JPEG, chosen by the file's magic bytes; errors name the file. */
kiln_error *kiln_image_load(const char *path, kiln_image *out);
void kiln_image_free(kiln_image *img);
/* Copy the rectangle [x, x+w) x [y, y+h) of src; it must lie inside src. */
kiln_error *kiln_image_crop(const kiln_image *src, int x, int y, int w, int h, kiln_image *out);
/* Resize to w x h exactly as PIL's Image.resize((w, h), Image.BICUBIC) does on an RGB image:
 * separable (horizontal pass, then vertical), the cubic kernel with a = -0.5 widened by the
 * downscale factor (antialiasing), coefficients in 22-bit fixed point, 8-bit rounding between
 * the passes. Same size gives a copy. */
kiln_error *kiln_image_resize_bicubic(const kiln_image *src, int w, int h, kiln_image *out);
/* Atomic write (temp file, fsync, rename). */
kiln_error *kiln_image_save_png(const char *path, const kiln_image *img);

#ifdef __cplusplus
}
#endif
#endif
