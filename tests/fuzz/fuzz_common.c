/* fuzz_common.c — temporary files and failure for the fuzz targets (fuzz.h). */
#include "fuzz.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FILES 8

static char dir[64];
static char paths[MAX_FILES][PATH_MAX];
static int n_files;

void fuzz_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: fuzz check failed: %s\n", file, line, what);
    abort();
}

static void cleanup(void)
{
    for (int i = 0; i < n_files; i++)
        unlink(paths[i]);
    if (dir[0])
        rmdir(dir);
}

const char *fuzz_dir(void)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fsoff-fuzz-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
        FUZZ_CHECK(mkdtemp(dir) != NULL);
        atexit(cleanup);
    }
    return dir;
}

const char *fuzz_file(const char *name, const uint8_t *data, size_t size)
{
    int i = 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    while (i < n_files && strcmp(paths[i], path) != 0)
        i++;
    if (i == n_files) {
        FUZZ_CHECK(n_files < MAX_FILES);
        snprintf(paths[n_files++], PATH_MAX, "%s", path);
    }
    int fd = open(paths[i], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        FUZZ_CHECK(w > 0);
        done += (size_t)w;
    }
    FUZZ_CHECK(close(fd) == 0);
    return paths[i];
}
