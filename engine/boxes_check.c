/* boxes_check.c — the checks that every box of a run runs the same thing
 * (boxes.h): the same build, the same files, and a folder every box sees.
 * fso_boxes_check_bytes, which these build on, is boxes.c's agreement with
 * its line-by-line message. Each check gives every box the same answer, so
 * every box refuses together and none waits for one that left.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "boxes.h"
#include "fso_build.h"

#define WHOLE_FILE_MAX ((uint64_t)64 << 20)
#define END_BYTES ((uint64_t)16 << 20)

/* Hash `len` bytes of fd from `off` into h; 0 or negative errno. */
static int hash_range(int fd, uint64_t off, uint64_t len, uint64_t h[2])
{
    static char buf[1 << 20];
    while (len) {
        size_t n = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t got = pread(fd, buf, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -errno;
        if (got == 0)
            return -EIO;
        fso_boxes_hash(buf, (size_t)got, h);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return 0;
}

/* What a box says of a file: its size and hash, or why it cannot read it. */
struct file_digest {
    uint64_t size;
    uint64_t h[2];
    int32_t err; /* errno, 0 when read */
    int32_t pad;
};

static struct file_digest digest_file(const char *path)
{
    struct file_digest d = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        d.err = errno;
        if (fd >= 0)
            close(fd);
        return d;
    }
    d.size = (uint64_t)st.st_size;
    int rc;
    if (d.size <= WHOLE_FILE_MAX) {
        rc = hash_range(fd, 0, d.size, d.h);
    } else {
        /* a big file: its ends, its size and its mtime (a copy keeps mtime
         * with cp -p or rsync -t; one rewritten on one box shows) */
        rc = hash_range(fd, 0, END_BYTES, d.h);
        if (!rc)
            rc = hash_range(fd, d.size - END_BYTES, END_BYTES, d.h);
        int64_t mt = (int64_t)st.st_mtime;
        fso_boxes_hash(&mt, sizeof mt, d.h);
    }
    if (rc)
        d.err = -rc;
    close(fd);
    return d;
}

/* The box fso_boxes_agree's message names ("... differs between boxes:
 * box 1 (host h) ..."). */
static int differing_box(const char *why)
{
    const char *at = strstr(why, "differs between boxes: box ");
    return at ? atoi(at + strlen("differs between boxes: box ")) : 1;
}

int fso_boxes_check_build(char *err, size_t errlen)
{
    if (fso_boxes_count() == 1)
        return 0;
    struct file_digest d = digest_file("/proc/self/exe");
    fso_boxes_hash(FSO_VERSION, sizeof FSO_VERSION, d.h);
    char mine[96] = "";
    snprintf(mine, sizeof mine, "%s %d %016" PRIx64 "%016" PRIx64, FSO_VERSION, (int)d.err,
             d.h[0], d.h[1]);
    char why[512];
    int rc = fso_boxes_agree("the fsoff build", mine, sizeof mine, why, sizeof why);
    if (rc == -EINVAL) {
        int box = differing_box(why);
        snprintf(err, errlen, "box %d (host %s) runs a different fsoff build than box 0 "
                 "(host %s): copy the same build to every box", box, fso_boxes_host(box),
                 fso_boxes_host(0));
        return rc;
    }
    if (rc)
        snprintf(err, errlen, "%s", why);
    return rc;
}

int fso_boxes_check_file(const char *what, const char *path, char *err, size_t errlen)
{
    if (fso_boxes_count() == 1)
        return 0;
    struct file_digest d = digest_file(path);
    /* first: can every box read it (each box's errno, summed in order) */
    const int B = fso_boxes_count();
    double *errs = calloc((size_t)B, sizeof *errs);
    if (!errs) {
        snprintf(err, errlen, "%s %s: out of host memory", what, path);
        return -ENOMEM;
    }
    errs[fso_boxes_self()] = d.err;
    int rc = fso_boxes_sum(what, errs, B, err, errlen);
    for (int k = 0; k < B && !rc; k++)
        if (errs[k] != 0) {
            snprintf(err, errlen, "%s %s cannot be read on box %d (host %s): %s; every box needs "
                     "the same file at the same path", what, path, k, fso_boxes_host(k),
                     strerror((int)errs[k]));
            rc = -ENOENT;
        }
    free(errs);
    if (rc)
        return rc;
    char why[512];
    rc = fso_boxes_agree(what, &d, sizeof d, why, sizeof why);
    if (rc == -EINVAL) {
        int box = differing_box(why);
        snprintf(err, errlen, "%s %s differs between boxes: box %d (host %s) has another file "
                 "than box 0 (host %s); copy the same file to every box", what, path, box,
                 fso_boxes_host(box), fso_boxes_host(0));
    } else if (rc) {
        snprintf(err, errlen, "%s", why);
    }
    return rc;
}

int fso_boxes_check_shared_dir(const char *dir, char *err, size_t errlen)
{
    if (fso_boxes_count() == 1)
        return 0;
    const int B = fso_boxes_count(), self = fso_boxes_self();
    /* box 0's token: 128 random bits and its host, and whether it could
     * write it (status) */
    struct {
        char text[160];
        char name[48];
        int32_t status;
    } tok;
    memset(&tok, 0, sizeof tok);
    char path[4096];
    if (self == 0) {
        uint64_t r[2] = {0, 0};
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
            r[0] = (uint64_t)getpid() ^ (uint64_t)time(NULL);
            r[1] = (uint64_t)clock();
        }
        snprintf(tok.name, sizeof tok.name, ".fsoff-shared-%016" PRIx64 "%016" PRIx64, r[0],
                 r[1]);
        snprintf(tok.text, sizeof tok.text, "%016" PRIx64 "%016" PRIx64 " %s\n", r[0], r[1],
                 fso_boxes_host(0));
        snprintf(path, sizeof path, "%s/%s", dir, tok.name);
        FILE *f = fopen(path, "w");
        if (!f || fputs(tok.text, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0)
            tok.status = errno ? errno : EIO;
        if (f)
            fclose(f);
    }
    int rc = fso_boxes_bcast("the shared-folder check", &tok, sizeof tok, err, errlen);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/%s", dir, tok.name);
    if (tok.status) {
        if (self == 0)
            unlink(path);
        snprintf(err, errlen, "checkpoint.dir %s: box 0 (host %s) cannot write there: %s", dir,
                 fso_boxes_host(0), strerror(tok.status));
        return -tok.status;
    }
    double *seen = calloc((size_t)B, sizeof *seen);
    if (!seen) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    if (self != 0) {
        char got[sizeof tok.text] = "";
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
        if (f)
            fclose(f);
        seen[self] = (n == strlen(tok.text) && memcmp(got, tok.text, n) == 0) ? 0 : 1;
    }
    rc = fso_boxes_sum("the shared-folder check", seen, B, err, errlen);
    if (self == 0)
        unlink(path);
    for (int k = 1; k < B && !rc; k++)
        if (seen[k] != 0) {
            snprintf(err, errlen, "checkpoint.dir %s is not shared: box %d (host %s) does not "
                     "see box 0's files there; put it on a filesystem every box mounts", dir, k,
                     fso_boxes_host(k));
            rc = -EXDEV;
        }
    free(seen);
    return rc;
}
