/* The NCCL backend of kiln_comm at one rank (the GPU machine has one GPU; more ranks run in
 * bench/multi_gpu.sh): ZeRO-1's uneven reduce-scatter/all-gather, the typed collectives in and out of
 * place, and the host control calls, all with exact expected values. */
#include "gpu_testutil.h"
#include "kiln/comm.h"

TEST(gpu_comm_nccl_one_rank) {
    kiln_comm *boot = NULL, *c = NULL;
    CHECK_OK(kiln_comm_local(&boot));
    kiln_error *e = kiln_comm_nccl_from(boot, &c);
    if (e) {
        CHECK_OK(e);
        boot->finalize(boot);
        return;
    }
    CHECK(c->device_buffers == 1 && c->size == 1 && c->rank == 0 && !strcmp(c->backend, "nccl"));
    const int64_t n = 1000;
    float *h = malloc(n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 97) - 48.0f;
    float *d = gt_up_f32(h, n), *d2 = gt_dev(n * sizeof(float));
    /* ZeRO-1: one rank owns everything; reduce-scatter of its block into another buffer, all-gather in place */
    size_t counts[1] = {(size_t)n - 100}, displs[1] = {100};
    CHECK_OK(c->allreduce_sum(c, d, (size_t)n));
    CHECK_OK(c->reduce_scatter_sum(c, d, d2, counts, displs));
    CHECK_OK(c->allgather(c, d, counts, displs));
    CHECK_OK(kiln_comm_sync(c));
    float *r = gt_down_f32(d2, n - 100), *r2 = gt_down_f32(d, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n - 100; i++) bad += r[i] != h[100 + i];
    for (int64_t i = 0; i < n; i++) bad += r2[i] != h[i];
    CHECK_MSG(bad == 0, "%lld wrong elements", (long long)bad);
    /* typed: out-of-place all-to-all and in-place all-to-all (the copy-aside path) */
    CHECK_OK(c->alltoall_dt(c, d, d2, (size_t)n, KILN_DT_F32));
    CHECK_OK(c->alltoall_dt(c, d2, d2, (size_t)n, KILN_DT_F32));
    CHECK_OK(c->broadcast_dt(c, d2, d2, (size_t)n, KILN_DT_F32, 0));
    CHECK_ERR(c->broadcast_dt(c, d2, d2, (size_t)n, KILN_DT_F32, 1), "root 1 is not a rank");
    CHECK_ERR(c->allreduce_sum_dt(c, d2, d2, (size_t)n, KILN_DT_I8), "dtype");
    CHECK_OK(kiln_comm_sync(c));
    free(r);
    r = gt_down_f32(d2, n);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += r[i] != h[i];
    CHECK_MSG(bad == 0, "all-to-all/broadcast: %lld wrong elements", (long long)bad);
    /* control plane on host memory */
    double x[3] = {1.5, -2, 3};
    CHECK_OK(c->allreduce_sum_f64(c, x, 3));
    CHECK_OK(c->allreduce_max_f64(c, x, 3));
    char msg[64] = "hello";
    CHECK_OK(c->broadcast(c, msg, sizeof msg, 0));
    CHECK_OK(c->barrier(c));
    CHECK(x[0] == 1.5 && x[1] == -2 && x[2] == 3 && !strcmp(msg, "hello"));
    kiln_cuda_free(d), kiln_cuda_free(d2);
    free(h), free(r), free(r2);
    c->finalize(c); /* and boot */
}

/* Two ranks of one machine on one GPU under NCCL (CUDA_VISIBLE_DEVICES=0 for both, whatever the machine has):
 * every rank stops at start-up with both rank numbers and the way to share a GPU (KILN_COMM=staged), instead of
 * failing, or hanging, inside NCCL's init. Both kiln bench comm and kiln train go through kiln_comm_nccl_from. */
TEST(gpu_comm_nccl_two_ranks_on_one_gpu_refused) {
    if (system("command -v mpirun >/dev/null 2>&1")) {
        CHECK_MSG(0, "mpirun not found: the GPU machine needs OpenMPI (.debs, scripts/gpu_machine_build.sh)");
        return;
    }
    char cmd[2048];
    static char out[65536];
    snprintf(cmd, sizeof cmd,
             "CUDA_VISIBLE_DEVICES=0 OMPI_MCA_btl=self,vader timeout 120 mpirun --allow-run-as-root --oversubscribe "
             "-np 2 '%s' bench comm --backend nccl -b 8 -e 64 -n 1 -w 0 2>&1", KILN_BINARY);
    const int rc = test_run_shell(cmd, out, sizeof out);
    CHECK_MSG(rc != 0 && rc != 124, "exit %d (want a refusal, not success or the timeout):\n%s", rc, out);
    CHECK_MSG(strstr(out, "ranks 0 and 1 are on one host and one GPU") && strstr(out, "KILN_COMM=staged"),
              "no refusal naming both ranks:\n%s", out);
}
