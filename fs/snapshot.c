/* memfd snapshots of view files; see snapshot.h. */
#include "fs/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Block-sized buffers kept for the next builds (a fresh 4 MiB buffer is a
 * fresh mapping, faulted and zeroed page by page); a build takes two. */
#define NSPARES 4

struct rs_snapshot {
	uint32_t node;
	int fd;                 /* -1 until built */
	uint64_t size;
	int refs;               /* open files, the builder and its waiters */
	bool ready;
	bool in_table;
	int error;              /* a failed build's, for its waiters */
	rs_snapshot *prev, *next;   /* idle list (ready, refs == 0) */
};

struct rs_snapshots {
	pthread_mutex_t lock;
	pthread_cond_t built;   /* a build ended */
	const rs_blocks *blocks;
	const rs_vtree *tree;
	uint64_t max_size;
	rs_snapshot **table;    /* by node */
	rs_snapshot *idle_head, *idle_tail;   /* head: released last */
	uint8_t *spares[NSPARES];
	unsigned nspares;
	rs_snapshot_stats stats;
};

static void idle_remove(rs_snapshots *s, rs_snapshot *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		s->idle_head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		s->idle_tail = e->prev;
	e->prev = e->next = NULL;
}

static void idle_push(rs_snapshots *s, rs_snapshot *e)
{
	e->prev = NULL;
	e->next = s->idle_head;
	if (s->idle_head)
		s->idle_head->prev = e;
	s->idle_head = e;
	if (!s->idle_tail)
		s->idle_tail = e;
}

static void entry_free(rs_snapshot *e)
{
	if (e->fd >= 0)
		close(e->fd);
	free(e);
}

/* Takes a ready entry out of the table (lock held); the caller frees it
 * and accounts for its bytes. */
static void unlist(rs_snapshots *s, rs_snapshot *e)
{
	s->table[e->node] = NULL;
	e->in_table = false;
	s->stats.files--;
	s->stats.bytes -= e->size;
}

/* The cache's reclaim callback (its lock held): idle snapshots, least
 * recently released first, until `want` bytes are freed. */
static uint64_t reclaim(void *arg, uint64_t want)
{
	rs_snapshots *s = arg;
	uint64_t freed = 0;

	pthread_mutex_lock(&s->lock);
	while (freed < want && s->idle_tail) {
		rs_snapshot *e = s->idle_tail;

		idle_remove(s, e);
		unlist(s, e);
		freed += e->size;
		s->stats.evictions++;
		entry_free(e);
	}
	pthread_mutex_unlock(&s->lock);
	return freed;
}

int rs_snapshots_new(rs_snapshots **out, const rs_blocks *blocks,
		     const rs_vtree *tree, uint64_t max_size)
{
	rs_snapshots *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->table = calloc(tree->count ? tree->count : 1, sizeof(*s->table));
	if (!s->table) {
		free(s);
		return -ENOMEM;
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->built, NULL);
	s->blocks = blocks;
	s->tree = tree;
	s->max_size = max_size;
	rs_cache_set_reclaim(blocks->cache, reclaim, s);
	*out = s;
	return 0;
}

void rs_snapshots_free(rs_snapshots *s)
{
	if (!s)
		return;
	rs_cache_set_reclaim(s->blocks->cache, NULL, NULL);
	for (uint32_t i = 0; i < s->tree->count; i++)
		if (s->table[i]) {
			rs_cache_uncharge(s->blocks->cache, s->table[i]->size);
			entry_free(s->table[i]);
		}
	for (unsigned i = 0; i < s->nspares; i++)
		free(s->spares[i]);
	free(s->table);
	pthread_cond_destroy(&s->built);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* --- building --- */

/* A file is built window by window: the bytes of one RS_BLOCK_SIZE-aligned
 * window are assembled in a buffer and written with one pwrite (a write
 * that covers only part of a new shmem page makes the kernel zero the
 * rest of it first; whole windows never do).  A window holding nothing
 * but zero segments is not written: a hole, no memory. */

typedef struct {
	rs_snapshots *s;
	const rs_vnode *n;
	int fd;
	uint8_t *win;           /* the window's bytes */
	uint64_t base, len;     /* the window: file bytes [base, base + len) */
	bool written;           /* it holds bytes other than zero segments */
	uint8_t *blk;           /* the last tensor block built, */
	const rs_chunk *blk_chunk;   /* of this chunk, */
	uint64_t blk_index;     /* this index */
} builder;

static int pwrite_full(int fd, const uint8_t *p, uint64_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

typedef struct {
	rs_sources *sources;
	uint32_t source;
	uint64_t off, len;
	uint8_t *dst;
} source_piece;

/* A gather for rs_blocks_gather: a source range read into the window.  A
 * pread copies the bytes before the check after it, so the check covers
 * them (fs/read.c says why a splice would not).  A source that ends
 * first is -EIO. */
static int read_piece(void *arg)
{
	source_piece *sp = arg;
	int err = rs_sources_pread(sp->sources, sp->source, sp->dst, sp->len,
				   sp->off);

	if (!err)
		rs_sources_count_read(sp->sources, sp->len);
	return err;
}

/* The part [lo, hi) (file offsets) of segment seg into the window. */
static int fill(builder *b, const rs_segment *seg, uint64_t lo, uint64_t hi)
{
	uint8_t *dst = b->win + (lo - b->base);
	uint64_t from = lo - seg->offset;    /* in the segment */

	switch (seg->kind) {
	case RS_SEG_LITERAL:
		memcpy(dst, seg->u.bytes + from, hi - lo);
		return 0;
	case RS_SEG_ZERO:
		memset(dst, 0, hi - lo);
		return 0;
	case RS_SEG_SOURCE: {
		source_piece sp = { b->s->blocks->sources, seg->u.source.index,
				    seg->u.source.offset + from, hi - lo, dst };
		rs_source_set set = { 0 };
		int err = rs_source_set_add(&set, sp.source);

		if (!err)
			err = rs_blocks_gather(b->s->blocks, &set, read_piece, &sp);
		rs_source_set_free(&set);
		return err;
	}
	case RS_SEG_TENSOR: {
		/* The blocks of the chunk the part overlaps, each built whole
		 * (blocks are where a plan may be sliced); a block that spans
		 * two windows is built once. */
		const rs_chunk *c = seg->u.tensor.chunk;
		uint64_t pos = seg->u.tensor.offset + from;
		uint64_t end = pos + (hi - lo);

		while (pos < end) {
			uint64_t k = pos / RS_BLOCK_SIZE, begin = k * RS_BLOCK_SIZE;
			uint64_t stop = begin + rs_blocks_block_len(c, k);
			uint64_t n = (end < stop ? end : stop) - pos;

			if (pos == begin && n == stop - begin) {
				/* a whole block in this window: built in place */
				int err = rs_blocks_build_into(b->s->blocks, c, k,
							       dst);

				if (err)
					return err;
				dst += n;
				pos += n;
				continue;
			}
			if (b->blk_chunk != c || b->blk_index != k) {
				int err = rs_blocks_build_into(b->s->blocks, c, k,
							       b->blk);

				b->blk_chunk = NULL;
				if (err)
					return err;
				b->blk_chunk = c;
				b->blk_index = k;
			}
			memcpy(dst, b->blk + (pos - begin), n);
			dst += n;
			pos += n;
		}
		return 0;
	}
	}
	return -EIO;
}

/* Every byte of file n written to b->fd, window by window. */
static int build_windows(builder *b)
{
	const rs_vnode *n = b->n;
	uint32_t i = 0;

	for (b->base = 0; b->base < n->size; b->base += RS_BLOCK_SIZE) {
		uint64_t wend;

		b->len = n->size - b->base < RS_BLOCK_SIZE ? n->size - b->base
							   : RS_BLOCK_SIZE;
		wend = b->base + b->len;
		b->written = false;
		for (; i < n->nsegs; i++) {
			const rs_segment *seg = &n->segs[i];
			uint64_t lo = seg->offset > b->base ? seg->offset : b->base;
			uint64_t send = seg->offset + seg->length;
			uint64_t hi = send < wend ? send : wend;
			int err;

			if (seg->offset >= wend)
				break;
			if (hi > lo) {
				err = fill(b, seg, lo, hi);
				if (err)
					return err;
				b->written |= seg->kind != RS_SEG_ZERO;
			}
			if (send > wend)
				break;  /* it goes on in the next window */
		}
		if (b->written) {
			int err = pwrite_full(b->fd, b->win, b->len, b->base);

			if (err)
				return err;
		}
	}
	return 0;
}

static uint8_t *take_buffer(rs_snapshots *s)
{
	uint8_t *buf = NULL;

	pthread_mutex_lock(&s->lock);
	if (s->nspares)
		buf = s->spares[--s->nspares];
	pthread_mutex_unlock(&s->lock);
	return buf ? buf : malloc(RS_BLOCK_SIZE);
}

static void give_buffer(rs_snapshots *s, uint8_t *buf)
{
	if (!buf)
		return;
	pthread_mutex_lock(&s->lock);
	if (s->nspares < NSPARES) {
		s->spares[s->nspares++] = buf;
		buf = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	free(buf);
}

/* A finished memfd sealed: it cannot be written, grown or shrunk again. */
static int seal(int fd)
{
	return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
		     F_SEAL_WRITE | F_SEAL_SEAL) == 0 ? 0 : -errno;
}

/* Every byte of file n into a new sealed memfd: *fd on success. */
static int build(rs_snapshots *s, const rs_vnode *n, int *out)
{
	builder b = { .s = s, .n = n };
	int err = 0;

	b.fd = memfd_create("reshardfs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (b.fd < 0)
		return -errno;
	b.win = take_buffer(s);
	b.blk = take_buffer(s);
	if (!b.win || !b.blk)
		err = -ENOMEM;
	if (!err && ftruncate(b.fd, (off_t)n->size) != 0)
		err = -errno;
	if (!err)
		err = build_windows(&b);
	if (!err)
		err = seal(b.fd);
	give_buffer(s, b.win);
	give_buffer(s, b.blk);
	if (err) {
		close(b.fd);
		return err;
	}
	*out = b.fd;
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- the store --- */

int rs_snapshots_get(rs_snapshots *s, uint32_t node, rs_snapshot **out,
		     bool *reused)
{
	const rs_vnode *n = &s->tree->nodes[node];
	rs_snapshot *e;
	uint64_t t0;
	int err, fd = -1;

	pthread_mutex_lock(&s->lock);
	while ((e = s->table[node])) {
		if (e->ready) {
			if (e->refs++ == 0)
				idle_remove(s, e);
			s->stats.reuses++;
			pthread_mutex_unlock(&s->lock);
			if (reused)
				*reused = true;
			*out = e;
			return 0;
		}
		/* being built: wait for it, then look again */
		e->refs++;
		while (!e->ready && e->in_table)
			pthread_cond_wait(&s->built, &s->lock);
		e->refs--;
		if (!e->in_table && !e->ready) {
			err = e->error;
			if (e->refs == 0)
				entry_free(e);
			pthread_mutex_unlock(&s->lock);
			return err;
		}
	}
	if (n->size > s->max_size) {
		pthread_mutex_unlock(&s->lock);
		return -E2BIG;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		pthread_mutex_unlock(&s->lock);
		return -ENOMEM;
	}
	e->node = node;
	e->fd = -1;
	e->size = n->size;
	e->refs = 1;
	e->in_table = true;
	s->table[node] = e;
	pthread_mutex_unlock(&s->lock);

	/* Outside the lock: the cache may call reclaim, which takes it. */
	t0 = now_ns();
	err = rs_cache_charge(s->blocks->cache, n->size);
	if (!err) {
		err = build(s, n, &fd);
		if (err)
			rs_cache_uncharge(s->blocks->cache, n->size);
	}

	pthread_mutex_lock(&s->lock);
	if (err) {
		s->table[node] = NULL;
		e->in_table = false;
		e->error = err;
		if (err != -ENOSPC)
			s->stats.build_errors++;
		e->refs--;
		pthread_cond_broadcast(&s->built);
		if (e->refs == 0)
			entry_free(e);
		pthread_mutex_unlock(&s->lock);
		return err;
	}
	e->fd = fd;
	e->ready = true;
	s->stats.files++;
	s->stats.bytes += e->size;
	if (s->stats.bytes > s->stats.bytes_peak)
		s->stats.bytes_peak = s->stats.bytes;
	s->stats.builds++;
	s->stats.bytes_built += e->size;
	s->stats.build_ns += now_ns() - t0;
	pthread_cond_broadcast(&s->built);
	pthread_mutex_unlock(&s->lock);
	if (reused)
		*reused = false;
	*out = e;
	return 0;
}

void rs_snapshots_release(rs_snapshots *s, rs_snapshot *e)
{
	pthread_mutex_lock(&s->lock);
	if (--e->refs == 0)
		idle_push(s, e);
	pthread_mutex_unlock(&s->lock);
}

int rs_snapshot_fd(const rs_snapshot *e)
{
	return e->fd;
}

uint64_t rs_snapshot_size(const rs_snapshot *e)
{
	return e->size;
}

void rs_snapshots_drop(rs_snapshots *s, uint32_t node)
{
	rs_snapshot *e;
	uint64_t size = 0;
	bool dropped = false;

	pthread_mutex_lock(&s->lock);
	e = s->table[node];
	if (e && e->ready && e->refs == 0) {
		idle_remove(s, e);
		unlist(s, e);
		size = e->size;
		entry_free(e);
		dropped = true;
	}
	pthread_mutex_unlock(&s->lock);
	if (dropped)    /* outside the lock: the cache's comes first */
		rs_cache_uncharge(s->blocks->cache, size);
}

void rs_snapshots_get_stats(rs_snapshots *s, rs_snapshot_stats *st)
{
	pthread_mutex_lock(&s->lock);
	*st = s->stats;
	pthread_mutex_unlock(&s->lock);
}
