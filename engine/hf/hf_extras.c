/* hf_extras.c — what an exported folder carries from the Hugging Face folder
 * a run started from (hf.h, fso_hf_extras): config.json's fields fsoff does
 * not model (the token ids among them), and the tokenizer's and generation
 * config's files, read whole into memory when the run starts so that every
 * checkpoint and export of the run has them even if the folder changes. */
#include "hf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

const char *const fso_hf_carried_files[FSO_HF_CARRIED_FILES + 1] = {
    "generation_config.json", "tokenizer.json",  "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "chat_template.jinja",
    NULL,
};

/* The files a Llama folder is expected to have: named when missing. Either
 * of tokenizer.json and tokenizer.model is a tokenizer. */
static bool expected(const fso_hf_extras *x, const char *name)
{
    if (strcmp(name, "tokenizer.model") == 0 || strcmp(name, "chat_template.jinja") == 0)
        return false;
    if (strcmp(name, "tokenizer.json") == 0)
        return !fso_hf_extras_file(x, "tokenizer.model");
    return true;
}

void fso_hf_extras_free(fso_hf_extras *x)
{
    json_decref(x->config);
    for (int i = 0; i < x->n_files; i++)
        free(x->files[i].data);
    memset(x, 0, sizeof *x);
}

const fso_hf_file *fso_hf_extras_file(const fso_hf_extras *x, const char *name)
{
    for (int i = 0; i < x->n_files; i++)
        if (strcmp(x->files[i].name, name) == 0)
            return &x->files[i];
    return NULL;
}

/* path whole into *data (absent: 0 with *data NULL). */
static int read_small(const char *path, void **data, size_t *bytes, char *err, size_t errlen)
{
    *data = NULL;
    *bytes = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return 0;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > FSO_HF_CARRIED_MAX_BYTES) {
        char size[32];
        fso_human_bytes(size, sizeof size, (double)st.st_size);
        if (S_ISREG(st.st_mode))
            snprintf(err, errlen, "%s: %s, more than the %zu MiB a tokenizer or generation file "
                                  "may have; this is not the file transformers writes, so "
                                  "remove or rename it", path, size,
                     FSO_HF_CARRIED_MAX_BYTES >> 20);
        else
            snprintf(err, errlen, "%s: not a regular file; remove or rename it", path);
        close(fd);
        return -EFBIG;
    }
    const size_t want = (size_t)st.st_size;
    char *buf = malloc(want + 1);
    ssize_t got = buf ? fso_read_full(fd, buf, want) : -ENOMEM;
    int rc = got < 0 ? (int)got : (size_t)got < want ? -EIO : 0; /* shrank while read */
    const size_t done = got > 0 ? (size_t)got : 0;
    close(fd);
    if (rc < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(-rc));
        free(buf);
        return rc;
    }
    buf[done] = '\0';
    *data = buf;
    *bytes = done;
    return 0;
}

/* config.json's keys fso_hf_config_write does not write itself. */
static int read_carried_config(fso_hf_extras *x, const char *dir, char *err, size_t errlen)
{
    char path[4200];
    json_error_t je;
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *hf = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(hf)) {
        snprintf(err, errlen, "%s: %s", path, hf ? "expected a JSON object (LlamaConfig)"
                                                 : je.text);
        json_decref(hf);
        return -EINVAL;
    }
    const char *key;
    json_t *v;
    if (!(x->config = json_object())) {
        json_decref(hf);
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    json_object_foreach(hf, key, v) {
        if (!fso_hf_config_writes_key(key) && json_object_set(x->config, key, v) < 0) {
            json_decref(hf);
            snprintf(err, errlen, "%s: out of memory", path);
            return -ENOMEM;
        }
    }
    json_decref(hf);
    return 0;
}

int fso_hf_extras_read(fso_hf_extras *x, const char *dir, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    x->origin = FSO_HF_EXTRAS_FOLDER;
    snprintf(x->from, sizeof x->from, "%s", dir);
    int rc = read_carried_config(x, dir, err, errlen);
    for (int i = 0; rc == 0 && fso_hf_carried_files[i]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, fso_hf_carried_files[i]);
        fso_hf_file *f = &x->files[x->n_files];
        if ((rc = read_small(path, &f->data, &f->bytes, err, errlen)) == 0 && f->data) {
            f->name = fso_hf_carried_files[i];
            x->n_files++;
        }
    }
    if (rc < 0)
        fso_hf_extras_free(x);
    return rc;
}

/* The token ids config carries, as "bos_token_id 128000, eos_token_id
 * [128001, 128009]". */
static void describe_ids(const json_t *config, char *buf, size_t len)
{
    static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id", NULL};
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; ids[i] && n < len; i++) {
        json_t *v = json_object_get(config, ids[i]);
        char *s = v && !json_is_null(v) ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
        if (s)
            n += (size_t)snprintf(buf + n, len - n, "%s%s %s", n ? ", " : "", ids[i], s);
        free(s);
    }
}

void fso_hf_extras_describe(const fso_hf_extras *x, char *buf, size_t len)
{
    if (x->origin == FSO_HF_EXTRAS_SCRATCH) {
        snprintf(buf, len, "the run started from scratch (no --init-from): there are no token "
                           "ids, tokenizer or generation config to carry, so transformers "
                           "will assume bos 1 and eos 2 unless you add them to config.json");
        return;
    }
    if (x->origin == FSO_HF_EXTRAS_UNRECORDED) {
        snprintf(buf, len, "the checkpoint was written by an earlier fsoff, which kept no token "
                           "ids or tokenizer files: copy them from the folder the run started "
                           "from (config.json's bos_token_id and eos_token_id, "
                           "generation_config.json, tokenizer*.json)");
        return;
    }
    char ids[256];
    describe_ids(x->config, ids, sizeof ids);
    size_t n = (size_t)snprintf(buf, len, "carried from %s: %s", x->from,
                                ids[0] ? ids : "no token ids (config.json has none)");
    for (int i = 0; i < x->n_files && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, ", %s", x->files[i].name);
    bool first = true;
    for (int i = 0; fso_hf_carried_files[i] && n < len; i++) {
        const char *name = fso_hf_carried_files[i];
        if (!fso_hf_extras_file(x, name) && expected(x, name)) {
            if (first)
                n += (size_t)snprintf(buf + n, len - n, "; %s has no %s", x->from, name);
            else
                n += (size_t)snprintf(buf + n, len - n, ", %s", name);
            first = false;
        }
    }
}
