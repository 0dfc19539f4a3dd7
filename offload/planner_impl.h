/* planner_impl.h — what the planner's parts share: planner.c (inputs and
 * sizes), planner_timeline.c (the step on the pipelined timeline) and
 * planner_search.c (choosing, explaining, re-planning). Private to
 * offload/planner*.c; everyone else uses planner.h.
 */
#ifndef FSO_PLANNER_IMPL_H
#define FSO_PLANNER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "footprint.h"
#include "planner.h"

/* planner.c */

/* 0, or -EINVAL for inputs out of the ranges planner.h gives. */
int pl_check_input(const fso_plan_input *in);
/* The engine's footprint rules on this machine's devices. */
fso_fp_rules pl_rules_of(const fso_plan_input *in);
/* Bytes of one shard of kind k of block b, as the engine allocates it. */
uint64_t pl_shard_bytes(const fso_plan_input *in, int b, int k);
/* Fills the memory fields of out (kind_bytes, activation_bytes,
 * buffer_bytes, need_bytes, have_bytes, short_tier, short_bytes, fits) as
 * the engine allocates for placement pl; returns out->fits. */
bool pl_size_placement(const fso_plan_input *in, const fso_placement *pl, fso_plan *out);

/* planner_timeline.c */

/* Lays out placement pl's steps and fills out's prediction (step_ms,
 * tokens_per_s, busy_ms, critical_ms, bottleneck, stall_ms); with trace,
 * prints the predicted step's events there. 0 or -ENOMEM; the inputs are
 * checked already (pl_check_input). */
int pl_simulate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out, FILE *trace);

#endif
