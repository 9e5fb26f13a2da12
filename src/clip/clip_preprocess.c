/* CLIPImageProcessor (the PIL backend, HF's reference): convert to RGB (done by kiln_image_load),
 * resize so the shortest side is `shortest_edge` (long side int(size * long / short)) with PIL's
 * bicubic, center crop with HF's rounding (zero padding when the crop is larger), rescale in
 * float64 then float32, normalize in float32 - the same arithmetic as transformers' numpy code. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"

kiln_error *kiln_clip_preprocess(const kiln_clip *m, const kiln_image *img, float *pixels) {
    const clip_preproc_cfg *p = &m->pre;
    if (!img || !img->rgb || img->width <= 0 || img->height <= 0)
        return kiln_errorf(KILN_EINVAL, "CLIP preprocess: empty image");
    kiln_image resized = {0};
    const kiln_image *cur = img;
    if (p->do_resize) {
        int h, w;
        if (p->resize_shortest) {
            int W = img->width, H = img->height, shorter = W <= H ? W : H, longer = W <= H ? H : W;
            /* transformers: new_long = int(size * long / short) in Python floats */
            int nl = (int)((double)((int64_t)p->resize_shortest * longer) / shorter);
            if (W <= H) w = p->resize_shortest, h = nl;
            else h = p->resize_shortest, w = nl;
        } else {
            h = p->resize_h, w = p->resize_w;
        }
        if (h <= 0 || w <= 0)
            return kiln_errorf(KILN_EINVAL, "CLIP preprocess: a %dx%d image resizes to nothing", img->width, img->height);
        KILN_TRY(kiln_image_resize_bicubic(img, w, h, &resized));
        cur = &resized;
    }
    int S = m->vision.image_size, W = cur->width, H = cur->height;
    /* HF center_crop: top = (H - crop_h) // 2 (floor), padding centred with ceil when the crop is larger */
    int ch = p->do_center_crop ? p->crop_h : H, cw = p->do_center_crop ? p->crop_w : W;
    if (ch != S || cw != S) {
        kiln_image_free(&resized);
        return kiln_errorf(KILN_EINVAL, "CLIP preprocess: the processor makes %dx%d images, the model takes %dx%d", cw, ch,
                           S, S);
    }
    int top = (int)floor((H - ch) / 2.0), left = (int)floor((W - cw) / 2.0);
    int pad_top = 0, pad_left = 0;
    if (top < 0 || left < 0 || top + ch > H || left + cw > W) {
        int nh = ch > H ? ch : H, nw = cw > W ? cw : W;
        pad_top = (nh - H + 1) / 2, pad_left = (nw - W + 1) / 2; /* ceil */
        top += pad_top, left += pad_left;
        if (top < 0) top = 0;
        if (left < 0) left = 0;
    }
    float mean[3], inv[3];
    for (int c = 0; c < 3; c++) {
        mean[c] = p->do_normalize ? (float)p->mean[c] : 0.0f;
        inv[c] = p->do_normalize ? (float)p->std[c] : 1.0f;
    }
    for (int y = 0; y < S; y++) {
        for (int x = 0; x < S; x++) {
            /* position in the (possibly padded) resized image, then in the image itself */
            int sy = top + y - pad_top, sx = left + x - pad_left;
            int inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
            for (int c = 0; c < 3; c++) {
                unsigned v = inside ? cur->rgb[((size_t)sy * W + sx) * 3 + c] : 0;
                float f = p->do_rescale ? (float)((double)v * p->rescale_factor) : (float)v;
                pixels[((size_t)c * S + y) * S + x] = p->do_normalize ? (f - mean[c]) / inv[c] : f;
            }
        }
    }
    kiln_image_free(&resized);
    return NULL;
}
