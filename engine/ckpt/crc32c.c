/* crc32c.c — CRC-32C (crc32c.h): slicing-by-8 tables, and the SSE4.2 crc32
 * instruction, three streams at once, where the CPU has it (checked once,
 * at the first call). */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u /* 0x1EDC6F41 reflected */

static uint32_t table[8][256];

static void make_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian: the CRC meets the first four bytes */
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
              table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

/* Three streams at once. The crc32 instruction takes three cycles and
 * issues one per cycle, so one stream runs at a third of its rate: the
 * instruction path cuts long buffers into three runs of STRIDE bytes,
 * computes them side by side, and joins them. The raw register after a run
 * followed by more bytes is the register after the run advanced over that
 * many zero bytes, xor the register of the rest alone: advancing over
 * STRIDE zero bytes is a linear map of the 32 register bits (over GF(2)),
 * kept as four byte-indexed tables. */
#define STRIDE 8192

static uint32_t advance[4][256];

/* A linear map of the register: col[i] is the image of bit i. */
typedef struct linmap {
    uint32_t col[32];
} linmap;

static uint32_t map_apply(const linmap *m, uint32_t v)
{
    uint32_t r = 0;
    for (int i = 0; v; i++, v >>= 1)
        if (v & 1)
            r ^= m->col[i];
    return r;
}

/* out = a after b */
static void map_after(linmap *out, const linmap *a, const linmap *b)
{
    linmap t;
    for (int i = 0; i < 32; i++)
        t.col[i] = map_apply(a, b->col[i]);
    *out = t;
}

/* The register's map over n zero bytes. */
static void map_zero_bytes(linmap *out, size_t n)
{
    linmap bit, byte, acc;
    bit.col[0] = POLY; /* one zero bit: r >> 1, xor POLY when bit 0 was set */
    for (int i = 1; i < 32; i++)
        bit.col[i] = 1u << (i - 1);
    byte = bit;
    for (int k = 1; k < 8; k++)
        map_after(&byte, &bit, &byte);
    for (int i = 0; i < 32; i++)
        acc.col[i] = 1u << i;
    for (; n; n >>= 1) { /* by squaring */
        if (n & 1)
            map_after(&acc, &byte, &acc);
        map_after(&byte, &byte, &byte);
    }
    *out = acc;
}

static void make_advance(void)
{
    linmap m;
    map_zero_bytes(&m, STRIDE);
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 0; k < 4; k++)
            advance[k][b] = map_apply(&m, b << (8 * k));
}

static inline uint32_t advance_stride(uint32_t r)
{
    return advance[0][r & 0xff] ^ advance[1][(r >> 8) & 0xff] ^ advance[2][(r >> 16) & 0xff] ^
           advance[3][r >> 24];
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t n)
{
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    for (; n >= 3 * STRIDE; n -= 3 * STRIDE, p += 3 * STRIDE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < STRIDE; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + STRIDE + i, 8);
            memcpy(&w2, p + 2 * STRIDE + i, 8);
            c = __builtin_ia32_crc32di(c, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
        }
        c = advance_stride((uint32_t)c) ^ (uint32_t)c1;
        c = advance_stride((uint32_t)c) ^ (uint32_t)c2;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

/* 1 table, 2 instruction; set once, with the tables. */
static int impl;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    make_tables();
    make_advance();
    impl = 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        impl = 2;
#endif
}

static int choose(void)
{
    pthread_once(&once, init);
    return impl;
}

uint32_t fso_crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
    choose();
    return ~crc_sw(~crc, buf, n);
}

uint32_t fso_crc32c(uint32_t crc, const void *buf, size_t n)
{
#if defined(__x86_64__)
    if (choose() == 2)
        return ~crc_hw(~crc, buf, n);
#else
    choose();
#endif
    return ~crc_sw(~crc, buf, n);
}
