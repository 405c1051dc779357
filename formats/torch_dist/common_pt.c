/* The view's common.pt for a distributed-optimizer state read as model-space
 * tensors (docs/FORMATS.md, "Distributed optimizer"): megatron-core loads
 * that state at any layout only as the fully_reshardable form, and asks
 * for the form common.pt records.  So the source's common.pt is copied
 * with its optimizer's param_state_sharding_type (and content_metadata's
 * distrib_optim_sharding_type, where there is one) saying
 * fully_reshardable, plus the items the caller brings; the source's
 * common.pt is hidden behind the made one.
 */
#include "formats/torch_dist/torch_dist_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torch_object.h"

static bool skipped(const rs_pvalue *key, const char *const *skip)
{
	for (; *skip; skip++)
		if (rs_pv_str_is(key, *skip))
			return true;
	return false;
}

/* Writes the start of a dict and d's items but those keyed as a string of
 * the NULL-ended skip (the caller adds items and ends it). */
static int copy_dict_but(rs_pwriter *w, const rs_pvalue *d,
			 const char *const *skip, char *msg, size_t size)
{
	int err = 0;

	rs_pw_dict_begin(w);
	for (size_t j = 0; j < rs_pv_len(d) && !err; j++) {
		if (skipped(rs_pv_key(d, j), skip))
			continue;
		err = rs_pw_value(w, rs_pv_key(d, j), rs_megatron_copy_allow,
				  rs_megatron_members, msg, size);
		if (!err)
			err = rs_pw_value(w, rs_pv_val(d, j), rs_megatron_copy_allow,
					  rs_megatron_members, msg, size);
	}
	return err;
}

/* What the made common.pt drops (the second, with chained optimizers). */
static const char *const content_skip[] = { "distrib_optim_sharding_type", NULL };
static const char *const content_skip_chained[] = { "distrib_optim_sharding_type",
						    "chained_optim_avoid_prefix", NULL };
static const char *const optimizer_skip[] = { "param_state_sharding_type",
					      "param_state", NULL };

/* One optimizer's dict: its form rewritten, `items` (may be NULL) added.
 * Its param_state is left out, as megatron-core's own fully_reshardable
 * common.pt has none: all it holds after the save took the sharded
 * tensors out is per-param leftovers (torch AdamW's 0-d steps, which the
 * load takes from the param groups) indexed in the source's DP layout. */
static int write_optimizer(rs_pwriter *w, const rs_pvalue *old,
			   const rs_common_items *items, char *msg, size_t size)
{
	int err = copy_dict_but(w, old, optimizer_skip, msg, size);

	for (size_t j = 0; items && j < items->n && !err; j++) {
		rs_pw_str(w, items->keys[j], items->klen[j]);
		err = rs_pw_value(w, rs_pv_item(rs_pickle_root(items->objs[j]), 0),
				  rs_megatron_copy_allow, rs_megatron_members,
				  msg, size);
	}
	rs_pw_cstr(w, "param_state_sharding_type");
	rs_pw_cstr(w, "fully_reshardable");
	rs_pw_dict_end(w);
	return err;
}

/* The root dict copied, the optimizer's form and content_metadata's
 * rewritten, items[i] added to optimizer i's dict.  Chained optimizers
 * (megatron-core's dense and expert pair: common.pt's `optimizer` a dict
 * keyed 0, 1, ...) are rewritten each; content_metadata then also says
 * chained_optim_avoid_prefix, because the view holds their state under
 * the unprefixed optimizer.state names, which megatron-core's load asks
 * for only with that flag. */
static int write_common(rs_pwriter *w, const rs_pvalue *root, bool chained,
			const rs_common_items *items, char *msg, size_t size)
{
	const rs_pvalue *old = rs_pv_get(root, "optimizer");
	const rs_pvalue *content = rs_pv_get(root, "content_metadata");
	int err = 0;

	rs_pw_dict_begin(w);
	for (size_t i = 0; i < rs_pv_len(root) && !err; i++) {
		const rs_pvalue *v = rs_pv_val(root, i);

		err = rs_pw_value(w, rs_pv_key(root, i), rs_megatron_copy_allow,
				  rs_megatron_members, msg, size);
		if (err)
			break;
		if (v == content && rs_pv_kind(v) == RS_PV_DICT) {
			err = copy_dict_but(w, v, chained ? content_skip_chained
							  : content_skip, msg, size);
			rs_pw_cstr(w, "distrib_optim_sharding_type");
			rs_pw_cstr(w, "fully_reshardable");
			if (chained) {
				rs_pw_cstr(w, "chained_optim_avoid_prefix");
				rs_pw_bool(w, true);
			}
			rs_pw_dict_end(w);
			continue;
		}
		if (v != old) {
			err = rs_pw_value(w, v, rs_megatron_copy_allow,
					  rs_megatron_members, msg, size);
			continue;
		}
		if (!chained) {
			err = write_optimizer(w, old, items, msg, size);
			continue;
		}
		rs_pw_dict_begin(w);
		for (size_t j = 0; j < rs_pv_len(old) && !err; j++) {
			rs_pw_int(w, (int64_t)j);
			err = write_optimizer(w, rs_pv_val(old, j),
					      items ? &items[j] : NULL, msg, size);
		}
		rs_pw_dict_end(w);
	}
	rs_pw_dict_end(w);
	return err;
}

/* How many chained optimizers common.pt's `optimizer` holds (a dict keyed
 * 0..n-1 in order, each naming `form`), 0 for one plain optimizer naming
 * it, -1 for neither. */
static long chained_count(const rs_pvalue *opt, const char *form)
{
	int64_t k;

	if (rs_pv_str_is(rs_pv_get(opt, "param_state_sharding_type"), form))
		return 0;
	if (rs_pv_kind(opt) != RS_PV_DICT || rs_pv_len(opt) < 2 ||
	    rs_pv_len(opt) > RS_COMMON_MAX_CHAINED)
		return -1;
	for (size_t j = 0; j < rs_pv_len(opt); j++)
		if (rs_pv_int(rs_pv_key(opt, j), &k) != 0 || k != (int64_t)j ||
		    !rs_pv_str_is(rs_pv_get(rs_pv_val(opt, j),
					    "param_state_sharding_type"), form))
			return -1;
	return (long)rs_pv_len(opt);
}

int rs_torch_dist_make_common(rs_checkpoint *ck, rs_diag *d, const char *form,
			      const rs_common_items *items, size_t nitems)
{
	rs_entry *common = rs_checkpoint_top_entry(ck, "common.pt");
	rs_pickle *top = NULL;
	uint8_t *pkl = NULL;
	size_t plen = 0;
	char msg[200];
	rs_made_file *made;
	long chained;
	rs_pwriter w;
	int err;

	if (!common || common->is_dir) {
		rs_diag_add(d, "%s/common.pt: missing; a %s checkpoint keeps the optimizer's sharding type there",
			    ck->dir_path, form);
		return -EINVAL;
	}
	err = rs_checkpoint_read_pickle(ck, common->source, 0,
					rs_sources_id(ck->sources, common->source)->size,
					true, &top, msg, sizeof(msg));
	if (err) {
		rs_diag_add(d, "%s/common.pt: %s", ck->dir_path, msg);
		goto out;
	}
	if (rs_pv_kind(rs_pickle_root(top)) != RS_PV_DICT) {
		rs_diag_add(d, "%s/common.pt: not a dict", ck->dir_path);
		err = -EINVAL;
		goto out;
	}
	chained = chained_count(rs_pv_get(rs_pickle_root(top), "optimizer"), form);
	if (chained < 0) {
		rs_diag_add(d, "%s/common.pt: its optimizer's param_state_sharding_type (or, for chained optimizers, that of each of optimizer[0], optimizer[1], ...) is not '%s', but .metadata holds %s state",
			    ck->dir_path, form, form);
		err = -EINVAL;
		goto out;
	}
	if (items && nitems != (chained ? (size_t)chained : 1)) {
		rs_diag_add(d, "%s/common.pt: records %ld chained optimizers, but .metadata holds %s state of %zu",
			    ck->dir_path, chained ? chained : 1, form, nitems);
		err = -EINVAL;
		goto out;
	}
	rs_pw_init(&w, 2);
	err = write_common(&w, rs_pickle_root(top), chained > 0, items, msg,
			   sizeof(msg));
	if (err) {
		rs_pw_free(&w);
		rs_diag_add(d, "%s/common.pt: cannot be rewritten for the view: %s",
			    ck->dir_path, msg);
		err = -EINVAL;
		goto out;
	}
	err = rs_pw_finish(&w, &pkl, &plen);
	if (err)
		goto out;
	made = realloc(ck->made, (ck->nmade + 1) * sizeof(*made));
	if (!made) {
		err = -ENOMEM;
		goto out;
	}
	ck->made = made;
	memset(&ck->made[ck->nmade], 0, sizeof(*ck->made));
	ck->made[ck->nmade].name = strdup("common.pt");
	if (!ck->made[ck->nmade].name) {
		err = -ENOMEM;
		goto out;
	}
	err = rs_torch_object_make(pkl, plen, &ck->made[ck->nmade].bytes,
				   &ck->made[ck->nmade].len);
	ck->nmade++;
	if (!err)
		common->hidden = true;
out:
	free(pkl);
	rs_pickle_free(top);
	return err;
}
