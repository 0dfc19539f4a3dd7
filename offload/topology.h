/* topology.h — the machine as hwloc sees it: NUMA nodes, cores, GPUs and
 * NVMe drives with the node each is attached to, and the block device (and
 * so the node) behind an NVMe folder. Used to put host memory and threads
 * near the devices they serve, and to tell the planner what is there.
 *
 * A topology is this machine's (discovered) or read from an hwloc XML file
 * (lstopo --of xml, or tests/topo/), which makes every query testable on
 * synthetic machines. Binding applies only to this machine's topology.
 *
 * GPUs: PCI 3D controllers, and display controllers from NVIDIA or AMD,
 * matched by PCI bus id ("0000:18:00.0", as cudaDeviceGetPCIBusId and
 * nvidia-smi print it). NVMe drives: PCI class 0x0108.
 */
#ifndef FSO_TOPOLOGY_H
#define FSO_TOPOLOGY_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FSO_TOPO_MAX 64

typedef struct fso_topo_numa {
    int os_index;             /* as numactl names it */
    uint64_t mem_bytes;
    int cores, pus;
} fso_topo_numa;

typedef struct fso_topo_pci {
    char busid[16];           /* "0000:18:00.0" */
    unsigned vendor, device;  /* PCI ids */
    unsigned class_id;        /* 0x0302, 0x0108, ... */
    int numa;                 /* os_index of the nearest NUMA node, -1 unknown */
    char osdev[64];           /* OS device below it: "nvme0n1", "" if none */
    char devid[32];           /* its block device's "major:minor", "" if none */
} fso_topo_pci;

typedef struct fso_topo {
    void *hw;                 /* hwloc_topology_t */
    bool this_system;         /* discovered here (binding possible) */
    char source[256];         /* "this machine" or the XML path */
    char cpu_model[128];
    int packages, cores, pus;
    uint64_t mem_bytes;
    int n_numa;
    fso_topo_numa numa[FSO_TOPO_MAX];
    int n_gpus;
    fso_topo_pci gpus[FSO_TOPO_MAX];
    int n_nvme;
    fso_topo_pci nvme[FSO_TOPO_MAX];
} fso_topo;

/* The block device behind a folder. */
typedef struct fso_topo_disk {
    char name[64];            /* "nvme0n1"; "" when the folder is on no block device */
    char devid[32];           /* "259:0" (the whole disk, not the partition) */
    char busid[16];           /* its PCI device, "" when not on PCI (virtual, dm, md) */
    int numa;                 /* -1 unknown */
} fso_topo_disk;

/* xml_path NULL: this machine. 0 or negative errno with a message. */
int fso_topo_create(fso_topo **out, const char *xml_path, char *err, size_t errlen);
void fso_topo_destroy(fso_topo *t);

/* Index in t->gpus of the GPU at this bus id (domain optional, any case),
 * or -ENOENT. */
int fso_topo_gpu_by_busid(const fso_topo *t, const char *busid);

/* The block device major:minor (sysfs_root "/sys" on a live system; tests
 * pass a fake tree): a partition resolves to its disk; a device-mapper or md
 * device to its first member. 0, or -ENOENT when sysfs has no such device. */
int fso_topo_disk_of_devnum(const fso_topo *t, const char *sysfs_root, unsigned major,
                            unsigned minor, fso_topo_disk *out);
/* The block device behind folder `dir` (stat, then as above). -ENODEV when
 * the folder's filesystem has no block device (tmpfs, overlay): out->name is
 * then "". Other errors: negative errno with a message. */
int fso_topo_disk_of_path(const fso_topo *t, const char *dir, fso_topo_disk *out, char *err,
                          size_t errlen);

/* Bind the calling thread to the cores of NUMA node `numa` (os index), or
 * place [addr, addr+len) on it: the policy only, no migration, so its pages
 * go there when first touched; bind before touching (pinned pages never
 * move, and mbind without MPOL_MF_STRICT does not say so).
 * Returns 0, -ENOTSUP for a topology that is not this machine's or a system
 * that refuses, -EINVAL for no such node. */
int fso_topo_bind_thread(const fso_topo *t, int numa);
int fso_topo_bind_memory(const fso_topo *t, void *addr, size_t len, int numa);

/* NUMA nodes of this machine from sysfs, without discovering the rest
 * (cheap; 1 when unknown): whether placing by node matters at all. */
int fso_topo_node_count(void);

/* The NUMA node (os index) each of `world` devices is nearest: a GPU by its
 * PCI bus id (busids[r]), CPU virtual devices (busids NULL) spread over the
 * nodes in order (device r on node r * nodes / world). -1: unknown (a
 * NULL bus id, a GPU not in the topology). The
 * engine runs a device's thread, its optimizer threads and its part of the
 * host arena there. */
void fso_topo_home_nodes(const fso_topo *t, int world, const char *const *busids, int *nodes);
/* The CPUs of NUMA node `numa` (os index) into *out: their count, or
 * -EINVAL for no such node. */
int fso_topo_node_cpus(const fso_topo *t, int numa, cpu_set_t *out);

/* "2 packages, 64 cores, 2 NUMA nodes (512 GiB), 8 GPUs, 4 NVMe" */
void fso_topo_describe(const fso_topo *t, char *buf, size_t len);

#endif
