/* Block builds and checked gathers; see blocks.h. */
#include "fs/blocks.h"

#include <errno.h>
#include <stdlib.h>

#include "fs/log.h"
#include "planner/array.h"

/* --- gathers between checks --- */

int rs_source_set_add(rs_source_set *set, uint32_t index)
{
	int err;

	for (size_t i = 0; i < set->n; i++)
		if (set->v[i] == index)
			return 0;
	err = rs_array_reserve(&set->v, &set->cap, set->n + 1,
			       sizeof(*set->v));
	if (!err)
		set->v[set->n++] = index;
	return err;
}

int rs_source_set_add_span(rs_source_set *set, uint32_t index, uint64_t off,
			   uint64_t len)
{
	int err = rs_source_set_add(set, index);

	if (!err)
		err = rs_array_reserve(&set->spans, &set->spans_cap,
				       set->nspans + 1, sizeof(*set->spans));
	if (!err)
		set->spans[set->nspans++] = (rs_source_span){ index, off, len };
	return err;
}

void rs_source_set_free(rs_source_set *set)
{
	free(set->v);
	free(set->spans);
	*set = (rs_source_set){ 0 };
}

static int span_cmp(const void *a, const void *b)
{
	const rs_source_span *x = a, *y = b;

	if (x->source != y->source)
		return x->source < y->source ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* The spans sorted and merged where they overlap or touch, so that each
 * byte is acquired once. */
static void merge_spans(rs_source_set *set)
{
	size_t n = 0;

	if (!set->nspans)
		return;
	qsort(set->spans, set->nspans, sizeof(*set->spans), span_cmp);
	for (size_t i = 0; i < set->nspans; i++) {
		rs_source_span *last = n ? &set->spans[n - 1] : NULL;
		const rs_source_span *s = &set->spans[i];

		if (last && last->source == s->source &&
		    s->off <= last->off + last->len) {
			uint64_t end = s->off + s->len;

			if (end > last->off + last->len)
				last->len = end - last->off;
		} else {
			set->spans[n++] = *s;
		}
	}
	set->nspans = n;
}

static void release_spans(const rs_blocks *b, const rs_source_set *set,
			  size_t n)
{
	for (size_t i = 0; i < n; i++)
		rs_sources_release(b->sources, set->spans[i].source,
				   set->spans[i].off, set->spans[i].len);
}

/* Every source of the set as recorded: 0, or the first one's error
 * (-ESTALE logged). */
static int verify_all(const rs_blocks *b, const rs_source_set *set)
{
	for (size_t i = 0; i < set->n; i++) {
		int err = rs_sources_verify(b->sources, set->v[i]);

		if (err == -ESTALE)
			rs_log(RS_LOG_ERROR, "%s/%s: source changed while it was read; reads of files built from it fail with EIO",
			       b->root_path, rs_sources_path(b->sources, set->v[i]));
		if (err)
			return err;
	}
	return 0;
}

int rs_blocks_gather(const rs_blocks *b, rs_source_set *set,
		     int (*gather)(void *arg), void *arg)
{
	int err = verify_all(b, set);
	size_t got = 0;

	if (err || !gather)
		return err;
	merge_spans(set);
	for (; got < set->nspans && !err; got++)
		err = rs_sources_acquire(b->sources, set->spans[got].source,
					 set->spans[got].off,
					 set->spans[got].len);
	if (err) {
		release_spans(b, set, got - 1);
		return err;
	}
	err = gather(arg);
	release_spans(b, set, got);
	return err ? err : verify_all(b, set);
}

/* --- blocks --- */

typedef struct {
	const rs_blocks *b;
	const rs_chunk *chunk;
	uint64_t begin;
} block_job;

typedef struct {
	const rs_blocks *b;
	const rs_chunk *chunk;
	const rs_plan *slice;
	uint8_t *buf;
	uint64_t len;
} block_gather;

static int run_block(void *arg)
{
	block_gather *g = arg;
	rs_exec_job job = { 0 };

	job.ops = g->slice->ops;
	job.nops = g->slice->count;
	job.dst = g->buf;
	job.size = g->len;
	job.zero_fill = g->slice->covered < g->slice->size;
	job.sources = g->b->sources;
	job.from = g->chunk->from;
	job.to = g->chunk->to;
	return rs_executor_run(g->b->exec, &job);
}

/* Where view bytes [begin, begin+len) of a chunk are in its plan, which
 * is made in the stored dtype: the same range without a cast.  Blocks
 * start at multiples of RS_BLOCK_SIZE, so they start on an element. */
static void plan_range(const rs_chunk *c, uint64_t begin, uint64_t len,
		       uint64_t *pbegin, uint64_t *pend)
{
	if (c->from == c->to) {
		*pbegin = begin;
		*pend = begin + len;
		return;
	}
	*pbegin = begin / rs_dtype_size(c->to) * rs_dtype_size(c->from);
	*pend = (begin + len) / rs_dtype_size(c->to) * rs_dtype_size(c->from);
}

/* Cache miss: plan the block's slice of the chunk and execute it, between
 * checks of its sources, so a source changed meanwhile fails the build
 * and nothing of it is cached. */
static int build_block(void *arg, uint8_t *buf, uint64_t len)
{
	block_job *bj = arg;
	block_gather g = { bj->b, bj->chunk, NULL, buf, len };
	rs_source_set set = { 0 };
	uint64_t pbegin, pend;
	rs_plan slice;
	int err;

	plan_range(bj->chunk, bj->begin, len, &pbegin, &pend);
	err = rs_plan_slice(&bj->chunk->plan, pbegin, pend, &slice);
	if (err)
		return err;
	for (size_t i = 0; i < slice.count && !err; i++) {
		const rs_copy_op *op = &slice.ops[i];

		/* The span an op reads, for a provider to fetch. */
		if (rs_sources_has_provider(bj->b->sources) && op->count)
			err = rs_source_set_add_span(
				&set, op->source, op->src_off,
				(op->count - 1) * op->src_stride + op->len);
		else
			err = rs_source_set_add(&set, op->source);
	}
	g.slice = &slice;
	if (!err)
		err = rs_blocks_gather(bj->b, &set, run_block, &g);
	rs_source_set_free(&set);
	rs_plan_free(&slice);
	return err;
}

uint64_t rs_blocks_block_len(const rs_chunk *c, uint64_t index)
{
	uint64_t begin = index * RS_BLOCK_SIZE;

	if (index >= (c->size + RS_BLOCK_SIZE - 1) / RS_BLOCK_SIZE)
		return 0;
	return c->size - begin < RS_BLOCK_SIZE ? c->size - begin
					       : RS_BLOCK_SIZE;
}

int rs_blocks_get(const rs_blocks *b, const rs_chunk *c, uint64_t index,
		  rs_block **out)
{
	uint64_t blen = rs_blocks_block_len(c, index);
	block_job bj = { b, c, index * RS_BLOCK_SIZE };

	if (!blen)
		return -EINVAL;
	return rs_cache_get(b->cache, c->id, index, blen, build_block, &bj,
			    out);
}

int rs_blocks_build_into(const rs_blocks *b, const rs_chunk *c,
			 uint64_t index, uint8_t *buf)
{
	uint64_t blen = rs_blocks_block_len(c, index);
	block_job bj = { b, c, index * RS_BLOCK_SIZE };

	if (!blen)
		return -EINVAL;
	return build_block(&bj, buf, blen);
}
