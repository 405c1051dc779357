/* executor: runs a batch of copy ops (planner/plan.h) into a buffer.
 *
 * One interface, several backends behind a table of function pointers:
 * the CPU thread pool is always built; a CUDA executor plugs in where the
 * toolkit is found.  All #ifdefs choosing a backend live in executor.c.
 *
 * A job names its ops, the destination buffer and the source table.  It
 * completes asynchronously: `done(job, status)` is called exactly once, on
 * some executor thread, with 0 or a negative errno:
 *   -EIO     a source read failed or came back short (never zeros);
 *   -ESTALE  a source file no longer matches its recorded identity.
 * Destination bytes no op writes are zeroed when `zero_fill` is set.
 * The job and its buffers must stay valid until `done` has been called.
 */
#ifndef RS_EXECUTOR_H
#define RS_EXECUTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/diag.h"
#include "planner/plan.h"
#include "planner/source.h"

typedef struct rs_exec_job rs_exec_job;
typedef void (*rs_exec_done)(rs_exec_job *job, int status);

/* A slice of one op: rows [row, row+rows) or, for a single-row op, bytes
 * [byte, byte+bytes) of it.  Executors cut jobs into pieces to spread them
 * over threads. */
typedef struct {
	uint32_t op;
	uint64_t row, rows;
	uint64_t byte, bytes;
} rs_exec_piece;

struct rs_exec_job {
	const rs_copy_op *ops;
	size_t nops;
	uint8_t *dst;
	uint64_t size;
	bool zero_fill;
	rs_sources *sources;
	rs_exec_done done;
	void *arg;

	/* Executor-private from here on. */
	rs_exec_piece *pieces;
	size_t npieces;
	_Atomic size_t next_piece;
	_Atomic size_t finished;
	_Atomic int status;
	rs_exec_job *queue_next;
};

typedef enum {
	RS_EXECUTOR_CPU = 0,
} rs_executor_kind;

typedef struct rs_executor rs_executor;

/* Creates an executor with `threads` workers (0: one per CPU). */
int rs_executor_create(rs_executor **out, rs_executor_kind kind,
		       unsigned threads, rs_diag *d);
void rs_executor_destroy(rs_executor *ex);

const char *rs_executor_name(const rs_executor *ex);

/* Starts a job; `done` reports its end.  Returns -errno if it could not be
 * started (then `done` is not called). */
int rs_executor_submit(rs_executor *ex, rs_exec_job *job);

/* Runs a job to completion, letting the calling thread work on it too.
 * Returns the job's status.  job->done and job->arg are used internally. */
int rs_executor_run(rs_executor *ex, rs_exec_job *job);

/* --- for backends --- */

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

#endif
