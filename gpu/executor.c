/* Executor selection and the shared job helpers.  Every #ifdef that picks
 * a backend belongs in this file. */
#include "gpu/executor.h"

#include "planner/array.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct rs_executor {
	const rs_executor_ops *ops;
	void *impl;
};

int rs_executor_create(rs_executor **out, rs_executor_kind kind,
		       unsigned threads, rs_diag *d)
{
	rs_executor *ex = calloc(1, sizeof(*ex));
	int err;

	if (!ex)
		return -ENOMEM;
	switch (kind) {
	case RS_EXECUTOR_CPU:
		err = rs_cpu_executor_create(&ex->impl, &ex->ops, threads);
		break;
	default:
		rs_diag_add(d, "executor: unknown kind %d", (int)kind);
		err = -EINVAL;
	}
	if (err) {
		free(ex);
		return err;
	}
	*out = ex;
	return 0;
}

void rs_executor_destroy(rs_executor *ex)
{
	if (!ex)
		return;
	ex->ops->destroy(ex->impl);
	free(ex);
}

const char *rs_executor_name(const rs_executor *ex)
{
	return ex->ops->name;
}

int rs_executor_submit(rs_executor *ex, rs_exec_job *job)
{
	return ex->ops->submit(ex->impl, job);
}

/* Waiting state of rs_executor_run. */
typedef struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool finished;
	int status;
} run_wait;

static void run_done(rs_exec_job *job, int status)
{
	run_wait *w = job->arg;

	pthread_mutex_lock(&w->lock);
	w->finished = true;
	w->status = status;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int rs_executor_run(rs_executor *ex, rs_exec_job *job)
{
	run_wait w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
		       false, 0 };
	int err;

	job->done = run_done;
	job->arg = &w;
	err = ex->ops->submit(ex->impl, job);
	if (err)
		return err;
	if (ex->ops->help)
		ex->ops->help(ex->impl, job);
	pthread_mutex_lock(&w.lock);
	while (!w.finished)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
	return w.status;
}

static int add_piece(rs_exec_job *job, size_t *cap, rs_exec_piece p)
{
	int err = rs_array_reserve(&job->pieces, cap, job->npieces + 1,
				   sizeof(p));

	if (!err)
		job->pieces[job->npieces++] = p;
	return err;
}

int rs_exec_job_split(rs_exec_job *job, uint64_t max_bytes)
{
	size_t cap = 0;
	int err = 0;

	job->pieces = NULL;
	job->npieces = 0;
	atomic_store(&job->next_piece, 0);
	for (size_t i = 0; i < job->nops && !err; i++) {
		const rs_copy_op *op = &job->ops[i];

		if (op->count == 1) {
			for (uint64_t b = 0; b < op->len && !err; b += max_bytes) {
				rs_exec_piece p = { (uint32_t)i, 0, 1, b,
						    op->len - b < max_bytes ? op->len - b : max_bytes };
				err = add_piece(job, &cap, p);
			}
			continue;
		}
		uint64_t per = op->len >= max_bytes ? 1 : max_bytes / op->len;

		for (uint64_t r = 0; r < op->count && !err; r += per) {
			rs_exec_piece p = { (uint32_t)i, r,
					    op->count - r < per ? op->count - r : per,
					    0, op->len };
			err = add_piece(job, &cap, p);
		}
	}
	if (err) {
		rs_exec_job_release(job);
		job->npieces = 0;
	}
	atomic_store(&job->finished, 0);
	atomic_store(&job->status, 0);
	return err;
}

void rs_exec_job_release(rs_exec_job *job)
{
	/* npieces stays: a helper thread may still compare next_piece with it
	 * (finding nothing left to claim). */
	free(job->pieces);
	job->pieces = NULL;
}
