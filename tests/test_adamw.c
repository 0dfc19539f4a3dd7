/* test_adamw.c — the fused AdamW kernels (offload/adamw.h).
 *
 *   - every SIMD kernel the CPU has against the scalar reference, bit for bit:
 *     random data with zeros, denormal-producing, huge, Inf and NaN gradients;
 *     odd lengths, unaligned starts (each array its own offset), fp32 and
 *     bf16 gradients, with and without bf16 output, clip factor 1 and < 1,
 *     weight decay 0 and > 0, several steps; guard elements around every
 *     output. NaN compares equal to NaN (which payload survives two NaNs
 *     meeting is not specified).
 *   - the bf16 output against an independent round to nearest even of the
 *     new master (ties, denormals, overflow, NaN) for every kernel.
 *   - every kernel against torch.optim.AdamW (tests/fixtures/adamw_torch.bin,
 *     from tests/gen_adamw_fixture.py): 5 steps, weight decay, a clipped run
 *     and a bf16-gradient run. Tolerance, fp32 against fp32 computed in
 *     another operation order, per element: |diff| <= TORCH_TOL * scale with
 *     scale = |torch value| + the size of what was summed into it: the sum
 *     of the learning rates for params, the largest |clipped gradient| for
 *     exp_avg, its square for exp_avg_sq (the moments cancel, so a plain
 *     relative error means nothing where they pass near zero).
 *   - the threaded driver gives the same bits with 1, 2 and 3 threads.
 *   - FSO_ISA: what it accepts and how it refuses.
 * Kernels the CPU lacks are skipped with a message.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "adamw.h"
#include "optpool.h"

#define TORCH_TOL 1e-6 /* seen: params 1.7e-7, exp_avg 4e-8, exp_avg_sq 2e-8 */
#define GUARD 19       /* elements each side of every array */
#define GUARD_BITS 0x7fa5a5a5u
#define FIX_MAGIC 0x46534F41

/* ---- helpers ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(void) /* [0, 1) */
{
    return (double)(rnd() >> 11) * 0x1.0p-53;
}

static double normal(void)
{
    double u = uniform() + 1e-300, w = uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool bf16_isnan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

/* Round to nearest even written from the definition: look at the 16 bits
 * dropped, compare with half, break ties towards an even last kept bit. */
static uint16_t bf16_rne_ref(float f)
{
    if (isnan(f))
        return (uint16_t)((f2u(f) >> 16 & 0x8000) | 0x7fc0); /* any NaN, same sign */
    uint32_t u = f2u(f), kept = u >> 16, dropped = u & 0xffff;
    if (dropped > 0x8000 || (dropped == 0x8000 && (kept & 1)))
        kept++; /* a carry into the exponent is the right answer, up to Inf */
    return (uint16_t)kept;
}

static void check_bf16(uint16_t got, float master, const char *what, size_t i)
{
    uint16_t want = bf16_rne_ref(master);
    if (isnan(master)) {
        if (!bf16_isnan(got) || (got & 0x8000) != (want & 0x8000))
            fail_msg("%s[%zu]: bf16 of NaN 0x%08x is 0x%04x, not a NaN of the same sign", what,
                     i, f2u(master), got);
    } else if (got != want) {
        fail_msg("%s[%zu]: bf16 of %a (0x%08x) is 0x%04x, round to nearest even is 0x%04x",
                 what, i, master, f2u(master), got, want);
    }
}

/* An array of n elements of `size` bytes, starting `off` elements after a
 * 64-byte boundary, with GUARD guard elements on both sides. */
typedef struct gbuf {
    void *raw;
    char *p;
    size_t n, size;
} gbuf;

static void gbuf_alloc(gbuf *b, size_t n, size_t size, size_t off)
{
    size_t bytes = (n + 2 * GUARD + off + 64) * size;
    b->raw = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    assert_non_null(b->raw);
    memset(b->raw, 0, (bytes + 63) & ~(size_t)63);
    b->n = n;
    b->size = size;
    size_t guard_bytes = ((GUARD * size + 63) & ~(size_t)63); /* keep the 64-byte phase */
    b->p = (char *)b->raw + guard_bytes + off * size;
    for (size_t i = 1; i <= GUARD; i++) {
        uint32_t g = GUARD_BITS;
        memcpy(b->p - i * size, &g, size);
        memcpy(b->p + (n + i - 1) * size, &g, size);
    }
}

static void gbuf_check(const gbuf *b, const char *what)
{
    for (size_t i = 1; i <= GUARD; i++) {
        uint32_t g = GUARD_BITS, lo = 0, hi = 0;
        memcpy(&lo, b->p - i * b->size, b->size);
        memcpy(&hi, b->p + (b->n + i - 1) * b->size, b->size);
        if (memcmp(&lo, &g, b->size) || memcmp(&hi, &g, b->size))
            fail_msg("%s: write outside the array (guard %zu)", what, i);
    }
}

static void gbuf_free(gbuf *b)
{
    free(b->raw);
    b->raw = b->p = NULL;
}

static bool same_f32(float a, float b)
{
    return f2u(a) == f2u(b) || (isnan(a) && isnan(b));
}

static bool same_bf16(uint16_t a, uint16_t b)
{
    return a == b || (bf16_isnan(a) && bf16_isnan(b));
}

static const fso_adamw_kernel *kernel_or_skip(fso_isa isa)
{
    const fso_adamw_kernel *k = NULL;
    int rc = fso_adamw_select(isa, &k);
    if (rc == -ENOTSUP) {
        print_message("[  SKIP    ] %s kernel: this %s lacks it\n", fso_isa_name(isa),
                      fso_isa_built(isa) ? "CPU" : "build");
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k->isa, isa);
    return k;
}

/* ---- the SIMD kernels against the scalar reference --------------------- */

/* One input state for a case: master, grad (fp32 and bf16), m, v. */
typedef struct state {
    float *master, *grad, *m, *v;
    uint16_t *grad_bf16;
} state;

static void state_random(state *s, size_t n)
{
    s->master = malloc(n * 4), s->grad = malloc(n * 4), s->m = malloc(n * 4);
    s->v = malloc(n * 4), s->grad_bf16 = malloc(n * 2);
    assert_true(s->master && s->grad && s->m && s->v && s->grad_bf16);
    for (size_t i = 0; i < n; i++) {
        s->master[i] = (float)(0.05 * normal());
        double scale = pow(10.0, -5.0 + 6.0 * uniform());
        s->grad[i] = (float)(scale * normal());
        s->m[i] = (float)(0.01 * normal());
        s->v[i] = (float)(1e-4 * fabs(normal()));
        switch (rnd() % 64) { /* a few special gradients */
        case 0: s->grad[i] = 0.0f; break;
        case 1: s->grad[i] = -0.0f; break;
        case 2: s->grad[i] = 1e-30f; break;       /* g * g underflows */
        case 3: s->grad[i] = 3e-39f; break;       /* denormal */
        case 4: s->grad[i] = 1e30f; break;        /* g * g overflows */
        case 5: s->grad[i] = INFINITY; break;
        case 6: s->grad[i] = NAN; break;
        case 7: s->m[i] = 0.0f, s->v[i] = 0.0f; break;
        case 8: s->master[i] = 1e-40f; break;     /* denormal master */
        default: break;
        }
        s->grad_bf16[i] = (uint16_t)(rnd() & 0xffff);
        if ((s->grad_bf16[i] & 0x7f80) == 0x7f80 && rnd() % 8) /* mostly finite */
            s->grad_bf16[i] &= 0xbfff;
        if (rnd() % 2) /* and half of them ordinary values */
            s->grad_bf16[i] = fso_bf16_from_f32(s->grad[i]);
    }
}

static void state_free(state *s)
{
    free(s->master), free(s->grad), free(s->m), free(s->v), free(s->grad_bf16);
}

typedef struct run_out {
    gbuf master, grad, m, v, out;
} run_out;

/* Copy the state into guarded arrays at the given element offsets and run
 * `steps` steps of kernel k. */
static void run_case(run_out *r, const fso_adamw_kernel *k, const state *s, size_t n,
                     const size_t off[5], fso_dtype dt, bool with_out, const fso_adamw_step *st0,
                     int steps)
{
    gbuf_alloc(&r->master, n, 4, off[0]);
    gbuf_alloc(&r->grad, n, dt == FSO_DT_F32 ? 4 : 2, off[1]);
    gbuf_alloc(&r->m, n, 4, off[2]);
    gbuf_alloc(&r->v, n, 4, off[3]);
    gbuf_alloc(&r->out, n, 2, off[4]);
    if (n) {
        memcpy(r->master.p, s->master, n * 4);
        memcpy(r->grad.p, dt == FSO_DT_F32 ? (void *)s->grad : (void *)s->grad_bf16,
               n * r->grad.size);
        memcpy(r->m.p, s->m, n * 4);
        memcpy(r->v.p, s->v, n * 4);
    }
    fso_adamw_step st = *st0;
    for (int t = 0; t < steps; t++) {
        st.t = st0->t + t;
        st.lr = st0->lr * (1.0 - 0.1 * t);
        fso_adamw_fused(k, (float *)r->master.p, r->grad.p, dt, (float *)r->m.p,
                        (float *)r->v.p, with_out ? (uint16_t *)r->out.p : NULL, n, &st);
    }
    gbuf_check(&r->master, "master");
    gbuf_check(&r->grad, "grad");
    gbuf_check(&r->m, "m");
    gbuf_check(&r->v, "v");
    gbuf_check(&r->out, "bf16 out");
}

static void run_free(run_out *r)
{
    gbuf_free(&r->master), gbuf_free(&r->grad), gbuf_free(&r->m), gbuf_free(&r->v);
    gbuf_free(&r->out);
}

static void compare_to_scalar(const fso_adamw_kernel *k)
{
    static const size_t lens[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65,
                                  100, 255, 257, 1000, 4099};
    const fso_adamw_kernel *ref = kernel_or_skip(FSO_ISA_SCALAR);
    state s;
    state_random(&s, 4099);
    int cases = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int variant = 0; variant < 32; variant++) {
            size_t n = lens[li];
            fso_dtype dt = variant & 1 ? FSO_DT_BF16 : FSO_DT_F32;
            bool with_out = variant & 2;
            fso_adamw_step st = {
                .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                .weight_decay = variant & 4 ? 0.1 : 0.0,
                .grad_scale = variant & 8 ? 0.3711 : 1.0,
                .t = variant & 16 ? 1 : 1000,
            };
            size_t off[5];
            for (int a = 0; a < 5; a++) /* aligned on some, each array its own offset */
                off[a] = variant % 3 == 0 ? 0 : (size_t)(rnd() % 17);
            run_out a, b;
            run_case(&a, ref, &s, n, off, dt, with_out, &st, 3);
            run_case(&b, k, &s, n, off, dt, with_out, &st, 3);
            const float *pa = (float *)a.master.p, *pb = (float *)b.master.p;
            const float *ma = (float *)a.m.p, *mb = (float *)b.m.p;
            const float *va = (float *)a.v.p, *vb = (float *)b.v.p;
            const uint16_t *oa = (uint16_t *)a.out.p, *ob = (uint16_t *)b.out.p;
            for (size_t i = 0; i < n; i++) {
                if (!same_f32(pa[i], pb[i]) || !same_f32(ma[i], mb[i]) ||
                    !same_f32(va[i], vb[i]))
                    fail_msg("%s n=%zu variant %d [%zu]: master %a/%a m %a/%a v %a/%a "
                             "(scalar/%s)", k->name, n, variant, i, pa[i], pb[i], ma[i], mb[i],
                             va[i], vb[i], k->name);
                if (with_out) {
                    if (!same_bf16(oa[i], ob[i]))
                        fail_msg("%s n=%zu variant %d [%zu]: bf16 out 0x%04x, scalar 0x%04x",
                                 k->name, n, variant, i, ob[i], oa[i]);
                    check_bf16(ob[i], pb[i], k->name, i);
                    check_bf16(oa[i], pa[i], "scalar", i);
                } else if (ob[i] != 0) {
                    fail_msg("%s: wrote the bf16 output it was not given", k->name);
                }
            }
            run_free(&a);
            run_free(&b);
            cases++;
        }
    print_message("%s: %d cases bit-identical to scalar\n", k->name, cases);
    state_free(&s);
}

static void test_avx2_matches_scalar_bit_for_bit(void **unused)
{
    (void)unused;
    compare_to_scalar(kernel_or_skip(FSO_ISA_AVX2));
}

static void test_avx512_matches_scalar_bit_for_bit(void **unused)
{
    (void)unused;
    compare_to_scalar(kernel_or_skip(FSO_ISA_AVX512));
}

/* ---- bf16 output: ties, denormals, overflow, NaN ------------------------ */

static void test_bf16_out_rounds_to_nearest_even(void **unused)
{
    (void)unused;
    /* lr = 0, weight decay 0, gradient 0: master comes out unchanged, so the
     * output is the rounding of these values. {input bits, expected bf16}. */
    static const uint32_t cases[][2] = {
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* tie, even kept: down */
        {0x3f818000, 0x3f82}, /* tie, odd kept: up */
        {0x3f807fff, 0x3f80}, /* below the tie */
        {0x3f808001, 0x3f81}, /* above the tie */
        {0xbf818000, 0xbf82}, /* negative tie up */
        {0x3fff8000, 0x4000}, /* tie carries into the exponent */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to Inf */
        {0x7f7f8000, 0x7f80}, /* tie at the top, odd: up to Inf */
        {0x7f7f7fff, 0x7f7f},
        {0x7f800000, 0x7f80}, /* Inf */
        {0xff800000, 0xff80}, /* -Inf */
        {0x00000000, 0x0000},
        {0x80000000, 0x8000}, /* -0 */
        {0x00008000, 0x0000}, /* denormal tie, even: down to 0 */
        {0x00018000, 0x0002}, /* denormal tie, odd: up */
        {0x00000001, 0x0000}, /* smallest denormal */
        {0x007fffff, 0x0080}, /* largest denormal rounds up to the smallest normal */
        {0x7fc00000, 0x7fc0}, /* quiet NaN */
        {0xffc00000, 0xffc0}, /* negative quiet NaN */
        {0x7f800001, 0x7fc0}, /* NaN with only low payload must not become Inf */
        {0x7fffffff, 0x7fff},
        {0xff80ffff, 0xffc0}, /* negative NaN, low payload */
    };
    const size_t nc = sizeof cases / sizeof cases[0];
    const size_t n = 101; /* each value at several positions: head, body, tail */
    fso_isa isas[] = {FSO_ISA_SCALAR, FSO_ISA_AVX2, FSO_ISA_AVX512};
    fso_adamw_step st = {.lr = 0.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = 0.0, .grad_scale = 1.0, .t = 1};
    int ran = 0;
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        const fso_adamw_kernel *k;
        if (fso_adamw_select(isas[ii], &k) == -ENOTSUP) {
            print_message("bf16 rounding: %s kernel skipped, this %s lacks it\n",
                          fso_isa_name(isas[ii]), fso_isa_built(isas[ii]) ? "CPU" : "build");
            continue;
        }
        for (size_t off = 0; off < 3; off++) {
            gbuf master, out;
            gbuf_alloc(&master, n, 4, off);
            gbuf_alloc(&out, n, 2, off);
            float *p = (float *)master.p, g[101] = {0}, m[101] = {0}, v[101] = {0};
            for (size_t i = 0; i < n; i++)
                p[i] = u2f(cases[i % nc][0]);
            fso_adamw_fused(k, p, g, FSO_DT_F32, m, v, (uint16_t *)out.p, n, &st);
            const uint16_t *o = (uint16_t *)out.p;
            for (size_t i = 0; i < n; i++) {
                uint32_t in = cases[i % nc][0];
                uint16_t want = (uint16_t)cases[i % nc][1];
                bool nan = (in & 0x7fffffff) > 0x7f800000;
                if (nan ? !(bf16_isnan(o[i]) && (o[i] & 0x8000) == (want & 0x8000) &&
                            isnan(p[i]))
                        : (o[i] != want || f2u(p[i]) != in))
                    fail_msg("%s: master 0x%08x -> 0x%08x, bf16 0x%04x, want 0x%04x", k->name,
                             in, f2u(p[i]), o[i], want);
                check_bf16(o[i], p[i], k->name, i);
            }
            gbuf_check(&master, "master");
            gbuf_check(&out, "bf16 out");
            gbuf_free(&master);
            gbuf_free(&out);
        }
        ran++;
    }
    assert_true(ran >= 1);
}

/* ---- torch.optim.AdamW fixture ------------------------------------------ */

static void *read_fixture(const char *name, size_t *size)
{
    char path[4096];
    const char *src = getenv("FSO_SRCDIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", src ? src : "..", name);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("%s: cannot open: %s (FSO_SRCDIR must point to the source tree; regenerate "
                 "with /usr/bin/python3 tests/gen_adamw_fixture.py)", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *blob = malloc((size_t)len);
    assert_non_null(blob);
    assert_int_equal(fread(blob, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *size = (size_t)len;
    return blob;
}

static void test_matches_torch_adamw_fixture(void **unused)
{
    (void)unused;
    size_t size;
    char *blob = read_fixture("adamw_torch.bin", &size);
    int32_t hdr[16];
    assert_true(size >= sizeof hdr);
    memcpy(hdr, blob, sizeof hdr);
    if (hdr[0] != FIX_MAGIC || hdr[1] != 1)
        fail_msg("adamw_torch.bin: magic/version 0x%x/%d, want 0x%x/1", hdr[0], hdr[1],
                 FIX_MAGIC);
    size_t n = (size_t)hdr[2], steps = (size_t)hdr[3], runs = (size_t)hdr[4];
    size_t nhyper = 8 + 2 * steps;
    size_t expect = sizeof hdr + runs * nhyper * 8 + n * 4 + steps * n * (4 + 2) + runs * 3 * n * 4;
    if (size != expect)
        fail_msg("adamw_torch.bin: %zu bytes, the header implies %zu", size, expect);
    const char *p = blob + sizeof hdr;
    double *hyper = malloc(runs * nhyper * 8);
    float *params0 = malloc(n * 4), *grads = malloc(steps * n * 4), *res = malloc(runs * 3 * n * 4);
    uint16_t *grads_bf16 = malloc(steps * n * 2);
    assert_true(hyper && params0 && grads && res && grads_bf16);
    memcpy(hyper, p, runs * nhyper * 8), p += runs * nhyper * 8;
    memcpy(params0, p, n * 4), p += n * 4;
    memcpy(grads, p, steps * n * 4), p += steps * n * 4;
    memcpy(grads_bf16, p, steps * n * 2), p += steps * n * 2;
    memcpy(res, p, runs * 3 * n * 4);

    float *master = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    uint16_t *out = malloc(n * 2);
    assert_true(master && m && v && out);
    fso_isa isas[] = {FSO_ISA_SCALAR, FSO_ISA_AVX2, FSO_ISA_AVX512};
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        const fso_adamw_kernel *k;
        if (fso_adamw_select(isas[ii], &k) == -ENOTSUP) {
            print_message("torch fixture: %s kernel skipped, this %s lacks it\n",
                          fso_isa_name(isas[ii]), fso_isa_built(isas[ii]) ? "CPU" : "build");
            continue;
        }
        for (size_t r = 0; r < runs; r++) {
            const double *h = hyper + r * nhyper;
            bool bf16 = h[4] != 0.0;
            memcpy(master, params0, n * 4);
            memset(m, 0, n * 4);
            memset(v, 0, n * 4);
            for (size_t s = 0; s < steps; s++) {
                fso_adamw_step st = {.lr = h[8 + s], .beta1 = h[0], .beta2 = h[1], .eps = h[2],
                                     .weight_decay = h[3], .grad_scale = h[8 + steps + s],
                                     .t = (int64_t)s + 1};
                const void *g = bf16 ? (const void *)(grads_bf16 + s * n)
                                     : (const void *)(grads + s * n);
                fso_adamw_fused(k, master, g, bf16 ? FSO_DT_BF16 : FSO_DT_F32, m, v, out, n,
                                &st);
            }
            const float *want[3] = {res + (r * 3) * n, res + (r * 3 + 1) * n,
                                    res + (r * 3 + 2) * n};
            const float *got[3] = {master, m, v};
            static const char *names[3] = {"params", "exp_avg", "exp_avg_sq"};
            double lr_sum = 0.0;
            for (size_t s = 0; s < steps; s++)
                lr_sum += h[8 + s];
            for (int a = 0; a < 3; a++) {
                double worst = 0.0;
                for (size_t i = 0; i < n; i++) {
                    double gmax = 0.0; /* the largest gradient term this element saw */
                    for (size_t s = 0; s < steps; s++) {
                        double g = bf16 ? fso_f32_from_bf16(grads_bf16[s * n + i])
                                        : grads[s * n + i];
                        g = fabs(g * h[8 + steps + s]);
                        gmax = g > gmax ? g : gmax;
                    }
                    double scale = fabs(want[a][i]) +
                                   (a == 0 ? lr_sum : a == 1 ? gmax : gmax * gmax);
                    double d = fabs((double)got[a][i] - want[a][i]);
                    if (!(d <= TORCH_TOL * scale))
                        fail_msg("%s run %zu %s[%zu]: fsoff %.9g, torch %.9g, |diff| %.3g > "
                                 "%.3g", k->name, r, names[a], i, got[a][i], want[a][i], d,
                                 TORCH_TOL * scale);
                    if (scale > 0 && d / scale > worst)
                        worst = d / scale;
                }
                if (ii == 0)
                    print_message("torch fixture run %zu (%s grads): %s normalized diff %.2g\n",
                                  r, bf16 ? "bf16" : "fp32", names[a], worst);
            }
            for (size_t i = 0; i < n; i++)
                check_bf16(out[i], master[i], "fixture bf16 out", i);
        }
    }
    free(master), free(m), free(v), free(out);
    free(hyper), free(params0), free(grads), free(res), free(grads_bf16);
    free(blob);
}

/* ---- threads ------------------------------------------------------------ */

static void test_thread_count_does_not_change_result(void **unused)
{
    (void)unused;
    const size_t n = 6 * FSO_ADAMW_MT_GRAIN_ELEMS + 12345; /* splits over 3 threads */
    const size_t off = 3;                                   /* an unaligned start */
    const fso_adamw_kernel *k;
    assert_int_equal(fso_adamw_select(FSO_ISA_AUTO, &k), 0);
    state s;
    state_random(&s, n);
    gbuf ref_master = {0}, ref_m = {0}, ref_v = {0}, ref_out = {0};
    for (int threads = 1; threads <= 3; threads++) {
        fso_optpool *op = NULL;
        assert_int_equal(fso_optpool_create(&op, threads), 0);
        int bound = fso_optpool_bind(op, 0, false); /* node 0 exists everywhere */
        assert_true(bound >= 0 && bound <= threads - 1);
        gbuf master, grad, m, v, out;
        gbuf_alloc(&master, n, 4, off), gbuf_alloc(&grad, n, 2, off), gbuf_alloc(&m, n, 4, off);
        gbuf_alloc(&v, n, 4, off), gbuf_alloc(&out, n, 2, off);
        memcpy(master.p, s.master, n * 4), memcpy(grad.p, s.grad_bf16, n * 2);
        memcpy(m.p, s.m, n * 4), memcpy(v.p, s.v, n * 4);
        for (int t = 1; t <= 3; t++) {
            fso_adamw_step st = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                 .weight_decay = 0.1, .grad_scale = 0.5, .t = t};
            fso_adamw_fused_mt(k, fso_optpool_pool(op), (float *)master.p, grad.p, FSO_DT_BF16,
                               (float *)m.p, (float *)v.p, (uint16_t *)out.p, n, &st);
        }
        gbuf_check(&master, "master"), gbuf_check(&m, "m"), gbuf_check(&v, "v");
        gbuf_check(&out, "bf16 out");
        if (threads == 1) {
            ref_master = master, ref_m = m, ref_v = v, ref_out = out;
        } else {
            if (memcmp(master.p, ref_master.p, n * 4) || memcmp(m.p, ref_m.p, n * 4) ||
                memcmp(v.p, ref_v.p, n * 4) || memcmp(out.p, ref_out.p, n * 2))
                fail_msg("%d threads (%d bound) differ from 1 thread", threads, bound);
            gbuf_free(&master), gbuf_free(&m), gbuf_free(&v), gbuf_free(&out);
        }
        gbuf_free(&grad);
        fso_optpool_destroy(op);
    }
    gbuf_free(&ref_master), gbuf_free(&ref_m), gbuf_free(&ref_v), gbuf_free(&ref_out);
    state_free(&s);
}

static void test_optpool_binding_degrades_quietly(void **unused)
{
    (void)unused;
    fso_optpool *op = NULL;
    assert_int_equal(fso_optpool_create(&op, 2), 0);
    assert_int_equal(fso_optpool_threads(op), 2);
    assert_true(fso_optpool_nodes(op) >= 1);
    assert_int_equal(fso_optpool_bind(op, 1 << 20, false), -EINVAL);
    int bound = fso_optpool_bind(op, -1, false);
    assert_true(bound == 0 || bound == 1);
    float *buf = aligned_alloc(4096, 1 << 16);
    assert_non_null(buf);
    memset(buf, 0, 1 << 16);
    int node = fso_optpool_node_of(op, buf, 1 << 16);
    assert_true(node >= -1 && node < 1 << 20);
    print_message("optpool: %d NUMA node(s), %d of 1 worker bound, test memory on node %d\n",
                  fso_optpool_nodes(op), bound, node);
    free(buf);
    fso_optpool_destroy(op);
    fso_optpool_destroy(NULL);
}

/* ---- selection and the trainer's entry point ---------------------------- */

static void test_select_reports_what_the_cpu_lacks(void **unused)
{
    (void)unused;
    const fso_adamw_kernel *k = NULL, *best = NULL;
    assert_int_equal(fso_adamw_select(FSO_ISA_SCALAR, &k), 0);
    assert_string_equal(k->name, "scalar");
    assert_int_equal(fso_adamw_select(FSO_ISA_AUTO, &best), 0);
    assert_int_equal(best->isa, fso_isa_best());
    assert_int_equal(fso_adamw_select((fso_isa)42, &k), -EINVAL);
    for (int isa = FSO_ISA_AUTO; isa < FSO_ISA_COUNT; isa++) {
        fso_isa parsed;
        assert_int_equal(fso_isa_parse(fso_isa_name((fso_isa)isa), &parsed), 0);
        assert_int_equal(parsed, isa);
    }
    fso_isa parsed;
    assert_int_equal(fso_isa_parse("sse", &parsed), -EINVAL);
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl");
    bool has2 = __builtin_cpu_supports("avx2");
    assert_int_equal(fso_isa_cpu_has(FSO_ISA_AVX512), has512);
    assert_int_equal(fso_isa_cpu_has(FSO_ISA_AVX2), has2);
    int rc = fso_adamw_select(FSO_ISA_AVX512, &k);
    if (!has512)
        assert_int_equal(rc, -ENOTSUP);
    if (rc == 0)
        assert_int_equal(best->isa, FSO_ISA_AVX512);
#endif
    print_message("auto selects %s\n", best->name);
}

/* FSO_ISA, as the trainer reads it: unset, empty and "auto" mean the widest;
 * a set the machine runs is taken; an unknown name or a set the CPU or build
 * lacks is an error naming the value and what the machine runs. */
static void test_fso_isa_chooses_or_fails_clearly(void **unused)
{
    (void)unused;
    const char *saved = getenv("FSO_ISA");
    char *keep = saved ? strdup(saved) : NULL, err[256];
    fso_isa isa;
    unsetenv("FSO_ISA");
    assert_int_equal(fso_isa_from_env(&isa, err, sizeof err), 0);
    assert_int_equal(isa, fso_isa_best());
    setenv("FSO_ISA", "", 1);
    assert_int_equal(fso_isa_from_env(&isa, err, sizeof err), 0);
    assert_int_equal(isa, fso_isa_best());
    setenv("FSO_ISA", "auto", 1);
    assert_int_equal(fso_isa_from_env(&isa, err, sizeof err), 0);
    assert_int_equal(isa, fso_isa_best());
    setenv("FSO_ISA", "sse4", 1);
    assert_int_equal(fso_isa_from_env(&isa, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "FSO_ISA=sse4: unknown instruction set"));
    assert_non_null(strstr(err, "scalar"));
    for (int i = FSO_ISA_SCALAR; i < FSO_ISA_COUNT; i++) {
        const char *name = fso_isa_name((fso_isa)i);
        setenv("FSO_ISA", name, 1);
        int rc = fso_isa_from_env(&isa, err, sizeof err);
        if (fso_isa_supported((fso_isa)i)) {
            assert_int_equal(rc, 0);
            assert_int_equal(isa, i);
            print_message("FSO_ISA=%s: taken\n", name);
        } else {
            assert_int_equal(rc, -ENOTSUP);
            assert_non_null(strstr(err, name));
            assert_non_null(strstr(err, "lack"));
            assert_non_null(strstr(err, "scalar")); /* what it runs instead */
            print_message("FSO_ISA=%s: refused here: %s\n", name, err);
        }
    }
    if (keep)
        setenv("FSO_ISA", keep, 1);
    else
        unsetenv("FSO_ISA");
    free(keep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select_reports_what_the_cpu_lacks),
        cmocka_unit_test(test_fso_isa_chooses_or_fails_clearly),
        cmocka_unit_test(test_avx2_matches_scalar_bit_for_bit),
        cmocka_unit_test(test_avx512_matches_scalar_bit_for_bit),
        cmocka_unit_test(test_bf16_out_rounds_to_nearest_even),
        cmocka_unit_test(test_matches_torch_adamw_fixture),
        cmocka_unit_test(test_thread_count_does_not_change_result),
        cmocka_unit_test(test_optpool_binding_degrades_quietly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
