/* kiln_image: loading by magic bytes, cropping, freeing. The decoders live in png.c and jpeg.c. */
#include <stdlib.h>
#include <string.h>

#include "image/image_internal.h"
#include "kiln/fsutil.h"

kiln_error *kiln_image_alloc(kiln_image *out, int64_t w, int64_t h, const char *path) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (w <= 0 || h <= 0)
        return kiln_errorf(KILN_EFORMAT, "%s: image has no pixels (%lldx%lld)", path, (long long)w, (long long)h);
    if ((uint64_t)w * (uint64_t)h > KILN_IMAGE_MAX_PIXELS)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: image of %lldx%lld pixels is larger than kiln decodes (%llu pixels)",
                           path, (long long)w, (long long)h, (unsigned long long)KILN_IMAGE_MAX_PIXELS);
    out->rgb = malloc((size_t)w * (size_t)h * 3);
    if (!out->rgb) return kiln_errorf(KILN_ENOMEM, "%s: out of memory for a %lldx%lld image", path, (long long)w, (long long)h);
    out->width = (int)w;
    out->height = (int)h;
    return NULL;
}

kiln_error *kiln_image_load(const char *path, kiln_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    char *data = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(path, &data, &len);
    if (e) return e;
    const uint8_t *d = (const uint8_t *)data;
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 8 && memcmp(d, png_magic, 8) == 0)
        e = kiln_png_decode(d, len, path, out);
    else if (len >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF)
        e = kiln_jpeg_decode(d, len, path, out);
    else if (len == 0)
        e = kiln_errorf(KILN_EFORMAT, "%s: empty file, not an image", path);
    else
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: not a PNG or JPEG file (unknown magic bytes %02x %02x %02x %02x)", path,
                        d[0], len > 1 ? d[1] : 0, len > 2 ? d[2] : 0, len > 3 ? d[3] : 0);
    free(data);
    if (e) kiln_image_free(out);
    return e;
}

void kiln_image_free(kiln_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

kiln_error *kiln_image_crop(const kiln_image *src, int x, int y, int w, int h, kiln_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!src || !src->rgb) return kiln_errorf(KILN_EINVAL, "image crop: no source image");
    if (w <= 0 || h <= 0 || x < 0 || y < 0 || (int64_t)x + w > src->width || (int64_t)y + h > src->height)
        return kiln_errorf(KILN_EINVAL, "image crop: rectangle x=%d y=%d w=%d h=%d is not inside the %dx%d image", x, y, w,
                           h, src->width, src->height);
    KILN_TRY(kiln_image_alloc(out, w, h, "image crop"));
    for (int r = 0; r < h; r++)
        memcpy(out->rgb + (size_t)r * w * 3, src->rgb + ((size_t)(y + r) * src->width + x) * 3, (size_t)w * 3);
    return NULL;
}
