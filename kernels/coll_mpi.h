/* coll_mpi.h — what an MPI rail (coll_mpi.c, coll.h's fso_coll_create_mpi)
 * asks of its owner when a box keeps it waiting.
 *
 * A rail's ranks are the boxes (engine/boxes.h). When a call times out the
 * rail knows which boxes it still waits for, not what they were doing: the
 * owner of the boxes' heartbeats does, and registers here a function that
 * writes one line about a box ("box 1 (host h): no heartbeat for 31 s;
 * last: step 12, reduce-scatter of block 3"). Without one, the line names
 * the box alone. Set once, before the rails are made.
 */
#ifndef FSO_COLL_MPI_H
#define FSO_COLL_MPI_H

#include <stddef.h>

#include "coll.h"

typedef void (*fso_coll_mpi_describe_fn)(int box, char *buf, size_t len);
void fso_coll_mpi_set_describe(fso_coll_mpi_describe_fn fn);

/* Change an MPI rail's timeout (comm.timeout_s read after the rail was
 * made); between calls, from the thread that uses the rail. */
void fso_coll_mpi_set_timeout(fso_coll *c, double timeout_s);

#endif
