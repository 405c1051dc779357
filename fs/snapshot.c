/* Snapshots of view files; see snapshot.h. */
#include "fs/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fs/clock.h"
#include "fs/huge_tmpfs.h"
#include "fs/log.h"

/* Block-sized buffers kept for the next builds (a fresh 4 MiB buffer is a
 * fresh mapping, faulted and zeroed page by page); a part being built
 * takes two.  Keeping 8 instead measured 35% more daemon CPU time for 4
 * readers of a tp 2->8 view (1.6 s against 2.2 s, all of it in the
 * copies into the buffers), so the extra ones are freed. */
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
	rs_snapshot_pages pages;
	/* Decided at the first build (lock): the tmpfs, or -1 and why not. */
	int huge_mnt;           /* fs/huge_tmpfs.h */
	char small_because[96];
	rs_snapshot **table;    /* by node */
	rs_snapshot *idle_head, *idle_tail;   /* head: released last */
	uint8_t *spares[NSPARES];
	unsigned nspares;
	rs_snapshot_stats stats;
	/* The build threads and their queue (qlock; see "building"). */
	pthread_mutex_t qlock;
	pthread_cond_t work;        /* a job was queued, or stop */
	pthread_cond_t job_done;    /* a job's last part ended */
	struct build_job *queue;
	pthread_t threads[RS_SNAPSHOT_MAX_THREADS];
	unsigned nthreads;
	bool stopping;
	uint64_t parts, parts_on_threads;
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
		     const rs_vtree *tree, uint64_t max_size,
		     rs_snapshot_pages pages)
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
	pthread_mutex_init(&s->qlock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->job_done, NULL);
	s->blocks = blocks;
	s->tree = tree;
	s->max_size = max_size;
	s->pages = pages;
	s->huge_mnt = -1;
	rs_cache_set_reclaim(blocks->cache, reclaim, s);
	*out = s;
	return 0;
}

void rs_snapshots_free(rs_snapshots *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->qlock);
	s->stopping = true;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->qlock);
	for (unsigned i = 0; i < s->nthreads; i++)
		pthread_join(s->threads[i], NULL);
	rs_cache_set_reclaim(s->blocks->cache, NULL, NULL);
	for (uint32_t i = 0; i < s->tree->count; i++)
		if (s->table[i]) {
			rs_cache_uncharge(s->blocks->cache, s->table[i]->size);
			entry_free(s->table[i]);
		}
	for (unsigned i = 0; i < s->nspares; i++)
		free(s->spares[i]);
	free(s->table);
	if (s->huge_mnt >= 0)
		close(s->huge_mnt);
	pthread_cond_destroy(&s->job_done);
	pthread_cond_destroy(&s->work);
	pthread_mutex_destroy(&s->qlock);
	pthread_cond_destroy(&s->built);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* --- building --- */

/* A file is built window by window: the bytes of one RS_BLOCK_SIZE-aligned
 * window are assembled in a buffer and written with one pwrite (a write
 * that covers only part of a new shmem page makes the kernel zero the
 * rest of it first; whole windows never do).  A window holding nothing
 * but zero segments is not written: a hole, no memory.
 *
 * A file of more than PART_SIZE bytes is cut into parts of about that
 * size, and the parts are built side by side: by the opener and by the
 * store's build threads, which take parts of every build in progress from
 * one queue.  (A block build already spreads its gather over the
 * executor's threads.  Parts overlap the rest of a window's work: one
 * part's source ranges and gathers run while another part's pwrite into
 * the memfd does; the pwrites themselves take the file's inode lock in
 * turn.  Writing the parts through a shared mapping instead measured no
 * faster with 4-16 threads and half as fast with one: populating small
 * shmem pages is the limit either way, about 3 GB/s for one memfd on the
 * 16-core device machine; BENCHMARKS.md, "Build threads".  Hence the
 * huge-page tmpfs, fs/huge_tmpfs.h.)  A cut never
 * falls inside a tensor block, so every block is
 * still built once (amplification 1.00); of two parts writing either end
 * of one page, whichever comes first zeroes only the bytes the other
 * then writes. */
#define PART_SIZE (4 * (uint64_t)RS_BLOCK_SIZE)

typedef struct build_job build_job;
struct build_job {
	rs_snapshots *s;
	const rs_vnode *n;
	int fd;
	uint64_t *cuts;         /* part k is the file's [cuts[k], cuts[k+1]) */
	uint32_t nparts;
	uint32_t next;          /* the next part to take (s->qlock) */
	uint32_t running;       /* parts being built (s->qlock) */
	int error;              /* the first part's error (s->qlock) */
	build_job *qnext;       /* in the queue of jobs with parts left */
};

typedef struct {
	rs_snapshots *s;
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

/* The segment of file n holding byte `off` (n->nsegs when none does). */
static uint32_t segment_at(const rs_vnode *n, uint64_t off)
{
	uint32_t lo = 0, hi = n->nsegs;

	while (lo < hi) {       /* the first segment ending past off */
		uint32_t mid = lo + (hi - lo) / 2;
		const rs_segment *seg = &n->segs[mid];

		if (seg->offset + seg->length <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Bytes [from, to) of file n written to b->fd, window by window; the
 * windows after the first are RS_BLOCK_SIZE-aligned. */
static int build_range(builder *b, const rs_vnode *n, uint64_t from,
		       uint64_t to)
{
	uint32_t i = segment_at(n, from);
	uint64_t wend;

	for (b->base = from; b->base < to; b->base = wend) {
		wend = (b->base / RS_BLOCK_SIZE + 1) * RS_BLOCK_SIZE;
		if (wend > to)
			wend = to;
		b->len = wend - b->base;
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

/* Part k of job j, with buffers of its own. */
static int build_part(build_job *j, uint32_t k)
{
	builder b = { .s = j->s, .fd = j->fd };
	int err = 0;

	b.win = take_buffer(j->s);
	b.blk = take_buffer(j->s);
	if (!b.win || !b.blk)
		err = -ENOMEM;
	if (!err)
		err = build_range(&b, j->n, j->cuts[k], j->cuts[k + 1]);
	give_buffer(j->s, b.win);
	give_buffer(j->s, b.blk);
	return err;
}

/* Takes the next part of job j (s->qlock held): its index, or -1 when
 * none is left.  A job with an error has none left; a job with none left
 * leaves the queue. */
static int64_t take_part(rs_snapshots *s, build_job *j)
{
	int64_t k = -1;

	if (!j->error && j->next < j->nparts) {
		k = j->next++;
		j->running++;
	}
	if (j->error || j->next == j->nparts) {
		j->next = j->nparts;
		for (build_job **q = &s->queue; *q; q = &(*q)->qnext)
			if (*q == j) {
				*q = j->qnext;
				break;
			}
	}
	return k;
}

/* Part k of job j built, or failed (s->qlock held). */
static void part_done(rs_snapshots *s, build_job *j, int err)
{
	if (err && !j->error)
		j->error = err;
	if (--j->running == 0 && j->next == j->nparts)
		pthread_cond_broadcast(&s->job_done);
}

static void *build_thread(void *arg)
{
	rs_snapshots *s = arg;

	pthread_mutex_lock(&s->qlock);
	for (;;) {
		build_job *j;
		int64_t k;
		int err;

		while (!s->queue && !s->stopping)
			pthread_cond_wait(&s->work, &s->qlock);
		if (s->stopping)
			break;
		j = s->queue;
		k = take_part(s, j);
		if (k < 0)
			continue;
		pthread_mutex_unlock(&s->qlock);
		err = build_part(j, (uint32_t)k);
		pthread_mutex_lock(&s->qlock);
		s->parts_on_threads++;
		part_done(s, j, err);
	}
	pthread_mutex_unlock(&s->qlock);
	return NULL;
}

/* Where file n may be cut at or before `want` without a tensor block on
 * both sides: want itself outside tensor segments, else the start of the
 * block holding it; 0 when there is no such place past the segment's
 * start. */
static uint64_t cut_at(const rs_vnode *n, uint64_t want)
{
	uint32_t i = segment_at(n, want);
	const rs_segment *seg;
	uint64_t pos;

	if (i == n->nsegs)
		return want;
	seg = &n->segs[i];
	if (seg->kind != RS_SEG_TENSOR)
		return want;
	pos = seg->u.tensor.offset + (want - seg->offset);
	pos -= pos % RS_BLOCK_SIZE;
	if (pos > seg->u.tensor.offset)
		return seg->offset + (pos - seg->u.tensor.offset);
	/* the segment's first block: cut before the segment, unless the
	 * segment before holds the start of that block */
	if (seg->u.tensor.offset % RS_BLOCK_SIZE && i > 0 &&
	    n->segs[i - 1].kind == RS_SEG_TENSOR &&
	    n->segs[i - 1].u.tensor.chunk == seg->u.tensor.chunk)
		return 0;
	return seg->offset;
}

/* The parts of file n into j->cuts. */
static int cut_parts(build_job *j, const rs_vnode *n)
{
	uint64_t most = n->size / PART_SIZE + 2;

	j->cuts = malloc(most * sizeof(*j->cuts));
	if (!j->cuts)
		return -ENOMEM;
	j->cuts[0] = 0;
	j->nparts = 0;
	for (uint64_t want = PART_SIZE; want < n->size; want += PART_SIZE) {
		uint64_t c = cut_at(n, want);

		if (c > j->cuts[j->nparts] && c < n->size)
			j->cuts[++j->nparts] = c;
	}
	j->cuts[++j->nparts] = n->size;
	return 0;
}

/* Every part of job j built: by this thread, and by the build threads
 * when there are parts for them.  0 or the first part's error. */
static int build_parts(rs_snapshots *s, build_job *j)
{
	int64_t k;
	int err;

	pthread_mutex_lock(&s->qlock);
	if (j->nparts > 1 && s->nthreads) {
		j->qnext = s->queue;    /* newest first: its opener waits */
		s->queue = j;
		pthread_cond_broadcast(&s->work);
	}
	while ((k = take_part(s, j)) >= 0) {
		pthread_mutex_unlock(&s->qlock);
		err = build_part(j, (uint32_t)k);
		pthread_mutex_lock(&s->qlock);
		part_done(s, j, err);
	}
	while (j->running)
		pthread_cond_wait(&s->job_done, &s->qlock);
	s->parts += j->nparts;
	err = j->error;
	pthread_mutex_unlock(&s->qlock);
	return err;
}

/* A finished memfd sealed: it cannot be written, grown or shrunk again. */
static int seal(int fd)
{
	return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
		     F_SEAL_WRITE | F_SEAL_SEAL) == 0 ? 0 : -errno;
}

/* A file made on the tmpfs and reopened read-only: 0 or its error. */
static int probe_tmpfs(int mnt)
{
	int fd, ro, err;

	err = rs_huge_tmpfs_file(mnt, &fd);
	if (err)
		return err;
	err = rs_huge_tmpfs_read_only(fd, &ro);
	close(err ? fd : ro);
	return err;
}

/* Why snapshots go into memfds (small pages, unless the machine's shmem
 * THP setting says otherwise), or "" for the huge-page tmpfs: decided
 * once, at the first build (a mount that never builds a snapshot makes no
 * tmpfs).  Lock held. */
static void decide_pages(rs_snapshots *s)
{
	char *why = s->small_because;
	size_t size = sizeof(s->small_because);
	int r;

	if (s->pages == RS_PAGES_SMALL) {
		snprintf(why, size, "-o snapshot_pages=small");
		return;
	}
	if (s->pages == RS_PAGES_AUTO) {
		r = rs_free_page_reporting(RS_BALLOON_DRIVER_DIR);
		if (r > 0)
			snprintf(why, size, "virtio-balloon free page reporting");
		else if (r < 0)
			snprintf(why, size, "virtio-balloon features unreadable: %s",
				 strerror(-r));
		if (r)
			return;
	}
	r = rs_huge_tmpfs_new(&s->huge_mnt);
	if (r) {
		s->huge_mnt = -1;
		snprintf(why, size, "no private tmpfs: %s", strerror(-r));
		return;
	}
	/* Once, what every build needs: a file, and its read-only reopening
	 * (through /proc), so that no build fails for want of them. */
	r = probe_tmpfs(s->huge_mnt);
	if (r) {
		close(s->huge_mnt);
		s->huge_mnt = -1;
		snprintf(why, size, "no read-only reopening on the private tmpfs: %s",
			 strerror(-r));
	}
}

/* The huge-page tmpfs, or -1: memfds.  Undecided while neither is set:
 * decide_pages always sets one. */
static int huge_mnt(rs_snapshots *s)
{
	bool first;
	int mnt;

	pthread_mutex_lock(&s->lock);
	first = s->huge_mnt < 0 && !s->small_because[0];
	if (first)
		decide_pages(s);
	mnt = s->huge_mnt;
	pthread_mutex_unlock(&s->lock);
	if (first && mnt < 0)
		rs_log(RS_LOG_INFO, "snapshots in memfds (%s)", s->small_because);
	return mnt;
}

/* Every byte of file n into a new file that nothing can write once built
 * (a sealed memfd, or a huge-page tmpfs file reopened read-only): *fd on
 * success. */
static int build(rs_snapshots *s, const rs_vnode *n, int *out)
{
	build_job j = { .s = s, .n = n };
	int mnt = huge_mnt(s), err = 0;

	if (mnt >= 0) {
		err = rs_huge_tmpfs_file(mnt, &j.fd);
		if (err)
			return err;
	} else {
		j.fd = memfd_create("reshardfs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (j.fd < 0)
			return -errno;
	}
	/* The size first: huge=within_size takes a huge page only for a
	 * range inside the file's size. */
	if (ftruncate(j.fd, (off_t)n->size) != 0)
		err = -errno;
	if (!err)
		err = cut_parts(&j, n);
	if (!err)
		err = build_parts(s, &j);
	if (!err)
		err = mnt >= 0 ? rs_huge_tmpfs_read_only(j.fd, &j.fd) : seal(j.fd);
	free(j.cuts);
	if (err) {
		close(j.fd);
		return err;
	}
	*out = j.fd;
	return 0;
}

int rs_snapshots_start(rs_snapshots *s, unsigned threads)
{
	int err = 0;

	if (threads > RS_SNAPSHOT_MAX_THREADS)
		threads = RS_SNAPSHOT_MAX_THREADS;
	pthread_mutex_lock(&s->qlock);
	while (s->nthreads < threads && !err) {
		err = -pthread_create(&s->threads[s->nthreads], NULL,
				      build_thread, s);
		if (!err)
			s->nthreads++;
	}
	pthread_mutex_unlock(&s->qlock);
	return err;
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
	t0 = rs_now_ns();
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
	s->stats.build_ns += rs_now_ns() - t0;
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
	st->huge_pages = s->huge_mnt >= 0;
	memcpy(st->small_because, s->small_because, sizeof(st->small_because));
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_lock(&s->qlock);
	st->parts = s->parts;
	st->parts_on_threads = s->parts_on_threads;
	st->build_threads = s->nthreads;
	pthread_mutex_unlock(&s->qlock);
}
