/* optpool.h — the optimizer's thread pool: a kernels/pool.h fso_pool whose
 * threads can be bound (hwloc) to the cores of one NUMA node, the node that
 * holds the optimizer state they update.
 *
 * Binding is best effort: where hwloc cannot bind threads (no support, a
 * cpuset that forbids it) fso_optpool_bind binds nothing, says so in its
 * return value, and prints nothing; the pool works the same, unbound.
 *
 * Nodes are named by the operating system's number (as numactl does).
 */
#ifndef FSO_OPTPOOL_H
#define FSO_OPTPOOL_H

#include <stdbool.h>
#include <stddef.h>

#include "pool.h"

typedef struct fso_optpool fso_optpool;

/* threads >= 1 (the calling thread counts as one). 0 or -errno. */
int fso_optpool_create(fso_optpool **out, int threads);
void fso_optpool_destroy(fso_optpool *op);

/* The pool to hand to fso_adamw_fused_mt and friends. */
fso_pool *fso_optpool_pool(const fso_optpool *op);
int fso_optpool_threads(const fso_optpool *op);

/* Number of NUMA nodes (1 on a machine without NUMA). */
int fso_optpool_nodes(const fso_optpool *op);

/* The node holding all pages of [addr, addr + len): its number, or -1 when
 * unknown (not touched yet, spread over nodes, or not supported). */
int fso_optpool_node_of(const fso_optpool *op, const void *addr, size_t len);

/* Bind the worker threads, and the calling thread too when include_caller
 * (the caller runs the first range of every loop), to the cores of NUMA node
 * `node`; node -1 binds them to every core the process may use. Returns how
 * many threads are now bound (0 where binding is not possible), or -EINVAL
 * when there is no such node. */
int fso_optpool_bind(fso_optpool *op, int node, bool include_caller);

#endif
