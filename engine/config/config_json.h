/* config_json.h — a configuration as a JSON document: every key with the
 * value it resolved to (defaults, file and --set applied), in the shape of a
 * configuration file, so the document loads back (fso_config_load_file) to
 * the same values. A checkpoint keeps its run's configuration this way
 * (checkpoint.h), and resuming compares the two key by key. */
#ifndef FSO_CONFIG_JSON_H
#define FSO_CONFIG_JSON_H

#include <jansson.h>

#include "config.h"

/* A new reference, or NULL when out of memory. The command line's own
 * choices (--devices, --device-mem) are not configuration keys and are not
 * in it. */
json_t *fso_config_to_json(const fso_config *cfg);

/* One key whose value differs between two such documents. */
typedef struct fso_config_change {
    char key[128];            /* dotted path: "optimizer.params.lr" */
    char was[96], now[96];    /* the values as JSON text ("absent" when missing) */
} fso_config_change;

/* The leaves of `was` and `now` that differ, in the order of `now`'s keys
 * (then keys only `was` has), up to max of them; returns how many differ
 * (may exceed max). */
int fso_config_json_diff(const json_t *was, const json_t *now, fso_config_change *out, int max);

#endif
