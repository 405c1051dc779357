/* megatron-core's flattened_range tensors as the N-d tensors they are cut
 * from (docs/FORMATS.md, "Distributed optimizer").
 *
 * A fully_sharded_model_space save (megatron-core's default form up to
 * 0.13, deprecated since) holds each param's optimizer state as pieces a
 * DP rank owns: a flat range of one TP shard.  torch_dist cannot store a
 * flat range of an N-d box, so megatron-core reformulates an [X, Y, Z]
 * tensor cut in [x, y, z] shards as [X/x, Y/y, Z/z, x*y*z]: a chunk is one
 * shard's cell and a range of its flat elements, and
 * mcore_data[key]["nd_reformulated_orig_global_shape"] records [X, Y, Z].
 * Each chunk is re-expressed as the few boxes of the original tensor it
 * holds, pointing at the same stored bytes.
 *
 * The state is then the model-space tensors megatron-core's
 * fully_reshardable form names (its fp32_param called param), and the
 * view's common.pt says that form (common_pt.c): the one it loads at any
 * layout.
 */
#include "formats/torch_dist/torch_dist_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_PREFIX "optimizer.state."
#define FP32_PARAM STATE_PREFIX "fp32_param."
#define PARAM STATE_PREFIX "param."

int rs_torch_dist_unflatten(rs_tensor *t, int ndim, const uint64_t *orig,
			    char *why, size_t size)
{
	uint64_t shard[RS_MAX_DIMS], numel = 1;
	rs_frag_list fl = { 0 };
	unsigned esize = rs_dtype_size(t->dtype);
	int err;

	if (ndim < 1 || t->ndim != ndim + 1) {
		snprintf(why, size, "its stored shape has %d axes; a flattened_range tensor of %d axes is stored with %d",
			 t->ndim, ndim, ndim + 1);
		return -EINVAL;
	}
	for (int i = 0; i < ndim; i++) {
		if (t->shape[i] == 0 || orig[i] % t->shape[i] != 0) {
			snprintf(why, size, "its original axis %d (%llu) is not cut into the %llu shards its stored shape says",
				 i, (unsigned long long)orig[i],
				 (unsigned long long)t->shape[i]);
			return -EINVAL;
		}
		shard[i] = orig[i] / t->shape[i];
		if (shard[i] && numel > UINT64_MAX / shard[i]) {
			snprintf(why, size, "its shard size overflows");
			return -EINVAL;
		}
		numel *= shard[i];
	}
	if (numel != t->shape[ndim]) {
		snprintf(why, size, "its shards would hold %llu elements and its stored flat axis is %llu long",
			 (unsigned long long)numel,
			 (unsigned long long)t->shape[ndim]);
		return -EINVAL;
	}
	for (size_t c = 0; c < t->nfrags; c++) {
		const rs_fragment *f = &t->frags[c];
		uint64_t base[RS_MAX_DIMS], a = f->box.off[ndim];
		rs_fragment first = *f;

		for (int i = 0; i < ndim; i++) {
			if (f->box.len[i] != 1) {
				snprintf(why, size, "chunk %zu spans %llu shards along axis %d, not one",
					 c, (unsigned long long)f->box.len[i], i);
				err = -EINVAL;
				goto fail;
			}
			base[i] = f->box.off[i] * shard[i];
		}
		/* flat element 0 of the shard, a elements before this chunk's
		 * first (the offset may wrap; only [a, a + len) is used) */
		first.stride[0] = f->stride[ndim];
		first.offset = f->offset - a * f->stride[ndim] * esize;
		err = rs_frag_list_add_flat(&fl, &first, esize, ndim, base, shard,
					    a, a + f->box.len[ndim]);
		if (err)
			goto fail;
		if (fl.n > RS_CATALOG_MAX_FRAGS) {
			snprintf(why, size, "its flat ranges make more than %u boxes",
				 RS_CATALOG_MAX_FRAGS);
			err = -EINVAL;
			goto fail;
		}
	}
	free(t->frags);
	t->frags = fl.v;
	t->nfrags = fl.n;
	t->ndim = ndim;
	memset(t->shape, 0, sizeof(t->shape));
	memcpy(t->shape, orig, (size_t)ndim * sizeof(*orig));
	t->regular = false;
	return 0;
fail:
	if (err == -ENOMEM)
		snprintf(why, size, "out of memory");
	free(fl.v);
	return err;
}

/* optimizer.state.fp32_param.<key> renamed optimizer.state.param.<key>,
 * the name the fully_reshardable form loads the main params by. */
static int rename_main_params(rs_checkpoint *ck, const char *meta_path,
			      rs_diag *d)
{
	rs_catalog *c = &ck->catalog;

	for (size_t i = 0; i < c->count; i++) {
		const char *key = c->tensors[i].name + strlen(FP32_PARAM);
		char *name;

		if (strncmp(c->tensors[i].name, FP32_PARAM, strlen(FP32_PARAM)) != 0)
			continue;
		if (asprintf(&name, PARAM "%s", key) < 0)
			return -ENOMEM;
		for (size_t j = 0; j < c->count; j++)
			if (strcmp(c->tensors[j].name, name) == 0) {
				rs_diag_add(d, "%s: holds both %s and %s, the main params twice",
					    meta_path, c->tensors[i].name, name);
				free(name);
				return -EINVAL;
			}
		free(c->tensors[i].name);
		c->tensors[i].name = name;
	}
	return 0;
}

int rs_torch_dist_read_flat_state(rs_checkpoint *ck, const char *meta_path,
				  rs_diag *d)
{
	int err = rename_main_params(ck, meta_path, d);

	if (!err)
		err = rs_torch_dist_make_common(ck, d, "fully_sharded_model_space",
						NULL, 0);
	return err;
}
