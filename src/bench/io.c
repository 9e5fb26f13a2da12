/* kiln bench io: storage throughput for checkpoint-sized files, and the checkpoint writer against it.
 *
 * Write tests create N files of SIZE bytes from one thread (seq_write) or T threads (par_write, what
 * T ranks writing their shards do), each file written in 8 MiB chunks and fsynced before it counts;
 * read tests read them back after dropping their pages from the cache (fadvise DONTNEED after the
 * fsync: the pages are clean, so the kernel lets them go). With --ckpt a synthetic ZAYA checkpoint of
 * about N*SIZE bytes goes through the trainer's own writer (src/train/checkpoint.c): the synchronous
 * save (snapshot, write, fsync, checksum, manifest, commit), the time an asynchronous save blocks the
 * training thread, and the CRC-32C checksum alone. With --device cuda the same checkpoint also lives on the
 * GPU and goes through the CUDA trainer's path (src/models/zaya_cuda_snapshot.c): the synchronous save
 * streamed from the live device buffers through pinned chunks, and the asynchronous one (device snapshot,
 * then the writer thread's stream), its blocking time and its total. Best of --iters; scratch files are
 * removed. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/bench.h"
#include "kiln/fsutil.h"
#include "kiln/comm.h"
#include "ckpt/crc32c.h"
#include "kiln/progress.h"
#include "kiln/zaya_cuda.h"
#include "kiln/zaya_cuda_snapshot.h"
#include "models/zaya_internal.h"
#include "train/train_internal.h"

static const char usage[] =
    "usage: kiln bench io --dir D [options]\n\n"
    "Sequential and parallel write (with fsync) and read throughput for checkpoint-sized files in D, and with\n"
    "--ckpt the checkpoint writer's save throughput against the sequential write speed measured in the same\n"
    "run. GB/s = 1e9 bytes/s. Scratch files are created in D and removed.\n\n"
    "  --dir D          directory on the file system to measure (required)\n"
    "  --size SIZE      bytes per file, 4K to 65536G, K/M/G suffixes (binary) (default 256M)\n"
    "  --files N        files per test (default 4)\n"
    "  --threads T      threads of the parallel tests (default: min(files, cores))\n"
    "  --iters N        repetitions; the best is reported (default 3)\n"
    "  --ckpt           also save a synthetic ZAYA checkpoint of about files x size bytes through the\n"
    "                   trainer's checkpoint writer (sync save, async blocking time, checksum alone), and\n"
    "                   on tmpfs/ext4/XFS the sequential write again through the writer's mapped path\n"
    "                   (seq_write_mapped: allocated up front, copied by KILN_WRITE_THREADS threads)\n"
    "  --device cpu|cuda with --ckpt: cuda also saves the checkpoint from the GPU through the CUDA trainer's\n"
    "                   path (device snapshot, pinned chunks) (default cpu)\n"
    "  --json FILE      write the JSON profile (section \"io\")\n"
    "  --csv FILE       write the numbers as CSV\n";

#define CHUNK ((size_t)8 << 20)

/* Ctrl-C (SIGINT), SIGTERM, SIGHUP (kiln_bench_catch_stops): the passes stop at the next chunk, the scratch files
 * (up to files x size bytes, gigabytes) and the checkpoint directory are removed, then the signal is raised again. */
typedef struct {
    const char *test;
    double bytes, file_bytes, files, threads, seconds, vs_seq_write;
} io_rec;


typedef struct {
    const char *dir;
    int pid, first, step, nfiles, write;
    size_t size;
    const unsigned char *buf; /* CHUNK bytes */
    kiln_error *err;
} job;

static void file_name(char *p, size_t n, const char *dir, int pid, int i) {
    snprintf(p, n, "%s/kiln-io-%d-%03d.bin", dir, pid, i);
}

static kiln_error *write_one(const char *path, size_t size, const unsigned char *buf) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) return kiln_errorf(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
    for (size_t done = 0; done < size;) {
        if (kiln_bench_stop_signal()) {
            close(fd);
            return kiln_bench_interrupted(path);
        }
        size_t n = size - done < CHUNK ? size - done : CHUNK;
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = errno;
            close(fd);
            return kiln_errorf(KILN_EIO, "%s: write at byte %zu: %s", path, done, strerror(w < 0 ? err : ENOSPC));
        }
        done += (size_t)w;
    }
    int rc = fsync(fd);
    int err = errno;
    if (!rc) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* clean now: the read test reads the disk */
    close(fd);
    return rc ? kiln_errorf(KILN_EIO, "%s: fsync: %s", path, strerror(err)) : NULL;
}

static kiln_error *read_one(const char *path, size_t size, unsigned char *buf) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t done = 0;
    for (;;) {
        if (kiln_bench_stop_signal()) {
            close(fd);
            return kiln_bench_interrupted(path);
        }
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int err = errno;
            close(fd);
            return kiln_errorf(KILN_EIO, "%s: read at byte %zu: %s", path, done, strerror(err));
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    close(fd);
    return done == size ? NULL : kiln_errorf(KILN_EIO, "%s: read %zu bytes, wrote %zu", path, done, size);
}

static void *run_job(void *p) {
    job *j = p;
    unsigned char *rbuf = j->write ? NULL : malloc(CHUNK);
    if (!j->write && !rbuf) j->err = kiln_errorf(KILN_ENOMEM, "read buffer");
    for (int i = j->first; !j->err && i < j->nfiles; i += j->step) {
        char path[1200];
        file_name(path, sizeof path, j->dir, j->pid, i);
        j->err = j->write ? write_one(path, j->size, j->buf) : read_one(path, j->size, rbuf);
    }
    free(rbuf);
    return NULL;
}

/* All files, on `threads` threads; seconds in *sec. */
static kiln_error *pass(const char *dir, int nfiles, size_t size, int threads, int write, const unsigned char *buf,
                        double *sec) {
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    int *started = calloc((size_t)threads, sizeof *started);
    if (!jobs || !tid || !started) {
        free(jobs), free(tid), free(started);
        return kiln_errorf(KILN_ENOMEM, "bench io");
    }
    double t0 = kiln_bench_now_s();
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job){dir, (int)getpid(), t, threads, nfiles, write, size, buf, NULL};
        started[t] = threads > 1 && pthread_create(&tid[t], NULL, run_job, &jobs[t]) == 0;
        if (!started[t]) run_job(&jobs[t]);
    }
    kiln_error *e = NULL;
    for (int t = 0; t < threads; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        if (!e) e = jobs[t].err;
        else kiln_error_free(jobs[t].err);
    }
    *sec = kiln_bench_now_s() - t0;
    free(jobs), free(tid), free(started);
    return e;
}

/* The files again, one after another, through the atomic writer's mapped path (kiln_atomic_begin_mapped:
 * allocated up front, copied into a shared mapping by KILN_WRITE_THREADS threads in pieces of up to 256 MiB,
 * as the checkpoint writer's pieces; fsync and rename): beside seq_write, whether the mapping is worth it on
 * this file system. Only where the file system is one the writer maps on (kiln_fs_maps_safely). */
static kiln_error *mapped_pass(const char *dir, int nfiles, size_t size, const unsigned char *chunk, double *sec) {
    const size_t piece = size < ((size_t)256 << 20) ? size : ((size_t)256 << 20);
    unsigned char *buf = malloc(piece ? piece : 1);
    if (!buf) return kiln_errorf(KILN_ENOMEM, "bench io: a %zu-byte piece", piece);
    for (size_t at = 0; at < piece; at += CHUNK) memcpy(buf + at, chunk, piece - at < CHUNK ? piece - at : CHUNK);
    kiln_error *e = NULL;
    const double t0 = kiln_bench_now_s();
    for (int i = 0; !e && i < nfiles; i++) {
        char path[1200];
        file_name(path, sizeof path, dir, (int)getpid(), i);
        kiln_atomic_file f;
        if ((e = kiln_atomic_begin_mapped(&f, path, size))) break; /* every file mapped, whatever its size */
        for (size_t done = 0; !e && done < size; done += piece)
            e = kiln_bench_stop_signal() ? kiln_bench_interrupted(path)
                                         : kiln_atomic_write(&f, buf, size - done < piece ? size - done : piece);
        if (e) kiln_atomic_abort(&f);
        else e = kiln_atomic_commit(&f);
    }
    *sec = kiln_bench_now_s() - t0;
    free(buf);
    return e;
}

static int dir_maps(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    const int ok = fd >= 0 && kiln_fs_maps_safely(fd);
    if (fd >= 0) close(fd);
    return ok;
}

static void remove_files(const char *dir, int nfiles) {
    for (int i = 0; i < nfiles; i++) {
        char path[1200];
        file_name(path, sizeof path, dir, (int)getpid(), i);
        unlink(path);
    }
}

/* ---- the checkpoint writer on a synthetic model ---- */

/* A ZAYA config whose checkpoint (parameters + optimizer state) is about `target` bytes. */
static kiln_error *ckpt_config(double target, kiln_train_config *c, double *bytes) {
    kiln_train_config_default(c);
    kiln_zaya_config *m = &c->model;
    /* width so that one layer is ~1/8 of the target (a layer holds ~460 h^2 bytes with its state) */
    int64_t h = (int64_t)sqrt(target / 8 / 460) / 64 * 64;
    if (h < 64) h = 64;
    m->hidden_size = h;
    m->head_dim = 32;
    m->num_heads = h / 32;
    m->num_kv_heads = 2;
    m->num_experts = 8;
    m->moe_intermediate = 2 * h;
    m->router_hidden = 32;
    m->vocab_size = 1024;
    for (int64_t L = 1;; L++) {
        m->num_layers = L;
        kiln_zaya t = {.cfg = *m};
        KILN_TRY(kiln_zaya_build_params(&t));
        kiln_opt_param *op = calloc((size_t)t.nparams, sizeof *op);
        if (!op) {
            free(t.params);
            return kiln_errorf(KILN_ENOMEM, "bench io");
        }
        kiln_optim_classify(&t, &c->optim, op);
        double b = 0;
        for (int i = 0; i < t.nparams; i++) b += 4.0 * (double)(t.params[i].numel + kiln_optim_state_numel(&op[i]));
        free(op);
        free(t.params);
        *bytes = b;
        if (b >= target || L >= 256) break;
    }
    return kiln_zaya_config_validate(m, "bench io: synthetic model");
}

typedef struct {
    double save_s, block_s, async_s, sum_s, bytes;
    double gsave_s, gblock_s, gasync_s; /* --device cuda */
    const char *gwhere;
} ckpt_times;

/* The GPU side of --ckpt: the model and optimizer state on the device, two writers as the CUDA trainer
 * has them (sync: the live buffers streamed; async: a device snapshot streamed in the background). */
typedef struct {
    kiln_zaya_cuda *g;
    kiln_zaya_cuda_opt *o;
    ckpt_writer *sync, *async;
} ckpt_gpu;

static kiln_error *ckpt_gpu_setup(ckpt_gpu *x, const kiln_zaya *m, const kiln_opt_param *op, const float *state) {
    KILN_TRY(kiln_zaya_cuda_create(m, 1, 8, 0, &x->g));
    KILN_TRY(kiln_zaya_cuda_opt_create(x->g, op, 0, m->nparams, &x->o));
    KILN_TRY(kiln_zaya_cuda_opt_state_upload(x->o, state));
    for (int k = 0; k < 2; k++) {
        ckpt_writer **w = k ? &x->async : &x->sync;
        kiln_zaya_cuda_snap *s = NULL;
        KILN_TRY(ckpt_writer_create(k, w));
        KILN_TRY(kiln_zaya_cuda_snap_create(x->g, x->o, m, op, 0, m->nparams, 0, &s));
        KILN_TRY(ckpt_writer_use_cuda(*w, s));
    }
    return NULL;
}

static void ckpt_gpu_free(ckpt_gpu *x) {
    ckpt_writer_free(x->sync);
    ckpt_writer_free(x->async);
    kiln_zaya_cuda_opt_free(x->o);
    kiln_zaya_cuda_free(x->g);
}

static kiln_error *ckpt_bench(const char *dir, double target, int iters, int cuda, ckpt_times *out) {
    kiln_train_config c;
    double bytes = 0;
    KILN_TRY(ckpt_config(target, &c, &bytes));
    snprintf(c.out_dir, sizeof c.out_dir, "%s/kiln-io-ckpt-%d", dir, (int)getpid());
    c.keep_last = 1;
    kiln_comm *comm = NULL;
    kiln_zaya *m = NULL;
    zero1_partition part = {0};
    balance_ctl bal = {0};
    kiln_opt_param *op = NULL;
    float *state = NULL;
    ckpt_writer *w = NULL;
    kiln_loader_state ls = {c.data_seed, 0, 0, 0};
    kiln_error *e = kiln_comm_local(&comm);
    if (!e) e = kiln_zaya_create(&c.model, &m);
    if (!e) {
        kiln_zaya_init_random(m, 1);
        e = zero1_partition_make(m, 1, &part);
    }
    size_t ns = 0;
    if (!e) {
        op = calloc((size_t)m->nparams, sizeof *op);
        if (op) kiln_optim_classify(m, &c.optim, op);
        for (int i = 0; op && i < m->nparams; i++) ns += (size_t)kiln_optim_state_numel(&op[i]);
        state = op ? malloc((ns + 1) * sizeof *state) : NULL;
        if (!state) e = kiln_errorf(KILN_ENOMEM, "bench io: optimizer state of %zu floats", ns);
        else kiln_bench_fill(state, (int64_t)ns, 7, 1.0f);
    }
    if (!e) e = balance_init(&bal, c.model.num_layers, c.model.num_experts + 1);
    printf("checkpoint: a ZAYA of %zu parameters (hidden %lld, %lld layers), %.1f MB with its optimizer state\n",
           m ? m->numel : 0, (long long)c.model.hidden_size, (long long)c.model.num_layers, bytes / 1e6);
    fflush(stdout);
    *out = (ckpt_times){INFINITY, INFINITY, INFINITY, INFINITY, bytes, INFINITY, INFINITY, INFINITY, "none"};
    if (!e) e = ckpt_writer_create(1, &w); /* one writer, as in training: its staging buffer is reused */
    ckpt_gpu gx = {0};
    if (!e && cuda) e = kiln_error_wrap(ckpt_gpu_setup(&gx, m, op, state), "bench io --ckpt --device cuda");
    kiln_progress pr;
    kiln_progress_start(&pr, "bench io ckpt", (uint64_t)iters, "save");
    for (int it = 0; !e && it < iters; it++) {
        if (kiln_bench_stop_signal()) {
            e = kiln_bench_interrupted(c.out_dir);
            break;
        }
        ckpt_view v = {4 * it + 1, &c, m, &part, op, state, &bal, &ls, 0};
        double t0 = kiln_bench_now_s();
        e = ckpt_save(comm, &v);
        double t1 = kiln_bench_now_s();
        v.step++;
        double t2 = kiln_bench_now_s();
        if (!e) e = ckpt_writer_save(w, comm, &v, 0);
        double t3 = kiln_bench_now_s();
        if (!e) e = ckpt_writer_poll(w, comm, 1);
        double t4 = kiln_bench_now_s();
        char shard[1400];
        snprintf(shard, sizeof shard, "%s/ckpt/step_%08d/rank_00000.safetensors", c.out_dir, 4 * it + 2);
        uint64_t n = 0;
        uint32_t h = 0;
        double t5 = kiln_bench_now_s();
        if (!e) e = kiln_crc32c_file(shard, &h, &n); /* what verify and resume run over every shard */
        double t6 = kiln_bench_now_s();
        double g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0;
        if (!e && cuda) { /* the same checkpoint from the GPU: steps 4it+3 (sync) and 4it+4 (async); keep_last 1 keeps the newest */
            v.step = 4 * it + 3;
            g0 = kiln_bench_now_s();
            e = ckpt_writer_save(gx.sync, comm, &v, 1);
            g1 = kiln_bench_now_s();
            v.step++;
            g2 = kiln_bench_now_s();
            if (!e) e = ckpt_writer_save(gx.async, comm, &v, 0);
            g3 = kiln_bench_now_s();
            if (!e) e = ckpt_writer_poll(gx.async, comm, 1);
            g4 = kiln_bench_now_s();
            if (!e) out->gwhere = ckpt_writer_snapshot_where(gx.async);
        }
        if (!e) {
            out->bytes = (double)n;
            out->save_s = fmin(out->save_s, t1 - t0);
            out->block_s = fmin(out->block_s, t3 - t2);
            out->async_s = fmin(out->async_s, t4 - t2);
            out->sum_s = fmin(out->sum_s, t6 - t5);
            if (cuda) {
                out->gsave_s = fmin(out->gsave_s, g1 - g0);
                out->gblock_s = fmin(out->gblock_s, g3 - g2);
                out->gasync_s = fmin(out->gasync_s, g4 - g2);
            }
        }
        kiln_progress_update(&pr, (uint64_t)it + 1);
    }
    kiln_progress_finish(&pr);
    ckpt_gpu_free(&gx);
    ckpt_writer_free(w);
    kiln_rm_tree(c.out_dir);
    balance_free(&bal);
    free(state);
    free(op);
    zero1_partition_free(&part);
    kiln_zaya_free(m);
    if (comm) comm->finalize(comm);
    return e;
}

/* ---- outputs ---- */

typedef struct {
    const io_rec *r;
    size_t n;
} io_out;

static void json_record(cJSON *o, size_t i, const void *ctx) {
    const io_rec *r = &((const io_out *)ctx)->r[i];
    cJSON_AddStringToObject(o, "test", r->test);
    cJSON_AddNumberToObject(o, "bytes", r->bytes);
    cJSON_AddNumberToObject(o, "file_bytes", r->file_bytes);
    cJSON_AddNumberToObject(o, "files", r->files);
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
    cJSON_AddNumberToObject(o, "gbs", r->bytes / r->seconds / 1e9);
    if (r->vs_seq_write > 0) cJSON_AddNumberToObject(o, "vs_seq_write", r->vs_seq_write);
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const io_rec *r = &((const io_out *)ctx)->r[i];
    fprintf(f, "%s,%.0f,%.0f,%.0f,%.0f,%.6g,%.6g,%.4g\n", r->test, r->bytes, r->file_bytes, r->files, r->threads,
            r->seconds, r->bytes / r->seconds / 1e9, r->vs_seq_write);
}

int kiln_bench_io_main(int argc, char **argv) {
    const char *dir = NULL, *json_path = NULL, *csv_path = NULL;
    size_t size = (size_t)256 << 20;
    long long files = 4, threads = 0, iters = 3;
    int ckpt = 0, cuda = 0;
    static const char *const valued[] = {"--dir", "--size", "--files", "--threads", "--iters", "--json", "--csv",
                                         "--device", NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ckpt")) {
            ckpt = 1;
            continue;
        }
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "io", usage, valued, &a, &v);
        if (r >= 0) return r;
        if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--size")) {
            /* 64 TiB: past any one file a checkpoint shard is, and far inside size_t and the double arithmetic */
            if (kiln_bench_parse_bytes(v, 4096, 65536.0 * 1073741824.0, &size))
                return kiln_bench_usage_err("io", "--size '%s': expected a size from 4K to 65536G (64 TiB), like 64M or 1G", v);
        } else if (!strcmp(a, "--files")) {
            if ((r = kiln_bench_parse_int("io", a, v, 1, 999, &files)) >= 0) return r;
        } else if (!strcmp(a, "--threads")) {
            if ((r = kiln_bench_parse_int("io", a, v, 1, 1024, &threads)) >= 0) return r;
        } else if (!strcmp(a, "--iters")) {
            if ((r = kiln_bench_parse_int("io", a, v, 1, 100, &iters)) >= 0) return r;
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return kiln_bench_usage_err("io", "--device '%s': expected cpu or cuda", v);
            cuda = !strcmp(v, "cuda");
        } else if (!strcmp(a, "--json")) json_path = v;
        else csv_path = v;
    }
    if (!dir) return kiln_bench_usage_err("io", "--dir D is required (the file system to measure)");
    if (cuda && !ckpt) return kiln_bench_usage_err("io", "--device cuda measures the checkpoint writer: it needs --ckpt");
    struct stat sb;
    if (stat(dir, &sb)) {
        const int err = errno;
        kiln_bench_fail("io", NULL, err == ENOENT ? kiln_errorf(KILN_ENOTFOUND, "%s: no such directory (it does not exist)", dir)
                                                  : kiln_errorf(KILN_EIO, "%s: cannot stat: %s", dir, strerror(err)));
        return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        kiln_bench_fail("io", NULL, kiln_errorf(KILN_EINVAL, "%s: not a directory", dir));
        return 1;
    }
    if (kiln_bench_check_outputs("io", json_path, csv_path)) return 1;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n < files ? n : files;
    }
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a write error to report, not a kill */
    kiln_bench_catch_stops();
    unsigned char *buf = malloc(CHUNK);
    if (!buf) return 1;
    for (size_t i = 0; i < CHUNK / sizeof(float); i++) ((float *)buf)[i] = (float)((i * 2654435761u) % 1000003) * 1e-3f;
    printf("kiln bench io: %s, %lld files x %.4g MiB, %lld threads in the parallel tests, best of %lld\n", dir, files,
           (double)size / 1048576.0, threads, iters);
    fflush(stdout); /* before the progress lines on stderr, also in a log */
    static const char *const names[4] = {"seq_write", "par_write", "seq_read", "par_read"};
    io_rec rec[12];
    size_t nrec = 0;
    for (int k = 0; k < 4; k++)
        rec[nrec++] = (io_rec){names[k], (double)size * (double)files, (double)size, (double)files,
                               (double)(k & 1 ? threads : 1), INFINITY, 0};
    kiln_error *e = NULL;
    kiln_progress pr;
    kiln_progress_start(&pr, "bench io", (uint64_t)iters * 4, "pass");
    for (long long it = 0; !e && it < iters; it++)
        for (int k = 0; !e && k < 4; k++) {
            double s = 0;
            /* write then read, with one thread then many: each read finds the files just written */
            int t = k == 0 || k == 2 ? 1 : (int)threads, write = k < 2;
            /* the record is the test's, not the thread count's: with --threads 1 (or one core, or --files 1)
             * the parallel tests also run on one thread and must still fill their own rows */
            e = pass(dir, (int)files, size, t, write, buf, &s);
            if (!e && s < rec[k].seconds) rec[k].seconds = s;
            kiln_progress_update(&pr, (uint64_t)(it * 4 + k + 1));
        }
    kiln_progress_finish(&pr);
    /* the writer's mapped path, with --ckpt (its numbers stand beside the checkpoint writer's) */
    double mapped_s = INFINITY;
    const int mapped = ckpt && dir_maps(dir);
    for (long long it = 0; !e && mapped && it < iters; it++) {
        double s = 0;
        e = mapped_pass(dir, (int)files, size, buf, &s);
        if (!e && s < mapped_s) mapped_s = s;
    }
    remove_files(dir, (int)files);
    free(buf);
    ckpt_times ct = {0};
    if (!e && ckpt) e = ckpt_bench(dir, (double)size * (double)files, (int)iters, cuda, &ct);
    /* during the last save: its numbers are in, but the user said stop */
    if (!e && kiln_bench_stop_signal()) e = kiln_bench_interrupted(dir);
    if (e) {
        kiln_bench_fail("io", NULL, e);
        if (kiln_bench_stop_signal()) { /* everything is cleaned up: die of the signal, as the shell expects */
            fprintf(stderr, "kiln bench io: scratch files removed from %s; nothing written\n", dir);
            kiln_bench_die_of_stop();
        }
        return 1;
    }
    const double seq = rec[0].bytes / rec[0].seconds;
    if (ckpt) {
        const char *cn[4] = {"ckpt_save", "ckpt_async_total", "ckpt_async_block", "ckpt_checksum"};
        double cs[4] = {ct.save_s, ct.async_s, ct.block_s, ct.sum_s};
        for (int k = 0; k < 4; k++) /* the ratio only where the whole save is timed */
            rec[nrec++] = (io_rec){cn[k], ct.bytes, ct.bytes, 1, 1, cs[k], k < 2 ? ct.bytes / cs[k] / seq : 0};
        const char *gn[3] = {"ckpt_save_cuda", "ckpt_async_total_cuda", "ckpt_async_block_cuda"};
        double gs[3] = {ct.gsave_s, ct.gasync_s, ct.gblock_s};
        for (int k = 0; cuda && k < 3; k++)
            rec[nrec++] = (io_rec){gn[k], ct.bytes, ct.bytes, 1, 1, gs[k], k < 2 ? ct.bytes / gs[k] / seq : 0};
        if (mapped) /* last, so that the records above keep their places */
            rec[nrec++] = (io_rec){"seq_write_mapped", (double)size * (double)files, (double)size, (double)files,
                                   1, mapped_s, (double)size * (double)files / mapped_s / seq};
        else
            printf("(no seq_write_mapped: %s is not on a file system the checkpoint writer maps files on)\n", dir);
    }
    /* every row must hold a measured time: an unmeasured one (INFINITY) would print inf and reach the JSON as
     * null, which kiln bench report refuses; better to say which test it is here than write such a profile */
    for (size_t i = 0; i < nrec; i++)
        if (!(rec[i].seconds > 0) || !isfinite(rec[i].seconds)) {
            kiln_bench_fail("io", NULL, kiln_errorf(KILN_EINVAL, "%s: no time was measured (%g s); nothing written",
                                                    rec[i].test, rec[i].seconds));
            return 1;
        }
    printf("%-18s %14s %8s %10s %10s %12s\n", "test", "bytes", "threads", "seconds", "GB/s", "vs seq write");
    for (size_t i = 0; i < nrec; i++) {
        printf("%-18s %14.0f %8.0f %10.4f %10.3f", rec[i].test, rec[i].bytes, rec[i].threads, rec[i].seconds,
               rec[i].bytes / rec[i].seconds / 1e9);
        if (rec[i].vs_seq_write > 0) printf(" %11.0f%%", 100 * rec[i].vs_seq_write);
        printf("\n");
    }
    if (ckpt)
        printf("checkpoint save: %.0f%% of the sequential write speed (target >= 80%%); an async save blocks training "
               "for %.4f s (the snapshot): at one save per 100 steps that is %.4f s per step on average\n",
               100 * rec[4].vs_seq_write, ct.block_s, ct.block_s / 100);
    if (ckpt && cuda)
        printf("from the GPU: a save %.0f%% of the sequential write speed (sync, streamed from the live buffers), "
               "async %.0f%%; an async save blocks training for %.4f s (snapshot in %s memory)\n",
               100 * rec[8].vs_seq_write, 100 * rec[9].vs_seq_write, ct.gblock_s, ct.gwhere);
    io_out o = {rec, nrec};
    const kiln_bench_output out = {"io", nrec, &o, json_record, NULL,
                                   "test,bytes,file_bytes,files,threads,seconds,gbs,vs_seq_write\n", csv_row};
    return kiln_bench_write_outputs(&out, json_path, csv_path);
}
