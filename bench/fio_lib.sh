# fio_lib.sh — sourced by the bench scripts that run fio beside fsoff
# (nvme_vs_fio.sh, step_vs_fio.sh, checkpoint_vs_fio.sh): what each needs
# before it starts, checked with one message each.
#
#   fio_require NAME DIR    exits 1 with "NAME: error: ..." unless $FSOFF is
#                           an executable, fio and python3 are installed and
#                           DIR is a folder
#   die MESSAGE             "NAME: error: MESSAGE" on stderr, exit 1 (NAME as
#                           fio_require was last given it)
#   fio_huge_pages BYTES    0 when the system has enough 2 MiB huge pages
#                           reserved for BYTES of fio buffers in them
#                           (--iomem=shmhuge, as fsoff's buffers are in
#                           transparent huge pages); else says on stderr how
#                           many to reserve and returns 1

die() { echo "${FIO_LIB_NAME:-bench}: error: $*" >&2; exit 1; }

fio_require() {
    FIO_LIB_NAME=$1
    [ -x "$FSOFF" ] || die "$FSOFF: no fsoff binary; build it (meson setup build && meson compile -C build) or set FSOFF"
    command -v fio >/dev/null ||
        die "fio not found; install it: sudo apt-get install fio (Debian/Ubuntu), sudo dnf install fio (Fedora)"
    command -v python3 >/dev/null ||
        die "python3 not found (it reads the JSON); install it: sudo apt-get install python3"
    [ -d "$2" ] || die "$2: no such folder; create it or pass another"
}

fio_huge_pages() {
    local need=$(($1 / 2097152 + 2)) free kb
    free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
    kb=$(awk '/^Hugepagesize:/ { print $2 }' /proc/meminfo)
    [ "${kb:-0}" = 2048 ] && [ "${free:-0}" -ge "$need" ] && return 0
    echo "# fio with huge-page buffers (as fsoff's are) not run: it needs $need free 2 MiB huge" \
        "pages (HugePages_Free: ${free:-0}); reserve them with" \
        "echo $need | sudo tee /proc/sys/vm/nr_hugepages" >&2
    return 1
}
