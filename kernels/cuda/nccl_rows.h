/* nccl_rows.h — private to the CUDA module: what its two NCCL collectives,
 * coll_nccl.c (the devices of one box) and coll_nccl_rail.c (a rail across
 * boxes), share for reduce_scatter_bf16. */
#ifndef FSO_NCCL_ROWS_H
#define FSO_NCCL_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <nccl.h>

/* Piece k of send (count bf16) to rank k, and rank k's piece for this rank
 * into rows + k * count, for every rank k of comm's `world`: one grouped
 * send and receive (an all-to-all) queued on stream s. The first failure,
 * or ncclGroupEnd's result. The rows are then summed in rank order
 * (fso_cuda_sum_bf16_rows). */
ncclResult_t fso_nccl_exchange_rows(const uint16_t *send, uint16_t *rows, size_t count, int world,
                                    ncclComm_t comm, cudaStream_t s);

#endif
