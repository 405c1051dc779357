/* torch_dist_int: the torch_dist reader and view builder, for the format's
 * row; private to formats/torch_dist/ (torch_dist.h is the contract). */
#ifndef RS_TORCH_DIST_INT_H
#define RS_TORCH_DIST_INT_H

#include "formats/checkpoint.h"

int rs_torch_dist_read(rs_checkpoint *ck, const rs_open_opts *o,
		       rs_diag *d);
/* megatron-core's dp_reshardable distributed-optimizer buckets in ck's
 * catalog (read from meta_path) as model-space optimizer.state tensors,
 * with a common.pt made for the view (see distopt.c).  0 when there are
 * none; -EINVAL with the reason in d when their layout cannot be
 * recomputed; -ENOMEM. */
int rs_torch_dist_read_distopt(rs_checkpoint *ck, const char *meta_path,
			       rs_diag *d);
/* Any checkpoint as torch_dist (see view.c for what it holds and who owns
 * which chunk). */
int rs_torch_dist_build_view(const rs_checkpoint *ck, const rs_layout *l,
			     rs_vtree *t, rs_diag *d);

#endif
