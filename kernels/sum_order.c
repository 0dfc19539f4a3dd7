/* sum_order.c — the order of sqnorm's and sum's reduction (sum_order.h),
 * on the host. */
#include "sum_order.h"

double fso_sum_tree(double v[FSO_SUM_LANES])
{
    for (int w = FSO_SUM_LANES / 2; w > 0; w >>= 1)
        for (int t = 0; t < w; t++)
            v[t] = v[t] + v[t + w];
    return v[0];
}

/* Eight rows of lanes at a time, each lane's eight additions in its order:
 * the lanes are loaded and stored once per eight rows. */
static inline void lanes_add(double *restrict lane, const float *restrict x, size_t n,
                             const bool square)
{
    const size_t L = FSO_SUM_LANES;
    size_t j = 0;
    for (; j + 8 * L <= n; j += 8 * L) {
        const float *r = x + j;
        for (size_t t = 0; t < L; t++) {
            double s = lane[t];
            for (size_t k = 0; k < 8; k++) {
                const double a = r[k * L + t];
                s += square ? a * a : a;
            }
            lane[t] = s;
        }
    }
    for (; j < n; j += L) {
        const float *r = x + j;
        const size_t m = n - j < L ? n - j : L;
        for (size_t t = 0; t < m; t++) {
            const double a = r[t];
            lane[t] += square ? a * a : a;
        }
    }
}

void fso_sum_lanes_add(double lane[FSO_SUM_LANES], const float *x, size_t n, bool square)
{
    if (square)
        lanes_add(lane, x, n, true);
    else
        lanes_add(lane, x, n, false);
}

double fso_sum_chunk(const float *x, size_t n, bool square)
{
    double lane[FSO_SUM_LANES] = {0};
    fso_sum_lanes_add(lane, x, n, square);
    return fso_sum_tree(lane);
}

double fso_sum_ordered(const float *x, size_t n, bool square)
{
    double slot[FSO_SUM_LANES] = {0};
    const size_t chunks = fso_sum_chunks(n);
    for (size_t b = 0; b < chunks; b++) {
        const size_t base = b * FSO_SUM_CHUNK;
        const size_t len = n - base < FSO_SUM_CHUNK ? n - base : FSO_SUM_CHUNK;
        slot[b % FSO_SUM_LANES] += fso_sum_chunk(x + base, len, square);
    }
    return fso_sum_tree(slot);
}
