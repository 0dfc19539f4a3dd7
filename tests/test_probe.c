/* test_probe.c — the machine the planner plans for:
 *  - hwloc topologies from tests/topo (NUMA nodes, cores, GPUs by bus id,
 *    NVMe drives, a folder's drive through a fake sysfs);
 *  - the probe cache: its round trip, what it keeps per machine and per set
 *    of folders, and the tuned entries of `fsoff bench tune`.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "probe.h"
#include "test_util.h"
#include "topology.h"

static char tmpdir[1024];

/* ------------------------------------------------------------------ topology */

static void topo_path(char *buf, size_t len, const char *name)
{
    const char *src = getenv("FSO_SRCDIR");
    snprintf(buf, len, "%s/tests/topo/%s", src ? src : "..", name);
}

static void test_topology_two_sockets_eight_gpus(void **state)
{
    (void)state;
    char path[1024], err[512];
    fso_topo *t = NULL;
    topo_path(path, sizeof path, "two_socket_8gpu_4nvme.xml");
    assert_int_equal(fso_topo_create(&t, path, err, sizeof err), 0);
    assert_int_equal(t->packages, 2);
    assert_int_equal(t->cores, 32);
    assert_int_equal(t->n_numa, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(t->numa[i].os_index, i);
        assert_int_equal(t->numa[i].cores, 16);
        assert_int_equal(t->numa[i].mem_bytes, (uint64_t)256 << 30);
    }
    assert_int_equal(t->n_gpus, 8);
    int g = fso_topo_gpu_by_busid(t, "0000:9a:00.0");
    assert_int_equal(g, 4);
    assert_int_equal(t->gpus[g].numa, 1);
    g = fso_topo_gpu_by_busid(t, "18:00.0"); /* domain left out, as some tools print */
    assert_int_equal(g, 0);
    assert_int_equal(t->gpus[g].numa, 0);
    assert_int_equal(fso_topo_gpu_by_busid(t, "0000:9A:00.0"), 4);
    assert_int_equal(fso_topo_gpu_by_busid(t, "0000:01:00.0"), -ENOENT);
    assert_int_equal(fso_topo_gpu_by_busid(t, "nonsense"), -EINVAL);
    assert_int_equal(t->n_nvme, 4);
    assert_string_equal(t->nvme[2].osdev, "nvme2n1");
    assert_string_equal(t->nvme[2].devid, "259:2");
    assert_int_equal(t->nvme[2].numa, 1);
    assert_int_equal(t->nvme[0].numa, 0);
    /* binding applies only to this machine */
    assert_int_equal(fso_topo_bind_thread(t, 0), -ENOTSUP);
    assert_int_equal(fso_topo_bind_thread(t, 7), -EINVAL);
    /* where each device's threads and host memory go: GPUs by bus id ... */
    const char *bus[8];
    for (int i = 0; i < 8; i++)
        bus[i] = t->gpus[i].busid;
    int nodes[8];
    fso_topo_home_nodes(t, 8, bus, nodes);
    for (int i = 0; i < 8; i++)
        assert_int_equal(nodes[i], i < 4 ? 0 : 1);
    const char *odd[2] = {t->gpus[6].busid, "0000:01:00.0"}; /* not in this box */
    fso_topo_home_nodes(t, 2, odd, nodes);
    assert_int_equal(nodes[0], 1);
    assert_int_equal(nodes[1], -1);
    /* ... CPU devices spread over the sockets in order */
    fso_topo_home_nodes(t, 4, NULL, nodes);
    assert_int_equal(nodes[0], 0);
    assert_int_equal(nodes[1], 0);
    assert_int_equal(nodes[2], 1);
    assert_int_equal(nodes[3], 1);
    fso_topo_home_nodes(t, 3, NULL, nodes);
    assert_int_equal(nodes[0], 0);
    assert_int_equal(nodes[1], 0);
    assert_int_equal(nodes[2], 1);
    cpu_set_t cpus;
    assert_int_equal(fso_topo_node_cpus(t, 1, &cpus), t->numa[1].pus);
    assert_int_equal(CPU_COUNT(&cpus), t->numa[1].pus);
    assert_int_equal(fso_topo_node_cpus(t, 5, &cpus), -EINVAL);
    fso_topo_destroy(t);

    topo_path(path, sizeof path, "desktop_1gpu.xml");
    assert_int_equal(fso_topo_create(&t, path, err, sizeof err), 0);
    assert_int_equal(t->n_numa, 1);
    assert_int_equal(t->cores, 8);
    assert_int_equal(t->n_gpus, 1);
    assert_string_equal(t->gpus[0].busid, "0000:01:00.0");
    fso_topo_destroy(t);

    assert_true(fso_topo_create(&t, "/nonexistent/topo.xml", err, sizeof err) < 0);
    assert_non_null(strstr(err, "/nonexistent/topo.xml"));
}

static void mkfile(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_folder_resolves_to_its_drive(void **state)
{
    (void)state;
    char path[1024], err[512], sys[1100], d[1400];
    fso_topo *t = NULL;
    fso_topo_disk disk;
    topo_path(path, sizeof path, "two_socket_8gpu_4nvme.xml");
    assert_int_equal(fso_topo_create(&t, path, err, sizeof err), 0);
    /* a fake sysfs: partition 259:5 of nvme2n1 (259:2) behind 0000:c1:00.0, and a
     * SATA disk 8:0 the topology does not list */
    snprintf(sys, sizeof sys, "%s/sys", tmpdir);
    const char *dirs[] = {"", "/dev", "/dev/block", "/devices", "/devices/pci0000:c0",
                          "/devices/pci0000:c0/0000:c0:01.0",
                          "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0",
                          "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/nvme",
                          "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/nvme/nvme2",
                          "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/nvme/nvme2/nvme2n1",
                          "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/nvme/nvme2/nvme2n1/"
                          "nvme2n1p1",
                          "/devices/pci0000:00", "/devices/pci0000:00/0000:00:17.0",
                          "/devices/pci0000:00/0000:00:17.0/ata1",
                          "/devices/pci0000:00/0000:00:17.0/ata1/block",
                          "/devices/pci0000:00/0000:00:17.0/ata1/block/sda"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(d, sizeof d, "%s%s", sys, dirs[i]);
        assert_true(mkdir(d, 0700) == 0 || errno == EEXIST);
    }
    const char *disk_dir = "/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/nvme/nvme2/nvme2n1";
    snprintf(d, sizeof d, "%s%s/dev", sys, disk_dir);
    mkfile(d, "259:2\n");
    snprintf(d, sizeof d, "%s%s/nvme2n1p1/partition", sys, disk_dir);
    mkfile(d, "1\n");
    snprintf(d, sizeof d, "%s%s/nvme2n1p1/dev", sys, disk_dir);
    mkfile(d, "259:5\n");
    snprintf(d, sizeof d, "%s/dev/block/259:5", sys);
    char target[1024];
    snprintf(target, sizeof target, "../..%s/nvme2n1p1", disk_dir);
    assert_int_equal(symlink(target, d), 0);
    snprintf(d, sizeof d, "%s/dev/block/8:0", sys);
    assert_int_equal(symlink("../../devices/pci0000:00/0000:00:17.0/ata1/block/sda", d), 0);

    assert_int_equal(fso_topo_disk_of_devnum(t, sys, 259, 5, &disk), 0);
    assert_string_equal(disk.name, "nvme2n1");
    assert_string_equal(disk.devid, "259:2");
    assert_string_equal(disk.busid, "0000:c1:00.0");
    assert_int_equal(disk.numa, 1);

    assert_int_equal(fso_topo_disk_of_devnum(t, sys, 8, 0, &disk), 0);
    assert_string_equal(disk.name, "sda");
    assert_string_equal(disk.busid, "0000:00:17.0");
    assert_int_equal(disk.numa, -1); /* not in this topology */

    /* not in sysfs, but the topology knows the number */
    assert_int_equal(fso_topo_disk_of_devnum(t, sys, 259, 3, &disk), 0);
    assert_string_equal(disk.name, "nvme3n1");
    assert_int_equal(disk.numa, 1);
    assert_int_equal(fso_topo_disk_of_devnum(t, sys, 7, 7, &disk), -ENOENT);

    /* a real folder on this machine: whatever it is, an answer or a clear error */
    int rc = fso_topo_disk_of_path(t, tmpdir, &disk, err, sizeof err);
    assert_true(rc == 0 || rc == -ENODEV);
    assert_true(fso_topo_disk_of_path(t, "/nonexistent/dir", &disk, err, sizeof err) < 0);
    assert_non_null(strstr(err, "/nonexistent/dir"));
    fso_topo_destroy(t);
}

/* ------------------------------------------------------------------ probe cache */

static void test_probe_cache_round_trip(void **state)
{
    (void)state;
    char path[1200], err[512];
    fso_probe a, b, c;
    snprintf(path, sizeof path, "%s/cache/fsoff/probe.json", tmpdir);
    memset(&a, 0, sizeof a);
    snprintf(a.key, sizeof a.key, "host|cpu|/mnt/a");
    a.when = 1700000000;
    a.threads = 16;
    a.host_mem_bytes = (uint64_t)512 << 30;
    a.n_dirs = 1;
    snprintf(a.dirs[0].path, sizeof a.dirs[0].path, "/mnt/a");
    a.dirs[0].read_gbps = 6.5;
    a.dirs[0].write_gbps = 4.25;
    a.dirs[0].read_lat_ms = 0.125;
    a.dirs[0].free_bytes = (uint64_t)3 << 40;
    a.dirs[0].direct = true;
    a.nvme_read_gbps = 6.5;
    a.nvme_write_gbps = 4.25;
    a.nvme_free_bytes = (uint64_t)3 << 40;
    a.nvme_read_cpu_s_per_gb = 0.0625;
    a.nvme_write_cpu_s_per_gb = 0.25;
    a.nvme_cpu_known = true;
    a.h2d_gbps = 25;
    a.d2h_gbps = 24.5;
    a.host_copy_gbps = 10;
    a.coll_gbps = 150;
    a.adam_gelems = 3.5;
    a.gflops = 1234.5;
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    /* the same machine with other folders: the folders are an entry of their
     * own; the machine's figures stay one entry, the latest */
    b = a;
    snprintf(b.key, sizeof b.key, "host|cpu|/mnt/b");
    snprintf(b.dirs[0].path, sizeof b.dirs[0].path, "/mnt/b");
    b.nvme_read_gbps = 1.5;
    b.nvme_cpu_known = false; /* as an older fsoff wrote it */
    b.gflops = 99;
    assert_int_equal(fso_probe_cache_save(path, &b, err, sizeof err), 0);
    a.adam_gelems = 4.5; /* replacing an entry keeps one per key */
    a.gflops = 1234.5;
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);

    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err), 0);
    assert_string_equal(c.key, a.key);
    assert_int_equal(c.threads, 16);
    assert_int_equal(c.host_mem_bytes, a.host_mem_bytes);
    assert_int_equal(c.n_dirs, 1);
    assert_string_equal(c.dirs[0].path, "/mnt/a");
    assert_true(c.dirs[0].direct);
    assert_int_equal(c.dirs[0].free_bytes, a.dirs[0].free_bytes);
    assert_true(fabs(c.dirs[0].read_lat_ms - 0.125) < 1e-9);
    assert_true(fabs(c.nvme_write_gbps - 4.25) < 1e-9);
    assert_true(fabs(c.nvme_read_gbps - 6.5) < 1e-9);
    assert_true(fabs(c.adam_gelems - 4.5) < 1e-9);
    assert_true(fabs(c.gflops - 1234.5) < 1e-9);
    assert_true(c.nvme_cpu_known);
    assert_true(fabs(c.nvme_read_cpu_s_per_gb - 0.0625) < 1e-9);
    assert_true(fabs(c.nvme_write_cpu_s_per_gb - 0.25) < 1e-9);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/b", &c, err, sizeof err), 0);
    assert_true(fabs(c.nvme_read_gbps - 1.5) < 1e-9);
    assert_false(c.nvme_cpu_known); /* fso_probe_get measures such folders again */
    assert_true(fabs(c.gflops - 1234.5) < 1e-9); /* one compute figure per machine */
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|", &c, err, sizeof err), 0);
    assert_int_equal(c.n_dirs, 0);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/c", &c, err, sizeof err),
                     -ENOENT);
    assert_int_equal(fso_probe_cache_load(path, "other|cpu|", &c, err, sizeof err), -ENOENT);
    FILE *f = fopen(path, "r");
    char doc[8192] = "";
    assert_non_null(f);
    doc[fread(doc, 1, sizeof doc - 1, f)] = 0;
    fclose(f);
    const char *g = strstr(doc, "\"gflops\"");
    assert_non_null(g);
    assert_null(strstr(g + 1, "\"gflops\"")); /* one compute entry in the file */

    /* this host's folders that are gone are dropped when the cache is written */
    char key[2048];
    const char *gone = b.dirs[0].path;
    snprintf(b.dirs[0].path, sizeof b.dirs[0].path, "%.900s/tmp-folder", tmpdir);
    assert_int_equal(mkdir(gone, 0700), 0);
    fso_probe_key(key, sizeof key, gone);
    b.n_dirs = 1;
    snprintf(b.key, sizeof b.key, "%s", key);
    assert_int_equal(fso_probe_cache_save(path, &b, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_load(path, key, &c, err, sizeof err), 0);
    assert_int_equal(rmdir(gone), 0);
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_load(path, key, &c, err, sizeof err), -ENOENT);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err), 0);

    /* a cache an older fsoff wrote is measured again, not an error */
    mkfile(path, "{\"version\": 1, \"machines\": []}");
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err),
                     -ENOENT);
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err), 0);

    /* the path follows XDG_CACHE_HOME, then HOME */
    char want[1024], got[1024];
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    assert_int_equal(fso_probe_cache_path(got, sizeof got), 0);
    assert_string_equal(got, "/x/cache/fsoff/probe.json");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(fso_probe_cache_path(got, sizeof got), 0);
    snprintf(want, sizeof want, "/home/u/.cache/fsoff/probe.json");
    assert_string_equal(got, want);

    /* a file that is not a cache: a clear error, and saving starts afresh */
    mkfile(path, "{\"version\": 99}");
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err),
                     -EINVAL);
    assert_non_null(strstr(err, "probe cache"));
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err), 0);

    /* the key names this machine and the folders, resolved */
    fso_probe_key(key, sizeof key, tmpdir);
    assert_non_null(strchr(key, '|'));
    assert_non_null(strstr(key, "fsoff-probe-"));

    /* a new folder on a machine the cache knows: the folder alone is
     * measured, the machine's figures are the cached ones */
    char xdg[1100];
    snprintf(xdg, sizeof xdg, "%s/xdg", tmpdir);
    setenv("XDG_CACHE_HOME", xdg, 1);
    assert_int_equal(fso_probe_cache_path(path, sizeof path), 0);
    b = a;
    b.n_dirs = 0;
    b.gflops = 777;
    fso_probe_key(b.key, sizeof b.key, "");
    assert_int_equal(fso_probe_cache_save(path, &b, err, sizeof err), 0);
    fso_probe_opts po = {.dirs = tmpdir, .threads = 1, .nvme_bytes = 1 << 20, .quiet = true};
    bool probed = false;
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_true(probed);
    assert_true(fabs(c.gflops - 777) < 1e-9);
    assert_int_equal(c.n_dirs, 1);
    assert_true(c.nvme_read_gbps > 0 && c.nvme_write_gbps > 0);
    assert_true(c.nvme_cpu_known && c.nvme_read_cpu_s_per_gb >= 0 &&
                c.nvme_write_cpu_s_per_gb >= 0);
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_false(probed); /* both now cached */
    /* folders cached without what their transfers cost the cores (an older
     * fsoff's entry) are measured again */
    c.nvme_cpu_known = false;
    assert_int_equal(fso_probe_cache_save(path, &c, err, sizeof err), 0);
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_true(probed && c.nvme_cpu_known);
    unsetenv("XDG_CACHE_HOME");
}

/* `fsoff bench tune`'s entries live beside the probe's, one per set of
 * folders: each kind of save keeps the other's, a gone folder's go with
 * its NVMe entry, and fso_probe_get takes the tuned rates for those
 * folders alone. */
static void test_probe_cache_tuned_entries(void **state)
{
    (void)state;
    char path[1200], err[512], key[2048], gone[1100], xdg[1100];
    fso_probe a, c;
    fso_probe_tuned t, u;
    snprintf(path, sizeof path, "%s/tuned/fsoff/probe.json", tmpdir);
    memset(&a, 0, sizeof a);
    snprintf(a.key, sizeof a.key, "host|cpu|/mnt/a");
    a.threads = 4;
    a.n_dirs = 1;
    snprintf(a.dirs[0].path, sizeof a.dirs[0].path, "/mnt/a");
    a.nvme_read_gbps = a.dirs[0].read_gbps = 2;
    a.nvme_write_gbps = a.dirs[0].write_gbps = 1;
    a.h2d_gbps = a.coll_gbps = a.adam_gelems = a.gflops = 1;
    memset(&t, 0, sizeof t);
    snprintf(t.key, sizeof t.key, "host|cpu|/mnt/a");
    t.when = 1700000000;
    t.devices = 2;
    t.block_bytes = 4 << 20;
    t.queue_depth = 8;
    t.read_gbps = 7.5;
    t.write_gbps = 3.25;
    t.read_lat_ms = 0.5;
    t.write_lat_ms = 0.25;

    /* no file, no entry */
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -ENOENT);
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), 0);
    assert_int_equal(u.devices, 2);
    assert_int_equal(u.block_bytes, 4 << 20);
    assert_int_equal(u.queue_depth, 8);
    assert_true(fabs(u.read_gbps - 7.5) < 1e-9 && fabs(u.write_lat_ms - 0.25) < 1e-9);
    t.queue_depth = 16; /* saving again replaces the entry */
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_cache_load(path, "host|cpu|/mnt/a", &c, err, sizeof err), 0);
    assert_true(fabs(c.nvme_read_gbps - 2) < 1e-9); /* the probe's rates, as probed */
    assert_false(c.nvme_tuned);
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), 0);
    assert_int_equal(u.queue_depth, 16);
    assert_int_equal(fso_probe_tuned_load(path, "host|cpu|/mnt/b", &u, err, sizeof err),
                     -ENOENT);

    /* out of range: refused by name, with the fix */
    t.block_bytes = ((uint64_t)1 << 30) + 4096;
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "host|cpu|/mnt/a"));
    assert_non_null(strstr(err, "fsoff bench tune"));
    t.block_bytes = 4 << 20;
    t.read_lat_ms = -1;
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -EINVAL);
    t.read_lat_ms = 0.5;

    /* this host's folder gone: its tuned entry goes with its NVMe entry;
     * another host's stays */
    snprintf(gone, sizeof gone, "%s/tuned-gone", tmpdir);
    assert_int_equal(mkdir(gone, 0700), 0);
    fso_probe_key(key, sizeof key, gone);
    fso_probe_tuned g = t;
    snprintf(g.key, sizeof g.key, "%s", key);
    assert_int_equal(fso_probe_tuned_save(path, &g, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_load(path, key, &u, err, sizeof err), 0);
    assert_int_equal(rmdir(gone), 0);
    assert_int_equal(fso_probe_cache_save(path, &a, err, sizeof err), 0);
    assert_int_equal(fso_probe_tuned_load(path, key, &u, err, sizeof err), -ENOENT);
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), 0);

    /* an older cache (a version 1 file with "tuned"; a version 2 one, whose
     * NVMe rates came through 4 KiB pages) is measured again */
    mkfile(path, "{\"version\": 1, \"machines\": [], \"tuned\": []}");
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -ENOENT);
    mkfile(path, "{\"version\": 2, \"machines\": [], \"nvme\": [], \"tuned\": []}");
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -ENOENT);
    /* "tuned" that is not an array: not a probe cache */
    mkfile(path, "{\"version\": 3, \"machines\": [], \"nvme\": [], \"tuned\": {}}");
    assert_int_equal(fso_probe_tuned_load(path, t.key, &u, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "not an fsoff probe cache"));

    /* fso_probe_get: the tuned rates replace the probe's for their folders */
    snprintf(xdg, sizeof xdg, "%s/xdg-tuned", tmpdir);
    setenv("XDG_CACHE_HOME", xdg, 1);
    assert_int_equal(fso_probe_cache_path(path, sizeof path), 0);
    fso_probe m = a;
    m.n_dirs = 0;
    fso_probe_key(m.key, sizeof m.key, ""); /* this machine known: only folders are probed */
    assert_int_equal(fso_probe_cache_save(path, &m, err, sizeof err), 0);
    fso_probe_opts po = {.dirs = tmpdir, .threads = 1, .nvme_bytes = 1 << 20, .quiet = true};
    bool probed = false;
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_true(probed);
    assert_false(c.nvme_tuned);
    const double probed_read = c.nvme_read_gbps;
    snprintf(t.key, sizeof t.key, "%s", c.key);
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_false(probed);
    assert_true(c.nvme_tuned);
    assert_true(fabs(c.nvme_read_gbps - 7.5) < 1e-9 && fabs(c.nvme_write_gbps - 3.25) < 1e-9);
    assert_true(fabs(c.nvme_read_lat_ms - 0.5) < 1e-9 && fabs(c.nvme_write_lat_ms - 0.25) < 1e-9);
    /* the cache keeps the probe's figures: tuning again or not, they stay
     * (written with 6 significant digits: a relative 5e-6 at most) */
    assert_int_equal(fso_probe_cache_load(path, c.key, &a, err, sizeof err), 0);
    assert_true(fabs(a.nvme_read_gbps - probed_read) < 1e-5 * probed_read);
    /* refresh measures again and the tuned figures still apply */
    assert_int_equal(fso_probe_get(&c, &po, true, &probed, err, sizeof err), 0);
    assert_true(probed && c.nvme_tuned);
    /* no folders: nothing tuned applies */
    po.dirs = "";
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_false(c.nvme_tuned);
    assert_true(c.nvme_read_gbps == 0);
    /* an entry out of range is not applied */
    po.dirs = tmpdir;
    t.write_gbps = 0;
    assert_int_equal(fso_probe_tuned_save(path, &t, err, sizeof err), 0);
    assert_int_equal(fso_probe_get(&c, &po, false, &probed, err, sizeof err), 0);
    assert_false(c.nvme_tuned);
    unsetenv("XDG_CACHE_HOME");
}

/* ------------------------------------------------------------------ main */

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(tmpdir, sizeof tmpdir, "fsoff-probe");
}

static int teardown(void **state)
{
    (void)state;
    return remove_tree(tmpdir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topology_two_sockets_eight_gpus),
        cmocka_unit_test(test_folder_resolves_to_its_drive),
        cmocka_unit_test(test_probe_cache_round_trip),
        cmocka_unit_test(test_probe_cache_tuned_entries),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
