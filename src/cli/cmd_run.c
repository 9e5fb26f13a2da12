/* kiln run [options] -- <training command>: the fault-tolerant supervisor. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/ft.h"

static const char usage[] =
    "usage: kiln run [options] -- <training command>\n\n"
    "Runs a training command under a supervisor: it launches the ranks (directly for one rank, through\n"
    "mpirun for several), follows each rank's heartbeat, and detects a rank that exits or is killed, a\n"
    "hang (no progress past a timeout, also inside a collective), NaN/Inf in the loss or gradient norm,\n"
    "loss spikes (z-score over a window) and stragglers. It then stops the job (SIGTERM, SIGKILL after\n"
    "the grace period), rolls back to the newest valid checkpoint (skipping the data window of a NaN or\n"
    "spike), and restarts with exponential back-off, up to a retry budget. Every incident goes to\n"
    "RUN_DIR/incidents.jsonl and one line on screen. Ctrl-C stops the ranks cleanly (they checkpoint).\n\n"
    "  kiln run --np 2 --run-dir runs/x -- kiln train --config x.json\n\n"
    "  --np N                 ranks (default 1)\n"
    "  --launcher L           auto (default: direct for 1 rank, mpirun for more), direct, mpirun\n"
    "  --mpirun PROG          the mpirun program (default mpirun; OpenMPI's -x passes the protocol)\n"
    "  --mpirun-args \"A B\"    extra mpirun arguments, e.g. \"--oversubscribe --allow-run-as-root\"\n"
    "  --run-dir DIR          heartbeat/, incidents.jsonl and ft_state.json (the windows skipped so far and\n"
    "                         the loss-spike window's losses: the same command continues the run)\n"
    "                         (default runs/default, the default run's out_dir; created with its\n"
    "                         parents); several nodes need it on a shared file system\n"
    "  --max-restarts N       retry budget (default 5). A failure before any rank's first step with the\n"
    "                         same error line 3 times in a row ends the run at once (a missing config\n"
    "                         file, an unknown flag), unless the line names a transient errno: EAGAIN,\n"
    "                         EBUSY, ETIMEDOUT, ECONNREFUSED, ECONNRESET, ECONNABORTED, EINTR, EADDRINUSE,\n"
    "                         ENETUNREACH, ENETDOWN, EHOSTUNREACH, EHOSTDOWN, ESTALE, ETXTBSY, or its\n"
    "                         message ('Resource temporarily unavailable'): those are retried with the\n"
    "                         back-off up to N restarts like any failure (ENOENT, ENOSPC, ENOMEM... are\n"
    "                         not transient)\n"
    "  --backoff S            first restart delay, doubled each restart (default 1)\n"
    "  --backoff-max S        longest delay (default 60)\n"
    "  --hang-timeout S       no heartbeat progress for S seconds is a hang (default 300; must exceed the\n"
    "                         longest step, evaluation or checkpoint save)\n"
    "  --start-timeout S      time to a rank's first heartbeat (default 600)\n"
    "  --grace S              SIGTERM (or Ctrl-C) to SIGKILL (default 10; a second Ctrl-C: at once)\n"
    "  --spike-z Z            a loss Z standard deviations above the window's mean is a spike (default 6,\n"
    "                         0: off)\n"
    "  --spike-window N       steps in the window (default 50; kept in ft_state.json, so a rerun is not\n"
    "                         blind: it judges its first steps against the losses before them)\n"
    "  --spike-min N          steps seen before spikes are judged (default 10)\n"
    "  --skip-window N        steps skipped, ending at the NaN or spike step (default 1; 0: roll back\n"
    "                         without skipping)\n"
    "  --straggler-factor F   a rank whose compute time is F x the median of the others' (default 3,\n"
    "                         0: off) ...\n"
    "  --straggler-steps N    ... for N steps in a row (default 5) is a straggler\n"
    "  --straggler-action A   warn (default) or restart\n"
    "  --quiet                do not forward the ranks' output\n\n"
    "The training command gets KILN_HEARTBEAT_DIR, KILN_RUN_ATTEMPT, KILN_RESUME, KILN_REJECT_FROM and\n"
    "KILN_SKIP_STEPS (docs/fault-tolerance.md). KILN_FAULT injects faults for tests, e.g.\n"
    "KILN_FAULT=kill:rank=1:step=7 (kinds: kill, stop, nan, spike, slow, disk-full, crash-in-save,\n"
    "slow-save).\n"
    "Exit status: 0 finished, 1 gave up, 130 interrupted, 2 usage.\n";

static volatile int interrupted;
static void on_signal(int sig) {
    (void)sig;
    interrupted++;
}

static kiln_error *num_arg(const char *flag, const char *v, double lo, double *out) {
    KILN_TRY(cli_double(flag, v, out));
    if (!(*out >= lo)) return kiln_errorf(KILN_EINVAL, "%s: %s must be >= %g", flag, v, lo);
    return NULL;
}

static kiln_error *int_arg(const char *flag, const char *v, int64_t lo, int64_t hi, int *out) {
    int64_t x;
    KILN_TRY(cli_int_in(flag, v, lo, hi, &x));
    *out = (int)x;
    return NULL;
}

static int cmd(int argc, char **argv) {
    kiln_supervisor_opts o;
    kiln_supervisor_opts_default(&o);
    o.out = stdout;
    o.interrupted = &interrupted;
    kiln_error *e = NULL;
    int i = 1;
    for (; i < argc && !e; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
        if (a[0] != '-') { /* "kiln run kiln train": the command's words taken for options */
            e = kiln_errorf(KILN_EINVAL, "'%s': the training command must follow '--' (kiln run [options] -- kiln train ...)", a);
            break;
        }
        if (i + 1 >= argc) { e = kiln_errorf(KILN_EINVAL, "%s needs a value (see kiln run --help)", a); break; }
        const char *v = argv[++i];
        if (!strcmp(a, "--np")) e = int_arg(a, v, 1, KILN_FT_MAX_NP, &o.np);
        else if (!strcmp(a, "--launcher")) {
            if (!strcmp(v, "auto")) o.launcher = KILN_LAUNCH_AUTO;
            else if (!strcmp(v, "direct")) o.launcher = KILN_LAUNCH_DIRECT;
            else if (!strcmp(v, "mpirun")) o.launcher = KILN_LAUNCH_MPIRUN;
            else e = kiln_errorf(KILN_EINVAL, "--launcher %s: auto, direct or mpirun", v);
        } else if (!strcmp(a, "--mpirun")) o.mpirun = v;
        else if (!strcmp(a, "--mpirun-args")) o.mpirun_args = v;
        else if (!strcmp(a, "--run-dir")) o.run_dir = v;
        else if (!strcmp(a, "--max-restarts")) e = int_arg(a, v, 0, 1000000000, &o.max_restarts);
        else if (!strcmp(a, "--backoff")) e = num_arg(a, v, 0, &o.backoff_s);
        else if (!strcmp(a, "--backoff-max")) e = num_arg(a, v, 0, &o.backoff_max_s);
        else if (!strcmp(a, "--hang-timeout")) e = num_arg(a, v, 0.1, &o.hang_timeout_s);
        else if (!strcmp(a, "--start-timeout")) e = num_arg(a, v, 0.1, &o.start_timeout_s);
        else if (!strcmp(a, "--grace")) e = num_arg(a, v, 0, &o.grace_s);
        else if (!strcmp(a, "--spike-z")) e = num_arg(a, v, 0, &o.spike_z);
        else if (!strcmp(a, "--spike-window")) e = int_arg(a, v, 2, KILN_FT_MAX_SPIKE_WINDOW, &o.spike_window);
        else if (!strcmp(a, "--spike-min")) e = int_arg(a, v, 2, KILN_FT_MAX_SPIKE_WINDOW, &o.spike_min);
        else if (!strcmp(a, "--skip-window")) e = int_arg(a, v, 0, 1000000000, &o.skip_window);
        else if (!strcmp(a, "--straggler-factor")) e = num_arg(a, v, 0, &o.straggler_factor);
        else if (!strcmp(a, "--straggler-steps")) e = int_arg(a, v, 1, 1000000000, &o.straggler_steps);
        else if (!strcmp(a, "--straggler-action")) {
            if (!strcmp(v, "warn")) o.straggler_restart = 0;
            else if (!strcmp(v, "restart")) o.straggler_restart = 1;
            else e = kiln_errorf(KILN_EINVAL, "--straggler-action %s: warn or restart", v);
        } else e = kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln run --help)", a);
    }
    if (e) {
        fprintf(stderr, "kiln run: error: %s\n", kiln_error_msg(e));
        kiln_error_free(e);
        return 2;
    }
    if (i >= argc - 1) {
        fprintf(stderr, "kiln run: error: no training command: kiln run [options] -- kiln train ...\n");
        return 2;
    }
    o.cmd = argv + i + 1; /* argv is NULL-terminated */
    /* the options together (--spike-min above --spike-window, --launcher direct with --np 2, a --run-dir too
     * long): usage errors too, before anything is created */
    if ((e = kiln_supervisor_check(&o))) {
        fprintf(stderr, "kiln run: error: %s\n", kiln_error_msg(e));
        kiln_error_free(e);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll() returns and the supervisor acts */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int status = 1;
    e = kiln_supervise(&o, &status);
    if (e) return cli_fail("run", e);
    return status;
}

const kiln_cmd kiln_cmd_run = {"run", "run training under the fault-tolerant supervisor (kiln run -- kiln train ...)", cmd,
                               usage};
