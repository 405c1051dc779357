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
 * the param's shape (param_shapes') when it is stored flat; with
 * is_step, a step.pt, whose value becomes the checkpoint's step. */
static int universal_state(rs_ds_reader *r, long file, const char *name,
			   const rs_pvalue *shape, const char *param,
			   bool is_step)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_file f = { .entry = file, .source = ck->entries[file].source };
	const rs_pvalue *v;
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
			if (!rs_mul_u64(numel, dims[k], &numel))
				numel = UINT64_MAX;     /* not n: refused */
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
	/* a param directory's files, in rs_ds_state_names order, then step */
	static const char *const file_names[4] = {
		"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt",
	};
	const rs_pvalue *root, *ps, *shapes = NULL, *shared = NULL;
	rs_ds_index by_shape = { 0 };
	long (*files)[4];
	int64_t world = 0;
	int err = rs_ds_open(r, f0, false);

	if (err)
		return err;
	root = rs_pickle_root(f0->pk);
	ps = rs_pv_get(root, "param_shapes");
	if (rs_pv_kind(ps) == RS_PV_LIST && rs_pv_len(ps))
		rs_pv_dict_like(rs_pv_item(ps, 0), &shapes);    /* stage 3: the only group */
	rs_pv_dict_like(rs_pv_get(root, "shared_params"), &shared);
	if (rs_pv_int(rs_pv_get(root, "dp_world_size"), &world) == 0 &&
	    world > 0 && world <= (int64_t)RS_DS_MAX_RANKS)
		st->world = (uint32_t)world;
	st->universal = true;
	st->groups = 1;
	st->step = malloc(sizeof(*st->step));
	if (!st->step)
		return -ENOMEM;
	st->step[0] = NAN;
	/* each param directory's files, in one pass over the entries */
	files = malloc((ck->nentries + 1) * sizeof(*files));
	if (!files)
		return -ENOMEM;
	for (size_t i = 0; i < ck->nentries; i++)
		for (int k = 0; k < 4; k++)
			files[i][k] = -1;
	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];

		if (e->is_dir || e->parent < 0 ||
		    ck->entries[e->parent].parent != r->zero)
			continue;
		for (int k = 0; k < 4; k++)
			if (strcmp(e->name, file_names[k]) == 0)
				files[e->parent][k] = (long)i;
	}
	if (shapes)
		err = rs_ds_index_dict(shapes, &by_shape);
	if (err == -EEXIST) {
		rs_diag_add(r->d, "%s: param_shapes names a param twice", f0->path);
		err = -EINVAL;
	}
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		size_t at = shapes ? rs_ds_index_find(&by_shape, e->name) : SIZE_MAX;
		const rs_pvalue *shape = at == SIZE_MAX ? NULL : rs_pv_val(shapes, at);
		bool trainable = files[i][DS_EXP_AVG] >= 0;

		if (e->parent != r->zero || !e->is_dir ||
		    rs_pv_get(shared, e->name))     /* a few names: scanned */
			continue;
		if (files[i][DS_FP32] < 0 ||
		    (trainable && files[i][DS_EXP_AVG_SQ] < 0)) {
			rs_diag_add(r->d, "%s/zero/%s: holds %s", r->where,
				    e->name, files[i][DS_FP32] < 0 ? "no fp32.pt"
				    : "exp_avg.pt but no exp_avg_sq.pt");
			err = -EINVAL;
			break;
		}
		for (int s = 0; s < (trainable ? DS_NSTATES : 1) && !err; s++) {
			char *name = NULL;

			if (s && asprintf(&name, "optimizer.state.%s.%s",
					  rs_ds_state_names[s], e->name) < 0) {
				err = -ENOMEM;
				break;
			}
			err = universal_state(r, files[i][s], s ? name : e->name,
					      shape, e->name, false);
			free(name);
		}
		if (!err && trainable && files[i][3] >= 0)
			err = universal_state(r, files[i][3], e->name, NULL,
					      e->name, true);
		if (trainable)
			st->nparams++;
		else
			st->nfrozen++;
	}
	rs_ds_index_free(&by_shape);
	free(files);
	if (err)
		return err;
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
