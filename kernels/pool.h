/* pool.h — a persistent pool of worker threads for data-parallel loops.
 *
 * fso_pool_for(pool, n, grain, fn, ctx) splits [0, n) into at most
 * `threads` contiguous ranges of at least `grain` items, calls fn(ctx, begin,
 * end, worker) once per range (the calling thread takes the first), and
 * returns when all are done. The split depends only on n, grain and the
 * thread count, so a loop whose ranges write disjoint outputs gives the same
 * bits on every run.
 *
 * Idle workers spin briefly, then sleep on a futex: the pool does not steal
 * cores from OpenBLAS's threads or from other processes between loops.
 */
#ifndef FSO_POOL_H
#define FSO_POOL_H

#include <stdint.h>

typedef struct fso_pool fso_pool;
typedef void (*fso_pool_fn)(void *ctx, int64_t begin, int64_t end, int worker);

/* threads >= 1 (1: no workers, loops run in the caller). 0 or -errno. */
int fso_pool_create(fso_pool **out, int threads);
void fso_pool_destroy(fso_pool *pool);
int fso_pool_threads(const fso_pool *pool);
void fso_pool_for(fso_pool *pool, int64_t n, int64_t grain, fso_pool_fn fn, void *ctx);

#endif
