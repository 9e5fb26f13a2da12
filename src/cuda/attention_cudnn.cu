// cuDNN's fused flash attention (forward and backward) through the cuDNN backend C API, behind
// kiln_attention_{forward,backward}_cuda (the dispatch is in attention.cu).
//
// The library is opened at run time (dlopen: $KILN_CUDNN_LIB, else libcudnn.so.9 from the loader path), not
// linked: the CI machine has no cuDNN and a kiln without it must still train with its own kernels. The few
// entry points and enum values used are declared here with cuDNN 9's ABI; when cudnn.h is on the include
// path at build time every value is checked against it at compile time.
//
// The operation graphs are the ones cuDNN's runtime-fusion engines recognise as scaled dot-product attention
// (the graphs NVIDIA's cudnn-frontend builds for its SDPA nodes): forward S = Q·Kᵀ, ×scale, causal mask
// (row index >= column index, else -inf), optional left bound (column + window > row), softmax with its
// statistics (max + log sum exp = the natural-log logsumexp kiln's own kernels save) and O = P·V; backward
// from the saved statistics: dO·O summed per row, P recomputed as exp(S·scale - lse), dV = Pᵀ·dO,
// dS = P·(dO·Vᵀ - rowsum)·scale, dK = dSᵀ·Q, dQ = dS·K (into an f32 accumulator, or, deterministic, straight
// into dQ through the engine's dP workspace). GQA: K/V have KV heads, the per-query-head dK/dV are summed
// over each group by a reduction node. Q, K, V, O and their gradients are read and written in kiln's
// [B, T, heads, D] layout through strides; the statistics are kiln's lse [B, NH, T].
// The forward also serves CLIP's towers (att_cudnn_layout): no mask at all (the vision tower) or the causal
// one (text), q/k/v read in place from the fused projection [B·T, 3·H] (a token's row 3·H apart: the
// "interleaved" layout cuDNN's SDPA takes, any sequence length), the statistics into the workspace when the
// caller keeps none.
//
// One execution plan per (device, shape, scale, window, pass) is built on first use (heuristics mode A, the
// first engine configuration that finalizes) and kept; failures are kept too, with their reason, so a shape
// cuDNN refuses falls back to kiln's kernels once and quietly afterwards.
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "cuda_check.h"
#include "kiln/log.h"

#if defined(__has_include)
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define KILN_CHECK_CUDNN_ABI 1
#endif
#endif

cudaError_t kiln_ops_scratch(void **p, size_t bytes, cudaStream_t st); // scratch.cu

typedef int kdnn_status; // cudnnStatus_t: 0 = success
typedef void *kdnn_desc;  // cudnnBackendDescriptor_t
typedef void *kdnn_handle; // cudnnHandle_t

// descriptor types
enum {
    KD_POINTWISE = 0, KD_ENGINECFG = 3, KD_ENGINEHEUR = 4, KD_PLAN = 5, KD_OP_POINTWISE = 13, KD_OPGRAPH = 15,
    KD_VARPACK = 16, KD_TENSOR = 17, KD_MATMUL = 18, KD_OP_MATMUL = 19, KD_REDUCTION = 21, KD_OP_REDUCTION = 22,
    KD_OP_RESHAPE = 31
};
// attribute names
enum {
    KA_PW_MODE = 0, KA_PW_MATH_PREC = 1, KA_PW_AXIS = 9, KA_HEUR_MODE = 200, KA_HEUR_OPGRAPH = 201,
    KA_HEUR_RESULTS = 202, KA_PLAN_HANDLE = 400, KA_PLAN_ENGINECFG = 401, KA_PLAN_WORKSPACE = 402,
    KA_OP_PW_DESC = 750, KA_OP_PW_X = 751, KA_OP_PW_B = 752, KA_OP_PW_Y = 753, KA_OP_PW_T = 758,
    KA_OPGRAPH_HANDLE = 800, KA_OPGRAPH_OPS = 801, KA_T_ALIGN = 900, KA_T_DTYPE = 901, KA_T_DIMS = 902,
    KA_T_STRIDES = 903, KA_T_UID = 906, KA_T_VIRTUAL = 907, KA_T_BY_VALUE = 908, KA_VP_UIDS = 1000,
    KA_VP_PTRS = 1001, KA_VP_WORKSPACE = 1003, KA_ENGINECFG_ENGINE = 300, KA_ENGINE_INDEX = 1301,
    KA_MM_COMP = 1500, KA_OP_MM_A = 1520, KA_OP_MM_B = 1521, KA_OP_MM_C = 1522, KA_OP_MM_DESC = 1523,
    KA_OP_MM_M = 1525, KA_OP_MM_N = 1526, KA_OP_MM_K = 1527, KA_RED_OP = 1600, KA_RED_COMP = 1601,
    KA_OP_RED_X = 1610, KA_OP_RED_Y = 1611, KA_OP_RED_DESC = 1612, KA_OP_RESHAPE_X = 2200, KA_OP_RESHAPE_Y = 2201
};
// attribute value types
enum {
    KT_HANDLE = 0, KT_DATA_TYPE = 1, KT_BOOLEAN = 2, KT_INT64 = 3, KT_FLOAT = 4, KT_VOID_PTR = 6, KT_HEUR_MODE = 8,
    KT_PW_MODE = 14, KT_DESC = 15, KT_RED_OP = 18
};
// data types, pointwise modes, reduction operators, heuristics modes
enum { KF_FLOAT = 0, KF_INT32 = 4, KF_BF16 = 9, KF_BOOL = 11 };
enum {
    KP_ADD = 0, KP_MUL = 1, KP_DIV = 6, KP_SUB = 9, KP_EXP = 13, KP_LOG = 15, KP_IDENTITY = 21, KP_CMP_GT = 302,
    KP_CMP_GE = 303, KP_CMP_LT = 304, KP_AND = 400, KP_GEN_INDEX = 501, KP_SELECT = 601
};
enum { KR_ADD = 0, KR_MAX = 3 };
enum { KH_FALLBACK = 2, KH_A = 3 };

#ifdef KILN_CHECK_CUDNN_ABI
static_assert((int)KD_POINTWISE == (int)CUDNN_BACKEND_POINTWISE_DESCRIPTOR && (int)KD_ENGINECFG == (int)CUDNN_BACKEND_ENGINECFG_DESCRIPTOR &&
                  (int)KD_ENGINEHEUR == (int)CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR &&
                  (int)KD_PLAN == (int)CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
                  (int)KD_OP_POINTWISE == (int)CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
                  (int)KD_OPGRAPH == (int)CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR &&
                  (int)KD_VARPACK == (int)CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR && (int)KD_TENSOR == (int)CUDNN_BACKEND_TENSOR_DESCRIPTOR &&
                  (int)KD_MATMUL == (int)CUDNN_BACKEND_MATMUL_DESCRIPTOR &&
                  (int)KD_OP_MATMUL == (int)CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR &&
                  (int)KD_REDUCTION == (int)CUDNN_BACKEND_REDUCTION_DESCRIPTOR &&
                  (int)KD_OP_REDUCTION == (int)CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR &&
                  (int)KD_OP_RESHAPE == (int)CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
              "cudnnBackendDescriptorType_t");
static_assert((int)KA_PW_MODE == (int)CUDNN_ATTR_POINTWISE_MODE && (int)KA_PW_MATH_PREC == (int)CUDNN_ATTR_POINTWISE_MATH_PREC &&
                  (int)KA_PW_AXIS == (int)CUDNN_ATTR_POINTWISE_AXIS && (int)KA_HEUR_MODE == (int)CUDNN_ATTR_ENGINEHEUR_MODE &&
                  (int)KA_HEUR_OPGRAPH == (int)CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH &&
                  (int)KA_HEUR_RESULTS == (int)CUDNN_ATTR_ENGINEHEUR_RESULTS && (int)KA_PLAN_HANDLE == (int)400 &&
                  (int)KA_PLAN_ENGINECFG == (int)CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG &&
                  (int)KA_PLAN_WORKSPACE == (int)CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
                  (int)KA_OP_PW_DESC == (int)CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR &&
                  (int)KA_OP_PW_X == (int)CUDNN_ATTR_OPERATION_POINTWISE_XDESC &&
                  (int)KA_OP_PW_B == (int)CUDNN_ATTR_OPERATION_POINTWISE_BDESC &&
                  (int)KA_OP_PW_Y == (int)CUDNN_ATTR_OPERATION_POINTWISE_YDESC &&
                  (int)KA_OP_PW_T == (int)CUDNN_ATTR_OPERATION_POINTWISE_TDESC && (int)KA_OPGRAPH_HANDLE == (int)800 &&
                  (int)KA_OPGRAPH_OPS == (int)CUDNN_ATTR_OPERATIONGRAPH_OPS && (int)KA_T_ALIGN == (int)CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT &&
                  (int)KA_T_DTYPE == (int)CUDNN_ATTR_TENSOR_DATA_TYPE && (int)KA_T_DIMS == (int)CUDNN_ATTR_TENSOR_DIMENSIONS &&
                  (int)KA_T_STRIDES == (int)CUDNN_ATTR_TENSOR_STRIDES && (int)KA_T_UID == (int)CUDNN_ATTR_TENSOR_UNIQUE_ID &&
                  (int)KA_T_VIRTUAL == (int)CUDNN_ATTR_TENSOR_IS_VIRTUAL && (int)KA_T_BY_VALUE == (int)CUDNN_ATTR_TENSOR_IS_BY_VALUE &&
                  (int)KA_VP_UIDS == (int)CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS &&
                  (int)KA_VP_PTRS == (int)CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS &&
                  (int)KA_VP_WORKSPACE == (int)CUDNN_ATTR_VARIANT_PACK_WORKSPACE &&
                  (int)KA_ENGINECFG_ENGINE == (int)CUDNN_ATTR_ENGINECFG_ENGINE &&
                  (int)KA_ENGINE_INDEX == (int)CUDNN_ATTR_ENGINE_GLOBAL_INDEX && (int)KA_MM_COMP == (int)CUDNN_ATTR_MATMUL_COMP_TYPE &&
                  (int)KA_OP_MM_A == (int)CUDNN_ATTR_OPERATION_MATMUL_ADESC && (int)KA_OP_MM_B == (int)CUDNN_ATTR_OPERATION_MATMUL_BDESC &&
                  (int)KA_OP_MM_C == (int)CUDNN_ATTR_OPERATION_MATMUL_CDESC &&
                  (int)KA_OP_MM_DESC == (int)CUDNN_ATTR_OPERATION_MATMUL_DESC &&
                  (int)KA_OP_MM_M == (int)CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC &&
                  (int)KA_OP_MM_N == (int)CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC &&
                  (int)KA_OP_MM_K == (int)CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC &&
                  (int)KA_RED_OP == (int)CUDNN_ATTR_REDUCTION_OPERATOR && (int)KA_RED_COMP == (int)CUDNN_ATTR_REDUCTION_COMP_TYPE &&
                  (int)KA_OP_RED_X == (int)CUDNN_ATTR_OPERATION_REDUCTION_XDESC &&
                  (int)KA_OP_RED_Y == (int)CUDNN_ATTR_OPERATION_REDUCTION_YDESC &&
                  (int)KA_OP_RED_DESC == (int)CUDNN_ATTR_OPERATION_REDUCTION_DESC &&
                  (int)KA_OP_RESHAPE_X == (int)CUDNN_ATTR_OPERATION_RESHAPE_XDESC &&
                  (int)KA_OP_RESHAPE_Y == (int)CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
              "cudnnBackendAttributeName_t");
static_assert((int)KT_HANDLE == (int)CUDNN_TYPE_HANDLE && (int)KT_DATA_TYPE == (int)CUDNN_TYPE_DATA_TYPE && (int)KT_BOOLEAN == (int)CUDNN_TYPE_BOOLEAN &&
                  (int)KT_INT64 == (int)CUDNN_TYPE_INT64 && (int)KT_FLOAT == (int)CUDNN_TYPE_FLOAT && (int)KT_VOID_PTR == (int)CUDNN_TYPE_VOID_PTR &&
                  (int)KT_HEUR_MODE == (int)CUDNN_TYPE_HEUR_MODE && (int)KT_PW_MODE == (int)CUDNN_TYPE_POINTWISE_MODE &&
                  (int)KT_DESC == (int)CUDNN_TYPE_BACKEND_DESCRIPTOR && (int)KT_RED_OP == (int)CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
              "cudnnBackendAttributeType_t");
static_assert((int)KF_FLOAT == (int)CUDNN_DATA_FLOAT && (int)KF_INT32 == (int)CUDNN_DATA_INT32 && (int)KF_BF16 == (int)CUDNN_DATA_BFLOAT16 &&
                  (int)KF_BOOL == (int)CUDNN_DATA_BOOLEAN,
              "cudnnDataType_t");
static_assert((int)KP_ADD == (int)CUDNN_POINTWISE_ADD && (int)KP_MUL == (int)CUDNN_POINTWISE_MUL && (int)KP_DIV == (int)CUDNN_POINTWISE_DIV &&
                  (int)KP_SUB == (int)CUDNN_POINTWISE_SUB && (int)KP_EXP == (int)CUDNN_POINTWISE_EXP && (int)KP_LOG == (int)CUDNN_POINTWISE_LOG &&
                  (int)KP_IDENTITY == (int)CUDNN_POINTWISE_IDENTITY && (int)KP_CMP_GT == (int)CUDNN_POINTWISE_CMP_GT &&
                  (int)KP_CMP_GE == (int)CUDNN_POINTWISE_CMP_GE && (int)KP_CMP_LT == (int)CUDNN_POINTWISE_CMP_LT &&
                  (int)KP_AND == (int)CUDNN_POINTWISE_LOGICAL_AND && (int)KP_GEN_INDEX == (int)CUDNN_POINTWISE_GEN_INDEX &&
                  (int)KP_SELECT == (int)CUDNN_POINTWISE_BINARY_SELECT,
              "cudnnPointwiseMode_t");
static_assert((int)KR_ADD == (int)CUDNN_REDUCE_TENSOR_ADD && (int)KR_MAX == (int)CUDNN_REDUCE_TENSOR_MAX, "cudnnReduceTensorOp_t");
static_assert((int)KH_FALLBACK == (int)CUDNN_HEUR_MODE_FALLBACK && (int)KH_A == (int)CUDNN_HEUR_MODE_A, "cudnnBackendHeurMode_t");
static_assert(sizeof(cudnnHandle_t) == sizeof(kdnn_handle) && sizeof(cudnnBackendDescriptor_t) == sizeof(kdnn_desc) &&
                  sizeof(cudnnStatus_t) == sizeof(kdnn_status) && (int)CUDNN_STATUS_SUCCESS == 0,
              "ABI");
#endif

#define KDNN_FUNCS(X)                                                                                             \
    X(GetVersion, size_t, (void))                                                                                \
    X(Create, kdnn_status, (kdnn_handle *))                                                                      \
    X(SetStream, kdnn_status, (kdnn_handle, cudaStream_t))                                                       \
    X(GetErrorString, const char *, (kdnn_status))                                                               \
    X(BackendCreateDescriptor, kdnn_status, (int, kdnn_desc *))                                                  \
    X(BackendDestroyDescriptor, kdnn_status, (kdnn_desc))                                                        \
    X(BackendFinalize, kdnn_status, (kdnn_desc))                                                                 \
    X(BackendSetAttribute, kdnn_status, (kdnn_desc, int, int, int64_t, const void *))                            \
    X(BackendGetAttribute, kdnn_status, (kdnn_desc, int, int, int64_t, int64_t *, void *))                       \
    X(BackendExecute, kdnn_status, (kdnn_handle, kdnn_desc, kdnn_desc))

#define KDNN_FIELD(name, ret, args) ret(*name) args;
static struct {
    KDNN_FUNCS(KDNN_FIELD)
    void (*GetLastErrorString)(char *, size_t); // cuDNN >= 9.0; optional
} dn;
#undef KDNN_FIELD

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;          // 0 not tried, 1 ok, -1 failed
static char load_why[512];  // why not, when loaded == -1
static long version;

static int dnn_load(void) {
    if (loaded) return loaded;
    const char *env = getenv("KILN_CUDNN_LIB");
    const char *names[] = {env && *env ? env : "libcudnn.so.9", "libcudnn.so"};
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why, "cannot open %s (set KILN_CUDNN_LIB): %s", names[0], e ? e : "?");
        return loaded = -1;
    }
#define KDNN_SYM(name, ret, args)                                                                                 \
    if (!(*(void **)&dn.name = dlsym(h, "cudnn" #name))) {                                                        \
        snprintf(load_why, sizeof load_why, "%s has no cudnn" #name, names[0]);                                   \
        return loaded = -1;                                                                                       \
    }
    KDNN_FUNCS(KDNN_SYM)
#undef KDNN_SYM
    *(void **)&dn.GetLastErrorString = dlsym(h, "cudnnGetLastErrorString");
    version = (long)dn.GetVersion();
    if (version < 90000) {
        snprintf(load_why, sizeof load_why, "cuDNN %ld is too old (kiln needs 9.0 or later)", version);
        return loaded = -1;
    }
    return loaded = 1;
}

long att_cudnn_version(void) {
    pthread_mutex_lock(&lock);
    long v = dnn_load() == 1 ? version : 0;
    pthread_mutex_unlock(&lock);
    return v;
}

// ---- graph building: every call records the first failure (call, status, cuDNN's last message) ----
#define GB_MAXD 256
struct gb {
    kdnn_desc d[GB_MAXD]; // every descriptor made, destroyed with the graph when the plan fails
    int nd;
    kdnn_desc ops[48];
    int nops;
    int64_t next_uid;
    char err[512];
};

static void gb_fail(gb *g, const char *what, kdnn_status s) {
    if (g->err[0]) return;
    char last[256] = "";
    if (dn.GetLastErrorString) dn.GetLastErrorString(last, sizeof last);
    snprintf(g->err, sizeof g->err, "%s: %s (%d)%s%s", what, dn.GetErrorString(s), s, last[0] ? ": " : "", last);
}
static kdnn_desc gb_make(gb *g, int type, const char *what) {
    kdnn_desc d = NULL;
    if (g->err[0]) return NULL;
    if (g->nd >= GB_MAXD) {
        snprintf(g->err, sizeof g->err, "%s: too many descriptors", what);
        return NULL;
    }
    kdnn_status s = dn.BackendCreateDescriptor(type, &d);
    if (s) {
        gb_fail(g, what, s);
        return NULL;
    }
    return g->d[g->nd++] = d;
}
static void gb_set(gb *g, kdnn_desc d, int name, int type, int64_t n, const void *v, const char *what) {
    if (g->err[0] || !d) return;
    kdnn_status s = dn.BackendSetAttribute(d, name, type, n, v);
    if (s) gb_fail(g, what, s);
}
static void gb_fin(gb *g, kdnn_desc d, const char *what) {
    if (g->err[0] || !d) return;
    kdnn_status s = dn.BackendFinalize(d);
    if (s) gb_fail(g, what, s);
}
static void gb_free(gb *g) {
    for (int i = g->nd - 1; i >= 0; i--) dn.BackendDestroyDescriptor(g->d[i]);
    g->nd = 0;
}

// a tensor: uid 0 = virtual (a fresh uid is assigned); by_value: a host scalar in the variant pack
static kdnn_desc gb_tensor(gb *g, int64_t uid, int dtype, const int64_t dims[4], const int64_t strides[4],
                           int by_value, const char *what) {
    kdnn_desc t = gb_make(g, KD_TENSOR, what);
    bool virt = uid == 0, byv = by_value != 0;
    int64_t id = virt ? g->next_uid++ : uid, align = 16;
    gb_set(g, t, KA_T_DTYPE, KT_DATA_TYPE, 1, &dtype, what);
    gb_set(g, t, KA_T_DIMS, KT_INT64, 4, dims, what);
    gb_set(g, t, KA_T_STRIDES, KT_INT64, 4, strides, what);
    gb_set(g, t, KA_T_UID, KT_INT64, 1, &id, what);
    gb_set(g, t, KA_T_ALIGN, KT_INT64, 1, &align, what);
    gb_set(g, t, KA_T_VIRTUAL, KT_BOOLEAN, 1, &virt, what);
    if (byv) gb_set(g, t, KA_T_BY_VALUE, KT_BOOLEAN, 1, &byv, what);
    gb_fin(g, t, what);
    return t;
}
static kdnn_desc gb_scalar(gb *g, int64_t uid, int dtype, const char *what) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return gb_tensor(g, uid, dtype, one, one, 1, what);
}
static void gb_op(gb *g, kdnn_desc op) {
    if (!g->err[0] && op) g->ops[g->nops++] = op;
}
// y = mode(x [, b] [, t]); axis >= 0 for GEN_INDEX (and as cudnn-frontend sets it on the window's add)
static void gb_pw(gb *g, int mode, int comp, kdnn_desc x, kdnn_desc b, kdnn_desc t, kdnn_desc y, int64_t axis,
                  const char *what) {
    kdnn_desc p = gb_make(g, KD_POINTWISE, what);
    gb_set(g, p, KA_PW_MODE, KT_PW_MODE, 1, &mode, what);
    gb_set(g, p, KA_PW_MATH_PREC, KT_DATA_TYPE, 1, &comp, what);
    if (axis >= 0) gb_set(g, p, KA_PW_AXIS, KT_INT64, 1, &axis, what);
    gb_fin(g, p, what);
    kdnn_desc op = gb_make(g, KD_OP_POINTWISE, what);
    gb_set(g, op, KA_OP_PW_DESC, KT_DESC, 1, &p, what);
    gb_set(g, op, KA_OP_PW_X, KT_DESC, 1, &x, what);
    if (b) gb_set(g, op, KA_OP_PW_B, KT_DESC, 1, &b, what);
    if (t) gb_set(g, op, KA_OP_PW_T, KT_DESC, 1, &t, what);
    gb_set(g, op, KA_OP_PW_Y, KT_DESC, 1, &y, what);
    gb_fin(g, op, what);
    gb_op(g, op);
}
static void gb_red(gb *g, int rop, kdnn_desc x, kdnn_desc y, const char *what) {
    kdnn_desc r = gb_make(g, KD_REDUCTION, what);
    int comp = KF_FLOAT;
    gb_set(g, r, KA_RED_OP, KT_RED_OP, 1, &rop, what);
    gb_set(g, r, KA_RED_COMP, KT_DATA_TYPE, 1, &comp, what);
    gb_fin(g, r, what);
    kdnn_desc op = gb_make(g, KD_OP_REDUCTION, what);
    gb_set(g, op, KA_OP_RED_X, KT_DESC, 1, &x, what);
    gb_set(g, op, KA_OP_RED_Y, KT_DESC, 1, &y, what);
    gb_set(g, op, KA_OP_RED_DESC, KT_DESC, 1, &r, what);
    gb_fin(g, op, what);
    gb_op(g, op);
}
// c = a·b (batched over the first two dims); m/n/k: optional per-batch overrides (the padding workaround)
static void gb_mm(gb *g, kdnn_desc a, kdnn_desc b, kdnn_desc c, kdnn_desc m, kdnn_desc n, kdnn_desc k,
                  const char *what) {
    kdnn_desc mm = gb_make(g, KD_MATMUL, what);
    int comp = KF_FLOAT;
    gb_set(g, mm, KA_MM_COMP, KT_DATA_TYPE, 1, &comp, what);
    gb_fin(g, mm, what);
    kdnn_desc op = gb_make(g, KD_OP_MATMUL, what);
    gb_set(g, op, KA_OP_MM_A, KT_DESC, 1, &a, what);
    gb_set(g, op, KA_OP_MM_B, KT_DESC, 1, &b, what);
    gb_set(g, op, KA_OP_MM_C, KT_DESC, 1, &c, what);
    gb_set(g, op, KA_OP_MM_DESC, KT_DESC, 1, &mm, what);
    if (m) gb_set(g, op, KA_OP_MM_M, KT_DESC, 1, &m, what);
    if (n) gb_set(g, op, KA_OP_MM_N, KT_DESC, 1, &n, what);
    if (k) gb_set(g, op, KA_OP_MM_K, KT_DESC, 1, &k, what);
    gb_fin(g, op, what);
    gb_op(g, op);
}
static void gb_reshape(gb *g, kdnn_desc x, kdnn_desc y, const char *what) {
    kdnn_desc op = gb_make(g, KD_OP_RESHAPE, what);
    gb_set(g, op, KA_OP_RESHAPE_X, KT_DESC, 1, &x, what);
    gb_set(g, op, KA_OP_RESHAPE_Y, KT_DESC, 1, &y, what);
    gb_fin(g, op, what);
    gb_op(g, op);
}
// A new virtual tensor (dtype, dims, strides) = mode(x [, b]) computed in f32, or = the reduction rop of x: the
// tensor is made first, then the op (the order every graph of this file makes them in)
static kdnn_desc gb_pw_new(gb *g, int mode, int dtype, kdnn_desc x, kdnn_desc b, const int64_t dims[4],
                           const int64_t strides[4], const char *what) {
    kdnn_desc y = gb_tensor(g, 0, dtype, dims, strides, 0, what);
    gb_pw(g, mode, KF_FLOAT, x, b, NULL, y, -1, what);
    return y;
}
static kdnn_desc gb_red_new(gb *g, int rop, kdnn_desc x, const int64_t dims[4], const int64_t strides[4],
                            const char *what) {
    kdnn_desc y = gb_tensor(g, 0, KF_FLOAT, dims, strides, 0, what);
    gb_red(g, rop, x, y, what);
    return y;
}
// a new virtual f32 tensor (dims, strides) = a·b, with gb_mm's overrides m, n, k
static kdnn_desc gb_mm_new(gb *g, kdnn_desc a, kdnn_desc b, const int64_t dims[4], const int64_t strides[4],
                           kdnn_desc m, kdnn_desc n, kdnn_desc k, const char *what) {
    kdnn_desc c = gb_tensor(g, 0, KF_FLOAT, dims, strides, 0, what);
    gb_mm(g, a, b, c, m, n, k, what);
    return c;
}

// ---- the plans ----
// uids of the tensors that live outside the graph
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SCALE, U_NEGINF1, U_NEGINF2, U_ONE, U_WIN, U_SUM,
    U_DQACC, U_SEQQ, U_SEQKV, U_NEGINF3, U_COUNT
};

struct att_plan {
    int dev, backward, nondet, pad; // pad: the backward with the padding workaround
    int64_t B, T, tk_cap, NH, KV, D, window;
    int causal;                     // the layout (att_cudnn_layout, rows resolved: never 0)
    int64_t q_row, kv_row, o_row, q_seq, tk;
    float scale;
    int ok;            // 1: plan usable; 0: cuDNN refused (why)
    char why[600];
    kdnn_desc plan;
    int64_t ws;        // the plan's workspace bytes
    int64_t off_sum, off_dqacc, total; // kiln's workspace tensors after the plan's, total bytes
    int64_t uids[U_COUNT];
    int nuid;
    float v_scale, v_neginf, v_one, v_win; // the by-value scalars (read at execution)
    int32_t *seq;      // device [2B]: the padding workaround's sequence lengths (q then kv), or NULL
    int64_t engine;
    int cfg, ncfg, mode; // which of the heuristics' ncfg configurations (mode A, else fallback) finalized
    // KILN_CUDNN_AUTOTUNE=1: every configuration that finalizes, timed on the first call, the fastest kept
    kdnn_desc cand[8];
    int64_t cand_engine[8];
    int cand_cfg[8], ncand, tuned;
    gb *graph;         // the operation graph's descriptors, which the plan's stay tied to (freed with the plan)
    uint64_t used;     // the plan cache's clock at its last use (the least recently used goes first)
};

static int autotune_on(void) {
    const char *e = getenv("KILN_CUDNN_AUTOTUNE");
    return e && *e && strcmp(e, "0") != 0;
}

// The plan cache: KILN_CUDNN_PLANS plans at most (default 64, the most kept at once is MAX_PLANS); past that the
// least recently used is destroyed, so a process that meets many shapes (a test suite, CLIP over changing image
// counts) keeps cuDNN for the shapes it uses now instead of falling back to kiln's kernels for every new one.
#define MAX_PLANS 256
static att_plan *plans[MAX_PLANS];
static int nplans;
static uint64_t plan_clock;
static kdnn_handle handles[64]; // per device

static int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

// the mask of kiln's visibility rule on the scores s [B,H,T,T]: causal, then the window's left bound
static kdnn_desc gb_masks(gb *g, kdnn_desc s, const int64_t *S, const int64_t *Sst, int64_t window) {
    kdnn_desc row = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "causal row index");
    kdnn_desc col = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "causal column index");
    gb_pw(g, KP_GEN_INDEX, KF_FLOAT, s, NULL, NULL, row, 2, "causal row index");
    gb_pw(g, KP_GEN_INDEX, KF_FLOAT, s, NULL, NULL, col, 3, "causal column index");
    kdnn_desc keep = gb_tensor(g, 0, KF_BOOL, S, Sst, 0, "causal row >= column");
    gb_pw(g, KP_CMP_GE, KF_BOOL, row, col, NULL, keep, -1, "causal row >= column");
    kdnn_desc ninf = gb_scalar(g, U_NEGINF1, KF_FLOAT, "-inf");
    kdnn_desc out = gb_tensor(g, 0, KF_FLOAT, S, Sst, 0, "causal select");
    gb_pw(g, KP_SELECT, KF_FLOAT, s, ninf, keep, out, -1, "causal select");
    if (window <= 0) return out;
    kdnn_desc row2 = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "window row index");
    kdnn_desc col2 = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "window column index");
    gb_pw(g, KP_GEN_INDEX, KF_FLOAT, out, NULL, NULL, row2, 2, "window row index");
    gb_pw(g, KP_GEN_INDEX, KF_FLOAT, out, NULL, NULL, col2, 3, "window column index");
    kdnn_desc win = gb_scalar(g, U_WIN, KF_FLOAT, "window");
    kdnn_desc colw = gb_tensor(g, 0, KF_FLOAT, S, Sst, 0, "column + window");
    gb_pw(g, KP_ADD, KF_FLOAT, col2, win, NULL, colw, 3, "column + window");
    kdnn_desc keep2 = gb_tensor(g, 0, KF_BOOL, S, Sst, 0, "column + window > row");
    gb_pw(g, KP_CMP_GT, KF_BOOL, colw, row2, NULL, keep2, -1, "column + window > row");
    kdnn_desc ninf2 = gb_scalar(g, U_NEGINF2, KF_FLOAT, "-inf");
    kdnn_desc out2 = gb_tensor(g, 0, KF_FLOAT, S, Sst, 0, "window select");
    gb_pw(g, KP_SELECT, KF_FLOAT, out, ninf2, keep2, out2, -1, "window select");
    return out2;
}

// cuDNN <= 9.15's backward needs an explicit padding mask when the key count is not a multiple of 128
static kdnn_desc gb_padding(gb *g, kdnn_desc s, const int64_t *S, const int64_t *Sst, kdnn_desc seqq,
                            kdnn_desc seqkv) {
    kdnn_desc row = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "padding row index");
    kdnn_desc col = gb_tensor(g, 0, KF_INT32, S, Sst, 0, "padding column index");
    gb_pw(g, KP_GEN_INDEX, KF_INT32, s, NULL, NULL, row, 2, "padding row index");
    gb_pw(g, KP_GEN_INDEX, KF_INT32, s, NULL, NULL, col, 3, "padding column index");
    kdnn_desc rm = gb_tensor(g, 0, KF_BOOL, S, Sst, 0, "row < seq_len_q");
    kdnn_desc cm = gb_tensor(g, 0, KF_BOOL, S, Sst, 0, "column < seq_len_kv");
    gb_pw(g, KP_CMP_LT, KF_BOOL, row, seqq, NULL, rm, -1, "row < seq_len_q");
    gb_pw(g, KP_CMP_LT, KF_BOOL, col, seqkv, NULL, cm, -1, "column < seq_len_kv");
    kdnn_desc m = gb_tensor(g, 0, KF_BOOL, S, Sst, 0, "padding and");
    gb_pw(g, KP_AND, KF_BOOL, rm, cm, NULL, m, -1, "padding and");
    kdnn_desc ninf = gb_scalar(g, U_NEGINF3, KF_FLOAT, "-inf");
    kdnn_desc out = gb_tensor(g, 0, KF_FLOAT, S, Sst, 0, "padding select");
    gb_pw(g, KP_SELECT, KF_FLOAT, s, ninf, m, out, -1, "padding select");
    return out;
}

static void build_forward(gb *g, att_plan *p) {
    // T queries over tk keys (tk > T only for the layouts' leading queries, without a mask)
    const int64_t B = p->B, T = p->T, tk = p->tk, H = p->NH, KV = p->KV, D = p->D, tc = p->tk_cap, qs = p->q_seq;
    const int64_t qr = p->q_row, kr = p->kv_row, orow = p->o_row;
    const int64_t Qd[4] = {B, H, T, D}, Qs[4] = {qs * qr, D, qr, 1}, Os[4] = {qs * orow, D, orow, 1};
    const int64_t Kd[4] = {B, KV, D, tk}, Ks[4] = {tc * kr, D, 1, kr}; // Kᵀ over kiln's K
    const int64_t Vd[4] = {B, KV, tk, D}, Vs[4] = {tc * kr, D, kr, 1};
    const int64_t S[4] = {B, H, T, tk}, Ss[4] = {H * T * tk, T * tk, tk, 1};
    const int64_t R[4] = {B, H, T, 1}, Rs[4] = {H * T, T, 1, 1};
    kdnn_desc q = gb_tensor(g, U_Q, KF_BF16, Qd, Qs, 0, "Q");
    kdnn_desc kt = gb_tensor(g, U_K, KF_BF16, Kd, Ks, 0, "K");
    kdnn_desc v = gb_tensor(g, U_V, KF_BF16, Vd, Vs, 0, "V");
    kdnn_desc o = gb_tensor(g, U_O, KF_BF16, Qd, Os, 0, "O");
    kdnn_desc st = gb_tensor(g, U_STATS, KF_FLOAT, R, Rs, 0, "stats");
    kdnn_desc s0 = gb_mm_new(g, q, kt, S, Ss, NULL, NULL, NULL, "Q.K^T");
    kdnn_desc sc = gb_scalar(g, U_SCALE, KF_FLOAT, "scale");
    kdnn_desc s1 = gb_pw_new(g, KP_MUL, KF_FLOAT, s0, sc, S, Ss, "scores x scale");
    kdnn_desc s2 = p->causal ? gb_masks(g, s1, S, Ss, p->window) : s1;
    kdnn_desc mx = gb_red_new(g, KR_MAX, s2, R, Rs, "row max");
    kdnn_desc sub = gb_pw_new(g, KP_SUB, KF_FLOAT, s2, mx, S, Ss, "scores - max");
    kdnn_desc ex = gb_pw_new(g, KP_EXP, KF_FLOAT, sub, NULL, S, Ss, "exp");
    kdnn_desc sum = gb_red_new(g, KR_ADD, ex, R, Rs, "row sum");
    kdnn_desc lg = gb_pw_new(g, KP_LOG, KF_FLOAT, sum, NULL, R, Rs, "log sum");
    gb_pw(g, KP_ADD, KF_FLOAT, mx, lg, NULL, st, -1, "stats = max + log sum");
    kdnn_desc pr = gb_pw_new(g, KP_DIV, KF_BF16, ex, sum, S, Ss, "probabilities");
    gb_mm(g, pr, v, o, NULL, NULL, NULL, "P.V");
    p->uids[p->nuid++] = U_Q, p->uids[p->nuid++] = U_K, p->uids[p->nuid++] = U_V, p->uids[p->nuid++] = U_O;
    p->uids[p->nuid++] = U_STATS, p->uids[p->nuid++] = U_SCALE;
    if (p->causal) p->uids[p->nuid++] = U_NEGINF1;
    if (p->window > 0) p->uids[p->nuid++] = U_WIN, p->uids[p->nuid++] = U_NEGINF2;
}

// y = xᵀ·r, a K or V gradient: x [B,H,T,T] (P or dS) reshaped into its bf16 transpose, the product made per
// query head and summed over each KV head's group when there are groups (GQA); what: the names of the
// transpose, the product, the per-head gradient and the sum
static void gb_grad_kv(gb *g, kdnn_desc x, kdnn_desc r, kdnn_desc y, bool group, const int64_t S[4],
                       const int64_t STs[4], const int64_t Full[4], const int64_t Fulls[4], kdnn_desc seqq,
                       kdnn_desc seqkv, const char *const what[4]) {
    kdnn_desc xt = gb_tensor(g, 0, KF_BF16, S, STs, 0, what[0]);
    gb_reshape(g, x, xt, what[0]);
    if (!group) {
        gb_mm(g, xt, r, y, seqkv, NULL, seqq, what[1]);
    } else {
        kdnn_desc yf = gb_tensor(g, 0, KF_BF16, Full, Fulls, 0, what[2]);
        gb_mm(g, xt, r, yf, seqkv, NULL, seqq, what[1]);
        gb_red(g, KR_ADD, yf, y, what[3]);
    }
}

static void build_backward(gb *g, att_plan *p) {
    const int64_t B = p->B, T = p->T, H = p->NH, KV = p->KV, D = p->D, tc = p->tk_cap;
    const int64_t Qd[4] = {B, H, T, D}, Qs[4] = {T * H * D, D, H * D, 1};
    const int64_t Kd[4] = {B, KV, D, T}, Ks[4] = {tc * KV * D, D, 1, KV * D}; // Kᵀ, Vᵀ over kiln's K, V
    const int64_t KVd[4] = {B, KV, T, D}, KVs[4] = {tc * KV * D, D, KV * D, 1};
    const int64_t S[4] = {B, H, T, T}, Ss[4] = {H * T * T, T * T, T, 1}, STs[4] = {H * T * T, T * T, 1, T};
    const int64_t R[4] = {B, H, T, 1}, Rs[4] = {H * T, T, 1, 1};
    const int64_t Full[4] = {B, H, T, D}, Fulls[4] = {H * T * D, T * D, D, 1};
    const int64_t dOOs[4] = {H * T * D, T * D, H * D, 1};
    kdnn_desc q = gb_tensor(g, U_Q, KF_BF16, Qd, Qs, 0, "Q");
    kdnn_desc kt = gb_tensor(g, U_K, KF_BF16, Kd, Ks, 0, "K");
    kdnn_desc vt = gb_tensor(g, U_V, KF_BF16, Kd, Ks, 0, "V");
    kdnn_desc o = gb_tensor(g, U_O, KF_BF16, Qd, Qs, 0, "O");
    kdnn_desc dO = gb_tensor(g, U_DO, KF_BF16, Qd, Qs, 0, "dO");
    kdnn_desc st = gb_tensor(g, U_STATS, KF_FLOAT, R, Rs, 0, "stats");
    kdnn_desc dQ = gb_tensor(g, U_DQ, KF_BF16, Qd, Qs, 0, "dQ");
    kdnn_desc dK = gb_tensor(g, U_DK, KF_BF16, KVd, KVs, 0, "dK");
    kdnn_desc dV = gb_tensor(g, U_DV, KF_BF16, KVd, KVs, 0, "dV");
    kdnn_desc seqq = NULL, seqkv = NULL;
    if (p->seq) {
        const int64_t Ld[4] = {B, 1, 1, 1}, Ls[4] = {1, 1, 1, 1};
        seqq = gb_tensor(g, U_SEQQ, KF_INT32, Ld, Ls, 0, "seq_len_q");
        seqkv = gb_tensor(g, U_SEQKV, KF_INT32, Ld, Ls, 0, "seq_len_kv");
    }
    // row sums of dO·O (the softmax backward's correction), kept in kiln's workspace
    kdnn_desc doo = gb_pw_new(g, KP_MUL, KF_FLOAT, dO, o, Qd, dOOs, "dO x O");
    kdnn_desc rs = gb_red_new(g, KR_ADD, doo, R, Rs, "sum dO x O");
    kdnn_desc one = gb_scalar(g, U_ONE, KF_FLOAT, "one");
    kdnn_desc sum = gb_tensor(g, U_SUM, KF_FLOAT, R, Rs, 0, "softmax sum");
    gb_pw(g, KP_MUL, KF_FLOAT, rs, one, NULL, sum, -1, "softmax sum");
    // P = exp(S·scale - lse), masked
    kdnn_desc s0 = gb_mm_new(g, q, kt, S, Ss, seqq, seqkv, NULL, "Q.K^T");
    kdnn_desc sc = gb_scalar(g, U_SCALE, KF_FLOAT, "scale");
    kdnn_desc s1 = gb_pw_new(g, KP_MUL, KF_FLOAT, s0, sc, S, Ss, "scores x scale");
    kdnn_desc s2 = gb_pw_new(g, KP_SUB, KF_FLOAT, s1, st, S, Ss, "scores - stats");
    if (p->seq) s2 = gb_padding(g, s2, S, Ss, seqq, seqkv);
    kdnn_desc s3 = gb_masks(g, s2, S, Ss, p->window);
    kdnn_desc e = gb_pw_new(g, KP_EXP, KF_FLOAT, s3, NULL, S, Ss, "P");
    // dV = Pᵀ·dO (summed over each KV head's group)
    static const char *const dv_what[4] = {"P^T", "P^T.dO", "dV per query head", "dV group sum"};
    gb_grad_kv(g, e, dO, dV, H != KV, S, STs, Full, Fulls, seqq, seqkv, dv_what);
    // dS = P·(dO·Vᵀ - sum)·scale
    kdnn_desc dp = gb_mm_new(g, dO, vt, S, Ss, seqq, seqkv, NULL, "dO.V^T");
    kdnn_desc d1 = gb_pw_new(g, KP_SUB, KF_FLOAT, dp, sum, S, Ss, "dP - sum");
    kdnn_desc d2 = gb_pw_new(g, KP_MUL, KF_FLOAT, d1, e, S, Ss, "x P");
    kdnn_desc ds = gb_pw_new(g, KP_MUL, KF_FLOAT, d2, sc, S, Ss, "dS");
    // dK = dSᵀ·Q (summed over each group)
    static const char *const dk_what[4] = {"dS^T", "dS^T.Q", "dK per query head", "dK group sum"};
    gb_grad_kv(g, ds, q, dK, H != KV, S, STs, Full, Fulls, seqq, seqkv, dk_what);
    // dQ = dS·K
    kdnn_desc k = gb_tensor(g, 0, KF_FLOAT, KVd, KVs, 0, "K");
    gb_reshape(g, kt, k, "K from K^T");
    if (p->nondet) {
        kdnn_desc acc = gb_tensor(g, U_DQACC, KF_FLOAT, Full, Fulls, 0, "dQ accumulator");
        gb_mm(g, ds, k, acc, seqq, NULL, seqkv, "dS.K");
        gb_pw(g, KP_IDENTITY, KF_FLOAT, acc, NULL, NULL, dQ, -1, "dQ");
    } else {
        gb_mm(g, ds, k, dQ, seqq, NULL, seqkv, "dS.K");
    }
    static const int base[] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_ONE, U_SUM, U_SCALE, U_NEGINF1};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) p->uids[p->nuid++] = base[i];
    if (p->window > 0) p->uids[p->nuid++] = U_WIN, p->uids[p->nuid++] = U_NEGINF2;
    if (p->nondet) p->uids[p->nuid++] = U_DQACC;
    if (p->seq) p->uids[p->nuid++] = U_SEQQ, p->uids[p->nuid++] = U_SEQKV, p->uids[p->nuid++] = U_NEGINF3;
}

// the operation graph → heuristics → the first engine configuration that finalizes
static void make_plan(gb *g, att_plan *p, kdnn_handle h) {
    kdnn_desc graph = gb_make(g, KD_OPGRAPH, "operation graph");
    gb_set(g, graph, KA_OPGRAPH_OPS, KT_DESC, g->nops, g->ops, "operation graph");
    gb_set(g, graph, KA_OPGRAPH_HANDLE, KT_HANDLE, 1, &h, "operation graph");
    gb_fin(g, graph, "operation graph");
    if (g->err[0]) return;
    const int modes[2] = {KH_A, KH_FALLBACK};
    const int tune = autotune_on();
    char tried[256] = "";
    for (int mi = 0; mi < 2 && !p->plan; mi++) {
        kdnn_desc heur = gb_make(g, KD_ENGINEHEUR, "heuristics");
        gb_set(g, heur, KA_HEUR_OPGRAPH, KT_DESC, 1, &graph, "heuristics");
        gb_set(g, heur, KA_HEUR_MODE, KT_HEUR_MODE, 1, &modes[mi], "heuristics");
        gb_fin(g, heur, "heuristics");
        if (g->err[0]) return;
        int64_t n = 0;
        kdnn_status s = dn.BackendGetAttribute(heur, KA_HEUR_RESULTS, KT_DESC, 0, &n, NULL);
        if (s) {
            gb_fail(g, "heuristics results", s);
            return;
        }
        if (n > 16) n = 16;
        kdnn_desc cfg[16];
        int64_t got = 0;
        for (int64_t i = 0; i < n; i++) cfg[i] = gb_make(g, KD_ENGINECFG, "engine config");
        if (g->err[0]) return;
        if (n && (s = dn.BackendGetAttribute(heur, KA_HEUR_RESULTS, KT_DESC, n, &got, cfg))) {
            gb_fail(g, "heuristics results", s);
            return;
        }
        for (int64_t i = 0; i < got && p->ncand < (tune ? 8 : 1); i++) {
            kdnn_desc plan = NULL;
            if (dn.BackendCreateDescriptor(KD_PLAN, &plan)) continue;
            if (dn.BackendSetAttribute(plan, KA_PLAN_HANDLE, KT_HANDLE, 1, &h) ||
                dn.BackendSetAttribute(plan, KA_PLAN_ENGINECFG, KT_DESC, 1, &cfg[i]) ||
                (s = dn.BackendFinalize(plan))) {
                size_t l = strlen(tried);
                snprintf(tried + l, sizeof tried - l, "%s%d", l ? "," : "", s);
                dn.BackendDestroyDescriptor(plan);
                continue;
            }
            const int c = p->ncand++;
            p->cand[c] = plan, p->cand_cfg[c] = (int)i, p->cand_engine[c] = -1;
            p->ncfg = (int)got, p->mode = modes[mi];
            int64_t cnt = 0, ws = 0;
            dn.BackendGetAttribute(plan, KA_PLAN_WORKSPACE, KT_INT64, 1, &cnt, &ws);
            if (ws > p->ws) p->ws = ws; // the workspace fits every candidate
            kdnn_desc eng = NULL;
            if (!dn.BackendCreateDescriptor(2 /* ENGINE */, &eng)) {
                if (!dn.BackendGetAttribute(cfg[i], KA_ENGINECFG_ENGINE, KT_DESC, 1, &cnt, &eng))
                    dn.BackendGetAttribute(eng, KA_ENGINE_INDEX, KT_INT64, 1, &cnt, &p->cand_engine[c]);
                dn.BackendDestroyDescriptor(eng);
            }
        }
        if (p->ncand) p->plan = p->cand[0], p->cfg = p->cand_cfg[0], p->engine = p->cand_engine[0];
    }
    if (!p->plan && !g->err[0]) {
        char last[256] = "";
        if (dn.GetLastErrorString) dn.GetLastErrorString(last, sizeof last);
        snprintf(g->err, sizeof g->err, "no engine configuration finalizes (statuses %s)%s%s", tried[0] ? tried : "none",
                 last[0] ? ": " : "", last);
    }
}

static int plan_cap(void) {
    const char *e = getenv("KILN_CUDNN_PLANS");
    const long n = e && *e ? atol(e) : 64;
    return n < 1 ? 1 : n > MAX_PLANS ? MAX_PLANS : (int)n;
}

// Destroys the least recently used plan (its descriptors, the graph's and its device sequence lengths). Callers
// hold the lock, and no plan is used past it: an execution enqueued earlier has taken its by-value scalars at
// enqueue time, and cudaFree waits for the device's work before it frees the sequence lengths.
static void plan_evict(void) {
    int lru = 0;
    for (int i = 1; i < nplans; i++)
        if (plans[i]->used < plans[lru]->used) lru = i;
    att_plan *p = plans[lru];
    plans[lru] = plans[--nplans];
    for (int c = 0; c < p->ncand; c++)
        if (p->cand[c]) dn.BackendDestroyDescriptor(p->cand[c]);
    if (p->graph) {
        gb_free(p->graph);
        free(p->graph);
    }
    if (p->seq) cudaFree(p->seq);
    kiln_log(KILN_LOG_DEBUG, "attention: cuDNN plan cache full (KILN_CUDNN_PLANS=%d): the %s of B=%lld T=%lld H=%lld "
             "D=%lld, least recently used, destroyed", plan_cap(), p->backward ? "backward" : "forward", (long long)p->B,
             (long long)p->T, (long long)p->NH, (long long)p->D);
    free(p);
}

// the cached plan for this call, built on first use; NULL with *why when cuDNN cannot run it
static att_plan *get_plan(const kiln_attn_shape *s, const att_cudnn_layout *l, int backward, int nondet,
                          const char **why) {
    static const char *no_load = load_why;
    if (s->Tq != s->tk && !(l && !l->causal && !backward && s->Tq < s->tk)) {
        *why = "queries and keys differ in number (a KV cache): kiln's kernels";
        return NULL;
    }
    if (s->D % 8 || s->D < 32 || s->D > 128) {
        // cuDNN takes multiples of 8 up to 256; below 32 and above 128 kiln has not checked its answers
        *why = "head dim not a multiple of 8 from 32 to 128";
        return NULL;
    }
    const int causal = l ? l->causal != 0 : 1;
    const int64_t q_row = l && l->q_row ? l->q_row : s->NH * s->D, kv_row = l && l->kv_row ? l->kv_row : s->KV * s->D,
                  o_row = l && l->o_row ? l->o_row : s->NH * s->D, q_seq = l && l->q_seq ? l->q_seq : s->Tq;
    if (q_seq < s->Tq) {
        *why = "the layout's q_seq is shorter than the queries";
        return NULL;
    }
    if (l && backward) {
        *why = "the backward takes the trainer's layout only";
        return NULL;
    }
    if (q_row % 8 || kv_row % 8 || o_row % 8 || q_row < s->NH * s->D || kv_row < s->KV * s->D ||
        o_row < s->NH * s->D) {
        *why = "a row stride is not a multiple of 8 elements or is shorter than a token's heads";
        return NULL;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        *why = "no current CUDA device";
        return NULL;
    }
    if (dnn_load() != 1) {
        *why = no_load;
        return NULL;
    }
    if (version == 91000 || version == 91001) {
        *why = "cuDNN 9.10.0/9.10.1 have known SDPA bugs (cudnn-frontend refuses them)";
        return NULL;
    }
    const int64_t window = s->window > 0 && s->window < s->tk ? s->window : 0;
    if (window && !causal) {
        *why = "a sliding window needs the causal mask";
        return NULL;
    }
    if (window && version < 90200) {
        *why = "sliding window needs cuDNN 9.2";
        return NULL;
    }
    if (!backward) nondet = 0;
    // cuDNN <= 9.15's backward needs an explicit padding mask when the key count is not a multiple of 128 (as
    // cudnn-frontend adds one); KILN_CUDNN_PAD_MASK=1 builds that graph on any version (the GPU test uses it
    // to check the graph where the GPU machine's cuDNN is newer)
    const char *pm = getenv("KILN_CUDNN_PAD_MASK");
    const int pad = backward && (version <= 91500 || (pm && *pm && strcmp(pm, "0"))) && s->Tq % 128 != 0;
    for (int i = 0; i < nplans; i++) {
        att_plan *p = plans[i];
        if (p->dev == dev && p->backward == backward && p->nondet == nondet && p->pad == pad && p->B == s->B &&
            p->T == s->Tq &&
            p->tk_cap == s->tk_cap && p->NH == s->NH && p->KV == s->KV && p->D == s->D && p->window == window &&
            p->scale == s->scale && p->causal == causal && p->q_row == q_row && p->kv_row == kv_row &&
            p->o_row == o_row && p->q_seq == q_seq && p->tk == s->tk) {
            p->used = ++plan_clock;
            if (!p->ok) *why = p->why;
            return p->ok ? p : NULL;
        }
    }
    if (nplans >= plan_cap()) plan_evict();
    att_plan *p = (att_plan *)calloc(1, sizeof *p);
    if (!p) {
        *why = "out of host memory";
        return NULL;
    }
    p->dev = dev, p->backward = backward, p->nondet = nondet, p->pad = pad, p->B = s->B, p->T = s->Tq;
    p->tk_cap = s->tk_cap;
    p->NH = s->NH, p->KV = s->KV, p->D = s->D, p->window = window, p->scale = s->scale;
    p->causal = causal, p->q_row = q_row, p->kv_row = kv_row, p->o_row = o_row, p->q_seq = q_seq, p->tk = s->tk;
    p->v_scale = s->scale, p->v_one = 1.f, p->v_win = (float)window;
    p->v_neginf = version < 91000 ? -3.402823466e38f : -INFINITY;
    p->used = ++plan_clock;
    plans[nplans++] = p;
    gb *g = (gb *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(p->why, sizeof p->why, "out of host memory");
        *why = p->why;
        return NULL;
    }
    p->graph = g;
    g->next_uid = 1000;
    if (!handles[dev]) {
        kdnn_status st = dn.Create(&handles[dev]);
        if (st) {
            handles[dev] = NULL;
            gb_fail(g, "cudnnCreate", st);
        }
    }
    if (!g->err[0] && pad) {
        // the padding workaround: sequence lengths as device tensors
        int32_t *h = (int32_t *)malloc((size_t)(2 * s->B) * sizeof *h);
        if (h) {
            for (int64_t b = 0; b < 2 * s->B; b++) h[b] = (int32_t)s->Tq;
            if (cudaMalloc((void **)&p->seq, (size_t)(2 * s->B) * sizeof *h) != cudaSuccess ||
                cudaMemcpy(p->seq, h, (size_t)(2 * s->B) * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess ||
                /* landed before the plan runs on a non-blocking stream (a pageable copy may return before) */
                cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess)
                snprintf(g->err, sizeof g->err, "cannot allocate the sequence lengths");
            free(h);
        } else {
            snprintf(g->err, sizeof g->err, "out of host memory");
        }
    }
    if (!g->err[0]) {
        if (backward)
            build_backward(g, p);
        else
            build_forward(g, p);
        make_plan(g, p, handles[dev]);
    }
    if (g->err[0]) {
        snprintf(p->why, sizeof p->why, "cuDNN %ld %s%s B=%lld T=%lld H=%lld KV=%lld D=%lld window=%lld: %s",
                 version, backward ? (nondet ? "backward (atomic dQ)" : "backward") : "forward",
                 causal ? "" : " (no mask)", (long long)s->B, (long long)s->Tq, (long long)s->NH, (long long)s->KV,
                 (long long)s->D, (long long)window, g->err);
        gb_free(g);
        *why = p->why;
        return NULL;
    }
    p->off_sum = align256(p->ws);
    p->off_dqacc = p->off_sum + (backward ? align256(s->B * s->NH * s->Tq * 4) : 0);
    p->total = p->off_dqacc + (backward && nondet ? align256(s->B * s->NH * s->Tq * s->D * 4) : 0);
    // the deterministic backward's workspace grows as B·H·T² (1.1 GB at the [cuda] benchmark's shape): past
    // a cap, kiln's kernels (deterministic too, no T x T scratch) are the better trade
    const char *cap_env = getenv("KILN_CUDNN_WORKSPACE_MB");
    const long long cap_mb = cap_env && *cap_env ? atoll(cap_env) : 4096;
    if (cap_mb > 0 && p->total > (int64_t)cap_mb << 20) {
        snprintf(p->why, sizeof p->why,
                 "cuDNN's %s of B=%lld T=%lld H=%lld needs a %.2f GiB workspace, more than KILN_CUDNN_WORKSPACE_MB=%lld%s",
                 backward ? (nondet ? "backward" : "deterministic backward") : "forward", (long long)s->B,
                 (long long)s->Tq, (long long)s->NH, (double)p->total / (1 << 30), cap_mb,
                 backward && !nondet ? " (KILN_ATTENTION=cudnn-nondet needs far less)" : "");
        *why = p->why;
        return NULL;
    }
    p->ok = 1;
    kiln_log(KILN_LOG_DEBUG, "attention: cuDNN %ld engine %lld (configuration %d of %d, heuristics %s) for the %s%s%s "
             "of B=%lld T=%lld (keys %lld) H=%lld KV=%lld D=%lld window=%lld, rows q %lld kv %lld out %lld, workspace "
             "%lld bytes", version, (long long)p->engine, p->cfg + 1, p->ncfg, p->mode == KH_A ? "A" : "fallback",
             backward ? "backward" : "forward", pad ? " (padding mask)" : "", causal ? "" : " (no mask)",
             (long long)s->B, (long long)s->Tq, (long long)s->tk, (long long)s->NH, (long long)s->KV, (long long)s->D,
             (long long)window, (long long)q_row, (long long)kv_row, (long long)o_row, (long long)p->total);
    return p;
}

int att_cudnn_usable(const kiln_attn_shape *s, const att_cudnn_layout *l, int backward, int nondet,
                     const char **why) {
    pthread_mutex_lock(&lock);
    att_plan *p = get_plan(s, l, backward, nondet, why);
    pthread_mutex_unlock(&lock);
    return p ? 0 : -1;
}

// one execution of a plan on the stream; 0 or the cuDNN status, *what naming the failing call
static kdnn_status run_plan(att_plan *p, kdnn_desc plan, void **data, void *ws, cudaStream_t st, const char **what) {
    kdnn_desc vp = NULL;
    kdnn_status s;
    if ((s = dn.SetStream(handles[p->dev], st))) {
        *what = "cudnnSetStream";
        return s;
    }
    if ((s = dn.BackendCreateDescriptor(KD_VARPACK, &vp))) {
        *what = "variant pack";
        return s;
    }
    if ((s = dn.BackendSetAttribute(vp, KA_VP_UIDS, KT_INT64, p->nuid, p->uids)) ||
        (s = dn.BackendSetAttribute(vp, KA_VP_PTRS, KT_VOID_PTR, p->nuid, data)) ||
        (s = dn.BackendSetAttribute(vp, KA_VP_WORKSPACE, KT_VOID_PTR, 1, &ws)) || (s = dn.BackendFinalize(vp)))
        *what = "variant pack";
    else if ((s = dn.BackendExecute(handles[p->dev], plan, vp)))
        *what = "cudnnBackendExecute";
    dn.BackendDestroyDescriptor(vp);
    return s;
}

// KILN_CUDNN_AUTOTUNE: each candidate once to warm up, then the mean of 3 runs; the fastest becomes the plan
static void autotune(att_plan *p, void **data, void *ws, cudaStream_t st) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    char line[512];
    int n = snprintf(line, sizeof line, "attention: cuDNN autotune of the %s B=%lld T=%lld:", p->backward ? "backward"
                     : "forward", (long long)p->B, (long long)p->T);
    float best = INFINITY;
    int bi = 0;
    p->tuned = 1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
    for (int c = 0; c < p->ncand; c++) {
        const char *what = "";
        float ms = INFINITY;
        if (!run_plan(p, p->cand[c], data, ws, st, &what) && cudaEventRecord(e0, st) == cudaSuccess) {
            int ok = 1;
            for (int r = 0; r < 3 && ok; r++) ok = !run_plan(p, p->cand[c], data, ws, st, &what);
            if (ok && cudaEventRecord(e1, st) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
                cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
                ms /= 3;
            else
                ms = INFINITY;
        }
        cudaGetLastError();
        if (n < (int)sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, " [config %d, engine %lld] %.3f ms", p->cand_cfg[c] + 1,
                          (long long)p->cand_engine[c], ms);
        if (ms < best) best = ms, bi = c;
    }
    p->plan = p->cand[bi], p->cfg = p->cand_cfg[bi], p->engine = p->cand_engine[bi];
    kiln_log(KILN_LOG_DEBUG, "%s; config %d kept", line, p->cfg + 1);
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
}

// *ran = 0 (and no error) when the workspace could not be allocated: the caller runs kiln's kernels instead
static kiln_error *execute(att_plan *p, void *const ptrs[U_COUNT], cudaStream_t st, int *ran) {
    kiln_error *err = NULL;
    void *ws = NULL;
    void *data[U_COUNT];
    kdnn_status s;
    const char *what = "";
    *ran = 0;
    // a forward whose caller keeps no statistics (inference) writes them after the plan's workspace
    const int64_t stats_at = p->total, total = p->total + (ptrs[U_STATS] ? 0 : align256(p->B * p->NH * p->T * 4));
    if (total) {
        cudaError_t ce = kiln_ops_scratch(&ws, (size_t)total, st);
        if (ce == cudaErrorMemoryAllocation) {
            cudaGetLastError(); // not sticky: clear it so that the next launch check does not see it
            return NULL;
        }
        CUDA_TRY(ce);
    }
    *ran = 1;
    for (int i = 0; i < p->nuid; i++) {
        int64_t u = p->uids[i];
        data[i] = u == U_SUM ? (char *)ws + p->off_sum : u == U_DQACC ? (char *)ws + p->off_dqacc : ptrs[u];
        if (u == U_STATS && !ptrs[u]) data[i] = (char *)ws + stats_at;
    }
    if (p->ncand > 1 && !p->tuned) autotune(p, data, ws, st); // before the memset: the real run follows
    if (p->nondet && version < 90600)
        CUDA_TRY(cudaMemsetAsync((char *)ws + p->off_dqacc, 0, (size_t)(p->total - p->off_dqacc), st));
    if ((s = run_plan(p, p->plan, data, ws, st, &what))) {
        char last[256] = "";
        if (dn.GetLastErrorString) dn.GetLastErrorString(last, sizeof last);
        err = kiln_errorf(KILN_EIO, "cuDNN attention %s: %s: %s (%d)%s%s", p->backward ? "backward" : "forward", what,
                          dn.GetErrorString(s), s, last[0] ? ": " : "", last);
    }
done:
    if (ws) cudaFreeAsync(ws, st);
    return err;
}

kiln_error *att_cudnn_forward(kiln_bf16 *out, float *lse, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                              const kiln_attn_shape *s, const att_cudnn_layout *l, cudaStream_t st, int *ran) {
    *ran = 0;
    const char *why = NULL;
    pthread_mutex_lock(&lock);
    att_plan *p = get_plan(s, l, 0, 0, &why);
    kiln_error *err = NULL;
    if (!p) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuDNN attention forward: %s", why);
    } else {
        void *ptrs[U_COUNT] = {0};
        ptrs[U_Q] = (void *)q, ptrs[U_K] = (void *)k, ptrs[U_V] = (void *)v, ptrs[U_O] = out, ptrs[U_STATS] = lse;
        ptrs[U_SCALE] = &p->v_scale, ptrs[U_NEGINF1] = &p->v_neginf, ptrs[U_NEGINF2] = &p->v_neginf;
        ptrs[U_WIN] = &p->v_win;
        err = execute(p, ptrs, st, ran);
    }
    pthread_mutex_unlock(&lock);
    return err;
}

kiln_error *att_cudnn_backward(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv, const kiln_bf16 *dout,
                               const kiln_bf16 *out, const float *lse, const kiln_bf16 *q, const kiln_bf16 *k,
                               const kiln_bf16 *v, const kiln_attn_shape *s, int nondet, cudaStream_t st, int *ran) {
    const char *why = NULL;
    *ran = 0;
    pthread_mutex_lock(&lock);
    att_plan *p = get_plan(s, NULL, 1, nondet, &why);
    kiln_error *err = NULL;
    if (!p) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuDNN attention backward: %s", why);
    } else {
        void *ptrs[U_COUNT] = {0};
        ptrs[U_Q] = (void *)q, ptrs[U_K] = (void *)k, ptrs[U_V] = (void *)v, ptrs[U_O] = (void *)out;
        ptrs[U_STATS] = (void *)lse, ptrs[U_DO] = (void *)dout, ptrs[U_DQ] = dq, ptrs[U_DK] = dk, ptrs[U_DV] = dv;
        ptrs[U_SCALE] = &p->v_scale, ptrs[U_NEGINF1] = &p->v_neginf, ptrs[U_NEGINF2] = &p->v_neginf;
        ptrs[U_NEGINF3] = &p->v_neginf, ptrs[U_WIN] = &p->v_win, ptrs[U_ONE] = &p->v_one;
        ptrs[U_SEQQ] = p->seq, ptrs[U_SEQKV] = p->seq ? p->seq + s->B : NULL;
        err = execute(p, ptrs, st, ran);
    }
    pthread_mutex_unlock(&lock);
    return err;
}
