/* memfd snapshots of view files; see snapshot.h. */
#include "fs/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <time.h>
#include <unistd.h>

/* Source bytes copied between one pair of checks: a check is one fstat,
 * so this only bounds how much work a change found at the end throws
 * away. */
#define SOURCE_PIECE (64ull << 20)
/* Block buffers kept for the next builds (a fresh 4 MiB buffer is a fresh
 * mapping, faulted and zeroed page by page). */
#define NSPARES 2

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
	uint64_t src_off, len, dst_off;
	int fd;
} source_copy;

/* A gather for rs_blocks_gather: the range copied from the source file
 * into the memfd by the kernel.  sendfile returns once the bytes are in
 * the memfd's own pages (it copies out of the source's page cache, unlike
 * a splice into a pipe, which only takes references: fs/read.c), so the
 * check after it covers every byte.  A source that ends first is -EIO. */
static int copy_source(void *arg)
{
	source_copy *sc = arg;
	off_t in = (off_t)sc->src_off;
	uint64_t left = sc->len;
	int src, err = rs_sources_fd(sc->sources, sc->source, &src);

	if (err)
		return err;
	if (lseek(sc->fd, (off_t)sc->dst_off, SEEK_SET) < 0)
		return -errno;
	while (left) {
		ssize_t n = sendfile(sc->fd, src, &in, left);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		left -= (uint64_t)n;
	}
	rs_sources_count_read(sc->sources, sc->len);
	return 0;
}

static int build_source(rs_snapshots *s, int fd, const rs_segment *seg)
{
	rs_sources *sources = s->blocks->sources;
	rs_source_set set = { 0 };
	int err = rs_source_set_add(&set, seg->u.source.index);

	for (uint64_t done = 0; !err && done < seg->length;) {
		source_copy sc = { sources, seg->u.source.index,
				   seg->u.source.offset + done, 0,
				   seg->offset + done, fd };

		sc.len = seg->length - done < SOURCE_PIECE ? seg->length - done
							   : SOURCE_PIECE;
		err = rs_blocks_gather(s->blocks, &set, copy_source, &sc);
		done += sc.len;
	}
	rs_source_set_free(&set);
	return err;
}

/* A tensor segment: the blocks of its chunk that it overlaps, each built
 * whole (blocks are where the plan may be sliced) into buf, and the
 * overlapping part written to the memfd. */
static int build_tensor(rs_snapshots *s, int fd, const rs_segment *seg,
			uint8_t *buf)
{
	const rs_chunk *c = seg->u.tensor.chunk;
	uint64_t from = seg->u.tensor.offset, to = from + seg->length;

	for (uint64_t k = from / RS_BLOCK_SIZE; k * RS_BLOCK_SIZE < to; k++) {
		uint64_t begin = k * RS_BLOCK_SIZE;
		uint64_t lo = from > begin ? from : begin;
		uint64_t end = begin + rs_blocks_block_len(c, k);
		uint64_t hi = to < end ? to : end;
		int err = rs_blocks_build_into(s->blocks, c, k, buf);

		if (!err)
			err = pwrite_full(fd, buf + (lo - begin), hi - lo,
					  seg->offset + (lo - from));
		if (err)
			return err;
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

/* Every byte of file n into a new sealed memfd: *fd on success. */
static int build(rs_snapshots *s, const rs_vnode *n, int *out)
{
	uint8_t *buf = NULL;
	int err = 0, fd;

	fd = memfd_create("reshardfs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)n->size) != 0)
		err = -errno;
	for (uint32_t i = 0; i < n->nsegs && !err; i++) {
		const rs_segment *seg = &n->segs[i];

		switch (seg->kind) {
		case RS_SEG_LITERAL:
			err = pwrite_full(fd, seg->u.bytes, seg->length,
					  seg->offset);
			break;
		case RS_SEG_ZERO:
			break;          /* a hole reads as zeros */
		case RS_SEG_SOURCE:
			err = build_source(s, fd, seg);
			break;
		case RS_SEG_TENSOR:
			if (!buf && !(buf = take_buffer(s)))
				err = -ENOMEM;
			if (!err)
				err = build_tensor(s, fd, seg, buf);
			break;
		}
	}
	give_buffer(s, buf);
	if (!err && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
			  F_SEAL_WRITE | F_SEAL_SEAL) != 0)
		err = -errno;
	if (err) {
		close(fd);
		return err;
	}
	*out = fd;
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
