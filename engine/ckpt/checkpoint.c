/* checkpoint.c — writing checkpoints (checkpoint.h): the layout of
 * state.bin, the save directory (its lock, temporary folders, `latest`,
 * the checkpoints kept), and one save on its own thread: the state streamed
 * out by zero_save.c into state.bin, the manifest, then the fsyncs and
 * renames that make it complete. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "boxes.h"
#include "checkpoint_impl.h"
#include "config/config_json.h"
#include "crc32c.h"
#include "fso_build.h"
#include "model.h"
#include "store.h"
#include "util.h"

const char *const fso_ckpt_kind_names[FSO_ZERO_SAVED_KINDS] = {"master", "adam_m", "adam_v"};

#define PAGE_ELEMS (FSO_IO_PAGE / sizeof(float)) /* a page of fp32 */

/* ------------------------------------------------------------------ layout */

int fso_ckpt_layout_init(fso_ckpt_layout *l, const fso_model_config *mc)
{
    memset(l, 0, sizeof *l);
    l->n_blocks = fso_model_n_blocks(mc);
    fso_block_layout *bl = calloc((size_t)l->n_blocks, sizeof *bl);
    l->elems = calloc((size_t)l->n_blocks, sizeof *l->elems);
    l->off = calloc((size_t)l->n_blocks * FSO_ZERO_SAVED_KINDS, sizeof *l->off);
    if (!bl || !l->elems || !l->off) {
        free(bl);
        fso_ckpt_layout_free(l);
        return -ENOMEM;
    }
    fso_model_layout(bl, mc, 1);
    uint64_t at = 0;
    for (int b = 0; b < l->n_blocks; b++) {
        l->elems[b] = (bl[b].used_elems + PAGE_ELEMS - 1) / PAGE_ELEMS * PAGE_ELEMS;
        for (int i = 0; i < FSO_ZERO_SAVED_KINDS; i++) {
            l->off[(size_t)i * l->n_blocks + b] = at;
            at += sizeof(float) * l->elems[b];
        }
    }
    l->total_bytes = at;
    free(bl);
    return 0;
}

void fso_ckpt_layout_free(fso_ckpt_layout *l)
{
    free(l->elems);
    free(l->off);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------ files and folders */

int fso_ckpt_fsync_path(const char *path, bool dir)
{
    int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* Write all of buf to a new file dir/name (never through a symlink), fsync
 * it. 0 or negative errno. */
static int write_file(const char *path, const char *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = fso_write_full(fd, buf, len);
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

int fso_ckpt_remove_folder(const char *path)
{
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : -errno;
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return -e;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) { /* not something a save writes: leave it */
            rc = -ENOTEMPTY;
            continue;
        }
        if (unlinkat(dfd, de->d_name, 0) != 0 && rc == 0) /* a symlink goes, not its target */
            rc = -errno;
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0)
        rc = -errno;
    return rc;
}

/* "step-%08lld" with digits only after the dash: the step, else -1. */
int64_t fso_ckpt_step_of_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* ------------------------------------------------------------------ the saver */

typedef struct fso_ckpt_saver fso_ckpt_saver;
static int fso_ckpt_saver_create_here(fso_ckpt_saver **out, const char *dir, int keep,
                                      char *err, size_t errlen);

struct fso_ckpt_saver {
    char dir[4096];
    int keep;
    int box, boxes;           /* several boxes (boxes.h) save into one shared folder: each
                                 writes its ranges of state.bin, box 0 the rest */
    int lock_fd;
    int64_t last_step;
    fso_fault_spec faults;    /* tests: injected into the next saves' data file */
    bool inject;
    const char *pause;        /* tests: pause each save halfway (fso_pause_at) */
    /* the save in flight */
    pthread_t tid;
    bool running;
    int finished;             /* set by the thread as it ends (atomic) */
    fso_zero *z;
    json_t *manifest;         /* what was known at the start; the chunks come last */
    const fso_hf_extras *hf;  /* the run's carried files (meta->hf), NULL: none */
    fso_ckpt_layout layout;
    fso_ckpt_result res;
    double t0;
    double run_waited_ms;     /* the run's own time spent on this save */
    fso_zero_save_spec spec;  /* across boxes: what this box's saver wrote, until the commit */
};

static int fail(fso_ckpt_result *r, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(fso_ckpt_result *r, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fso_first_errorv(&r->rc, r->err, sizeof r->err, rc, fmt, ap);
    va_end(ap);
    return rc;
}

/* Leftovers of saves that were killed or failed: .tmp-* folders. */
static void remove_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4400];
        if (strncmp(de->d_name, ".tmp-", 5) != 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            fso_ckpt_remove_folder(p);
        else if (lstat(p, &st) == 0)
            unlink(p);
    }
    closedir(d);
}

/* Across boxes: box 0 prepared the folder (rc, its outcome) and every box
 * learns how that went; a box that cannot see the folder says so. 0 or
 * negative errno with err. */
static int boxes_agree_on_folder(int rc, const char *dir, char *err, size_t errlen)
{
    double v = rc < 0 ? 1 : 0;
    char berr[512] = "";
    int brc = fso_boxes_bcast("the save folder's preparation", &v, sizeof v, berr, sizeof berr);
    if (brc < 0) {
        snprintf(err, errlen, "%s", berr);
        return brc;
    }
    if (rc < 0)
        return rc;
    struct stat st;
    if (v != 0) {
        snprintf(err, errlen, "checkpoint.dir %s: box 0 could not prepare it (its error says "
                              "why)", dir);
        return -EIO;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "checkpoint.dir %s: box %d (host %s) does not see the folder box 0 "
                              "made; put it on a filesystem every box mounts",
                 dir, fso_boxes_self(), fso_boxes_host(fso_boxes_self()));
        return -ENOENT;
    }
    return 0;
}

int fso_ckpt_saver_create(fso_ckpt_saver **out, const char *dir, int keep, char *err,
                          size_t errlen)
{
    *out = NULL;
    const int box = fso_boxes_self(), boxes = fso_boxes_count();
    if (boxes > 1) { /* box 0 makes the folder and holds its lock for the run */
        int rc = box == 0 ? fso_ckpt_saver_create_here(out, dir, keep, err, errlen) : 0;
        if ((rc = boxes_agree_on_folder(rc, dir, err, errlen)) < 0) {
            fso_ckpt_saver_destroy(*out);
            *out = NULL;
            return rc;
        }
        if (box != 0 && !(*out = calloc(1, sizeof **out))) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        fso_ckpt_saver *sv = *out;
        if (box != 0) {
            snprintf(sv->dir, sizeof sv->dir, "%s", dir);
            sv->keep = keep > 0 ? keep : 1;
            sv->last_step = -1;
            sv->lock_fd = -1;
        }
        sv->box = box;
        sv->boxes = boxes;
        return 0;
    }
    return fso_ckpt_saver_create_here(out, dir, keep, err, errlen);
}

/* The saver of one box, or box 0's of several: the folder, its lock, and
 * no leftovers of killed saves. */
static int fso_ckpt_saver_create_here(fso_ckpt_saver **out, const char *dir, int keep,
                                      char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, 0755) != 0) {
            int e = errno;
            snprintf(err, errlen, "checkpoint.dir %s: cannot create the folder: %s; create it or "
                                  "give another --save folder", dir, strerror(e));
            return -e;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "checkpoint.dir %s: not a folder; --save takes a folder", dir);
        return -ENOTDIR;
    }
    fso_ckpt_saver *sv = calloc(1, sizeof *sv);
    if (!sv) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    snprintf(sv->dir, sizeof sv->dir, "%s", dir);
    sv->keep = keep > 0 ? keep : 1;
    sv->last_step = -1;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/.lock", dir);
    sv->lock_fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (sv->lock_fd < 0) {
        int e = errno;
        snprintf(err, errlen, "checkpoint.dir %s: cannot create files there: %s; fix its "
                              "permissions or give another --save folder", dir, strerror(e));
        free(sv);
        return -e;
    }
    if (flock(sv->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        snprintf(err, errlen, "checkpoint.dir %s: %s", dir,
                 e == EWOULDBLOCK ? "another fsoff is saving checkpoints there (it holds "
                                    ".lock); give another --save folder"
                                  : strerror(e));
        close(sv->lock_fd);
        free(sv);
        return -(e == EWOULDBLOCK ? EBUSY : e);
    }
    remove_temporaries(dir);
    *out = sv;
    return 0;
}

void fso_ckpt_saver_inject_faults(fso_ckpt_saver *sv, const fso_fault_spec *spec)
{
    sv->faults = *spec;
    sv->inject = true;
}

int64_t fso_ckpt_saver_last_step(const fso_ckpt_saver *sv)
{
    return sv->last_step;
}

/* The manifest's "hf": what an export carries (hf.h, fso_hf_extras): the
 * folder the run started from (null: from scratch), config.json's carried
 * fields, and the files saved beside state.bin with their sizes and CRCs. */
static json_t *hf_json(const fso_hf_extras *x)
{
    json_t *files = json_array();
    int bad = !files;
    for (int i = 0; x && i < x->n_files && !bad; i++)
        bad |= json_array_append_new(
            files, json_pack("{s:s, s:I, s:I}", "name", x->files[i].name, "bytes",
                             (json_int_t)x->files[i].bytes, "crc32c",
                             (json_int_t)fso_crc32c(0, x->files[i].data, x->files[i].bytes)));
    json_t *config = x && x->config ? json_deep_copy(x->config) : json_object();
    bool folder = x && x->origin == FSO_HF_EXTRAS_FOLDER;
    if (bad || !config) {
        json_decref(files);
        json_decref(config);
        return NULL;
    }
    return json_pack("{s:o, s:o, s:o}", "from", folder ? json_string(x->from) : json_null(),
                     "config", config, "files", files);
}

/* The manifest's parts known when the save starts. */
static json_t *manifest_begin(const fso_zero *z, const fso_ckpt_layout *l, const fso_ckpt_meta *m)
{
    const fso_config *cfg = m->cfg;
    const fso_model *model = fso_zero_model(z);
    json_t *tensors = json_array(), *blocks = json_array(), *kinds = json_array();
    json_t *config = fso_config_to_json(cfg);
    int bad = !tensors || !blocks || !kinds || !config;
    for (int b = 0; b < l->n_blocks && !bad; b++) {
        const fso_block_layout *bl = &model->blocks[b];
        bad |= json_array_append_new(blocks, json_pack("[I,I]", (json_int_t)l->off[b],
                                                        (json_int_t)(sizeof(float) *
                                                                     l->elems[b])));
        for (int t = 0; t < bl->n_tensors && !bad; t++) {
            const fso_tensor_desc *d = &bl->tensors[t];
            json_t *shape = d->cols == 1 ? json_pack("[i]", d->rows)
                                         : json_pack("[i,i]", d->rows, d->cols);
            bad |= json_array_append_new(
                tensors, json_pack("{s:s, s:o, s:i, s:I}", "name", d->name, "shape", shape,
                                   "block", b, "offset",
                                   (json_int_t)(l->off[b] + sizeof(float) * d->offset_elems)));
        }
    }
    for (int i = 0; i < FSO_ZERO_SAVED_KINDS && !bad; i++)
        bad |= json_array_append_new(kinds, json_string(fso_ckpt_kind_names[i]));
    char when[64] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *man = bad ? NULL : json_pack(
        "{s:s, s:i, s:s, s:s, s:I, s:{s:I, s:I, s:s}, s:{s:I, s:s}, "
        "s:{s:i, s:s, s:s, s:s}, s:o, s:{s:I, s:o, s:o, s:{s:I, s:o}}}",
        "format", FSO_CKPT_FORMAT, "version", FSO_CKPT_VERSION, "fsoff", FSO_VERSION,
        "saved_at", when, "step", (json_int_t)fso_zero_steps(z),
        "data", "position", (json_int_t)m->data_position, "tokens", (json_int_t)m->data_tokens,
        "path", cfg->data.path,
        /* fsoff draws random numbers only to initialise the parameters, from
         * the seed; training reads the data in order and has no dropout */
        "rng", "parameter_seed", (json_int_t)cfg->seed, "draws_after_init", "none",
        "run", "devices", cfg->world, "backend", fso_backend_row_of(cfg->backend)->name, "parameters",
        fso_tier_name(cfg->offload.param_tier), "optimizer_state",
        fso_tier_name(cfg->offload.optim_tier),
        "config", config,
        "model", "params", (json_int_t)model->n_params, "blocks", blocks, "tensors", tensors,
        FSO_CKPT_DATA, "bytes", (json_int_t)l->total_bytes, "kinds", kinds);
    /* the per-block placement at the save (state.h fso_block_rule): the
     * configuration's, or a re-plan's since; shards are saved in one format
     * whatever their tier, so any other placement resumes from them */
    const fso_block_rule *rule = fso_zero_block_rule(z);
    json_t *run = man ? json_object_get(man, "run") : NULL;
    if (run && (json_object_set_new(run, "resident_blocks",
                                    json_integer(rule->resident_blocks > 0 ? rule->resident_blocks
                                                                           : 0)) < 0 ||
                json_object_set_new(run, "device_state_blocks",
                                    json_integer(rule->device_state_blocks > 0
                                                     ? rule->device_state_blocks
                                                     : 0)) < 0 ||
                json_object_set_new(run, "device_state_from",
                                    json_string(fso_config_choice_name(
                                        fso_config_state_from_choices, rule->device_state_first))) <
                    0)) {
        json_decref(man);
        return NULL;
    }
    /* a run resumed from a checkpoint of an earlier fsoff still knows nothing */
    if (man && !(m->hf && m->hf->origin == FSO_HF_EXTRAS_UNRECORDED) &&
        json_object_set_new(man, "hf", hf_json(m->hf)) < 0) {
        json_decref(man);
        return NULL;
    }
    if (!man) {
        if (bad) {
            json_decref(tensors);
            json_decref(blocks);
            json_decref(kinds);
            json_decref(config);
        }
        return NULL;
    }
    return man;
}

void fso_pause_at(const char *file)
{
    int fd = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
    struct timespec ts = {0, 10 * 1000 * 1000};
    while (access(file, F_OK) == 0)
        nanosleep(&ts, NULL);
}

void fso_ckpt_saver_pause_halfway(fso_ckpt_saver *sv, const char *file)
{
    sv->pause = file;
}

/* The saver's hook after each block of a save: halfway, the test's pause. */
static void pause_halfway(void *ctx, int done, int n_blocks)
{
    const fso_ckpt_saver *sv = ctx;
    if (sv->pause && done == (n_blocks + 1) / 2)
        fso_pause_at(sv->pause);
}

/* state.bin: the state streamed out of z. */
static int write_state(fso_ckpt_saver *sv, const char *tmp, fso_zero_save_spec *spec)
{
    fso_ckpt_result *r = &sv->res;
    fso_store_opts so = {0};
    char serr[FSO_STORE_ERR_MAX];
    so.dirs[0] = tmp;
    so.ndirs = 1;
    so.file_name = FSO_CKPT_DATA;
    so.keep_files = true;
    so.existing = sv->boxes > 1; /* box 0 made it before any box began (save_begin) */
    so.capacity_bytes = sv->layout.total_bytes;
    so.block_bytes = FSO_ZERO_SAVE_PIECE_BYTES;
    so.queue_depth = 32;
    so.direct = true;
    fso_store *out = NULL;
    int rc = fso_store_open_uring(&out, &so, serr, sizeof serr);
    if (rc == -ENOSPC) {
        struct statvfs v;
        char need[32], have[32] = "unknown";
        fso_human_bytes(need, sizeof need, (double)sv->layout.total_bytes);
        if (statvfs(tmp, &v) == 0)
            fso_human_bytes(have, sizeof have, (double)v.f_bavail * (double)v.f_frsize);
        return fail(r, rc, "%s: not enough space for the checkpoint's %s (%s free); free some "
                           "space or give another --save folder", sv->dir, need, have);
    }
    if (rc < 0)
        return fail(r, rc, "%s", serr);
    if (sv->inject) {
        fso_store *wrapped;
        if (fso_store_wrap_faults(&wrapped, out, &sv->faults) == 0)
            out = wrapped;
    }
    spec->out = out;
    spec->block_off = sv->layout.off;
    spec->block_elems = sv->layout.elems;
    spec->piece_bytes = FSO_ZERO_SAVE_PIECE_BYTES;
    spec->reflink = true;
    spec->after_block = pause_halfway;
    spec->ctx = sv;
    rc = fso_zero_save_stream(sv->z, spec);
    fso_store_destroy(out);
    if (rc < 0)
        return fail(r, rc, "writing %s/%s: %s (%s)", tmp, FSO_CKPT_DATA, strerror(-rc),
                    spec->err);
    return 0;
}

/* state.bin at its exact size (the store preallocated whole stripes), on
 * the drive. */
static int finish_data(const char *path, uint64_t bytes)
{
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = ftruncate(fd, (off_t)bytes) == 0 && fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* The carried files (sv->hf) beside state.bin, as the manifest lists them. */
static int write_carried(fso_ckpt_saver *sv, const char *tmp, uint64_t *bytes)
{
    for (int i = 0; sv->hf && i < sv->hf->n_files; i++) {
        const fso_hf_file *f = &sv->hf->files[i];
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", tmp, f->name);
        int rc = write_file(path, f->data, f->bytes);
        if (rc < 0)
            return fail(&sv->res, rc, "%s: %s", path, strerror(-rc));
        *bytes += f->bytes;
    }
    return 0;
}

/* manifest.json: the parts known at the start, and the chunks. */
static int write_manifest(fso_ckpt_saver *sv, const char *tmp, const fso_zero_save_spec *spec,
                          uint64_t *bytes)
{
    json_t *chunks = json_array();
    int bad = !chunks;
    for (size_t i = 0; i < spec->n_pieces && !bad; i++)
        bad |= json_array_append_new(chunks, json_pack("[I,I,I]", (json_int_t)spec->pieces[i].off,
                                                       (json_int_t)spec->pieces[i].bytes,
                                                       (json_int_t)spec->pieces[i].crc32c));
    if (bad || json_object_set_new(sv->manifest, "chunks", chunks) != 0)
        return fail(&sv->res, -ENOMEM, "out of memory writing the manifest");
    char *text = json_dumps(sv->manifest, JSON_INDENT(1) | JSON_COMPACT);
    if (!text)
        return fail(&sv->res, -ENOMEM, "out of memory writing the manifest");
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", tmp, FSO_CKPT_MANIFEST);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room: the terminator becomes the newline */
    int rc = write_file(path, text, len + 1);
    free(text);
    *bytes += len + 1;
    return rc < 0 ? fail(&sv->res, rc, "%s: %s", path, strerror(-rc)) : 0;
}

/* tmp becomes dir/step-N; one already there (an earlier run saved step N)
 * is replaced in one step. */
static int publish(fso_ckpt_saver *sv, const char *tmp, const char *final)
{
    int rc = 0;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) == 0)
        return fso_ckpt_fsync_path(sv->dir, true);
    if (errno != EEXIST && errno != EINVAL)
        return -errno;
    if (errno == EEXIST && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        rc = fso_ckpt_fsync_path(sv->dir, true);
        fso_ckpt_remove_folder(tmp); /* the older one, now under the temporary name */
        return rc;
    }
    /* no renameat2 here: move the old one aside first */
    char old[4400];
    snprintf(old, sizeof old, "%s.old", tmp);
    struct stat st;
    if (lstat(final, &st) == 0 && rename(final, old) != 0)
        return -errno;
    if (rename(tmp, final) != 0)
        return -errno;
    rc = fso_ckpt_fsync_path(sv->dir, true);
    fso_ckpt_remove_folder(old);
    return rc;
}

static int write_latest(fso_ckpt_saver *sv, const char *name)
{
    char tmp[4200], latest[4200], line[64];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", sv->dir, FSO_CKPT_LATEST);
    snprintf(latest, sizeof latest, "%s/%s", sv->dir, FSO_CKPT_LATEST);
    int len = snprintf(line, sizeof line, "%s\n", name);
    int rc = write_file(tmp, line, (size_t)len);
    if (rc == 0 && rename(tmp, latest) != 0)
        rc = -errno;
    if (rc == 0)
        rc = fso_ckpt_fsync_path(sv->dir, true);
    return rc;
}

typedef struct found {
    int64_t step;
    char name[64];
} found;

static int by_step(const void *a, const void *b)
{
    int64_t x = ((const found *)a)->step, y = ((const found *)b)->step;
    return (x > y) - (x < y);
}

/* Complete checkpoints beyond `keep`, oldest step first, except `newest`:
 * renamed to a temporary name (no longer a checkpoint), then removed. */
static void prune(fso_ckpt_saver *sv, int64_t newest)
{
    DIR *d = opendir(sv->dir);
    if (!d)
        return;
    found *f = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t step = fso_ckpt_step_of_name(de->d_name);
        char p[4400];
        struct stat st;
        if (step < 0 || step == newest || strlen(de->d_name) >= sizeof f->name)
            continue;
        snprintf(p, sizeof p, "%s/%s", sv->dir, de->d_name);
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode)) /* a symlink is not ours to delete */
            continue;
        snprintf(p, sizeof p, "%s/%s/%s", sv->dir, de->d_name, FSO_CKPT_MANIFEST);
        if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            found *g = realloc(f, cap * sizeof *f);
            if (!g)
                break;
            f = g;
        }
        f[n].step = step;
        memcpy(f[n].name, de->d_name, strlen(de->d_name) + 1); /* shorter than name: above */
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(f, n, sizeof *f, by_step);
    /* the newest counts as one of the kept */
    for (size_t i = 0; i + (size_t)sv->keep - 1 < n; i++) {
        char from[4400], to[4400];
        snprintf(from, sizeof from, "%s/%s", sv->dir, f[i].name);
        snprintf(to, sizeof to, "%s/.tmp-delete-%s", sv->dir, f[i].name);
        if (rename(from, to) == 0) {
            int rc = fso_ckpt_remove_folder(to);
            if (rc < 0)
                fprintf(stderr, "fsoff: warning: checkpoint %s: could not remove it all (%s); "
                                "what is left is in %s\n", from, strerror(-rc), to);
        }
    }
    free(f);
}

/* The temporary folder tmp, its state.bin on the drive, made a checkpoint:
 * the carried files and the manifest (spec's pieces) beside state.bin, the
 * folder on the drive, renamed to final and named in `latest`, and the
 * checkpoints beyond checkpoint.keep pruned. *bytes grows by what was
 * written. 0, or negative errno with sv->res's err. */
static int complete(fso_ckpt_saver *sv, const char *tmp, const char *name, const char *final,
                    const fso_zero_save_spec *spec, uint64_t *bytes)
{
    fso_ckpt_result *r = &sv->res;
    int rc = write_carried(sv, tmp, bytes);
    if (rc == 0)
        rc = write_manifest(sv, tmp, spec, bytes);
    if (rc == 0 && (rc = fso_ckpt_fsync_path(tmp, true)) < 0)
        fail(r, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0 && (rc = publish(sv, tmp, final)) < 0)
        fail(r, rc, "renaming %s to %s: %s", tmp, final, strerror(-rc));
    if (rc == 0 && (rc = write_latest(sv, name)) < 0)
        fail(r, rc, "%s/%s: %s", sv->dir, FSO_CKPT_LATEST, strerror(-rc));
    if (rc == 0)
        prune(sv, r->step);
    return rc;
}

static void save_names(const fso_ckpt_saver *sv, char *name, char *tmp, char *final)
{
    snprintf(name, 64, "step-%08lld", (long long)sv->res.step);
    snprintf(tmp, 4200, "%s/.tmp-%s", sv->dir, name);
    snprintf(final, 4200, "%s/%s", sv->dir, name);
}

/* The pieces box k of several wrote, beside state.bin until the commit. */
static void pieces_path(const char *tmp, int box, char *path, size_t len)
{
    snprintf(path, len, "%s/.pieces-box%d", tmp, box);
}

/* Across boxes, on each box's saver thread: its ranges of state.bin (its
 * slices of the optimizer's state) into the file box 0 made, on the drive,
 * and the list of their pieces beside it (box 0 keeps its own in memory).
 * Box 0 commits once every box is done (commit_boxes, on the main thread). */
static void save_ranges(fso_ckpt_saver *sv)
{
    fso_ckpt_result *r = &sv->res;
    char name[64], tmp[4200], final[4200], path[4400];
    save_names(sv, name, tmp, final);
    int rc = write_state(sv, tmp, &sv->spec);
    fso_zero_save_disarm(sv->z);
    snprintf(path, sizeof path, "%s/%s", tmp, FSO_CKPT_DATA);
    if (rc == 0 && (rc = finish_data(path, sv->layout.total_bytes)) < 0)
        fail(r, rc, "%s: %s", path, strerror(-rc));
    if (rc == 0 && sv->box != 0) {
        pieces_path(tmp, sv->box, path, sizeof path);
        if ((rc = write_file(path, (const char *)sv->spec.pieces,
                             sizeof *sv->spec.pieces * sv->spec.n_pieces)) < 0)
            fail(r, rc, "%s: %s", path, strerror(-rc));
    }
    r->bytes = sv->spec.bytes;
    r->cloned_bytes = sv->spec.cloned_bytes;
}

static void *save_main(void *arg)
{
    fso_ckpt_saver *sv = arg;
    fso_ckpt_result *r = &sv->res;
    if (sv->boxes > 1) {
        save_ranges(sv);
        __atomic_store_n(&sv->finished, 1, __ATOMIC_RELEASE);
        return NULL;
    }
    fso_zero_save_spec spec = {0};
    char name[64], tmp[4200], final[4200];
    save_names(sv, name, tmp, final);
    uint64_t bytes = sv->layout.total_bytes;
    int rc = fso_ckpt_remove_folder(tmp);
    if (rc == 0 && mkdir(tmp, 0755) != 0)
        rc = -errno;
    if (rc < 0)
        fail(r, rc, "%s: cannot create the checkpoint's folder: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = write_state(sv, tmp, &spec);
    fso_zero_save_disarm(sv->z); /* training goes on without waiting, whatever happened */
    char data[4400];
    snprintf(data, sizeof data, "%s/%s", tmp, FSO_CKPT_DATA);
    if (rc == 0 && (rc = finish_data(data, sv->layout.total_bytes)) < 0)
        fail(r, rc, "%s: %s", data, strerror(-rc));
    if (rc == 0)
        rc = complete(sv, tmp, name, final, &spec, &bytes);
    if (rc == 0) {
        snprintf(r->path, sizeof r->path, "%s", final);
        r->bytes = bytes;
        r->cloned_bytes = spec.cloned_bytes;
        sv->last_step = r->step;
    } else {
        fso_ckpt_remove_folder(tmp);
        snprintf(r->path, sizeof r->path, "%s", sv->dir);
    }
    free(spec.pieces);
    r->seconds = (fso_now_ms() - sv->t0) / 1e3;
    __atomic_store_n(&sv->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Across boxes, before any box's saver starts: box 0 makes the
 * checkpoint's temporary folder and its state.bin at full size, and every
 * box learns that it did. 0 or negative errno with err. */
static int boxes_prepare(fso_ckpt_saver *sv, char *err, size_t errlen)
{
    char name[64], tmp[4200], final[4200], path[4400];
    save_names(sv, name, tmp, final);
    int rc = 0;
    if (sv->box == 0) {
        rc = fso_ckpt_remove_folder(tmp);
        if (rc == 0 && mkdir(tmp, 0755) != 0)
            rc = -errno;
        snprintf(path, sizeof path, "%s/%s", tmp, FSO_CKPT_DATA);
        int fd = rc == 0 ? open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)
                         : -1;
        if (rc == 0 && fd < 0)
            rc = -errno;
        if (fd >= 0 && ftruncate(fd, (off_t)sv->layout.total_bytes) != 0)
            rc = -errno;
        if (fd >= 0)
            close(fd);
        if (rc < 0)
            snprintf(err, errlen, "%s: cannot create the checkpoint's folder and data file: %s",
                     tmp, strerror(-rc));
    }
    return boxes_agree_on_folder(rc, tmp, err, errlen);
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const fso_zero_save_piece *)a)->off, y = ((const fso_zero_save_piece *)b)->off;
    return (x > y) - (x < y);
}

/* Across boxes, on the main thread of every box at once, when every box's
 * ranges are on the drive: box 0 gathers every box's pieces (their files
 * beside state.bin), writes the manifest and the carried files, publishes
 * the folder and names it in `latest`; every box learns the outcome into
 * sv->res. failed: boxes whose own part failed. */
static void commit_boxes(fso_ckpt_saver *sv, int failed)
{
    fso_ckpt_result *r = &sv->res;
    char name[64], tmp[4200], final[4200], path[4400];
    save_names(sv, name, tmp, final);
    int rc = 0;
    if (sv->box == 0 && failed && r->rc == 0)
        rc = fail(r, -EIO, "%d of the %d boxes could not write their part (their errors say "
                  "why)", failed, sv->boxes);
    fso_zero_save_spec *spec = &sv->spec;
    for (int k = 1; sv->box == 0 && k < sv->boxes && rc == 0 && r->rc == 0; k++) {
        size_t len;
        pieces_path(tmp, k, path, sizeof path);
        FILE *f = fopen(path, "rb");
        void *more = NULL;
        if (f && fseek(f, 0, SEEK_END) == 0 && (len = (size_t)ftell(f)) % sizeof *spec->pieces == 0 &&
            fseek(f, 0, SEEK_SET) == 0 &&
            (more = realloc(spec->pieces, sizeof *spec->pieces * spec->n_pieces + len)) &&
            fread((char *)more + sizeof *spec->pieces * spec->n_pieces, 1, len, f) == len) {
            spec->pieces = more;
            spec->n_pieces += len / sizeof *spec->pieces;
        } else {
            if (more)
                spec->pieces = more;
            rc = fail(r, -EIO, "%s: box %d's pieces cannot be read: %s", path, k,
                      f ? "short or malformed" : strerror(errno));
        }
        if (f)
            fclose(f);
        unlink(path);
    }
    if (sv->box == 0 && rc == 0 && r->rc == 0) {
        /* the manifest's chunks tile the file in order (a large model's
         * are many thousands: sorted, not inserted one by one) */
        qsort(spec->pieces, spec->n_pieces, sizeof *spec->pieces, by_offset);
        uint64_t bytes = sv->layout.total_bytes;
        if ((rc = complete(sv, tmp, name, final, spec, &bytes)) == 0)
            r->bytes = bytes;
    }
    if (sv->box == 0 && (rc < 0 || r->rc < 0))
        fso_ckpt_remove_folder(tmp);
    /* every box: box 0's outcome */
    double v = r->rc < 0 ? 1 : 0;
    char berr[512];
    if (fso_boxes_bcast("the checkpoint's commit", &v, sizeof v, berr, sizeof berr) < 0 &&
        r->rc == 0)
        fail(r, -EIO, "%s", berr);
    else if (v != 0 && r->rc == 0)
        fail(r, -EIO, "box 0 could not complete the checkpoint (its error says why)");
    if (r->rc == 0) {
        snprintf(r->path, sizeof r->path, "%s", final);
        sv->last_step = r->step;
    } else {
        snprintf(r->path, sizeof r->path, "%s", sv->dir);
    }
    free(spec->pieces);
    memset(spec, 0, sizeof *spec);
    r->seconds = (fso_now_ms() - sv->t0) / 1e3;
}

int fso_ckpt_save_begin(fso_ckpt_saver *sv, fso_zero *z, const fso_ckpt_meta *meta, char *err,
                        size_t errlen)
{
    double t0 = fso_now_ms();
    fso_ckpt_result prev;
    if (sv->running && fso_ckpt_save_poll(sv, true, &prev) == 1 && prev.rc < 0)
        fprintf(stderr, "fsoff: error: checkpoint of step %lld: %s\n", (long long)prev.step,
                prev.err);
    fso_ckpt_layout_free(&sv->layout);
    json_decref(sv->manifest);
    sv->manifest = NULL;
    memset(&sv->res, 0, sizeof sv->res);
    sv->res.step = fso_zero_steps(z);
    sv->z = z;
    sv->hf = meta->hf;
    int rc = fso_ckpt_layout_init(&sv->layout, &fso_zero_model(z)->mc);
    if (rc == 0 && !(sv->manifest = manifest_begin(z, &sv->layout, meta)))
        rc = -ENOMEM;
    if (rc < 0) {
        snprintf(err, errlen, "out of memory starting a checkpoint");
        return rc;
    }
    if (sv->boxes > 1 && (rc = boxes_prepare(sv, err, errlen)) < 0)
        return rc;
    if ((rc = fso_zero_save_arm(z)) < 0) {
        snprintf(err, errlen, "a save is already streaming");
        return rc;
    }
    sv->t0 = t0;
    sv->finished = 0;
    if ((rc = pthread_create(&sv->tid, NULL, save_main, sv)) != 0) {
        fso_zero_save_disarm(z);
        snprintf(err, errlen, "cannot start the saver's thread: %s", strerror(rc));
        return -rc;
    }
    sv->running = true;
    sv->run_waited_ms = fso_now_ms() - t0;
    return 0;
}

int fso_ckpt_save_poll(fso_ckpt_saver *sv, bool wait, fso_ckpt_result *res)
{
    if (!sv || !sv->running)
        return 0;
    double t0 = fso_now_ms();
    if (sv->boxes > 1) { /* every box polls at the same points: done when all are */
        double v[2] = {__atomic_load_n(&sv->finished, __ATOMIC_ACQUIRE) ? 1 : 0, 0};
        char berr[512];
        if (!wait && fso_boxes_sum("the checkpoint's progress", v, 1, berr, sizeof berr) == 0 &&
            v[0] < sv->boxes)
            return 0;
        pthread_join(sv->tid, NULL);
        v[1] = sv->res.rc < 0 ? 1 : 0;
        if (fso_boxes_sum("the checkpoint's outcome", &v[1], 1, berr, sizeof berr) < 0)
            fail(&sv->res, -EIO, "%s", berr);
        commit_boxes(sv, (int)v[1]);
    } else {
        if (!wait && !__atomic_load_n(&sv->finished, __ATOMIC_ACQUIRE))
            return 0;
        pthread_join(sv->tid, NULL);
    }
    sv->running = false;
    sv->run_waited_ms += fso_now_ms() - t0;
    *res = sv->res;
    res->exposed_ms = sv->run_waited_ms + fso_zero_save_waited_ms(sv->z);
    return 1;
}

void fso_ckpt_saver_destroy(fso_ckpt_saver *sv)
{
    if (!sv)
        return;
    fso_ckpt_result r;
    fso_ckpt_save_poll(sv, true, &r);
    fso_ckpt_layout_free(&sv->layout);
    json_decref(sv->manifest);
    if (sv->lock_fd >= 0)
        close(sv->lock_fd);
    free(sv->spec.pieces);
    free(sv);
}
