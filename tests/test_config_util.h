/* test_config_util.h — what the configuration tests (test_config.c,
 * test_ds_config.c) share: a config file written into the test's folder,
 * the whole load sequence, the exact error expected, and the warnings a
 * load printed. Include after test_util.h (tdir, FSO_TEST_FN). */
#ifndef FSO_TEST_CONFIG_UTIL_H
#define FSO_TEST_CONFIG_UTIL_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "test_util.h"

/* Write text to <dir>/<name>; t->file is its path. */
FSO_TEST_FN const char *write_cfg(tdir *t, const char *name, const char *text)
{
    snprintf(t->file, sizeof(t->file), "%s/%s", t->path, name);
    FILE *f = fopen(t->file, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    return t->file;
}

/* Load an optional file and --set list, then finish; returns finish's (or the
 * first failing call's) result with the message in cfg->err. */
FSO_TEST_FN int load(fso_config *cfg, const char *path, const char *const *sets, int nsets)
{
    fso_config_defaults(cfg);
    int rc = 0;
    if (path)
        rc = fso_config_load_file(cfg, path);
    for (int i = 0; rc == 0 && i < nsets; i++)
        rc = fso_config_set(cfg, sets[i]);
    if (rc == 0)
        rc = fso_config_finish(cfg);
    fso_config_free(cfg);
    return rc;
}

FSO_TEST_FN int load_text(tdir *t, fso_config *cfg, const char *text)
{
    return load(cfg, write_cfg(t, "job.json", text), NULL, 0);
}

FSO_TEST_FN int load_sets(fso_config *cfg, const char *const *sets, int nsets)
{
    return load(cfg, NULL, sets, nsets);
}

/* cfg->err must be exactly the formatted text. */
__attribute__((format(printf, 2, 3)))
FSO_TEST_FN void expect_err(const fso_config *cfg, const char *fmt, ...)
{
    char want[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    assert_string_equal(cfg->err, want);
}

/* Run fn with stderr going to a file; returns what was written (caller frees). */
FSO_TEST_FN char *capture_stderr(tdir *t, int (*fn)(tdir *, fso_config *), fso_config *c,
                                  int *rc)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/stderr.txt", t->path);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    *rc = fn(t, c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 8192);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 8191, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

#endif
