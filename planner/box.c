#include "planner/box.h"

bool rs_product(const uint64_t *v, int n, uint64_t *out)
{
	uint64_t p = 1;

	for (int i = 0; i < n; i++)
		if (!rs_mul_u64(p, v[i], &p))
			return false;
	*out = p;
	return true;
}

bool rs_box_intersect(const rs_box *a, const rs_box *b, rs_box *out)
{
	if (a->ndim != b->ndim)
		return false;
	out->ndim = a->ndim;
	for (int i = 0; i < a->ndim; i++) {
		uint64_t lo = a->off[i] > b->off[i] ? a->off[i] : b->off[i];
		uint64_t ae = a->off[i] + a->len[i];
		uint64_t be = b->off[i] + b->len[i];
		uint64_t hi = ae < be ? ae : be;

		if (hi <= lo)
			return false;
		out->off[i] = lo;
		out->len[i] = hi - lo;
	}
	return true;
}

void rs_grid_count(const uint64_t *shape, const uint64_t *chunk, int n,
		   uint64_t *count)
{
	for (int i = 0; i < n; i++)
		count[i] = shape[i] / chunk[i] + (shape[i] % chunk[i] != 0);
}

void rs_grid_cell(const uint64_t *idx, const uint64_t *chunk,
		  const uint64_t *shape, int n, rs_box *out)
{
	out->ndim = n;
	for (int i = 0; i < n; i++) {
		uint64_t off = idx[i] * chunk[i], end = off + chunk[i];

		out->off[i] = off;
		out->len[i] = (end > shape[i] ? shape[i] : end) - off;
	}
}

void rs_grid_coords(uint64_t g, const uint64_t *count, int n, uint64_t *idx)
{
	for (int i = n - 1; i >= 0; i--) {
		idx[i] = g % count[i];
		g /= count[i];
	}
}

void rs_c_strides(const uint64_t *extent, int ndim, uint64_t *stride)
{
	uint64_t s = 1;

	for (int i = ndim - 1; i >= 0; i--) {
		stride[i] = s;
		s *= extent[i];
	}
}
