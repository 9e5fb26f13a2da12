/* kiln_route_topk / kiln_route_gate_backward on hand-worked cases: the biased choice with the unbiased
 * gate, the skip class's zero gate, ties to the lower index, distinct slots, the gate gradient. */
#include <string.h>

#include "kiln/nn.h"
#include "test.h"

TEST(route_topk_cases) {
    const float probs[3] = {0.1f, 0.5f, 0.4f};
    int32_t ch[3];
    float g[3];
    const float b0[3] = {0, 0, 0}, b1[3] = {0.5f, 0, 0}, b2[3] = {0, 0, 0.2f};
    kiln_route_topk(ch, g, probs, b0, 1, 3, 1);
    CHECK(ch[0] == 1 && g[0] == 0.5f);
    kiln_route_topk(ch, g, probs, b1, 1, 3, 1); /* biased choice, unbiased gate */
    CHECK(ch[0] == 0 && g[0] == 0.1f);
    kiln_route_topk(ch, g, probs, b2, 1, 3, 1); /* the skip class (last) wins: gate 0 */
    CHECK(ch[0] == 2 && g[0] == 0.0f);
    kiln_route_topk(ch, g, probs, b0, 1, 3, 3); /* every class once, by value */
    CHECK(ch[0] == 1 && ch[1] == 2 && ch[2] == 0);
    CHECK(g[0] == 0.5f && g[1] == 0.0f && g[2] == 0.1f);
    const float flat[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.1f, 0.3f, 0.3f, 0.3f}; /* two tokens, ties */
    int32_t c2[4];
    float g2[4];
    const float bz[4] = {0, 0, 0, 0};
    kiln_route_topk(c2, g2, flat, bz, 2, 4, 2);
    CHECK(c2[0] == 0 && c2[1] == 1 && c2[2] == 1 && c2[3] == 2);
    CHECK(g2[2] == 0.3f && g2[3] == 0.3f);
}

TEST(route_gate_backward_cases) {
    const int32_t ch[4] = {1, 3, 3, 0}; /* E1 = 4: class 3 is the skip class */
    const float dg[4] = {2.0f, 5.0f, 7.0f, -1.0f};
    float dp[8];
    for (int i = 0; i < 8; i++) dp[i] = 0.5f;
    kiln_route_gate_backward(dp, dg, ch, 2, 4, 2);
    const float want[8] = {0.5f, 2.5f, 0.5f, 0.5f, -0.5f, 0.5f, 0.5f, 0.5f};
    CHECK(!memcmp(dp, want, sizeof want));
}
