/* allow.c — linked into the tests' programs (and fsoff-standin) only: lets
 * the CUDA loader accept the stand-in module when FSO_CUDA_MODULE names it
 * (kernels/cuda/cuda_module.h, fso_cuda_standin_allowed). fsoff itself never
 * links this file, so a user's run cannot train on the stand-in. */
#include "cuda/cuda_module.h"

const int fso_cuda_standin_allowed = 1;
