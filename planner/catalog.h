/* catalog: the logical tensors of a checkpoint and where their bytes live.
 *
 * A tensor has a name, a dtype, a global shape and fragments.  A fragment is
 * a global box whose elements live in one source file: element box.off is at
 * byte `offset`, and a step of one along axis i moves `stride[i]` elements.
 * A zarr chunk is C order over the full chunk extents (an edge chunk stores
 * more than the part inside the tensor); a torch.save tensor may have any
 * strides.  Fragments of one tensor never overlap.
 *
 * When the fragments form a regular grid (chunk size `grid[i]` along every
 * axis, fragment g at linear grid index g), `regular` is set, and planning a
 * box touches only the fragments it overlaps.
 *
 * Ownership: the catalog owns its tensors, their names and fragments.
 * Functions return 0 or a negative errno.
 */
#ifndef RS_CATALOG_H
#define RS_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/box.h"
#include "planner/dtype.h"

typedef struct {
	rs_box box;                     /* global region held (inside shape) */
	uint64_t stride[RS_MAX_DIMS];   /* element strides in the source */
	uint32_t source;                /* index into the rs_sources table */
	uint64_t offset;                /* byte offset of element box.off */
} rs_fragment;

typedef struct {
	char *name;
	char *origin;                   /* file that defines it, for messages */
	rs_dtype dtype;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	bool regular;
	uint64_t grid[RS_MAX_DIMS];     /* chunk extents when regular */
	uint64_t grid_count[RS_MAX_DIMS]; /* chunks along each axis */
	rs_fragment *frags;
	size_t nfrags;
} rs_tensor;

typedef struct {
	rs_tensor *tensors;
	size_t count;
	size_t cap;
} rs_catalog;

void rs_catalog_init(rs_catalog *c);
void rs_catalog_free(rs_catalog *c);
/* Removes (and frees) every tensor whose name starts with `prefix`; the
 * others keep their order. */
void rs_catalog_drop_prefix(rs_catalog *c, const char *prefix);

/* Fragments of one tensor at most.  Room for them is allocated up front
 * (about 200 bytes each) from numbers a checkpoint gives, so a few bytes of
 * hostile .zarray must not cost gigabytes.  2^20 fragments is ~200 MB,
 * far above any real grid (layers x experts x TP is ~10^5 chunk files in
 * one directory). */
#define RS_CATALOG_MAX_FRAGS (1u << 20)

/* Appends a tensor with a regular grid of `chunk` extents and room for one
 * fragment per grid cell (fragments start zeroed; the caller fills each with
 * rs_catalog_set_chunk).  `name` is copied.  On success *index is the new
 * tensor's index.  -EOVERFLOW when the grid or byte sizes overflow, -E2BIG
 * past RS_CATALOG_MAX_FRAGS cells. */
int rs_catalog_add_regular(rs_catalog *c, const char *name, rs_dtype dtype,
			   int ndim, const uint64_t *shape,
			   const uint64_t *chunk, size_t *index);

/* Appends a tensor with `nfrags` zeroed fragments the caller fills in any
 * order (then rs_tensor_make_regular may find their grid).  `name` is
 * copied.  -EOVERFLOW when the byte size of the shape overflows, -E2BIG
 * past RS_CATALOG_MAX_FRAGS fragments. */
int rs_catalog_add_fragments(rs_catalog *c, const char *name, rs_dtype dtype,
			     int ndim, const uint64_t *shape, size_t nfrags,
			     size_t *index);

/* When the fragments tile the shape as a regular grid (the fragment at the
 * origin gives the chunk extents; every other one sits on that grid, cut
 * only by the shape's end, once each), orders them by grid index and sets
 * `regular`.  Returns true if so; otherwise leaves the tensor unchanged.
 * Fragments that overlap or leave holes are never regular. */
bool rs_tensor_make_regular(rs_tensor *t);

/* Whether the fragments tile the shape exactly, whatever their grid: each
 * inside the shape, no two overlapping, their volumes adding up to the
 * whole.  (A regular tensor does by construction.)  Fragments that leave a
 * hole must not be served: the plan would fill it with zeros.  Returns 0;
 * -ERANGE when fragment *a lies outside the shape; -EINVAL with *a < *b
 * two overlapping fragments; -ENODATA when they leave elements uncovered
 * (*covered of *total); -E2BIG when checking would take more than
 * RS_TILING_MAX_PAIRS comparisons (refuse those too); -ENOMEM. */
#define RS_TILING_MAX_PAIRS (1u << 24)
int rs_tensor_check_tiling(const rs_tensor *t, size_t *a, size_t *b,
			   uint64_t *covered, uint64_t *total);

/* Records the file that defines tensor `index` (copied), so problems with
 * it can name the file.  Returns 0 or -ENOMEM. */
int rs_catalog_set_origin(rs_catalog *c, size_t index, const char *origin);

/* Linear grid index of chunk coordinates `idx` (C order). */
uint64_t rs_tensor_grid_index(const rs_tensor *t, const uint64_t *idx);

/* Fills the fragment of grid cell `idx`: its box is the cell clipped to the
 * shape, laid out C order over the full chunk extents. */
void rs_catalog_set_chunk(rs_tensor *t, const uint64_t *idx, uint32_t source,
			  uint64_t offset);

/* Bytes of one full stored chunk of a regular tensor. */
uint64_t rs_tensor_chunk_bytes(const rs_tensor *t);

/* Fragments being collected for one tensor (the caller frees v). */
typedef struct {
	rs_fragment *v;
	size_t n, cap;
} rs_frag_list;

/* Appends the boxes holding flat elements [a, b) (a <= b) of a C-order box
 * of extents len[0..ndim) at global origin `base`: a partial first row,
 * whole rows, a partial last row, recursively, so at most 2*ndim - 1.
 * `first` gives their source, in `offset` the byte offset of the box's flat
 * element 0 (which may lie outside [a, b): only offsets inside it are
 * formed, so it may wrap) and in stride[0] the source's element step
 * between flat neighbours.  The caller checks that the box lies in the
 * tensor.  Returns 0 or -ENOMEM. */
int rs_frag_list_add_flat(rs_frag_list *fl, const rs_fragment *first,
			  unsigned esize, int ndim, const uint64_t *base,
			  const uint64_t *len, uint64_t a, uint64_t b);

#endif
