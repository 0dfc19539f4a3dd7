/* optpool.c — an fso_pool with hwloc thread binding (optpool.h). */
#include "optpool.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <hwloc.h>

struct fso_optpool {
    fso_pool *pool;
    int threads;
    hwloc_topology_t topo; /* NULL when hwloc could not load one */
    bool can_bind;
};

int fso_optpool_create(fso_optpool **out, int threads)
{
    fso_optpool *op = calloc(1, sizeof *op);
    if (!op)
        return -ENOMEM;
    int rc = fso_pool_create(&op->pool, threads);
    if (rc < 0) {
        free(op);
        return rc;
    }
    op->threads = fso_pool_threads(op->pool);
    if (hwloc_topology_init(&op->topo) == 0) {
        if (hwloc_topology_load(op->topo) == 0) {
            const struct hwloc_topology_support *s = hwloc_topology_get_support(op->topo);
            op->can_bind = s && s->cpubind && s->cpubind->set_thisthread_cpubind;
        } else {
            hwloc_topology_destroy(op->topo);
            op->topo = NULL;
        }
    } else {
        op->topo = NULL;
    }
    *out = op;
    return 0;
}

void fso_optpool_destroy(fso_optpool *op)
{
    if (!op)
        return;
    fso_pool_destroy(op->pool);
    if (op->topo)
        hwloc_topology_destroy(op->topo);
    free(op);
}

fso_pool *fso_optpool_pool(const fso_optpool *op)
{
    return op ? op->pool : NULL;
}

int fso_optpool_threads(const fso_optpool *op)
{
    return op ? op->threads : 1;
}

int fso_optpool_nodes(const fso_optpool *op)
{
    if (!op || !op->topo)
        return 1;
    int n = hwloc_get_nbobjs_by_type(op->topo, HWLOC_OBJ_NUMANODE);
    return n > 0 ? n : 1;
}

int fso_optpool_node_of(const fso_optpool *op, const void *addr, size_t len)
{
    if (!op || !op->topo || !addr || !len)
        return -1;
    hwloc_nodeset_t set = hwloc_bitmap_alloc();
    if (!set)
        return -1;
    int node = -1;
    if (hwloc_get_area_memlocation(op->topo, addr, len, set, HWLOC_MEMBIND_BYNODESET) == 0 &&
        hwloc_bitmap_weight(set) == 1)
        node = hwloc_bitmap_first(set);
    hwloc_bitmap_free(set);
    return node;
}

typedef struct bind_job {
    hwloc_topology_t topo;
    hwloc_const_cpuset_t set;
    bool include_caller;
    atomic_int bound;
} bind_job;

static void bind_one(void *ctx, int64_t begin, int64_t end, int worker)
{
    (void)begin, (void)end;
    bind_job *j = ctx;
    if (worker == 0 && !j->include_caller)
        return;
    if (hwloc_set_cpubind(j->topo, j->set, HWLOC_CPUBIND_THREAD) == 0)
        atomic_fetch_add(&j->bound, 1);
}

int fso_optpool_bind(fso_optpool *op, int node, bool include_caller)
{
    hwloc_const_cpuset_t set;
    if (node < -1)
        return -EINVAL;
    if (!op->topo)
        return node <= 0 ? 0 : -EINVAL; /* no topology: only "node 0" is known to exist */
    if (node >= 0) {
        hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(op->topo, (unsigned)node);
        if (!obj)
            return -EINVAL;
        set = obj->cpuset;
    } else {
        set = hwloc_topology_get_allowed_cpuset(op->topo);
    }
    if (!op->can_bind || !set || hwloc_bitmap_iszero(set))
        return 0;
    bind_job j = {.topo = op->topo, .set = set, .include_caller = include_caller};
    atomic_init(&j.bound, 0);
    /* n = threads, grain 1: range r runs on worker r, each exactly once. */
    fso_pool_for(op->pool, op->threads, 1, bind_one, &j);
    return atomic_load(&j.bound);
}
