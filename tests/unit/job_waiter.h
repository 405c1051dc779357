/* job_waiter: waiting for an executor job's `done` in the unit tests.
 *
 * rs_test_waiter_init(w, job) points the job's done/arg at w;
 * rs_test_waiter_done counts every call (a job must end exactly once) and
 * keeps the status; rs_test_waiter_wait returns that status, and ends the
 * whole test (exit 1, naming `who`) when no call comes in `seconds` - a hung
 * device must not hang the run. */
#ifndef RS_TEST_JOB_WAITER_H
#define RS_TEST_JOB_WAITER_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "gpu/executor.h"

typedef struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int calls;
	int status;
} rs_test_waiter;

static inline void rs_test_waiter_done(rs_exec_job *job, int status)
{
	rs_test_waiter *w = job->arg;

	pthread_mutex_lock(&w->lock);
	w->calls++;
	w->status = status;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static inline void rs_test_waiter_init(rs_test_waiter *w, rs_exec_job *job)
{
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->calls = 0;
	w->status = 0;
	job->done = rs_test_waiter_done;
	job->arg = w;
}

static inline int rs_test_waiter_wait(rs_test_waiter *w, int seconds,
				      const char *who)
{
	struct timespec until;
	int status;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += seconds;
	pthread_mutex_lock(&w->lock);
	while (w->calls == 0)
		if (pthread_cond_timedwait(&w->cond, &w->lock, &until) == ETIMEDOUT) {
			fprintf(stderr, "%s: a job did not finish in %d s\n", who,
				seconds);
			_exit(1);
		}
	status = w->status;
	pthread_mutex_unlock(&w->lock);
	return status;
}

static inline void rs_test_waiter_free(rs_test_waiter *w)
{
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
}

#endif
