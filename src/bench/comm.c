/* kiln bench comm: collectives over a message-size sweep, in nccl-tests' style (flags, table columns, size
 * and bus-bandwidth conventions: see comm_formulas.h). Backends: on CPUs one process per rank under mpirun
 * (MPI) or one rank without it (local); on GPUs NCCL with one GPU per process under mpirun, and/or -g N GPUs
 * driven by one process (a thread per GPU, each a rank). Every result is checked against rank-dependent
 * fill patterns of small integers, exact in f32 and bf16 (made on the host and copied to the GPU).
 * Times are the slowest rank's (MAX over ranks); on GPUs each timed call is followed by a stream
 * synchronization, so a time includes one launch and one sync, as torch's `op(); synchronize()`. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "bench/comm_formulas.h"
#include "kiln/bench.h"
#include "kiln/comm.h"
#include "kiln/cuda.h"
#include "kiln/dtype.h"
#include "kiln/fsutil.h"

static const char usage[] =
    "usage: kiln bench comm [options]            (mpirun -np N kiln bench comm ... for N ranks)\n\n"
    "Times collectives over message sizes from -b to -e, nccl-tests' columns and bus-bandwidth conventions.\n"
    "One rank (no mpirun) moves no data between ranks: busbw is 0, and in place algbw too (records: \"moved\").\n\n"
    "  -b, --minbytes N      smallest size in bytes, K/M/G suffixes (default 8)\n"
    "  -e, --maxbytes N      largest size (default 1G; capped with a warning to what memory holds)\n"
    "  -f, --stepfactor N    multiply the size by N each step, N >= 2 (default 2)\n"
    "  -n, --iters N         timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
    "  -d, --datatype T      float | bfloat16 (default float; bf16 sums are f32 per element, rounded)\n"
    "  -o, --op sum          the reduction (sum only)\n"
    "  -c, --check 1|0       check every result (#wrong) (default 1)\n"
    "  --backend B           cpu (MPI under mpirun, else one local rank) or nccl (GPUs) (default cpu)\n"
    "  -g, --ngpus N         nccl: GPUs driven by this process, one thread (rank) each (default 1);\n"
    "                        under mpirun every process takes N GPUs of its host\n"
    "  --collectives LIST    comma-separated: all_reduce,reduce_scatter,all_gather,broadcast,alltoall\n"
    "                        (default all five)\n"
    "  --inplace, --outofplace   only that variant (default both)\n"
    "  --json FILE           write the JSON profile (section \"comm\")\n"
    "  --csv FILE            write the same records as CSV\n";

typedef struct {
    size_t minb, maxb;
    long factor, iters, warmup;
    kiln_dtype dt;
    int check;
    int want[KILN_COLL_COUNT];
    int oop, ip;
    int nccl;
    long ngpus;
    const char *json, *csv;
} opts;

/* ---- flags ---- */

static int quiet_rank(void) { /* usage errors: print once under mpirun */
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMI_RANK");
    return r && atoi(r) != 0;
}

static int usage_error(const char *fmt, ...) KILN_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    if (quiet_rank()) return 2;
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln bench comm: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see kiln bench comm --help)\n", stderr);
    va_end(ap);
    return 2;
}

/* "1024", "64K", "1M", "1G" (binary multiples, as nccl-tests); 0 on success */
static int parse_size(const char *s, size_t *out) {
    if (!isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    unsigned long long mul = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1ull << 10; break;
        case 'M': mul = 1ull << 20; break;
        case 'G': mul = 1ull << 30; break;
        case 'T': mul = 1ull << 40; break;
        default: return -1;
        }
        if (end[1]) return -1;
    }
    if (v > SIZE_MAX / mul) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_long(const char *s, long *out) {
    if (!isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int coll_from_name(const char *s, size_t len) {
    char n[32];
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < sizeof n; i++)
        if (s[i] != '_' && s[i] != '-') n[k++] = (char)tolower((unsigned char)s[i]);
    n[k] = 0;
    static const char *const plain[KILN_COLL_COUNT] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                                       "alltoall"};
    for (int c = 0; c < KILN_COLL_COUNT; c++)
        if (!strcmp(n, plain[c])) return c;
    return -1;
}

static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){.minb = 8, .maxb = (size_t)1 << 30, .factor = 2, .iters = 20, .warmup = 5, .dt = KILN_DT_F32,
                .check = 1, .ngpus = 1};
    int gpus_given = 0;
    int any_coll = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (!quiet_rank()) fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--inplace")) { o->ip = 1; continue; }
        if (!strcmp(a, "--outofplace")) { o->oop = 1; continue; }
        const char *v = NULL, *eq = NULL;
        char flag[64];
        if (!strncmp(a, "--", 2) && (eq = strchr(a, '=')) != NULL) { /* --flag=value */
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
            a = flag;
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[i + 1];
        }
#define IS(s, l) (!strcmp(a, s) || !strcmp(a, l))
        int known = IS("-b", "--minbytes") || IS("-e", "--maxbytes") || IS("-f", "--stepfactor") ||
                    IS("-n", "--iters") || IS("-w", "--warmup_iters") || IS("-d", "--datatype") || IS("-o", "--op") ||
                    IS("-c", "--check") || !strcmp(a, "--collectives") || !strcmp(a, "--json") || !strcmp(a, "--csv") ||
                    !strcmp(a, "--backend") || IS("-g", "--ngpus");
        if (!known) return usage_error("unknown option '%s'", argv[i]);
        if (!v) return usage_error("%s needs a value", a);
        if (!eq) i++;
        if (IS("-b", "--minbytes") || IS("-e", "--maxbytes")) {
            size_t *dst = a[1] == 'b' || !strcmp(a, "--minbytes") ? &o->minb : &o->maxb;
            if (parse_size(v, dst)) return usage_error("%s '%s' is not a size (bytes, optionally with K, M or G)", a, v);
        } else if (IS("-f", "--stepfactor")) {
            if (parse_long(v, &o->factor) || o->factor < 2)
                return usage_error("%s '%s': the step factor must be an integer >= 2", a, v);
        } else if (IS("-n", "--iters")) {
            if (parse_long(v, &o->iters) || o->iters < 1) return usage_error("%s '%s': iterations must be >= 1", a, v);
        } else if (IS("-w", "--warmup_iters")) {
            if (parse_long(v, &o->warmup) || o->warmup < 0)
                return usage_error("%s '%s': warm-up iterations must be >= 0", a, v);
        } else if (IS("-d", "--datatype")) {
            if (!strcmp(v, "float") || !strcmp(v, "float32") || !strcmp(v, "f32")) o->dt = KILN_DT_F32;
            else if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) o->dt = KILN_DT_BF16;
            else return usage_error("unknown datatype '%s' (float or bfloat16)", v);
        } else if (IS("-o", "--op")) {
            if (strcmp(v, "sum")) return usage_error("unsupported reduction op '%s' (sum only)", v);
        } else if (IS("-c", "--check")) {
            if (strcmp(v, "0") && strcmp(v, "1")) return usage_error("%s '%s': expected 1 or 0", a, v);
            o->check = v[0] == '1';
        } else if (!strcmp(a, "--collectives")) {
            for (const char *p = v;;) {
                size_t len = strcspn(p, ",");
                int c = coll_from_name(p, len);
                if (c < 0)
                    return usage_error("unknown collective '%.*s' (all_reduce, reduce_scatter, all_gather, broadcast, "
                                       "alltoall)", (int)len, p);
                o->want[c] = any_coll = 1;
                if (!p[len]) break;
                p += len + 1;
            }
        } else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "nccl")) o->nccl = 1;
            else if (!strcmp(v, "cpu") || !strcmp(v, "mpi")) o->nccl = 0;
            else return usage_error("unknown backend '%s' (cpu or nccl)", v);
        } else if (IS("-g", "--ngpus")) {
            if (parse_long(v, &o->ngpus) || o->ngpus < 1 || o->ngpus > 1024)
                return usage_error("%s '%s': the number of GPUs must be an integer in 1..1024", a, v);
            gpus_given = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = v;
        } else {
            o->csv = v;
        }
#undef IS
    }
    if (o->minb == 0) return usage_error("--minbytes must be at least 1");
    if (o->minb > o->maxb) return usage_error("--minbytes %zu is larger than --maxbytes %zu", o->minb, o->maxb);
    if (!any_coll)
        for (int c = 0; c < KILN_COLL_COUNT; c++) o->want[c] = 1;
    if (!o->ip && !o->oop) o->ip = o->oop = 1;
    if (gpus_given && !o->nccl) return usage_error("-g/--ngpus needs --backend nccl");
    return -1; /* go on */
}

/* ---- memory ---- */

static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        double kb = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
        fclose(f);
        if (kb >= 0) return kb * 1024.0;
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

/* ---- fill patterns (comm_formulas.h): small integers, exact in f32 and bf16 (sums too, at any rank count) ---- */

#define mov_val kiln_coll_mov_val
#define SENTINEL (-999.0f)

static void put(void *b, size_t i, float v, kiln_dtype dt) {
    if (dt == KILN_DT_BF16) ((uint16_t *)b)[i] = kiln_f32_to_bf16(v);
    else ((float *)b)[i] = v;
}
static float get(const void *b, size_t i, kiln_dtype dt) {
    return dt == KILN_DT_BF16 ? kiln_bf16_to_f32(((const uint16_t *)b)[i]) : ((const float *)b)[i];
}
static int same(float got, float want, kiln_dtype dt) {
    if (dt == KILN_DT_BF16) want = kiln_bf16_to_f32(kiln_f32_to_bf16(want));
    return got == want;
}

typedef struct {
    kiln_comm *c;
    kiln_coll coll;
    kiln_dtype dt;
    size_t ts, count, block; /* total elements, elements per rank block */
    int inplace, root;
    char *a, *b;             /* two buffers of the largest size */
    const void *send;
    void *recv;
    char *da, *db;           /* device backends: the buffers the collectives use; a, b stage them */
    const void *dsend;
    void *drecv;
} run;

/* set the send/recv pointers and fill the inputs (and a sentinel where results go) */
static void prepare(run *u) {
    const int me = u->c->rank, n = u->c->size;
    const size_t cnt = u->count, blk = u->block;
    const kiln_dtype dt = u->dt;
    char *a = u->a, *b = u->b;
    switch (u->coll) {
    case KILN_COLL_ALLREDUCE:
        u->send = u->inplace ? b : a;
        u->recv = b;
        for (size_t j = 0; j < cnt; j++) put((void *)u->send, j, kiln_coll_red_val(u->c->size, me, j), dt);
        if (!u->inplace) for (size_t j = 0; j < cnt; j++) put(b, j, SENTINEL, dt);
        break;
    case KILN_COLL_REDUCE_SCATTER:
        u->send = u->inplace ? b : a;
        u->recv = u->inplace ? b + (size_t)me * blk * u->ts : b;
        for (size_t j = 0; j < cnt; j++) put((void *)u->send, j, kiln_coll_red_val(u->c->size, me, j), dt);
        if (!u->inplace) for (size_t k = 0; k < blk; k++) put(b, k, SENTINEL, dt);
        break;
    case KILN_COLL_ALLGATHER:
        u->recv = b;
        u->send = u->inplace ? b + (size_t)me * blk * u->ts : a;
        for (size_t j = 0; j < cnt; j++) put(b, j, SENTINEL, dt);
        for (size_t k = 0; k < blk; k++) put((void *)u->send, k, mov_val(me, (size_t)me * blk + k), dt);
        break;
    case KILN_COLL_BROADCAST:
        u->send = u->inplace ? b : a;
        u->recv = b;
        for (size_t j = 0; j < cnt; j++) put(b, j, SENTINEL, dt);
        if (me == u->root)
            for (size_t j = 0; j < cnt; j++) put((void *)u->send, j, mov_val(me, j), dt);
        else if (!u->inplace)
            for (size_t j = 0; j < cnt; j++) put(a, j, SENTINEL, dt); /* never read */
        break;
    case KILN_COLL_ALLTOALL:
        u->send = u->inplace ? b : a;
        u->recv = b;
        if (!u->inplace) for (size_t j = 0; j < cnt; j++) put(b, j, SENTINEL, dt);
        for (size_t j = 0; j < cnt; j++) put((void *)u->send, j, mov_val(me, j), dt);
        break;
    default: break;
    }
    (void)n;
}

/* device backends: the host-prepared buffers go to the device, with send/recv at the same offsets (the
 * result always lies in b, so only b comes back) */
static kiln_error *upload(run *u) {
    if (!u->da) return NULL;
    const size_t bytes = u->count * u->ts;
    KILN_TRY(kiln_cuda_copy(u->da, u->a, bytes, KILN_CUDA_H2D));
    KILN_TRY(kiln_cuda_copy(u->db, u->b, bytes, KILN_CUDA_H2D));
    const char *s = u->send;
    u->dsend = s >= u->b && s < u->b + bytes ? u->db + (s - u->b) : u->da + (s - u->a);
    u->drecv = u->db + ((char *)u->recv - u->b);
    return NULL;
}
static kiln_error *download(run *u) {
    return u->da ? kiln_cuda_copy(u->b, u->db, u->count * u->ts, KILN_CUDA_D2H) : NULL;
}

static kiln_error *op(run *u) {
    kiln_comm *c = u->c;
    const void *s = u->da ? u->dsend : u->send;
    void *r = u->da ? u->drecv : u->recv;
    switch (u->coll) {
    case KILN_COLL_ALLREDUCE: return c->allreduce_sum_dt(c, s, r, u->count, u->dt);
    case KILN_COLL_REDUCE_SCATTER: return c->reduce_scatter_sum_dt(c, s, r, u->block, u->dt);
    case KILN_COLL_ALLGATHER: return c->allgather_dt(c, s, r, u->block, u->dt);
    case KILN_COLL_BROADCAST: return c->broadcast_dt(c, s, r, u->count, u->dt, u->root);
    case KILN_COLL_ALLTOALL: return c->alltoall_dt(c, s, r, u->block, u->dt);
    default: return kiln_errorf(KILN_EINVAL, "collective %d", (int)u->coll);
    }
}

/* elements of this rank's result that differ from the expected values */
static size_t count_wrong(const run *u) {
    const int me = u->c->rank;
    const size_t cnt = u->count, blk = u->block;
    const kiln_dtype dt = u->dt;
    const void *r = u->recv;
    size_t bad = 0;
    switch (u->coll) {
    case KILN_COLL_ALLREDUCE:
        for (size_t j = 0; j < cnt; j++) bad += !same(get(r, j, dt), kiln_coll_red_sum(u->c->size, j), dt);
        break;
    case KILN_COLL_REDUCE_SCATTER:
        for (size_t k = 0; k < blk; k++)
            bad += !same(get(r, k, dt), kiln_coll_red_sum(u->c->size, (size_t)me * blk + k), dt);
        break;
    case KILN_COLL_ALLGATHER:
        for (size_t j = 0; j < cnt; j++) bad += !same(get(r, j, dt), mov_val((int)(j / blk), j), dt);
        break;
    case KILN_COLL_BROADCAST:
        for (size_t j = 0; j < cnt; j++) bad += !same(get(r, j, dt), mov_val(u->root, j), dt);
        break;
    case KILN_COLL_ALLTOALL:
        for (size_t j = 0; j < cnt; j++)
            bad += !same(get(r, j, dt), mov_val((int)(j / blk), (size_t)me * blk + j % blk), dt);
        break;
    default: break;
    }
    return bad;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

typedef struct {
    double tmin, tavg, tmax, algbw, busbw;
    double wrong; /* -1: not checked */
    int stop;     /* a signal some rank caught (kiln_bench_stop_signal): every rank stops at this record */
} result;

/* warm-up, timed iterations, then (with -c 1) a fresh run whose result is checked */
static kiln_error *measure(run *u, const opts *o, result *res) {
    kiln_comm *c = u->c;
    prepare(u);
    KILN_TRY(upload(u));
    for (long i = 0; i < o->warmup; i++) KILN_TRY(op(u));
    KILN_TRY(kiln_comm_sync(c));
    KILN_TRY(c->barrier(c));
    double t[4] = {1e300, 0, 0, 0}; /* min, sum, max; a caught signal */
    for (long i = 0; i < o->iters; i++) {
        double t0 = now_us();
        KILN_TRY(op(u));
        KILN_TRY(kiln_comm_sync(c));
        double dt = now_us() - t0;
        t[0] = dt < t[0] ? dt : t[0];
        t[1] += dt;
        t[2] = dt > t[2] ? dt : t[2];
    }
    t[1] /= (double)o->iters;
    /* the slowest rank, as nccl-tests; and whether any rank caught Ctrl-C or mpirun's SIGTERM, so that all stop at
     * the same record (one that left alone would leave the others waiting in the next collective) */
    t[3] = kiln_bench_stop_signal();
    KILN_TRY(c->allreduce_max_f64(c, t, 4));
    res->tmin = t[0], res->tavg = t[1], res->tmax = t[2];
    res->stop = (int)t[3];
    size_t bytes = u->count * u->ts;
    /* one rank: nothing crosses between ranks (busbw 0); in place nothing moves at all (algbw 0 too) */
    res->algbw = kiln_coll_call_algbw_gbs(c->size, u->inplace, bytes, res->tavg);
    res->busbw = res->algbw * kiln_coll_busbw_factor(u->coll, c->size);
    res->wrong = -1;
    if (o->check && !res->stop) {
        prepare(u);
        KILN_TRY(upload(u));
        KILN_TRY(op(u));
        KILN_TRY(kiln_comm_sync(c));
        KILN_TRY(download(u));
        double w = (double)count_wrong(u);
        KILN_TRY(c->allreduce_sum_f64(c, &w, 1));
        res->wrong = w;
    }
    return NULL;
}

/* ---- output ---- */

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *s = realloc(b->s, cap);
        if (!s) return;
        b->s = s, b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static const char *type_name(kiln_dtype dt) { return dt == KILN_DT_BF16 ? "bfloat16" : "float"; }

static void fmt_time(char *s, size_t n, double us) {
    snprintf(s, n, us < 1e4 ? "%7.2f" : us < 1e6 ? "%7.1f" : "%7.0f", us);
}

static void print_table_head(const opts *o) {
    /* the row is 52 characters of size/count/type/redop/root, then 32 per variant; labels centred on them */
    printf("#%61s%s", "", o->oop ? "out-of-place" : "        ");
    if (o->ip) printf("%*s", o->oop ? 22 + 8 : 8, "in-place");
    printf("\n#       size         count      type   redop    root");
    for (int k = 0; k < o->oop + o->ip; k++) printf("     time   algbw   busbw #wrong");
    printf("\n%-52s", "#        (B)    (elements)");
    for (int k = 0; k < o->oop + o->ip; k++) printf("     (us)  (GB/s)  (GB/s)       ");
    printf("\n");
}

/* hosts: how many distinct hosts the ranks ran on (node boundaries: kiln size tells NVLink from the network by it) */
static void add_record(cJSON *sec, sbuf *csv, const kiln_comm *c, int hosts, const run *u, const result *r) {
    size_t bytes = u->count * u->ts;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "backend", c->backend);
    cJSON_AddStringToObject(j, "collective", kiln_coll_name(u->coll));
    cJSON_AddStringToObject(j, "dtype", type_name(u->dt));
    cJSON_AddNumberToObject(j, "ranks", c->size);
    cJSON_AddBoolToObject(j, "inplace", u->inplace);
    cJSON_AddNumberToObject(j, "bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "count", (double)u->count);
    cJSON_AddNumberToObject(j, "time_us_min", r->tmin);
    cJSON_AddNumberToObject(j, "time_us_avg", r->tavg);
    cJSON_AddNumberToObject(j, "time_us_max", r->tmax);
    cJSON_AddNumberToObject(j, "algbw_gbs", r->algbw);
    cJSON_AddNumberToObject(j, "busbw_gbs", r->busbw);
    if (r->wrong >= 0) cJSON_AddNumberToObject(j, "wrong", r->wrong);
    else cJSON_AddNullToObject(j, "wrong");
    const char *moved = kiln_coll_moved_name(kiln_coll_moved(c->size, u->inplace));
    cJSON_AddStringToObject(j, "moved", moved);
    cJSON_AddNumberToObject(j, "hosts", hosts);
    cJSON_AddItemToArray(sec, j);
    sb_printf(csv, "%s,%s,%s,%d,%d,%zu,%zu,%.17g,%.17g,%.17g,%.17g,%.17g,", c->backend, kiln_coll_name(u->coll),
              type_name(u->dt), c->size, u->inplace, bytes, u->count, r->tmin, r->tavg, r->tmax, r->algbw, r->busbw);
    if (r->wrong >= 0) sb_printf(csv, "%.0f", r->wrong);
    sb_printf(csv, ",%s,%d\n", moved, hosts);
}

/* ---- main ---- */

/* Rank 0: the profile and the CSV as they stand, each replaced atomically. `incomplete`, when not NULL, is why the
 * sweep is short, written into the profile (field "incomplete"; removed again by the final, complete save). */
static kiln_error *save_outputs(cJSON *prof, const sbuf *csv, const opts *o, const char *incomplete) {
    cJSON_DeleteItemFromObjectCaseSensitive(prof, "incomplete");
    if (incomplete && !cJSON_AddStringToObject(prof, "incomplete", incomplete))
        return kiln_errorf(KILN_ENOMEM, "profile");
    if (o->json) KILN_TRY(kiln_error_wrap(kiln_profile_write(prof, o->json), "--json"));
    if (o->csv) {
        if (!csv->s) return kiln_errorf(KILN_ENOMEM, "--csv %s", o->csv);
        KILN_TRY(kiln_error_wrap(kiln_write_file_atomic(o->csv, csv->s, csv->len), "--csv"));
    }
    return NULL;
}

/* Long sweeps save what they have every 10 s (rank 0, between records): mpirun follows its SIGTERM with a SIGKILL
 * a few seconds later, which a record of gigabytes can outlast, and a killed run keeps its records up to the last
 * save. KILN_BENCH_SAVE_EVERY=S changes the period (a testing hook; 0: after every row). */
static double save_every_s(void) {
    const char *v = getenv("KILN_BENCH_SAVE_EVERY");
    return v && *v ? atof(v) : 10.0;
}

static kiln_error *bench(kiln_comm *c, const opts *o, int *wrong_total) {
    const int me = c->rank, n = c->size;
    const size_t ts = kiln_dtype_size(o->dt);
    /* the largest size of the sweep, capped by memory: two buffers of it per rank, as nccl-tests */
    size_t maxb = o->maxb;
    /* the ranks sharing this host's memory (threads of one process included), and the hosts' count */
    kiln_host_layout lay;
    KILN_TRY(kiln_comm_host_layout(c, &lay));
    double avail = mem_available(), budget = 0.8 * avail / lay.local_size;
    double capped = (double)maxb;
    if (avail > 0 && 2.0 * (double)maxb > budget) capped = budget / 2;
    size_t dfree = 0, dtotal = 0;
    if (c->device_buffers) { /* and two device buffers, leaving NCCL its own memory */
        KILN_TRY(kiln_cuda_mem_info(&dfree, &dtotal));
        double dbudget = 0.9 * (double)dfree - 512.0 * 1048576.0;
        if (2.0 * (double)maxb > dbudget && dbudget / 2 < capped) capped = dbudget > 0 ? dbudget / 2 : 0, budget = dbudget;
    }
    double neg = -capped;
    KILN_TRY(c->allreduce_max_f64(c, &neg, 1)); /* the smallest cap of all ranks */
    if (-neg < (double)maxb) {
        size_t cap = (size_t)-neg;
        if (me == 0)
            fprintf(stderr, "# warning: --maxbytes %zu needs %.1f MiB per rank for its two buffers; %.1f MiB are "
                    "available to each of %d rank(s) on this host: capped to %zu bytes\n", maxb,
                    2.0 * (double)maxb / 1048576.0, budget / 1048576.0, lay.local_size, cap);
        if (cap < o->minb)
            return kiln_errorf(KILN_ENOMEM, "not enough memory for --minbytes %zu (%.1f MiB available per rank)",
                               o->minb, budget / 1048576.0);
        maxb = cap;
    }
    size_t last = o->minb; /* largest size of the sweep */
    while (last <= maxb / (size_t)o->factor) last *= (size_t)o->factor;
    size_t alloc = last < 64 ? 64 : last;
    char *a = malloc(alloc), *b = malloc(alloc), *da = NULL, *db = NULL;
    /* rank 0: the distinct hosts, in rank order (each rank's name, truncated to 63 characters) */
    char (*hosts)[64] = me == 0 ? calloc((size_t)n, sizeof *hosts) : NULL;
    double fail = !a || !b || (me == 0 && !hosts); /* every rank learns it: one stopping alone would leave the others */
    if (!fail && c->device_buffers) {
        kiln_error *de = kiln_cuda_alloc((void **)&da, alloc);
        if (!de) de = kiln_cuda_alloc((void **)&db, alloc);
        if (de) {
            fprintf(stderr, "kiln bench comm (rank %d): %s\n", me, kiln_error_msg(de));
            kiln_error_free(de);
            fail = 1;
        }
    }
    kiln_error *e = c->allreduce_sum_f64(c, &fail, 1);
    if (!e && fail > 0) e = kiln_errorf(KILN_ENOMEM, "two buffers of %zu bytes on %.0f rank(s)", alloc, fail);
    if (e) {
        free(a);
        free(b);
        free(hosts);
        kiln_cuda_free(da);
        kiln_cuda_free(db);
        return e;
    }

    struct {
        int pid, device, host_index, local_rank, local_size;
        char host[64], gpu[64];
    } info;
    char gpu[64] = "";
    char ncclv[32] = "";
    if (c->device_buffers) {
        kiln_cuda_info gi;
        kiln_error *ge = kiln_cuda_device_info(&gi);
        if (!ge) snprintf(gpu, sizeof gpu, "%.63s", gi.name);
        kiln_error_free(ge);
        kiln_error_free(kiln_comm_nccl_version(ncclv, sizeof ncclv));
    }
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    if (me == 0) {
        const char *mv = kiln_comm_mpi_version();
        printf("# kiln bench comm: backend %s%s%s, %d rank%s, host %s%s%s\n", c->backend, *ncclv ? " " : "", ncclv, n,
               n == 1 ? "" : "s", host, strcmp(c->backend, "mpi") || !mv ? "" : ", ",
               strcmp(c->backend, "mpi") || !mv ? "" : mv);
        printf("# minBytes %zu maxBytes %zu step: %ld(factor) warmup iters: %ld iters: %ld validation: %d "
               "datatype: %s\n#\n# Using ranks\n", o->minb, maxb, o->factor, o->warmup, o->iters, o->check,
               type_name(o->dt));
    }
    int nhosts = 0;
    for (int r = 0; r < n && !e; r++) { /* each rank's pid and host, printed by rank 0 */
        memset(&info, 0, sizeof info);
        info.pid = (int)getpid();
        info.device = c->device_buffers ? c->device : -1;
        info.host_index = lay.host_index, info.local_rank = lay.local_rank, info.local_size = lay.local_size;
        memcpy(info.host, host, sizeof info.host - 1); /* truncated to 63 characters */
        memcpy(info.gpu, gpu, sizeof info.gpu - 1);
        e = c->broadcast(c, &info, sizeof info, r);
        if (!e && me == 0) {
            /* hosts are numbered in the order of their first ranks: a new one is the next number */
            if (info.host_index == nhosts && nhosts < n) memcpy(hosts[nhosts++], info.host, sizeof info.host);
            printf("#  Rank %2d Pid %6d on %s (local rank %d of %d)", r, info.pid, info.host, info.local_rank,
                   info.local_size);
            if (info.device >= 0) printf(" device %2d %s", info.device, info.gpu);
            printf("\n");
        }
    }
    if (me == 0 && n == 1) /* nccl-tests prints S/time whatever moved: on one rank that is not a bandwidth */
        printf("#\n# One rank: no data moves between ranks, so busbw is 0 for every collective (broadcast too).\n"
               "# Out of place a call copies send to recv in this process (algbw: that copy); in place it moves\n"
               "# nothing at all (algbw 0). The calls are still timed. Records: \"moved\": local_copy / none.\n");

    cJSON *prof = NULL, *sec = NULL;
    sbuf csv = {0};
    if (me == 0) {
        prof = kiln_profile_new("comm");
        sec = prof ? kiln_profile_section(prof, "comm") : NULL;
        if (!sec) e = kiln_errorf(KILN_ENOMEM, "profile");
        else {
            cJSON *l = cJSON_GetObjectItemCaseSensitive(prof, "libraries");
            if (l && kiln_comm_mpi_version()) cJSON_AddStringToObject(l, "mpi", kiln_comm_mpi_version());
            if (l && *ncclv) cJSON_AddStringToObject(l, "nccl", ncclv);
            cJSON *mach = cJSON_GetObjectItemCaseSensitive(prof, "machine");
            if (mach && *gpu) {
                cJSON_AddStringToObject(mach, "gpu", gpu);
                cJSON_AddNumberToObject(mach, "gpu_memory_gib", (double)dtotal / 1073741824.0);
            }
            /* "machine" describes rank 0's host; the ranks' hosts, each once in rank order, say where the rest ran */
            cJSON *hl = mach ? cJSON_AddArrayToObject(mach, "hosts") : NULL;
            for (int k = 0; hl && k < nhosts; k++) cJSON_AddItemToArray(hl, cJSON_CreateString(hosts[k]));
        }
        sb_printf(&csv, "backend,collective,dtype,ranks,inplace,bytes,count,time_us_min,time_us_avg,time_us_max,"
                  "algbw_gbs,busbw_gbs,wrong,moved,hosts\n");
    }
    double all_wrong = 0, last_save = now_us(), save_every = save_every_s();
    size_t nrec = 0;
    int stop = 0;
    run u = {.c = c, .dt = o->dt, .ts = ts, .a = a, .b = b, .da = da, .db = db, .root = 0};
    for (int ci = 0; ci < KILN_COLL_COUNT && !e && !stop; ci++) {
        if (!o->want[ci]) continue;
        u.coll = (kiln_coll)ci;
        const int reduces = ci == KILN_COLL_ALLREDUCE || ci == KILN_COLL_REDUCE_SCATTER;
        if (me == 0) {
            printf("#\n# Collective: %s\n", kiln_coll_name(u.coll));
            print_table_head(o);
        }
        double bw_sum = 0, wrong = 0;
        int rows = 0;
        for (size_t s = o->minb; !e && !stop; s *= (size_t)o->factor) {
            u.count = kiln_coll_count(u.coll, s, ts, n, &u.block);
            result res[2];
            int have[2] = {0, 0};
            for (int ip = 0; ip < 2 && !e && !stop; ip++) {
                if ((ip && !o->ip) || (!ip && !o->oop)) continue;
                u.inplace = ip;
                e = measure(&u, o, &res[ip]);
                /* the signal came while this record was timed (and mpirun's shutdown may have slowed it): dropped */
                if (!e && res[ip].stop) stop = res[ip].stop;
                else if (!e) {
                    have[ip] = 1, nrec++;
                    bw_sum += res[ip].busbw, rows++;
                    if (res[ip].wrong > 0) wrong += res[ip].wrong;
                    if (me == 0) add_record(sec, &csv, c, nhosts, &u, &res[ip]);
                }
            }
            if (!e && me == 0 && (have[0] || have[1])) {
                printf("%12zu  %12zu  %8s  %6s  %6d", u.count * ts, u.count, type_name(o->dt), reduces ? "sum" : "none",
                       ci == KILN_COLL_BROADCAST ? u.root : -1);
                for (int ip = 0; ip < 2; ip++) {
                    if ((ip && !o->ip) || (!ip && !o->oop)) continue;
                    if (!have[ip]) { /* stopped before it */
                        printf("  %7s  %6s  %6s  %5s", "-", "-", "-", "-");
                        continue;
                    }
                    char t[32], w[32];
                    fmt_time(t, sizeof t, res[ip].tavg);
                    if (res[ip].wrong >= 0) snprintf(w, sizeof w, "%.0f", res[ip].wrong);
                    else snprintf(w, sizeof w, "N/A");
                    printf("  %s  %6.2f  %6.2f  %5s", t, res[ip].algbw, res[ip].busbw, w);
                }
                printf("\n");
                fflush(stdout);
                if (!stop && (o->json || o->csv) && now_us() - last_save >= save_every * 1e6) {
                    e = save_outputs(prof, &csv, o, "the sweep was still running: a partial save, made as it goes");
                    last_save = now_us();
                }
            }
            if (s > maxb / (size_t)o->factor) break;
        }
        if (!e && !stop && me == 0) {
            if (o->check) printf("# Out of bounds values : %.0f %s\n", wrong, wrong > 0 ? "FAILED" : "OK");
            printf("# Avg bus bandwidth    : %g%s\n", rows ? bw_sum / rows : 0.0,
                   n == 1 ? " (one rank: no data moves between ranks)" : "");
        }
        all_wrong += wrong;
    }
    if (me == 0) printf("#\n");
    char why[200] = "";
    if (stop)
        snprintf(why, sizeof why, "interrupted by signal %d (%s) after %zu record%s", stop, strsignal(stop), nrec,
                 nrec == 1 ? "" : "s");
    if (!e && me == 0) e = save_outputs(prof, &csv, o, stop ? why : NULL);
    if (!e && stop) /* the outputs hold every record measured; the caller dies of the signal */
        e = kiln_errorf(KILN_EIO, "%s%s%s%s%s", why, o->json || o->csv ? "; they are in " : "", o->json ? o->json : "",
                        o->json && o->csv ? " and " : "", o->csv ? o->csv : "");
    cJSON_Delete(prof);
    free(hosts);
    free(csv.s);
    free(a);
    free(b);
    kiln_cuda_free(da);
    kiln_cuda_free(db);
    *wrong_total = all_wrong > 0;
    if (!e && all_wrong > 0)
        e = kiln_errorf(KILN_EIO, "%.0f wrong element%s: the collectives' results differ from the expected values",
                        all_wrong, all_wrong == 1 ? "" : "s");
    return e;
}

/* one rank of the NCCL backend driven by a thread of this process */
typedef struct {
    const opts *o;
    const unsigned char *id;
    int nranks, rank, device, wrong;
    kiln_error *e;
} gpu_rank;

static void *gpu_rank_main(void *arg) {
    gpu_rank *g = arg;
    kiln_comm *c = NULL;
    g->e = kiln_comm_nccl_create(g->id, g->nranks, g->rank, g->device, NULL, &c);
    if (!g->e) {
        g->e = bench(c, g->o, &g->wrong);
        c->finalize(c);
    }
    return NULL;
}

/* NCCL: -g GPUs per process, each a thread; the process comm (MPI or local) hands out the unique id.
 * Sets *owned when a new comm took `boot` over (its finalize finalizes boot). */
static kiln_error *bench_nccl(kiln_comm *boot, const opts *o, int *wrong, int *owned) {
    const long g = o->ngpus;
    kiln_error *e = NULL;
    if (boot->size == 1 && g == 1) { /* one rank: the plain path, no thread */
        kiln_comm *c = NULL;
        KILN_TRY(kiln_comm_nccl_from(boot, &c));
        *owned = 1;
        e = bench(c, o, wrong);
        c->finalize(c); /* finalizes boot too */
        return e;
    }
    int dev0 = -1;
    KILN_TRY(kiln_comm_pick_gpus(boot, (int)g, &dev0)); /* g <= 1024 (parse_args); agreed on every rank */
    unsigned char id[KILN_NCCL_ID_BYTES] = {0};
    double ok = 1;
    if (boot->rank == 0) {
        e = kiln_comm_nccl_unique_id(id);
        ok = !e;
    }
    kiln_error *be = boot->broadcast(boot, &ok, sizeof ok, 0);
    if (!be && ok) be = boot->broadcast(boot, id, sizeof id, 0);
    if (e || be || !ok) {
        kiln_error_free(be);
        return e ? e : kiln_errorf(KILN_EIO, "rank 0 could not make an NCCL id");
    }
    gpu_rank *ranks = calloc((size_t)g, sizeof *ranks);
    pthread_t *th = calloc((size_t)g, sizeof *th);
    long started = 0;
    if (!ranks || !th) e = kiln_errorf(KILN_ENOMEM, "%ld GPU threads", g);
    for (long t = 0; !e && t < g; t++, started++) {
        ranks[t] = (gpu_rank){.o = o, .id = id, .nranks = boot->size * (int)g, .rank = boot->rank * (int)g + (int)t,
                              .device = dev0 + (int)t};
        if (pthread_create(&th[t], NULL, gpu_rank_main, &ranks[t]))
            e = kiln_errorf(KILN_EIO, "cannot start the thread of GPU %ld", t);
    }
    for (long t = 0; t < started; t++) pthread_join(th[t], NULL);
    for (long t = 0; t < started; t++) {
        *wrong |= ranks[t].wrong;
        if (!e) e = ranks[t].e;
        else kiln_error_free(ranks[t].e);
    }
    free(ranks);
    free(th);
    return e;
}

int kiln_bench_comm_main(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    kiln_comm *c = NULL;
    kiln_error *e = kiln_comm_init(&argc, &argv, &c);
    if (e) {
        kiln_bench_fail("comm", NULL, e);
        return 1;
    }
    int wrong = 0, rank = c->rank;
    kiln_bench_catch_stops(); /* Ctrl-C, or mpirun's SIGTERM: the sweep stops after the record running, and saves */
    /* only rank 0 writes the files: it checks them before anything runs, and every rank stops with it */
    e = rank == 0 ? kiln_bench_check_output("--json", o.json) : NULL;
    if (!e && rank == 0) e = kiln_bench_check_output("--csv", o.csv);
    double bad = e != NULL;
    kiln_error *ae = c->allreduce_sum_f64(c, &bad, 1);
    if (e || ae || bad > 0) {
        if (e) fprintf(stderr, "kiln bench comm (rank %d): error: %s\n", rank, kiln_error_msg(e));
        else if (ae && rank == 0) fprintf(stderr, "kiln bench comm (rank %d): error: %s\n", rank, kiln_error_msg(ae));
        kiln_error_free(e);
        kiln_error_free(ae);
        c->finalize(c);
        return 1;
    }
    if (o.nccl) {
        int owned = 0;
        e = bench_nccl(c, &o, &wrong, &owned);
        if (!owned) c->finalize(c);
    } else {
        e = bench(c, &o, &wrong);
        c->finalize(c);
    }
    if (e) {
        if (rank == 0 || !wrong) fprintf(stderr, "kiln bench comm (rank %d): error: %s\n", rank, kiln_error_msg(e));
        kiln_error_free(e);
        kiln_bench_die_of_stop(); /* interrupted: die of the signal, as the shell and mpirun expect */
        return 1;
    }
    return 0;
}
