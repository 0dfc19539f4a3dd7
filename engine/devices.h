/* devices.h — the devices a run is given on the command line: the compute
 * devices (--devices) and the NVMe folders state may go to (--nvme and the
 * offload sections' nvme_path). One parser and one check each, shared by
 * fsoff train, fsoff plan and the benchmarks, so every command accepts the
 * same forms and says the same thing about a bad one. */
#ifndef FSO_DEVICES_H
#define FSO_DEVICES_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"

/* A --devices value. */
typedef struct fso_devices {
    bool is_auto;             /* "auto": every CUDA GPU, else the CPU */
    fso_backend_kind backend; /* FSO_BACKEND_CPU or FSO_BACKEND_CUDA; CPU when is_auto */
    int count;                /* the N of cpu:N or cuda:N, 1 to FSO_MAX_DEVICES; 0: none given */
} fso_devices;

/* Parse --devices: auto, cpu, cpu:N, cuda or cuda:N, or with cpu_only
 * only cpu and cpu:N (a command that plans or simulates CPU devices), N
 * from 1 to FSO_MAX_DEVICES (coll.h). 0, or -EINVAL with one line in err
 * naming the option, the value and the forms accepted. */
int fso_devices_parse(const char *arg, bool cpu_only, fso_devices *out, char *err,
                      size_t errlen);

/* A list of NVMe folders as `what` names it (--nvme, or a configuration
 * key): one or more, comma-separated, no empty item, at most
 * FSO_STORE_MAX_DIRS (store.h), each an existing folder unless here is
 * false (a plan for drives elsewhere). The list is copied into buf and
 * split into dirs (FSO_STORE_MAX_DIRS entries). The count, or -EINVAL with
 * one line in err naming `what`, the list and what to give instead. */
int fso_nvme_folders_split(const char *what, const char *list, bool here, char *buf,
                           size_t buflen, const char **dirs, char *err, size_t errlen);

#endif
