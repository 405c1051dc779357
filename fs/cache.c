#include "fs/cache.h"

#include <errno.h>
#include <lz4.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 65536u
/* Freed block buffers kept for the next build: a fresh multi-MiB malloc is
 * a fresh mapping, and faulting in and zeroing its pages cost more than the
 * gather that fills it (perf, BENCHMARKS.md).  At most this many, outside
 * the budget. */
#define NSPARES 4

typedef enum {
	BLOCK_BUILDING,   /* being built or decompressed; data not valid yet */
	BLOCK_READY,      /* raw data valid, on the hot list */
	BLOCK_PACKING,    /* being compressed; raw data still valid */
	BLOCK_COLD,       /* only the compressed copy, on the cold list */
} block_state;

struct rs_block {
	uint64_t chunk, index, len;
	uint8_t *data;
	uint8_t *packed;
	uint64_t packed_len;
	block_state state;
	int refs;
	uint64_t taken;         /* bytes reads took from it (rs_cache_mark_read) */
	int error;              /* why a failed build failed, for waiters */
	bool in_table;
	rs_block *hnext;
	rs_block *prev, *next;  /* hot or cold list, by state */
};

typedef struct {
	rs_block *head, *tail;  /* head: most recently used */
} block_list;

struct rs_cache {
	pthread_mutex_t lock;
	pthread_cond_t changed;  /* a build, unpack or pack finished */
	rs_block *buckets[NBUCKETS];
	block_list hot, cold;
	uint64_t budget, bytes, hot_bytes;
	uint64_t charged;       /* rs_cache_charge: counted in the budget */
	rs_cache_reclaim reclaim;
	void *reclaim_arg;
	bool compress;
	rs_cache_stats stats;
	struct { uint8_t *data; uint64_t len; } spares[NSPARES];
	unsigned nspares;
};

static size_t bucket_of(uint64_t chunk, uint64_t index)
{
	uint64_t h = chunk * 0x9E3779B97F4A7C15ull ^ (index + 0x632BE59BD9B4E019ull);

	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	return (size_t)(h >> 32) & (NBUCKETS - 1);
}

static void list_remove(block_list *l, rs_block *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		l->head = b->next;
	if (b->next)
		b->next->prev = b->prev;
	else
		l->tail = b->prev;
	b->prev = b->next = NULL;
}

static void list_push_front(block_list *l, rs_block *b)
{
	b->prev = NULL;
	b->next = l->head;
	if (l->head)
		l->head->prev = b;
	l->head = b;
	if (!l->tail)
		l->tail = b;
}

static void table_remove(rs_cache *c, rs_block *b)
{
	rs_block **pp = &c->buckets[bucket_of(b->chunk, b->index)];

	for (; *pp; pp = &(*pp)->hnext)
		if (*pp == b) {
			*pp = b->hnext;
			break;
		}
	b->in_table = false;
}

/* A buffer of `len` bytes: a spare of exactly that size if there is one
 * (a bigger one would hold more memory than the budget counts). */
static uint8_t *data_take(rs_cache *c, uint64_t len)
{
	for (unsigned i = 0; i < c->nspares; i++)
		if (c->spares[i].len == len) {
			uint8_t *d = c->spares[i].data;

			c->spares[i] = c->spares[--c->nspares];
			return d;
		}
	return malloc(len ? len : 1);
}

/* Keeps a freed buffer as a spare, replacing the oldest when full. */
static void data_give(rs_cache *c, uint8_t *data, uint64_t len)
{
	if (!data)
		return;
	if (c->nspares == NSPARES) {
		free(c->spares[0].data);
		memmove(&c->spares[0], &c->spares[1],
			(NSPARES - 1) * sizeof(c->spares[0]));
		c->nspares--;
	}
	c->spares[c->nspares].data = data;
	c->spares[c->nspares++].len = len;
}

/* Frees a block (lock held); its buffer may become a spare. */
static void block_free(rs_cache *c, rs_block *b)
{
	data_give(c, b->data, b->len);
	free(b->packed);
	free(b);
}

/* Removes a block from the cache, whatever its state; it is freed now or
 * by its last release. */
static void drop(rs_cache *c, rs_block *b)
{
	if (b->state == BLOCK_READY)
		list_remove(&c->hot, b);
	else if (b->state == BLOCK_COLD)
		list_remove(&c->cold, b);
	if (b->state == BLOCK_READY || b->state == BLOCK_PACKING)
		c->hot_bytes -= b->len;
	if (b->state == BLOCK_COLD)
		c->stats.cold_blocks--;
	if (b->data)
		c->bytes -= b->len;
	if (b->packed)
		c->bytes -= b->packed_len;
	c->stats.blocks--;
	table_remove(c, b);
	if (b->refs == 0)
		block_free(c, b);
}

/* Least recently used hot block nobody holds, or NULL. */
static rs_block *hot_victim(rs_cache *c)
{
	for (rs_block *b = c->hot.tail; b; b = b->prev)
		if (b->refs == 0)
			return b;
	return NULL;
}

/* Least recently used block, hot or cold, nobody holds and every byte of
 * which reads have taken, or NULL: the first to go.  Its bytes are in the
 * readers' page cache now, and loaders read each byte once, while a block
 * only partly read is usually waiting for the rest of a read that the
 * kernel's readahead began (a torch.load reading a zip's tail builds the
 * block holding it, then reads the data in front of it later): evicted
 * first, it would be built twice. */
static rs_block *read_victim(rs_cache *c)
{
	for (rs_block *b = c->hot.tail; b; b = b->prev)
		if (b->refs == 0 && b->taken >= b->len)
			return b;
	for (rs_block *b = c->cold.tail; b; b = b->prev)
		if (b->refs == 0 && b->taken >= b->len)
			return b;
	return NULL;
}

/* Compresses a hot block into the cold list, outside the lock. */
static void pack(rs_cache *c, rs_block *b)
{
	int bound = LZ4_compressBound((int)b->len);
	uint8_t *packed = bound > 0 ? malloc((size_t)bound) : NULL;
	int n = 0;

	list_remove(&c->hot, b);
	c->hot_bytes -= b->len;
	b->state = BLOCK_PACKING;
	b->refs++;
	pthread_mutex_unlock(&c->lock);
	if (packed)
		n = LZ4_compress_default((const char *)b->data, (char *)packed,
					 (int)b->len, bound);
	pthread_mutex_lock(&c->lock);
	b->refs--;
	if (n > 0 && (uint64_t)n <= b->len - b->len / 8) {
		uint8_t *shrunk = realloc(packed, (size_t)n);

		b->packed = shrunk ? shrunk : packed;
		b->packed_len = (uint64_t)n;
		c->bytes += b->packed_len;
		c->bytes -= b->len;
		data_give(c, b->data, b->len);
		b->data = NULL;
		b->state = BLOCK_COLD;
		c->stats.cold_blocks++;
		list_push_front(&c->cold, b);
	} else {
		free(packed);
		c->stats.evictions++;
		drop(c, b); /* incompressible: evicted like any other */
	}
	pthread_cond_broadcast(&c->changed);
}

/* Evicts until the budget holds (lock held; may drop it while packing). */
static void make_room(rs_cache *c)
{
	while (c->compress && c->hot_bytes > c->budget / 2) {
		rs_block *b = read_victim(c);

		if (b && b->state == BLOCK_READY) {
			c->stats.evictions++;   /* read: dropped, not packed */
			drop(c, b);
			continue;
		}
		b = hot_victim(c);
		if (!b || b->len > INT32_MAX)
			break;
		pack(c, b);
	}
	while (c->bytes + c->charged > c->budget) {
		rs_block *b = read_victim(c);

		if (!b)
			b = c->cold.tail;
		while (b && b->refs)
			b = b->prev;
		if (!b)
			b = hot_victim(c);
		if (!b) {
			/* every block left is in use: charged bytes next */
			uint64_t want = c->bytes + c->charged - c->budget;
			uint64_t freed = c->reclaim && c->charged
				? c->reclaim(c->reclaim_arg, want) : 0;

			if (!freed)
				break; /* everything left is in use */
			c->charged -= freed < c->charged ? freed : c->charged;
			continue;
		}
		c->stats.evictions++;
		drop(c, b);
	}
}

int rs_cache_new(rs_cache **out, uint64_t budget, bool compress)
{
	rs_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->changed, NULL);
	c->budget = budget;
	c->compress = compress;
	c->stats.budget = budget;
	*out = c;
	return 0;
}

void rs_cache_free(rs_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < NBUCKETS; i++) {
		rs_block *b = c->buckets[i];

		while (b) {
			rs_block *next = b->hnext;

			block_free(c, b);
			b = next;
		}
	}
	for (unsigned i = 0; i < c->nspares; i++)
		free(c->spares[i].data);
	pthread_cond_destroy(&c->changed);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static rs_block *find(rs_cache *c, uint64_t chunk, uint64_t index)
{
	for (rs_block *b = c->buckets[bucket_of(chunk, index)]; b; b = b->hnext)
		if (b->chunk == chunk && b->index == index)
			return b;
	return NULL;
}

/* Turns a cold block back into a hot one (lock held on entry and exit;
 * dropped while decompressing, with the block marked BUILDING so others
 * wait).  The caller holds a reference. */
static int unpack(rs_cache *c, rs_block *b)
{
	uint8_t *data = data_take(c, b->len);
	int n = -1;

	list_remove(&c->cold, b);
	c->stats.cold_blocks--;
	b->state = BLOCK_BUILDING;
	pthread_mutex_unlock(&c->lock);
	if (data)
		n = LZ4_decompress_safe((const char *)b->packed, (char *)data,
					(int)b->packed_len, (int)b->len);
	pthread_mutex_lock(&c->lock);
	if (n < 0 || (uint64_t)n != b->len) {
		/* Out of memory: forget the block; the caller rebuilds it. */
		data_give(c, data, b->len);
		b->error = -ENOMEM;
		drop(c, b);
		pthread_cond_broadcast(&c->changed);
		return -EAGAIN;
	}
	c->bytes -= b->packed_len;
	free(b->packed);
	b->packed = NULL;
	b->data = data;
	c->bytes += b->len;
	c->hot_bytes += b->len;
	b->state = BLOCK_READY;
	list_push_front(&c->hot, b);
	pthread_cond_broadcast(&c->changed);
	return 0;
}

int rs_cache_get(rs_cache *c, uint64_t chunk, uint64_t index, uint64_t len,
		 rs_block_build build, void *arg, rs_block **out)
{
	rs_block *b;
	int err;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		b = find(c, chunk, index);
		if (!b)
			break;
		if (b->state == BLOCK_READY || b->state == BLOCK_PACKING) {
			if (b->state == BLOCK_READY) {
				list_remove(&c->hot, b);
				list_push_front(&c->hot, b);
			}
			b->refs++;
			c->stats.hits++;
			pthread_mutex_unlock(&c->lock);
			*out = b;
			return 0;
		}
		if (b->state == BLOCK_COLD) {
			b->refs++;
			err = unpack(c, b);
			b->refs--;
			if (err == 0) {
				b->refs++;
				c->stats.hits++;
				make_room(c);
				pthread_mutex_unlock(&c->lock);
				*out = b;
				return 0;
			}
			if (b->refs == 0 && !b->in_table)
				block_free(c, b);
			continue;
		}
		/* Someone is building it: wait for them, then look again. */
		b->refs++;
		while (b->state == BLOCK_BUILDING && b->in_table)
			pthread_cond_wait(&c->changed, &c->lock);
		b->refs--;
		if (b->in_table && b->state == BLOCK_READY) {
			b->refs++;
			c->stats.hits++;
			pthread_mutex_unlock(&c->lock);
			*out = b;
			return 0;
		}
		if (!b->in_table) {
			/* The build failed: report its error, do not retry. */
			err = b->error ? b->error : -EIO;
			if (b->refs == 0)
				block_free(c, b);
			if (err == -ENOMEM)
				continue; /* a failed unpack: build it anew */
			pthread_mutex_unlock(&c->lock);
			return err;
		}
	}

	/* Miss: reserve the bytes (evicting first, so that an evicted buffer
	 * can be reused), publish a BUILDING block, build unlocked. */
	b = calloc(1, sizeof(*b));
	if (!b) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	c->bytes += len;
	make_room(c);
	b->data = data_take(c, len);
	if (!b->data) {
		c->bytes -= len;
		free(b);
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	b->chunk = chunk;
	b->index = index;
	b->len = len;
	b->state = BLOCK_BUILDING;
	b->refs = 1;
	b->in_table = true;
	b->hnext = c->buckets[bucket_of(chunk, index)];
	c->buckets[bucket_of(chunk, index)] = b;
	c->stats.blocks++;
	c->stats.misses++;
	pthread_mutex_unlock(&c->lock);

	err = build(arg, b->data, len);

	pthread_mutex_lock(&c->lock);
	if (err) {
		b->error = err;
		b->refs--;
		drop(c, b);
		pthread_cond_broadcast(&c->changed);
		pthread_mutex_unlock(&c->lock);
		return err;
	}
	b->state = BLOCK_READY;
	c->hot_bytes += len;
	list_push_front(&c->hot, b);
	pthread_cond_broadcast(&c->changed);
	make_room(c);
	pthread_mutex_unlock(&c->lock);
	*out = b;
	return 0;
}

bool rs_cache_has(rs_cache *c, uint64_t chunk, uint64_t index)
{
	bool has;

	pthread_mutex_lock(&c->lock);
	has = find(c, chunk, index) != NULL;
	pthread_mutex_unlock(&c->lock);
	return has;
}

const uint8_t *rs_block_data(const rs_block *b)
{
	return b->data;
}

uint64_t rs_block_len(const rs_block *b)
{
	return b->len;
}

bool rs_cache_mark_read(rs_cache *c, rs_block *b, uint64_t bytes)
{
	bool whole;

	pthread_mutex_lock(&c->lock);
	whole = b->taken < b->len && b->taken + bytes >= b->len;
	b->taken += bytes;
	pthread_mutex_unlock(&c->lock);
	return whole;
}

void rs_cache_release(rs_cache *c, rs_block *b)
{
	pthread_mutex_lock(&c->lock);
	if (--b->refs == 0 && !b->in_table) {
		block_free(c, b);
	} else if (b->refs == 0 && c->bytes + c->charged > c->budget) {
		make_room(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void rs_cache_get_stats(rs_cache *c, rs_cache_stats *s)
{
	pthread_mutex_lock(&c->lock);
	*s = c->stats;
	s->bytes = c->bytes;
	s->charged = c->charged;
	pthread_mutex_unlock(&c->lock);
}

void rs_cache_set_reclaim(rs_cache *c, rs_cache_reclaim fn, void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->reclaim = fn;
	c->reclaim_arg = arg;
	pthread_mutex_unlock(&c->lock);
}

int rs_cache_charge(rs_cache *c, uint64_t bytes)
{
	int err = 0;

	pthread_mutex_lock(&c->lock);
	if (bytes > c->budget) {
		err = -ENOSPC;
	} else {
		c->charged += bytes;
		make_room(c);
		if (c->bytes + c->charged > c->budget) {
			c->charged -= bytes;   /* held by blocks and charges in use */
			err = -ENOSPC;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

void rs_cache_uncharge(rs_cache *c, uint64_t bytes)
{
	pthread_mutex_lock(&c->lock);
	c->charged -= bytes < c->charged ? bytes : c->charged;
	pthread_mutex_unlock(&c->lock);
}
