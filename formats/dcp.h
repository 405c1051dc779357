/* dcp: torch_dist checkpoints, i.e. PyTorch Distributed Checkpoint
 * (FORMATS.md §3).
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
 * names an unknown class; a relative_path that is not one plain file name;
 * an item outside its file; a chunk without storage, of the wrong dtype or
 * shape, or whose strided elements leave their storage; mcore's old
 * `flattened_range` items.
 */
#ifndef RS_DCP_H
#define RS_DCP_H

#include "formats/checkpoint.h"

/* Reads SOURCE (already opened into ck->sources) into ck. */
int rs_dcp_read(rs_checkpoint *ck, rs_diag *d);

/* Builds the torch_dist view of any checkpoint (see dcp_view.c for what it
 * holds and who owns which chunk). */
int rs_dcp_build_view(const rs_checkpoint *ck, const rs_layout *l,
		      rs_vtree *t, rs_diag *d);

#endif
