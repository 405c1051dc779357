/* box: axis-aligned regions of an N-d tensor, and overflow-checked sizes.
 *
 * A box is [off[i], off[i]+len[i]) along each of ndim axes, in global
 * element coordinates.  Every size in reshardfs is a uint64_t computed with
 * the checked helpers below: a checkpoint's numbers are never trusted.
 */
#ifndef RS_BOX_H
#define RS_BOX_H

#include <stdbool.h>
#include <stdint.h>

#define RS_MAX_DIMS 8

typedef struct {
	int ndim;
	uint64_t off[RS_MAX_DIMS];
	uint64_t len[RS_MAX_DIMS];
} rs_box;

/* a*b and a+b; return false (and leave *out untouched) on overflow. */
static inline bool rs_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

static inline bool rs_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return !__builtin_add_overflow(a, b, out);
}

/* Product of n extents; false on overflow.  An empty product is 1. */
bool rs_product(const uint64_t *v, int n, uint64_t *out);

/* Intersection of two boxes of the same rank.  Returns false when they do
 * not overlap (or a zero-sized axis makes the result empty). */
bool rs_box_intersect(const rs_box *a, const rs_box *b, rs_box *out);

/* A chunk grid over a shape: cells of `chunk` extents, the last along each
 * axis cut by the shape's end.  Callers check chunk[i] > 0. */

/* Cells along each axis: ceil(shape / chunk). */
void rs_grid_count(const uint64_t *shape, const uint64_t *chunk, int n,
		   uint64_t *count);

/* The box of cell idx. */
void rs_grid_cell(const uint64_t *idx, const uint64_t *chunk,
		  const uint64_t *shape, int n, rs_box *out);

/* The coordinates of linear (C-order) cell index g. */
void rs_grid_coords(uint64_t g, const uint64_t *count, int n, uint64_t *idx);

/* Steps idx through the grid [0, count) in C order; false once it wraps
 * back to all zeros (every position has been visited). */
static inline bool rs_grid_next(uint64_t *idx, const uint64_t *count, int n)
{
	int i = n - 1;

	while (i >= 0 && ++idx[i] == count[i])
		idx[i--] = 0;
	return i >= 0;
}

/* C-order element strides of a dense array with the given extents. */
void rs_c_strides(const uint64_t *extent, int ndim, uint64_t *stride);

#endif
