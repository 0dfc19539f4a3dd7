/* test_zero_arena.c — the host arena (engine/zero/zero_arena.c) on its own:
 * no range it hands out crosses one of its pinning registrations (a copy
 * over two is refused by the CUDA driver), with the registration size shrunk
 * to a few pages; and each device's range is bound to its NUMA node before
 * any of its pages is touched, pinning (mlock here) touching them after.
 *
 * On a machine with one NUMA node the binding is to that node: the test
 * checks the order (a bind policy and no page resident before pinning, the
 * pages on the node after), not that two devices' ranges land on two
 * sockets, which needs a machine with two. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "store.h"
#include "topology.h"
#include "zero/zero_impl.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* linux/mempolicy.h's, without needing libnuma's headers. hwloc's BIND
 * without STRICT is MPOL_PREFERRED_MANY where the kernel has it (else
 * MPOL_PREFERRED, or MPOL_BIND): the node first, others when it is full. */
#define MPOL_PREFERRED_ 1
#define MPOL_BIND_ 2
#define MPOL_PREFERRED_MANY_ 5
#define MPOL_F_NODE_ 1
#define MPOL_F_ADDR_ 2

/* get_mempolicy(2) for the page at p: with node, the node its page is on;
 * else whether its policy places it on `want` (a bind or preference naming
 * that node), -1 when it has none (the process's default: the node of the
 * thread that touches it first). */
static int policy_of(void *p, bool node, int want)
{
    int mode = -1;
    unsigned long mask[16] = {0};
    long rc = syscall(SYS_get_mempolicy, &mode, node ? NULL : mask,
                      node ? 0UL : (unsigned long)(sizeof mask * 8), p,
                      (unsigned long)(MPOL_F_ADDR_ | (node ? MPOL_F_NODE_ : 0)));
    if (rc != 0)
        fail_msg("get_mempolicy at %p: %s", p, strerror(errno));
    if (node)
        return mode;
    const bool names = (mask[want / 64] >> (want % 64)) & 1;
    return (mode == MPOL_BIND_ || mode == MPOL_PREFERRED_ || mode == MPOL_PREFERRED_MANY_) &&
                   names
               ? 1
               : -1;
}

static size_t resident_pages(void *p, size_t bytes)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page;
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore(p, bytes, v), 0);
    size_t in = 0;
    for (size_t i = 0; i < n; i++)
        in += v[i] & 1;
    free(v);
    return in;
}

typedef struct two_devices {
    fso_config cfg;
    fso_zero z;
    rank_state ranks[2];
} two_devices;

static void two_devices_init(two_devices *t, bool pin_memory)
{
    memset(t, 0, sizeof *t);
    t->cfg.offload.pin_memory = pin_memory;
    t->z.cfg = &t->cfg;
    t->z.world = 2;
    t->z.ranks = t->ranks;
    for (int r = 0; r < 2; r++) {
        t->ranks[r].z = &t->z;
        t->ranks[r].rank = r;
        t->ranks[r].numa = -1;
    }
}

static void two_devices_free(two_devices *t)
{
    zr_arena_free(&t->z);
    fso_topo_destroy(t->z.topo);
}

/* The piece of the arena's registrations holding offset off. */
static int piece_of(const host_arena *a, size_t off)
{
    for (int i = 0; i < a->n_pieces; i++)
        if (off >= a->piece[i] && off < a->piece[i + 1])
            return i;
    fail_msg("offset %zu is in no piece (pinned %zu)", off, a->pinned);
    return -1;
}

/* Ranges of 4 to 48 KiB, registrations of at most 64 KiB: a range that
 * would cross one starts the next instead, at creation and after a grow
 * (a re-plan's), and the pieces stay within the size. */
static void test_no_range_crosses_a_registration(void **state)
{
    (void)state;
    two_devices t;
    char err[256];
    two_devices_init(&t, false);
    host_arena *a = &t.z.arena;
    a->pin_chunk_bytes = 64 * KiB;
    assert_int_equal(zr_arena_init(&t.z, 64 * MiB, 8 * MiB, err, sizeof err), 0);
    size_t off[400], len[400];
    int n = 0;
    uint32_t seed = 12345;
    for (int round = 0; round < 2; round++) {
        if (round == 1)
            assert_int_equal(zr_arena_grow(&t.z, a->bytes + 8 * MiB, err, sizeof err), 0);
        for (int i = 0; i < 150; i++, n++) {
            seed = seed * 1103515245u + 12345u;
            len[n] = 4 * KiB + (seed >> 8) % (44 * KiB);
            off[n] = (size_t)((char *)zr_rank_take(&t.ranks[i % 2], len[n]) - (char *)a->base);
        }
        zr_arena_pin(&t.z, round == 0);
        assert_int_equal(a->pinned, fso_fp_round_page(a->used));
        assert_true(a->n_pieces > 20);
        for (int i = 0; i < n; i++) {
            const int p = piece_of(a, off[i]);
            if (off[i] + len[i] > a->piece[p + 1])
                fail_msg("range %d [%zu, %zu) crosses the registration boundary at %zu", i,
                         off[i], off[i] + len[i], a->piece[p + 1]);
        }
        for (int p = 0; p < a->n_pieces; p++)
            if (a->piece[p + 1] - a->piece[p] > a->pin_chunk_bytes)
                fail_msg("piece %d is %zu bytes, over %zu", p, a->piece[p + 1] - a->piece[p],
                         a->pin_chunk_bytes);
    }
    two_devices_free(&t);
}

/* What a store's register_buffers saw (io_uring's pins the range, as
 * rank 0's did over the whole arena before the others had bound theirs):
 * the length registered, and pages of it not bound to `node` then. */
typedef struct seen_store {
    fso_store st;
    int node;
    size_t registered, unbound;
} seen_store;

static int seen_register_buffers(fso_store *s, void *base, size_t len)
{
    seen_store *ss = (seen_store *)s;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ss->registered = len;
    for (size_t off = 0; off < len; off += page)
        ss->unbound += policy_of((char *)base + off, false, ss->node) != 1;
    return 0;
}

/* Each device's ranges carry a bind policy to its node and no page of
 * them is resident before zr_arena_pin; after it (mlock) every page is,
 * on that node; a store registering the arena (rank 0's) sees every page
 * of it bound, device 1's too. */
static void test_ranges_are_bound_before_they_are_pinned(void **state)
{
    (void)state;
    two_devices t;
    char err[256];
    two_devices_init(&t, true);
    if (fso_topo_create(&t.z.topo, NULL, err, sizeof err) < 0)
        skip(); /* no hwloc topology of this machine */
    const int node = t.z.topo->n_numa > 0 ? t.z.topo->numa[0].os_index : 0;
    void *probe = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(probe != MAP_FAILED);
    const int brc = fso_topo_bind_memory(t.z.topo, probe, 4096, node);
    munmap(probe, 4096);
    if (brc < 0) {
        print_message("# binding memory: %s: skipped\n", strerror(-brc));
        fso_topo_destroy(t.z.topo);
        skip();
    }
    for (int r = 0; r < 2; r++)
        t.ranks[r].numa = node; /* one node here: both devices' nodes are it */
    static const fso_store_ops seen_ops = {.register_buffers = seen_register_buffers};
    seen_store store = {.st = {.ops = &seen_ops}, .node = node};
    t.ranks[0].io.store = &store.st;
    assert_int_equal(zr_arena_init(&t.z, 16 * MiB, 4 * MiB, err, sizeof err), 0);
    void *p[8];
    const size_t bytes = 192 * KiB;
    for (int i = 0; i < 8; i++)
        p[i] = zr_rank_take(&t.ranks[i / 4], bytes);
    for (int i = 0; i < 8; i++) {
        if (policy_of(p[i], false, node) != 1)
            fail_msg("range %d (device %d): not bound to node %d before pinning", i, i / 4,
                     node);
        if (resident_pages(p[i], bytes) != 0)
            fail_msg("range %d (device %d): pages touched before it was bound and pinned", i,
                     i / 4);
    }
    zr_arena_pin(&t.z, true);
    assert_int_equal(store.registered, t.z.arena.pinned);
    if (store.unbound)
        fail_msg("the store registered %zu pages not yet bound to node %d", store.unbound, node);
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer makes mlock a no-op that succeeds: nothing to see */
    const bool mlock_works = false;
#else
    const bool mlock_works = true;
#endif
    if (!t.z.arena.locked) {
        print_message("# %s: skipped the after-pinning half\n", t.z.arena.pin_refused);
    } else if (!mlock_works) {
        print_message("# AddressSanitizer ignores mlock: skipped the after-pinning half\n");
    } else {
        for (int i = 0; i < 8; i++) {
            const size_t page = (size_t)sysconf(_SC_PAGESIZE);
            assert_int_equal(resident_pages(p[i], bytes), bytes / page);
            if (policy_of(p[i], true, 0) != node)
                fail_msg("range %d: on node %d, want %d", i, policy_of(p[i], true, 0), node);
        }
    }
    two_devices_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_range_crosses_a_registration),
        cmocka_unit_test(test_ranges_are_bound_before_they_are_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
