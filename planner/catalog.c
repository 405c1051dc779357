#include "planner/catalog.h"

#include "planner/array.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void rs_catalog_init(rs_catalog *c)
{
	memset(c, 0, sizeof(*c));
}

void rs_catalog_free(rs_catalog *c)
{
	for (size_t i = 0; i < c->count; i++) {
		free(c->tensors[i].name);
		free(c->tensors[i].origin);
		free(c->tensors[i].frags);
	}
	free(c->tensors);
	memset(c, 0, sizeof(*c));
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
	if (nfrags > (1u << 24))
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
