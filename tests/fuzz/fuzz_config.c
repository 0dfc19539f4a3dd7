/* fuzz_config.c — the configuration as users give it: a JSON file and --set
 * overrides (engine/config/config.c, config_keys.c).
 *
 * Input: the file's bytes up to the first NUL (no file when that is empty),
 * then each further NUL-separated piece is one --set KEY=VALUE, at most
 * MAX_SETS. Every input gives 0 or an error with its message; a config that
 * loads has a finite, non-negative learning rate at every step.
 *
 * Loading a config opens one path the config names: model.init_from's
 * folder, whose config.json fso_config_finish() reads (config_hf.c); the
 * data and NVMe paths it only stores. So that the input opens nothing
 * outside the target's sandbox (fuzz_dir()), the folder is taken inside it
 * before the config is finished (sandbox_init_from). The sandbox holds no
 * folder with a config.json, so a config that names a folder fails. The
 * seeds corpus/config/init_from_* name a fixture folder that exists
 * (tests/fixtures/hf/linear_f32, from the source or the build folder) by a
 * relative path, by a path that climbs and by an absolute one.
 */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/config_impl.h"
#include "fuzz.h"

#define MAX_SETS 8

/* Whether s has a ".." component. */
static bool climbs(const char *s)
{
    for (;;) {
        size_t n = strcspn(s, "/");
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return true;
        if (!s[n])
            return false;
        s += n + 1;
    }
}

/* When the document cfg holds names a folder in model.init_from, sets it,
 * as a last --set would, to that folder inside fuzz_dir(): the path read
 * from there, or fuzz_dir()/refused for a path with a ".." component. The
 * value is read as config_hf.c reads it, up to its first NUL. Returns
 * whether a folder is named. */
static bool sandbox_init_from(fso_config *cfg)
{
    json_t *model = cfg->doc ? json_object_get(cfg->doc->merged, "model") : NULL;
    json_t *from = json_is_object(model) ? json_object_get(model, "init_from") : NULL;
    if (!json_is_string(from) || json_string_length(from) == 0)
        return false;
    const char *named = json_string_value(from);
    char *path = NULL, *value = NULL, *set = NULL;
    FUZZ_CHECK(asprintf(&path, "%s/%s", fuzz_dir(), climbs(named) ? "refused" : named) >= 0);
    json_t *js = json_string(path);
    FUZZ_CHECK(js != NULL);
    FUZZ_CHECK((value = json_dumps(js, JSON_ENCODE_ANY)) != NULL);
    FUZZ_CHECK(asprintf(&set, "model.init_from=%s", value) >= 0);
    FUZZ_CHECK(fso_config_set(cfg, set) == 0);
    free(set);
    free(value);
    json_decref(js);
    free(path);
    return true;
}

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
    /* fso_config_load_all(), with the folder sandboxed before the finish */
    int rc = path ? fso_config_load_file(&cfg, path) : 0;
    for (int i = 0; i < nsets && rc >= 0; i++)
        rc = fso_config_set(&cfg, sets[i]);
    if (rc >= 0) {
        bool names_folder = sandbox_init_from(&cfg);
        rc = fso_config_finish(&cfg);
        FUZZ_CHECK(!names_folder || rc < 0);
    }
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
