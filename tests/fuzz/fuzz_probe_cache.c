/* fuzz_probe_cache.c — the probe cache file that fsoff plan and the planner
 * read back ($XDG_CACHE_HOME/fsoff/probe.json; offload/probe.c).
 *
 * Input: the file's bytes, read for the key "k", as a machine entry and as
 * a "tuned" entry (what `fsoff bench tune` left). A read gives 0 with an
 * entry that holds what the planner divides by (threads, positive rates,
 * no negative rate or latency; integers in range, with no undefined cast),
 * -ENOENT (no such entry), or -EINVAL with a message. An entry read is then
 * saved to a fresh cache and read back: the same key, folders and threads,
 * or the same request size and queue depth.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "probe.h"

static void tuned(const char *path)
{
    static fso_probe_tuned t, u;
    char err[512] = "";
    int rc = fso_probe_tuned_load(path, "k", &t, err, sizeof err);
    if (rc < 0) {
        FUZZ_CHECK(rc == -ENOENT || (rc == -EINVAL && err[0] != '\0'));
        return;
    }
    FUZZ_CHECK(strcmp(t.key, "k") == 0);
    FUZZ_CHECK(t.read_gbps > 0 && t.write_gbps > 0 && t.read_lat_ms >= 0 && t.write_lat_ms >= 0);
    FUZZ_CHECK(t.block_bytes > 0 && t.queue_depth >= 1);

    const char *saved = fuzz_file("tuned.json", (const uint8_t *)"", 0);
    FUZZ_CHECK(fso_probe_tuned_save(saved, &t, err, sizeof err) == 0);
    FUZZ_CHECK(fso_probe_tuned_load(saved, "k", &u, err, sizeof err) == 0);
    FUZZ_CHECK(u.block_bytes == t.block_bytes && u.queue_depth == t.queue_depth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fso_probe p, q; /* 20 KiB each: off the stack */
    char err[512] = "";
    const char *path = fuzz_file("probe.json", data, size);
    tuned(path);
    int rc = fso_probe_cache_load(path, "k", &p, err, sizeof err);
    if (rc < 0) {
        FUZZ_CHECK(rc == -ENOENT || (rc == -EINVAL && err[0] != '\0'));
        return 0;
    }
    FUZZ_CHECK(strcmp(p.key, "k") == 0);
    FUZZ_CHECK(p.threads >= 1 && p.n_dirs >= 0 && p.n_dirs <= FSO_STORE_MAX_DIRS);
    FUZZ_CHECK(p.h2d_gbps > 0 && p.gflops > 0 && p.adam_gelems > 0 && p.coll_gbps > 0);
    FUZZ_CHECK(p.d2h_gbps >= 0 && p.host_copy_gbps >= 0 && p.nvme_read_gbps >= 0 &&
               p.nvme_write_gbps >= 0 && p.nvme_read_lat_ms >= 0 && p.nvme_write_lat_ms >= 0);
    for (int i = 0; i < p.n_dirs; i++)
        FUZZ_CHECK(p.dirs[i].read_gbps >= 0 && p.dirs[i].write_gbps >= 0 &&
                   p.dirs[i].read_lat_ms >= 0 && p.dirs[i].write_lat_ms >= 0);

    const char *saved = fuzz_file("saved.json", (const uint8_t *)"", 0);
    FUZZ_CHECK(fso_probe_cache_save(saved, &p, err, sizeof err) == 0);
    FUZZ_CHECK(fso_probe_cache_load(saved, "k", &q, err, sizeof err) == 0);
    FUZZ_CHECK(q.threads == p.threads && q.n_dirs == p.n_dirs);
    for (int i = 0; i < p.n_dirs; i++)
        FUZZ_CHECK(strcmp(q.dirs[i].path, p.dirs[i].path) == 0);
    return 0;
}
