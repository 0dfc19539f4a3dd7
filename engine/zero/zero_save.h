/* zero_save.h — private to engine/zero*.c (through zero_impl.h): the gate
 * between a save that streams the state out on the checkpoint's saver
 * thread and the updates that would change it (zero_save.c). */
#ifndef FSO_ZERO_SAVE_H
#define FSO_ZERO_SAVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "zero.h"
#include "zero_io.h"
#include "zero_lock.h"

typedef struct rank_state rank_state;

/* The save in progress: the state of step `step` streams out block by
 * block while training goes on; an update of a later step waits until the
 * saver is done with its block. */
typedef struct save_gate {
    zr_mutex mu;                 /* every field below */
    pthread_cond_t cv;           /* a block went out or the save ended: updates wait for
                                    done[b] or !active, a re-plan for !active */
    bool init;                   /* setup */
    bool active;                 /* armed, and not every block is done */
    int64_t step;                /* the saver reads it unlocked: armed before its thread
                                    starts */
    bool *done;                  /* [block] streamed out: a later update may change it */
    double *waited_ms;           /* [rank] updates waited for the saver, this save */
    double idle_waited_ms;       /* a re-plan waited for this save to stream out */
    zr_pinned stages;            /* the saver's staging buffers (the saver, one save at a
                                    time): copies out of a GPU are then asynchronous, not
                                    bounced through the driver's buffer */
} save_gate;

/* Before an update of step t changes block b on device rk: wait while a
 * save of an earlier step still needs the block. */
void zr_save_gate(rank_state *rk, int b, int64_t t);
/* Wait until no save is streaming (before state moves between tiers). */
void zr_save_wait_idle(fso_zero *z);
int zr_save_init(fso_zero *z);
void zr_save_free(fso_zero *z);

#endif
