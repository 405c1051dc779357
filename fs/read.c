/* The read path: file segments -> one reply vector (DESIGN.md §2).
 *
 * Literal and zero segments point at memory; source segments are passed as
 * file-descriptor buffers so libfuse splices them from the source file
 * without a user-space copy; tensor segments are served from cached blocks,
 * built on a miss by the executor.  Every source a file depends on is
 * checked first, so a changed source gives EIO, never stale bytes; any
 * failure replies with an error, never a short buffer (libfuse would pad a
 * short reply with zeros).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fs/fs.h"
#include "fs/log.h"
#include "planner/array.h"

static const uint8_t zeros[RS_MAX_READ];

typedef struct {
	struct fuse_bufvec *vec;   /* vec->buf grows past its declared size */
	size_t cap;
	rs_block **blocks;
	size_t nblocks, cap_blocks;
	uint64_t source_bytes;
} reply;

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

/* Cache miss: plan the block's slice of the chunk and execute it. */
static int build_block(void *arg, uint8_t *buf, uint64_t len)
{
	block_job *bj = arg;
	rs_exec_job job = { 0 };
	rs_plan slice;
	int err;

	err = rs_plan_slice(&bj->chunk->plan, bj->begin, bj->begin + len,
			    &slice);
	if (err)
		return err;
	job.ops = slice.ops;
	job.nops = slice.count;
	job.dst = buf;
	job.size = len;
	job.zero_fill = slice.covered < len;
	job.sources = bj->fs->ck.sources;
	err = rs_executor_run(bj->fs->exec, &job);
	rs_plan_free(&slice);
	return err;
}

int rs_fs_get_block(rs_fs *fs, const rs_chunk *c, uint64_t index,
		    rs_block **out)
{
	uint64_t begin = index * RS_BLOCK_SIZE;
	uint64_t blen = c->plan.size - begin < RS_BLOCK_SIZE
				? c->plan.size - begin : RS_BLOCK_SIZE;
	block_job bj = { fs, c, begin };

	if (begin >= c->plan.size)
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
		struct fuse_buf b = {
			.size = len,
			.flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK |
				 FUSE_BUF_FD_RETRY,
			.pos = (off_t)(s->u.source.offset + from),
		};
		int err = rs_sources_fd(fs->ck.sources, s->u.source.index,
					&b.fd);

		if (err)
			return err;
		r->source_bytes += len;
		return add_buf(r, b);
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
	/* FUSE_BUF_FD_RETRY makes libfuse read a short fd read to the end;
	 * sizes were checked against the sources just above. */
	err = fuse_reply_data(req, r.vec, FUSE_BUF_SPLICE_MOVE);
	if (err == 0) {
		atomic_fetch_add_explicit(&fs->bytes_served, end - (uint64_t)off,
					  memory_order_relaxed);
		rs_sources_count_read(fs->ck.sources, r.source_bytes);
	}
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
	free(r.vec);
}
