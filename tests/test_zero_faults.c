/* test_zero_faults.c — the sharded trainer when things go wrong or move:
 *  - NVMe faults (EIO on read and write, ENOSPC, short reads) end the step
 *    with a clear error or are retried, never computing from a bad shard; a
 *    failed update stops every device that shares the block;
 *  - folder errors and the tmpfs fallback;
 *  - re-plans while training: every move of parameters and optimizer state
 *    between the tiers keeps the run's bits, and a move that fails or would
 *    pass the device cap changes nothing.
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "cpu_async.h"
#include "test_util.h"
#include "train.h"
#include "util.h"
#include "zero/zero.h"

static char nvme_dir[512];

/* ---- faults */

static fso_fault_spec g_spec;
static void inject(fso_trainer *tr)
{
    assert_int_equal(fso_zero_inject_faults(tr->zero, 0, &g_spec), 0);
}

static void fault_run(fso_fault_spec spec, run_result *r)
{
    fso_config cfg;
    fso_test_small_model(&cfg, 2, 4);
    fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_NVME, nvme_dir);
    g_spec = spec;
    run(&cfg, &(run_hooks){.started = inject}, r);
}

static void test_nvme_read_eio_ends_the_step(void **state)
{
    (void)state;
    run_result r;
    fault_run((fso_fault_spec){.read_eio_at = 3}, &r);
    assert_int_equal(r.rc, -EIO);
    assert_non_null(strstr(r.err, "NVMe"));
    assert_non_null(strstr(r.err, "not applied"));
    result_free(&r);
}

static void test_nvme_write_eio_is_reported(void **state)
{
    (void)state;
    run_result r;
    fault_run((fso_fault_spec){.write_eio_at = 2}, &r);
    assert_int_equal(r.rc, -EIO);
    assert_non_null(strstr(r.err, "NVMe"));
    result_free(&r);
}

/* Parameters lent from the buffer the devices share: when device 0's
 * update fails, device 1, waiting for it before lending the block, fails
 * the step too instead of waiting forever or computing with a block half
 * updated; on every schedule. */
static void test_a_failed_update_stops_the_devices_sharing_a_block(void **state)
{
    (void)state;
    for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_BACKWARD; mode++) {
        fso_config cfg;
        run_result r;
        fso_tier t[FSO_N_KINDS];
        fso_test_small_model(&cfg, 2, 4);
        for (int k = 0; k < FSO_N_KINDS; k++) /* m and v on NVMe: the update's writes only */
            t[k] = k == FSO_KIND_M || k == FSO_KIND_V ? FSO_TIER_NVME : FSO_TIER_DEVICE;
        fso_test_set_kind_tiers(&cfg, t, nvme_dir);
        cfg.optimizer_overlap = (fso_overlap)mode;
        cfg.grad_clip = mode == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
        g_spec = (fso_fault_spec){.write_eio_at = 2};
        run(&cfg, &(run_hooks){.started = inject}, &r);
        /* named by the block whose write failed */
        if (r.rc != -EIO || !strstr(r.err, "NVMe I/O for block ") || strstr(r.err, "block -"))
            fail_msg("schedule %d: rc %d: %s", mode, r.rc, r.err);
        result_free(&r);
    }
}

static void test_nvme_enospc_mid_run_is_reported(void **state)
{
    (void)state;
    run_result r;
    fault_run((fso_fault_spec){.write_enospc_at = 5}, &r);
    assert_int_equal(r.rc, -ENOSPC);
    assert_non_null(strstr(r.err, "No space left"));
    result_free(&r);
}

static void test_nvme_short_read_is_retried_exactly(void **state)
{
    (void)state;
    run_result clean, shortr;
    fault_run((fso_fault_spec){0}, &clean);
    fault_run((fso_fault_spec){.short_read_at = 4}, &shortr);
    assert_bit_identical(&clean, &shortr, 1, "short read retried");
    result_free(&clean);
    result_free(&shortr);
}

static void test_nvme_folder_errors(void **state)
{
    (void)state;
    fso_config cfg;
    run_result r;
    fso_test_small_model(&cfg, 1, 2);
    fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_NVME, nvme_dir);
    snprintf(cfg.offload.param_nvme_path, sizeof cfg.offload.param_nvme_path, "%s/missing",
             nvme_dir);
    snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "%s/missing",
             nvme_dir);
    run(&cfg, NULL, &r);
    assert_true(r.rc < 0);
    assert_non_null(strstr(r.err, "missing"));
    result_free(&r);

    char file[600];
    snprintf(file, sizeof file, "%s/plainfile", nvme_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "%s", file);
    snprintf(cfg.offload.param_nvme_path, sizeof cfg.offload.param_nvme_path, "%s", file);
    run(&cfg, NULL, &r);
    assert_true(r.rc < 0);
    assert_non_null(strstr(r.err, "plainfile"));
    result_free(&r);
    unlink(file);
}

static void test_tmpfs_falls_back_to_buffered(void **state)
{
    (void)state;
    char shm[] = "/dev/shm/fsoff-test-XXXXXX";
    if (!mkdtemp(shm)) {
        fprintf(stderr, "# no /dev/shm here: skipping the tmpfs case\n");
        skip();
    }
    fso_config cfg;
    run_result a, b;
    fso_test_small_model(&cfg, 1, 2);
    fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_NVME, nvme_dir);
    run(&cfg, NULL, &a);
    snprintf(cfg.offload.param_nvme_path, sizeof cfg.offload.param_nvme_path, "%s", shm);
    snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "%s", shm);
    run(&cfg, NULL, &b);
    rmdir(shm);
    if (b.rc)
        fail_msg("tmpfs: %s", b.err);
    assert_bit_identical(&a, &b, 1, "tmpfs vs disk");
    result_free(&a);
    result_free(&b);
}

/* Re-plans while training: every move of parameters and optimizer state
 * between the tiers, and prefetch depth changes, keep the run's bits. */
typedef struct move {
    int after_step;
    fso_tier param, optim;
    int prefetch;
    const char *nvme;       /* folder; NULL: the test's */
    uint64_t device_cap;    /* 0: as configured */
    int want_rc;            /* 0, or the failure expected */
    const char *want_err;   /* a part of the message */
    int state_host_blocks;  /* offload.state_host_blocks after the move */
} move;
static const move *g_moves;
static int g_nmoves;

static void do_moves(fso_trainer *tr, int s)
{
    for (int i = 0; i < g_nmoves; i++) {
        const move *m = &g_moves[i];
        if (m->after_step != s)
            continue;
        fso_offload_config o = tr->cfg->offload;
        o.param_tier = m->param;
        o.optim_tier = m->optim;
        o.prefetch_blocks = m->prefetch;
        o.state_host_blocks = m->state_host_blocks;
        const char *dir = m->nvme ? m->nvme : nvme_dir;
        snprintf(o.param_nvme_path, sizeof o.param_nvme_path, "%s", dir);
        snprintf(o.optim_nvme_path, sizeof o.optim_nvme_path, "%s", dir);
        double waited;
        char err[512] = "";
        uint64_t moved = 0;
        assert_int_equal(fso_trainer_finish(tr, &waited), 0);
        int rc = fso_zero_retier(tr->zero, &o, &moved, err, sizeof err);
        if (rc != m->want_rc)
            fail_msg("move %d after step %d: rc %d (%s), expected %d", i, s, rc, err,
                     m->want_rc);
        if (m->want_err && !strstr(err, m->want_err))
            fail_msg("move %d: message \"%s\" lacks \"%s\"", i, err, m->want_err);
        if (rc == 0)
            assert_true(moved > 0);
    }
}

/* The backend of the moving run ("cpu" when NULL); the unmoved run it is
 * compared with is always on "cpu". */
static const char *g_move_backend;

static void moves_keep_bits(int world, fso_tier p0, fso_tier o0, const move *moves, int n,
                            bool bf16)
{
    run_result base, r;
    fso_config cfg;
    fso_test_small_model(&cfg, world, 4);
    cfg.bf16 = bf16;
    fso_test_set_tiers(&cfg, FSO_TIER_DEVICE, FSO_TIER_DEVICE, nvme_dir);
    run(&cfg, NULL, &base);
    assert_int_equal(base.rc, 0);
    fso_test_set_tiers(&cfg, p0, o0, nvme_dir);
    if (g_move_backend)
        cfg.backend = fso_backend_find(g_move_backend)->kind;
    g_moves = moves;
    g_nmoves = n;
    run(&cfg, &(run_hooks){.stepped = do_moves}, &r);
    if (r.rc)
        fail_msg("%s", r.err);
    if (g_move_backend)
        assert_gpu_rules_match(&base, &r, 1, bf16, "re-planned run");
    else
        assert_bit_identical(&base, &r, 1, "re-planned run");
    result_free(&base);
    result_free(&r);
}

static void test_replan_moves_keep_bits_one_device(void **state)
{
    (void)state;
    const move moves[] = {
        {1, FSO_TIER_NVME, FSO_TIER_HOST, 1, NULL, 0, 0, NULL, 0},
        {2, FSO_TIER_HOST, FSO_TIER_NVME, 3, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, moves, 2, false);
    /* and back up from NVMe, the store's files removed once unused */
    const move up[] = {
        {1, FSO_TIER_NVME, FSO_TIER_NVME, 2, NULL, 0, 0, NULL, 0},
        {2, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 0, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(1, FSO_TIER_HOST, FSO_TIER_NVME, up, 2, false);
    char path[600];
    snprintf(path, sizeof path, "%s/fsoff-dev0.0", nvme_dir);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_replan_moves_keep_bits_two_devices(void **state)
{
    (void)state;
    const move moves[] = {
        {1, FSO_TIER_DEVICE, FSO_TIER_NVME, 0, NULL, 0, 0, NULL, 0},
        {2, FSO_TIER_NVME, FSO_TIER_DEVICE, 4, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(2, FSO_TIER_HOST, FSO_TIER_HOST, moves, 2, false);
}

/* Moves of the first blocks' optimizer state between the host and NVMe:
 * onto the host with the rest onto NVMe, more blocks, fewer, none. */
static void test_replan_moves_first_blocks_state_keep_bits(void **state)
{
    (void)state;
    const move moves[] = {
        {1, FSO_TIER_HOST, FSO_TIER_NVME, 2, NULL, 0, 0, NULL, 2},
        {2, FSO_TIER_HOST, FSO_TIER_NVME, 2, NULL, 0, 0, NULL, 1},
    };
    moves_keep_bits(2, FSO_TIER_HOST, FSO_TIER_HOST, moves, 2, true);
    const move more[] = {
        {1, FSO_TIER_DEVICE, FSO_TIER_NVME, 0, NULL, 0, 0, NULL, 3},
        {2, FSO_TIER_DEVICE, FSO_TIER_NVME, 0, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(1, FSO_TIER_DEVICE, FSO_TIER_NVME, more, 2, false);
}

/* bf16 working parameters move at 2 bytes per element, on one device (its
 * shard lent as it is, before and after a trip through NVMe) and two (lent
 * in place from the devices' shared buffer, and gathered from NVMe). */
static void test_replan_moves_keep_bits_bf16(void **state)
{
    (void)state;
    const move one[] = {
        {1, FSO_TIER_NVME, FSO_TIER_HOST, 1, NULL, 0, 0, NULL, 0},
        {2, FSO_TIER_DEVICE, FSO_TIER_NVME, 0, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, one, 2, true);
    const move two[] = {
        {1, FSO_TIER_DEVICE, FSO_TIER_NVME, 0, NULL, 0, 0, NULL, 0},
        {2, FSO_TIER_NVME, FSO_TIER_DEVICE, 4, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(2, FSO_TIER_HOST, FSO_TIER_HOST, two, 2, true);
}

/* A move that cannot be made leaves the placement as it was, says why, and
 * the run goes on with the same bits. */
static void test_replan_failures_change_nothing(void **state)
{
    (void)state;
    const move moves[] = {
        {1, FSO_TIER_NVME, FSO_TIER_NVME, 2, "/nonexistent/fsoff", 0, -ENOENT, "no such folder",
         0},
        {1, FSO_TIER_HOST, FSO_TIER_HOST, 40, NULL, 0, -EINVAL, "prefetch depth 40", 0},
        {1, FSO_TIER_HOST, FSO_TIER_NVME, 2, NULL, 0, -EINVAL, "state_host_blocks 9: must be 0 to",
         9},
        {2, FSO_TIER_NVME, FSO_TIER_HOST, 1, NULL, 0, 0, NULL, 0},
    };
    moves_keep_bits(2, FSO_TIER_DEVICE, FSO_TIER_HOST, moves, 4, false);
}

/* Moving state between tiers mid-run on a device with a GPU's rules
 * (cpu-async): the copies between device memory and the host keep the
 * bits, and refused moves still change nothing. */
static void test_replan_moves_keep_bits_on_a_gpu_like_device(void **state)
{
    g_move_backend = fso_test_gpu_rules();
    test_replan_moves_keep_bits_one_device(state);
    test_replan_moves_keep_bits_two_devices(state);
    test_replan_moves_keep_bits_bf16(state);
    test_replan_failures_change_nothing(state);
    g_move_backend = NULL;
}

static void test_replan_over_the_device_cap_changes_nothing(void **state)
{
    (void)state;
    fso_config cfg;
    run_result base, r;
    fso_test_small_model(&cfg, 1, 4);
    fso_test_set_tiers(&cfg, FSO_TIER_HOST, FSO_TIER_HOST, nvme_dir);
    run(&cfg, NULL, &base);
    assert_int_equal(base.rc, 0);
    /* room for the activations and the gather window, not for the state */
    cfg.device_mem_bytes = base.peak_device + (64u << 10);
    const move moves[] = {
        {1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 0, NULL, 0, -ENOMEM, "device memory: device 0", 0},
    };
    g_moves = moves;
    g_nmoves = 1;
    run(&cfg, &(run_hooks){.stepped = do_moves}, &r);
    if (r.rc)
        fail_msg("%s", r.err);
    assert_bit_identical(&base, &r, 1, "after a refused move");
    result_free(&base);
    result_free(&r);
}

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(nvme_dir, sizeof nvme_dir, "fsoff-zero-faults");
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(nvme_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvme_read_eio_ends_the_step),
        cmocka_unit_test(test_nvme_write_eio_is_reported),
        cmocka_unit_test(test_a_failed_update_stops_the_devices_sharing_a_block),
        cmocka_unit_test(test_nvme_enospc_mid_run_is_reported),
        cmocka_unit_test(test_nvme_short_read_is_retried_exactly),
        cmocka_unit_test(test_nvme_folder_errors),
        cmocka_unit_test(test_tmpfs_falls_back_to_buffered),
        cmocka_unit_test(test_replan_moves_keep_bits_one_device),
        cmocka_unit_test(test_replan_moves_keep_bits_two_devices),
        cmocka_unit_test(test_replan_moves_first_blocks_state_keep_bits),
        cmocka_unit_test(test_replan_moves_keep_bits_bf16),
        cmocka_unit_test(test_replan_failures_change_nothing),
        cmocka_unit_test(test_replan_moves_keep_bits_on_a_gpu_like_device),
        cmocka_unit_test(test_replan_over_the_device_cap_changes_nothing),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
