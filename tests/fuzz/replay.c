/* replay.c — a fuzz target as a test: feeds it every file named on the
 * command line, or found in a folder named there (in name order), once.
 * A crash or a failed check fails the test; so does finding no input at all
 * (a test that ran nothing would pass for the wrong reason). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap * 2);
            if (!b)
                free(buf);
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    int inputs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i]) < 0)
                return 1;
            inputs++;
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[i], &ents, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        int folder = 0;
        for (int e = 0; e < n; e++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], ents[e]->d_name);
            if (ents[e]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                if (replay_file(path) < 0)
                    return 1;
                folder++;
            }
            free(ents[e]);
        }
        free(ents);
        printf("replay: %s: %d inputs\n", argv[i], folder);
        inputs += folder;
    }
    if (inputs == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replay: %d inputs, no failure\n", inputs);
    return 0;
}
