/* zarr: Megatron-core dist checkpoints in the zarr backend (FORMATS.md §2).
 *
 * Reader: every directory holding a `.zarray` is an array; its chunk files
 * (`i.j.k`, raw C-order bytes of one full chunk, no compressor) become the
 * fragments of one catalog tensor.  Everything else - metadata.json,
 * common.pt, ShardedObject directories - is passed through.  A malformed
 * .zarray, a missing chunk or a chunk of the wrong size refuses the mount.
 *
 * View: arrays whose grid the layout keeps are passed through byte for
 * byte; the others get a rewritten .zarray (new "chunks", and "shape" for
 * re-padded vocab) and chunk files named by the new grid.
 */
#ifndef RS_ZARR_H
#define RS_ZARR_H

#include <stddef.h>
#include <stdint.h>

#include "formats/checkpoint.h"

/* Walks SOURCE (already opened into ck->sources) and fills ck. */
int rs_zarr_read(rs_checkpoint *ck, rs_diag *d);

/* Lists a zarr checkpoint's ShardedObjects, `<key>/shard_<...>.pt` files,
 * as the byte items `<key>/shard_<...>` other views carry (and marks their
 * entries `blob`). */
int rs_zarr_collect_blobs(rs_checkpoint *ck);

/* Parses one .zarray text into a new catalog tensor named `name`. */
int rs_zarr_parse_meta(const char *text, size_t len, const char *path,
		       const char *name, rs_catalog *c, size_t *tensor,
		       rs_diag *d);

/* Chunk file name of grid coordinates idx: "i.j.k", or "0" for a 0-d
 * array.  `size` of RS_MAX_DIMS*21 always suffices. */
void rs_zarr_chunk_name(const uint64_t *idx, int ndim, char *out,
			size_t size);

int rs_zarr_build_view(const rs_checkpoint *ck, const rs_layout *l,
		       rs_vtree *t, rs_diag *d);

#endif
