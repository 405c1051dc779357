/* The read path: file segments -> one reply vector (DESIGN.md §2).
 *
 * Literal and zero segments point at memory; tensor segments are served
 * from cached blocks, built on a miss by the executor; source segments are
 * read with pread into a buffer of the thread's, straight into place in the
 * reply.  Every source a file depends on is checked first, so a changed
 * source gives EIO, never stale bytes; any failure replies with an error,
 * never a short buffer (libfuse would pad a short reply with zeros).
 *
 * Checking first is not enough when the source changes while it is being
 * read, so every gather from a source - a block build, the source ranges
 * of a reply - runs between two stamps of the files it reads
 * (rs_sources_stamp): bytes are used only when nothing moved in between,
 * and a build that saw a change is never cached.
 *
 * Why source ranges are copied, not spliced.  Handing libfuse the source
 * descriptor (FUSE_BUF_IS_FD) spliced the range into the reply without a
 * copy of ours, but a splice from a file does not copy either: the pipe
 * holds references to the source's page-cache pages, so the bytes are only
 * read when the kernel copies them into the reply - after any check the
 * daemon can make.  A truncation in between made libfuse send a short reply
 * (the kernel then zero-fills the rest of the page and shrinks the file's
 * size); even a splice into a pipe of our own that came back whole still
 * sees a later truncation zero the tail of its last page, and a write in
 * place change its bytes.  A pread is a copy taken before the stamps are
 * compared (tests/mount/test_faults.py catches both races).  Every reply is
 * then memory and goes out in one writev (fuse_reply_iov), which makes the
 * copy cost what the splice did (BENCHMARKS.md, "Source ranges read into
 * the reply").
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fs/fs.h"
#include "fs/log.h"
#include "planner/array.h"

/* Gathers retried when a source's ctime moved but its identity did not
 * (a chmod, a hard link, or a change undone) before the read gives EIO. */
#define STAMP_TRIES 3

static const uint8_t zeros[RS_MAX_READ];

/* --- gathers between stamps --- */

typedef struct {
	uint32_t index;
	rs_file_stamp stamp;
} source_stamp;

/* The distinct sources a gather reads. */
typedef struct {
	source_stamp *v;
	size_t n, cap;
} stamp_set;

static int stamp_set_add(stamp_set *set, uint32_t index)
{
	int err;

	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].index == index)
			return 0;
	err = rs_array_reserve(&set->v, &set->cap, set->n + 1,
			       sizeof(*set->v));
	if (!err)
		set->v[set->n++].index = index;
	return err;
}

static void log_changed(rs_fs *fs, uint32_t index)
{
	rs_log(RS_LOG_ERROR, "%s/%s: source changed while it was read; reads of files built from it fail with EIO",
	       fs->ck.root_path, rs_sources_path(fs->ck.sources, index));
}

/* Runs gather(arg) between two stamps of every source in `set`: 0 only
 * when none of them changed meanwhile; -ESTALE (logged) when one did. */
static int checked_gather(rs_fs *fs, stamp_set *set, int (*gather)(void *),
			  void *arg)
{
	rs_sources *src = fs->ck.sources;
	size_t i;
	int err = 0;

	for (int tries = 0; tries < STAMP_TRIES; tries++) {
		for (i = 0; i < set->n; i++) {
			err = rs_sources_stamp(src, set->v[i].index,
					       &set->v[i].stamp);
			if (err)
				goto out;
		}
		err = gather(arg);
		if (err)
			return err;
		for (i = 0; i < set->n; i++) {
			err = rs_sources_recheck(src, set->v[i].index,
						 &set->v[i].stamp);
			if (err)
				break;
		}
		if (err != -EAGAIN)
			goto out;
	}
	err = -ESTALE;   /* still moving: i is the last one that moved */
out:
	if (err == -ESTALE)
		log_changed(fs, set->v[i < set->n ? i : 0].index);
	return err;
}

/* --- the reply --- */

typedef struct {
	uint32_t source;
	uint64_t off, len;
	uint8_t *dst;
} source_read;

typedef struct {
	struct fuse_bufvec *vec;   /* vec->buf grows past its declared size */
	size_t cap;
	rs_block **blocks;
	size_t nblocks, cap_blocks;
	uint64_t source_bytes;
	/* Source segments: read into buf, which mirrors the reply's bytes
	 * from file offset `start`; `len` of them. */
	uint64_t start, len;
	uint8_t *buf;
	source_read *reads;
	size_t nreads, cap_reads;
	stamp_set stamps;
	rs_fs *fs;
} reply;

/* The calling thread's buffer for source bytes, at least `need` bytes,
 * kept for the thread's next reads and freed when it exits. */
typedef struct {
	uint8_t *p;
	size_t cap;
} thread_buf;

static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static bool buf_key_ok;

static void free_thread_buf(void *arg)
{
	thread_buf *b = arg;

	free(b->p);
	free(b);
}

static void make_buf_key(void)
{
	buf_key_ok = pthread_key_create(&buf_key, free_thread_buf) == 0;
}

static uint8_t *thread_buffer(size_t need)
{
	thread_buf *b;
	void *p;

	pthread_once(&buf_once, make_buf_key);
	if (!buf_key_ok)
		return NULL;
	b = pthread_getspecific(buf_key);
	if (!b) {
		b = calloc(1, sizeof(*b));
		if (!b)
			return NULL;
		if (pthread_setspecific(buf_key, b) != 0) {
			free(b);
			return NULL;
		}
	}
	if (b->cap < need) {
		size_t cap = need < RS_MAX_READ ? RS_MAX_READ : need;

		if (posix_memalign(&p, 4096, cap) != 0)
			return NULL;
		free(b->p);
		b->p = p;
		b->cap = cap;
	}
	return b->p;
}

static int read_sources(void *arg)
{
	reply *r = arg;

	for (size_t i = 0; i < r->nreads; i++) {
		const source_read *sr = &r->reads[i];
		int err = rs_sources_pread(r->fs->ck.sources, sr->source,
					   sr->dst, sr->len, sr->off);

		if (err)
			return err;
	}
	return 0;
}

static int add_buf(reply *r, struct fuse_buf b)
{
	if (r->vec->count == r->cap) {
		size_t cap = r->cap * 2;
		struct fuse_bufvec *g = realloc(r->vec, sizeof(*g) +
						cap * sizeof(struct fuse_buf));

		if (!g)
			return -ENOMEM;
		r->vec = g;
		r->cap = cap;
	}
	r->vec->buf[r->vec->count++] = b;
	return 0;
}

static int add_mem(reply *r, const void *p, size_t len)
{
	struct fuse_buf b = { .size = len, .mem = (void *)p };

	return add_buf(r, b);
}

static int hold_block(reply *r, rs_block *blk)
{
	int err = rs_array_reserve(&r->blocks, &r->cap_blocks, r->nblocks + 1,
				   sizeof(blk));

	if (!err)
		r->blocks[r->nblocks++] = blk;
	return err;
}

typedef struct {
	rs_fs *fs;
	const rs_chunk *chunk;
	uint64_t begin;
} block_job;

typedef struct {
	rs_fs *fs;
	const rs_chunk *chunk;
	const rs_plan *slice;
	uint8_t *buf;
	uint64_t len;
} block_gather;

static int run_block(void *arg)
{
	block_gather *g = arg;
	rs_exec_job job = { 0 };

	job.ops = g->slice->ops;
	job.nops = g->slice->count;
	job.dst = g->buf;
	job.size = g->len;
	job.zero_fill = g->slice->covered < g->slice->size;
	job.sources = g->fs->ck.sources;
	job.from = g->chunk->from;
	job.to = g->chunk->to;
	return rs_executor_run(g->fs->exec, &job);
}

/* Where view bytes [begin, begin+len) of a chunk are in its plan, which
 * is made in the stored dtype: the same range without a cast.  Blocks
 * start at multiples of RS_BLOCK_SIZE, so they start on an element. */
static void plan_range(const rs_chunk *c, uint64_t begin, uint64_t len,
		       uint64_t *pbegin, uint64_t *pend)
{
	if (c->from == c->to) {
		*pbegin = begin;
		*pend = begin + len;
		return;
	}
	*pbegin = begin / rs_dtype_size(c->to) * rs_dtype_size(c->from);
	*pend = (begin + len) / rs_dtype_size(c->to) * rs_dtype_size(c->from);
}

/* Cache miss: plan the block's slice of the chunk and execute it, between
 * stamps of its sources, so a source changed meanwhile fails the build
 * and nothing of it is cached. */
static int build_block(void *arg, uint8_t *buf, uint64_t len)
{
	block_job *bj = arg;
	block_gather g = { bj->fs, bj->chunk, NULL, buf, len };
	stamp_set set = { 0 };
	uint64_t pbegin, pend;
	rs_plan slice;
	int err;

	plan_range(bj->chunk, bj->begin, len, &pbegin, &pend);
	err = rs_plan_slice(&bj->chunk->plan, pbegin, pend, &slice);
	if (err)
		return err;
	for (size_t i = 0; i < slice.count && !err; i++)
		err = stamp_set_add(&set, slice.ops[i].source);
	g.slice = &slice;
	if (!err)
		err = checked_gather(bj->fs, &set, run_block, &g);
	free(set.v);
	rs_plan_free(&slice);
	return err;
}

int rs_fs_get_block(rs_fs *fs, const rs_chunk *c, uint64_t index,
		    rs_block **out)
{
	uint64_t begin = index * RS_BLOCK_SIZE;
	uint64_t blen = c->size - begin < RS_BLOCK_SIZE
				? c->size - begin : RS_BLOCK_SIZE;
	block_job bj = { fs, c, begin };

	if (begin >= c->size)
		return -EINVAL;
	return rs_cache_get(fs->cache, c->id, index, blen, build_block, &bj,
			    out);
}

static int add_tensor(rs_fs *fs, reply *r, const rs_segment *s,
		      uint64_t from, uint64_t len)
{
	uint64_t pos = s->u.tensor.offset + from;   /* within the chunk */
	const rs_chunk *c = s->u.tensor.chunk;

	while (len) {
		uint64_t index = pos / RS_BLOCK_SIZE;
		uint64_t in = pos - index * RS_BLOCK_SIZE;
		rs_block *blk;
		uint64_t take;
		int err;

		err = rs_fs_get_block(fs, c, index, &blk);
		if (err)
			return err;
		err = hold_block(r, blk);
		if (err) {
			rs_cache_release(fs->cache, blk);
			return err;
		}
		take = rs_block_len(blk) - in < len ? rs_block_len(blk) - in : len;
		err = add_mem(r, rs_block_data(blk) + in, take);
		if (err)
			return err;
		pos += take;
		len -= take;
	}
	return 0;
}

static int add_segment(rs_fs *fs, reply *r, const rs_segment *s,
		       uint64_t from, uint64_t len)
{
	switch (s->kind) {
	case RS_SEG_LITERAL:
		return add_mem(r, s->u.bytes + from, len);
	case RS_SEG_ZERO:
		while (len) {
			uint64_t n = len < sizeof(zeros) ? len : sizeof(zeros);
			int err = add_mem(r, zeros, n);

			if (err)
				return err;
			len -= n;
		}
		return 0;
	case RS_SEG_SOURCE: {
		int err;

		if (!r->buf && !(r->buf = thread_buffer(r->len)))
			return -ENOMEM;
		err = rs_array_reserve(&r->reads, &r->cap_reads, r->nreads + 1,
				       sizeof(*r->reads));
		if (!err)
			err = stamp_set_add(&r->stamps, s->u.source.index);
		if (err)
			return err;
		source_read *sr = &r->reads[r->nreads++];

		sr->source = s->u.source.index;
		sr->off = s->u.source.offset + from;
		sr->len = len;
		sr->dst = r->buf + (s->offset + from - r->start);
		r->source_bytes += len;
		return add_mem(r, sr->dst, len);
	}
	case RS_SEG_TENSOR:
		return add_tensor(fs, r, s, from, len);
	}
	return -EIO;
}

int rs_fs_check_sources(rs_fs *fs, const rs_vnode *n)
{
	for (uint32_t i = 0; i < n->nsources; i++) {
		int err = rs_sources_check(fs->ck.sources, n->sources[i]);

		if (err) {
			rs_log(RS_LOG_ERROR, "%s/%s: source changed since mount; reads of files built from it fail with EIO",
			       fs->ck.root_path,
			       rs_sources_path(fs->ck.sources, n->sources[i]));
			return err;
		}
	}
	return 0;
}

/* A read that continues the last one on its handle asks for the window
 * ahead of it, once per block boundary crossed. */
static void read_ahead(rs_fs *fs, rs_open_file *of, uint64_t off,
		       uint64_t end)
{
	uint64_t last = atomic_exchange(&of->last_end, end);
	uint64_t want = end + RS_PREFETCH_AHEAD, to;

	if (off != 0 && (off + RS_MAX_READ < last || last + RS_MAX_READ < off))
		return;   /* not sequential */
	to = atomic_load(&of->prefetched_to);
	if (off == 0) {
		uint32_t prev = rs_prefetch_prev_sibling(&fs->tree, of->node);

		to = 0;
		atomic_store(&of->in_dir_order, prev != UINT32_MAX &&
			     atomic_load(&fs->last_finished) == prev + 1);
	}
	if (end == fs->tree.nodes[of->node].size)
		atomic_store(&fs->last_finished, of->node + 1);
	if (want <= to)
		return;
	want = (want + RS_BLOCK_SIZE - 1) / RS_BLOCK_SIZE * RS_BLOCK_SIZE;
	atomic_store(&of->prefetched_to, want);
	if (to < end)
		to = end;
	rs_prefetch_window(fs->prefetch, of->node, to, want - to,
			   atomic_load(&of->in_dir_order));
}

/* Every buffer of a reply is memory: one writev of them into the request
 * (fuse_reply_iov) copies each byte once, where fuse_reply_data would
 * write them into a pipe and splice that.  Past IOV_MAX buffers (many
 * small tensors in one read), fuse_reply_data. */
static int send_reply(fuse_req_t req, const reply *r)
{
	const struct fuse_bufvec *v = r->vec;
	struct iovec *iov;
	int err;

	if (v->count >= IOV_MAX)   /* fuse_reply_iov adds the header's */
		return fuse_reply_data(req, r->vec, FUSE_BUF_SPLICE_MOVE);
	iov = malloc(v->count * sizeof(*iov));
	if (!iov)
		return fuse_reply_data(req, r->vec, FUSE_BUF_SPLICE_MOVE);
	for (size_t i = 0; i < v->count; i++) {
		iov[i].iov_base = v->buf[i].mem;
		iov[i].iov_len = v->buf[i].size;
	}
	err = fuse_reply_iov(req, iov, (int)v->count);
	free(iov);
	return err;
}

void rs_fs_read(rs_fs *fs, fuse_req_t req, const rs_vnode *n,
		rs_open_file *of, size_t size, off_t off)
{
	reply r = { 0 };
	uint64_t pos = (uint64_t)off, end;
	int err;

	atomic_fetch_add_explicit(&fs->reads, 1, memory_order_relaxed);
	if (off < 0 || pos >= n->size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	end = n->size - pos < size ? n->size : pos + size;
	if (of) {
		read_ahead(fs, of, pos, end);
		atomic_fetch_add_explicit(&of->reads_done, 1,
					  memory_order_release);
	}
	err = rs_fs_check_sources(fs, n);
	if (err)
		goto fail;
	r.fs = fs;
	r.start = pos;
	r.len = end - pos;
	r.cap = 8;
	r.vec = malloc(sizeof(*r.vec) + r.cap * sizeof(struct fuse_buf));
	if (!r.vec) {
		err = -ENOMEM;
		goto fail;
	}
	memset(r.vec, 0, sizeof(*r.vec));
	for (uint32_t i = rs_vtree_find_segment(n, pos); pos < end; i++) {
		const rs_segment *s = &n->segs[i];
		uint64_t from = pos - s->offset;
		uint64_t len = s->length - from < end - pos ? s->length - from
							     : end - pos;

		err = add_segment(fs, &r, s, from, len);
		if (err)
			goto fail;
		pos += len;
	}
	if (r.nreads) {
		err = checked_gather(fs, &r.stamps, read_sources, &r);
		if (err)
			goto fail;
	}
	/* Counted before the reply goes out, so a reader that reads the
	 * stats file right after its read sees it. */
	atomic_fetch_add_explicit(&fs->bytes_served, end - (uint64_t)off,
				  memory_order_relaxed);
	rs_sources_count_read(fs->ck.sources, r.source_bytes);
	send_reply(req, &r);
	goto out;
fail:
	atomic_fetch_add_explicit(&fs->read_errors, 1, memory_order_relaxed);
	if (err != -ESTALE)
		rs_log(RS_LOG_ERROR, "read of %s at %lld failed: %s", n->name,
		       (long long)off, strerror(-err));
	fuse_reply_err(req, err == -ENOMEM ? ENOMEM : EIO);
out:
	for (size_t i = 0; i < r.nblocks; i++)
		rs_cache_release(fs->cache, r.blocks[i]);
	free(r.blocks);
	free(r.reads);
	free(r.stamps.v);
	free(r.vec);
}
