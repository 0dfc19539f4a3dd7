/* state.c — the names of state.h's kinds and tiers: each spelling once. */
#include "state.h"

#include <stddef.h>

const char *fso_kind_name(int kind)
{
    static const char *const names[FSO_N_KINDS] = {"parameters", "master weights", "AdamW m",
                                                   "AdamW v", "gradients"};
    return kind >= 0 && kind < FSO_N_KINDS ? names[kind] : "?";
}

const char *fso_kind_key(int kind)
{
    static const char *const keys[FSO_N_KINDS] = {"parameters", "master", "m", "v", "gradients"};
    return kind >= 0 && kind < FSO_N_KINDS ? keys[kind] : "?";
}

const char *fso_kind_abbrev(int kind)
{
    static const char *const abbrevs[FSO_N_KINDS] = {"params", "master", "m", "v", "grads"};
    return kind >= 0 && kind < FSO_N_KINDS ? abbrevs[kind] : "?";
}

const char *fso_tier_name(int tier)
{
    static const char *const names[FSO_N_TIERS] = {"device", "host", "nvme"};
    return tier >= 0 && tier < FSO_N_TIERS ? names[tier] : "?";
}

void fso_residency_order(int n_blocks, int *order)
{
    if (n_blocks <= 0)
        return;
    int n = 0;
    order[n++] = 0;
    const int rest = n_blocks - 1; /* blocks 1 .. n_blocks - 1, spread */
    int bits = 0;
    while ((1 << bits) < rest)
        bits++;
    for (int i = 0; i < (1 << bits); i++) {
        int r = 0;
        for (int j = 0; j < bits; j++)
            if (i & (1 << j))
                r |= 1 << (bits - 1 - j);
        if (r < rest)
            order[n++] = 1 + r;
    }
}

int fso_residency_rank(int n_blocks, int b)
{
    if (b <= 0 || b >= n_blocks)
        return b <= 0 ? 0 : n_blocks;
    const int rest = n_blocks - 1, want = b - 1;
    int bits = 0;
    while ((1 << bits) < rest)
        bits++;
    int rank = 1;
    for (int i = 0; i < (1 << bits); i++) {
        int r = 0;
        for (int j = 0; j < bits; j++)
            if (i & (1 << j))
                r |= 1 << (bits - 1 - j);
        if (r == want)
            return rank;
        if (r < rest)
            rank++;
    }
    return n_blocks; /* not reached */
}

fso_tier fso_block_tier(const fso_block_rule *r, int kind, int b)
{
    if (kind == FSO_KIND_PARAM)
        return r->resident_blocks > 0 && fso_residency_rank(r->n_blocks, b) < r->resident_blocks
                   ? FSO_TIER_DEVICE
                   : r->tier[FSO_KIND_PARAM];
    const int S = r->device_state_blocks;
    if (S > 0 && (r->device_state_first ? b < S : b >= r->n_blocks - S))
        return FSO_TIER_DEVICE;
    const bool state = kind == FSO_KIND_MASTER || kind == FSO_KIND_M || kind == FSO_KIND_V;
    return state && r->tier[kind] == FSO_TIER_NVME && b < r->state_host_blocks ? FSO_TIER_HOST
                                                                              : r->tier[kind];
}

bool fso_block_rule_same(const fso_block_rule *a, const fso_block_rule *b)
{
    for (int k = 0; k < FSO_N_KINDS; k++)
        if (a->tier[k] != b->tier[k])
            return false;
    return a->n_blocks == b->n_blocks && a->resident_blocks == b->resident_blocks &&
           a->device_state_blocks == b->device_state_blocks &&
           a->device_state_first == b->device_state_first &&
           a->state_host_blocks == b->state_host_blocks;
}
