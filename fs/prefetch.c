/* Prefetch threads and their bounded queue; see prefetch.h. */
#include "fs/prefetch.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fs/fs.h"

#define QUEUE_LEN 64
/* Files of a directory the window may run into past the reader's own. */
#define MAX_NEXT_FILES 4

typedef struct {
	const rs_chunk *chunk;   /* a block to build */
	uint64_t index;
} request;

struct rs_prefetch {
	rs_fs *fs;
	pthread_t *threads;
	unsigned nthreads;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	request queue[QUEUE_LEN];
	unsigned head, count;
	bool stop;
	_Atomic uint64_t blocks;
	/* One bit per block of the tree's chunks, set once reads took the
	 * block whole; chunk i's blocks start at bit first[i] (chunk ids are
	 * their indices in the tree). */
	uint64_t *first;
	size_t nchunks;
	_Atomic uint64_t *read_whole;
};

static uint64_t nblocks(const rs_chunk *c)
{
	return (c->size + RS_BLOCK_SIZE - 1) / RS_BLOCK_SIZE;
}

static bool was_read_whole(rs_prefetch *p, const rs_chunk *c, uint64_t b)
{
	uint64_t bit;

	if (c->id >= p->nchunks || b >= nblocks(c))
		return false;
	bit = p->first[c->id] + b;

	return atomic_load_explicit(&p->read_whole[bit / 64],
				    memory_order_relaxed) & (1ull << (bit % 64));
}

void rs_prefetch_read_whole(rs_prefetch *p, const rs_chunk *c,
			    uint64_t index)
{
	uint64_t bit;

	if (!p || c->id >= p->nchunks || index >= nblocks(c))
		return;
	bit = p->first[c->id] + index;
	atomic_fetch_or_explicit(&p->read_whole[bit / 64], 1ull << (bit % 64),
				 memory_order_relaxed);
}

static bool same(const request *a, const request *b)
{
	return a->chunk == b->chunk && a->index == b->index;
}

/* Queues a request unless full or already queued (lock taken here). */
static void enqueue(rs_prefetch *p, const request *r)
{
	pthread_mutex_lock(&p->lock);
	if (p->count < QUEUE_LEN && !p->stop) {
		bool dup = false;

		for (unsigned i = 0; i < p->count && !dup; i++)
			dup = same(&p->queue[(p->head + i) % QUEUE_LEN], r);
		if (!dup) {
			p->queue[(p->head + p->count++) % QUEUE_LEN] = *r;
			pthread_cond_signal(&p->cond);
		}
	}
	pthread_mutex_unlock(&p->lock);
}

static void run(rs_prefetch *p, const request *r)
{
	rs_block *blk;

	if (rs_blocks_get(&p->fs->blocks, r->chunk, r->index, &blk) == 0) {
		rs_cache_release(p->fs->blocks.cache, blk);
		atomic_fetch_add(&p->blocks, 1);
	}
}

static void *worker(void *arg)
{
	rs_prefetch *p = arg;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->count && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->stop)
			break;
		request r = p->queue[p->head];

		p->head = (p->head + 1) % QUEUE_LEN;
		p->count--;
		pthread_mutex_unlock(&p->lock);
		run(p, &r);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* Queues what [from, from+len) of one file needs; returns the bytes of the
 * window it covered (up to the end of the file). */
static uint64_t window_in_file(rs_prefetch *p, const rs_vnode *n,
			       uint64_t from, uint64_t len)
{
	uint64_t end = n->size - from < len ? n->size : from + len;

	if (from >= n->size)
		return 0;
	for (uint32_t i = rs_vtree_find_segment(n, from);
	     i < n->nsegs && n->segs[i].offset < end; i++) {
		const rs_segment *s = &n->segs[i];
		uint64_t lo = from > s->offset ? from - s->offset : 0;
		uint64_t hi = end - s->offset < s->length ? end - s->offset
							  : s->length;
		request r = { 0 };

		if (s->kind == RS_SEG_TENSOR) {
			const rs_chunk *c = s->u.tensor.chunk;
			uint64_t first = (s->u.tensor.offset + lo) / RS_BLOCK_SIZE;
			uint64_t last = (s->u.tensor.offset + hi - 1) / RS_BLOCK_SIZE;

			for (uint64_t b = first; b <= last; b++) {
				if (was_read_whole(p, c, b) ||
				    rs_cache_has(p->fs->blocks.cache, c->id, b))
					continue;
				r.chunk = c;
				r.index = b;
				enqueue(p, &r);
			}
		}
	}
	return end - from;
}

/* Position of `node` among its parent's children. */
static uint32_t position(const rs_vtree *t, uint32_t node)
{
	const rs_vnode *dir = &t->nodes[t->nodes[node].parent];
	uint32_t pos = 0;

	while (pos < dir->nchildren && dir->children[pos] != node)
		pos++;
	return pos;
}

uint32_t rs_prefetch_prev_sibling(const rs_vtree *t, uint32_t node)
{
	uint32_t pos;

	if (node == 0)
		return UINT32_MAX;
	pos = position(t, node);
	return pos > 0 && pos < t->nodes[t->nodes[node].parent].nchildren
		       ? t->nodes[t->nodes[node].parent].children[pos - 1]
		       : UINT32_MAX;
}

void rs_prefetch_window(rs_prefetch *p, uint32_t node, uint64_t from,
			uint64_t len, bool into_next)
{
	const rs_vtree *t;
	const rs_vnode *dir;
	uint32_t pos;

	if (!p)
		return;
	t = &p->fs->tree;
	len -= window_in_file(p, &t->nodes[node], from, len);
	if (len == 0 || node == 0 || !into_next)
		return;
	/* Past the end: the next files of the directory, in readdir order. */
	dir = &t->nodes[t->nodes[node].parent];
	pos = position(t, node);
	for (unsigned k = 0; k < MAX_NEXT_FILES && len && ++pos < dir->nchildren;
	     k++) {
		const rs_vnode *next = &t->nodes[dir->children[pos]];

		if (next->is_dir)
			break;
		len -= window_in_file(p, next, 0, len);
	}
}

uint64_t rs_prefetch_blocks(const rs_prefetch *p)
{
	return p ? atomic_load(&((rs_prefetch *)p)->blocks) : 0;
}

int rs_prefetch_start(rs_prefetch **out, rs_fs *fs, unsigned threads)
{
	rs_prefetch *p = calloc(1, sizeof(*p));
	const rs_vtree *t = &fs->tree;
	uint64_t bits = 0;

	if (!p)
		return -ENOMEM;
	p->fs = fs;
	p->first = calloc(t->nchunks ? t->nchunks : 1, sizeof(*p->first));
	for (size_t i = 0; p->first && i < t->nchunks; i++) {
		p->first[i] = bits;
		bits += nblocks(t->chunks[i]);
	}
	p->nchunks = t->nchunks;
	p->read_whole = calloc(bits / 64 + 1, sizeof(*p->read_whole));
	p->threads = calloc(threads ? threads : 1, sizeof(pthread_t));
	if (!p->first || !p->read_whole || !p->threads) {
		free(p->first);
		free((void *)p->read_whole);
		free(p->threads);
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	for (unsigned i = 0; i < threads; i++) {
		if (pthread_create(&p->threads[i], NULL, worker, p) != 0)
			break;
		p->nthreads++;
	}
	if (p->nthreads == 0) {
		rs_prefetch_stop(p);
		return -EAGAIN;
	}
	*out = p;
	return 0;
}

void rs_prefetch_stop(rs_prefetch *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->threads);
	free(p->first);
	free((void *)p->read_whole);
	free(p);
}
