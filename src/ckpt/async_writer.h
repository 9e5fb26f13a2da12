/* One background job at a time: the checkpoint writer's thread. The job only touches files
 * and memory it was handed (no collectives: MPI is not initialised for threads), so the main
 * thread keeps training and learns the outcome at poll/join, never losing an error. */
#ifndef KILN_CKPT_ASYNC_WRITER_H
#define KILN_CKPT_ASYNC_WRITER_H

#include <pthread.h>
#include <stdatomic.h>

#include "kiln/error.h"

typedef kiln_error *(*kiln_bg_fn)(void *arg);

typedef struct {
    pthread_t tid;
    int running;     /* started and not yet joined */
    atomic_int done; /* the job has returned */
    kiln_bg_fn fn;
    void *arg;
    kiln_error *err;
} kiln_bg_job;

/* Start fn(arg) on a thread that blocks SIGINT/SIGTERM (they stay with the main thread). If no
 * thread can be created the job runs here, synchronously: slower, never lost. */
kiln_error *kiln_bg_start(kiln_bg_job *j, kiln_bg_fn fn, void *arg);
/* Non-blocking: has the job finished (or was none started)? */
int kiln_bg_done(kiln_bg_job *j);
/* Wait for the job and return its error (NULL if none or no job). */
kiln_error *kiln_bg_join(kiln_bg_job *j);

#endif
