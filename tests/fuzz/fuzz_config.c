/* fuzz_config.c — the configuration as users give it: a JSON file and --set
 * overrides (engine/config.c, config_keys.c).
 *
 * Input: the file's bytes up to the first NUL (no file when that is empty),
 * then each further NUL-separated piece is one --set KEY=VALUE, at most
 * MAX_SETS. Every input gives 0 or an error with its message; a config that
 * loads has a finite, non-negative learning rate at every step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"

#define MAX_SETS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *end = data + size, *nul = memchr(data, 0, size);
    size_t file_len = nul ? (size_t)(nul - data) : size;
    const char *path = file_len ? fuzz_file("job.json", data, file_len) : NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    for (const uint8_t *p = nul ? nul + 1 : end; p < end && nsets < MAX_SETS;) {
        const uint8_t *q = memchr(p, 0, (size_t)(end - p));
        size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
        sets[nsets] = malloc(n + 1);
        FUZZ_CHECK(sets[nsets] != NULL);
        memcpy(sets[nsets], p, n);
        sets[nsets++][n] = '\0';
        p += n + 1;
    }

    fso_config cfg;
    fso_config_defaults(&cfg);
    int rc = fso_config_load_all(&cfg, path, sets, nsets);
    if (rc < 0) {
        FUZZ_CHECK(cfg.err[0] != '\0');
    } else {
        FUZZ_CHECK(cfg.steps >= 1);
        const int64_t at[] = {1, 2, cfg.sched.warmup_num_steps, cfg.sched.warmup_num_steps + 1,
                              cfg.steps / 2 + 1, cfg.steps};
        for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
            double lr = fso_config_lr_at(&cfg, at[i] > 0 ? at[i] : 1);
            FUZZ_CHECK(isfinite(lr) && lr >= 0);
        }
    }
    fso_config_free(&cfg);
    for (int i = 0; i < nsets; i++)
        free(sets[i]);
    return 0;
}
