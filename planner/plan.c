#include "planner/plan.h"

#include "planner/array.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void rs_plan_init(rs_plan *p)
{
	memset(p, 0, sizeof(*p));
}

void rs_plan_free(rs_plan *p)
{
	free(p->ops);
	memset(p, 0, sizeof(*p));
}

/* Appends an op, normalising a row-contiguous op to a single run and merging
 * it into the previous op when it continues it on both sides. */
static int push(rs_plan *p, rs_copy_op op)
{
	int err;

	if (op.count > 1 && op.src_stride == op.len && op.dst_stride == op.len) {
		op.len *= op.count;
		op.count = 1;
	}
	if (op.count == 1)
		op.src_stride = op.dst_stride = op.len;
	p->covered += op.len * op.count;
	if (p->count) {
		rs_copy_op *last = &p->ops[p->count - 1];

		if (last->count == 1 && op.count == 1 &&
		    last->source == op.source &&
		    last->src_off + last->len == op.src_off &&
		    last->dst_off + last->len == op.dst_off) {
			last->len += op.len;
			last->src_stride = last->dst_stride = last->len;
			return 0;
		}
	}
	if (p->count == RS_PLAN_MAX_OPS)
		return -E2BIG;
	err = rs_array_reserve(&p->ops, &p->cap, p->count + 1, sizeof(op));
	if (err)
		return err;
	p->ops[p->count++] = op;
	return 0;
}

/* Emits the ops copying intersection `in` of fragment `f` into the box. */
static int plan_fragment(const rs_tensor *t, const rs_fragment *f,
			 const rs_box *box, const uint64_t *dst_extent,
			 const rs_box *in, rs_plan *out)
{
	const uint64_t e = rs_dtype_size(t->dtype);
	const int n = t->ndim;
	uint64_t sst[RS_MAX_DIMS], dst[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 };
	uint64_t run, count = 1, sstride = 0, dstride = 0;
	int k, cdim, err;

	if (n == 0) {
		rs_copy_op op = { f->source, f->offset, 0, e, 1, e, e };
		return push(out, op);
	}
	memcpy(sst, f->stride, sizeof(sst));
	rs_c_strides(dst_extent, n, dst);

	/* A row is a contiguous run on both sides: the innermost axis, widened
	 * over outer axes for as long as each slab is whole on both sides.  A
	 * source whose innermost stride is not 1 moves one element per row. */
	k = n - 1;
	if (sst[k] != 1) {
		run = 1;
		cdim = k;
		count = in->len[k];
		sstride = sst[k] * e;
		dstride = dst[k] * e;
		goto emit;
	}
	run = in->len[k];
	while (k > 0 && in->len[k] * sst[k] == sst[k - 1] &&
	       in->len[k] * dst[k] == dst[k - 1]) {
		k--;
		run *= in->len[k];
	}
	cdim = k - 1;
	if (cdim >= 0) {
		count = in->len[cdim];
		sstride = sst[cdim] * e;
		dstride = dst[cdim] * e;
	}

emit:
	/* Axes outside the row axis are enumerated one op per position. */
	for (;;) {
		uint64_t so = 0, dof = 0;
		rs_copy_op op;

		for (int i = 0; i < n; i++) {
			uint64_t g = in->off[i] + (i < cdim ? idx[i] : 0);

			so += (g - f->box.off[i]) * sst[i];
			dof += (g - box->off[i]) * dst[i];
		}
		op.source = f->source;
		op.src_off = f->offset + so * e;
		op.dst_off = dof * e;
		op.len = run * e;
		op.count = count;
		op.src_stride = sstride;
		op.dst_stride = dstride;
		err = push(out, op);
		if (err)
			return err;

		/* Next outer position, over axes [0, cdim). */
		if (!rs_grid_next(idx, in->len, cdim))
			return 0;
	}
}

static int cmp_dst(const void *a, const void *b)
{
	const rs_copy_op *x = a, *y = b;

	return x->dst_off < y->dst_off ? -1 : x->dst_off > y->dst_off;
}

/* Re-merges runs that became adjacent once sorted by destination. */
static void sort_and_merge(rs_plan *p)
{
	size_t w = 0;

	/* An empty plan has no array: qsort(NULL, 0) is undefined. */
	if (p->count > 1)
		qsort(p->ops, p->count, sizeof(*p->ops), cmp_dst);
	for (size_t r = 0; r < p->count; r++) {
		rs_copy_op *op = &p->ops[r];

		if (w && op->count == 1 && p->ops[w - 1].count == 1 &&
		    p->ops[w - 1].source == op->source &&
		    p->ops[w - 1].src_off + p->ops[w - 1].len == op->src_off &&
		    p->ops[w - 1].dst_off + p->ops[w - 1].len == op->dst_off) {
			p->ops[w - 1].len += op->len;
			p->ops[w - 1].src_stride = p->ops[w - 1].len;
			p->ops[w - 1].dst_stride = p->ops[w - 1].len;
			continue;
		}
		p->ops[w++] = *op;
	}
	p->count = w;
}

/* Visits the grid cells overlapping `box` (regular tensors) or every
 * fragment (irregular ones). */
int rs_plan_box(const rs_tensor *t, const rs_box *box,
		const uint64_t *dst_extent, rs_plan *out)
{
	uint64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS], idx[RS_MAX_DIMS];
	rs_box in;
	int err;

	rs_plan_init(out);
	out->size = rs_dtype_size(t->dtype);
	for (int i = 0; i < t->ndim; i++)
		out->size *= dst_extent[i];

	if (!t->regular) {
		for (size_t f = 0; f < t->nfrags; f++) {
			if (!rs_box_intersect(box, &t->frags[f].box, &in))
				continue;
			err = plan_fragment(t, &t->frags[f], box, dst_extent,
					    &in, out);
			if (err)
				goto fail;
		}
		goto done;
	}
	for (int i = 0; i < t->ndim; i++) {
		uint64_t end = box->off[i] + box->len[i];

		if (end > t->shape[i])
			end = t->shape[i];
		if (box->len[i] == 0 || box->off[i] >= end)
			goto done; /* nothing stored inside the box */
		lo[i] = box->off[i] / t->grid[i];
		hi[i] = (end - 1) / t->grid[i];
		idx[i] = lo[i];
	}
	for (;;) {
		const rs_fragment *f = &t->frags[rs_tensor_grid_index(t, idx)];

		if (rs_box_intersect(box, &f->box, &in) || t->ndim == 0) {
			if (t->ndim == 0)
				in = *box;
			err = plan_fragment(t, f, box, dst_extent, &in, out);
			if (err)
				goto fail;
		}
		int i = t->ndim - 1;

		while (i >= 0 && idx[i] == hi[i]) {
			idx[i] = lo[i];
			i--;
		}
		if (i < 0)
			break;
		idx[i]++;
	}
done:
	sort_and_merge(out);
	return 0;
fail:
	rs_plan_free(out);
	return err;
}

int rs_plan_slice(const rs_plan *in, uint64_t begin, uint64_t end,
		  rs_plan *out)
{
	int err;

	rs_plan_init(out);
	out->size = end - begin;
	for (size_t k = 0; k < in->count; k++) {
		const rs_copy_op *op = &in->ops[k];
		uint64_t first, last;

		if (op->dst_off >= end)
			continue;
		/* Rows [first, last] are the ones that touch [begin, end). */
		if (op->dst_off + op->len > begin)
			first = 0;
		else
			first = (begin - op->dst_off - op->len) / op->dst_stride + 1;
		last = op->count == 1 ? 0 : (end - 1 - op->dst_off) / op->dst_stride;
		if (last >= op->count)
			last = op->count - 1;
		for (uint64_t i = first; i <= last;) {
			uint64_t d0 = op->dst_off + i * op->dst_stride;
			uint64_t s0 = op->src_off + i * op->src_stride;
			uint64_t a = d0 < begin ? begin : d0;
			uint64_t b = d0 + op->len > end ? end : d0 + op->len;
			rs_copy_op part;

			if (a >= b) {
				i++;
				continue;
			}
			part.source = op->source;
			part.len = b - a;
			part.src_off = s0 + (a - d0);
			part.dst_off = a - begin;
			part.count = 1;
			part.src_stride = part.dst_stride = part.len;
			/* Whole rows in the middle go out as one strided op. */
			if (a == d0 && b == d0 + op->len && i < last) {
				uint64_t n = last - i;

				/* the last row may be cut by `end` */
				if (op->dst_off + last * op->dst_stride + op->len <= end)
					n++;
				part.count = n;
				part.src_stride = op->src_stride;
				part.dst_stride = op->dst_stride;
				i += n;
			} else {
				i++;
			}
			err = push(out, part);
			if (err)
				goto fail;
		}
	}
	return 0;
fail:
	rs_plan_free(out);
	return err;
}

bool rs_plan_is_runs(const rs_plan *p)
{
	for (size_t i = 0; i < p->count; i++)
		if (p->ops[i].count != 1)
			return false;
	return true;
}

int rs_plan_unroll_rows(rs_plan *p, uint64_t min_len, size_t max_runs)
{
	rs_plan runs;
	size_t n = 0;
	int err = 0;

	for (size_t i = 0; i < p->count; i++) {
		const rs_copy_op *op = &p->ops[i];

		if (op->count > 1 && op->len < min_len)
			return -E2BIG;
		if (op->count > max_runs - n)
			return -E2BIG;
		n += op->count;
	}
	rs_plan_init(&runs);
	runs.size = p->size;
	for (size_t i = 0; i < p->count && !err; i++) {
		const rs_copy_op *op = &p->ops[i];

		for (uint64_t r = 0; r < op->count && !err; r++) {
			rs_copy_op row = {
				.source = op->source,
				.src_off = op->src_off + r * op->src_stride,
				.dst_off = op->dst_off + r * op->dst_stride,
				.len = op->len,
				.count = 1,
			};

			err = push(&runs, row);
		}
	}
	if (err) {
		rs_plan_free(&runs);
		return err;
	}
	sort_and_merge(&runs);
	rs_plan_free(p);
	*p = runs;
	return 0;
}
