/* CUDA executor: staging lanes on each device, one worker thread per lane.
 *
 * A job alternates between the CPU (reading its source rows into pinned
 * memory) and the device (H2D, zero fill, gather or cast, D2H).  Each lane
 * runs one job at a time, start to end; two lanes per device let one read
 * while the other's bytes cross the link, so the disk or page cache and
 * PCIe are busy at once.  Jobs wait in one queue for the whole executor
 * and whichever lane is free takes the next: blocks spread over devices by
 * load, with no scheduler to keep.
 *
 * Sizes, per lane.  The daemon builds 4 MiB blocks (fs/blocks.h), so:
 *  - result 4 MiB: one block in any dtype;
 *  - stage 8 MiB: the source of any plain block (at most the block), and
 *    of a block narrowed 2x (f32 state shown as bf16 or f16, the dtype
 *    views of README.md).  Narrowing by more (f32 to fp8, f64 to
 *    16 bits) needs 16 MiB or more of source per block; those jobs get
 *    -E2BIG and the dispatcher runs them on the CPU;
 *  - tables 1 MiB: ops, stage offsets and pieces, about 12K ops.
 * That is 13 MiB of device memory and 13 MiB of pinned host memory a lane,
 * 26 MiB of each a device with the default two lanes.  Pinned memory is
 * host RAM outside the cache's budget, so lanes stay few and fixed; gpu_mem
 * (default 256 MiB) caps what is taken on each device: one lane when it
 * holds only one, -ENOMEM when it holds none.
 *
 * Submit checks a job before queueing it, so a lane never writes outside
 * its buffers: -E2BIG when it is larger than a lane, -EINVAL when a cast is
 * not between floating-point types or its rows are not whole elements, or
 * an op writes past job->size.
 *
 * Failures.  A source that cannot be read ends the job with the read's
 * error (-EIO, -ESTALE), as on the CPU.  Any CUDA error ends it with
 * -ENODEV and retires the device: its lanes stop, its first error is kept
 * for rs_cuda_last_error, and once no device is left submit says -ENODEV
 * at once and jobs still queued end with -ENODEV, for the dispatcher to
 * rerun on the CPU.  Nothing is logged here.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gpu/cuda.h"
#include "gpu/backend.h"
#include "gpu/executor.h"
#include "gpu/mapped_copy.h"

#define LANES_PER_GPU 2
#define STAGE_BYTES (8ull << 20)
#define RESULT_BYTES (4ull << 20)
#define TABLE_BYTES (1ull << 20)
#define LANE_BYTES (STAGE_BYTES + RESULT_BYTES + TABLE_BYTES)
#define DEFAULT_GPU_MEM (256ull << 20)
/* Bytes of source one thread block moves: 8 MiB of stage makes 256 or
 * more blocks, enough to fill every SM of an H100/H200 (132). */
#define PIECE_BYTES (32u << 10)
/* Jobs without a cast and with at most this many ops are copied with one
 * cudaMemcpy2DAsync per op, without the table transfer a kernel needs. */
#define COPY2D_MAX_OPS 4
/* As in gpu/cpu.c: strided source rows shorter than this are gathered
 * through a mapping, longer ones with one pread each. */
#define MAPPED_ROW_MAX (4u << 10)
#define ERR_MAX 256

typedef struct cuda_exec cuda_exec;

typedef struct {
	int ordinal;
	char name[64];
	bool dead;                  /* under ex->lock */
	char err[ERR_MAX];          /* written once, before dead is set */
} cuda_dev;

typedef struct {
	cuda_exec *ex;
	cuda_dev *dev;
	pthread_t thread;
	bool started;
	cudaStream_t stream;
	cudaEvent_t ev[4];          /* H2D start/end, D2H start/end */
	uint8_t *h_stage, *h_result, *h_table;   /* pinned */
	uint8_t *d_stage, *d_result, *d_table;
	char err[ERR_MAX];          /* this lane's device failure */
} cuda_lane;

struct cuda_exec {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	rs_exec_job *head, *tail;   /* queued jobs, FIFO, under lock */
	unsigned usable;            /* devices not retired, under lock */
	bool stop;
	cuda_dev devs[RS_MAX_GPUS];
	unsigned ndevs;
	cuda_lane *lanes;
	unsigned nlanes;
	const char *_Atomic last_error;
	_Atomic uint64_t h2d_bytes, h2d_ns, d2h_bytes, d2h_ns;
};

/* What a job needs, worked out from its ops alone. */
typedef struct {
	bool cast;
	uint32_t sf, st;            /* element sizes (1 and 1 without a cast) */
	size_t live_ops;            /* ops that copy at least one byte */
	bool rows_apart;            /* no op's rows overlap (as planned) */
	uint64_t stage;             /* stage bytes, ops at RS_CUDA_ALIGN */
	uint64_t covered;           /* result bytes the ops write */
	uint64_t npieces;
	uint64_t off_stage_off, off_pieces, table;   /* table layout */
} job_shape;

static uint64_t align_up(uint64_t v)
{
	return (v + RS_CUDA_ALIGN - 1) / RS_CUDA_ALIGN * RS_CUDA_ALIGN;
}

static uint64_t op_pieces(const rs_copy_op *op)
{
	if (op->len >= PIECE_BYTES)
		return op->count * ((op->len + PIECE_BYTES - 1) / PIECE_BYTES);
	uint64_t per = PIECE_BYTES / op->len;

	return (op->count + per - 1) / per;
}

/* 0, -EINVAL (a cast the kernels cannot do, or an op writing past the
 * destination) or -E2BIG (larger than a lane).  Checked in submit, so a
 * worker never sees a job that would write outside its buffers. */
static int job_shape_of(const rs_exec_job *job, job_shape *sh)
{
	memset(sh, 0, sizeof(*sh));
	sh->sf = sh->st = 1;
	sh->rows_apart = true;
	if (job->from != job->to) {
		if (!rs_dtype_is_float(job->from) || !rs_dtype_is_float(job->to))
			return -EINVAL;
		sh->cast = true;
		sh->sf = rs_dtype_size(job->from);
		sh->st = rs_dtype_size(job->to);
	}
	if (job->size > RESULT_BYTES ||
	    job->nops > TABLE_BYTES / (sizeof(rs_copy_op) + sizeof(uint64_t)))
		return -E2BIG;
	for (size_t i = 0; i < job->nops; i++) {
		const rs_copy_op *op = &job->ops[i];
		uint64_t bytes, end;

		if (op->len == 0 || op->count == 0)
			continue;
		if (op->len > STAGE_BYTES || op->count > STAGE_BYTES / op->len)
			return -E2BIG;
		bytes = op->len * op->count;
		if (sh->cast && (op->len % sh->sf || op->dst_off % sh->sf ||
				 (op->count > 1 && op->dst_stride % sh->sf)))
			return -EINVAL;
		/* The last row must end inside the destination. */
		if (op->count > 1 &&
		    op->dst_stride > (UINT64_MAX - op->len) / (op->count - 1))
			return -EINVAL;
		end = (op->count - 1) * op->dst_stride + op->len;
		if (op->dst_off > UINT64_MAX - end ||
		    (op->dst_off + end) / sh->sf * sh->st > job->size)
			return -EINVAL;
		sh->stage = align_up(sh->stage) + bytes;
		if (sh->stage > STAGE_BYTES)
			return -E2BIG;
		if (op->count > 1 && op->dst_stride < op->len)
			sh->rows_apart = false;
		sh->covered += bytes / sh->sf * sh->st;
		sh->npieces += op_pieces(op);
		sh->live_ops++;
	}
	sh->off_stage_off = align_up(job->nops * sizeof(rs_copy_op));
	sh->off_pieces = align_up(sh->off_stage_off + job->nops * sizeof(uint64_t));
	if (sh->npieces > (TABLE_BYTES - sh->off_pieces) / sizeof(rs_cuda_piece))
		return -E2BIG;
	sh->table = sh->off_pieces + sh->npieces * sizeof(rs_cuda_piece);
	return 0;
}

/* Fills the lane's pinned table: the ops as they are, each op's stage
 * offset, and the pieces. */
static void build_table(cuda_lane *l, const rs_exec_job *job,
			const job_shape *sh)
{
	uint64_t *stage_off = (uint64_t *)(l->h_table + sh->off_stage_off);
	rs_cuda_piece *pc = (rs_cuda_piece *)(l->h_table + sh->off_pieces);
	uint64_t at = 0;

	memcpy(l->h_table, job->ops, job->nops * sizeof(rs_copy_op));
	for (size_t i = 0; i < job->nops; i++) {
		const rs_copy_op *op = &job->ops[i];

		stage_off[i] = at;
		if (op->len == 0 || op->count == 0)
			continue;
		at = align_up(at + op->len * op->count);
		if (op->len >= PIECE_BYTES) {
			for (uint64_t r = 0; r < op->count; r++)
				for (uint64_t b = 0; b < op->len; b += PIECE_BYTES)
					*pc++ = (rs_cuda_piece){
						(uint32_t)i, (uint32_t)r, 1, (uint32_t)b,
						(uint32_t)(op->len - b < PIECE_BYTES
							   ? op->len - b : PIECE_BYTES) };
			continue;
		}
		uint64_t per = PIECE_BYTES / op->len;

		for (uint64_t r = 0; r < op->count; r += per)
			*pc++ = (rs_cuda_piece){
				(uint32_t)i, (uint32_t)r,
				(uint32_t)(op->count - r < per ? op->count - r : per),
				0, (uint32_t)op->len };
	}
}

/* Source rows strided in the file, packed in the stage: short rows through
 * a mapping, the rest (or all, where mapping is unavailable) one pread
 * each.  (preadv cannot skip the bytes between rows.) */
static int read_rows_strided(int fd, uint8_t *dst, const rs_copy_op *op)
{
	int err = -ENOTSUP;

	if (op->len < MAPPED_ROW_MAX)
		err = rs_mapped_gather(fd, dst, op->len, op->src_off,
				       op->src_stride, op->len, op->count);
	if (err != -ENOTSUP && err != -ENOMEM && err != -ENODEV)
		return err;
	err = 0;
	for (uint64_t r = 0; r < op->count && !err; r++)
		err = rs_pread_full(fd, dst + r * op->len, op->len,
				    op->src_off + r * op->src_stride);
	return err;
}

static int read_sources(cuda_lane *l, const rs_exec_job *job,
			const job_shape *sh)
{
	const uint64_t *stage_off = (const uint64_t *)(l->h_table +
						       sh->off_stage_off);

	for (size_t i = 0; i < job->nops; i++) {
		const rs_copy_op *op = &job->ops[i];
		uint8_t *dst = l->h_stage + stage_off[i];
		int fd, err;

		if (op->len == 0 || op->count == 0)
			continue;
		err = rs_sources_fd(job->sources, op->source, &fd);
		if (!err && (op->count == 1 || op->src_stride == op->len))
			err = rs_pread_full(fd, dst, op->len * op->count, op->src_off);
		else if (!err)
			err = read_rows_strided(fd, dst, op);
		if (err)    /* -ENODEV from a job means the device failed */
			return err == -ENODEV ? -EIO : err;
		rs_sources_count_read(job->sources, op->len * op->count);
	}
	return 0;
}

/* Records a failed CUDA call in the lane; the job then ends with -ENODEV. */
static bool cuda_ok(cuda_lane *l, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return true;
	snprintf(l->err, sizeof(l->err), "cuda device %d (%s): %s: %s",
		 l->dev->ordinal, l->dev->name, what, cudaGetErrorString(e));
	return false;
}

static uint64_t elapsed_ns(cuda_lane *l, cudaEvent_t a, cudaEvent_t b,
			   bool *ok)
{
	float ms = 0;

	if (*ok)
		*ok = cuda_ok(l, cudaEventElapsedTime(&ms, a, b),
			      "cudaEventElapsedTime");
	return ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
}

/* The device part of a job, from the filled pinned stage to the pinned
 * result.  False (l->err says why) on any CUDA error. */
static bool device_run(cuda_lane *l, const rs_exec_job *job,
		       const job_shape *sh)
{
	cuda_exec *ex = l->ex;
	cudaStream_t s = l->stream;
	/* cudaMemcpy2D refuses a pitch below the width: overlapping rows
	 * (which plans never have) go through the kernel. */
	bool copy2d = !sh->cast && sh->live_ops <= COPY2D_MAX_OPS &&
		      sh->rows_apart;
	uint64_t h2d = sh->stage + (copy2d ? 0 : sh->table), h2d_ns, d2h_ns;
	bool ok;

	ok = cuda_ok(l, cudaEventRecord(l->ev[0], s), "cudaEventRecord") &&
	     cuda_ok(l, cudaMemcpyAsync(l->d_stage, l->h_stage, sh->stage,
					cudaMemcpyHostToDevice, s),
		     "cudaMemcpyAsync (stage)") &&
	     (copy2d ||
	      cuda_ok(l, cudaMemcpyAsync(l->d_table, l->h_table, sh->table,
					 cudaMemcpyHostToDevice, s),
		      "cudaMemcpyAsync (tables)")) &&
	     cuda_ok(l, cudaEventRecord(l->ev[1], s), "cudaEventRecord");
	if (ok && job->zero_fill && sh->covered < job->size)
		ok = cuda_ok(l, cudaMemsetAsync(l->d_result, 0, job->size, s),
			     "cudaMemsetAsync");
	if (ok && copy2d) {
		const uint64_t *stage_off =
			(const uint64_t *)(l->h_table + sh->off_stage_off);

		for (size_t i = 0; i < job->nops && ok; i++) {
			const rs_copy_op *op = &job->ops[i];

			if (op->len == 0 || op->count == 0)
				continue;
			if (op->count == 1)
				ok = cuda_ok(l, cudaMemcpyAsync(
						     l->d_result + op->dst_off,
						     l->d_stage + stage_off[i],
						     op->len,
						     cudaMemcpyDeviceToDevice, s),
					     "cudaMemcpyAsync (run)");
			else
				ok = cuda_ok(l, cudaMemcpy2DAsync(
						     l->d_result + op->dst_off,
						     op->dst_stride,
						     l->d_stage + stage_off[i],
						     op->len, op->len, op->count,
						     cudaMemcpyDeviceToDevice, s),
					     "cudaMemcpy2DAsync");
		}
	} else if (ok) {
		rs_cuda_gather_args a = {
			.ops = (const rs_copy_op *)l->d_table,
			.stage_off = (const uint64_t *)(l->d_table + sh->off_stage_off),
			.pieces = (const rs_cuda_piece *)(l->d_table + sh->off_pieces),
			.npieces = (uint32_t)sh->npieces,
			.stage = l->d_stage,
			.result = l->d_result,
			.from = sh->cast ? job->from : RS_DTYPE_INVALID,
			.to = sh->cast ? job->to : RS_DTYPE_INVALID,
			.from_size = sh->sf,
			.to_size = sh->st,
		};

		ok = cuda_ok(l, rs_cuda_launch_gather(s, &a), "kernel launch");
	}
	ok = ok &&
	     cuda_ok(l, cudaEventRecord(l->ev[2], s), "cudaEventRecord") &&
	     cuda_ok(l, cudaMemcpyAsync(l->h_result, l->d_result, job->size,
					cudaMemcpyDeviceToHost, s),
		     "cudaMemcpyAsync (result)") &&
	     cuda_ok(l, cudaEventRecord(l->ev[3], s), "cudaEventRecord") &&
	     cuda_ok(l, cudaStreamSynchronize(s), "cudaStreamSynchronize");
	h2d_ns = elapsed_ns(l, l->ev[0], l->ev[1], &ok);
	d2h_ns = elapsed_ns(l, l->ev[2], l->ev[3], &ok);
	if (!ok)
		return false;
	atomic_fetch_add(&ex->h2d_bytes, h2d);
	atomic_fetch_add(&ex->h2d_ns, h2d_ns);
	atomic_fetch_add(&ex->d2h_bytes, job->size);
	atomic_fetch_add(&ex->d2h_ns, d2h_ns);
	return true;
}

/* From the pinned result into the job's buffer.  Without zero fill, bytes
 * no op writes are left as the caller had them, as on the CPU. */
static void copy_out(cuda_lane *l, rs_exec_job *job, const job_shape *sh)
{
	if (job->zero_fill || sh->covered == job->size) {
		memcpy(job->dst, l->h_result, job->size);
		return;
	}
	for (size_t i = 0; i < job->nops; i++) {
		const rs_copy_op *op = &job->ops[i];
		uint64_t row = op->len / sh->sf * sh->st;

		for (uint64_t r = 0; r < op->count && op->len; r++) {
			uint64_t at = (op->dst_off + r * op->dst_stride) / sh->sf *
				      sh->st;

			memcpy(job->dst + at, l->h_result + at, row);
		}
	}
}

/* Runs one job on the lane: 0 or the source's error; -ENODEV with
 * *dev_failed set when the device failed. */
static int run_job(cuda_lane *l, rs_exec_job *job, bool *dev_failed)
{
	job_shape sh;
	int err = job_shape_of(job, &sh);   /* checked by submit already */

	*dev_failed = false;
	if (err)
		return err;
	build_table(l, job, &sh);
	err = read_sources(l, job, &sh);
	if (err)
		return err;
	if (!device_run(l, job, &sh)) {
		*dev_failed = true;
		return -ENODEV;
	}
	copy_out(l, job, &sh);
	return 0;
}

/* Retires the lane's device; when it was the last one, ends every queued
 * job with -ENODEV. */
static void device_failed(cuda_lane *l)
{
	cuda_exec *ex = l->ex;
	rs_exec_job *orphans = NULL;

	pthread_mutex_lock(&ex->lock);
	if (!l->dev->dead) {
		memcpy(l->dev->err, l->err, sizeof(l->dev->err));
		l->dev->dead = true;
		ex->usable--;
		atomic_store(&ex->last_error, (const char *)l->dev->err);
		if (ex->usable == 0) {
			orphans = ex->head;
			ex->head = ex->tail = NULL;
		}
		pthread_cond_broadcast(&ex->cond);
	}
	pthread_mutex_unlock(&ex->lock);
	while (orphans) {
		rs_exec_job *job = orphans;

		orphans = job->queue_next;
		job->done(job, -ENODEV);
	}
}

static void *lane_main(void *arg)
{
	cuda_lane *l = arg;
	cuda_exec *ex = l->ex;

	if (!cuda_ok(l, cudaSetDevice(l->dev->ordinal), "cudaSetDevice")) {
		device_failed(l);
		return NULL;
	}
	pthread_mutex_lock(&ex->lock);
	for (;;) {
		rs_exec_job *job;
		bool dev_failed;
		int status;

		while (!ex->stop && !l->dev->dead && !ex->head)
			pthread_cond_wait(&ex->cond, &ex->lock);
		if (ex->stop || l->dev->dead)
			break;
		job = ex->head;
		ex->head = job->queue_next;
		if (!ex->head)
			ex->tail = NULL;
		pthread_mutex_unlock(&ex->lock);
		status = run_job(l, job, &dev_failed);
		/* Retire the device before reporting, so the dispatcher's
		 * next submit already sees it gone. */
		if (dev_failed)
			device_failed(l);
		job->done(job, status);
		pthread_mutex_lock(&ex->lock);
	}
	pthread_mutex_unlock(&ex->lock);
	return NULL;
}

static int cuda_submit(void *impl, rs_exec_job *job)
{
	cuda_exec *ex = impl;
	job_shape sh;
	int err = job_shape_of(job, &sh);

	if (err)
		return err;
	pthread_mutex_lock(&ex->lock);
	if (ex->usable == 0) {
		pthread_mutex_unlock(&ex->lock);
		return -ENODEV;
	}
	if (sh.live_ops == 0) {
		/* Nothing to read: no trip to the device. */
		pthread_mutex_unlock(&ex->lock);
		if (job->zero_fill)
			memset(job->dst, 0, job->size);
		job->done(job, 0);
		return 0;
	}
	job->queue_next = NULL;
	if (ex->tail)
		ex->tail->queue_next = job;
	else
		ex->head = job;
	ex->tail = job;
	pthread_cond_signal(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
	return 0;
}

/* Frees a lane's CUDA resources (any subset of them).  Errors are ignored:
 * on a device that failed every call may fail, and what can be freed still
 * is. */
static void lane_free(cuda_lane *l)
{
	(void)cudaSetDevice(l->dev->ordinal);
	if (l->stream) {
		(void)cudaStreamSynchronize(l->stream);
		(void)cudaStreamDestroy(l->stream);
	}
	for (int i = 0; i < 4; i++)
		if (l->ev[i])
			(void)cudaEventDestroy(l->ev[i]);
	if (l->d_stage)
		(void)cudaFree(l->d_stage);
	if (l->d_result)
		(void)cudaFree(l->d_result);
	if (l->d_table)
		(void)cudaFree(l->d_table);
	if (l->h_stage)
		(void)cudaFreeHost(l->h_stage);
	if (l->h_result)
		(void)cudaFreeHost(l->h_result);
	if (l->h_table)
		(void)cudaFreeHost(l->h_table);
	(void)cudaGetLastError();
}

static void cuda_destroy(void *impl)
{
	cuda_exec *ex = impl;
	rs_exec_job *left;
	int prev = -1;

	pthread_mutex_lock(&ex->lock);
	ex->stop = true;
	left = ex->head;
	ex->head = ex->tail = NULL;
	pthread_cond_broadcast(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
	for (unsigned i = 0; i < ex->nlanes; i++)
		if (ex->lanes[i].started)
			pthread_join(ex->lanes[i].thread, NULL);
	while (left) {
		rs_exec_job *job = left;

		left = job->queue_next;
		job->done(job, -ECANCELED);
	}
	if (cudaGetDevice(&prev) != cudaSuccess)
		prev = -1;
	for (unsigned i = 0; i < ex->nlanes; i++)
		lane_free(&ex->lanes[i]);
	if (prev >= 0)
		(void)cudaSetDevice(prev);
	(void)cudaGetLastError();
	free(ex->lanes);
	pthread_cond_destroy(&ex->cond);
	pthread_mutex_destroy(&ex->lock);
	free(ex);
}

/* One allocation or setup step of create: -ENOMEM for memory, -ENODEV for
 * anything else, with one line in d. */
static int setup_ok(cudaError_t e, const cuda_dev *dev, const char *what,
		    uint64_t bytes, rs_diag *d)
{
	if (e == cudaSuccess)
		return 0;
	(void)cudaGetLastError();
	if (e == cudaErrorMemoryAllocation) {
		rs_diag_add(d, "cuda device %d (%s): %s of %llu bytes: %s",
			    dev->ordinal, dev->name, what,
			    (unsigned long long)bytes, cudaGetErrorString(e));
		return -ENOMEM;
	}
	rs_diag_add(d, "cuda device %d (%s): %s: %s", dev->ordinal, dev->name,
		    what, cudaGetErrorString(e));
	return -ENODEV;
}

static int lane_init(cuda_lane *l, rs_diag *d)
{
	int err;

	if ((err = setup_ok(cudaStreamCreateWithFlags(&l->stream,
						      cudaStreamNonBlocking),
			    l->dev, "cudaStreamCreate", 0, d)))
		return err;
	for (int i = 0; i < 4; i++)
		if ((err = setup_ok(cudaEventCreate(&l->ev[i]), l->dev,
				    "cudaEventCreate", 0, d)))
			return err;
	if ((err = setup_ok(cudaMalloc((void **)&l->d_stage, STAGE_BYTES),
			    l->dev, "cudaMalloc (stage)", STAGE_BYTES, d)) ||
	    (err = setup_ok(cudaMalloc((void **)&l->d_result, RESULT_BYTES),
			    l->dev, "cudaMalloc (result)", RESULT_BYTES, d)) ||
	    (err = setup_ok(cudaMalloc((void **)&l->d_table, TABLE_BYTES),
			    l->dev, "cudaMalloc (tables)", TABLE_BYTES, d)) ||
	    (err = setup_ok(cudaHostAlloc((void **)&l->h_stage, STAGE_BYTES,
					  cudaHostAllocPortable),
			    l->dev, "cudaHostAlloc (stage)", STAGE_BYTES, d)) ||
	    (err = setup_ok(cudaHostAlloc((void **)&l->h_result, RESULT_BYTES,
					  cudaHostAllocPortable),
			    l->dev, "cudaHostAlloc (result)", RESULT_BYTES, d)) ||
	    (err = setup_ok(cudaHostAlloc((void **)&l->h_table, TABLE_BYTES,
					  cudaHostAllocPortable),
			    l->dev, "cudaHostAlloc (tables)", TABLE_BYTES, d)))
		return err;
	return 0;
}

/* Makes `dev` current and checks it can run the kernels. */
static int device_init(cuda_dev *dev, rs_diag *d)
{
	struct cudaDeviceProp prop;
	cudaError_t e;
	int err;

	snprintf(dev->name, sizeof(dev->name), "?");
	if ((err = setup_ok(cudaSetDevice(dev->ordinal), dev, "cudaSetDevice",
			    0, d)))
		return err;
	if ((err = setup_ok(cudaGetDeviceProperties(&prop, dev->ordinal), dev,
			    "cudaGetDeviceProperties", 0, d)))
		return err;
	snprintf(dev->name, sizeof(dev->name), "%.63s", prop.name);
	/* Sleep in cudaStreamSynchronize rather than spin: the lanes' CPU
	 * time is better spent on source reads.  Refused (and harmless) when
	 * the device's context is already active with other flags. */
	e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
	if (e != cudaSuccess)
		(void)cudaGetLastError();
	e = rs_cuda_check_kernels();
	if (e != cudaSuccess) {
		rs_diag_add(d, "cuda device %d (%s, compute capability %d.%d): "
			    "no kernel of this build runs on it (%s); rebuild "
			    "with CMAKE_CUDA_ARCHITECTURES=%d%d",
			    dev->ordinal, dev->name, prop.major, prop.minor,
			    cudaGetErrorString(e), prop.major, prop.minor);
		return -ENODEV;
	}
	return 0;
}

/* Why cudaGetDeviceCount found no device (e: its error, or cudaSuccess
 * with a count of 0).  The runtime says cudaErrorInsufficientDriver both
 * when the driver is older than it and when there is no driver at all;
 * cudaDriverGetVersion tells them apart (0: no driver). */
static void no_device(cudaError_t e, rs_diag *d)
{
	const char *visible = getenv("CUDA_VISIBLE_DEVICES");
	int driver = 0, runtime = 0;

	if (e == cudaErrorInsufficientDriver &&
	    cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
		(void)cudaRuntimeGetVersion(&runtime);
		rs_diag_add(d, "cuda: no usable device: %s (the driver supports "
			    "CUDA %d.%d, this reshardfs needs %d.%d)",
			    cudaGetErrorString(e), driver / 1000,
			    driver % 1000 / 10, runtime / 1000,
			    runtime % 1000 / 10);
	} else if (e == cudaSuccess || e == cudaErrorNoDevice ||
		   e == cudaErrorInsufficientDriver) {
		rs_diag_add(d, "cuda: no usable device: no NVIDIA driver or GPU "
			    "found%s%s%s", visible ? " (CUDA_VISIBLE_DEVICES=" : "",
			    visible ? visible : "", visible ? ")" : "");
	} else {
		rs_diag_add(d, "cuda: no usable device: %s",
			    cudaGetErrorString(e));
	}
	(void)cudaGetLastError();
}

static const rs_executor_ops cuda_ops = {
	.name = "cuda",
	.submit = cuda_submit,
	.help = NULL,
	.destroy = cuda_destroy,
};

int rs_cuda_executor_create(void **impl, const rs_executor_ops **ops,
			    const rs_executor_opts *o, rs_diag *d)
{
	uint64_t budget = o && o->gpu_mem ? o->gpu_mem : DEFAULT_GPU_MEM;
	unsigned ngpus = o ? o->ngpus : 0, lanes;
	int count = 0, prev = -1, err = 0;
	cudaError_t e;
	cuda_exec *ex;

	if (ngpus > RS_MAX_GPUS) {
		rs_diag_add(d, "cuda: gpus lists %u devices, at most %d", ngpus,
			    RS_MAX_GPUS);
		return -EINVAL;
	}
	for (unsigned i = 0; i < ngpus; i++) {
		if (o->gpus[i] < 0) {
			rs_diag_add(d, "cuda: gpus=%d: not a device ordinal",
				    o->gpus[i]);
			return -EINVAL;
		}
		for (unsigned j = 0; j < i; j++)
			if (o->gpus[j] == o->gpus[i]) {
				rs_diag_add(d, "cuda: gpus lists device %d twice",
					    o->gpus[i]);
				return -EINVAL;
			}
	}
	/* Linked statically, the runtime answers this without a driver too
	 * (an error), so a machine without one lands here. */
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count <= 0) {
		no_device(e, d);        /* clears the error too */
		return -ENODEV;
	}
	for (unsigned i = 0; i < ngpus; i++)
		if (o->gpus[i] >= count) {
			rs_diag_add(d, "cuda: gpus=%d: no such device (%d visible)",
				    o->gpus[i], count);
			return -ENODEV;
		}
	if (budget < LANE_BYTES) {
		rs_diag_add(d, "cuda: gpu_mem=%llu bytes cannot hold one staging "
			    "lane (%llu bytes of device memory)",
			    (unsigned long long)budget,
			    (unsigned long long)LANE_BYTES);
		return -ENOMEM;
	}
	lanes = budget / LANE_BYTES < LANES_PER_GPU
		? (unsigned)(budget / LANE_BYTES) : LANES_PER_GPU;

	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return -ENOMEM;
	pthread_mutex_init(&ex->lock, NULL);
	pthread_cond_init(&ex->cond, NULL);
	ex->ndevs = ngpus ? ngpus
			  : (count < RS_MAX_GPUS ? (unsigned)count : RS_MAX_GPUS);
	for (unsigned i = 0; i < ex->ndevs; i++)
		ex->devs[i].ordinal = ngpus ? o->gpus[i] : (int)i;
	ex->lanes = calloc((size_t)ex->ndevs * lanes, sizeof(cuda_lane));
	if (!ex->lanes) {
		cuda_destroy(ex);
		return -ENOMEM;
	}
	(void)cudaGetDevice(&prev);
	for (unsigned i = 0; i < ex->ndevs && !err; i++) {
		err = device_init(&ex->devs[i], d);
		for (unsigned k = 0; k < lanes && !err; k++) {
			cuda_lane *l = &ex->lanes[ex->nlanes++];

			l->ex = ex;
			l->dev = &ex->devs[i];
			err = lane_init(l, d);
		}
	}
	ex->usable = ex->ndevs;
	for (unsigned i = 0; i < ex->nlanes && !err; i++) {
		cuda_lane *l = &ex->lanes[i];

		if (pthread_create(&l->thread, NULL, lane_main, l) != 0) {
			rs_diag_add(d, "cuda: cannot start a lane thread");
			err = -EAGAIN;
			break;
		}
		l->started = true;
	}
	if (prev >= 0)
		(void)cudaSetDevice(prev);
	if (err) {
		cuda_destroy(ex);
		return err;
	}
	*impl = ex;
	*ops = &cuda_ops;
	return 0;
}

const char *rs_cuda_last_error(void *impl)
{
	cuda_exec *ex = impl;

	return atomic_load(&ex->last_error);
}

void rs_cuda_transfer_stats(void *impl, uint64_t *h2d_bytes, uint64_t *h2d_ns,
			    uint64_t *d2h_bytes, uint64_t *d2h_ns)
{
	cuda_exec *ex = impl;

	if (h2d_bytes)
		*h2d_bytes = atomic_load(&ex->h2d_bytes);
	if (h2d_ns)
		*h2d_ns = atomic_load(&ex->h2d_ns);
	if (d2h_bytes)
		*d2h_bytes = atomic_load(&ex->d2h_bytes);
	if (d2h_ns)
		*d2h_ns = atomic_load(&ex->d2h_ns);
}
