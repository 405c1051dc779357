/* metaseq reader: finds the shard files, reads each one's "model" tensors
 * and shard_metadata, then hands them to the stitcher. */
#include "formats/metaseq/metaseq.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/metaseq/metaseq_int.h"
#include "formats/codec/torch_tensor.h"
#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"
#include "planner/array.h"
#include "planner/names.h"

/* data.pkl of a shard holds the model's and the optimizer's tensor
 * headers plus cfg: kilobytes to a few MB. */
#define MS_DATAPKL_MAX (256u << 20)
#define MS_WHERE 4400

/* A top-level name of a shard file (also what detection looks for). */
static bool is_shard_name(const char *name)
{
	size_t n = strlen(name);

	return n > 3 && strcmp(name + n - 3, ".pt") == 0 &&
	       strstr(name, "model_part-") != NULL;
}

/* 1 to 9 decimal digits at *p. */
static bool digits(const char **p, uint32_t *out)
{
	uint32_t v = 0;
	int n = 0;

	while ((*p)[n] >= '0' && (*p)[n] <= '9' && n < 9)
		v = v * 10 + (uint32_t)((*p)[n++] - '0');
	if (n == 0 || ((*p)[n] >= '0' && (*p)[n] <= '9'))
		return false;
	*p += n;
	*out = v;
	return true;
}

/* "<prefix>model_part-<m>[-shard<d>].pt" */
static bool parse_name(const char *name, size_t *plen, uint32_t *part,
		       uint32_t *shard, bool *sharded)
{
	const char *at = NULL, *p;

	for (p = strstr(name, "model_part-"); p; p = strstr(p + 1, "model_part-"))
		at = p;
	if (!at)
		return false;
	*plen = (size_t)(at - name);
	p = at + strlen("model_part-");
	if (!digits(&p, part))
		return false;
	*shard = 0;
	*sharded = strncmp(p, "-shard", 6) == 0;
	if (*sharded) {
		p += 6;
		if (!digits(&p, shard))
			return false;
	}
	return strcmp(p, ".pt") == 0;
}

static int cmp_file(const void *a, const void *b)
{
	const ms_file *x = a, *y = b;

	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return x->shard < y->shard ? -1 : x->shard > y->shard;
}

/* Parts 0..M-1, each with shards 0..D-1 (one FSDP world for every part),
 * once each; one prefix and one naming form throughout. */
static int check_complete(const rs_checkpoint *ck, const ms_file *f, size_t n,
			  size_t plen, bool sharded, uint32_t *nparts,
			  rs_diag *d)
{
	const char *prefix = f[0].name;
	uint32_t part = 0, k = 0, nshards = 0;

	for (size_t i = 0; i < n; i++)
		if (f[i].shard >= nshards)
			nshards = f[i].shard + 1;
	for (size_t i = 0; i <= n; i++) {
		if (i == n || f[i].part != part) {
			if (k == 0)
				goto missing_part;
			if (k != nshards)
				goto missing_shard;
			if (i == n)
				break;
			part++;
			k = 0;
			if (f[i].part != part)
				goto missing_part;
		}
		if (f[i].shard < k) {
			rs_diag_add(d, "%s: %s and %s are both shard %u of model part %u",
				    ck->dir_path, f[i - 1].name, f[i].name,
				    f[i].shard, part);
			return -EINVAL;
		}
		if (f[i].shard > k)
			goto missing_shard;
		k++;
	}
	*nparts = part + 1;
	return 0;
missing_shard:
	rs_diag_add(d, "%s/%.*smodel_part-%u-shard%u.pt: missing (model parts have shards 0 to %u)",
		    ck->dir_path, (int)plen, prefix, part, k, nshards - 1);
	return -EINVAL;
missing_part:
	rs_diag_add(d, "%s: model part %u is missing (no %.*smodel_part-%u%s.pt; parts up to %u are there)",
		    ck->dir_path, part, (int)plen, prefix, part,
		    sharded ? "-shard*" : "", f[n - 1].part);
	return -EINVAL;
}

/* The shard files among SOURCE's top-level entries, sorted. */
static int find_files(rs_checkpoint *ck, ms_file **out, size_t *count,
		      uint32_t *nparts, rs_diag *d)
{
	ms_file *files = NULL;
	size_t n = 0, cap = 0, plen0 = 0;
	bool sharded0 = false;
	int err = 0;

	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		size_t plen;
		bool sharded;
		ms_file *f;

		if (e->parent >= 0 || e->is_dir || !is_shard_name(e->name))
			continue;
		if (rs_array_reserve(&files, &cap, n + 1, sizeof(*files))) {
			err = -ENOMEM;
			goto fail;
		}
		f = &files[n];
		memset(f, 0, sizeof(*f));
		f->name = e->name;
		f->source = e->source;
		if (!parse_name(e->name, &plen, &f->part, &f->shard, &sharded)) {
			rs_diag_add(d, "%s/%s: not named <prefix>model_part-<m>[-shard<d>].pt (MoE expert files and other layouts are not supported)",
				    ck->dir_path, e->name);
			err = -EINVAL;
			goto fail;
		}
		if (n == 0) {
			plen0 = plen;
			sharded0 = sharded;
		} else if (plen != plen0 ||
			   memcmp(e->name, files[0].name, plen) != 0) {
			rs_diag_add(d, "%s: holds the shards of more than one checkpoint (%s and %s)",
				    ck->dir_path, files[0].name, e->name);
			err = -EINVAL;
			goto fail;
		} else if (sharded != sharded0) {
			rs_diag_add(d, "%s: mixes <prefix>model_part-<m>.pt and <prefix>model_part-<m>-shard<d>.pt files (%s and %s)",
				    ck->dir_path, files[0].name, e->name);
			err = -EINVAL;
			goto fail;
		}
		n++;
	}
	if (!n) {
		rs_diag_add(d, "%s: no <prefix>model_part-<m>[-shard<d>].pt files",
			    ck->dir_path);
		err = -EINVAL;
		goto fail;
	}
	qsort(files, n, sizeof(*files), cmp_file);
	err = check_complete(ck, files, n, plen0, sharded0, nparts, d);
	if (err)
		goto fail;
	*out = files;
	*count = n;
	return 0;
fail:
	free(files);
	return err;
}

/* One value of the model dict: a torch.save tensor (formats/codec/torch_tensor.h)
 * whose elements lie in its storage record. */
static int read_tensor(const rs_zip *z, const rs_pvalue *v, const char *where,
		       const char *key, ms_tensor *t, rs_diag *d)
{
	rs_torch_tensor tt;
	char why[200];

	if (rs_torch_tensor_read(z, v, &tt, why, sizeof(why)) != 0) {
		rs_diag_add(d, "%s: model[\"%s\"] %s", where, key, why);
		return -EINVAL;
	}
	t->dtype = tt.dtype;
	t->ndim = tt.ndim;
	memcpy(t->shape, tt.shape, sizeof(t->shape));
	memcpy(t->stride, tt.stride, sizeof(t->stride));
	t->offset = tt.offset;
	return 0;
}

/* Sorts the key index; Python keeps the last of two equal keys, a lookup
 * here would find either: refuse. */
static int index_keys(ms_file *f, const char *where, rs_diag *d)
{
	size_t p;
	int err = rs_names_sort(&f->by_key, f->tensors, f->ntensors,
				sizeof(ms_tensor), offsetof(ms_tensor, key));

	if (err)
		return err;
	p = rs_names_next_dup(&f->by_key, 1);
	if (p < f->ntensors) {
		rs_diag_add(d, "%s: model names %s twice", where,
			    rs_names_at(&f->by_key, p));
		return -EINVAL;
	}
	return 0;
}

const ms_tensor *ms_file_find(const ms_file *f, const char *key)
{
	size_t i = rs_names_find(&f->by_key, key);

	return i == SIZE_MAX ? NULL : &f->tensors[i];
}

/* cfg of a file, kept with what was wrong with it: a cfg that does not
 * describe the model refuses the mount only where it is needed
 * (formats/metaseq/metaseq_int.h, ms_cfg); the first file's scalars are
 * kept for the metaseq view too. */
static int read_cfg(const rs_pvalue *top, ms_file *f, const char *where)
{
	rs_diag *cd = rs_diag_new();
	int err = 0;

	if (!cd)
		return -ENOMEM;
	if (f->part == 0 && f->shard == 0) {
		f->state = calloc(1, sizeof(ms_state));
		err = f->state ? ms_cfg_copy(top, f->state) : -ENOMEM;
	}
	if (!err)
		err = ms_cfg_read(top, where, &f->cfg, cd);
	if (err == -EINVAL) {
		/* The first problem, cut to the field's size. */
		snprintf(f->cfg.why, sizeof(f->cfg.why), "%.*s",
			 (int)sizeof(f->cfg.why) - 1,
			 rs_diag_count(cd) ? rs_diag_line(cd, 0) : where);
		err = 0;
	} else {
		f->cfg.ok = f->cfg.present;
	}
	rs_diag_free(cd);
	return err;
}

/* The model dict and shard_metadata of a parsed data.pkl. */
static int read_dict(const rs_zip *z, const rs_pvalue *root, ms_file *f,
		     const char *where, rs_diag *d)
{
	const rs_pvalue *top, *model;
	size_t cap = 0;
	int err;

	if (!ms_dict(root, &top) || !ms_dict(rs_pv_get(top, "model"), &model)) {
		rs_diag_add(d, "%s: data.pkl is not a dict with a \"model\" dict",
			    where);
		return -EINVAL;
	}
	for (size_t i = 0; i < rs_pv_len(model); i++) {
		const char *key = ms_whole_str(rs_pv_key(model, i));
		ms_tensor *t;

		/* Grown as tensors prove real: a pickle's item count costs
		 * it nothing. */
		if (rs_array_reserve(&f->tensors, &cap, f->ntensors + 1,
				     sizeof(ms_tensor)))
			return -ENOMEM;
		t = &f->tensors[f->ntensors];
		memset(t, 0, sizeof(*t));

		if (!key || !*key) {
			rs_diag_add(d, "%s: a model key is not a non-empty string without NULs",
				    where);
			return -EINVAL;
		}
		err = read_tensor(z, rs_pv_val(model, i), where, key, t, d);
		if (err)
			return err;
		if (!(t->key = strdup(key)))
			return -ENOMEM;
		f->ntensors++;
	}
	err = index_keys(f, where, d);
	if (!err)
		err = ms_meta_from_pickle(rs_pv_get(top, "shard_metadata"),
					  where, &f->meta, d);
	if (!err)
		err = read_cfg(top, f, where);
	return err;
}

static int load_file(rs_checkpoint *ck, ms_file *f, rs_diag *d)
{
	char where[MS_WHERE];
	rs_pickle *pk = NULL;
	rs_zip z = { 0 };
	int err;

	snprintf(where, sizeof(where), "%s/%s", ck->dir_path, f->name);
	err = rs_checkpoint_open_torch_save(ck, f->source, where,
					    ms_pickle_allow, MS_DATAPKL_MAX,
					    &z, &pk, d);
	if (!err)
		err = read_dict(&z, rs_pickle_root(pk), f, where, d);
	rs_pickle_free(pk);
	rs_zip_free(&z);
	return err;
}

static void free_files(ms_file *files, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t t = 0; t < files[i].ntensors; t++)
			free(files[i].tensors[t].key);
		free(files[i].tensors);
		rs_names_free(&files[i].by_key);
		ms_meta_free(&files[i].meta);
		ms_state_free(files[i].state);
	}
	free(files);
}

/* Release-form files (no shard_metadata): the flat params cfg implies,
 * into *derived; a params file is checked against them (and takes cfg's
 * tied output projection when it names no shared param). */
static int derive(rs_checkpoint *ck, ms_file *files, size_t n,
		  uint32_t nparts, const char *params_file,
		  ms_meta *params, ms_meta *derived, rs_diag *d)
{
	char where[MS_WHERE];
	size_t nshards = 0;
	int err;

	while (nshards < n && files[nshards].part == 0)
		nshards++;
	/* Needed for flat params without shard_metadata only (reshard_fsdp's
	 * unflattened output has none and needs none). */
	if (files[0].meta.present || !files[0].cfg.present ||
	    (nshards == 1 && !ms_holds_flat_key(&files[0])))
		return 0;
	snprintf(where, sizeof(where), "%s/%s", ck->dir_path, files[0].name);
	if (!files[0].cfg.ok) {
		/* Only needed when no params file stands in for it. */
		if (!params->present)
			rs_diag_add(d, "%s: has no shard_metadata to unflatten its FSDP flat params with, and its cfg does not describe the model (%s): pass -o params=FILE (names and shapes of the flat params)",
				    where, ms_cfg_why(&files[0].cfg, where));
		return params->present ? 0 : -EINVAL;
	}
	err = ms_meta_from_cfg(&files[0].cfg, files, nshards, nparts, derived,
			       where, d);
	if (!err && params->present)
		err = ms_meta_check(derived, params, params_file, d);
	/* The map form cannot say the output projection is tied; cfg does. */
	if (!err && params->present && !params->naliases) {
		params->aliases = derived->aliases;
		params->naliases = derived->naliases;
		derived->aliases = NULL;
		derived->naliases = 0;
	}
	return err;
}

/* Whether the parts store a fused qkv_proj: by the description that
 * unflattened them, else by the stored names. */
static bool holds_qkv(const ms_file *f0, const ms_meta *other)
{
	const ms_meta *m = f0->meta.present ? &f0->meta
			   : other->present ? other : NULL;

	for (size_t k = 0; m && k < m->nflats; k++)
		for (size_t i = 0; i < m->flats[k].nparams; i++)
			if (strstr(m->flats[k].params[i].name, "qkv_proj."))
				return true;
	for (size_t i = 0; !m && i < f0->ntensors; i++)
		if (strstr(f0->tensors[i].key, ".qkv_proj."))
			return true;
	return false;
}

/* Without cfg: an output projection that is a shared param (an alias
 * of the embeddings: the same fragments). */
static bool holds_tied(const rs_checkpoint *ck)
{
	const rs_tensor *e = NULL, *o = NULL;

	for (size_t i = 0; i < ck->catalog.count; i++) {
		const rs_tensor *t = &ck->catalog.tensors[i];

		if (strcmp(t->name, "decoder.embed_tokens.weight") == 0)
			e = t;
		else if (strcmp(t->name, "decoder.output_projection.weight") == 0)
			o = t;
	}
	return e && o && e->nfrags == o->nfrags && e->nfrags &&
	       memcmp(e->frags, o->frags, e->nfrags * sizeof(*e->frags)) == 0;
}

/* What cfg says of the model, for the views (ck->model): the vocab is
 * the merged embed_tokens' rows. */
static void model_config(rs_checkpoint *ck, const ms_file *f0)
{
	const ms_cfg *c = &f0->cfg;

	if (!c->ok) {
		snprintf(ck->model.why, sizeof(ck->model.why), "%s",
			 c->present ? c->why : "");
		return;
	}
	ck->model = c->m;
	ck->model.family_name = "opt";   /* share/reshardfs/families/opt.json */
	for (size_t i = 0; i < ck->catalog.count; i++) {
		const rs_tensor *t = &ck->catalog.tensors[i];

		if (strcmp(t->name, "decoder.embed_tokens.weight") == 0 &&
		    t->ndim == 2) {
			ck->model.vocab = t->shape[0];
			ck->model.dtype = t->dtype;
		}
	}
}

int rs_metaseq_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	const char *params_file = o->params_file;
	ms_meta params = { 0 }, derived = { 0 };
	ms_file *files = NULL;
	size_t n = 0;
	uint32_t nparts = 0;
	int err;

	/* Everything in SOURCE as entries first: the shard files are found
	 * (and their identity recorded) there; the rest passes through. */
	err = rs_checkpoint_walk(ck, NULL, d);
	if (err)
		return err;
	err = find_files(ck, &files, &n, &nparts, d);
	if (!err && params_file)
		err = ms_meta_from_json(params_file, &params, d);
	for (size_t i = 0; i < n && !err; i++)
		err = load_file(ck, &files[i], d);
	if (!err)
		err = ms_cfg_agree(files, n, ck->dir_path, d);
	if (!err)
		err = derive(ck, files, n, nparts, params_file, &params,
			     &derived, d);
	if (!err)
		err = ms_stitch(ck, files, n, nparts,
				params.present ? &params : &derived, d);
	if (!err)
		err = ms_check_sizes(ck, &files[0],
				     derived.present && !params.present, d);
	if (!err)
		model_config(ck, &files[0]);
	if (!err) {
		ms_state *st = files[0].state;

		files[0].state = NULL;
		st->fused_qkv = holds_qkv(&files[0], params.present ? &params
								    : &derived);
		st->tied = ck->model.family_name ? ck->model.tied : holds_tied(ck);
		ck->extra = st;
		ck->extra_free = ms_state_free;
	}
	for (size_t i = 0; !err && i < ck->nentries; i++) {
		rs_entry *e = &ck->entries[i];

		if (e->parent < 0 && !e->is_dir && is_shard_name(e->name))
			e->hidden = true;
	}
	free_files(files, n);
	ms_meta_free(&params);
	ms_meta_free(&derived);
	return err;
}

static rs_detect detect(const char *name, mode_t mode)
{
	return !S_ISDIR(mode) && is_shard_name(name) ? RS_DETECT_FILES
						     : RS_DETECT_NONE;
}

const rs_format_def rs_metaseq_format = {
	.name = "metaseq",
	.detect = detect,
	.looks_like = "*model_part-*.pt files",
	.read = rs_metaseq_read,
	.build_view = rs_metaseq_build_view,
	.default_view = "safetensors",
};
