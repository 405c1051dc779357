/* torch_dist: Megatron-core dist checkpoints in the torch_dist backend,
 * which are PyTorch Distributed Checkpoint (DCP) directories, and plain
 * DCP directories (docs/FORMATS.md, "torch_dist"), as a source and as a
 * view.
 *
 * Reader: `.metadata` is parsed with the restricted pickle reader (nothing
 * executed; only torch's and Megatron's classes are allowed, resolved by
 * name so torch and mcore versions that moved them still parse).  Every
 * tensor chunk is a torch.save zip inside a `.distcp` file; its central
 * directory and data.pkl are read (never its data) to find where the
 * chunk's elements are and with which strides, and that becomes one catalog
 * fragment.  Byte items become blobs.  metadata.json, common.pt and any
 * other file are passed through; `.metadata` and `*.distcp` are not (a view
 * writes its own).
 *
 * Refused, with a line naming the file: a `.metadata` that does not parse or
 * names an unknown class; a name or relative_path holding a NUL, or given
 * twice (Python keeps the last; the C side would see both); a relative_path
 * that is not one plain file name; an item outside its file; a chunk
 * without storage, of the wrong dtype or shape, or whose strided elements
 * leave their storage; chunks that overlap or leave part of their tensor
 * uncovered (a view would serve zeros there); mcore's old
 * `flattened_range` items.
 */
#ifndef RS_TORCH_DIST_H
#define RS_TORCH_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "formats/checkpoint.h"

/* The torch_dist row of the format table. */
extern const rs_format_def rs_torch_dist_format;

/* The part of the reader after the walk: parses the `.metadata` bytes
 * buf[0, len) and adds its tensors (each chunk's torch.save item read from
 * the `.distcp` entry of ck that storage_data names) and byte items to ck.
 * ck must hold SOURCE's root entries and their sources already.  Public so
 * the metadata parser can be fuzzed without a directory walk. */
int rs_torch_dist_read_metadata(rs_checkpoint *ck, const uint8_t *buf,
				size_t len, rs_diag *d);

#endif
