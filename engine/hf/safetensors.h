/* safetensors.h — the safetensors file format: checking a file's header,
 * reading its tensors as fp32, and writing a file tensor by tensor.
 *
 * A file is an 8-byte little-endian length N, N bytes of JSON (the
 * header), then the data. The header maps each tensor's name to
 * {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}
 * (offsets into the data), and may map "__metadata__" to an object of
 * strings. A header is accepted as the reference implementation
 * (huggingface/safetensors) accepts it, and refused otherwise with a
 * message naming the file and, where there is one, the tensor:
 *   - N is at most 100,000,000 and 8 + N fits in the file;
 *   - the header is a UTF-8 JSON object with no name twice;
 *   - each tensor has a dtype of the format's (BOOL, U8, I8, F8_E4M3, ...,
 *     F16, BF16, F32, F64, I64, ...), a shape of non-negative integers and
 *     two data_offsets (other members are ignored);
 *   - in the order of their offsets the tensors tile the data from 0 with
 *     no gap or overlap (begin <= end, each begin the previous end);
 *   - end - begin = product(shape) x the dtype's bits / 8, in whole bytes,
 *     without overflow;
 *   - the data ends where the file ends: 8 + N + the last end = its size.
 * fsoff reads F32, BF16 and F16 data (widened exactly); the other dtypes
 * are checked and can be skipped.
 *
 * The writer (fso_st_writer) writes what transformers writes: the header
 * with {"format": "pt"} metadata and the tensors in the given order,
 * padded with spaces to a multiple of 8 bytes, then each tensor's bytes as
 * the caller streams them.
 */
#ifndef FSO_SAFETENSORS_H
#define FSO_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FSO_ST_MAX_HEADER_BYTES 100000000ull

typedef enum fso_st_dtype {
    FSO_ST_BOOL = 0, FSO_ST_F4, FSO_ST_F6_E2M3, FSO_ST_F6_E3M2, FSO_ST_U8, FSO_ST_I8,
    FSO_ST_F8_E5M2, FSO_ST_F8_E4M3, FSO_ST_F8_E8M0, FSO_ST_F8_E4M3FNUZ, FSO_ST_F8_E5M2FNUZ,
    FSO_ST_I16, FSO_ST_U16, FSO_ST_F16, FSO_ST_BF16, FSO_ST_I32, FSO_ST_U32, FSO_ST_F32,
    FSO_ST_C64, FSO_ST_F64, FSO_ST_I64, FSO_ST_U64,
    FSO_ST_N_DTYPES
} fso_st_dtype;

const char *fso_st_dtype_name(fso_st_dtype d);
unsigned fso_st_dtype_bits(fso_st_dtype d);

typedef struct fso_st_tensor {
    char *name;
    fso_st_dtype dtype;
    int ndim;
    uint64_t *shape;            /* (ndim) */
    uint64_t numel;
    uint64_t begin, end;        /* in the data: the file offset is data_offset + begin */
} fso_st_tensor;

typedef struct fso_st_file {
    char *path;
    int fd;                     /* -1: parsed from memory only */
    uint64_t size;              /* the file's bytes */
    uint64_t data_offset;       /* 8 + N */
    int n;
    fso_st_tensor *tensors;     /* sorted by name */
} fso_st_file;

/* Check a header: head holds the first head_len bytes of a file of
 * file_size bytes (head_len >= 8 + N, else the file is truncated). path
 * names the file in messages. Fills f (fd -1); 0, or -EINVAL (a bad
 * header) / -ENOMEM with the message in err. fso_st_close frees f. */
int fso_st_parse(fso_st_file *f, const char *path, const void *head, size_t head_len,
                 uint64_t file_size, char *err, size_t errlen);
/* Open path and check its header. 0 or a negative errno with err. */
int fso_st_open(fso_st_file *f, const char *path, char *err, size_t errlen);
void fso_st_close(fso_st_file *f);

/* The tensor called name, or NULL. */
const fso_st_tensor *fso_st_find(const fso_st_file *f, const char *name);

/* Elements [first, first + n) of t (F32, BF16 or F16) into dst as fp32,
 * read from the file. 0 or a negative errno with err naming the file, the
 * tensor and, for a short read, the offset. */
int fso_st_read_f32(const fso_st_file *f, const fso_st_tensor *t, uint64_t first, size_t n,
                    float *dst, char *err, size_t errlen);

/* fp16 <-> fp32: exact widening; narrowing rounds to nearest even
 * (a finite value beyond fp16's range becomes infinity, as PyTorch's). */
float fso_f32_from_f16(uint16_t h);
uint16_t fso_f16_from_f32(float f);

/* ------------------------------------------------------------------ writing */

typedef struct fso_st_entry {
    const char *name;
    fso_st_dtype dtype;
    int ndim;                   /* 1 or 2 */
    uint64_t shape[2];
} fso_st_entry;

/* Bytes of entry e's data. */
uint64_t fso_st_entry_bytes(const fso_st_entry *e);
/* Bytes of the header (the 8-byte length included) for entries e[0..n),
 * laid out back to back in that order. */
uint64_t fso_st_header_bytes(const fso_st_entry *e, int n);

typedef struct fso_st_writer {
    int fd;
    char *path;
    uint64_t expect;            /* bytes the header promises, header included */
    uint64_t written;
} fso_st_writer;

/* Create path (mode 0644 less the umask; an existing file is replaced) and
 * write the header for entries e[0..n). 0 or a negative errno with err. */
int fso_st_writer_open(fso_st_writer *w, const char *path, const fso_st_entry *e, int n,
                       char *err, size_t errlen);
/* Append the next bytes of data. */
int fso_st_writer_write(fso_st_writer *w, const void *data, size_t bytes, char *err,
                        size_t errlen);
/* Check that the data the header promised was written, fsync and close.
 * 0 or a negative errno with err; the writer is closed either way. */
int fso_st_writer_finish(fso_st_writer *w, char *err, size_t errlen);
/* Close without finishing (an error elsewhere); the file stays. */
void fso_st_writer_abandon(fso_st_writer *w);

#endif
