/* topology.c — hwloc discovery, folder-to-drive resolution, binding
 * (topology.h). */
#include "topology.h"

#include <dirent.h>
#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int numa_of(hwloc_topology_t hw, hwloc_obj_t io)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(hw, io);
    if (!a || !a->nodeset || hwloc_bitmap_iszero(a->nodeset))
        return -1;
    /* attached above several nodes (a package with sub-NUMA clustering):
     * the first is as good a guess as any */
    return hwloc_bitmap_first(a->nodeset);
}

static void fill_pci(hwloc_topology_t hw, hwloc_obj_t o, fso_topo_pci *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->busid, sizeof p->busid, "%04x:%02x:%02x.%01x", o->attr->pcidev.domain,
             o->attr->pcidev.bus, o->attr->pcidev.dev, o->attr->pcidev.func);
    p->vendor = o->attr->pcidev.vendor_id;
    p->device = o->attr->pcidev.device_id;
    p->class_id = o->attr->pcidev.class_id;
    p->numa = numa_of(hw, o);
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
        if (c->type != HWLOC_OBJ_OS_DEVICE)
            continue;
        if (!p->osdev[0] && c->name)
            snprintf(p->osdev, sizeof p->osdev, "%s", c->name);
        const char *id = hwloc_obj_get_info_by_name(c, "LinuxDeviceID");
        if (id && !p->devid[0]) {
            snprintf(p->devid, sizeof p->devid, "%s", id);
            if (c->name)
                snprintf(p->osdev, sizeof p->osdev, "%s", c->name);
        }
    }
}

static bool is_gpu(hwloc_obj_t o)
{
    unsigned cls = o->attr->pcidev.class_id, ven = o->attr->pcidev.vendor_id;
    return cls == 0x0302 || (cls == 0x0300 && (ven == 0x10de || ven == 0x1002));
}

int fso_topo_create(fso_topo **out, const char *xml_path, char *err, size_t errlen)
{
    fso_topo *t = calloc(1, sizeof *t);
    hwloc_topology_t hw;
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (hwloc_topology_init(&hw) < 0) {
        free(t);
        snprintf(err, errlen, "hwloc: cannot initialise a topology");
        return -ENOMEM;
    }
    hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml_path && hwloc_topology_set_xml(hw, xml_path) < 0) {
        int e = errno ? errno : EINVAL;
        snprintf(err, errlen, "%s: cannot use as an hwloc XML topology: %s", xml_path,
                 strerror(e));
        hwloc_topology_destroy(hw);
        free(t);
        return -e;
    }
    if (hwloc_topology_load(hw) < 0) {
        int e = errno ? errno : EINVAL;
        snprintf(err, errlen, "%s: hwloc could not load the topology: %s",
                 xml_path ? xml_path : "this machine", strerror(e));
        hwloc_topology_destroy(hw);
        free(t);
        return -e;
    }
    t->hw = hw;
    t->this_system = xml_path == NULL;
    snprintf(t->source, sizeof t->source, "%s", xml_path ? xml_path : "this machine");
    t->packages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
    t->cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    t->pus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
    hwloc_obj_t pkg = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PACKAGE, 0);
    const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
    snprintf(t->cpu_model, sizeof t->cpu_model, "%s", model ? model : "unknown CPU");

    int nn = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn && t->n_numa < FSO_TOPO_MAX; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        fso_topo_numa *n = &t->numa[t->n_numa++];
        n->os_index = (int)o->os_index;
        n->mem_bytes = o->attr ? o->attr->numanode.local_memory : 0;
        n->cores = hwloc_get_nbobjs_inside_cpuset_by_type(hw, o->cpuset, HWLOC_OBJ_CORE);
        n->pus = hwloc_get_nbobjs_inside_cpuset_by_type(hw, o->cpuset, HWLOC_OBJ_PU);
        t->mem_bytes += n->mem_bytes;
    }
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(hw, o)) != NULL;) {
        if (is_gpu(o) && t->n_gpus < FSO_TOPO_MAX)
            fill_pci(hw, o, &t->gpus[t->n_gpus++]);
        else if (o->attr->pcidev.class_id == 0x0108 && t->n_nvme < FSO_TOPO_MAX)
            fill_pci(hw, o, &t->nvme[t->n_nvme++]);
    }
    *out = t;
    return 0;
}

void fso_topo_destroy(fso_topo *t)
{
    if (!t)
        return;
    if (t->hw)
        hwloc_topology_destroy((hwloc_topology_t)t->hw);
    free(t);
}

static int parse_busid(const char *s, unsigned *d, unsigned *b, unsigned *dv, unsigned *f)
{
    *d = 0;
    if (sscanf(s, "%x:%x:%x.%x", d, b, dv, f) == 4)
        return 0;
    *d = 0;
    if (sscanf(s, "%x:%x.%x", b, dv, f) == 3)
        return 0;
    return -EINVAL;
}

int fso_topo_gpu_by_busid(const fso_topo *t, const char *busid)
{
    unsigned d, b, dv, f;
    if (parse_busid(busid, &d, &b, &dv, &f) < 0)
        return -EINVAL;
    for (int i = 0; i < t->n_gpus; i++) {
        unsigned d2, b2, dv2, f2;
        if (parse_busid(t->gpus[i].busid, &d2, &b2, &dv2, &f2) == 0 && d == d2 && b == b2 &&
            dv == dv2 && f == f2)
            return i;
    }
    return -ENOENT;
}

/* The OS block device with this LinuxDeviceID, in the topology. */
static hwloc_obj_t osdev_by_devid(hwloc_topology_t hw, const char *devid)
{
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(hw, o)) != NULL;) {
        const char *id = hwloc_obj_get_info_by_name(o, "LinuxDeviceID");
        if (id && strcmp(id, devid) == 0)
            return o;
    }
    return NULL;
}

/* The last PCI address ("dddd:bb:dd.f") among the components of a sysfs path. */
static bool last_busid(const char *path, char *out, size_t len)
{
    bool found = false;
    const char *p = path;
    while ((p = strchr(p, '/')) != NULL) {
        p++;
        unsigned d, b, dv, f;
        int n = 0;
        if (sscanf(p, "%4x:%2x:%2x.%1x%n", &d, &b, &dv, &f, &n) == 4 && (p[n] == '/' || !p[n])) {
            snprintf(out, len, "%04x:%02x:%02x.%01x", d, b, dv, f);
            found = true;
        }
    }
    return found;
}

static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    if (!fgets(buf, (int)len, f)) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}


/* The PCI bus id and NUMA node of the disk behind hwloc OS device o. */
static void fill_from_osdev(hwloc_topology_t hw, hwloc_obj_t o, fso_topo_disk *out)
{
    hwloc_obj_t pci = o->parent;
    while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE)
        pci = pci->parent;
    if (pci) {
        fso_topo_pci p;
        fill_pci(hw, pci, &p);
        snprintf(out->busid, sizeof out->busid, "%s", p.busid);
    }
    out->numa = numa_of(hw, o);
}

int fso_topo_disk_of_devnum(const fso_topo *t, const char *sysfs_root, unsigned major,
                            unsigned minor, fso_topo_disk *out)
{
    hwloc_topology_t hw = (hwloc_topology_t)t->hw;
    char link[PATH_MAX], real[PATH_MAX], tmp[PATH_MAX + 64], devid[32];
    memset(out, 0, sizeof *out);
    out->numa = -1;
    snprintf(devid, sizeof devid, "%u:%u", major, minor);
    snprintf(link, sizeof link, "%s/dev/block/%s", sysfs_root, devid);
    if (!realpath(link, real)) {
        /* not in sysfs: perhaps the topology still knows the number */
        hwloc_obj_t o = osdev_by_devid(hw, devid);
        if (!o)
            return -ENOENT;
        snprintf(out->devid, sizeof out->devid, "%s", devid);
        snprintf(out->name, sizeof out->name, "%s", o->name ? o->name : "");
        fill_from_osdev(hw, o, out);
        return 0;
    }
    /* a partition: its disk is the parent folder */
    snprintf(tmp, sizeof tmp, "%s/partition", real);
    if (access(tmp, F_OK) == 0) {
        char *slash = strrchr(real, '/');
        if (slash)
            *slash = 0;
        snprintf(tmp, sizeof tmp, "%s/dev", real);
        if (read_line(tmp, devid, sizeof devid) < 0)
            return -ENOENT;
    }
    /* device mapper, md: the first member */
    snprintf(tmp, sizeof tmp, "%s/slaves", real);
    DIR *d = opendir(tmp);
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
        char member[sizeof tmp + 300], line[32];
        unsigned ma, mi;
        if (de->d_name[0] == '.')
            continue;
        snprintf(member, sizeof member, "%s/%s/dev", tmp, de->d_name);
        if (read_line(member, line, sizeof line) == 0 && sscanf(line, "%u:%u", &ma, &mi) == 2) {
            closedir(d);
            return fso_topo_disk_of_devnum(t, sysfs_root, ma, mi, out);
        }
    }
    if (d)
        closedir(d);
    const char *base = strrchr(real, '/');
    snprintf(out->name, sizeof out->name, "%.63s", base ? base + 1 : real);
    snprintf(out->devid, sizeof out->devid, "%s", devid);
    hwloc_obj_t o = osdev_by_devid(hw, devid);
    if (o) {
        fill_from_osdev(hw, o, out);
        return 0;
    }
    if (last_busid(real, out->busid, sizeof out->busid)) {
        hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(hw, out->busid);
        if (pci)
            out->numa = numa_of(hw, pci);
    }
    return 0;
}

int fso_topo_disk_of_path(const fso_topo *t, const char *dir, fso_topo_disk *out, char *err,
                          size_t errlen)
{
    struct stat st;
    memset(out, 0, sizeof *out);
    out->numa = -1;
    if (stat(dir, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s; check the NVMe folder", dir, strerror(e));
        return -e;
    }
    int rc = fso_topo_disk_of_devnum(t, "/sys", major(st.st_dev), minor(st.st_dev), out);
    if (rc == -ENOENT) {
        snprintf(err, errlen, "%s: on no block device (device %u:%u; tmpfs or overlay?)", dir,
                 major(st.st_dev), minor(st.st_dev));
        return -ENODEV;
    }
    return rc;
}

static hwloc_obj_t numa_obj(const fso_topo *t, int numa)
{
    hwloc_topology_t hw = (hwloc_topology_t)t->hw;
    int nn = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if ((int)o->os_index == numa)
            return o;
    }
    return NULL;
}

int fso_topo_bind_thread(const fso_topo *t, int numa)
{
    hwloc_obj_t o = numa_obj(t, numa);
    if (!o)
        return -EINVAL;
    if (!t->this_system)
        return -ENOTSUP;
    if (hwloc_set_cpubind((hwloc_topology_t)t->hw, o->cpuset, HWLOC_CPUBIND_THREAD) < 0)
        return errno == ENOSYS || errno == EXDEV ? -ENOTSUP : -errno;
    return 0;
}

int fso_topo_bind_memory(const fso_topo *t, void *addr, size_t len, int numa)
{
    hwloc_obj_t o = numa_obj(t, numa);
    if (!o)
        return -EINVAL;
    if (!t->this_system)
        return -ENOTSUP;
    if (hwloc_set_area_membind((hwloc_topology_t)t->hw, addr, len, o->nodeset,
                               HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET) < 0)
        return errno == ENOSYS || errno == EXDEV ? -ENOTSUP : -errno;
    return 0;
}

int fso_topo_node_count(void)
{
    DIR *d = opendir("/sys/devices/system/node");
    if (!d)
        return 1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9')
            n++;
    closedir(d);
    return n > 0 ? n : 1;
}

void fso_topo_home_nodes(const fso_topo *t, int world, const char *const *busids, int *nodes)
{
    for (int r = 0; r < world; r++) {
        nodes[r] = -1;
        if (busids) {
            int g = busids[r] ? fso_topo_gpu_by_busid(t, busids[r]) : -ENOENT;
            if (g >= 0)
                nodes[r] = t->gpus[g].numa;
        } else if (t->n_numa > 0) { /* CPU devices: node by node, in order */
            nodes[r] = t->numa[(int)((long)r * t->n_numa / world)].os_index;
        }
    }
}

int fso_topo_node_cpus(const fso_topo *t, int numa, cpu_set_t *out)
{
    hwloc_obj_t o = numa_obj(t, numa);
    if (!o)
        return -EINVAL;
    CPU_ZERO(out);
    int n = 0;
    unsigned i;
    hwloc_bitmap_foreach_begin(i, o->cpuset)
    {
        if (i < CPU_SETSIZE) {
            CPU_SET(i, out);
            n++;
        }
    }
    hwloc_bitmap_foreach_end();
    return n;
}

void fso_topo_describe(const fso_topo *t, char *buf, size_t len)
{
    snprintf(buf, len, "%s: %d package%s, %d cores, %d NUMA node%s (%.0f GiB), %d GPU%s, %d NVMe",
             t->cpu_model, t->packages, t->packages == 1 ? "" : "s", t->cores, t->n_numa,
             t->n_numa == 1 ? "" : "s", (double)t->mem_bytes / (1024.0 * 1024 * 1024), t->n_gpus,
             t->n_gpus == 1 ? "" : "s", t->n_nvme);
}
