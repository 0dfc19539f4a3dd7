/* rng.h — the engine's seeded random numbers: splitmix64 and Box-Muller
 * normals in double. Deterministic on every platform for a given seed. */
#ifndef FSO_RNG_H
#define FSO_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct fso_rng {
    uint64_t state;
    double spare;
    int has_spare;
} fso_rng;

static inline void fso_rng_seed(fso_rng *r, uint64_t seed)
{
    r->state = seed;
    r->has_spare = 0;
}

static inline uint64_t fso_rng_u64(fso_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1] */
static inline double fso_rng_uniform(fso_rng *r)
{
    return ((fso_rng_u64(r) >> 11) + 1) * (1.0 / 9007199254740992.0);
}

static inline double fso_rng_normal(fso_rng *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = fso_rng_uniform(r), u2 = fso_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

#endif
