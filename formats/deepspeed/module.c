/* The model-states files of a DeepSpeed save (formats/deepspeed/deepspeed.h):
 * param_shapes, frozen params, buffers, shared names, and what the module
 * says of the training dtype.  Whole tensors, or stage 3's parts laid end
 * to end; the flat partitions are zero.c's. */
#include "formats/deepspeed/deepspeed_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

static int add_param(rs_ds_reader *r, const rs_ds_file *f, const char *name,
		     size_t len, const rs_pvalue *shape, uint32_t group)
{
	rs_ds_state *st = r->st;
	rs_ds_param *p;
	uint64_t numel = 1;

	if (!rs_ds_name_ok(name, len)) {
		rs_diag_add(r->d, "%s: param_shapes holds a name that cannot be a tensor's name", f->path);
		return -EINVAL;
	}
	if (rs_array_reserve(&st->params, &st->cap_params, st->nparams + 1,
			     sizeof(*st->params)))
		return -ENOMEM;
	p = &st->params[st->nparams];
	memset(p, 0, sizeof(*p));
	if (!rs_pv_dims(shape, p->shape, &p->ndim, RS_MAX_DIMS) || p->ndim < 1) {
		rs_diag_add(r->d, "%s: param_shapes[%s] is not a torch.Size of 1 to %d dimensions",
			    f->path, name, RS_MAX_DIMS);
		return -EINVAL;
	}
	for (int k = 0; k < p->ndim; k++) {
		if (p->shape[k] && numel > UINT64_MAX / 8 / p->shape[k]) {
			rs_diag_add(r->d, "%s: param_shapes[%s] is too large", f->path, name);
			return -EINVAL;
		}
		numel *= p->shape[k];
	}
	p->name = strdup(name);
	if (!p->name)
		return -ENOMEM;
	p->numel = numel;
	p->group = group;
	st->nparams++;
	return 0;
}

int rs_ds_read_param_shapes(rs_ds_reader *r, rs_ds_file *f)
{
	const rs_pvalue *ps = rs_pv_get(rs_pickle_root(f->pk), "param_shapes");
	int err = 0;

	if (rs_pv_kind(ps) != RS_PV_LIST) {
		rs_diag_add(r->d, "%s: no param_shapes list", f->path);
		return -EINVAL;
	}
	if (r->st->stage < 3 && rs_pv_len(ps) != r->st->groups) {
		rs_diag_add(r->d, "%s: param_shapes has %zu groups, the optimizer files %u",
			    f->path, rs_pv_len(ps), r->st->groups);
		return -EINVAL;
	}
	for (size_t g = 0; g < rs_pv_len(ps) && !err; g++) {
		const rs_pvalue *items;

		if (!rs_pv_dict_like(rs_pv_item(ps, g), &items)) {
			rs_diag_add(r->d, "%s: param_shapes[%zu] is not a dict", f->path, g);
			return -EINVAL;
		}
		for (size_t i = 0; i < rs_pv_len(items) && !err; i++) {
			size_t len = 0;
			const char *name = rs_pv_str(rs_pv_key(items, i), &len);

			err = add_param(r, f, name, len, rs_pv_val(items, i),
					(uint32_t)g);
		}
	}
	return err;
}

/* The catalog tensor `name` of shape[ndim]: one stored tensor of that
 * shape (with its strides), or the first elements of dense 1-d parts
 * laid end to end (stage 3's frozen params: one part per rank). */
int rs_ds_add_stored(rs_ds_reader *r, const char *name, size_t len,
		      const rs_torch_tensor *parts, const uint32_t *sources,
		      uint32_t nparts, const uint64_t *shape, int ndim,
		      const char *path)
{
	rs_checkpoint *ck = r->ck;
	rs_frag_list fl = { 0 };
	uint64_t numel = 1, at = 0;
	size_t idx;
	int err = 0;

	if (!rs_ds_name_ok(name, len)) {
		rs_diag_add(r->d, "%s: holds a name that cannot be a tensor's name", path);
		return -EINVAL;
	}
	for (int k = 0; k < ndim; k++)
		if (!rs_mul_u64(numel, shape[k], &numel) || numel > (1ull << 60)) {
			rs_diag_add(r->d, "%s: %s's shape is too large", path, name);
			return -EINVAL;
		}
	for (uint32_t k = 0; k < nparts && at < numel && !err; k++) {
		const rs_torch_tensor *t = &parts[k];
		uint64_t base[RS_MAX_DIMS] = { 0 }, n = 1, take;
		unsigned es = (unsigned)rs_dtype_size(t->dtype);
		rs_fragment first = { .source = sources[k] };

		for (int j = 0; j < t->ndim; j++)
			n *= t->shape[j];
		if (nparts == 1 && t->ndim == ndim &&
		    memcmp(t->shape, shape, (size_t)ndim * sizeof(*shape)) == 0) {
			/* whole, with its own strides: one fragment */
			fl.v = calloc(1, sizeof(*fl.v));
			if (!fl.v)
				return -ENOMEM;
			fl.n = fl.cap = 1;
			fl.v[0].source = sources[0];
			fl.v[0].offset = t->offset;
			fl.v[0].box.ndim = ndim;
			for (int j = 0; j < ndim; j++) {
				fl.v[0].box.len[j] = shape[j];
				fl.v[0].stride[j] = t->stride[j];
			}
			at = numel;
			break;
		}
		if (t->ndim != 1 || (n > 1 && t->stride[0] != 1) ||
		    (k && t->dtype != parts[0].dtype)) {
			rs_diag_add(r->d, "%s: %s is not a dense 1-d part of %s elements",
				    path, name, "its param's");
			return -EINVAL;
		}
		take = numel - at < n ? numel - at : n;
		first.offset = t->offset - at * es;
		first.stride[0] = 1;
		err = rs_frag_list_add_flat(&fl, &first, es, ndim, base, shape,
					    at, at + take);
		at += take;
	}
	if (!err && at != numel) {
		rs_diag_add(r->d, "%s: the parts of %s hold fewer than its %llu elements",
			    path, name, (unsigned long long)numel);
		err = -EINVAL;
	}
	if (!err)
		err = rs_catalog_add_fragments(&ck->catalog, name, parts[0].dtype,
					       ndim, shape, fl.n, &idx);
	if (!err) {
		memcpy(ck->catalog.tensors[idx].frags, fl.v, fl.n * sizeof(*fl.v));
		err = rs_catalog_set_origin(&ck->catalog, idx, path);
	}
	free(fl.v);
	return err;
}

/* What the model-states files say of the module: the dtype it trained
 * in (its first param's), the version. */
void rs_ds_module_facts(rs_ds_reader *r, rs_ds_file *f)
{
	const rs_pvalue *root = rs_pickle_root(f->pk), *module;
	const char *v;
	size_t len;

	r->st->trained = RS_DTYPE_F32;
	if (rs_pv_dict_like(rs_pv_get(root, "module"), &module) && r->st->params) {
		const rs_pvalue *t = rs_pv_get(module, r->st->params[0].name);
		rs_torch_tensor tt;
		char why[200];

		if (t && rs_torch_tensor_read(&f->z, t, &tt, why, sizeof(why)) == 0)
			r->st->trained = tt.dtype;
	}
	v = rs_pv_str(rs_pv_get(root, "ds_version"), &len);
	if (v && len < 40 && rs_ds_name_ok(v, len))
		r->st->ds_version = strdup(v);
}

/* Frozen params: whole in stages 1-2, one part per rank in stage 3. */
int rs_ds_read_frozen(rs_ds_reader *r)
{
	rs_ds_file *f0 = &r->model[0];
	const rs_pvalue *shapes, **frags = NULL;
	rs_torch_tensor *parts = NULL;
	uint32_t *sources = NULL, n = r->st->stage < 3 ? 1 : r->nmodel;
	rs_ds_index *by = NULL;
	int err = 0;

	if (!rs_pv_dict_like(rs_pv_get(rs_pickle_root(f0->pk), "frozen_param_shapes"), &shapes) ||
	    !rs_pv_len(shapes))
		return 0;
	parts = calloc(n, sizeof(*parts));
	sources = calloc(n, sizeof(*sources));
	frags = calloc(n, sizeof(*frags));
	by = calloc(n, sizeof(*by));
	if (!parts || !sources || !frags || !by) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t k = 0; k < n && !err; k++) {
		if (!rs_pv_dict_like(rs_pv_get(rs_pickle_root(r->model[k].pk),
					  "frozen_param_fragments"), &frags[k])) {
			rs_diag_add(r->d, "%s: frozen_param_fragments is not a dict",
				    r->model[k].path);
			err = -EINVAL;
		}
		if (!err && (err = rs_ds_index_dict(frags[k], &by[k])) == -EEXIST) {
			rs_diag_add(r->d, "%s: frozen_param_fragments names a param twice",
				    r->model[k].path);
			err = -EINVAL;
		}
	}
	for (size_t i = 0; i < rs_pv_len(shapes) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_key(shapes, i), &len);
		uint64_t shape[RS_MAX_DIMS];
		int ndim = 0;

		if (!name || !rs_pv_dims(rs_pv_val(shapes, i), shape, &ndim,
					 RS_MAX_DIMS) || ndim < 1) {
			rs_diag_add(r->d, "%s: frozen_param_shapes holds an entry that is not a name and a torch.Size",
				    f0->path);
			err = -EINVAL;
			break;
		}
		for (uint32_t k = 0; k < n && !err; k++) {
			rs_ds_file *f = &r->model[k];
			size_t at = rs_ds_index_find(&by[k], name);
			const rs_pvalue *t = at == SIZE_MAX ? NULL
							    : rs_pv_val(frags[k], at);

			if (!t) {
				rs_diag_add(r->d, "%s: frozen_param_fragments lacks %s",
					    f->path, name);
				err = -EINVAL;
				break;
			}
			sources[k] = f->source;
			err = rs_ds_tensor(r, f, t, name, &parts[k]);
		}
		if (!err)
			err = rs_ds_add_stored(r, name, len, parts, sources, n, shape,
					 ndim, f0->path);
		r->st->nfrozen++;
	}
out:
	for (uint32_t k = 0; by && k < n; k++)
		rs_ds_index_free(&by[k]);
	free(by);
	free(frags);
	free(parts);
	free(sources);
	return err;
}

/* Stage 1 saves no frozen_param_shapes: its frozen params are the
 * module's other entries (not trainable, not buffers, not shared), as
 * stored. */
int rs_ds_read_module_frozen(rs_ds_reader *r)
{
	rs_ds_file *f = &r->model[0];
	const rs_pvalue *root = rs_pickle_root(f->pk), *module, *sh = NULL;
	rs_ds_index known_names = { 0 };
	int err;

	if (r->st->stage == 3 || rs_pv_get(root, "frozen_param_shapes") == NULL ||
	    rs_pv_kind(rs_pv_get(root, "frozen_param_shapes")) != RS_PV_NONE ||
	    !rs_pv_dict_like(rs_pv_get(root, "module"), &module))
		return 0;
	rs_pv_dict_like(rs_pv_get(root, "shared_params"), &sh);
	err = rs_ds_index_catalog(&r->ck->catalog, &known_names);
	for (size_t i = 0; i < rs_pv_len(module) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_key(module, i), &len);
		rs_torch_tensor tt;

		/* shared_params is a few names: scanned */
		if (!name || rs_pv_get(sh, name) ||
		    rs_ds_index_find(&known_names, name) != SIZE_MAX)
			continue;
		err = rs_ds_tensor(r, f, rs_pv_val(module, i), name, &tt);
		if (!err)
			err = rs_ds_add_stored(r, name, len, &tt, &f->source, 1,
					 tt.shape, tt.ndim, f->path);
		r->st->nfrozen++;
	}
	rs_ds_index_free(&known_names);
	return err;
}

/* Buffers: the module's entries buffer_names lists, as stored. */
int rs_ds_read_buffers(rs_ds_reader *r)
{
	rs_ds_file *f = &r->model[0];
	const rs_pvalue *root = rs_pickle_root(f->pk), *module = NULL;
	const rs_pvalue *names = rs_pv_get(root, "buffer_names");
	int err = 0;

	if (!rs_pv_len(names))
		return 0;
	if (rs_pv_kind(names) != RS_PV_LIST ||
	    !rs_pv_dict_like(rs_pv_get(root, "module"), &module)) {
		rs_diag_add(r->d, "%s: buffer_names is not a list of the module's entries",
			    f->path);
		return -EINVAL;
	}
	for (size_t i = 0; i < rs_pv_len(names) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_item(names, i), &len);
		const rs_pvalue *t = name ? rs_pv_get(module, name) : NULL;
		rs_torch_tensor tt;

		if (!t) {
			rs_diag_add(r->d, "%s: buffer %s is not in module",
				    f->path, name ? name : "(not a name)");
			return -EINVAL;
		}
		err = rs_ds_tensor(r, f, t, name, &tt);
		if (!err)
			err = rs_ds_add_stored(r, name, len, &tt, &f->source, 1,
					 tt.shape, tt.ndim, f->path);
		r->st->nbuffers++;
	}
	return err;
}

/* shared_params: a name for another param's tensor (a tied output
 * layer): the same fragments under a second name. */
int rs_ds_read_shared(rs_ds_reader *r)
{
	rs_ds_file *f = &r->model[0];
	rs_catalog *c = &r->ck->catalog;
	const rs_pvalue *sh;
	rs_ds_index params = { 0 };
	int err;

	if (!rs_pv_dict_like(rs_pv_get(rs_pickle_root(f->pk), "shared_params"), &sh))
		return 0;
	err = rs_ds_index_catalog(c, &params);
	for (size_t i = 0; i < rs_pv_len(sh) && !err; i++) {
		size_t len = 0, tlen = 0, idx;
		const char *name = rs_pv_str(rs_pv_key(sh, i), &len);
		const char *target = rs_pv_str(rs_pv_val(sh, i), &tlen);
		size_t to = rs_ds_index_find(&params, target);

		if (!rs_ds_name_ok(name, len) || to == SIZE_MAX) {
			rs_diag_add(r->d, "%s: shared_params names %s for %s, which is no param",
				    f->path, name && rs_ds_name_ok(name, len) ? name : "a tensor",
				    target && rs_ds_name_ok(target, tlen) ? target : "a name");
			err = -EINVAL;
			break;
		}
		err = rs_catalog_add_fragments(c, name, c->tensors[to].dtype,
					       c->tensors[to].ndim,
					       c->tensors[to].shape,
					       c->tensors[to].nfrags, &idx);
		if (!err) {
			rs_tensor *t = &c->tensors[idx], *s = &c->tensors[to];

			memcpy(t->frags, s->frags, s->nfrags * sizeof(*s->frags));
			err = rs_catalog_set_origin(c, idx, f->path);
		}
		r->st->nshared++;
	}
	rs_ds_index_free(&params);
	return err;
}
