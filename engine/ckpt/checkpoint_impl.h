/* checkpoint_impl.h — private to engine/checkpoint*.c and their tests:
 * file helpers the writer and the reader share, and the test hook that
 * injects faults into a save. */
#ifndef FSO_CHECKPOINT_IMPL_H
#define FSO_CHECKPOINT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "checkpoint.h"
#include "store.h"

/* fsync a file or a folder by path. 0 or negative errno. */
int fso_ckpt_fsync_path(const char *path, bool dir);
/* Remove a folder a save wrote and the files in it, following no symlink
 * (a symlink inside is removed, not its target). A subfolder is left, and
 * so is the folder (-ENOTEMPTY): saves write none. 0 when gone or absent. */
int fso_ckpt_remove_folder(const char *path);
/* The step of a checkpoint folder's name ("step-00000020": 20), -1 when
 * the name is not one. */
int64_t fso_ckpt_step_of_name(const char *name);

/* The checkpoint's manifest, as read (checkpoint_export.c reads its "hf"). */
const json_t *fso_ckpt_manifest(const fso_ckpt *ck);

/* Tests: read as where io_uring is forbidden, one chunk at a time. */
void fso_ckpt_read_without_uring(fso_ckpt *ck);

/* Tests: the next saves' state.bin goes through a fault-injecting store. */
void fso_ckpt_saver_inject_faults(fso_ckpt_saver *sv, const fso_fault_spec *spec);

#endif
