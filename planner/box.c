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

void rs_c_strides(const uint64_t *extent, int ndim, uint64_t *stride)
{
	uint64_t s = 1;

	for (int i = ndim - 1; i >= 0; i--) {
		stride[i] = s;
		s *= extent[i];
	}
}
