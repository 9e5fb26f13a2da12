/* The ranks' host layout and GPU choice (src/comm/comm_hosts.c): the pure parts against a brute-force reference
 * on random layouts, the exchange on the local backend, and the whole under mpirun without the launcher's
 * local-rank variables (as srun starts ranks), on one machine made into two "hosts" by KILN_HOST_ID. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include "kiln/comm.h"
#include "test.h"

/* the layout by definition, O(n^2) */
static kiln_host_layout layout_ref(const uint64_t *ids, int n, int me) {
    kiln_host_layout h = {0};
    int first_mine = me;
    for (int r = 0; r < n; r++)
        if (ids[r] == ids[me]) {
            h.local_size++;
            h.local_rank += r < me;
            if (r < first_mine) first_mine = r;
        }
    for (int r = 0; r < n; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++) first = ids[q] != ids[r];
        h.nhosts += first;
        h.host_index += first && r < first_mine;
    }
    return h;
}

TEST(comm_host_layout_of_matches_reference) {
    /* a fixed case: hosts A A B B A C, in rank order */
    const uint64_t ids[6] = {7, 7, 3, 3, 7, 1ULL << 63};
    const int want[6][4] = {{0, 3, 3, 0}, {1, 3, 3, 0}, {0, 2, 3, 1}, {1, 2, 3, 1}, {2, 3, 3, 0}, {0, 1, 3, 2}};
    for (int me = 0; me < 6; me++) {
        kiln_host_layout h;
        CHECK_OK(kiln_host_layout_of(ids, 6, me, &h));
        CHECK_MSG(h.local_rank == want[me][0] && h.local_size == want[me][1] && h.nhosts == want[me][2] &&
                      h.host_index == want[me][3],
                  "rank %d: local %d of %d, %d hosts, host %d", me, h.local_rank, h.local_size, h.nhosts,
                  h.host_index);
    }
    /* random layouts: 1..300 ranks over 1..40 hosts, ids anywhere in 64 bits, ranks placed at random */
    uint64_t s = 0x9e3779b97f4a7c15ULL ^ (uint64_t)time(NULL);
    uint64_t *r_ids = malloc(300 * sizeof *r_ids), hosts[40];
    for (int t = 0; t < 200; t++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        const int n = 1 + (int)((s >> 33) % 300), nh = 1 + (int)((s >> 20) % 40);
        for (int k = 0; k < nh; k++) {
            s = s * 6364136223846793005ULL + 1;
            hosts[k] = s ^ (s >> 29);
        }
        for (int r = 0; r < n; r++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            r_ids[r] = hosts[(s >> 35) % (uint64_t)nh];
        }
        for (int me = 0; me < n; me += 1 + n / 17) {
            kiln_host_layout h, ref = layout_ref(r_ids, n, me);
            CHECK_OK(kiln_host_layout_of(r_ids, n, me, &h));
            CHECK_MSG(!memcmp(&h, &ref, sizeof h), "n %d rank %d: local %d of %d, %d hosts, host %d; want %d of %d, %d, %d",
                      n, me, h.local_rank, h.local_size, h.nhosts, h.host_index, ref.local_rank, ref.local_size,
                      ref.nhosts, ref.host_index);
        }
    }
    free(r_ids);
    kiln_host_layout h;
    CHECK_ERR(kiln_host_layout_of(ids, 6, 6, &h), "rank 6 of 6");
    CHECK_ERR(kiln_host_layout_of(ids, 0, 0, &h), "rank 0 of 0");
}

TEST(comm_gpu_for_rank) {
    kiln_host_layout h = {.local_rank = 2, .local_size = 4, .nhosts = 1};
    int d = -1;
    CHECK_OK(kiln_gpu_for_rank(&h, 1, 8, &d)); /* enough GPUs for the host's ranks: its own */
    CHECK(d == 2);
    CHECK_OK(kiln_gpu_for_rank(&h, 2, 8, &d)); /* two a rank (bench comm -g 2) */
    CHECK(d == 4);
    CHECK_OK(kiln_gpu_for_rank(&h, 1, 4, &d));
    CHECK(d == 2);
    CHECK_OK(kiln_gpu_for_rank(&h, 1, 1, &d)); /* one visible: the launcher bound it to this rank */
    CHECK(d == 0);
    CHECK_OK(kiln_gpu_for_rank(&h, 2, 2, &d));
    CHECK(d == 0);
    CHECK_ERR(kiln_gpu_for_rank(&h, 1, 3, &d), "4 ranks on this host need 4 GPUs (1 each), and 3 are visible");
    CHECK(d == -1);
    CHECK_ERR(kiln_gpu_for_rank(&h, 2, 5, &d), "need 8 GPUs (2 each), and 5 are visible");
    CHECK_ERR(kiln_gpu_for_rank(&h, 1, 0, &d), "no CUDA device");
    kiln_host_layout one = {.local_rank = 0, .local_size = 1, .nhosts = 3};
    CHECK_OK(kiln_gpu_for_rank(&one, 1, 1, &d));
    CHECK(d == 0);
}

TEST(comm_ranks_share_gpu) {
    /* ranks 0-3 on host 1, 4-5 on host 2; GPU ids repeat across hosts (the same PCI address on two machines) */
    uint64_t host[6] = {1, 1, 1, 1, 2, 2}, gpu[6] = {10, 11, 12, 13, 10, 11};
    int a = -1, b = -1;
    CHECK(!kiln_ranks_share_gpu(host, gpu, 6, &a, &b));
    gpu[3] = 11; /* ranks 1 and 3 on one GPU of host 1 */
    CHECK(kiln_ranks_share_gpu(host, gpu, 6, &a, &b) && a == 1 && b == 3);
    gpu[3] = 13, gpu[5] = 10; /* ranks 4 and 5 on host 2 */
    CHECK(kiln_ranks_share_gpu(host, gpu, 6, &a, &b) && a == 4 && b == 5);
    CHECK(!kiln_ranks_share_gpu(host, gpu, 1, &a, &b));
}

TEST(comm_allgather_u64_and_layout_local) {
    kiln_comm *c = NULL;
    CHECK_OK(kiln_comm_local(&c));
    if (!c) return;
    uint64_t v = 0;
    CHECK_OK(kiln_comm_allgather_u64(c, 0xfedcba9876543210ULL, &v)); /* both halves past 2^31 */
    CHECK(v == 0xfedcba9876543210ULL);
    kiln_host_layout h;
    CHECK_OK(kiln_comm_host_layout(c, &h));
    CHECK(h.local_rank == 0 && h.local_size == 1 && h.nhosts == 1 && h.host_index == 0);
    c->finalize(c);
    /* the identity: stable, and KILN_HOST_ID's when set */
    const uint64_t id = kiln_host_id();
    CHECK(id == kiln_host_id());
    setenv("KILN_HOST_ID", "node-a", 1);
    const uint64_t a = kiln_host_id();
    setenv("KILN_HOST_ID", "node-b", 1);
    CHECK(a != kiln_host_id() && a != id);
    unsetenv("KILN_HOST_ID");
    CHECK(kiln_host_id() == id);
}

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* Four ranks started without OMPI_COMM_WORLD_LOCAL_RANK/SIZE (as srun starts them), on two "hosts" of two ranks
 * each by KILN_HOST_ID: kiln bench comm's rank lines show each rank's place on its host, its records say 2 hosts
 * and its profile lists them. Before the layout came from the ranks, every rank here believed itself local rank
 * 0 of 1 (and so took GPU 0), and the hosts were told apart by name alone. */
TEST(comm_host_layout_under_mpirun_without_launcher_env) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    const char *json = test_join(test_tmpdir(), "lay.json");
    char cmd[4096];
    static char out[65536];
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np 4 "
             "sh -c 'unset OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS; "
             "KILN_HOST_ID=node$((OMPI_COMM_WORLD_RANK %% 2)) exec \"$0\" bench comm -b 8 -e 64 -n 1 -w 0 "
             "--collectives all_reduce --json \"$1\"' '%s' '%s' 2>&1",
             KILN_BINARY, json);
    int rc = test_run_shell(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "mpirun failed (%d): %s", rc, out);
    /* ranks 0 and 2 on node0, 1 and 3 on node1 */
    const int lr[4] = {0, 0, 1, 1};
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "Rank %2d Pid", r);
        const char *l = strstr(out, want);
        char tail[64];
        snprintf(tail, sizeof tail, "(local rank %d of 2)", lr[r]);
        const char *nl = l ? strchr(l, '\n') : NULL;
        CHECK_MSG(l && nl && strstr(l, tail) && strstr(l, tail) < nl, "rank %d's line lacks '%s':\n%s", r, tail, out);
    }
    char *text = NULL;
    FILE *f = fopen(json, "rb");
    if (f) {
        text = calloc(1, 1 << 20);
        if (text && fread(text, 1, (1 << 20) - 1, f) == 0) text[0] = 0;
        fclose(f);
    }
    cJSON *p = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(p, "no profile at %s", json);
    if (!p) return;
    const cJSON *hl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "machine"), "hosts");
    CHECK_MSG(cJSON_GetArraySize(hl) == 2, "machine.hosts has %d entries, want 2", cJSON_GetArraySize(hl));
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(p, "comm"), *r; /* the records */
    int n = 0;
    cJSON_ArrayForEach(r, recs) {
        n++;
        CHECK(cJSON_GetObjectItemCaseSensitive(r, "hosts")->valuedouble == 2);
    }
    CHECK_MSG(n == 2 * 4, "%d records", n);
    cJSON_Delete(p);
}
