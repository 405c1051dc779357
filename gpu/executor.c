/* Executor selection and dispatch (gpu/executor.h).  Every #ifdef that
 * picks a backend belongs in this file. */
#include "gpu/executor.h"

#include "gpu/backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef RS_HAVE_CUDA
#include "gpu/cuda.h"
#endif

enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 };

/* What AUTO knows about one kind of work on one backend. */
typedef struct {
	unsigned samples;
	double ns_per_byte;     /* moving average of job latency per byte */
} measure;

/* After this many samples of each backend, AUTO keeps to the faster one,
 * sending every REMEASURE-th job of that kind to the other so a change
 * (a cold page cache, a busy device) is seen. */
#define AUTO_SAMPLES 4
#define AUTO_REMEASURE 32

struct rs_executor {
	rs_executor_kind mode;
	const rs_executor_ops *cpu_ops;
	void *cpu;
	const rs_executor_ops *cuda_ops;
	void *cuda;                     /* NULL: not built or not usable */
	bool real_cuda;                 /* not a test's stand-in */
	void (*log)(const char *line);
	_Atomic bool cuda_ok;           /* cleared by a device failure */
	pthread_mutex_t lock;           /* everything below */
	rs_backend_stats stats[2];
	measure m[RS_WORK_KINDS][2];
	uint64_t kind_jobs[RS_WORK_KINDS];
	uint64_t fallbacks;
	char cuda_status[256];
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *mode_name(rs_executor_kind k)
{
	return k == RS_EXECUTOR_CPU ? "cpu" : k == RS_EXECUTOR_CUDA ? "cuda"
								     : "auto";
}

#ifdef RS_HAVE_CUDA
static int start_cuda(rs_executor *ex, const rs_executor_opts *o, rs_diag *d)
{
	rs_diag *mine = rs_diag_new();
	int err;

	if (!mine)
		return -ENOMEM;
	err = rs_cuda_executor_create(&ex->cuda, &ex->cuda_ops, o, mine);
	if (err) {
		ex->cuda = NULL;
		snprintf(ex->cuda_status, sizeof(ex->cuda_status), "%s",
			 rs_diag_line(mine, 0) ? rs_diag_line(mine, 0)
					       : strerror(-err));
		if (o->kind == RS_EXECUTOR_CUDA)
			rs_diag_add(d, "executor=cuda: %s", ex->cuda_status);
	} else {
		snprintf(ex->cuda_status, sizeof(ex->cuda_status), "ready");
		ex->real_cuda = true;
		atomic_store(&ex->cuda_ok, true);
	}
	rs_diag_free(mine);
	return o->kind == RS_EXECUTOR_CUDA ? err : 0;
}
#else
static int start_cuda(rs_executor *ex, const rs_executor_opts *o, rs_diag *d)
{
	snprintf(ex->cuda_status, sizeof(ex->cuda_status),
		 "not built (no CUDA toolkit at build time)");
	if (o->kind != RS_EXECUTOR_CUDA)
		return 0;
	rs_diag_add(d, "executor=cuda: this reshardfs was built without CUDA");
	return -ENODEV;
}
#endif

/* Both constructors: the CPU pool, then the device from `dev_ops` (a
 * test's stand-in) or from start_cuda. */
static int create(rs_executor **out, const rs_executor_opts *o,
		  const rs_executor_ops *dev_ops, void *dev_impl, rs_diag *d)
{
	rs_executor *ex = calloc(1, sizeof(*ex));
	int err;

	if (!ex)
		return -ENOMEM;
	ex->mode = o->kind;
	ex->log = o->log;
	pthread_mutex_init(&ex->lock, NULL);
	err = rs_cpu_executor_create(&ex->cpu, &ex->cpu_ops, o->threads);
	if (err)
		goto fail;
	snprintf(ex->cuda_status, sizeof(ex->cuda_status), "not used");
	if (o->kind != RS_EXECUTOR_CPU && dev_ops) {
		ex->cuda_ops = dev_ops;
		ex->cuda = dev_impl;
		snprintf(ex->cuda_status, sizeof(ex->cuda_status), "ready");
		atomic_store(&ex->cuda_ok, true);
	} else if (o->kind != RS_EXECUTOR_CPU) {
		err = start_cuda(ex, o, d);
		if (err)
			goto fail_cpu;
	}
	*out = ex;
	return 0;
fail_cpu:
	ex->cpu_ops->destroy(ex->cpu);
fail:
	pthread_mutex_destroy(&ex->lock);
	free(ex);
	return err;
}

int rs_executor_create(rs_executor **out, const rs_executor_opts *o,
		       rs_diag *d)
{
	return create(out, o, NULL, NULL, d);
}

int rs_executor_create_with_device(rs_executor **out,
				   const rs_executor_opts *o,
				   const rs_executor_ops *dev_ops,
				   void *dev_impl)
{
	return create(out, o, dev_ops, dev_impl, NULL);
}

int rs_executor_probe(const rs_executor_opts *o, rs_diag *d)
{
	char line[512] = "";
	int fds[2], status = 0;
	ssize_t got;
	pid_t pid;

	if (o->kind != RS_EXECUTOR_CUDA)
		return 0;
	if (pipe(fds) != 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -EAGAIN;
	}
	if (pid == 0) {
		rs_executor_opts one = *o;
		rs_diag *mine = rs_diag_new();
		rs_executor *ex;
		int err;

		one.threads = 1;
		err = mine ? rs_executor_create(&ex, &one, mine) : -ENOMEM;
		if (!err)
			rs_executor_destroy(ex);
		else if (rs_diag_line(mine, 0) &&
			 write(fds[1], rs_diag_line(mine, 0),
			       strlen(rs_diag_line(mine, 0))) < 0)
			err = -EIO;
		_exit(err ? 1 : 0);
	}
	close(fds[1]);
	do
		got = read(fds[0], line, sizeof(line) - 1);
	while (got < 0 && errno == EINTR);
	close(fds[0]);
	line[got > 0 ? got : 0] = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	rs_diag_add(d, "%s", line[0] ? line : "executor=cuda: the device check failed");
	return -ENODEV;
}

void rs_executor_destroy(rs_executor *ex)
{
	if (!ex)
		return;
	if (ex->cuda)
		ex->cuda_ops->destroy(ex->cuda);
	ex->cpu_ops->destroy(ex->cpu);
	pthread_mutex_destroy(&ex->lock);
	free(ex);
}

const char *rs_executor_name(const rs_executor *ex)
{
	return mode_name(ex->mode);
}

const char *rs_executor_backends(void)
{
#ifdef RS_HAVE_CUDA
	return "cpu cuda";
#else
	return "cpu";
#endif
}

const char *rs_executor_cuda_status(rs_executor *ex)
{
	return ex->cuda_status;
}

rs_work_kind rs_exec_job_kind(const rs_exec_job *job)
{
	if (job->from != job->to)
		return RS_WORK_CAST;
	for (size_t i = 0; i < job->nops; i++)
		if (job->ops[i].count > 1)
			return RS_WORK_STRIDED;
	return RS_WORK_RUNS;
}

/* The backend for the next job of `kind` (lock held). */
static int choose(rs_executor *ex, rs_work_kind kind)
{
	const measure *m = ex->m[kind];
	uint64_t n;
	int best;

	if (!atomic_load(&ex->cuda_ok))
		return BACKEND_CPU;
	if (ex->mode == RS_EXECUTOR_CUDA)
		return BACKEND_CUDA;
	if (kind == RS_WORK_RUNS)
		return BACKEND_CPU;   /* plain copies stay on the CPU */
	n = ex->kind_jobs[kind]++;
	if (m[BACKEND_CPU].samples < AUTO_SAMPLES ||
	    m[BACKEND_CUDA].samples < AUTO_SAMPLES)
		return m[BACKEND_CPU].samples <= m[BACKEND_CUDA].samples
			? BACKEND_CPU : BACKEND_CUDA;
	best = m[BACKEND_CUDA].ns_per_byte < m[BACKEND_CPU].ns_per_byte
		? BACKEND_CUDA : BACKEND_CPU;
	return n % AUTO_REMEASURE == 0 ? 1 - best : best;
}

static void account(rs_executor *ex, const rs_exec_job *job, int backend,
		    uint64_t ns)
{
	measure *m = &ex->m[job->kind][backend];
	double per = job->size ? (double)ns / (double)job->size : 0;

	pthread_mutex_lock(&ex->lock);
	ex->stats[backend].jobs++;
	ex->stats[backend].bytes += job->size;
	ex->stats[backend].ns += ns;
	m->ns_per_byte = m->samples ? 0.75 * m->ns_per_byte + 0.25 * per : per;
	m->samples++;
	pthread_mutex_unlock(&ex->lock);
}

static void finish(rs_exec_job *job, int status);

static int submit_to(rs_executor *ex, rs_exec_job *job, int backend)
{
	atomic_store(&job->backend, backend);
	job->done = finish;
	job->arg = ex;
	job->start_ns = now_ns();
	if (backend == BACKEND_CUDA)
		return ex->cuda_ops->submit(ex->cuda, job);
	return ex->cpu_ops->submit(ex->cpu, job);
}

/* A job the device could not run (status -ENODEV from the backend, or a
 * refusal at submit) is run again on the CPU.  A device failure also
 * turns the device off for later jobs. */
static int fall_back(rs_executor *ex, rs_exec_job *job, bool device_failed)
{
	pthread_mutex_lock(&ex->lock);
	ex->fallbacks++;
	pthread_mutex_unlock(&ex->lock);
	if (device_failed && atomic_exchange(&ex->cuda_ok, false)) {
		const char *why = "device error";

#ifdef RS_HAVE_CUDA
		if (ex->real_cuda && rs_cuda_last_error(ex->cuda))
			why = rs_cuda_last_error(ex->cuda);
#endif
		char line[sizeof(ex->cuda_status) + 64];

		pthread_mutex_lock(&ex->lock);
		snprintf(ex->cuda_status, sizeof(ex->cuda_status),
			 "failed: %s", why);
		snprintf(line, sizeof(line), "CUDA executor %s; blocks are built on the CPU from now on",
			 ex->cuda_status);
		pthread_mutex_unlock(&ex->lock);
		if (ex->log)
			ex->log(line);
	}
	return submit_to(ex, job, BACKEND_CPU);
}

static void finish(rs_exec_job *job, int status)
{
	rs_executor *ex = job->arg;
	int backend = atomic_load(&job->backend);

	if (backend == BACKEND_CUDA && status == -ENODEV) {
		int err = fall_back(ex, job, true);

		if (!err)
			return;
		status = err;
	}
	account(ex, job, backend, now_ns() - job->start_ns);
	job->done = job->user_done;
	job->arg = job->user_arg;
	job->done(job, status);
}

/* Submits and says which backend took the job first. */
static int dispatch(rs_executor *ex, rs_exec_job *job, int *backend)
{
	int err;

	job->user_done = job->done;
	job->user_arg = job->arg;
	job->kind = rs_exec_job_kind(job);
	pthread_mutex_lock(&ex->lock);
	*backend = choose(ex, job->kind);
	pthread_mutex_unlock(&ex->lock);
	err = submit_to(ex, job, *backend);
	if (err && *backend == BACKEND_CUDA) {
		*backend = BACKEND_CPU;
		err = fall_back(ex, job, err == -ENODEV);
	}
	if (err) {
		job->done = job->user_done;
		job->arg = job->user_arg;
	}
	return err;
}

int rs_executor_submit(rs_executor *ex, rs_exec_job *job)
{
	int backend;

	return dispatch(ex, job, &backend);
}

void rs_executor_get_stats(rs_executor *ex, rs_executor_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->mode = mode_name(ex->mode);
#ifdef RS_HAVE_CUDA
	out->cuda_built = true;
#endif
	pthread_mutex_lock(&ex->lock);
	out->cuda_usable = atomic_load(&ex->cuda_ok);
	out->cpu = ex->stats[BACKEND_CPU];
	out->cuda = ex->stats[BACKEND_CUDA];
	out->cuda_fallbacks = ex->fallbacks;
	for (int k = 0; k < RS_WORK_KINDS; k++) {
		const measure *m = ex->m[k];
		bool cuda = out->cuda_usable &&
			    (ex->mode == RS_EXECUTOR_CUDA ||
			     (k != RS_WORK_RUNS &&
			      m[BACKEND_CPU].samples >= AUTO_SAMPLES &&
			      m[BACKEND_CUDA].samples >= AUTO_SAMPLES &&
			      m[BACKEND_CUDA].ns_per_byte < m[BACKEND_CPU].ns_per_byte));

		out->choice[k] = cuda ? "cuda" : "cpu";
	}
	snprintf(out->cuda_status, sizeof(out->cuda_status), "%s",
		 ex->cuda_status);
	pthread_mutex_unlock(&ex->lock);
#ifdef RS_HAVE_CUDA
	if (ex->real_cuda)
		rs_cuda_transfer_stats(ex->cuda, &out->h2d_bytes, &out->h2d_ns,
				       &out->d2h_bytes, &out->d2h_ns);
#endif
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

	int backend;

	job->done = run_done;
	job->arg = &w;
	err = dispatch(ex, job, &backend);
	if (err)
		return err;
	/* Only a job the CPU took from the start: one the device hands back
	 * may be entering the CPU queue right now. */
	if (backend == BACKEND_CPU && ex->cpu_ops->help)
		ex->cpu_ops->help(ex->cpu, job);
	pthread_mutex_lock(&w.lock);
	while (!w.finished)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
	return w.status;
}
