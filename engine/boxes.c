/* boxes.c — placeholder until the MPI transport lands (boxes.h): one box. */
#include "boxes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

void fso_boxes_phase(const char *what, int64_t step, int block)
{
    (void)what;
    (void)step;
    (void)block;
}
int fso_boxes_count(void) { return 1; }
int fso_boxes_self(void) { return 0; }
const char *fso_boxes_host(int box) { (void)box; return "localhost"; }
int fso_boxes_sum(const char *what, double *v, int n, char *err, size_t errlen)
{
    (void)what; (void)v; (void)n; (void)err; (void)errlen;
    return 0;
}
int fso_boxes_bcast(const char *what, void *buf, size_t len, char *err, size_t errlen)
{
    (void)what; (void)buf; (void)len; (void)err; (void)errlen;
    return 0;
}
int fso_boxes_barrier(const char *what, char *err, size_t errlen)
{
    (void)what; (void)err; (void)errlen;
    return 0;
}
int fso_boxes_check_build(char *err, size_t errlen) { (void)err; (void)errlen; return 0; }
int fso_boxes_check_bytes(const char *what, const void *buf, size_t len, char *err,
                          size_t errlen)
{ (void)what; (void)buf; (void)len; (void)err; (void)errlen; return 0; }
int fso_boxes_check_file(const char *what, const char *path, char *err, size_t errlen)
{ (void)what; (void)path; (void)err; (void)errlen; return 0; }
int fso_boxes_check_shared_dir(const char *dir, char *err, size_t errlen)
{ (void)dir; (void)err; (void)errlen; return 0; }
int fso_boxes_rails(int devices, bool cuda, fso_rails *out, char *err, size_t errlen)
{ (void)devices; (void)cuda; (void)err; (void)errlen; *out = (fso_rails){.boxes = 1}; return 0; }
void fso_boxes_rails_free(fso_rails *r) { (void)r; }
_Noreturn void fso_boxes_abort(const char *why, int code) { (void)why; exit(code); }
double fso_boxes_net_gbps(void) { return 0; }
