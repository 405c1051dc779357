/* torch_dist_int: the torch_dist reader and view builder, for the format's
 * row; private to formats/torch_dist/ (torch_dist.h is the contract). */
#ifndef RS_TORCH_DIST_INT_H
#define RS_TORCH_DIST_INT_H

#include "formats/checkpoint.h"
#include "formats/codec/pickle.h"

int rs_torch_dist_read(rs_checkpoint *ck, const rs_open_opts *o,
		       rs_diag *d);
/* megatron-core's dp_reshardable distributed-optimizer buckets in ck's
 * catalog (read from meta_path) as model-space optimizer.state tensors,
 * with a common.pt made for the view (see distopt.c).  0 when there are
 * none; -EINVAL with the reason in d when their layout cannot be
 * recomputed; -ENOMEM. */
int rs_torch_dist_read_distopt(rs_checkpoint *ck, const char *meta_path,
			       rs_diag *d);
/* Tensor t, read as stored, made the N-d tensor of shape orig[0..ndim) a
 * megatron-core flattened_range tensor was reformulated from (see
 * flat_range.c): its fragments become boxes of that shape, the bytes they
 * point at unchanged.  -EINVAL with the reason in why when the stored
 * shape or a chunk does not fit that reformulation; -ENOMEM. */
int rs_torch_dist_unflatten(rs_tensor *t, int ndim, const uint64_t *orig,
			    char *why, size_t size);
/* After flattened_range optimizer state was unflattened: its main params
 * named as the fully_reshardable form names them and common.pt made to
 * say that form.  0, -EINVAL (reason in d), -ENOMEM. */
int rs_torch_dist_read_flat_state(rs_checkpoint *ck, const char *meta_path,
				  rs_diag *d);

/* What the view's common.pt adds to an optimizer's dict: key j
 * (klen[j] bytes) with the one item of the list objs[j] holds. */
#define RS_COMMON_MAX_ITEMS 16
#define RS_COMMON_MAX_CHAINED 8
typedef struct {
	size_t n;
	const char *const *keys;
	const size_t *klen;
	rs_pickle *const *objs;
} rs_common_items;
/* Makes the view's common.pt (see common_pt.c): the source's, its
 * optimizer's form (which must be `form`; of each optimizer, for chained
 * optimizers) and content_metadata's saying fully_reshardable, items[i]
 * (items may be NULL, else nitems must be the optimizer count) added to
 * optimizer i's dict; the source's common.pt is hidden.  0, -EINVAL
 * (reason in d), -ENOMEM. */
int rs_torch_dist_make_common(rs_checkpoint *ck, rs_diag *d, const char *form,
			      const rs_common_items *items, size_t nitems);

/* Any checkpoint as torch_dist (see view.c for what it holds and who owns
 * which chunk). */
int rs_torch_dist_build_view(const rs_checkpoint *ck, const rs_layout *l,
			     rs_vtree *t, rs_diag *d);

#endif
