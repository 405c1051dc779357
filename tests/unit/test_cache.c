/* Block cache: budget, LRU eviction (blocks read whole first), single
 * flight, failed builds, lz4; bytes charged from outside, and their
 * reclaim. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/cache.h"
#include "tests/unit/check.h"

#define LEN (64u << 10)

static atomic_int builds;

/* Fills a block with a pattern derived from its key (compressible when
 * arg says so). */
static int fill(void *arg, uint8_t *buf, uint64_t len)
{
	uintptr_t key = (uintptr_t)arg;

	atomic_fetch_add(&builds, 1);
	for (uint64_t i = 0; i < len; i++)
		buf[i] = (uint8_t)((key & 1) ? key : (key * 31 + i * 7 + (i >> 8)));
	return 0;
}

static int fill_slow(void *arg, uint8_t *buf, uint64_t len)
{
	usleep(50000);
	return fill(arg, buf, len);
}

static int fail(void *arg, uint8_t *buf, uint64_t len)
{
	atomic_fetch_add(&builds, 1);
	return -EIO;
}

static bool same(const rs_block *b, uintptr_t key)
{
	uint8_t *want = malloc(LEN);
	bool ok;

	fill((void *)key, want, LEN);
	atomic_fetch_sub(&builds, 1);
	ok = memcmp(rs_block_data(b), want, LEN) == 0;
	free(want);
	return ok;
}

static void test_budget_and_lru(void)
{
	rs_cache *c;
	rs_cache_stats s;
	rs_block *b;

	CHECK(rs_cache_new(&c, 4 * LEN, false) == 0);
	builds = 0;
	for (uintptr_t k = 0; k < 4; k++) {
		CHECK(rs_cache_get(c, 1, k, LEN, fill, (void *)(k * 2), &b) == 0);
		rs_cache_release(c, b);
	}
	/* Touch block 0, then add a fifth: block 1 (least recent) goes. */
	CHECK(rs_cache_get(c, 1, 0, LEN, fill, (void *)0, &b) == 0);
	rs_cache_release(c, b);
	CHECK(rs_cache_get(c, 1, 4, LEN, fill, (void *)8, &b) == 0);
	rs_cache_release(c, b);
	rs_cache_get_stats(c, &s);
	CHECK(s.bytes <= 4 * LEN && s.evictions == 1 && s.hits == 1);
	CHECK(builds == 5);
	CHECK(rs_cache_get(c, 1, 0, LEN, fill, (void *)0, &b) == 0);
	CHECK(builds == 5 && same(b, 0));
	rs_cache_release(c, b);
	CHECK(rs_cache_get(c, 1, 1, LEN, fill, (void *)2, &b) == 0);
	CHECK(builds == 6 && same(b, 2));
	rs_cache_release(c, b);

	/* A block in use is never freed, even over budget. */
	{
		rs_block *held[6];

		for (uintptr_t k = 0; k < 6; k++)
			CHECK(rs_cache_get(c, 2, k, LEN, fill, (void *)(k * 4), &held[k]) == 0);
		for (uintptr_t k = 0; k < 6; k++) {
			CHECK(same(held[k], k * 4));
			rs_cache_release(c, held[k]);
		}
		rs_cache_get_stats(c, &s);
		CHECK(s.bytes <= 4 * LEN);
	}
	rs_cache_free(c);
}

typedef struct {
	rs_cache *c;
	int err;
	bool ok;
} racer;

static void *race(void *arg)
{
	racer *r = arg;
	rs_block *b;

	r->err = rs_cache_get(r->c, 9, 9, LEN, fill_slow, (void *)6, &b);
	if (!r->err) {
		r->ok = same(b, 6);
		rs_cache_release(r->c, b);
	}
	return NULL;
}

static void *race_fail(void *arg)
{
	racer *r = arg;
	rs_block *b;

	r->err = rs_cache_get(r->c, 5, 5, LEN, fail, NULL, &b);
	return NULL;
}

static void test_single_flight(void)
{
	pthread_t th[8];
	racer r[8];
	rs_cache *c;
	rs_block *b;

	CHECK(rs_cache_new(&c, 16 * LEN, false) == 0);
	builds = 0;
	for (int i = 0; i < 8; i++) {
		r[i] = (racer){ c, -1, false };
		pthread_create(&th[i], NULL, race, &r[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		CHECK(r[i].err == 0 && r[i].ok);
	}
	CHECK(builds == 1);

	/* A failed build reaches its waiters as an error and is not cached. */
	builds = 0;
	for (int i = 0; i < 8; i++) {
		r[i] = (racer){ c, 0, false };
		pthread_create(&th[i], NULL, race_fail, &r[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		CHECK(r[i].err == -EIO);
	}
	CHECK(builds >= 1);
	CHECK(rs_cache_get(c, 5, 5, LEN, fill, (void *)2, &b) == 0 && same(b, 2));
	rs_cache_release(c, b);
	rs_cache_free(c);
}

static void test_lz4_cold(void)
{
	rs_cache *c;
	rs_cache_stats s;
	rs_block *b;

	/* Odd keys fill constant bytes: they compress to almost nothing. */
	CHECK(rs_cache_new(&c, 4 * LEN, true) == 0);
	builds = 0;
	for (uintptr_t k = 0; k < 8; k++) {
		CHECK(rs_cache_get(c, 3, k, LEN, fill, (void *)(2 * k + 1), &b) == 0);
		rs_cache_release(c, b);
	}
	rs_cache_get_stats(c, &s);
	CHECK(s.cold_blocks >= 4 && s.bytes <= 4 * LEN);
	for (uintptr_t k = 0; k < 8; k++) {
		CHECK(rs_cache_get(c, 3, k, LEN, fill, (void *)(2 * k + 1), &b) == 0);
		CHECK(same(b, 2 * k + 1));
		rs_cache_release(c, b);
	}
	CHECK(builds == 8); /* every block came back from its cold copy */
	rs_cache_free(c);
}

/* A stand-in for fs/snapshot.c: `idle` charged bytes it can give back. */
typedef struct {
	uint64_t idle;
	int calls;
} reclaimer;

static uint64_t give_back(void *arg, uint64_t want)
{
	reclaimer *r = arg;
	uint64_t n = want < r->idle ? (want + LEN - 1) / LEN * LEN : r->idle;

	n = n < r->idle ? n : r->idle;
	r->idle -= n;
	r->calls++;
	return n;
}

static void test_charges(void)
{
	rs_cache *c;
	rs_cache_stats s;
	rs_block *b, *held;
	reclaimer r = { 0 };

	CHECK(rs_cache_new(&c, 8 * LEN, false) == 0);
	/* A charge evicts unused blocks to fit. */
	for (uintptr_t k = 0; k < 8; k++) {
		CHECK(rs_cache_get(c, 4, k, LEN, fill, (void *)(2 * k), &b) == 0);
		rs_cache_release(c, b);
	}
	CHECK(rs_cache_charge(c, 5 * LEN) == 0);
	rs_cache_get_stats(c, &s);
	CHECK(s.charged == 5 * LEN && s.bytes == 3 * LEN && s.evictions == 5);
	/* Blocks in use and charges are not evicted: no room, nothing
	 * charged. */
	CHECK(rs_cache_get(c, 4, 100, LEN, fill, (void *)0, &held) == 0);
	CHECK(rs_cache_charge(c, 3 * LEN) == -ENOSPC);
	CHECK(rs_cache_charge(c, 9 * LEN) == -ENOSPC);
	rs_cache_get_stats(c, &s);
	CHECK(s.charged == 5 * LEN && s.bytes + s.charged <= 8 * LEN);
	/* With a reclaim callback: charged bytes it gives back make room,
	 * for charges and for blocks alike. */
	r.idle = 5 * LEN;
	rs_cache_set_reclaim(c, give_back, &r);
	CHECK(rs_cache_charge(c, 4 * LEN) == 0);
	rs_cache_get_stats(c, &s);
	CHECK(r.calls >= 1 && s.bytes + s.charged <= 8 * LEN);
	CHECK(s.charged == 5 * LEN - (5 * LEN - r.idle) + 4 * LEN);
	/* Blocks evict blocks first, then reclaim: the held block and the one
	 * being built leave room for no more. */
	uint64_t idle = r.idle;

	for (uintptr_t k = 0; k < 6; k++) {
		CHECK(rs_cache_get(c, 5, k, LEN, fill, (void *)(2 * k), &b) == 0);
		CHECK(same(b, 2 * k));
		rs_cache_release(c, b);
		rs_cache_get_stats(c, &s);
		CHECK(s.bytes + s.charged <= 8 * LEN);
	}
	CHECK(r.idle < idle && s.charged == 4 * LEN + r.idle);
	rs_cache_uncharge(c, 4 * LEN);
	rs_cache_get_stats(c, &s);
	CHECK(s.charged == r.idle);
	rs_cache_release(c, held);
	rs_cache_free(c);
}

/* Blocks every byte of which reads took go first, least recently used of
 * them first; a block read only in part is kept (it would be built twice:
 * see read_victim); then plain LRU.  Also with LZ4: a block read whole is
 * dropped, not packed. */
static void test_read_first(void)
{
	rs_cache *c;
	rs_cache_stats st;
	rs_block *b;

	for (int compress = 0; compress < 2; compress++) {
		CHECK(rs_cache_new(&c, 4 * LEN, compress) == 0);
		for (uintptr_t k = 0; k < 4; k++) {
			CHECK(rs_cache_get(c, 6, k, LEN, fill, (void *)(2 * k), &b) == 0);
			if (k == 1 || k == 2)
				rs_cache_mark_read(c, b, LEN);
			if (k == 0)
				rs_cache_mark_read(c, b, LEN / 2);
			rs_cache_release(c, b);
		}
		if (compress) {
			/* over the hot half: the blocks read whole went, the
			 * others were packed */
			rs_cache_get_stats(c, &st);
			CHECK(!rs_cache_has(c, 6, 1) && !rs_cache_has(c, 6, 2));
			CHECK(rs_cache_has(c, 6, 0) && rs_cache_has(c, 6, 3));
			CHECK(st.evictions == 2);
			rs_cache_free(c);
			continue;
		}
		CHECK(rs_cache_get(c, 6, 4, LEN, fill, (void *)8, &b) == 0);
		rs_cache_release(c, b);
		CHECK(rs_cache_has(c, 6, 0) && !rs_cache_has(c, 6, 1) &&
		      rs_cache_has(c, 6, 2) && rs_cache_has(c, 6, 3));
		CHECK(rs_cache_get(c, 6, 5, LEN, fill, (void *)10, &b) == 0);
		rs_cache_release(c, b);
		CHECK(rs_cache_has(c, 6, 0) && !rs_cache_has(c, 6, 2));
		/* no block read whole left: least recently used */
		CHECK(rs_cache_get(c, 6, 6, LEN, fill, (void *)12, &b) == 0);
		rs_cache_release(c, b);
		CHECK(!rs_cache_has(c, 6, 0) && rs_cache_has(c, 6, 3));
		rs_cache_free(c);
	}
}

int main(void)
{
	test_budget_and_lru();
	test_single_flight();
	test_lz4_cold();
	test_charges();
	test_read_first();
	return CHECK_DONE();
}
