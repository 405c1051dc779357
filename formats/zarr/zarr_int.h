/* zarr_int: what the zarr reader keeps for the zarr view; private to
 * formats/zarr/ (formats/zarr/zarr.h is the module's contract). */
#ifndef RS_ZARR_INT_H
#define RS_ZARR_INT_H

#include <stddef.h>
#include <stdint.h>

#include "formats/checkpoint.h"

/* A zarr array of SOURCE: a directory with a .zarray, chunk files and
 * perhaps other files (listed as entries whose parent is `dir_entry`). */
typedef struct {
	size_t tensor;          /* index in the catalog */
	long dir_entry;         /* its directory in the entry list */
	uint32_t zarray_source;
	char *zarray_text;
	size_t zarray_len;
} rs_zarr_array;

/* ck->extra of a zarr source. */
typedef struct {
	rs_zarr_array *arrays;
	size_t narrays, cap_arrays;
} rs_zarr_state;

/* The zarr source's arrays, or NULL when ck is not a zarr source. */
const rs_zarr_state *rs_zarr_state_of(const rs_checkpoint *ck);

int rs_zarr_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);
int rs_zarr_build_view(const rs_checkpoint *ck, const rs_layout *l,
		       rs_vtree *t, rs_diag *d);

/* Chunk file name of grid coordinates idx: "i.j.k", or "0" for a 0-d
 * array.  `size` of RS_MAX_DIMS*21 always suffices. */
void rs_zarr_chunk_name(const uint64_t *idx, int ndim, char *out,
			size_t size);

#endif
