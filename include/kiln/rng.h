/* Deterministic random numbers (splitmix64 seeding a xoshiro256**), the same on every
 * machine, so that initialisation, sampling and tests are reproducible from a seed. */
#ifndef KILN_RNG_H
#define KILN_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} kiln_rng;

void kiln_rng_seed(kiln_rng *r, uint64_t seed);
uint64_t kiln_rng_u64(kiln_rng *r);
double kiln_rng_uniform(kiln_rng *r); /* [0, 1) with 53 random bits */
double kiln_rng_normal(kiln_rng *r);  /* standard normal (Box-Muller) */

#endif
