/* The checkpoint writer's background thread (see async_writer.h). */
#include "async_writer.h"

#include <signal.h>
#include <string.h>

static void *trampoline(void *p) {
    kiln_bg_job *j = p;
    j->err = j->fn(j->arg);
    atomic_store(&j->done, 1);
    return NULL;
}

kiln_error *kiln_bg_start(kiln_bg_job *j, kiln_bg_fn fn, void *arg) {
    if (j->running) return kiln_errorf(KILN_EINVAL, "checkpoint writer: a job is still running");
    j->fn = fn;
    j->arg = arg;
    j->err = NULL;
    atomic_store(&j->done, 0);
    /* the thread inherits this mask: Ctrl-C keeps landing on the training thread */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&j->tid, NULL, trampoline, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        trampoline(j);
        return NULL;
    }
    j->running = 1;
    return NULL;
}

int kiln_bg_done(kiln_bg_job *j) { return !j->running || atomic_load(&j->done); }

kiln_error *kiln_bg_join(kiln_bg_job *j) {
    if (j->running) {
        pthread_join(j->tid, NULL);
        j->running = 0;
    }
    kiln_error *e = j->err;
    j->err = NULL;
    return e;
}
