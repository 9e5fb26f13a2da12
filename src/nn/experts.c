/* ZAYA's experts (ZayaExperts): the routed slots grouped by expert, per expert a SwiGLU MLP
 * (gate_up [E,2I,H], down [E,H,I]), each output scaled by its gate and added to its token.
 * Slots routed to the skip class (choice == E) cost nothing and add nothing. One implementation
 * for the model and for `kiln bench moe`, so the benchmark times what the trainer runs. */
#include <string.h>

#include "kiln/nn.h"

void kiln_experts_forward(kiln_experts *x, float *out, const float *in, const float *wgu, const float *wdn) {
    const int64_t E = x->E, H = x->H, I = x->inter, top = x->top, S = x->N * top;
    memset(x->exp_off, 0, (size_t)(E + 1) * sizeof *x->exp_off);
    for (int64_t s = 0; s < S; s++)
        if (x->choice[s] < E) x->exp_off[x->choice[s] + 1]++;
    for (int64_t e = 0; e < E; e++) x->exp_off[e + 1] += x->exp_off[e];
    x->nslots = x->exp_off[E];
    memcpy(x->fill, x->exp_off, (size_t)E * sizeof *x->fill);
    for (int64_t s = 0; s < S; s++) {
        int32_t e = x->choice[s];
        if (e == E) continue;
        int32_t slot = x->fill[e]++;
        x->slot_tok[slot] = (int32_t)(s / top);
        x->slot_k[slot] = (int32_t)(s % top);
    }
    for (int64_t s = 0; s < x->nslots; s++)
        memcpy(x->xe + s * H, in + (int64_t)x->slot_tok[s] * H, (size_t)H * sizeof(float));
    for (int64_t e = 0; e < E; e++) {
        int64_t s0 = x->exp_off[e], ne = x->exp_off[e + 1] - s0;
        if (!ne) continue;
        kiln_linear_forward(x->gu + s0 * 2 * I, x->xe + s0 * H, wgu + e * 2 * I * H, NULL, ne, H, 2 * I);
        kiln_swiglu_forward(x->act + s0 * I, x->gu + s0 * 2 * I, ne, I);
        kiln_linear_forward(x->ye + s0 * H, x->act + s0 * I, wdn + e * H * I, NULL, ne, I, H);
    }
    memset(out, 0, (size_t)(x->N * H) * sizeof(float));
    for (int64_t s = 0; s < x->nslots; s++) {
        float g = x->gate[(int64_t)x->slot_tok[s] * top + x->slot_k[s]];
        float *dst = out + (int64_t)x->slot_tok[s] * H;
        for (int64_t h = 0; h < H; h++) dst[h] += g * x->ye[s * H + h];
    }
}

void kiln_experts_backward(const kiln_experts *x, float *dx, float *dgate, float *dwgu, float *dwdn, const float *dout,
                           const float *wgu, const float *wdn, kiln_experts_scratch *w) {
    const int64_t E = x->E, H = x->H, I = x->inter, top = x->top, S = x->nslots;
    memset(dgate, 0, (size_t)(x->N * top) * sizeof(float));
    for (int64_t sl = 0; sl < S; sl++) {
        int64_t n = x->slot_tok[sl], gi = n * top + x->slot_k[sl];
        float g = x->gate[gi];
        double dg = 0;
        for (int64_t h = 0; h < H; h++) {
            w->dye[sl * H + h] = g * dout[n * H + h];
            dg += (double)dout[n * H + h] * x->ye[sl * H + h];
        }
        dgate[gi] = (float)dg;
    }
    memset(w->dact, 0, (size_t)(S * I) * sizeof(float));
    memset(w->dgu, 0, (size_t)(S * 2 * I) * sizeof(float));
    memset(w->dxe, 0, (size_t)(S * H) * sizeof(float));
    for (int64_t e = 0; e < E; e++) {
        int64_t s0 = x->exp_off[e], ne = x->exp_off[e + 1] - s0;
        if (!ne) continue;
        kiln_linear_backward(w->dact + s0 * I, dwdn + e * H * I, NULL, w->dye + s0 * H, x->act + s0 * I, wdn + e * H * I,
                             ne, I, H);
        kiln_swiglu_backward(w->dgu + s0 * 2 * I, w->dact + s0 * I, x->gu + s0 * 2 * I, ne, I);
        kiln_linear_backward(w->dxe + s0 * H, dwgu + e * 2 * I * H, NULL, w->dgu + s0 * 2 * I, x->xe + s0 * H,
                             wgu + e * 2 * I * H, ne, H, 2 * I);
    }
    for (int64_t sl = 0; sl < S; sl++) {
        float *dst = dx + (int64_t)x->slot_tok[sl] * H;
        for (int64_t h = 0; h < H; h++) dst[h] += w->dxe[sl * H + h];
    }
}
