#!/usr/bin/python3
"""Writes the synthetic hwloc XML topologies that tests/test_planner.c reads.

    /usr/bin/python3 tests/topo/gen_topo.py tests/topo

two_socket_8gpu_4nvme.xml  two packages of 16 cores, one NUMA node each
                           (256 GiB), four GPUs and two NVMe drives behind
                           each package's host bridges
desktop_1gpu.xml           one package of 8 cores, one NUMA node (128 GiB),
                           one GPU and one NVMe drive

GPUs: NVIDIA 3D controllers (class 0302, 10de:2335). NVMe: class 0108
(144d:a80a) with an OS block device nvmeNn1 whose LinuxDeviceID is 259:N.
"""
import sys

GIB = 1 << 30


class Gen:
    def __init__(self):
        self.gp = 0
        self.out = []

    def idx(self):
        self.gp += 1
        return self.gp

    def w(self, depth, text):
        self.out.append("  " * depth + text)


def mask(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v


def pci_dev(g, d, busid, cls, ven, dev, osdev=None, devid=None):
    g.w(d, '<object type="PCIDev" gp_index="%d" pci_busid="%s" pci_type="%04x [%04x:%04x] '
           '[%04x:0000] 00" pci_link_speed="15.753846">' % (g.idx(), busid, cls, ven, dev, ven))
    if osdev:
        g.w(d + 1, '<object type="OSDev" gp_index="%d" name="%s" osdev_type="0">' % (g.idx(), osdev))
        g.w(d + 2, '<info name="LinuxDeviceID" value="%s"/>' % devid)
        g.w(d + 1, '</object>')
    g.w(d, '</object>')


def host_bridge(g, d, bus, children):
    g.w(d, '<object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
           'bridge_pci="0000:[%02x-%02x]">' % (g.idx(), bus, bus))
    for c in children:
        pci_dev(g, d + 1, *c)
    g.w(d, '</object>')


def topology(packages, cores_per_pkg, mem_per_node, io_per_pkg):
    g = Gen()
    npu = packages * cores_per_pkg
    allpu = mask(range(npu))
    allnode = mask(range(packages))
    g.w(0, '<?xml version="1.0" encoding="UTF-8"?>')
    g.w(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    g.w(0, '<topology version="2.0">')
    g.w(1, '<object type="Machine" os_index="0" cpuset="%s" complete_cpuset="%s" '
           'allowed_cpuset="%s" nodeset="%s" complete_nodeset="%s" allowed_nodeset="%s" '
           'gp_index="%d">' % (allpu, allpu, allpu, allnode, allnode, allnode, g.idx()))
    g.w(2, '<info name="Backend" value="Synthetic"/>')
    g.w(2, '<info name="HostName" value="synthetic"/>')
    for p in range(packages):
        pus = range(p * cores_per_pkg, (p + 1) * cores_per_pkg)
        cs, ns = mask(pus), mask([p])
        g.w(2, '<object type="Package" os_index="%d" cpuset="%s" complete_cpuset="%s" '
               'nodeset="%s" complete_nodeset="%s" gp_index="%d">' % (p, cs, cs, ns, ns, g.idx()))
        g.w(3, '<info name="CPUModel" value="Synthetic Xeon 8480"/>')
        g.w(3, '<object type="NUMANode" os_index="%d" cpuset="%s" complete_cpuset="%s" '
               'nodeset="%s" complete_nodeset="%s" gp_index="%d" local_memory="%d">'
               % (p, cs, cs, ns, ns, g.idx(), mem_per_node))
        g.w(4, '<page_type size="4096" count="%d"/>' % (mem_per_node // 4096))
        g.w(3, '</object>')
        for c in pus:
            one, = [mask([c])]
            g.w(3, '<object type="Core" os_index="%d" cpuset="%s" complete_cpuset="%s" '
                   'nodeset="%s" complete_nodeset="%s" gp_index="%d">' % (c, one, one, ns, ns, g.idx()))
            g.w(4, '<object type="PU" os_index="%d" cpuset="%s" complete_cpuset="%s" '
                   'nodeset="%s" complete_nodeset="%s" gp_index="%d"/>' % (c, one, one, ns, ns, g.idx()))
            g.w(3, '</object>')
        for bus, children in io_per_pkg[p]:
            host_bridge(g, 3, bus, children)
        g.w(2, '</object>')
    g.w(1, '</object>')
    g.w(0, '</topology>')
    return "\n".join(g.out) + "\n"


def gpu(bus):
    return ("0000:%02x:00.0" % bus, 0x0302, 0x10de, 0x2335)


def nvme(bus, n):
    return ("0000:%02x:00.0" % bus, 0x0108, 0x144d, 0xa80a, "nvme%dn1" % n, "259:%d" % n)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    big = topology(2, 16, 256 * GIB, [
        [(0x18, [gpu(0x18)]), (0x2a, [gpu(0x2a)]), (0x3a, [gpu(0x3a)]), (0x5d, [gpu(0x5d)]),
         (0x1c, [nvme(0x1c, 0)]), (0x1d, [nvme(0x1d, 1)])],
        [(0x9a, [gpu(0x9a)]), (0xab, [gpu(0xab)]), (0xba, [gpu(0xba)]), (0xdb, [gpu(0xdb)]),
         (0xc1, [nvme(0xc1, 2)]), (0xc2, [nvme(0xc2, 3)])],
    ])
    small = topology(1, 8, 128 * GIB, [
        [(0x01, [gpu(0x01)]), (0x02, [nvme(0x02, 0)])],
    ])
    with open(out + "/two_socket_8gpu_4nvme.xml", "w") as f:
        f.write(big)
    with open(out + "/desktop_1gpu.xml", "w") as f:
        f.write(small)


if __name__ == "__main__":
    main()
