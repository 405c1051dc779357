/* executor: runs a batch of copy ops (planner/plan.h) into a buffer.
 *
 * One interface, several backends behind a table of function pointers
 * (gpu/backend.h, what backends implement): the CPU thread pool is always
 * built; a CUDA executor plugs in where the toolkit is found.  All #ifdefs
 * choosing a backend live in executor.c.  This header is what callers
 * use.
 *
 * A job names its ops, the destination buffer and the source table.  It
 * completes asynchronously: `done(job, status)` is called exactly once, on
 * some executor thread, with 0 or a negative errno:
 *   -EIO     a source read failed or came back short (never zeros);
 *   -ESTALE  a source file no longer matches its recorded identity.
 * Destination bytes no op writes are zeroed when `zero_fill` is set.
 * The job and its buffers must stay valid until `done` has been called.
 *
 * Casts.  When `from` and `to` differ (both floating-point types,
 * rs_cast_supported), the ops describe the destination as if it held
 * `from` elements - the plan of a view is made in the source's dtype - and
 * every element is converted on the way: a row of `len` bytes at dst_off
 * lands as len/size(from) elements of `to` at dst_off/size(from)*size(to).
 * `size` is then the converted destination's byte size.  Leave both 0
 * (RS_DTYPE_INVALID) to copy bytes as they are.
 */
#ifndef RS_EXECUTOR_H
#define RS_EXECUTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/diag.h"
#include "planner/dtype.h"
#include "planner/plan.h"
#include "planner/source.h"

/* Kinds of work, as the AUTO policy tells them apart. */
typedef enum {
	RS_WORK_RUNS = 0,           /* contiguous runs, no cast */
	RS_WORK_STRIDED,            /* strided rows, no cast */
	RS_WORK_CAST,               /* any job that converts elements */
	RS_WORK_KINDS
} rs_work_kind;

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
	rs_dtype from, to;      /* a cast, or both RS_DTYPE_INVALID */
	rs_exec_done done;
	void *arg;

	/* Executor-private from here on. */
	rs_exec_piece *pieces;
	size_t npieces;
	_Atomic size_t next_piece;
	_Atomic size_t finished;
	_Atomic int status;
	rs_exec_job *queue_next;
	/* The dispatcher's (executor.c): the caller's completion, and what
	 * ran the job since when, for stats and the AUTO policy. */
	rs_exec_done user_done;
	void *user_arg;
	uint64_t start_ns;
	_Atomic int backend;
	rs_work_kind kind;
};

/* Which backend runs jobs.  AUTO: the CPU, plus CUDA (when a device is
 * usable) for the kinds of work it measured faster at, never for plain
 * contiguous copies.  CPU: only the CPU.  CUDA: every job on the device;
 * creating it fails (-ENODEV, one diag line) when no device is usable. */
typedef enum {
	RS_EXECUTOR_AUTO = 0,
	RS_EXECUTOR_CPU,
	RS_EXECUTOR_CUDA,
} rs_executor_kind;

#define RS_MAX_GPUS 16
/* The most CPU build threads -o threads= asks for. */
#define RS_MAX_THREADS 1024

typedef struct {
	rs_executor_kind kind;
	unsigned threads;           /* CPU workers; 0: one per CPU */
	unsigned ngpus;             /* 0: every visible device */
	int gpus[RS_MAX_GPUS];      /* device ordinals (-o gpus=0,1) */
	uint64_t gpu_mem;           /* device bytes per GPU; 0: default */
	/* Told, once, when the device fails and the CPU takes over (may be
	 * NULL); called on an executor thread. */
	void (*log)(const char *line);
} rs_executor_opts;

typedef struct {
	uint64_t jobs, bytes, ns;   /* bytes: destination bytes built */
} rs_backend_stats;

typedef struct {
	const char *mode;           /* "auto", "cpu" or "cuda" */
	bool cuda_built, cuda_usable;
	rs_backend_stats cpu, cuda;
	const char *choice[RS_WORK_KINDS];   /* "cpu" or "cuda", per kind */
	uint64_t cuda_fallbacks;    /* jobs the device refused or failed,
				     * run on the CPU instead */
	char cuda_status[256];      /* "ready", "not used", why not usable */
	/* Host<->device copies of the CUDA executor (ns summed over its
	 * lanes, so overlapping lanes count twice). */
	uint64_t h2d_bytes, h2d_ns, d2h_bytes, d2h_ns;
} rs_executor_stats;

typedef struct rs_executor rs_executor;

/* Creates an executor.  -ENODEV (with a line in d) when kind is CUDA and
 * no device is usable; under AUTO a missing device is logged through d as
 * a note and the CPU is used. */
int rs_executor_create(rs_executor **out, const rs_executor_opts *o,
		       rs_diag *d);
void rs_executor_destroy(rs_executor *ex);

/* Checks, before the daemon forks, that rs_executor_create will succeed:
 * for CUDA, creates the executor in a child process and reports its
 * refusal line to d (-ENODEV), so the parent never initialises CUDA (a
 * CUDA context does not survive fork) yet a mount with executor=cuda and
 * no usable device fails at once.  0 for the other kinds. */
int rs_executor_probe(const rs_executor_opts *o, rs_diag *d);

/* "cpu", "cuda" or "auto". */
const char *rs_executor_name(const rs_executor *ex);

/* The backends this build has: "cpu" or "cpu cuda". */
const char *rs_executor_backends(void);

/* Whether the device is in use, or why not (for the startup log line). */
const char *rs_executor_cuda_status(rs_executor *ex);

/* Starts a job; `done` reports its end.  Returns -errno if it could not be
 * started (then `done` is not called). */
int rs_executor_submit(rs_executor *ex, rs_exec_job *job);

/* Runs a job to completion, letting the calling thread work on it too.
 * Returns the job's status.  job->done and job->arg are used internally. */
int rs_executor_run(rs_executor *ex, rs_exec_job *job);

void rs_executor_get_stats(rs_executor *ex, rs_executor_stats *out);

/* The kind of work a job is. */
rs_work_kind rs_exec_job_kind(const rs_exec_job *job);

#endif
