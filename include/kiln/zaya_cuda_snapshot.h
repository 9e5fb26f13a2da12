/* The checkpoint of the CUDA trainer without stalling it (issue [ft] item 2): at save time one
 * device-to-device copy of this rank's owned f32 parameters and optimizer state into a spare device
 * buffer, queued on a side stream after the optimizer step (the model's stream waits for it before it
 * touches them again: training is held up for the copy only, ~12 ms for 21 GB on an H200); the
 * checkpoint writer's background thread then streams that copy to the shard file through two small
 * pinned host buffers (D2H of the next chunk while the current one is written and checksummed).
 *
 * Where the device has no room for the copy, the snapshot goes to pinned host memory instead (one D2H
 * copy while training waits), or, if that cannot be pinned either, to pageable host memory. A save
 * that blocks training anyway (synchronous) copies nothing: the stream reads the live buffers.
 *
 * The bytes streamed are the shard's data section exactly as the CPU trainer writes it: for each owned
 * tensor t in order, param.<name> (numel f32) then opt.<name> (its state floats), so GPU and CPU
 * checkpoints are the same files. Built only with CUDA; without it create says so. */
#ifndef KILN_ZAYA_CUDA_SNAPSHOT_H
#define KILN_ZAYA_CUDA_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/optim.h"
#include "kiln/zaya.h"
#include "kiln/zaya_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_zaya_cuda_snap kiln_zaya_cuda_snap;

/* Where a snapshot may go: AUTO = the device if it has room (free memory after the copy >= 1 GiB),
 * else pinned host, else pageable host. */
typedef enum { KILN_SNAP_AUTO = 0, KILN_SNAP_DEVICE, KILN_SNAP_PINNED, KILN_SNAP_PAGEABLE } kiln_snap_place;

/* For tensors [first, last) of m (this rank's ZeRO-1 shard) on g, state in o (op: their optimizer
 * classes). chunk_bytes: the size of each of the two pinned buffers of the stream (0: 256 MiB). Nothing
 * large is allocated until the first snapshot. */
kiln_error *kiln_zaya_cuda_snap_create(kiln_zaya_cuda *g, kiln_zaya_cuda_opt *o, const kiln_zaya *m,
                                       const kiln_opt_param *op, int first, int last, size_t chunk_bytes,
                                       kiln_zaya_cuda_snap **out);
/* Waits for any copy in flight, frees everything. */
void kiln_zaya_cuda_snap_free(kiln_zaya_cuda_snap *s);

/* Training thread, after the step's optimizer update was queued. copy = 1: take a snapshot (place as
 * above; the device copy returns once queued, a host one once landed). copy = 0: no copy, the next
 * stream reads the live buffers (the caller must not run the model until the stream ends). */
kiln_error *kiln_zaya_cuda_snap_take(kiln_zaya_cuda_snap *s, int copy, kiln_snap_place place);
/* "device", "pinned host", "pageable host" or "live": where the last snapshot went. */
const char *kiln_zaya_cuda_snap_where(const kiln_zaya_cuda_snap *s);
/* Bytes of the stream: 4 x (owned parameters + optimizer state floats). */
uint64_t kiln_zaya_cuda_snap_bytes(const kiln_zaya_cuda_snap *s);

/* Any one thread (the checkpoint writer's): the snapshot's bytes in file order. begin, then read (a
 * kiln_st_source: pieces of at most chunk_bytes, each valid until the next call) until
 * kiln_zaya_cuda_snap_bytes have come, then end (also after an error: waits for the copies in flight). */
kiln_error *kiln_zaya_cuda_snap_read_begin(kiln_zaya_cuda_snap *s);
kiln_error *kiln_zaya_cuda_snap_read(void *s, const void **data, size_t *len);
void kiln_zaya_cuda_snap_read_end(kiln_zaya_cuda_snap *s);

#ifdef __cplusplus
}
#endif
#endif
