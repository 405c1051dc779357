/* CPU executor: a thread pool of pread/preadv workers.
 *
 * Jobs are cut into pieces of at most 1 MiB so one block is built by every
 * worker (and the asking thread) at once.  Pieces are claimed under one
 * lock; a job leaves the queue when its last piece is claimed, so the queue
 * never points at a job that may already be finished and freed.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

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

static int exec_piece(rs_exec_job *job, const rs_exec_piece *p)
{
	const rs_copy_op *op = &job->ops[p->op];
	int fd, err;

	err = rs_sources_fd(job->sources, op->source, &fd);
	if (err)
		return err;
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

static int cpu_submit(void *impl, rs_exec_job *job)
{
	cpu_pool *pool = impl;
	uint64_t covered = 0;
	int err;

	for (size_t i = 0; i < job->nops; i++)
		covered += job->ops[i].len * job->ops[i].count;
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
