/* fuzz_probe_cache.c — the probe cache file that fsoff plan, the planner
 * and `fsoff bench tune` read back ($XDG_CACHE_HOME/fsoff/probe.json;
 * offload/probe.c).
 *
 * Input: the file's bytes, read for the folders' key "h|c|d" (the machine
 * entry "h|c" and the nvme entry "h|c|d"), for the machine alone ("h|c|"),
 * as the tuned entry "h|c|d" (what `fsoff bench tune` left) and as the
 * layer entry "h|c|layer" (the planner's timing of one layer). A read
 * gives 0 with figures that hold what the planner divides by (threads,
 * positive rates, no negative rate or latency, a request size aio takes;
 * integers in range, with no undefined cast), -ENOENT (no such entry, or a
 * cache an older fsoff wrote), or -EINVAL with a message. What was read is
 * then saved to a fresh cache and read back: the same threads and folders,
 * the same request size and queue depth, the same rate; and a tuned or a
 * layer entry saved beside a probe's leaves the probe's readable.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "probe.h"

#define KEY "h|c|d"
#define LAYER_KEY "h|c|layer"

/* The layer entry of path into *l: whether there is one. */
static bool read_layer(const char *path, fso_probe_layer *l)
{
    char err[512] = "";
    int rc = fso_probe_layer_load(path, LAYER_KEY, l, err, sizeof err);
    if (rc < 0) {
        FUZZ_CHECK(rc == -ENOENT || (rc == -EINVAL && err[0] != '\0'));
        return false;
    }
    FUZZ_CHECK(strcmp(l->key, LAYER_KEY) == 0);
    FUZZ_CHECK(l->gflops > 0 && l->embed_fwd_ms >= 0 && l->head_ms >= 0 && l->embed_bwd_ms >= 0);
    return true;
}

/* The tuned entry of path into *t: whether there is one. */
static bool read_tuned(const char *path, fso_probe_tuned *t)
{
    char err[512] = "";
    int rc = fso_probe_tuned_load(path, KEY, t, err, sizeof err);
    if (rc < 0) {
        FUZZ_CHECK(rc == -ENOENT || (rc == -EINVAL && err[0] != '\0'));
        return false;
    }
    FUZZ_CHECK(strcmp(t->key, KEY) == 0);
    FUZZ_CHECK(t->read_gbps > 0 && t->write_gbps > 0 && t->read_lat_ms >= 0 &&
               t->write_lat_ms >= 0);
    FUZZ_CHECK(t->block_bytes > 0 && t->block_bytes <= ((uint64_t)1 << 30) &&
               t->queue_depth >= 1);
    return true;
}

/* key's figures in path into *p: whether the cache has them all. */
static bool read_probe(const char *path, const char *key, fso_probe *p)
{
    char err[512] = "";
    int rc = fso_probe_cache_load(path, key, p, err, sizeof err);
    if (rc < 0) {
        FUZZ_CHECK(rc == -ENOENT || (rc == -EINVAL && err[0] != '\0'));
        return false;
    }
    FUZZ_CHECK(strcmp(p->key, key) == 0);
    FUZZ_CHECK(p->threads >= 1 && p->n_dirs >= 0 && p->n_dirs <= FSO_STORE_MAX_DIRS);
    FUZZ_CHECK((p->n_dirs > 0) == (strcmp(key, KEY) == 0)); /* folders only for a key with them */
    FUZZ_CHECK(p->h2d_gbps > 0 && p->gflops > 0 && p->adam_gelems > 0 && p->coll_gbps > 0);
    FUZZ_CHECK(p->d2h_gbps >= 0 && p->host_copy_gbps >= 0 && p->nvme_read_lat_ms >= 0 &&
               p->nvme_write_lat_ms >= 0);
    FUZZ_CHECK(p->n_dirs == 0 || (p->nvme_read_gbps > 0 && p->nvme_write_gbps > 0));
    for (int i = 0; i < p->n_dirs; i++)
        FUZZ_CHECK(p->dirs[i].read_gbps >= 0 && p->dirs[i].write_gbps >= 0 &&
                   p->dirs[i].read_lat_ms >= 0 && p->dirs[i].write_lat_ms >= 0);
    FUZZ_CHECK(!p->nvme_tuned); /* only fso_probe_get applies tuned figures */
    return true;
}

/* p saved to a fresh cache reads back the same. */
static void round_trip(const fso_probe *p, const char *saved)
{
    static fso_probe q;
    char err[512] = "";
    FUZZ_CHECK(fso_probe_cache_save(saved, p, err, sizeof err) == 0);
    FUZZ_CHECK(fso_probe_cache_load(saved, p->key, &q, err, sizeof err) == 0);
    FUZZ_CHECK(q.threads == p->threads && q.n_dirs == p->n_dirs);
    for (int i = 0; i < p->n_dirs; i++)
        FUZZ_CHECK(strcmp(q.dirs[i].path, p->dirs[i].path) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fso_probe p, machine; /* 20 KiB each: off the stack */
    static fso_probe_tuned t, u;
    static fso_probe_layer l, k;
    char err[512] = "";
    const char *path = fuzz_file("probe.json", data, size);
    bool have_t = read_tuned(path, &t);
    bool have_l = read_layer(path, &l);
    bool have_p = read_probe(path, KEY, &p);
    bool have_m = read_probe(path, "h|c|", &machine);
    FUZZ_CHECK(!have_p || have_m); /* the folders' figures come with the machine's */

    const char *saved = fuzz_file("saved.json", (const uint8_t *)"", 0);
    if (have_m)
        round_trip(&machine, saved);
    if (have_p)
        round_trip(&p, saved);
    if (have_t) {
        FUZZ_CHECK(fso_probe_tuned_save(saved, &t, err, sizeof err) == 0);
        FUZZ_CHECK(fso_probe_tuned_load(saved, KEY, &u, err, sizeof err) == 0);
        FUZZ_CHECK(u.block_bytes == t.block_bytes && u.queue_depth == t.queue_depth);
        if (have_p) /* tune's entry sits beside the probe's */
            FUZZ_CHECK(fso_probe_cache_load(saved, KEY, &p, err, sizeof err) == 0);
    }
    if (have_l) {
        FUZZ_CHECK(fso_probe_layer_save(saved, &l, err, sizeof err) == 0);
        FUZZ_CHECK(fso_probe_layer_load(saved, LAYER_KEY, &k, err, sizeof err) == 0);
        FUZZ_CHECK(k.gflops > 0);
        if (have_p) /* the layer's entry sits beside the probe's */
            FUZZ_CHECK(fso_probe_cache_load(saved, KEY, &p, err, sizeof err) == 0);
    }
    return 0;
}
