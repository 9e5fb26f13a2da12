/* The supervisor's detectors, as pure functions over the numbers in the heartbeats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ft.h"

kiln_error *kiln_spike_init(kiln_spike_detector *d, int window, int min_samples) {
    memset(d, 0, sizeof *d);
    if (window < 2 || min_samples < 2 || min_samples > window)
        return kiln_errorf(KILN_EINVAL, "loss-spike window %d, minimum samples %d: need 2 <= minimum <= window", window,
                           min_samples);
    d->x = calloc((size_t)window, sizeof *d->x);
    if (!d->x) return kiln_errorf(KILN_ENOMEM, "loss-spike window");
    d->window = window;
    d->min_samples = min_samples;
    return NULL;
}

double kiln_spike_push(kiln_spike_detector *d, double loss, double z_max) {
    if (!isfinite(loss)) return INFINITY;
    double z = 0;
    if (d->n >= d->min_samples) {
        double mean = 0, var = 0;
        for (int i = 0; i < d->n; i++) mean += d->x[i];
        mean /= d->n;
        for (int i = 0; i < d->n; i++) var += (d->x[i] - mean) * (d->x[i] - mean);
        double sd = sqrt(var / (d->n - 1));
        if (sd > 0) z = (loss - mean) / sd;
        else z = loss == mean ? 0 : (loss > mean ? INFINITY : -INFINITY);
    }
    if (z_max > 0 && z > z_max) return z;
    d->x[d->head] = loss;
    d->head = (d->head + 1) % d->window;
    if (d->n < d->window) d->n++;
    return z;
}

void kiln_spike_reset(kiln_spike_detector *d) {
    d->n = 0;
    d->head = 0;
}

void kiln_spike_free(kiln_spike_detector *d) {
    free(d->x);
    memset(d, 0, sizeof *d);
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double kiln_median(const double *x, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return NAN;
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_dbl);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

int kiln_straggler(const double *compute_s, int n, double factor, double *ratio) {
    *ratio = 0;
    if (n < 2 || factor <= 0) return -1;
    double *others = malloc((size_t)(n - 1) * sizeof *others);
    if (!others) return -1;
    int worst = -1;
    for (int r = 0; r < n; r++) {
        int k = 0;
        for (int j = 0; j < n; j++)
            if (j != r) others[k++] = compute_s[j];
        double med = kiln_median(others, k);
        if (med <= 0) continue;
        double q = compute_s[r] / med;
        if (q > factor && q > *ratio) {
            *ratio = q;
            worst = r;
        }
    }
    free(others);
    return worst;
}
