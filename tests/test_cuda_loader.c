/* test_cuda_loader.c — fsoff without a GPU, or without the CUDA libraries:
 * the CUDA module (kernels/cuda/cuda_module.h) is loaded only on demand, and when
 * it cannot be, every entry point of cuda_backend.h says why instead of
 * failing to start or crashing.
 *
 *  - the module built with this fsoff loads and its table matches this
 *    program (ABI, build identity, version, struct sizes); asked for
 *    devices without a driver it answers 0 with a reason;
 *  - a missing file and a library that is not a module are refused, the
 *    message naming the file;
 *  - modules from another build are refused: one with another build
 *    identity (its interface headers differed) with both identities and
 *    both files named, one with another interface number without reading
 *    its table past that number (module_stub/other_module.c);
 *  - with FSO_CUDA_MODULE at a missing file (a CUDA build on a machine
 *    without its module or libraries), availability, device count and
 *    queries give -ENODEV and the reason naming the file and the fix;
 *    creating a backend or a communicator fails the same way; CPU backends
 *    are not taken for CUDA ones and are destroyed as usual.
 * In a build without CUDA: fso_cuda_available() says so (-ENOTSUP).
 * The process-wide load happens once, so the FSO_CUDA_MODULE case runs last.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_module.h"
#include "fso_build.h"

#if FSO_HAVE_CUDA

#include <limits.h>
#include <unistd.h>

#include "fso_cuda_module_id.h"

#define MISSING "/nonexistent/fsoff-test/" FSO_CUDA_MODULE_FILE
#define STUBS FSO_CUDA_MODULE_BUILD_DIR "/tests/module_stub/"

static void test_the_built_module_loads_and_matches_this_program(void **state)
{
    (void)state;
    const fso_cuda_module_api *api = NULL;
    char err[1024] = "";
    int rc = fso_cuda_module_open(FSO_CUDA_MODULE_BUILD_DIR "/" FSO_CUDA_MODULE_FILE, &api, err,
                                  sizeof err);
    if (rc != 0)
        fail_msg("%s", err);
    assert_non_null(api);
    assert_int_equal(api->abi, FSO_CUDA_MODULE_ABI);
    assert_string_equal(api->build_id, FSO_CUDA_MODULE_ID);
    assert_int_equal(strlen(FSO_CUDA_MODULE_ID), 16);
    assert_string_equal(api->version, FSO_VERSION);
    err[0] = 0;
    int n = api->device_count(err, sizeof err);
    assert_true(n >= 0);
    if (n == 0)
        assert_true(strstr(err, "no CUDA device") != NULL);
    assert_int_equal(api->backend_is_cuda(NULL), 0);
}

static void test_a_missing_file_is_named(void **state)
{
    (void)state;
    const fso_cuda_module_api *api = (const void *)1;
    char err[1024] = "";
    assert_int_equal(fso_cuda_module_open(MISSING, &api, err, sizeof err), -ENOENT);
    assert_null(api);
    assert_non_null(strstr(err, MISSING));
}

static void test_a_library_that_is_not_the_module_is_refused(void **state)
{
    (void)state;
    Dl_info info;
    assert_true(dladdr((void *)&snprintf, &info) != 0 && info.dli_fname); /* libc */
    const fso_cuda_module_api *api = (const void *)1;
    char err[1024] = "";
    assert_int_equal(fso_cuda_module_open(info.dli_fname, &api, err, sizeof err), -ENOEXEC);
    assert_null(api);
    assert_non_null(strstr(err, info.dli_fname));
    assert_non_null(strstr(err, "not an fsoff CUDA module"));
}

/* err has `want` in it, else the test fails showing err */
static void assert_says(const char *err, const char *want)
{
    if (!strstr(err, want))
        fail_msg("the reason does not say \"%s\": \"%s\"", want, err);
}

static void test_a_module_with_another_build_identity_is_refused_naming_both(void **state)
{
    (void)state;
    const char *path = STUBS "libfso_cuda_other_id.so";
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    const fso_cuda_module_api *api = (const void *)1;
    char err[1024] = "";
    assert_int_equal(fso_cuda_module_open(path, &api, err, sizeof err), -ENOEXEC);
    fprintf(stderr, "# %s\n", err);
    assert_null(api);
    assert_says(err, path);
    assert_says(err, self);
    assert_says(err, "0123456789abcdef"); /* the stand-in's identity */
    assert_says(err, FSO_CUDA_MODULE_ID);  /* this program's */
    assert_says(err, "headers that define the module interface differ");
    assert_says(err, "rebuild or reinstall fsoff");
}

/* The stand-in's table is its interface number alone: reading any field
 * after it would read past the stand-in's data (AddressSanitizer builds
 * report that; other builds read whatever follows). */
static void test_a_module_with_another_interface_is_refused_from_its_number_alone(void **state)
{
    (void)state;
    const char *path = STUBS "libfso_cuda_other_abi.so";
    const fso_cuda_module_api *api = (const void *)1;
    char err[1024] = "";
    char other[32];
    snprintf(other, sizeof other, "interface is number %u", FSO_CUDA_MODULE_ABI + 1);
    assert_int_equal(fso_cuda_module_open(path, &api, err, sizeof err), -ENOEXEC);
    fprintf(stderr, "# %s\n", err);
    assert_null(api);
    assert_says(err, path);
    assert_says(err, other);
    assert_says(err, "another fsoff build");
}

/* The tests' CUDA stand-in (tests/standin) is refused by a program that
 * does not link tests/standin/allow.c, as fsoff does not: this one. */
static void test_the_cuda_stand_in_is_refused_outside_the_tests(void **state)
{
    (void)state;
    const char *path = FSO_CUDA_MODULE_BUILD_DIR "/tests/standin/libfso_cuda_standin.so";
    const fso_cuda_module_api *api = (const void *)1;
    char err[1024] = "";
    assert_true(&fso_cuda_standin_allowed == NULL);
    assert_int_equal(fso_cuda_module_open(path, &api, err, sizeof err), -ENOEXEC);
    fprintf(stderr, "# %s\n", err);
    assert_null(api);
    assert_says(err, path);
    assert_says(err, "the tests' CUDA stand-in");
    assert_says(err, "unset FSO_CUDA_MODULE");
}

/* err names the variable and its file, and says what to do */
static void assert_names_the_module(const char *err)
{
    if (!strstr(err, "FSO_CUDA_MODULE=" MISSING) || !strstr(err, "unset it"))
        fail_msg("the reason does not name the module and the fix: \"%s\"", err);
}

static void test_without_its_module_every_entry_point_says_why(void **state)
{
    (void)state;
    char err[1024] = "";
    assert_int_equal(setenv("FSO_CUDA_MODULE", MISSING, 1), 0);

    assert_int_equal(fso_cuda_available(err, sizeof err), -ENODEV);
    assert_names_the_module(err);
    err[0] = 0;
    assert_int_equal(fso_cuda_device_count(err, sizeof err), 0);
    assert_names_the_module(err);

    fso_gpu_info gi;
    err[0] = 0;
    assert_int_equal(fso_gpu_info_query(0, &gi, err, sizeof err), -ENODEV);
    assert_names_the_module(err);

    fso_backend *be = (fso_backend *)1;
    err[0] = 0;
    assert_int_equal(fso_backend_create_cuda(&be, 0, 0, err, sizeof err), -ENODEV);
    assert_null(be);
    assert_names_the_module(err);
    be = (fso_backend *)1; /* the registry's row goes the same way */
    err[0] = 0;
    assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CUDA, 0, 0, 0, err, sizeof err), -ENODEV);
    assert_null(be);
    assert_names_the_module(err);

    fso_backend *cpu = NULL;
    assert_int_equal(fso_backend_create(&cpu, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
    assert_int_equal(fso_backend_is_cuda(cpu), 0);
    fso_coll *coll = (fso_coll *)1;
    err[0] = 0;
    assert_int_equal(fso_coll_create_nccl(&coll, 1, &cpu, err, sizeof err), -ENODEV);
    assert_null(coll);
    assert_names_the_module(err);
    unsigned char id[FSO_NCCL_ID_BYTES];
    err[0] = 0;
    assert_int_equal(fso_nccl_rail_id(id, err, sizeof err), -ENODEV);
    assert_names_the_module(err);
    coll = (fso_coll *)1;
    memset(id, 0, sizeof id);
    err[0] = 0;
    assert_int_equal(fso_coll_create_nccl_rail(&coll, 0, 2, 0, id, 1.0, NULL, err, sizeof err),
                     -ENODEV);
    assert_null(coll);
    assert_names_the_module(err);

    char page[4096];
    err[0] = 0;
    assert_int_equal(fso_cuda_host_register(page, sizeof page, err, sizeof err), -ENODEV);
    assert_names_the_module(err);
    assert_int_equal(fso_cuda_host_unregister(page, sizeof page), -ENODEV);

    fso_backend_destroy(cpu);
    fso_backend_destroy_cuda(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_built_module_loads_and_matches_this_program),
        cmocka_unit_test(test_a_missing_file_is_named),
        cmocka_unit_test(test_a_library_that_is_not_the_module_is_refused),
        cmocka_unit_test(test_a_module_with_another_build_identity_is_refused_naming_both),
        cmocka_unit_test(test_a_module_with_another_interface_is_refused_from_its_number_alone),
        cmocka_unit_test(test_the_cuda_stand_in_is_refused_outside_the_tests),
        cmocka_unit_test(test_without_its_module_every_entry_point_says_why),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no CUDA in this build */

int main(void)
{
    char err[512] = "";
    if (fso_cuda_available(err, sizeof err) != -ENOTSUP || !strstr(err, "built without CUDA")) {
        fprintf(stderr, "test_cuda_loader: fso_cuda_available: want -ENOTSUP, \"built without "
                        "CUDA...\"; got \"%s\"\n", err);
        return 1;
    }
    return 0;
}

#endif
