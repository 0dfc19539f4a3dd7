/* state.c — the names of state.h's kinds and tiers: each spelling once. */
#include "state.h"

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
