/* planner_search.c — choosing a placement (planner.h): the candidates
 * enumerated in a fixed order (next_candidate), each sized and predicted
 * (evaluate_candidate), the pick among those that fit (pick_candidate);
 * what the next faster tier would do with each kind (fso_plan_explain);
 * re-planning from measured steps (fso_plan_replan).
 *
 * Contract: every candidate keeps the pins; the one chosen fits every tier,
 * or, when none fits, the result is -ENOSPC with the candidate closest to
 * fitting. Among equals the first in enumeration order wins, so the order
 * of the CHOICE_* levels is part of the result.
 */
#include "planner_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ search */

/* One placement the search considers: the choices it enumerates
 * (next_candidate) and the residency filled into the memory they leave
 * (fill_resident, fill_host_state). */
typedef struct cand {
    int param_tier;       /* tier of the parameter blocks not kept on the device (of every
                             block when !per_block_tiers); FSO_TIER_DEVICE: all on the device */
    int device_params;    /* parameter blocks kept on the device, the first of state.h's
                             fso_residency_order (per-block mode) */
    int device_state;     /* blocks whose optimizer state and gradients stay on the device,
                             updated there (per-block mode; which ones: state_block) */
    bool device_state_from_first; /* device_state counts from block 0 up, else from the last
                             block down (state_block) */
    bool state_residency_first; /* fill_resident gives the device's room to device_state
                             before device_params */
    int host_state;       /* blocks from the first whose state kinds on NVMe stay on the host
                             (engine.state_host_blocks) */
    int state_tier[3];    /* master, m, v tiers */
    int grad_tier;        /* gradient tier */
    bool whole_copy;      /* blocks copied whole to every device instead of gathered */
    int prefetch;         /* visits read ahead of compute */
    double step_ms;       /* the predicted step (candidates that fit) */
    int tier_sum;         /* the tiers chosen, summed: lower is higher tiers (tie-break) */
    int prefetch_key;     /* the prefetch depth where it matters (parameters on NVMe), else 0 */
} cand;

/* The i-th block to keep its optimizer state on the device, from the last
 * block down (the CPU updates first what the next forward needs first) or
 * from block 0 up (the device's quick updates let the forward start at
 * once): the search tries both. */
static int state_block(const fso_plan_input *in, const cand *c, int i)
{
    return c->device_state_from_first ? i : in->model.n_blocks - 1 - i;
}

/* Whether block b is among c's blocks whose state is on the device. */
static bool device_state_at(const fso_plan_input *in, const cand *c, int b)
{
    const int nb = in->model.n_blocks;
    return c->device_state > 0 &&
           (c->device_state_from_first ? b < c->device_state : b >= nb - c->device_state);
}

static void build_placement(const fso_plan_input *in, const cand *c, const int *order,
                            fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    fso_placement_uniform(pl, nb, c->param_tier, c->state_tier[0], c->grad_tier, c->prefetch);
    pl->acts = in->pins.acts == FSO_TIER_HOST ? FSO_TIER_HOST : FSO_TIER_DEVICE; /* choose_acts */
    for (int b = 0; b < nb; b++) {
        pl->tier[FSO_KIND_M][b] = (uint8_t)c->state_tier[1];
        pl->tier[FSO_KIND_V][b] = (uint8_t)c->state_tier[2];
        pl->whole_copy[b] = c->whole_copy;
    }
    for (int i = 0; i < c->device_params && i < nb; i++)
        pl->tier[FSO_KIND_PARAM][order[i]] = FSO_TIER_DEVICE;
    for (int i = 0; i < c->device_state && i < nb; i++)
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            pl->tier[k][state_block(in, c, i)] = FSO_TIER_DEVICE;
    /* NVMe state of the first blocks on the host, where the device does not
     * hold it (the device state comes first, as in fso_block_tier) */
    for (int b = 0; b < c->host_state && b < nb; b++)
        for (int i = 0; i < 3; i++)
            if (c->state_tier[i] == FSO_TIER_NVME && !device_state_at(in, c, b))
                pl->tier[FSO_KIND_MASTER + i][b] = FSO_TIER_HOST;
}

/* engine.state_host_blocks: the host memory a placement leaves, filled
 * from block 0 up with the blocks' state kinds that are on NVMe, all but
 * the last block; none where a pin names the state's tier. */
static void fill_host_state(const fso_plan_input *in, cand *c, const int *order, fso_plan *tmp,
                            fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    const uint64_t W = (uint64_t)in->machine.devices;
    c->host_state = 0;
    if (!in->engine.state_host_blocks ||
        (c->state_tier[0] != FSO_TIER_NVME && c->state_tier[1] != FSO_TIER_NVME &&
         c->state_tier[2] != FSO_TIER_NVME))
        return;
    for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++)
        if (in->pins.tier[k] >= 0)
            return;
    build_placement(in, c, order, pl);
    if (!pl_size_placement(in, pl, tmp))
        return;
    uint64_t room = tmp->have_bytes[FSO_TIER_HOST] - tmp->need_bytes[FSO_TIER_HOST];
    while (c->host_state < nb - 1) {
        uint64_t add = 0;
        for (int i = 0; i < 3 && !device_state_at(in, c, c->host_state); i++)
            if (c->state_tier[i] == FSO_TIER_NVME)
                add += pl_shard_bytes(in, c->host_state, FSO_KIND_MASTER + i) * W;
        if (add > room)
            break;
        room -= add;
        c->host_state++;
    }
}

static bool tier_ok(const fso_plan_input *in, int t)
{
    return t != FSO_TIER_NVME || in->machine.nvme_free_bytes > 0;
}

static bool pin_ok(const fso_plan_input *in, int k, int t)
{
    return in->pins.tier[k] < 0 || in->pins.tier[k] == t;
}

/* Per-block mode: fill the device memory left after the uniform choices
 * with parameter blocks (in residency order) and with blocks whose optimizer
 * state and gradients stay on the device (state_block order), one kind of
 * residency first (c->state_residency_first), then the other. A count the
 * pins give is taken as it is, and the other fills what it leaves; a kind
 * whose tier is pinned and whose count is not stays on its tier whole. */
static void fill_resident(const fso_plan_input *in, cand *c, const int *order, fso_plan *tmp,
                          fso_placement *pl)
{
    const int nb = in->model.n_blocks;
    const fso_plan_pins *pin = &in->pins;
    const bool state_first = c->state_residency_first;
    const bool params_free = pin->tier[FSO_KIND_PARAM] < 0 && pin->resident_blocks < 0 &&
                             c->param_tier != FSO_TIER_DEVICE;
    bool state_free = c->state_tier[0] != FSO_TIER_DEVICE ||
                      c->state_tier[1] != FSO_TIER_DEVICE ||
                      c->state_tier[2] != FSO_TIER_DEVICE || c->grad_tier != FSO_TIER_DEVICE;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        state_free = state_free && pin->tier[k] < 0;
    state_free = state_free && pin->device_state_blocks < 0;
    c->device_params = c->param_tier == FSO_TIER_DEVICE ? nb : 0;
    c->device_state = 0;
    if (!in->engine.per_block_tiers)
        return;
    if (pin->resident_blocks >= 0 && c->param_tier != FSO_TIER_DEVICE)
        c->device_params = pin->resident_blocks < nb ? pin->resident_blocks : nb;
    if (pin->device_state_blocks >= 0)
        c->device_state = pin->device_state_blocks < nb ? pin->device_state_blocks : nb;
    build_placement(in, c, order, pl);
    pl_size_placement(in, pl, tmp);
    int64_t room = (int64_t)tmp->have_bytes[FSO_TIER_DEVICE] - (int64_t)tmp->need_bytes[FSO_TIER_DEVICE];
    for (int pass = 0; pass < 2; pass++) {
        bool state = (pass == 0) == state_first;
        if (state && state_free) {
            while (c->device_state < nb) {
                int64_t add = 0;
                for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++) {
                    int t = k == FSO_KIND_GRAD ? c->grad_tier
                                               : c->state_tier[k - FSO_KIND_MASTER];
                    if (t != FSO_TIER_DEVICE)
                        add += (int64_t)pl_shard_bytes(in, state_block(in, c, c->device_state), k);
                }
                if (add > room)
                    break;
                room -= add;
                c->device_state++;
            }
        } else if (!state && params_free) {
            while (c->device_params < nb) {
                int64_t add = (int64_t)pl_shard_bytes(in, order[c->device_params], FSO_KIND_PARAM);
                if (add > room)
                    break;
                room -= add;
                c->device_params++;
            }
        }
    }
}

/* The choices a candidate is made of, outermost first: candidates come in
 * the order these would as nested loops, the innermost varying fastest
 * (among equals the tie-break keeps the first). */
enum {
    CHOICE_PARAM_TIER,  /* cand.param_tier */
    CHOICE_MASTER_TIER, /* cand.state_tier[0] */
    CHOICE_M_TIER,      /* cand.state_tier[1]: the master's tier or a slower one */
    CHOICE_V_TIER,      /* cand.state_tier[2]: m's tier or a slower one */
    CHOICE_GRAD_TIER,   /* cand.grad_tier */
    CHOICE_WHOLE_COPY,  /* cand.whole_copy: 0 gathers, 1 whole copies */
    CHOICE_PREFETCH,    /* cand.prefetch */
    CHOICE_FILL,        /* bit 0: cand.state_residency_first; bit 1:
                           cand.device_state_from_first */
    N_CHOICES,
};

/* Where the enumeration of candidates stands. */
typedef struct cand_iter {
    int at[N_CHOICES];    /* the value of each choice */
    int max_prefetch;     /* the deepest prefetch tried where the depth matters */
    int default_prefetch; /* the depth where it does not, or the pinned one */
    bool started;         /* at[] holds a candidate */
} cand_iter;

static void cand_iter_start(const fso_plan_input *in, cand_iter *it)
{
    memset(it, 0, sizeof *it);
    int max_pf = FSO_FP_MAX_PREFETCH < FSO_PLAN_MAX_PREFETCH ? FSO_FP_MAX_PREFETCH
                                                             : FSO_PLAN_MAX_PREFETCH;
    if (max_pf > 8)
        max_pf = 8; /* deeper rarely pays; a pin may still ask for more */
    it->max_prefetch = max_pf;
    it->default_prefetch = in->pins.prefetch >= 0 ? in->pins.prefetch : 2 <= max_pf ? 2 : max_pf;
}

/* The prefetch depth is searched only where it matters (parameters on
 * NVMe) and is not pinned. */
static bool prefetch_searched(const fso_plan_input *in, const cand_iter *it)
{
    return in->pins.prefetch < 0 && it->at[CHOICE_PARAM_TIER] == FSO_TIER_NVME;
}

/* The first and the last value of choice l, given the choices before it. */
static int choice_first(const fso_plan_input *in, const cand_iter *it, int l)
{
    switch (l) {
    case CHOICE_M_TIER:
        return it->at[CHOICE_MASTER_TIER];
    case CHOICE_V_TIER:
        return it->at[CHOICE_M_TIER];
    case CHOICE_PREFETCH:
        return prefetch_searched(in, it) ? 0 : it->default_prefetch;
    default:
        return 0;
    }
}

static int choice_last(const fso_plan_input *in, const cand_iter *it, int l)
{
    switch (l) {
    case CHOICE_WHOLE_COPY:
        return 1;
    case CHOICE_PREFETCH:
        return prefetch_searched(in, it) ? it->max_prefetch : it->default_prefetch;
    case CHOICE_FILL:
        return in->engine.per_block_tiers ? 3 : 0;
    default:
        return FSO_N_TIERS - 1;
    }
}

/* Whether the engine, the machine and the pins allow the choices. */
static bool choices_allowed(const fso_plan_input *in, const cand_iter *it)
{
    const int *at = it->at;
    const int pt = at[CHOICE_PARAM_TIER], g = at[CHOICE_GRAD_TIER];
    if (!tier_ok(in, pt) || !pin_ok(in, FSO_KIND_PARAM, pt))
        return false;
    if (!tier_ok(in, g) || !pin_ok(in, FSO_KIND_GRAD, g))
        return false;
    for (int i = 0; i < 3; i++)
        if (!tier_ok(in, at[CHOICE_MASTER_TIER + i]) ||
            !pin_ok(in, FSO_KIND_MASTER + i, at[CHOICE_MASTER_TIER + i]))
            return false;
    /* pinned counts: fewer resident parameter blocks than all of them need
     * a tier to stream the others from, fewer device-state blocks a kind of
     * state off the device; the pinned direction only */
    const fso_plan_pins *pin = &in->pins;
    const int nb = in->model.n_blocks;
    if (pin->resident_blocks >= 0 && pin->resident_blocks < nb && pt == FSO_TIER_DEVICE)
        return false;
    if (pin->device_state_blocks >= 0 && pin->device_state_blocks < nb &&
        at[CHOICE_MASTER_TIER] == FSO_TIER_DEVICE && at[CHOICE_M_TIER] == FSO_TIER_DEVICE &&
        at[CHOICE_V_TIER] == FSO_TIER_DEVICE && g == FSO_TIER_DEVICE)
        return false;
    if (in->engine.per_block_tiers && pin->device_state_first >= 0 &&
        (at[CHOICE_FILL] >= 2) != (pin->device_state_first > 0))
        return false;
    /* whole-block copies: where the engine makes them (streamed blocks on
     * more than one device it cannot address), as pinned, else the search's
     * choice from host memory only (from NVMe every device would read every
     * device's shard, unprefetched) */
    const bool wc_applies = in->engine.whole_copy && in->machine.devices > 1 &&
                            pt != FSO_TIER_DEVICE;
    if (!wc_applies)
        return !at[CHOICE_WHOLE_COPY];
    if (pin->whole_copy >= 0)
        return at[CHOICE_WHOLE_COPY] == pin->whole_copy;
    return !at[CHOICE_WHOLE_COPY] || pt == FSO_TIER_HOST;
}

/* Steps it to the next allowed choices and fills c with them (residency
 * not yet filled: fill_resident, fill_host_state). false when none is
 * left. */
static bool next_candidate(const fso_plan_input *in, cand_iter *it, cand *c)
{
    do {
        int l = 0;
        if (it->started) {
            for (l = N_CHOICES - 1; l >= 0 && it->at[l] >= choice_last(in, it, l); l--)
                ;
            if (l < 0)
                return false;
            it->at[l++]++;
        }
        it->started = true;
        for (; l < N_CHOICES; l++)
            it->at[l] = choice_first(in, it, l);
    } while (!choices_allowed(in, it));
    const int *at = it->at;
    *c = (cand){.param_tier = at[CHOICE_PARAM_TIER],
                .state_tier = {at[CHOICE_MASTER_TIER], at[CHOICE_M_TIER], at[CHOICE_V_TIER]},
                .grad_tier = at[CHOICE_GRAD_TIER],
                .whole_copy = at[CHOICE_WHOLE_COPY] != 0,
                .prefetch = at[CHOICE_PREFETCH],
                .state_residency_first = (at[CHOICE_FILL] & 1) != 0,
                .device_state_from_first = at[CHOICE_FILL] >= 2};
    c->tier_sum = c->param_tier + c->state_tier[0] + c->state_tier[1] + c->state_tier[2] +
                  c->grad_tier;
    c->prefetch_key = c->param_tier == FSO_TIER_NVME ? c->prefetch : 0;
    return true;
}

/* What the search keeps while it runs. */
typedef struct plan_search {
    const fso_plan_input *in;
    int *order;             /* (n_blocks) state.h's fso_residency_order */
    fso_plan *tmp;          /* sizes and prediction of the candidate at hand */
    fso_placement *pl;      /* the candidate at hand */
    cand *fit;              /* the candidates that fit, in enumeration order */
    size_t n_fit, cap_fit;
    cand closest;           /* of those that do not fit, the first least short */
    uint64_t closest_short; /* its shortfall; UINT64_MAX: none seen */
    int evaluated;          /* candidates predicted */
    fso_plan_search stats;  /* what was searched (planner.h) */
} plan_search;

/* The sized candidate in sr->tmp into the search's counts. */
static void count_candidate(plan_search *sr)
{
    const fso_plan *t = sr->tmp;
    fso_plan_search *st = &sr->stats;
    st->considered++;
    for (int k = 0; k < FSO_N_TIERS; k++) {
        if (t->fits) {
            if (st->fit == 0 || t->need_bytes[k] < st->least_need[k])
                st->least_need[k] = t->need_bytes[k];
        } else if (t->need_bytes[k] > t->have_bytes[k]) {
            const uint64_t by = t->need_bytes[k] - t->have_bytes[k];
            if (st->short_on[k]++ == 0 || by < st->least_short[k])
                st->least_short[k] = by;
        }
    }
    st->fit += t->fits;
}

/* Fills candidate c's residency, sizes it and, when it fits, predicts its
 * step and keeps it in sr->fit (else in sr->closest when closer to
 * fitting). 0, or an error. */
static int evaluate_candidate(plan_search *sr, cand c)
{
    const fso_plan_input *in = sr->in;
    fill_resident(in, &c, sr->order, sr->tmp, sr->pl);
    if (c.device_state_from_first && c.device_state == 0 && in->pins.device_state_first < 0)
        return 0; /* the same as counting from the last block */
    fill_host_state(in, &c, sr->order, sr->tmp, sr->pl);
    build_placement(in, &c, sr->order, sr->pl);
    const bool fits = pl_size_placement(in, sr->pl, sr->tmp);
    count_candidate(sr);
    if (!fits) {
        if (sr->tmp->short_bytes < sr->closest_short) {
            sr->closest_short = sr->tmp->short_bytes;
            sr->closest = c;
        }
        return 0;
    }
    int rc = pl_simulate(in, sr->pl, sr->tmp, NULL);
    if (rc < 0)
        return rc;
    sr->evaluated++;
    c.step_ms = sr->tmp->step_ms;
    if (sr->n_fit == sr->cap_fit) {
        cand *n2 = realloc(sr->fit, sizeof(cand) * sr->cap_fit * 2);
        if (!n2)
            return -ENOMEM;
        sr->fit = n2;
        sr->cap_fit *= 2;
    }
    sr->fit[sr->n_fit++] = c;
    return 0;
}

/* Of the ncand candidates that fit, the one to take: the least predicted
 * step; among those within PICK_TIE of it, the shallower prefetch, then the
 * higher tiers, then the faster; of equals the first. The probed rates a
 * prediction rests on move by several percent from one probe to the next
 * (a shared disk, a timing of a layer), so a lower tier must win by more
 * than that to be taken: else the choice (at 2.28B on two CPU devices,
 * parameters on NVMe or in the host arena) flips with the probe. */
#define PICK_TIE 1.05
static size_t pick_candidate(const cand *cands, size_t ncand)
{
    double best = INFINITY;
    for (size_t i = 0; i < ncand; i++)
        if (cands[i].step_ms < best)
            best = cands[i].step_ms;
    size_t pick = 0;
    bool have = false;
    for (size_t i = 0; i < ncand; i++) {
        const cand *c = &cands[i];
        if (c->step_ms > best * PICK_TIE + 1e-9)
            continue;
        if (!have) {
            pick = i;
            have = true;
            continue;
        }
        const cand *p = &cands[pick];
        /* shallower prefetch, then higher tiers, then faster */
        if (c->prefetch_key < p->prefetch_key ||
            (c->prefetch_key == p->prefetch_key &&
             (c->tier_sum < p->tier_sum ||
              (c->tier_sum == p->tier_sum && c->step_ms < p->step_ms))))
            pick = i;
    }
    return pick;
}

/* No candidate fits: out is the one closest to fitting, or where the pins
 * left none, every kind on the host but pinned parameters. -ENOSPC, or an
 * error. */
static int choose_closest(const plan_search *sr, int default_prefetch, fso_plan *out)
{
    const fso_plan_input *in = sr->in;
    if (sr->closest_short == UINT64_MAX) { /* nothing even considered: pins exclude all */
        fso_placement_uniform(sr->pl, in->model.n_blocks, in->pins.tier[FSO_KIND_PARAM] >= 0
                                  ? in->pins.tier[FSO_KIND_PARAM] : FSO_TIER_HOST,
                              FSO_TIER_HOST, FSO_TIER_HOST, default_prefetch);
    } else {
        build_placement(in, &sr->closest, sr->order, sr->pl);
    }
    int rc = fso_plan_evaluate(in, sr->pl, out);
    if (rc == 0) /* cannot happen: it did not fit above */
        rc = -ENOSPC;
    out->evaluated = sr->evaluated;
    out->search = sr->stats;
    return rc;
}

/* The search with the kept activations on in->pins.acts's tier (the
 * device when free): fso_plan_choose's, one tier at a time. */
static int choose_on(const fso_plan_input *in, fso_plan *out)
{
    int rc = pl_check_input(in);
    if (rc < 0)
        return rc;
    plan_search sr = {.in = in, .cap_fit = 256, .closest_short = UINT64_MAX};
    cand_iter it;
    cand c;
    sr.order = malloc(sizeof(int) * (size_t)in->model.n_blocks);
    sr.tmp = malloc(sizeof *sr.tmp);
    sr.pl = malloc(sizeof *sr.pl);
    sr.fit = malloc(sizeof(cand) * sr.cap_fit);
    if (!sr.order || !sr.tmp || !sr.pl || !sr.fit) {
        rc = -ENOMEM;
        goto out;
    }
    /* the engine keeps parameters resident by this order (state.h): a plan
     * in any other could not be written as a configuration */
    fso_residency_order(in->model.n_blocks, sr.order);

    cand_iter_start(in, &it);
    while (next_candidate(in, &it, &c))
        if ((rc = evaluate_candidate(&sr, c)) < 0)
            goto out;
    if (sr.n_fit == 0) {
        rc = choose_closest(&sr, it.default_prefetch, out);
        goto out;
    }
    build_placement(in, &sr.fit[pick_candidate(sr.fit, sr.n_fit)], sr.order, sr.pl);
    rc = fso_plan_evaluate(in, sr.pl, out);
    out->evaluated = sr.evaluated;
    out->search = sr.stats;
    if (rc == 0)
        rc = fso_plan_explain(in, out);
out:
    free(sr.order);
    free(sr.tmp);
    free(sr.pl);
    free(sr.fit);
    return rc;
}

/* The kept activations' tier: the pin; else the device, unless only the
 * host fits, or the host frees room for a placement faster by more than 1%
 * (the tie rule of pick_candidate). out->acts_* say why. */
int fso_plan_choose(const fso_plan_input *in, fso_plan *out)
{
    if (in->pins.acts >= 0 || !in->model.act_kept_bytes) {
        int rc = choose_on(in, out);
        out->acts_pinned = in->pins.acts >= 0;
        out->acts_alt = -1;
        return rc;
    }
    fso_plan_input on = *in;
    fso_plan *alt = malloc(sizeof *alt);
    if (!alt)
        return -ENOMEM;
    on.pins.acts = FSO_TIER_DEVICE;
    int rd = choose_on(&on, out);
    on.pins.acts = FSO_TIER_HOST;
    int rh = rd == 0 || rd == -ENOSPC ? choose_on(&on, alt) : rd;
    if (rh < 0 && rh != -ENOSPC) {
        free(alt);
        return rh;
    }
    const bool host = (rh == 0 && (rd != 0 || alt->step_ms < 0.99 * out->step_ms)) ||
                      (rh != 0 && rd != 0 && alt->short_bytes < out->short_bytes);
    if (host) {
        fso_plan t = *out;
        *out = *alt;
        *alt = t;
        int r = rd;
        rd = rh;
        rh = r;
    }
    out->acts_pinned = false;
    out->acts_alt = alt->pl.acts;
    out->acts_alt_fits = rh == 0;
    out->acts_short_tier = alt->short_tier;
    out->acts_short_bytes = alt->short_bytes;
    out->acts_alt_ms = alt->step_ms;
    free(alt);
    return rd;
}

/* ------------------------------------------------------------------ re-planning */

/* Per block: a copy of in's visits in which each block's visits take the
 * compute time measured on them (what a visit costs differs between the
 * embedding, the layers and the head, and from what FLOPs alone say), and
 * the compute over the measured blocks as in predicted it (*pred_all) and
 * as measured (*meas_all). NULL (nothing to free) when meas has no time
 * for any block of in. */
static fso_plan_visit *measured_block_visits(const fso_plan_input *in,
                                             const fso_plan_measured *meas, double *pred_all,
                                             double *meas_all)
{
    const fso_plan_machine *mc = &in->machine;
    fso_plan_visit *visits = NULL;
    bool per_block = false;
    if (meas->block_compute_ms && meas->n_blocks == in->model.n_blocks &&
        (visits = malloc(sizeof *visits * (size_t)in->model.n_visits))) {
        memcpy(visits, in->model.visits, sizeof *visits * (size_t)in->model.n_visits);
        for (int b = 0; b < in->model.n_blocks; b++) {
            double pred = 0;
            for (int k = 0; k < in->model.n_visits; k++)
                if (visits[k].block == b)
                    pred += visits[k].flops / (mc->device_gflops * 1e6) * in->model.grad_accum;
            double got = meas->block_compute_ms[b];
            if (pred <= 0 || got <= 0)
                continue;
            for (int k = 0; k < in->model.n_visits; k++)
                if (visits[k].block == b)
                    visits[k].flops *= got / pred;
            *pred_all += pred;
            *meas_all += got;
            per_block = true;
        }
    }
    if (!per_block) {
        free(visits);
        visits = NULL;
    }
    return visits;
}

int fso_plan_replan(const fso_plan_input *in, const fso_plan *cur, const fso_plan_measured *meas,
                    fso_plan *out, fso_plan_machine *corrected, char *msg, size_t msglen)
{
    if (!meas || meas->step_ms <= 0 || cur->step_ms <= 0)
        return -EINVAL;
    double ratio = meas->step_ms / cur->step_ms;
    if (msglen)
        msg[0] = 0;
    if (fabs(ratio - 1.0) <= 0.20) {
        *out = *cur;
        if (corrected)
            *corrected = in->machine;
        return 0;
    }
    fso_plan_input x = *in;
    fso_plan_machine *mc = &x.machine;
    char what[256] = "";
    size_t wl = 0;
#define NOTE(...)                                                                          \
    do {                                                                                   \
        if (wl < sizeof what)                                                              \
            wl += (size_t)snprintf(what + wl, sizeof what - wl, __VA_ARGS__);              \
    } while (0)
    if (meas->nvme_read_gbps > 0 && cur->busy_ms[FSO_STREAM_NVME_READ] > 0) {
        NOTE("%sNVMe reads ran at %.2f GB/s (assumed %.2f)", wl ? "; " : "",
             meas->nvme_read_gbps, mc->nvme_read_gbps);
        mc->nvme_read_gbps = meas->nvme_read_gbps;
    }
    if (meas->nvme_write_gbps > 0 && cur->busy_ms[FSO_STREAM_NVME_WRITE] > 0) {
        NOTE("%sNVMe writes ran at %.2f GB/s (assumed %.2f)", wl ? "; " : "",
             meas->nvme_write_gbps, mc->nvme_write_gbps);
        mc->nvme_write_gbps = meas->nvme_write_gbps;
    }
    if (meas->optimizer_ms > 0 && cur->busy_ms[FSO_STREAM_OPTIM] > 0) {
        double f = cur->busy_ms[FSO_STREAM_OPTIM] / meas->optimizer_ms;
        if (fabs(f - 1) > 0.1) {
            NOTE("%sAdamW ran at %.2f Gelem/s (assumed %.2f)", wl ? "; " : "",
                 mc->adam_gelems * f, mc->adam_gelems);
            mc->adam_gelems *= f;
        }
    }
    double pred_all = 0, meas_all = 0;
    fso_plan_visit *visits = measured_block_visits(&x, meas, &pred_all, &meas_all);
    const bool per_block = visits != NULL;
    if (per_block) {
        x.model.visits = visits;
        /* on CPU devices the blocks' measured compute holds the cores' NVMe
         * work already (planner.h nvme_*_cpu_s_per_gb): not added again */
        if (mc->cpu_devices)
            mc->nvme_read_cpu_s_per_gb = mc->nvme_write_cpu_s_per_gb = 0;
        if (fabs(meas_all / pred_all - 1) > 0.1)
            NOTE("%scompute took %.0f ms per step over the blocks (assumed %.0f)",
                 wl ? "; " : "", meas_all, pred_all);
    }
    if (!per_block && meas->compute_ms > 0 && cur->busy_ms[FSO_STREAM_COMPUTE] > 0) {
        double f = cur->busy_ms[FSO_STREAM_COMPUTE] / meas->compute_ms;
        if (fabs(f - 1) > 0.1) {
            NOTE("%scompute ran at %.0f GFLOP/s (assumed %.0f)", wl ? "; " : "",
                 mc->device_gflops * f, mc->device_gflops);
            mc->device_gflops *= f;
        }
    }
    /* What the named corrections do not explain: scale every rate alike. */
    fso_plan *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        free(visits);
        return -ENOMEM;
    }
    int rc = fso_plan_evaluate(&x, &cur->pl, tmp);
    if (rc < 0 && rc != -ENOSPC) {
        free(tmp);
        free(visits);
        return rc;
    }
    double rest = meas->step_ms / tmp->step_ms;
    if (fabs(rest - 1) > 0.05) {
        NOTE("%sthe rest ran %.2fx %s than assumed", wl ? "; " : "", rest > 1 ? rest : 1 / rest,
             rest > 1 ? "slower" : "faster");
        mc->nvme_read_gbps /= rest;
        mc->nvme_write_gbps /= rest;
        mc->nvme_read_lat_ms *= rest;
        mc->nvme_write_lat_ms *= rest;
        mc->h2d_gbps /= rest;
        mc->d2h_gbps /= rest;
        mc->coll_gbps /= rest;
        mc->device_gflops /= rest;
        mc->adam_gelems /= rest;
        mc->device_adam_gelems /= rest;
        mc->host_copy_gbps /= rest;
    }
#undef NOTE
    free(tmp);
    rc = fso_plan_choose(&x, out);
    free(visits);
    if (rc < 0 && rc != -ENOSPC)
        return rc;
    if (corrected)
        *corrected = x.machine;
    char was[256], now[256];
    fso_plan_describe(cur, was, sizeof was);
    fso_plan_describe(out, now, sizeof now);
    snprintf(msg, msglen,
             "plan: measured %.0f ms/step, predicted %.0f ms (%+.0f%%): %s; re-planned: %s%s, "
             "predicted %.0f ms/step",
             meas->step_ms, cur->step_ms, (ratio - 1) * 100, what[0] ? what : "rates corrected",
             strcmp(was, now) == 0 ? "placement unchanged: " : "", now, out->step_ms);
    return 1;
}

/* ------------------------------------------------------------------ reasons */

/* The fastest tier kind k's blocks use, and how many blocks sit there
 * when they sit on more than one tier (0 when one). */
static int split_of(const fso_plan *p, int k, int *top)
{
    int count[FSO_N_TIERS] = {0}, used = 0;
    for (int b = 0; b < p->pl.n_blocks; b++)
        count[p->pl.tier[k][b]]++;
    *top = -1;
    for (int t = FSO_N_TIERS - 1; t >= 0; t--)
        if (count[t]) {
            used++;
            *top = t;
        }
    return used > 1 ? count[*top] : 0;
}

int fso_plan_explain(const fso_plan_input *in, fso_plan *p)
{
    fso_placement *pl = malloc(sizeof *pl);
    fso_plan *alt = malloc(sizeof *alt);
    if (!pl || !alt) {
        free(pl);
        free(alt);
        return -ENOMEM;
    }
    for (int k = 0; k < FSO_N_KINDS; k++) {
        fso_plan_reason *r = &p->why[k];
        int top;
        memset(r, 0, sizeof *r);
        r->tier = fso_plan_main_tier(p, k);
        r->pinned = in->pins.tier[k] >= 0 && in->pins.tier[k] == r->tier;
        r->alt_tier = r->tier - 1;
        r->short_tier = -1;
        /* split over tiers: why the rest is not on the fastest one too */
        r->split = fso_plan_state_host_blocks(p, k) ? 0 : split_of(p, k, &top);
        if (r->split)
            r->alt_tier = top;
        if (r->pinned || r->alt_tier < 0)
            continue;
        *pl = p->pl;
        for (int b = 0; b < pl->n_blocks; b++)
            pl->tier[k][b] = (uint8_t)r->alt_tier;
        int rc = fso_plan_evaluate(in, pl, alt);
        if (rc < 0 && rc != -ENOSPC) {
            free(pl);
            free(alt);
            return rc;
        }
        r->alt_fits = rc == 0;
        r->short_tier = alt->short_tier;
        r->short_bytes = alt->short_bytes;
        r->alt_step_ms = alt->step_ms;
    }
    p->explained = true;
    free(pl);
    free(alt);
    return 0;
}
