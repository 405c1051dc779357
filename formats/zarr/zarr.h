/* zarr: Megatron-core dist checkpoints in the zarr backend
 * (docs/FORMATS.md, "zarr"), as a source and as a view.
 *
 * Reader: every directory holding a `.zarray` is an array; its chunk files
 * (`i.j.k`, raw C-order bytes of one full chunk, no compressor) become the
 * fragments of one catalog tensor.  ShardedObject files (`<key>/shard_
 * <...>.pt`) become byte items.  Everything else - metadata.json,
 * common.pt - is passed through.  A malformed .zarray, a missing chunk or
 * a chunk of the wrong size refuses the mount.
 *
 * View: arrays whose grid the layout keeps are passed through byte for
 * byte; the others get a rewritten .zarray (new "chunks", and "shape" for
 * re-padded vocab) and chunk files named by the new grid.  Tensors of
 * other formats' sources get an array directory each, byte items their
 * `.pt` files, and a source without metadata.json gets one.
 */
#ifndef RS_ZARR_H
#define RS_ZARR_H

#include <stddef.h>

#include "formats/checkpoint.h"

/* The zarr row of the format table. */
extern const rs_format_def rs_zarr_format;

/* Parses one .zarray text into a new catalog tensor named `name`; `path`
 * names the file in messages.  Public for the unit and fuzz tests. */
int rs_zarr_parse_meta(const char *text, size_t len, const char *path,
		       const char *name, rs_catalog *c, size_t *tensor,
		       rs_diag *d);

#endif
