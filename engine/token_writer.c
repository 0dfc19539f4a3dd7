/* token_writer.c — streaming writer of token files (token_writer.h). */
#include "token_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "util.h"

#define STAGE_BYTES ((size_t)1 << 20)
#define HEADER_BYTES ((size_t)FSO_TOKENS_HEADER_INTS * 4)

fso_tokfile_kind fso_tokfile_pick(int32_t vocab_size, int flagged, int *elem_bytes)
{
    *elem_bytes = vocab_size <= FSO_TOKFILE_U16_VOCAB_MAX ? 2 : 4;
    if (flagged)
        return FSO_TOKFILE_FLAGGED;
    return *elem_bytes == 2 ? FSO_TOKFILE_V1 : FSO_TOKFILE_V7;
}

const char *fso_tokfile_name(fso_tokfile_kind kind, int elem_bytes)
{
    switch (kind) {
    case FSO_TOKFILE_V1:
        return "llm.c v1, uint16";
    case FSO_TOKFILE_V7:
        return "llm.c v7, uint32";
    case FSO_TOKFILE_FLAGGED:
        return elem_bytes == 2 ? "fsoff flagged, uint16" : "fsoff flagged, uint32";
    }
    return "?";
}

/* The fix for an error of errno e while writing path. */
static const char *write_fix(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        return "free space on that drive or write the output elsewhere";
    case EFBIG:
        return "the file is larger than this file system allows; write it elsewhere or split the "
               "input";
    case EACCES:
    case EPERM:
    case EROFS:
        return "write the output to a folder you may write to";
    case ENOENT:
    case ENOTDIR:
        return "create the folder first";
    default:
        return "check the drive, then run the command again";
    }
}

static int io_err(fso_token_writer *w, int rc, const char *what, char *err, size_t errlen)
{
    int e = -rc;
    fso_set_err(err, errlen, "%s: %s %s failed: %s; %s (nothing was written to %s)", w->path, what,
            w->tmp, strerror(e), write_fix(e), w->path);
    return rc;
}

/* An unnamed file in path's folder (O_TMPFILE), else a named one unlinked
 * at once: either way nothing remains of it after the process. */
static int open_flags_file(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
    if (fd < 0) {
        size_t len = strlen(path) + 64;
        char *name = malloc(len);
        if (!name) {
            free(copy);
            return -ENOMEM;
        }
        snprintf(name, len, "%s.flags.tmp.%ld", path, (long)getpid());
        fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            unlink(name);
        free(name);
    }
    int rc = fd < 0 ? -errno : fd;
    free(copy);
    return rc;
}

int fso_token_writer_open(fso_token_writer *w, const char *path, fso_tokfile_kind kind,
                          int elem_bytes, int32_t delimiter, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->fd = w->flags_fd = -1;
    FSO_BUG_ON(elem_bytes != 2 && elem_bytes != 4, "elem_bytes %d", elem_bytes);
    FSO_BUG_ON((kind == FSO_TOKFILE_V1 && elem_bytes != 2) ||
               (kind == FSO_TOKFILE_V7 && elem_bytes != 4), "kind %d with %d-byte tokens",
               (int)kind, elem_bytes);
    w->kind = kind;
    w->elem_bytes = elem_bytes;
    w->delimiter = delimiter;
    size_t tlen = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(tlen);
    w->stage = malloc(STAGE_BYTES);
    w->fstage = kind == FSO_TOKFILE_FLAGGED ? malloc(STAGE_BYTES) : NULL;
    if (!w->path || !w->tmp || !w->stage || (kind == FSO_TOKFILE_FLAGGED && !w->fstage)) {
        fso_token_writer_abort(w);
        fso_set_err(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    snprintf(w->tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        fso_set_err(err, errlen, "%s: cannot create %s: %s; %s", path, w->tmp, strerror(e),
                write_fix(e));
        fso_token_writer_abort(w);
        return -e;
    }
    if (kind == FSO_TOKFILE_FLAGGED) {
        w->flags_fd = open_flags_file(path);
        if (w->flags_fd < 0) {
            int rc = w->flags_fd;
            fso_set_err(err, errlen, "%s: cannot create a temporary file for its flags beside it: "
                        "%s; %s", path, strerror(-rc), write_fix(-rc));
            fso_token_writer_abort(w);
            return rc;
        }
    }
    /* room for the header, written at finish */
    static const unsigned char zeros[HEADER_BYTES];
    int rc = fso_write_full(w->fd, zeros, sizeof zeros);
    if (rc < 0) {
        io_err(w, rc, "writing", err, errlen);
        fso_token_writer_abort(w);
        return rc;
    }
    return 0;
}

static int flush_stage(fso_token_writer *w, char *err, size_t errlen)
{
    int rc;
    if (w->staged && (rc = fso_write_full(w->fd, w->stage, w->staged)) < 0)
        return io_err(w, rc, "writing", err, errlen);
    w->staged = 0;
    if (w->fstaged && (rc = fso_write_full(w->flags_fd, w->fstage, w->fstaged)) < 0) {
        int e = -rc;
        fso_set_err(err, errlen, "%s: writing its flags to a temporary file beside it failed: %s; "
                    "%s (nothing was written to %s)", w->path, strerror(e), write_fix(e), w->path);
        return rc;
    }
    w->fstaged = 0;
    return 0;
}

int fso_token_writer_add(fso_token_writer *w, const int32_t *ids, const uint8_t *flags, size_t n,
                         char *err, size_t errlen)
{
    const uint32_t max = w->elem_bytes == 2 ? 0xffffu : 0xffffffffu;
    FSO_BUG_ON(w->kind == FSO_TOKFILE_FLAGGED && n && !flags, "a flagged file needs flags");
    if (n > (uint64_t)INT32_MAX - w->n_tokens) {
        fso_set_err(err, errlen, "%s: more than %d tokens, the most a token file's header counts; "
                "split the input and tokenize each part into a file of its own", w->path,
                INT32_MAX);
        return -EOVERFLOW;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] > max) {
            fso_set_err(err, errlen, "%s: token %d does not fit a %d-byte token", w->path, ids[i],
                    w->elem_bytes);
            return -EINVAL;
        }
        if (w->staged + 4 > STAGE_BYTES || w->fstaged + 1 > STAGE_BYTES) {
            int rc = flush_stage(w, err, errlen);
            if (rc < 0)
                return rc;
        }
        uint32_t v = (uint32_t)ids[i];
        unsigned char *p = w->stage + w->staged;
        p[0] = (unsigned char)v;
        p[1] = (unsigned char)(v >> 8);
        if (w->elem_bytes == 4) {
            p[2] = (unsigned char)(v >> 16);
            p[3] = (unsigned char)(v >> 24);
        }
        w->staged += (size_t)w->elem_bytes;
        if (w->fstage)
            w->fstage[w->fstaged++] = flags[i];
    }
    w->n_tokens += n;
    return 0;
}

static void put_i32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

/* The flags file's bytes after the tokens. */
static int copy_flags(fso_token_writer *w, char *err, size_t errlen)
{
    if (lseek(w->flags_fd, 0, SEEK_SET) < 0)
        return io_err(w, -errno, "rewinding the flags for", err, errlen);
    uint64_t left = w->n_tokens;
    while (left) {
        size_t want = left < STAGE_BYTES ? (size_t)left : STAGE_BYTES;
        ssize_t got = fso_read_full(w->flags_fd, w->fstage, want);
        if (got < 0)
            return io_err(w, (int)got, "reading back the flags for", err, errlen);
        if ((size_t)got != want)
            return io_err(w, -EIO, "reading back the flags (short) for", err, errlen);
        int rc = fso_write_full(w->fd, w->fstage, want);
        if (rc < 0)
            return io_err(w, rc, "writing", err, errlen);
        left -= want;
    }
    return 0;
}

/* A zeroed w (path NULL) holds no file descriptors. */
static void writer_free(fso_token_writer *w)
{
    if (w->path && w->fd >= 0)
        close(w->fd);
    if (w->path && w->flags_fd >= 0)
        close(w->flags_fd);
    free(w->path);
    free(w->tmp);
    free(w->stage);
    free(w->fstage);
    memset(w, 0, sizeof *w);
    w->fd = w->flags_fd = -1;
}

int fso_token_writer_finish(fso_token_writer *w, char *err, size_t errlen)
{
    int rc = flush_stage(w, err, errlen);
    if (rc == 0 && w->kind == FSO_TOKFILE_FLAGGED)
        rc = copy_flags(w, err, errlen);
    if (rc == 0) {
        unsigned char h[HEADER_BYTES];
        memset(h, 0, sizeof h);
        switch (w->kind) {
        case FSO_TOKFILE_V1:
            put_i32(h, FSO_TOKENS_MAGIC);
            put_i32(h + 4, 1);
            break;
        case FSO_TOKFILE_V7:
            put_i32(h, FSO_TOKENS_MAGIC_LLAMA3);
            put_i32(h + 4, FSO_TOKENS_LLAMA3_VERSION);
            break;
        case FSO_TOKFILE_FLAGGED:
            put_i32(h, FSO_TOKENS_MAGIC_FLAGGED);
            put_i32(h + 4, FSO_TOKENS_FLAGGED_VERSION);
            put_i32(h + 16, w->elem_bytes);
            break;
        }
        put_i32(h + 8, (int32_t)w->n_tokens);
        put_i32(h + 12, w->delimiter >= 0 ? w->delimiter + 1 : 0);
        ssize_t put = pwrite(w->fd, h, sizeof h, 0);
        if (put != (ssize_t)sizeof h)
            rc = io_err(w, put < 0 ? -errno : -EIO, "writing the header of", err, errlen);
    }
    if (rc == 0 && fsync(w->fd) < 0)
        rc = io_err(w, -errno, "fsync of", err, errlen);
    if (rc == 0) {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) < 0)
            rc = io_err(w, -errno, "closing", err, errlen);
    }
    if (rc == 0 && rename(w->tmp, w->path) < 0) {
        int e = errno;
        fso_set_err(err, errlen, "%s: renaming %s to it failed: %s; %s", w->path, w->tmp,
                    strerror(e), write_fix(e));
        rc = -e;
    }
    if (rc < 0) {
        fso_token_writer_abort(w);
        return rc;
    }
    /* the rename made durable: fsync the folder (best effort: some file
     * systems refuse a directory fsync, and the file itself is complete) */
    char *copy = strdup(w->path);
    if (copy) {
        int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(copy);
    }
    writer_free(w);
    return 0;
}

void fso_token_writer_abort(fso_token_writer *w)
{
    if (w->tmp && w->path)
        unlink(w->tmp);
    writer_free(w);
}
