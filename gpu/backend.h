/* backend: what an executor backend implements and the dispatcher calls
 * (gpu/executor.c); callers use gpu/executor.h.
 *
 * A backend is an opaque `impl` plus an ops table.  submit starts a job
 * and reports its end through job->done exactly once (the contract of
 * gpu/executor.h); help lets the submitting thread work on the job too;
 * destroy frees the backend, and is called only once no job of it is in
 * flight (rs_executor_destroy, after the daemon's last read).  Backends
 * cut jobs into pieces with rs_exec_job_split (gpu/job.c) and release
 * them when the job ends.
 */
#ifndef RS_BACKEND_H
#define RS_BACKEND_H

#include <stdint.h>

#include "gpu/executor.h"
#include "planner/diag.h"

typedef struct {
	const char *name;
	int (*submit)(void *impl, rs_exec_job *job);
	/* Lets the caller's thread execute pieces of `job` (may be NULL). */
	void (*help)(void *impl, rs_exec_job *job);
	void (*destroy)(void *impl);
} rs_executor_ops;

/* Cuts a job into pieces of at most `max_bytes` (job->pieces, malloc'd;
 * freed by rs_exec_job_release). */
int rs_exec_job_split(rs_exec_job *job, uint64_t max_bytes);
void rs_exec_job_release(rs_exec_job *job);

int rs_cpu_executor_create(void **impl, const rs_executor_ops **ops,
			   unsigned threads);

/* For tests of the dispatcher: like rs_executor_create, with the device
 * backend given instead of CUDA (the executor destroys it). */
int rs_executor_create_with_device(rs_executor **out,
				   const rs_executor_opts *o,
				   const rs_executor_ops *dev_ops,
				   void *dev_impl);

/* The CUDA backend (gpu/cuda.c; built when CMake finds the toolkit, which
 * defines RS_HAVE_CUDA).  Its submit returns -E2BIG for a job larger than
 * its staging buffers (the caller runs it on the CPU), and a job the
 * device failed on ends with status -ENODEV: none of its destination is
 * valid and the caller reruns it on the CPU.  Create returns -ENODEV, with
 * a line in d saying why, when no listed device is usable; -ENOMEM when
 * gpu_mem cannot hold one staging lane. */
int rs_cuda_executor_create(void **impl, const rs_executor_ops **ops,
			    const rs_executor_opts *o, rs_diag *d);

#endif
