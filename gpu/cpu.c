/* CPU executor: a thread pool of pread/preadv workers.
 *
 * Jobs are cut into pieces of at most 1 MiB so one block is built by every
 * worker (and the asking thread) at once.  Pieces are claimed under one
 * lock; a job leaves the queue when its last piece is claimed, so the queue
 * never points at a job that may already be finished and freed.
 *
 * A cast job (job->from != job->to) gathers each piece's source rows into
 * a per-thread scratch buffer with the same reads, then converts them
 * into place (gpu/cast.h): elements change size, so no read can land in
 * the destination directly.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gpu/cast.h"
#include "gpu/backend.h"
#include "gpu/executor.h"
#include "gpu/mapped_copy.h"

#define PIECE_BYTES (1u << 20)
#define MAX_IOV 1024
/* Strided source rows shorter than this are gathered through a mapping
 * (one memcpy per row) instead of one pread per row; longer rows amortise
 * the system call.  tests/bench/gather_bench measured, rows at a 4x stride
 * from the page cache: mapped/pread 8.2x at 256 B, 2.0x at 1 KiB, 0.96x at
 * 4 KiB, 0.64x at 16 KiB (BENCHMARKS.md, "strided gathers"). */
#define MAPPED_ROW_MAX (4u << 10)
/* A cast piece's source bytes go through this much scratch at a time:
 * all of a piece unless its rows are longer.  Element-aligned for every
 * type, as byte pieces of single-row ops are. */
#define SCRATCH_BYTES PIECE_BYTES
_Static_assert(PIECE_BYTES % 8 == 0, "byte pieces split elements");

typedef struct {
	pthread_t *threads;
	unsigned nthreads;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	rs_exec_job *queue;      /* jobs with unclaimed pieces, FIFO */
	bool stop;
} cpu_pool;

/* Rows contiguous in the source, scattered in the destination: one preadv
 * per MAX_IOV rows instead of a pread each. */
static int read_rows_scatter(int fd, uint8_t *dst, const rs_copy_op *op,
			     uint64_t row, uint64_t rows)
{
	struct iovec iov[MAX_IOV];

	while (rows) {
		uint64_t n = rows < MAX_IOV ? rows : MAX_IOV;
		uint64_t want = n * op->len, off = op->src_off + row * op->len;
		ssize_t got;

		for (uint64_t i = 0; i < n; i++) {
			iov[i].iov_base = dst + op->dst_off + (row + i) * op->dst_stride;
			iov[i].iov_len = op->len;
		}
		do
			got = preadv(fd, iov, (int)n, (off_t)off);
		while (got < 0 && errno == EINTR);
		if (got < 0)
			return -EIO;
		if ((uint64_t)got != want) {
			/* Finish a short vector read row by row. */
			for (uint64_t i = 0; i < n; i++) {
				uint64_t done_i = (uint64_t)got > i * op->len
					? (uint64_t)got - i * op->len : 0;

				if (done_i >= op->len)
					continue;
				int err = rs_pread_full(fd, (uint8_t *)iov[i].iov_base + done_i,
						    op->len - done_i,
						    off + i * op->len + done_i);
				if (err)
					return err;
			}
		}
		row += n;
		rows -= n;
	}
	return 0;
}

/* Rows strided in the source: short rows through a mapping, the rest (and
 * any row when mapping is unavailable) one pread each. */
static int read_rows_strided(int fd, uint8_t *dst, const rs_copy_op *op,
			     uint64_t row, uint64_t rows)
{
	int err = -ENOTSUP;

	if (op->len < MAPPED_ROW_MAX)
		err = rs_mapped_gather(fd, dst + op->dst_off + row * op->dst_stride,
				       op->dst_stride,
				       op->src_off + row * op->src_stride,
				       op->src_stride, op->len, rows);
	if (err != -ENOTSUP && err != -ENOMEM && err != -ENODEV)
		return err;
	err = 0;
	for (uint64_t r = row; r < row + rows && !err; r++)
		err = rs_pread_full(fd, dst + op->dst_off + r * op->dst_stride,
				op->len, op->src_off + r * op->src_stride);
	return err;
}

/* The calling thread's scratch for cast pieces, allocated on first use
 * and freed when the thread exits (workers, and any thread that helps
 * through rs_executor_run). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_err;

static void scratch_key_create(void)
{
	scratch_key_err = pthread_key_create(&scratch_key, free);
}

static uint8_t *thread_scratch(void)
{
	uint8_t *buf;

	pthread_once(&scratch_once, scratch_key_create);
	if (scratch_key_err)
		return NULL;
	buf = pthread_getspecific(scratch_key);
	if (!buf) {
		buf = malloc(SCRATCH_BYTES);
		if (buf && pthread_setspecific(scratch_key, buf) != 0) {
			free(buf);
			buf = NULL;
		}
	}
	return buf;
}

/* Where byte `off` of the destination as the ops describe it (holding
 * `from` elements) lands in the converted one. */
static uint8_t *cast_dst(const rs_exec_job *job, uint64_t off)
{
	return job->dst + off / rs_dtype_size(job->from) * rs_dtype_size(job->to);
}

/* Bytes [lo, hi) of rows [first, last) of op, in runs of the scratch's
 * size: a single-row op's piece, or rows longer than the scratch. */
static int cast_spans(rs_exec_job *job, const rs_copy_op *op, int fd,
		      uint8_t *scratch, uint64_t first, uint64_t last,
		      uint64_t lo, uint64_t hi)
{
	unsigned fsize = rs_dtype_size(job->from);
	int err = 0;

	for (uint64_t r = first; r < last && !err; r++)
		for (uint64_t b = lo; b < hi && !err; b += SCRATCH_BYTES) {
			uint64_t n = hi - b < SCRATCH_BYTES ? hi - b : SCRATCH_BYTES;

			err = rs_pread_full(fd, scratch, n,
					    op->src_off + r * op->src_stride + b);
			if (!err)
				rs_cast_run(job->to,
					    cast_dst(job, op->dst_off + r * op->dst_stride + b),
					    job->from, scratch, n / fsize);
		}
	return err;
}

/* Rows [row, row+rows) of op, each no longer than the scratch: gathered
 * into it packed with the uncast path's reads (a copy of op whose
 * destination is the scratch), then converted row by row, or in one run
 * when the destination rows are contiguous too.  A piece's rows fit the
 * scratch in one go, as pieces are cut to its size. */
static int cast_rows(rs_exec_job *job, const rs_copy_op *op, int fd,
		     uint8_t *scratch, uint64_t row, uint64_t rows)
{
	unsigned fsize = rs_dtype_size(job->from);
	uint64_t per = SCRATCH_BYTES / op->len;
	int err = 0;

	for (uint64_t r = row; r < row + rows && !err; r += per) {
		uint64_t n = row + rows - r < per ? row + rows - r : per;
		rs_copy_op packed = *op;

		packed.src_off = op->src_off + r * op->src_stride;
		packed.dst_off = 0;
		packed.dst_stride = op->len;
		packed.count = n;
		if (op->src_stride == op->len)
			err = read_rows_scatter(fd, scratch, &packed, 0, n);
		else
			err = read_rows_strided(fd, scratch, &packed, 0, n);
		if (err)
			break;
		if (op->dst_stride == op->len) {
			rs_cast_run(job->to, cast_dst(job, op->dst_off + r * op->len),
				    job->from, scratch, n * op->len / fsize);
			continue;
		}
		for (uint64_t i = 0; i < n; i++)
			rs_cast_run(job->to,
				    cast_dst(job, op->dst_off + (r + i) * op->dst_stride),
				    job->from, scratch + i * op->len, op->len / fsize);
	}
	return err;
}

/* A piece of a cast job: the reads of exec_piece, through scratch. */
static int exec_cast_piece(rs_exec_job *job, const rs_exec_piece *p, int fd)
{
	const rs_copy_op *op = &job->ops[p->op];
	uint8_t *scratch = thread_scratch();
	int err;

	if (!scratch)
		return -ENOMEM;
	if (op->count == 1)
		err = cast_spans(job, op, fd, scratch, 0, 1, p->byte,
				 p->byte + p->bytes);
	else if (op->len > SCRATCH_BYTES)
		err = cast_spans(job, op, fd, scratch, p->row, p->row + p->rows,
				 0, op->len);
	else
		err = cast_rows(job, op, fd, scratch, p->row, p->rows);
	if (!err)
		rs_sources_count_read(job->sources, op->count == 1
				      ? p->bytes : p->rows * op->len);
	return err;
}

static int exec_piece(rs_exec_job *job, const rs_exec_piece *p)
{
	const rs_copy_op *op = &job->ops[p->op];
	int fd, err;

	err = rs_sources_fd(job->sources, op->source, &fd);
	if (err)
		return err;
	if (job->from != job->to)
		return exec_cast_piece(job, p, fd);
	if (op->count == 1) {
		err = rs_pread_full(fd, job->dst + op->dst_off + p->byte, p->bytes,
				op->src_off + p->byte);
		if (!err)
			rs_sources_count_read(job->sources, p->bytes);
		return err;
	}
	if (op->src_stride == op->len)
		err = read_rows_scatter(fd, job->dst, op, p->row, p->rows);
	else
		err = read_rows_strided(fd, job->dst, op, p->row, p->rows);
	if (!err)
		rs_sources_count_read(job->sources, p->rows * op->len);
	return err;
}

static void unlink_job(cpu_pool *pool, rs_exec_job *job)
{
	for (rs_exec_job **pp = &pool->queue; *pp; pp = &(*pp)->queue_next)
		if (*pp == job) {
			*pp = job->queue_next;
			return;
		}
}

/* Claims the next piece of `job` (pool lock held); -1 when none is left. */
static long claim(cpu_pool *pool, rs_exec_job *job)
{
	size_t i = atomic_load(&job->next_piece);

	if (i >= job->npieces)
		return -1;
	atomic_store(&job->next_piece, i + 1);
	if (i + 1 == job->npieces)
		unlink_job(pool, job);
	return (long)i;
}

static void run_piece(rs_exec_job *job, size_t i)
{
	/* Read before finishing: once the last piece is counted, the job may
	 * be freed by its owner. */
	size_t total = job->npieces;
	int err = exec_piece(job, &job->pieces[i]);

	if (err) {
		int zero = 0;

		atomic_compare_exchange_strong(&job->status, &zero, err);
	}
	if (atomic_fetch_add(&job->finished, 1) + 1 == total) {
		int status = atomic_load(&job->status);

		rs_exec_job_release(job);
		job->done(job, status);
	}
}

static void *worker(void *arg)
{
	cpu_pool *pool = arg;

	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (!pool->queue && !pool->stop)
			pthread_cond_wait(&pool->cond, &pool->lock);
		if (pool->stop)
			break;
		rs_exec_job *job = pool->queue;
		long i = claim(pool, job);

		if (i < 0)
			continue;
		pthread_mutex_unlock(&pool->lock);
		run_piece(job, (size_t)i);
		pthread_mutex_lock(&pool->lock);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

/* A cast needs a pair gpu/cast.h converts, and ops in whole elements. */
static int check_cast(const rs_exec_job *job)
{
	unsigned fsize = rs_dtype_size(job->from);

	if (!rs_cast_supported(job->from, job->to))
		return -EINVAL;
	for (size_t i = 0; i < job->nops; i++) {
		const rs_copy_op *op = &job->ops[i];

		if (op->len % fsize || op->dst_off % fsize ||
		    (op->count > 1 && op->dst_stride % fsize))
			return -EINVAL;
	}
	return 0;
}

static int cpu_submit(void *impl, rs_exec_job *job)
{
	cpu_pool *pool = impl;
	uint64_t covered = 0;
	int err;

	for (size_t i = 0; i < job->nops; i++)
		covered += job->ops[i].len * job->ops[i].count;
	if (job->from != job->to) {
		err = check_cast(job);
		if (err)
			return err;
		covered = covered / rs_dtype_size(job->from) * rs_dtype_size(job->to);
	}
	if (job->zero_fill && covered < job->size)
		memset(job->dst, 0, job->size);
	err = rs_exec_job_split(job, PIECE_BYTES);
	if (err)
		return err;
	if (job->npieces == 0) {
		rs_exec_job_release(job);
		job->done(job, 0);
		return 0;
	}
	pthread_mutex_lock(&pool->lock);
	job->queue_next = NULL;
	{
		rs_exec_job **tail = &pool->queue;

		while (*tail)
			tail = &(*tail)->queue_next;
		*tail = job;
	}
	pthread_cond_broadcast(&pool->cond);
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

static void cpu_help(void *impl, rs_exec_job *job)
{
	cpu_pool *pool = impl;

	for (;;) {
		long i;

		pthread_mutex_lock(&pool->lock);
		i = claim(pool, job);
		pthread_mutex_unlock(&pool->lock);
		if (i < 0)
			return;
		run_piece(job, (size_t)i);
	}
}

static void cpu_destroy(void *impl)
{
	cpu_pool *pool = impl;

	pthread_mutex_lock(&pool->lock);
	pool->stop = true;
	pthread_cond_broadcast(&pool->cond);
	pthread_mutex_unlock(&pool->lock);
	for (unsigned i = 0; i < pool->nthreads; i++)
		pthread_join(pool->threads[i], NULL);
	pthread_cond_destroy(&pool->cond);
	pthread_mutex_destroy(&pool->lock);
	free(pool->threads);
	free(pool);
}

static const rs_executor_ops cpu_ops = {
	.name = "cpu",
	.submit = cpu_submit,
	.help = cpu_help,
	.destroy = cpu_destroy,
};

int rs_cpu_executor_create(void **impl, const rs_executor_ops **ops,
			   unsigned threads)
{
	cpu_pool *pool = calloc(1, sizeof(*pool));
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (!pool)
		return -ENOMEM;
	if (threads == 0)
		threads = ncpu > 0 ? (unsigned)ncpu : 1;
	pool->threads = calloc(threads, sizeof(pthread_t));
	if (!pool->threads) {
		free(pool);
		return -ENOMEM;
	}
	pthread_mutex_init(&pool->lock, NULL);
	pthread_cond_init(&pool->cond, NULL);
	for (unsigned i = 0; i < threads; i++) {
		if (pthread_create(&pool->threads[i], NULL, worker, pool) != 0)
			break;
		pool->nthreads++;
	}
	if (pool->nthreads == 0) {
		cpu_destroy(pool);
		return -EAGAIN;
	}
	*impl = pool;
	*ops = &cpu_ops;
	return 0;
}
