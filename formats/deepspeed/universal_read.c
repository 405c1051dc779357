/* A universal checkpoint as a source (formats/deepspeed/deepspeed.h):
 * zero/<param>/ directories as ds_to_universal.py writes them, the shapes
 * its flat stage 3 files lack from param_shapes. */
#include "formats/deepspeed/deepspeed_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The entry of `name` in directory `dir`, -1. */
long rs_ds_child(const rs_checkpoint *ck, long dir, const char *name)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent == dir &&
		    strcmp(ck->entries[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* One zero/<param>/<state>.pt: its 'param' (or, as ds_to_universal
 * writes stage 3's, the bare flat tensor) as catalog tensor `name`, in
 * the param's shape (param_shapes') when it is stored flat. */
static int universal_state(rs_ds_reader *r, long file, const char *name,
			   const rs_pvalue *shapes, const char *param,
			   bool *is_step)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_file f = { .entry = file, .source = ck->entries[file].source };
	const rs_pvalue *v, *shape = rs_pv_get(shapes, param);
	uint64_t dims[RS_MAX_DIMS], numel = 1, n = 1;
	int ndim = 0, err = rs_ds_open(r, &f, true);
	rs_torch_tensor t;

	if (err)
		goto out;
	v = rs_pickle_root(f.pk);
	if (rs_pv_kind(v) == RS_PV_DICT)
		v = rs_pv_get(v, "param");
	err = rs_ds_tensor(r, &f, v, "param", &t);
	if (err)
		goto out;
	if (is_step) {
		double step;

		*is_step = true;
		err = rs_ds_read_step(r, &f, v, &step);
		if (!err && r->st->groups && isnan(r->st->step[0]))
			r->st->step[0] = step;
		goto out;
	}
	if (t.dtype != RS_DTYPE_F32) {
		rs_diag_add(r->d, "%s: param is not float32", f.path);
		err = -EINVAL;
		goto out;
	}
	for (int k = 0; k < t.ndim; k++)
		n *= t.shape[k];
	if (t.ndim == 1 && shape && rs_pv_dims(shape, dims, &ndim, RS_MAX_DIMS)) {
		for (int k = 0; k < ndim; k++)
			numel *= dims[k];
		if (numel != n || ndim < 1) {
			rs_diag_add(r->d, "%s: holds %llu elements, param_shapes says %s has %llu",
				    f.path, (unsigned long long)n, param,
				    (unsigned long long)numel);
			err = -EINVAL;
			goto out;
		}
	} else {
		ndim = t.ndim;
		memcpy(dims, t.shape, sizeof(dims));
	}
	err = rs_ds_add_stored(r, name, strlen(name), &t, &f.source, 1, dims, ndim,
			 f.path);
out:
	rs_pickle_free(f.pk);
	rs_zip_free(&f.z);
	return err;
}

/* Every zero/<param>/ directory: a trainable param (fp32, exp_avg,
 * exp_avg_sq, step), or what ds_to_universal writes fp32.pt alone for
 * (frozen params, buffers); tied names come from shared_params. */
int rs_ds_read_universal(rs_ds_reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_state *st = r->st;
	rs_ds_file *f0 = &r->model[0];
	const rs_pvalue *root, *ps, *shapes = NULL, *shared = NULL;
	int64_t world = 0;
	int err = rs_ds_open(r, f0, false);

	if (err)
		return err;
	root = rs_pickle_root(f0->pk);
	ps = rs_pv_get(root, "param_shapes");
	if (rs_pv_kind(ps) == RS_PV_LIST && rs_pv_len(ps))
		rs_ds_dict(rs_pv_item(ps, 0), &shapes);    /* stage 3: the only group */
	rs_ds_dict(rs_pv_get(root, "shared_params"), &shared);
	if (rs_pv_int(rs_pv_get(root, "dp_world_size"), &world) == 0 &&
	    world > 0 && world <= (int64_t)RS_DS_MAX_RANKS)
		st->world = (uint32_t)world;
	st->universal = true;
	st->groups = 1;
	st->step = malloc(sizeof(*st->step));
	if (!st->step)
		return -ENOMEM;
	st->step[0] = NAN;
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		bool trainable;

		if (e->parent != r->zero || !e->is_dir ||
		    rs_pv_get(shared, e->name))
			continue;
		if (rs_ds_child(ck, (long)i, "fp32.pt") < 0) {
			rs_diag_add(r->d, "%s/zero/%s: holds no fp32.pt", r->where,
				    e->name);
			return -EINVAL;
		}
		trainable = rs_ds_child(ck, (long)i, "exp_avg.pt") >= 0;
		for (int s = 0; s < DS_NSTATES && !err; s++) {
			long file = rs_ds_child(ck, (long)i, s ? (s == DS_EXP_AVG ? "exp_avg.pt" : "exp_avg_sq.pt") : "fp32.pt");
			char *name = NULL;

			if (file < 0) {
				if (trainable && s) {
					rs_diag_add(r->d, "%s/zero/%s: holds exp_avg.pt but no exp_avg_sq.pt",
						    r->where, e->name);
					err = -EINVAL;
				}
				continue;
			}
			if (s && asprintf(&name, "optimizer.state.%s.%s",
					  rs_ds_state_names[s], e->name) < 0)
				return -ENOMEM;
			err = universal_state(r, file, s ? name : e->name, shapes,
					      e->name, NULL);
			free(name);
		}
		if (!err && trainable && rs_ds_child(ck, (long)i, "step.pt") >= 0) {
			bool step = false;

			err = universal_state(r, rs_ds_child(ck, (long)i, "step.pt"),
					      e->name, NULL, e->name, &step);
		}
		if (trainable)
			st->nparams++;
		else
			st->nfrozen++;
	}
	st->has_state[DS_FP32] = true;
	st->has_state[DS_EXP_AVG] = st->has_state[DS_EXP_AVG_SQ] = st->nparams > 0;
	/* From a stage 3 save ds_to_universal copies every rank's
	 * model-states file and writes no directory for frozen params and
	 * buffers: they are in those files, as in the save. */
	st->stage = r->zero3_names ? 3 : 0;
	for (uint32_t k = 1; k < r->nmodel && r->zero3_names && !err; k++)
		err = r->model[k].entry < 0 ? 0 : rs_ds_open(r, &r->model[k], false);
	if (!err && r->zero3_names && r->nmodel == st->world)
		err = rs_ds_read_frozen(r);
	if (!err && r->zero3_names)
		err = rs_ds_read_buffers(r);
	return err ? err : rs_ds_read_shared(r);
}
