/* devices.c — parsing --devices and checking NVMe folder lists (devices.h). */
#include "devices.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coll.h"
#include "store.h"
#include "util.h"

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

int fso_nvme_folders_split(const char *what, const char *list, bool here, char *buf,
                           size_t buflen, const char **dirs, char *err, size_t errlen)
{
    const size_t len = strlen(list);
    const bool empty_item = list[0] == ',' || (len > 0 && list[len - 1] == ',') ||
                            strstr(list, ",,");
    if (len >= buflen) {
        snprintf(err, errlen, "%s: the list of folders is longer than %zu bytes", what,
                 buflen - 1);
        return -EINVAL;
    }
    memcpy(buf, list, len + 1);
    int n = fso_split_list(buf, ',', dirs, FSO_STORE_MAX_DIRS);
    if (n == 0 || empty_item) {
        snprintf(err, errlen, "%s \"%s\": expected one or more folders, comma-separated, "
                              "e.g. /mnt/nvme0,/mnt/nvme1", what, list);
        return -EINVAL;
    }
    if (n < 0) {
        snprintf(err, errlen, "%s %s: more than %d folders; stripe over at most %d", what, list,
                 FSO_STORE_MAX_DIRS, FSO_STORE_MAX_DIRS);
        return -EINVAL;
    }
    for (int i = 0; here && i < n; i++) {
        struct stat st;
        if (stat(dirs[i], &st) != 0) {
            snprintf(err, errlen, "%s %s: %s: no such folder; create it or name another", what,
                     list, dirs[i]);
            return -EINVAL;
        }
        if (!S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s %s: %s is not a folder; name folders, comma-separated",
                     what, list, dirs[i]);
            return -EINVAL;
        }
    }
    return n;
}
