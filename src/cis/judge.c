/* The zero-shot CLIP judge on embeddings: views of an image, per-view component probability,
 * grounding entropy over patches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/cis.h"

float kiln_cis_dot(const float *a, const float *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)a[i] * b[i];
    return (float)s;
}

kiln_error *kiln_cis_parse_grids(const char *s, int *grids, int *ngrids, int cap) {
    int n = 0, have1 = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long g = strtol(p, &end, 10);
        if (end == p || g < 1 || g > 8 || (*end && *end != ','))
            return kiln_errorf(KILN_EINVAL, "--crops '%s': expected grid sizes 1..8 separated by commas, e.g. 1,2,3", s);
        for (int i = 0; i < n; i++)
            if (grids[i] == g) return kiln_errorf(KILN_EINVAL, "--crops '%s': grid %ld is listed twice", s, g);
        if (n == cap) return kiln_errorf(KILN_EINVAL, "--crops '%s': at most %d grid sizes", s, cap);
        have1 |= g == 1;
        grids[n++] = (int)g;
        p = *end ? end + 1 : end;
    }
    if (!have1) { /* the whole image always counts */
        if (n == cap) return kiln_errorf(KILN_EINVAL, "--crops '%s': at most %d grid sizes", s, cap);
        memmove(grids + 1, grids, (size_t)n * sizeof *grids);
        grids[0] = 1;
        n++;
    }
    *ngrids = n;
    return NULL;
}

int kiln_cis_views(int width, int height, const int *grids, int ngrids, kiln_cis_view *views, int cap) {
    int n = 0;
    for (int k = 0; k < ngrids; k++) {
        int g = grids[k];
        if (g == 1) {
            if (n < cap) views[n] = (kiln_cis_view){0, 0, width, height};
            n++;
            continue;
        }
        int cw = 2 * width / (g + 1), ch = 2 * height / (g + 1);
        if (cw < 1 || ch < 1) continue;
        for (int gy = 0; gy < g; gy++)
            for (int gx = 0; gx < g; gx++) {
                /* stride W/(g+1); the last crop ends at the border whatever the rounding */
                int x = gx == g - 1 ? width - cw : gx * width / (g + 1);
                int y = gy == g - 1 ? height - ch : gy * height / (g + 1);
                if (n < cap) views[n] = (kiln_cis_view){x, y, cw, ch};
                n++;
            }
    }
    return n;
}

double kiln_cis_judge_view(const float *view, const float *comp, const float *contrasts, int ncontrast, int d,
                           float logit_scale) {
    double z0 = (double)logit_scale * kiln_cis_dot(view, comp, d), m = z0;
    double *z = malloc((size_t)(ncontrast > 0 ? ncontrast : 1) * sizeof *z);
    if (!z) return NAN;
    for (int j = 0; j < ncontrast; j++) {
        z[j] = (double)logit_scale * kiln_cis_dot(view, contrasts + (size_t)j * d, d);
        if (z[j] > m) m = z[j];
    }
    double den = exp(z0 - m);
    for (int j = 0; j < ncontrast; j++) den += exp(z[j] - m);
    free(z);
    return exp(z0 - m) / den;
}

double kiln_cis_grounding_entropy(const float *text, const float *patches, int np, int d, float logit_scale) {
    if (np < 2) return 0;
    double *p = malloc((size_t)np * sizeof *p);
    if (!p) return NAN;
    double m = -INFINITY, s = 0;
    for (int i = 0; i < np; i++) {
        p[i] = (double)logit_scale * kiln_cis_dot(text, patches + (size_t)i * d, d);
        if (p[i] > m) m = p[i];
    }
    for (int i = 0; i < np; i++) s += (p[i] = exp(p[i] - m));
    for (int i = 0; i < np; i++) p[i] /= s;
    double h = kiln_cis_entropy_norm(p, np);
    free(p);
    return h;
}
