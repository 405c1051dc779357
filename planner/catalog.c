#include "planner/catalog.h"

#include "planner/array.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void rs_catalog_init(rs_catalog *c)
{
	memset(c, 0, sizeof(*c));
}

static void tensor_free(rs_tensor *t)
{
	free(t->name);
	free(t->origin);
	free(t->frags);
}

void rs_catalog_free(rs_catalog *c)
{
	for (size_t i = 0; i < c->count; i++)
		tensor_free(&c->tensors[i]);
	free(c->tensors);
	memset(c, 0, sizeof(*c));
}

void rs_catalog_drop_prefix(rs_catalog *c, const char *prefix)
{
	size_t kept = 0;

	for (size_t i = 0; i < c->count; i++) {
		if (strncmp(c->tensors[i].name, prefix, strlen(prefix)) == 0)
			tensor_free(&c->tensors[i]);
		else
			c->tensors[kept++] = c->tensors[i];
	}
	c->count = kept;
}

int rs_catalog_add_fragments(rs_catalog *c, const char *name, rs_dtype dtype,
			     int ndim, const uint64_t *shape, size_t nfrags,
			     size_t *index)
{
	rs_tensor t = { 0 };
	uint64_t bytes;
	int err;

	if (ndim < 0 || ndim > RS_MAX_DIMS || !rs_dtype_size(dtype))
		return -EINVAL;
	if (!rs_product(shape, ndim, &bytes) ||
	    !rs_mul_u64(bytes, rs_dtype_size(dtype), &bytes))
		return -EOVERFLOW;
	if (nfrags > RS_CATALOG_MAX_FRAGS)
		return -E2BIG;
	err = rs_array_reserve(&c->tensors, &c->cap, c->count + 1,
			       sizeof(rs_tensor));
	if (err)
		return err;
	t.dtype = dtype;
	t.ndim = ndim;
	memcpy(t.shape, shape, (size_t)ndim * sizeof(uint64_t));
	t.name = strdup(name);
	t.nfrags = nfrags;
	t.frags = calloc(nfrags ? nfrags : 1, sizeof(rs_fragment));
	if (!t.name || !t.frags) {
		free(t.name);
		free(t.frags);
		return -ENOMEM;
	}
	c->tensors[c->count] = t;
	*index = c->count++;
	return 0;
}

int rs_catalog_add_regular(rs_catalog *c, const char *name, rs_dtype dtype,
			   int ndim, const uint64_t *shape,
			   const uint64_t *chunk, size_t *index)
{
	uint64_t nchunks = 1, count[RS_MAX_DIMS], chunk_bytes;
	rs_tensor *t;
	int err;

	if (ndim < 0 || ndim > RS_MAX_DIMS || !rs_dtype_size(dtype))
		return -EINVAL;
	for (int i = 0; i < ndim; i++)
		if (chunk[i] == 0)
			return -EINVAL;
	rs_grid_count(shape, chunk, ndim, count);
	for (int i = 0; i < ndim; i++)
		if (!rs_mul_u64(nchunks, count[i], &nchunks))
			return -EOVERFLOW;
	/* A full chunk's bytes must be representable too (edge chunks are
	 * stored whole). */
	if (!rs_product(chunk, ndim, &chunk_bytes) ||
	    !rs_mul_u64(chunk_bytes, rs_dtype_size(dtype), &chunk_bytes))
		return -EOVERFLOW;
	if (nchunks > SIZE_MAX)
		return -E2BIG;
	err = rs_catalog_add_fragments(c, name, dtype, ndim, shape,
				       (size_t)nchunks, index);
	if (err)
		return err;
	t = &c->tensors[*index];
	t->regular = true;
	memcpy(t->grid, chunk, (size_t)ndim * sizeof(uint64_t));
	memcpy(t->grid_count, count, (size_t)ndim * sizeof(uint64_t));
	return 0;
}

bool rs_tensor_make_regular(rs_tensor *t)
{
	uint64_t grid[RS_MAX_DIMS], count[RS_MAX_DIMS], cells = 1;
	const rs_fragment *origin = NULL;
	rs_fragment *sorted = NULL;
	bool *taken = NULL, ok = false;

	if (t->regular)
		return true;
	if (t->ndim == 0) {
		t->regular = t->nfrags == 1;
		return t->regular;
	}
	for (size_t f = 0; f < t->nfrags && !origin; f++) {
		bool zero = true;

		for (int i = 0; i < t->ndim; i++)
			zero &= t->frags[f].box.off[i] == 0;
		if (zero)
			origin = &t->frags[f];
	}
	if (!origin)
		return false;
	for (int i = 0; i < t->ndim; i++) {
		grid[i] = origin->box.len[i];
		if (grid[i] == 0)
			return false;
	}
	rs_grid_count(t->shape, grid, t->ndim, count);
	for (int i = 0; i < t->ndim; i++) {
		if (!rs_mul_u64(cells, count[i], &cells))
			return false;
	}
	if (cells != t->nfrags)
		return false;
	sorted = malloc(t->nfrags * sizeof(rs_fragment));
	taken = calloc(t->nfrags, sizeof(bool));
	if (!sorted || !taken)
		goto out;
	/* Every fragment must be exactly one cell, and no cell taken twice;
	 * with as many fragments as cells that proves the tiling. */
	for (size_t f = 0; f < t->nfrags; f++) {
		const rs_fragment *fr = &t->frags[f];
		uint64_t g = 0;

		for (int i = 0; i < t->ndim; i++) {
			uint64_t off = fr->box.off[i], end;

			if (off % grid[i] != 0 || off >= t->shape[i])
				goto out;
			end = off + grid[i] > t->shape[i] ? t->shape[i]
							  : off + grid[i];
			if (fr->box.len[i] != end - off)
				goto out;
			g = g * count[i] + off / grid[i];
		}
		if (taken[g])
			goto out;
		taken[g] = true;
		sorted[g] = *fr;
	}
	free(t->frags);
	t->frags = sorted;
	sorted = NULL;
	memcpy(t->grid, grid, sizeof(grid));
	memcpy(t->grid_count, count, sizeof(count));
	t->regular = true;
	ok = true;
out:
	free(taken);
	free(sorted);
	return ok;
}

typedef struct {
	uint64_t start;         /* box.off[axis] */
	size_t frag;
} by_start;

static int cmp_start(const void *a, const void *b)
{
	const by_start *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* Fills order[] with the fragments sorted by where they start along
 * `axis`; returns how many distinct starts there are. */
static size_t sort_along(const rs_tensor *t, int axis, by_start *order)
{
	size_t distinct = 0;

	for (size_t f = 0; f < t->nfrags; f++)
		order[f] = (by_start){ t->frags[f].box.off[axis], f };
	qsort(order, t->nfrags, sizeof(*order), cmp_start);
	for (size_t f = 0; f < t->nfrags; f++)
		distinct += f == 0 || order[f].start != order[f - 1].start;
	return distinct;
}

/* Sweeps along the axis the fragments are cut most along (so fragments
 * side by side are rarely compared): a fragment can only meet those that
 * start before it ends there.  0 when none overlap; -EINVAL with *a < *b
 * overlapping; -E2BIG past RS_TILING_MAX_PAIRS comparisons. */
static int find_overlap(const rs_tensor *t, by_start *order, size_t *a,
			size_t *b)
{
	uint64_t pairs = 0;
	size_t most = 0;
	int axis = 0;

	if (t->ndim == 0) {
		if (t->nfrags < 2)
			return 0;
		*a = 0;
		*b = 1;
		return -EINVAL;
	}
	for (int i = 0; i < t->ndim; i++) {
		size_t n = sort_along(t, i, order);

		if (n > most) {
			most = n;
			axis = i;
		}
	}
	sort_along(t, axis, order);
	for (size_t i = 0; i < t->nfrags; i++) {
		const rs_box *x = &t->frags[order[i].frag].box;
		uint64_t end = x->off[axis] + x->len[axis];

		for (size_t j = i + 1; j < t->nfrags && order[j].start < end; j++) {
			rs_box both;

			if (++pairs > RS_TILING_MAX_PAIRS)
				return -E2BIG;
			if (rs_box_intersect(x, &t->frags[order[j].frag].box,
					     &both)) {
				*a = order[i].frag < order[j].frag ? order[i].frag
								  : order[j].frag;
				*b = order[i].frag ^ order[j].frag ^ *a;
				return -EINVAL;
			}
		}
	}
	return 0;
}

int rs_tensor_check_tiling(const rs_tensor *t, size_t *a, size_t *b,
			   uint64_t *covered, uint64_t *total)
{
	by_start *order;
	uint64_t sum = 0;
	int err;

	/* The byte size was checked when the tensor was added. */
	rs_product(t->shape, t->ndim, total);
	*covered = *total;
	if (t->regular)
		return 0;
	for (size_t f = 0; f < t->nfrags; f++) {
		const rs_box *x = &t->frags[f].box;
		uint64_t vol;

		for (int i = 0; i < t->ndim; i++)
			if (x->off[i] > t->shape[i] ||
			    x->len[i] > t->shape[i] - x->off[i]) {
				*a = *b = f;
				return -ERANGE;
			}
		rs_product(x->len, t->ndim, &vol); /* inside: no overflow */
		if (!rs_add_u64(sum, vol, &sum))
			sum = UINT64_MAX;
	}
	order = malloc((t->nfrags ? t->nfrags : 1) * sizeof(*order));
	if (!order)
		return -ENOMEM;
	err = find_overlap(t, order, a, b);
	free(order);
	if (err)
		return err;
	/* Disjoint boxes inside the shape: their volumes add up to at most
	 * the whole, and to the whole only when they cover it. */
	*covered = sum;
	return sum == *total ? 0 : -ENODATA;
}

int rs_catalog_set_origin(rs_catalog *c, size_t index, const char *origin)
{
	char *copy = strdup(origin);

	if (!copy)
		return -ENOMEM;
	free(c->tensors[index].origin);
	c->tensors[index].origin = copy;
	return 0;
}

uint64_t rs_tensor_grid_index(const rs_tensor *t, const uint64_t *idx)
{
	uint64_t g = 0;

	for (int i = 0; i < t->ndim; i++)
		g = g * t->grid_count[i] + idx[i];
	return g;
}

void rs_catalog_set_chunk(rs_tensor *t, const uint64_t *idx, uint32_t source,
			  uint64_t offset)
{
	rs_fragment *f = &t->frags[rs_tensor_grid_index(t, idx)];

	rs_grid_cell(idx, t->grid, t->shape, t->ndim, &f->box);
	rs_c_strides(t->grid, t->ndim, f->stride);
	f->source = source;
	f->offset = offset;
}

uint64_t rs_tensor_chunk_bytes(const rs_tensor *t)
{
	uint64_t n = rs_dtype_size(t->dtype);

	/* Validated not to overflow by rs_catalog_add_regular. */
	for (int i = 0; i < t->ndim; i++)
		n *= t->grid[i];
	return n;
}

/* The piece of a local shard at flat [a, b) (C order over `len`, element
 * strides `stride`, global origin `base`) as boxes; `first` is the
 * fragment for local element 0 (its offset; the box is filled here).
 * Recursion depth is at most the rank. */
static int emit_range(rs_frag_list *fl, const rs_fragment *first, unsigned esize,
		      int ndim, const uint64_t *base, const uint64_t *len,
		      const uint64_t *stride, int axis, uint64_t lead,
		      uint64_t a, uint64_t b, uint64_t *pos)
{
	uint64_t inner = 1;
	int err;

	if (a >= b)
		return 0;
	for (int i = axis + 1; i < ndim; i++)
		inner *= len[i];
	/* pos[0..axis) are fixed; lead is the flat index of their corner */
	if (a % inner == 0 && b % inner == 0) {
		rs_fragment *f;

		err = rs_array_reserve(&fl->v, &fl->cap, fl->n + 1, sizeof(*f));
		if (err)
			return err;
		f = &fl->v[fl->n++];
		*f = *first;
		f->box.ndim = ndim;
		for (int i = 0; i < ndim; i++) {
			f->box.off[i] = base[i] + (i < axis ? pos[i] : 0);
			f->box.len[i] = i < axis ? 1 : len[i];
			f->stride[i] = stride[i] * first->stride[0];
		}
		f->box.off[axis] = base[axis] + a / inner;
		f->box.len[axis] = (b - a) / inner;
		f->offset = first->offset +
			    (lead + a) * first->stride[0] * esize;
		return 0;
	}
	if (a / inner == (b - 1) / inner) {
		uint64_t row = a / inner;

		pos[axis] = row;
		return emit_range(fl, first, esize, ndim, base, len, stride,
				  axis + 1, lead + row * inner, a - row * inner,
				  b - row * inner, pos);
	}
	if (a % inner) {
		uint64_t cut = (a / inner + 1) * inner;

		err = emit_range(fl, first, esize, ndim, base, len, stride,
				 axis, lead, a, cut, pos);
		if (err)
			return err;
		a = cut;
	}
	if (b / inner * inner > a) {
		err = emit_range(fl, first, esize, ndim, base, len, stride,
				 axis, lead, a, b / inner * inner, pos);
		if (err)
			return err;
		a = b / inner * inner;
	}
	return emit_range(fl, first, esize, ndim, base, len, stride, axis,
			  lead, a, b, pos);
}

int rs_frag_list_add_flat(rs_frag_list *fl, const rs_fragment *first,
			  unsigned esize, int ndim, const uint64_t *base,
			  const uint64_t *len, uint64_t a, uint64_t b)
{
	uint64_t stride[RS_MAX_DIMS], pos[RS_MAX_DIMS] = { 0 };

	rs_c_strides(len, ndim, stride);
	return emit_range(fl, first, esize, ndim, base, len, stride, 0, 0, a,
			  b, pos);
}
