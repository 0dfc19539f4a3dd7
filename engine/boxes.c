/* boxes.c — placeholder until the MPI transport lands (boxes.h). */
#include "boxes.h"

void fso_boxes_phase(const char *what, int64_t step, int block)
{
    (void)what;
    (void)step;
    (void)block;
}
