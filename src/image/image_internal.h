/* Decoders behind kiln_image_load: each takes the whole file in memory and
 * the path for messages, and fills an 8-bit RGB image. */
#ifndef KILN_IMAGE_INTERNAL_H
#define KILN_IMAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/image.h"

/* Largest image we decode: PIL refuses above 2 * 89,478,485 pixels as a decompression bomb; we stop
 * a little earlier, where a [H][W][3] buffer is 768 MiB. */
#define KILN_IMAGE_MAX_PIXELS (1ull << 28)

kiln_error *kiln_png_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out);
kiln_error *kiln_jpeg_decode(const uint8_t *data, size_t len, const char *path, kiln_image *out);
/* Allocate out->rgb for w x h, refusing zero or oversize dimensions. */
kiln_error *kiln_image_alloc(kiln_image *out, int64_t w, int64_t h, const char *path);

#endif
