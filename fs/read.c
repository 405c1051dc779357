/* The read path: file segments -> one reply vector (docs/ARCHITECTURE.md).
 *
 * Literal and zero segments point at memory; tensor segments are served
 * from cached blocks (fs/blocks.h), built on a miss by the executor;
 * source segments are read with pread into a buffer of the thread's,
 * straight into place in the reply.  Every source the read touches (its
 * source ranges, and every source of the chunks its blocks come from,
 * cached or not) is checked by path first, so a source replaced since the
 * mount gives EIO, never stale bytes; any failure replies with an error,
 * never a short buffer (libfuse would pad a short reply with zeros).  The
 * check costs what the read touches, not what the whole file is built
 * from (a torch_dist view file can read hundreds of sources).
 *
 * Checking first is not enough when the source changes while it is being
 * read, so the source ranges of a reply are read in one checked gather
 * (rs_blocks_gather: the touched sources' descriptors checked before and
 * after), like every block build; a reply of cached blocks alone is
 * checked the same way, so a block built before a change is not served
 * after it.
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
 * place change its bytes.  A pread is a copy taken before the second
 * check (tests/mount/test_faults.py catches both races).  Every reply is
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

static const uint8_t zeros[RS_MAX_READ];

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
	rs_source_set sources;  /* every source the read touches */
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

		err = rs_blocks_get(&fs->blocks, c, index, &blk);
		if (err)
			return err;
		err = hold_block(r, blk);
		if (err) {
			rs_cache_release(fs->blocks.cache, blk);
			return err;
		}
		take = rs_block_len(blk) - in < len ? rs_block_len(blk) - in : len;
		if (rs_cache_mark_read(fs->blocks.cache, blk, take))
			rs_prefetch_read_whole(fs->prefetch, c, index);
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

/* Sources v[0, n) at their paths as recorded; -ESTALE (logged) when one
 * is not. */
static int check_paths(rs_fs *fs, const uint32_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int err = rs_sources_check(fs->ck.sources, v[i]);

		if (err) {
			rs_log(RS_LOG_ERROR, "%s/%s: source changed since mount; reads of files built from it fail with EIO",
			       fs->ck.root_path,
			       rs_sources_path(fs->ck.sources, v[i]));
			return err;
		}
	}
	return 0;
}

int rs_fs_check_sources(rs_fs *fs, const rs_vnode *n)
{
	return check_paths(fs, n->sources, n->nsources);
}

/* The sources of the segments overlapping [pos, end) of n. */
static int touched_sources(const rs_vnode *n, uint64_t pos, uint64_t end,
			   rs_source_set *set)
{
	int err = 0;

	for (uint32_t i = rs_vtree_find_segment(n, pos);
	     i < n->nsegs && n->segs[i].offset < end && !err; i++) {
		const rs_segment *s = &n->segs[i];

		if (s->kind == RS_SEG_SOURCE) {
			err = rs_source_set_add(set, s->u.source.index);
		} else if (s->kind == RS_SEG_TENSOR) {
			const rs_chunk *c = s->u.tensor.chunk;

			for (uint32_t k = 0; k < c->nsources && !err; k++)
				err = rs_source_set_add(set, c->sources[k]);
		}
	}
	return err;
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
	err = touched_sources(n, pos, end, &r.sources);
	if (!err)
		err = check_paths(fs, r.sources.v, r.sources.n);
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
	err = rs_blocks_gather(&fs->blocks, &r.sources,
			       r.nreads ? read_sources : NULL, &r);
	if (err)
		goto fail;
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
		rs_cache_release(fs->blocks.cache, r.blocks[i]);
	free(r.blocks);
	free(r.reads);
	rs_source_set_free(&r.sources);
	free(r.vec);
}
