/* safetensors: reader (mmap, zero-copy, lazy) and writer (atomic).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 *   { "__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ... }
 * then the byte buffer; offsets are relative to the start of the buffer.
 *
 * The reader validates everything before handing out a pointer: header length
 * cap (100 MB), JSON shape, dtype names, shape x dtype size == byte range,
 * offsets inside the file, no overlaps, no gaps (as the reference library
 * requires), duplicate names. Tensor data is returned as pointers into the
 * mapping: nothing is read until it is touched.
 */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ST_MAX_DIMS 8
#define KILN_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    int64_t numel;
    const void *data;   /* points into the mapping; may be unaligned */
    size_t nbytes;
    const char *file;   /* the file this tensor lives in (for messages) */
} kiln_st_tensor;

typedef struct kiln_st kiln_st;

/* Open one .safetensors file. */
kiln_error *kiln_st_open(const char *path, kiln_st **out);
/* Open a model directory: model.safetensors, or model.safetensors.index.json
 * with its shards (every tensor in the weight_map must exist in the named shard,
 * and every shard tensor must be in the map). */
kiln_error *kiln_st_open_dir(const char *dir, kiln_st **out);
void kiln_st_close(kiln_st *st);

size_t kiln_st_count(const kiln_st *st);
const kiln_st_tensor *kiln_st_at(const kiln_st *st, size_t i);      /* file order */
const kiln_st_tensor *kiln_st_find(const kiln_st *st, const char *name); /* NULL if absent */
/* Value of a "__metadata__" key, or NULL (first file only for directories). */
const char *kiln_st_metadata(const kiln_st *st, const char *key);

/* Copy a tensor into f32 (F32/F16/BF16/F64 and integer types converted).
 * Fails, naming the tensor, if numel != n. */
kiln_error *kiln_st_read_f32(const kiln_st_tensor *t, float *dst, size_t n);
/* Copy an integer tensor (I64/I32/I16/I8/U8/U16/U32) into int64. */
kiln_error *kiln_st_read_i64(const kiln_st_tensor *t, int64_t *dst, size_t n);

/* ---- writer ---- */
typedef struct {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;   /* numel * dtype size bytes, little-endian */
} kiln_st_entry;

/* Write atomically: <path>.tmp.<pid>, fsync, rename over path, fsync the directory.
 * On any failure the temp file is removed and path is untouched.
 * metadata: NULL or NULL-terminated array of key,value,key,value,... strings. */
kiln_error *kiln_st_write(const char *path, const kiln_st_entry *entries, size_t n,
                          const char *const *metadata);

/* The data section of kiln_st_write_stream, piece by piece: *data and *len the next bytes (the
 * tensors' data in entry order, concatenated: pieces need not align with tensors); *data stays valid
 * until the next call. *len 0 before the end is an error, as is a piece past the end. */
typedef kiln_error *(*kiln_st_source)(void *ctx, const void **data, size_t *len);
/* kiln_st_write with the data from src instead of the entries' data pointers (ignored, may be NULL):
 * the same bytes as kiln_st_write of the same tensors. For data that is not in host memory as a
 * whole (a checkpoint streamed from the GPU through small pinned buffers). */
kiln_error *kiln_st_write_stream(const char *path, const kiln_st_entry *entries, size_t n,
                                 const char *const *metadata, kiln_st_source src, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
