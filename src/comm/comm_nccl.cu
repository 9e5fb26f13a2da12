/* The NCCL backend of kiln_comm: one rank per GPU, data collectives on device memory, issued on the
 * comm's own stream.
 *
 * libnccl.so.2 is opened at run time (dlopen), not linked: NCCL's development files are not part of a
 * CUDA toolkit everywhere (pip wheels ship only the library), and a kiln that cannot find NCCL must still
 * run everything else. The few entry points we call are declared below with NCCL's ABI (stable since 2.x:
 * the enum values are part of it); when nccl.h is on the include path at build time, every declaration is
 * checked against it at compile time. Library: $KILN_NCCL_LIB, else libnccl.so.2 from the loader path.
 *
 * NCCL collectives with uneven partitions (ZeRO-1's reduce-scatter/all-gather of whole tensors) are a
 * group of per-rank Reduce/Broadcast calls: NCCL runs a group as one launch. All-to-all is a group of
 * Send/Recv pairs, as NCCL's documentation prescribes; in place, the input is first copied aside. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kiln/comm.h"
#include "kiln/hash.h"

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#define KILN_CHECK_NCCL_ABI 1
#endif
#endif

typedef int knccl_result;   /* ncclResult_t: 0 = ncclSuccess */
typedef int knccl_dtype;    /* ncclDataType_t */
typedef int knccl_redop;    /* ncclRedOp_t */
typedef void *knccl_comm;   /* ncclComm_t, an opaque pointer */
typedef struct { char internal[KILN_NCCL_ID_BYTES]; } knccl_id;
enum { KNCCL_UINT8 = 1, KNCCL_F32 = 7, KNCCL_F64 = 8, KNCCL_BF16 = 9, KNCCL_SUM = 0, KNCCL_MAX = 2 };

#ifdef KILN_CHECK_NCCL_ABI
static_assert(sizeof(knccl_id) == sizeof(ncclUniqueId), "ncclUniqueId");
static_assert((int)KNCCL_UINT8 == (int)ncclUint8 && (int)KNCCL_F32 == (int)ncclFloat32 &&
              (int)KNCCL_F64 == (int)ncclFloat64 && (int)KNCCL_BF16 == (int)ncclBfloat16, "ncclDataType_t");
static_assert((int)KNCCL_SUM == (int)ncclSum && (int)KNCCL_MAX == (int)ncclMax && (int)ncclSuccess == 0,
              "ncclRedOp_t");
static_assert(sizeof(ncclComm_t) == sizeof(knccl_comm) && sizeof(ncclResult_t) == sizeof(knccl_result), "ABI");
#endif

/* the entry points, as a table filled by dlsym */
#define KNCCL_FUNCS(X)                                                                                            \
    X(GetVersion, knccl_result, (int *))                                                                         \
    X(GetUniqueId, knccl_result, (knccl_id *))                                                                   \
    X(CommInitRank, knccl_result, (knccl_comm *, int, knccl_id, int))                                            \
    X(CommDestroy, knccl_result, (knccl_comm))                                                                   \
    X(CommGetAsyncError, knccl_result, (knccl_comm, knccl_result *))                                             \
    X(GetErrorString, const char *, (knccl_result))                                                              \
    X(GetLastError, const char *, (knccl_comm))                                                                  \
    X(AllReduce, knccl_result, (const void *, void *, size_t, knccl_dtype, knccl_redop, knccl_comm, cudaStream_t)) \
    X(ReduceScatter, knccl_result, (const void *, void *, size_t, knccl_dtype, knccl_redop, knccl_comm, cudaStream_t)) \
    X(AllGather, knccl_result, (const void *, void *, size_t, knccl_dtype, knccl_comm, cudaStream_t))             \
    X(Broadcast, knccl_result, (const void *, void *, size_t, knccl_dtype, int, knccl_comm, cudaStream_t))        \
    X(Reduce, knccl_result, (const void *, void *, size_t, knccl_dtype, knccl_redop, int, knccl_comm, cudaStream_t)) \
    X(Send, knccl_result, (const void *, size_t, knccl_dtype, int, knccl_comm, cudaStream_t))                     \
    X(Recv, knccl_result, (void *, size_t, knccl_dtype, int, knccl_comm, cudaStream_t))                           \
    X(GroupStart, knccl_result, (void))                                                                          \
    X(GroupEnd, knccl_result, (void))

#define KNCCL_FIELD(name, ret, args) ret(*name) args;
static struct { KNCCL_FUNCS(KNCCL_FIELD) } nc;
#undef KNCCL_FIELD


static char load_error[512];
static int loaded; /* 0 not tried, 1 ok, -1 failed */

/* dlopen once; thread-safe enough for our use: ranks-as-threads call it after the main thread did */
static kiln_error *nccl_load(void) {
    if (loaded == 1) return NULL;
    if (loaded == 0) {
        const char *env = getenv("KILN_NCCL_LIB");
        const char *names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so"};
        void *h = NULL;
        for (int i = 0; i < 2 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            snprintf(load_error, sizeof load_error, "cannot load NCCL (%s): %s; install libnccl2 or set KILN_NCCL_LIB "
                     "to libnccl.so.2 (pip: site-packages/nvidia/nccl/lib)", names[0], dlerror());
            loaded = -1;
        } else {
            int ok = 1;
#define KNCCL_SYM(name, ret, args)                                                                  \
    if (ok && !(*(void **)&nc.name = dlsym(h, "nccl" #name))) {                                      \
        snprintf(load_error, sizeof load_error, "%s has no symbol nccl" #name " (NCCL too old?)", names[0]); \
        ok = 0;                                                                                     \
    }
            KNCCL_FUNCS(KNCCL_SYM)
#undef KNCCL_SYM
            loaded = ok ? 1 : -1;
        }
    }
    return loaded == 1 ? NULL : kiln_errorf(KILN_EUNSUPPORTED, "%s", load_error);
}

typedef struct {
    knccl_comm comm;
    cudaStream_t stream;
    kiln_comm *boot;
    void *stage;        /* device staging for the host control calls */
    size_t stage_bytes;
    void *scratch;      /* in-place all-to-all's copy of its input */
    size_t scratch_bytes;
    cudaEvent_t after;  /* after_stream's mark on the caller's stream */
} nccl_impl;

static nccl_impl *impl(kiln_comm *c) { return (nccl_impl *)c->impl; }

static kiln_error *nc_err(knccl_result r, const char *what, knccl_comm comm) {
    if (r == 0) return NULL;
    const char *last = comm && nc.GetLastError ? nc.GetLastError(comm) : NULL;
    return kiln_errorf(KILN_EIO, "NCCL %s failed: %s%s%s", what, nc.GetErrorString(r), last && *last ? ": " : "",
                       last ? last : "");
}
static kiln_error *cu_err(cudaError_t r, const char *what) {
    return r == cudaSuccess ? NULL : kiln_errorf(KILN_EIO, "%s: %s", what, cudaGetErrorString(r));
}
#define NC_TRY(call, what) KILN_TRY(nc_err((call), what, impl(c)->comm))
#define CU_TRY(call, what) KILN_TRY(cu_err((call), what))

static kiln_error *dt_of(kiln_dtype dt, knccl_dtype *out, const char *what) {
    switch (dt) {
    case KILN_DT_F32: *out = KNCCL_F32; return NULL;
    case KILN_DT_BF16: *out = KNCCL_BF16; return NULL;
    case KILN_DT_F64: *out = KNCCL_F64; return NULL;
    default:
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: dtype %s is not supported (F32, BF16, F64)", what,
                           kiln_dtype_name(dt));
    }
}

/* ---- data plane: device buffers, asynchronous on the comm's stream ---- */

static kiln_error *ar(kiln_comm *c, float *b, size_t n) {
    NC_TRY(nc.AllReduce(b, b, n, KNCCL_F32, KNCCL_SUM, impl(c)->comm, impl(c)->stream), "all-reduce");
    return NULL;
}

/* uneven blocks: rank r reduces [displs[r], +counts[r]) to itself (empty blocks skipped: counts are the same on
 * every rank, so every rank skips the same) */
static kiln_error *rs(kiln_comm *c, const float *send, float *recv, const size_t *counts, const size_t *displs) {
    nccl_impl *m = impl(c);
    NC_TRY(nc.GroupStart(), "group start");
    knccl_result r = 0;
    for (int p = 0; p < c->size && !r; p++)
        if (counts[p])
            r = nc.Reduce(send + displs[p], p == c->rank ? recv : NULL, counts[p], KNCCL_F32, KNCCL_SUM, p, m->comm,
                          m->stream);
    knccl_result r2 = nc.GroupEnd();
    NC_TRY(r ? r : r2, "reduce-scatter (grouped reduce)");
    return NULL;
}

static kiln_error *ag(kiln_comm *c, float *b, const size_t *counts, const size_t *displs) {
    nccl_impl *m = impl(c);
    NC_TRY(nc.GroupStart(), "group start");
    knccl_result r = 0;
    for (int p = 0; p < c->size && !r; p++)
        r = nc.Broadcast(b + displs[p], b + displs[p], counts[p], KNCCL_F32, p, m->comm, m->stream);
    knccl_result r2 = nc.GroupEnd();
    NC_TRY(r ? r : r2, "all-gather (grouped broadcast)");
    return NULL;
}

static kiln_error *ar_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    knccl_dtype t;
    KILN_TRY(dt_of(dt, &t, "all-reduce"));
    NC_TRY(nc.AllReduce(s, r, n, t, KNCCL_SUM, impl(c)->comm, impl(c)->stream), "all-reduce");
    return NULL;
}
static kiln_error *rs_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    knccl_dtype t;
    KILN_TRY(dt_of(dt, &t, "reduce-scatter"));
    NC_TRY(nc.ReduceScatter(s, r, n, t, KNCCL_SUM, impl(c)->comm, impl(c)->stream), "reduce-scatter");
    return NULL;
}
static kiln_error *ag_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    knccl_dtype t;
    KILN_TRY(dt_of(dt, &t, "all-gather"));
    NC_TRY(nc.AllGather(s, r, n, t, impl(c)->comm, impl(c)->stream), "all-gather");
    return NULL;
}
static kiln_error *bc_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt, int root) {
    knccl_dtype t;
    KILN_TRY(dt_of(dt, &t, "broadcast"));
    if (root < 0 || root >= c->size)
        return kiln_errorf(KILN_EINVAL, "broadcast: root %d is not a rank (0..%d)", root, c->size - 1);
    NC_TRY(nc.Broadcast(s, r, n, t, root, impl(c)->comm, impl(c)->stream), "broadcast");
    return NULL;
}

static kiln_error *grow(void **buf, size_t *have, size_t need, const char *what) {
    if (need <= *have) return NULL;
    if (*buf) cudaFree(*buf);
    *buf = NULL, *have = 0;
    CU_TRY(cudaMalloc(buf, need), what);
    *have = need;
    return NULL;
}

static kiln_error *a2a_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    nccl_impl *m = impl(c);
    knccl_dtype t;
    KILN_TRY(dt_of(dt, &t, "all-to-all"));
    const size_t ts = kiln_dtype_size(dt), block = n * ts;
    if (s == r && c->size > 1) { /* NCCL's send/recv cannot overlap: copy the input aside on the stream */
        KILN_TRY(grow(&m->scratch, &m->scratch_bytes, block * (size_t)c->size, "all-to-all scratch (cudaMalloc)"));
        CU_TRY(cudaMemcpyAsync(m->scratch, s, block * (size_t)c->size, cudaMemcpyDeviceToDevice, m->stream),
               "all-to-all (cudaMemcpyAsync)");
        s = m->scratch;
    } else if (s == r) {
        return NULL;
    }
    NC_TRY(nc.GroupStart(), "group start");
    knccl_result e = 0;
    for (int p = 0; p < c->size && !e; p++) {
        e = nc.Send((const char *)s + (size_t)p * block, n, t, p, m->comm, m->stream);
        if (!e) e = nc.Recv((char *)r + (size_t)p * block, n, t, p, m->comm, m->stream);
    }
    knccl_result e2 = nc.GroupEnd();
    NC_TRY(e ? e : e2, "all-to-all (grouped send/recv)");
    return NULL;
}

static kiln_error *nsync(kiln_comm *c) {
    nccl_impl *m = impl(c);
    CU_TRY(cudaStreamSynchronize(m->stream), "NCCL stream (cudaStreamSynchronize)");
    knccl_result async = 0;
    NC_TRY(nc.CommGetAsyncError(m->comm, &async), "async error query");
    NC_TRY(async, "collective (asynchronous error)");
    return NULL;
}

/* the collectives issued next wait, on NCCL's stream, for the work queued so far on `stream` */
static kiln_error *after(kiln_comm *c, void *stream) {
    nccl_impl *m = impl(c);
    if (!m->after) CU_TRY(cudaEventCreateWithFlags(&m->after, cudaEventDisableTiming), "after_stream (cudaEventCreate)");
    CU_TRY(cudaEventRecord(m->after, (cudaStream_t)stream), "after_stream (cudaEventRecord)");
    CU_TRY(cudaStreamWaitEvent(m->stream, m->after, 0), "after_stream (cudaStreamWaitEvent)");
    return NULL;
}

/* kiln_comm's group (the ZeRO-1 all-gather's broadcasts from every owner, launched as one) */
static kiln_error *gstart(kiln_comm *c) {
    NC_TRY(nc.GroupStart(), "group start");
    return NULL;
}
static kiln_error *gend(kiln_comm *c) {
    NC_TRY(nc.GroupEnd(), "group end (the grouped collectives' launch)");
    return NULL;
}

/* ---- control plane: host memory, synchronous, through a small device staging buffer ---- */

static kiln_error *host_coll(kiln_comm *c, void *buf, size_t bytes, knccl_dtype t, size_t count, int kind, int root,
                             const char *what) {
    // one rank: the sum, the maximum and the broadcast are the buffer itself. The round trip through the
    // device (two copies, a collective, a wait) costs the trainer's one-GPU step ~30 us of idle GPU each time
    // (three a step: the stop flag, the loss and norm, the routing counts; bench/kernel_trace.sh showed them)
    if (c->size == 1) return NULL;
    nccl_impl *m = impl(c);
    KILN_TRY(grow(&m->stage, &m->stage_bytes, bytes < 256 ? 256 : bytes, "staging buffer (cudaMalloc)"));
    CU_TRY(cudaMemcpyAsync(m->stage, buf, bytes, cudaMemcpyHostToDevice, m->stream), what);
    if (kind == 2) NC_TRY(nc.Broadcast(m->stage, m->stage, count, t, root, m->comm, m->stream), what);
    else NC_TRY(nc.AllReduce(m->stage, m->stage, count, t, kind ? KNCCL_MAX : KNCCL_SUM, m->comm, m->stream), what);
    CU_TRY(cudaMemcpyAsync(buf, m->stage, bytes, cudaMemcpyDeviceToHost, m->stream), what);
    return nsync(c);
}
static kiln_error *ar64(kiln_comm *c, double *b, size_t n) {
    return n ? host_coll(c, b, n * sizeof *b, KNCCL_F64, n, 0, 0, "all-reduce (host f64)") : NULL;
}
static kiln_error *max64(kiln_comm *c, double *b, size_t n) {
    return n ? host_coll(c, b, n * sizeof *b, KNCCL_F64, n, 1, 0, "all-reduce max (host f64)") : NULL;
}
static kiln_error *bc(kiln_comm *c, void *b, size_t n, int root) {
    if (root < 0 || root >= c->size)
        return kiln_errorf(KILN_EINVAL, "broadcast: root %d is not a rank (0..%d)", root, c->size - 1);
    return n ? host_coll(c, b, n, KNCCL_UINT8, n, 2, root, "broadcast (host)") : NULL;
}
static kiln_error *barrier(kiln_comm *c) {
    double x = 0;
    return ar64(c, &x, 1);
}

static void fin(kiln_comm *c) {
    nccl_impl *m = impl(c);
    if (m->stream) cudaStreamSynchronize(m->stream);
    if (m->comm) nc.CommDestroy(m->comm);
    if (m->stage) cudaFree(m->stage);
    if (m->scratch) cudaFree(m->scratch);
    if (m->after) cudaEventDestroy(m->after);
    if (m->stream) cudaStreamDestroy(m->stream);
    if (m->boot) m->boot->finalize(m->boot);
    free(m);
    free(c);
}

extern "C" kiln_error *kiln_comm_nccl_unique_id(unsigned char id[KILN_NCCL_ID_BYTES]) {
    KILN_TRY(nccl_load());
    knccl_id u;
    KILN_TRY(nc_err(nc.GetUniqueId(&u), "get unique id", NULL));
    memcpy(id, u.internal, KILN_NCCL_ID_BYTES);
    return NULL;
}

extern "C" kiln_error *kiln_comm_nccl_version(char *buf, size_t n) {
    KILN_TRY(nccl_load());
    int v = 0;
    KILN_TRY(nc_err(nc.GetVersion(&v), "get version", NULL));
    /* NCCL_VERSION(X,Y,Z) is X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before */
    if (v >= 20900) snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(buf, n, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
    return NULL;
}

extern "C" kiln_error *kiln_comm_nccl_create(const unsigned char id[KILN_NCCL_ID_BYTES], int nranks, int rank,
                                             int device, kiln_comm *boot, kiln_comm **out) {
    *out = NULL;
    KILN_TRY(nccl_load());
    int ndev = 0;
    KILN_TRY(cu_err(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount"));
    if (device < 0 || device >= ndev)
        return kiln_errorf(KILN_EINVAL, "NCCL rank %d: CUDA device %d does not exist (this host has %d GPU%s)", rank,
                           device, ndev, ndev == 1 ? "" : "s");
    kiln_comm *c = (kiln_comm *)calloc(1, sizeof *c);
    nccl_impl *m = (nccl_impl *)calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return kiln_errorf(KILN_ENOMEM, "NCCL communicator");
    }
    c->backend = "nccl";
    c->rank = rank, c->size = nranks, c->device_buffers = 1, c->device = device, c->impl = m;
    c->allreduce_sum = ar, c->allreduce_sum_f64 = ar64, c->reduce_scatter_sum = rs, c->allgather = ag;
    c->broadcast = bc, c->barrier = barrier, c->finalize = fin, c->allreduce_sum_dt = ar_dt;
    c->reduce_scatter_sum_dt = rs_dt, c->allgather_dt = ag_dt, c->broadcast_dt = bc_dt, c->alltoall_dt = a2a_dt;
    c->allreduce_max_f64 = max64, c->sync = nsync;
    c->group_start = gstart, c->group_end = gend, c->after_stream = after;
    kiln_error *e = cu_err(cudaSetDevice(device), "cudaSetDevice");
    /* the greatest priority, as the model's stream has: the reduce-scatter's kernels beside the backward (the
     * trainer's KILN_RS_OVERLAP) are not left waiting behind its pending blocks while their peers spin on them */
    int least = 0, greatest = 0;
    if (!e) e = cu_err(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    if (!e) e = cu_err(cudaStreamCreateWithPriority(&m->stream, cudaStreamNonBlocking, greatest), "cudaStreamCreate");
    knccl_id u;
    memcpy(u.internal, id, KILN_NCCL_ID_BYTES);
    if (!e) e = nc_err(nc.CommInitRank(&m->comm, nranks, u, rank), "comm init", NULL);
    if (e) {
        m->comm = NULL; /* not created */
        fin(c);
        return kiln_error_wrap(e, "NCCL rank %d of %d on device %d", rank, nranks, device);
    }
    m->boot = boot;
    *out = c;
    return NULL;
}

/* A hash of this process's current device's PCI address (domain:bus:device), the same in every process
 * that sees that GPU whatever its CUDA index there; 0 when CUDA cannot say. */
static uint64_t gpu_id(int device) {
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus - 1, device) != cudaSuccess) return 0;
    for (char *p = bus; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    return kiln_fnv1a64(KILN_FNV1A64_INIT, bus, strlen(bus));
}

extern "C" kiln_error *kiln_comm_pick_gpus(kiln_comm *boot, int per_rank, int *dev0) {
    *dev0 = -1;
    /* the hosts' ids gathered once: the layout comes from them, and so does the shared-GPU check below */
    uint64_t *host = (uint64_t *)calloc((size_t)boot->size, sizeof *host);
    uint64_t *gpu = (uint64_t *)calloc((size_t)boot->size, sizeof *gpu);
    kiln_error *ge = !host || !gpu ? kiln_errorf(KILN_ENOMEM, "GPU check of %d ranks", boot->size) : NULL;
    if (!ge) ge = kiln_comm_allgather_u64(boot, kiln_host_id(), host);
    kiln_host_layout h;
    if (!ge) ge = kiln_host_layout_of(host, boot->size, boot->rank, &h);
    if (ge) {
        free(host);
        free(gpu);
        return ge;
    }
    int ndev = 0, dev = -1;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    kiln_error *e = ce != cudaSuccess ? kiln_errorf(KILN_EIO, "rank %d: no CUDA device: %s", boot->rank,
                                                     cudaGetErrorString(ce))
                                      : kiln_gpu_for_rank(&h, per_rank, ndev, &dev);
    if (e && h.local_size > 1 && ndev >= 1)
        e = kiln_error_wrap(e, "rank %d: NCCL needs a GPU of its own for each rank (KILN_COMM=staged lets ranks share "
                            "one, slowly, through host memory)", boot->rank);
    /* every rank must learn whether all can go on: a rank that returns alone would hang the others. The GPU's
     * identity rides along: two ranks of a host on one GPU (a launcher's binding gone wrong) stop here with
     * their numbers, not in NCCL's init ("invalid usage") */
    ge = kiln_comm_allgather_u64(boot, e ? 0 : gpu_id(dev), gpu); /* 0: this rank has no GPU */
    int bad_rank = -1, a = -1, b = -1;
    for (int r = 0; !ge && r < boot->size && bad_rank < 0; r++)
        if (!gpu[r]) bad_rank = r;
    const int shared = !ge && bad_rank < 0 && kiln_ranks_share_gpu(host, gpu, boot->size, &a, &b);
    free(host);
    free(gpu);
    if (e || ge) {
        kiln_error_free(ge);
        return e ? e : kiln_errorf(KILN_EIO, "rank %d: agreeing on the ranks' GPUs failed", boot->rank);
    }
    if (bad_rank >= 0) return kiln_errorf(KILN_EIO, "rank %d: rank %d has no usable GPU", boot->rank, bad_rank);
    if (shared)
        return kiln_errorf(KILN_EINVAL, "ranks %d and %d are on one host and one GPU: NCCL needs a GPU of its own for "
                           "each rank (check the launcher's GPU binding, or KILN_COMM=staged to share one)", a, b);
    *dev0 = dev;
    return NULL;
}

extern "C" kiln_error *kiln_comm_nccl_from(kiln_comm *boot, kiln_comm **out) {
    *out = NULL;
    int dev = -1;
    KILN_TRY(kiln_comm_pick_gpus(boot, 1, &dev));
    kiln_error *e = NULL;
    unsigned char id[KILN_NCCL_ID_BYTES] = {0};
    double ok = 1;
    if (boot->rank == 0) {
        e = kiln_comm_nccl_unique_id(id);
        ok = !e;
    }
    KILN_TRY(boot->broadcast(boot, &ok, sizeof ok, 0));
    if (e) return e;
    if (!ok) return kiln_errorf(KILN_EIO, "rank %d: rank 0 could not start NCCL", boot->rank);
    KILN_TRY(boot->broadcast(boot, id, sizeof id, 0));
    return kiln_comm_nccl_create(id, boot->size, boot->rank, dev, boot, out);
}
