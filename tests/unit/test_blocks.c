/* The block builder (fs/blocks.h) without a mount: blocks of real chunks
 * built from a real source file through the planner, the CPU executor and
 * the cache, compared with values computed here; a source changed after it
 * was recorded fails the build with -ESTALE and leaves nothing cached; a
 * gather during which the source's ctime moves (a chmod: a change of its
 * identity) fails with -ESTALE, and a cached block is not served after it.
 *
 * The source holds one f32 tensor of ROWS x COLS, stored as two chunks of
 * ROWS/2 rows one after the other.  Element g (C order) has the bits
 *     hi(g) << 16 | lo(g),  hi(g) = 0x3f80 + g % 0x3f00,  lo(g) < 0x8000:
 * every element differs, and each is a positive normal float that rounds
 * to the bf16 hi(g) exactly (the low half is below the halfway point). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs/blocks.h"
#include "planner/catalog.h"
#include "planner/plan.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

#define ROWS 3072u
#define COLS 1024u
#define MiB (1ull << 20)

static char dir[] = "/tmp/rs_blocks_XXXXXX";

static uint16_t hi(uint64_t g)
{
	return (uint16_t)(0x3f80 + g % 0x3f00);
}

static uint32_t bits(uint64_t g)
{
	return (uint32_t)hi(g) << 16 | (uint32_t)(g / 0x3f00 & 0x7fff);
}

/* The tensor as stored: the two row chunks are C order over the whole
 * tensor, so the file is simply every element in C order. */
static uint8_t *make_content(void)
{
	uint8_t *p = malloc((size_t)ROWS * COLS * 4);

	for (uint64_t g = 0; p && g < (uint64_t)ROWS * COLS; g++) {
		uint32_t v = bits(g);

		memcpy(p + g * 4, &v, 4);
	}
	return p;
}

static void make_tensor(rs_catalog *cat, rs_tensor **t)
{
	const uint64_t shape[2] = { ROWS, COLS }, chunk[2] = { ROWS / 2, COLS };
	size_t ti;

	rs_catalog_init(cat);
	CHECK(rs_catalog_add_regular(cat, "t", RS_DTYPE_F32, 2, shape, chunk,
				     &ti) == 0);
	*t = &cat->tensors[ti];
	for (uint64_t r = 0; r < 2; r++) {
		const uint64_t idx[2] = { r, 0 };

		rs_catalog_set_chunk(*t, idx, 0, r * (ROWS / 2) * COLS * 4);
	}
}

/* A chunk of box rows [0, ROWS), columns [c0, c0+ncols) of t, reading
 * the one source file. */
static void make_chunk(rs_chunk *c, const rs_tensor *t, uint64_t id,
		       uint64_t c0, uint64_t ncols, rs_dtype to)
{
	static uint32_t the_source[1] = { 0 };
	rs_box box = { .ndim = 2, .off = { 0, c0 }, .len = { ROWS, ncols } };

	memset(c, 0, sizeof(*c));
	c->id = id;
	c->sources = the_source;
	c->nsources = 1;
	CHECK(rs_plan_box(t, &box, box.len, &c->plan) == 0);
	c->size = c->plan.size;
	if (to != RS_DTYPE_INVALID) {
		c->from = RS_DTYPE_F32;
		c->to = to;
		c->size = c->plan.size / 4 * rs_dtype_size(to);
	}
}

/* The column shard: columns [COL0, COL0+NCOLS), past the stored ones
 * (zeros) at the end. */
#define COL0 512u
#define NCOLS 768u

/* Element e of the column shard, and of the whole tensor as bf16. */
static uint32_t want_cols(uint64_t e)
{
	uint64_t row = e / NCOLS, col = COL0 + e % NCOLS;

	return col < COLS ? bits(row * COLS + col) : 0;
}

static uint32_t want_bf16(uint64_t e)
{
	return hi(e);
}

/* Block `index` of chunk c holds want_len bytes of `esize`-byte elements,
 * element e of the chunk being want(e). */
static void check_block(const rs_blocks *b, const rs_chunk *c,
			uint64_t index, uint64_t want_len, unsigned esize,
			uint32_t (*want)(uint64_t e))
{
	uint64_t bad = 0;
	rs_block *blk;
	int err = rs_blocks_get(b, c, index, &blk);

	CHECK(err == 0);
	if (err)
		return;
	CHECK(rs_block_len(blk) == want_len);
	for (uint64_t i = 0; i < rs_block_len(blk) / esize; i++) {
		uint32_t got = 0;   /* little-endian: the low esize bytes */

		memcpy(&got, rs_block_data(blk) + i * esize, esize);
		bad += got != want(index * RS_BLOCK_SIZE / esize + i);
	}
	CHECK(bad == 0);
	rs_cache_release(b->cache, blk);
}

/* A provider (planner/source.h) whose file starts as zeros and gets only
 * the ranges acquired, copied from the source: a block that read a byte
 * it did not acquire would hold a zero there, not the element. */
typedef struct {
	rs_sources *s;
	int fd;
	unsigned acquired, released;
	uint64_t pinned;        /* bytes acquired and not yet released */
} fake_provider;

static int fake_acquire(void *arg, uint32_t i, uint64_t off, uint64_t len)
{
	fake_provider *p = arg;
	uint8_t *buf = malloc(len);
	int fd, err = buf ? rs_sources_own_fd(p->s, i, &fd) : -ENOMEM;

	if (!err)
		err = rs_pread_full(fd, buf, len, off);
	if (!err && pwrite(p->fd, buf, len, (off_t)off) != (ssize_t)len)
		err = -EIO;
	free(buf);
	if (!err) {
		p->acquired++;
		p->pinned += len;
	}
	return err;
}

static void fake_release(void *arg, uint32_t i, uint64_t off, uint64_t len)
{
	fake_provider *p = arg;

	(void)i;
	(void)off;
	p->released++;
	p->pinned -= len;
}

static int fake_fd(void *arg, uint32_t i)
{
	(void)i;
	return ((fake_provider *)arg)->fd;
}

static const rs_source_provider fake = { fake_acquire, fake_release,
					 fake_fd };

/* Blocks built through a provider read only what they acquired, and
 * release all of it. */
static void test_provider(const rs_blocks *b, const rs_chunk *cols)
{
	fake_provider p = { .s = b->sources };
	char path[64];

	snprintf(path, sizeof(path), "%s/provided", dir);
	p.fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(p.fd >= 0 && ftruncate(p.fd, (off_t)ROWS * COLS * 4) == 0);
	rs_sources_set_provider(b->sources, &fake, &p);
	CHECK(rs_sources_has_provider(b->sources));
	check_block(b, cols, 0, RS_BLOCK_SIZE, 4, want_cols);
	check_block(b, cols, 2, 1 * MiB, 4, want_cols);
	check_block(b, cols, 1, RS_BLOCK_SIZE, 4, want_cols);
	/* A span per stored chunk a block reads, every one released. */
	CHECK(p.acquired >= 3 && p.released == p.acquired && p.pinned == 0);
	rs_sources_set_provider(b->sources, NULL, NULL);
	close(p.fd);
	unlink(path);
}

/* A gather for rs_blocks_gather: counts its calls, and on the first
 * `moves` of them moves the source's ctime (a chmod). */
typedef struct {
	int calls, moves;
	char path[64];
} ctime_gather;

static int move_ctime(void *arg)
{
	ctime_gather *g = arg;

	if (g->calls++ < g->moves) {
		/* Past a coarse timestamp tick, so the ctime surely moves. */
		nanosleep(&(struct timespec){ 0, 20 * 1000 * 1000 }, NULL);
		CHECK(chmod(g->path, g->calls % 2 ? 0600 : 0644) == 0);
	}
	return 0;
}

static int fail_gather(void *arg)
{
	(void)arg;
	return -EIO;
}

/* Checked gathers: a gather's own error passes through; one that saw the
 * ctime move is -ESTALE, once (nothing is retried); after that every
 * check of the source fails, with or without a gather. */
static void test_gather(const rs_blocks *b, const rs_chunk *cached)
{
	rs_source_set set = { 0 };
	ctime_gather g = { 0 };

	snprintf(g.path, sizeof(g.path), "%s/src", dir);
	CHECK(rs_source_set_add(&set, 0) == 0);
	CHECK(rs_source_set_add(&set, 0) == 0 && set.n == 1);

	CHECK(rs_blocks_gather(b, &set, move_ctime, &g) == 0 && g.calls == 1);
	CHECK(rs_blocks_gather(b, &set, NULL, NULL) == 0);
	CHECK(rs_blocks_gather(b, &set, fail_gather, NULL) == -EIO);
	g.calls = 0;
	g.moves = 1;
	CHECK(rs_blocks_gather(b, &set, move_ctime, &g) == -ESTALE);
	CHECK(g.calls == 1);
	CHECK(rs_blocks_gather(b, &set, NULL, NULL) == -ESTALE);
	/* The cache still holds the block built before: what the read path
	 * checks (rs_blocks_gather of the chunk's sources) refuses to serve
	 * it, as above. */
	CHECK(rs_cache_has(b->cache, cached->id, 0));
	CHECK(cached->nsources == 1 && cached->sources[0] == 0);
	rs_source_set_free(&set);
	CHECK(set.v == NULL && set.n == 0);
}

/* The source grows after it was recorded: its identity (size) no longer
 * matches, so a build fails with -ESTALE and caches nothing, every time,
 * and a gather from it never runs. */
static void test_changed_source(const rs_blocks *b, const rs_chunk *c)
{
	rs_cache_stats before, after;
	rs_source_set set = { 0 };
	ctime_gather g = { 0 };
	char path[64];
	rs_block *blk = NULL;
	FILE *f;

	snprintf(path, sizeof(path), "%s/src", dir);
	f = fopen(path, "ab");
	CHECK(f && fputc('x', f) == 'x');
	if (f)
		fclose(f);
	rs_cache_get_stats(b->cache, &before);
	for (int i = 0; i < 2; i++) {
		CHECK(rs_blocks_get(b, c, 1, &blk) == -ESTALE);
		CHECK(!rs_cache_has(b->cache, c->id, 1));
	}
	rs_cache_get_stats(b->cache, &after);
	CHECK(after.blocks == before.blocks && after.bytes == before.bytes);
	CHECK(after.misses == before.misses + 2); /* built again: not cached */

	CHECK(rs_source_set_add(&set, 0) == 0);
	CHECK(rs_blocks_gather(b, &set, move_ctime, &g) == -ESTALE);
	CHECK(g.calls == 0);
	rs_source_set_free(&set);
}

int main(void)
{
	rs_executor_opts eo = { .kind = RS_EXECUTOR_CPU, .threads = 2 };
	rs_blocks b = { .root_path = dir };
	uint8_t *content = make_content();
	rs_chunk cols, cast, late;
	rs_catalog cat;
	rs_tensor *t;
	rs_block *blk;
	char path[64];

	CHECK(content != NULL);
	CHECK(mkdtemp(dir) != NULL);
	if (check_failed)
		return CHECK_DONE();
	b.sources = rs_test_source(dir, "src", content,
				   (size_t)ROWS * COLS * 4);
	free(content);
	CHECK(rs_executor_create(&b.exec, &eo, NULL) == 0);
	CHECK(rs_cache_new(&b.cache, 64 * MiB, false) == 0);
	make_tensor(&cat, &t);
	if (check_failed)
		return CHECK_DONE();

	/* The column shard: strided, across both stored chunks, its last
	 * 256 columns past the tensor: 9 MiB, so blocks of 4, 4 and 1 MiB. */
	make_chunk(&cols, t, 1, COL0, NCOLS, RS_DTYPE_INVALID);
	CHECK(cols.size == 9 * MiB);
	check_block(&b, &cols, 0, RS_BLOCK_SIZE, 4, want_cols);
	check_block(&b, &cols, 2, 1 * MiB, 4, want_cols);
	check_block(&b, &cols, 1, RS_BLOCK_SIZE, 4, want_cols);
	CHECK(rs_blocks_get(&b, &cols, 3, &blk) == -EINVAL);

	/* The whole tensor as bf16: 6 MiB of view from 12 MiB of plan, so
	 * block 1 is plan bytes [8 MiB, 12 MiB). */
	make_chunk(&cast, t, 2, 0, COLS, RS_DTYPE_BF16);
	CHECK(cast.size == 6 * MiB);
	check_block(&b, &cast, 1, 2 * MiB, 2, want_bf16);
	check_block(&b, &cast, 0, RS_BLOCK_SIZE, 2, want_bf16);

	/* Before test_gather, which changes the source's identity.  A fresh
	 * chunk id, so its blocks are built, not found cached. */
	{
		rs_chunk provided;

		make_chunk(&provided, t, 4, COL0, NCOLS, RS_DTYPE_INVALID);
		test_provider(&b, &provided);
		rs_plan_free(&provided.plan);
	}
	test_gather(&b, &cast);
	/* A chunk none of whose blocks was built before the source changed. */
	make_chunk(&late, t, 3, 0, COLS, RS_DTYPE_INVALID);
	test_changed_source(&b, &late);

	rs_plan_free(&cols.plan);
	rs_plan_free(&cast.plan);
	rs_plan_free(&late.plan);
	rs_catalog_free(&cat);
	rs_cache_free(b.cache);
	rs_executor_destroy(b.exec);
	rs_sources_free(b.sources);
	snprintf(path, sizeof(path), "%s/src", dir);
	unlink(path);
	rmdir(dir);
	return CHECK_DONE();
}
