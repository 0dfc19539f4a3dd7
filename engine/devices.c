/* devices.c — parsing --devices (devices.h). */
#include "devices.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

int fso_devices_parse(const char *arg, bool cpu_only, fso_devices *out, char *err,
                      size_t errlen)
{
    const char *colon = strchr(arg, ':');
    const size_t kind_len = colon ? (size_t)(colon - arg) : strlen(arg);
    long n = 0;
    bool ok = true;
    if (colon) {
        char *end;
        errno = 0;
        n = strtol(colon + 1, &end, 10);
        ok = !errno && end != colon + 1 && !*end && n >= 1 && n <= FSO_MAX_DEVICES;
    }
    *out = (fso_devices){.backend = FSO_BACKEND_CPU, .count = (int)n};
    if (ok && kind_len == 3 && strncmp(arg, "cpu", 3) == 0)
        return 0;
    if (ok && !cpu_only && kind_len == 4 && strncmp(arg, "cuda", 4) == 0) {
        out->backend = FSO_BACKEND_CUDA;
        return 0;
    }
    if (ok && !cpu_only && !colon && strcmp(arg, "auto") == 0) {
        out->is_auto = true;
        return 0;
    }
    snprintf(err, errlen, "--devices %s: expected %s with N from 1 to %d", arg,
             cpu_only ? "cpu or cpu:N" : "auto, cpu, cpu:N, cuda or cuda:N", FSO_MAX_DEVICES);
    return -EINVAL;
}
