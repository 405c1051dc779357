/* torch_dist_int: the torch_dist reader and view builder, for the format's
 * row; private to formats/torch_dist/ (torch_dist.h is the contract). */
#ifndef RS_TORCH_DIST_INT_H
#define RS_TORCH_DIST_INT_H

#include "formats/checkpoint.h"

int rs_torch_dist_read(rs_checkpoint *ck, const rs_open_opts *o,
		       rs_diag *d);
/* Any checkpoint as torch_dist (see view.c for what it holds and who owns
 * which chunk). */
int rs_torch_dist_build_view(const rs_checkpoint *ck, const rs_layout *l,
			     rs_vtree *t, rs_diag *d);

#endif
