#include "fs/cache.h"

#include <errno.h>
#include <lz4.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 65536u

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
	bool compress;
	rs_cache_stats stats;
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

static void block_free(rs_block *b)
{
	free(b->data);
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
		block_free(b);
}

/* Least recently used hot block nobody holds, or NULL. */
static rs_block *hot_victim(rs_cache *c)
{
	for (rs_block *b = c->hot.tail; b; b = b->prev)
		if (b->refs == 0)
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
		free(b->data);
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
		rs_block *b = hot_victim(c);

		if (!b || b->len > INT32_MAX)
			break;
		pack(c, b);
	}
	while (c->bytes > c->budget) {
		rs_block *b = c->cold.tail;

		while (b && b->refs)
			b = b->prev;
		if (!b)
			b = hot_victim(c);
		if (!b)
			break; /* everything left is in use */
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

			block_free(b);
			b = next;
		}
	}
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
	uint8_t *data = malloc(b->len ? b->len : 1);
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
		free(data);
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
				block_free(b);
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
				block_free(b);
			if (err == -ENOMEM)
				continue; /* a failed unpack: build it anew */
			pthread_mutex_unlock(&c->lock);
			return err;
		}
	}

	/* Miss: reserve the bytes, publish a BUILDING block, build unlocked. */
	b = calloc(1, sizeof(*b));
	if (b)
		b->data = malloc(len ? len : 1);
	if (!b || !b->data) {
		if (b)
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
	c->bytes += len;
	c->stats.blocks++;
	c->stats.misses++;
	make_room(c);
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

const uint8_t *rs_block_data(const rs_block *b)
{
	return b->data;
}

uint64_t rs_block_len(const rs_block *b)
{
	return b->len;
}

void rs_cache_release(rs_cache *c, rs_block *b)
{
	pthread_mutex_lock(&c->lock);
	if (--b->refs == 0 && !b->in_table) {
		block_free(b);
	} else if (b->refs == 0 && c->bytes > c->budget) {
		make_room(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void rs_cache_get_stats(rs_cache *c, rs_cache_stats *s)
{
	pthread_mutex_lock(&c->lock);
	*s = c->stats;
	s->bytes = c->bytes;
	pthread_mutex_unlock(&c->lock);
}
