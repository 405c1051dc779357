/* metaseq flat-param descriptions: fairscale's shard_metadata (a pickle
 * value) and -o params=FILE (JSON) into one ms_meta. */
#include "formats/metaseq/metaseq_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "planner/array.h"
#include "planner/user_file.h"

/* Params files are small; a larger one is a mistake. */
#define MS_PARAMS_MAX_BYTES (64u << 20)
/* Params in one flat param: an OPT-175B layer has 16, the root a few. */
#define MS_MAX_PARAMS (1u << 20)

/* What metaseq checkpoints pickle besides the model: cfg (a dict, an
 * omegaconf DictConfig or an argparse.Namespace), metaseq/fairseq enums
 * and meters, numpy scalars in the meters.  All stay inert tokens. */
const char *const ms_pickle_allow[] = {
	"torch.*",
	"collections.OrderedDict",
	"collections.defaultdict",
	"argparse.Namespace",
	"metaseq.*",
	"fairseq.*",
	"omegaconf.*",
	"typing.Any",
	"numpy.dtype",
	"numpy.ndarray",
	"numpy.core.multiarray.scalar",
	"numpy.core.multiarray._reconstruct",
	"numpy._core.multiarray.scalar",
	"numpy._core.multiarray._reconstruct",
	"pathlib.*",
	"_codecs.encode",
	"builtins.set",
	"builtins.frozenset",
	"builtins.bytearray",
	"builtins.dict",
	"builtins.list",
	"builtins.tuple",
	"builtins.int",
	/* protocol 2 names int "__builtin__.long" (an OmegaConf ListConfig's
	 * key_type) */
	"builtins.long",
	"builtins.float",
	"builtins.str",
	"builtins.bool",
	NULL,
};

const char *ms_whole_str(const rs_pvalue *v)
{
	size_t len;
	const char *s = rs_pv_str(v, &len);

	return s && strlen(s) == len ? s : NULL;
}

bool ms_dict(const rs_pvalue *v, const rs_pvalue **items)
{
	if (rs_pv_kind(v) == RS_PV_DICT) {
		*items = v;
		return true;
	}
	if (rs_pv_call_is(v, "collections.OrderedDict") ||
	    rs_pv_call_is(v, "collections.defaultdict")) {
		*items = rs_pv_dictitems(v);    /* NULL when empty: len 0 */
		return !*items || rs_pv_kind(*items) == RS_PV_DICT;
	}
	return false;
}

bool ms_name_ok(const char *s)
{
	if (!rs_name_is_safe(s))
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

void ms_meta_free(ms_meta *m)
{
	for (size_t i = 0; i < m->nflats; i++) {
		ms_flat *f = &m->flats[i];

		for (size_t p = 0; p < f->nparams; p++)
			free(f->params[p].name);
		free(f->params);
		free(f->key);
	}
	free(m->flats);
	for (size_t i = 0; i < m->nbuffers; i++)
		free(m->buffers[i]);
	free(m->buffers);
	for (size_t i = 0; i < m->naliases; i++) {
		free(m->aliases[i].src);
		free(m->aliases[i].dst);
	}
	free(m->aliases);
	memset(m, 0, sizeof(*m));
}

/* "<prefix>.<name>", or name at the root. */
static char *join_name(const char *prefix, size_t plen, const char *name)
{
	char *out;

	if (!plen)
		return strdup(name);
	if (asprintf(&out, "%.*s.%s", (int)plen, prefix, name) < 0)
		return NULL;
	return out;
}

/* A new flat param `key` with room for n params; NULL on ENOMEM. */
static ms_flat *flat_add(ms_meta *m, size_t *cap, char *key,
			 size_t prefix_len, size_t n)
{
	ms_flat *f;

	if (!key || rs_array_reserve(&m->flats, cap, m->nflats + 1,
				     sizeof(ms_flat))) {
		free(key);
		return NULL;
	}
	f = &m->flats[m->nflats++];
	memset(f, 0, sizeof(*f));
	f->key = key;
	f->prefix_len = prefix_len;
	f->params = calloc(n ? n : 1, sizeof(ms_param));
	return f->params ? f : NULL;
}

/* Param i of f: checks the shape against a given numel (has_numel) and
 * adds it up.  `where` prefixes messages. */
static int flat_param(ms_flat *f, const char *where, const char *name,
		      const uint64_t *shape, int ndim, bool has_numel,
		      uint64_t numel, rs_diag *d)
{
	ms_param *p = &f->params[f->nparams];
	uint64_t n;

	if (!name || !*name) {
		rs_diag_add(d, "%s: %s: name %zu is not a non-empty string without NULs",
			    where, f->key, f->nparams);
		return -EINVAL;
	}
	if (!rs_product(shape, ndim, &n)) {
		rs_diag_add(d, "%s: %s: the shape of %s overflows", where,
			    f->key, name);
		return -EINVAL;
	}
	if (has_numel && n != numel) {
		rs_diag_add(d, "%s: %s: %s has %llu elements by its shape but numel %llu",
			    where, f->key, name, (unsigned long long)n,
			    (unsigned long long)numel);
		return -EINVAL;
	}
	if (!rs_add_u64(f->total, n, &f->total)) {
		rs_diag_add(d, "%s: %s: numels overflow", where, f->key);
		return -EINVAL;
	}
	p->name = strdup(name);
	if (!p->name)
		return -ENOMEM;
	p->ndim = ndim;
	memcpy(p->shape, shape, (size_t)ndim * sizeof(uint64_t));
	p->numel = n;
	f->nparams++;
	return 0;
}

static bool pv_list(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_LIST || rs_pv_kind(v) == RS_PV_TUPLE;
}

/* params[flat_name] of one FSDP instance (pickle). */
static int pickle_flat(ms_meta *m, size_t *cap, const char *path,
		       const char *flat_name, const rs_pvalue *info,
		       bool rank0_only, const char *where, rs_diag *d)
{
	const rs_pvalue *items, *names, *shapes, *numels;
	size_t plen = strlen(path), n;
	char t[80];
	int64_t pad;
	ms_flat *f;

	if (!ms_dict(info, &items)) {
		rs_diag_add(d, "%s: shard_metadata: %s is not a dict", where,
			    flat_name);
		return -EINVAL;
	}
	names = rs_pv_get(items, "names");
	shapes = rs_pv_get(items, "shapes");
	numels = rs_pv_get(items, "numels");
	n = rs_pv_len(names);
	if (!pv_list(names) || !pv_list(shapes) || !pv_list(numels) ||
	    rs_pv_len(shapes) != n || rs_pv_len(numels) != n ||
	    n > MS_MAX_PARAMS) {
		rs_diag_add(d, "%s: shard_metadata: %s%s%s needs lists names, shapes and numels of one length (at most %u)",
			    where, path, plen ? "." : "", flat_name,
			    MS_MAX_PARAMS);
		return -EINVAL;
	}
	if (rs_pv_int(rs_pv_get(items, "padding"), &pad) != 0 || pad < 0) {
		rs_diag_add(d, "%s: shard_metadata: %s%s%s: padding is %s, not a non-negative int",
			    where, path, plen ? "." : "", flat_name,
			    rs_pv_text(rs_pv_get(items, "padding"), t,
					  sizeof(t)));
		return -EINVAL;
	}
	f = flat_add(m, cap, join_name(path, plen, flat_name), plen, n);
	if (!f)
		return -ENOMEM;
	f->rank0_only = rank0_only;
	f->padding = (uint64_t)pad;
	f->has_padding = true;
	for (size_t i = 0; i < n; i++) {
		uint64_t shape[RS_MAX_DIMS];
		int64_t numel;
		int ndim = 0, err;

		if (!rs_pv_dims(rs_pv_item(shapes, i), shape, &ndim, RS_MAX_DIMS)) {
			rs_diag_add(d, "%s: shard_metadata: %s: shapes[%zu] is not a torch.Size of at most %d non-negative ints",
				    where, f->key, i, RS_MAX_DIMS);
			return -EINVAL;
		}
		if (rs_pv_int(rs_pv_item(numels, i), &numel) != 0 || numel < 0) {
			rs_diag_add(d, "%s: shard_metadata: %s: numels[%zu] is %s, not a non-negative int",
				    where, f->key, i,
				    rs_pv_text(rs_pv_item(numels, i), t,
						  sizeof(t)));
			return -EINVAL;
		}
		err = flat_param(f, where, ms_whole_str(rs_pv_item(names, i)),
				 shape, ndim, true, (uint64_t)numel, d);
		if (err)
			return err;
	}
	return 0;
}

/* (src, dst) pairs of one instance, named under its module path. */
static int pickle_aliases(ms_meta *m, size_t *cap, const char *path,
			  const rs_pvalue *list, const char *where, rs_diag *d)
{
	size_t plen = strlen(path);

	if (!list || rs_pv_kind(list) == RS_PV_NONE)
		return 0;
	if (!pv_list(list))
		goto bad;
	for (size_t i = 0; i < rs_pv_len(list); i++) {
		const rs_pvalue *pair = rs_pv_item(list, i);
		const char *src = ms_whole_str(rs_pv_item(pair, 0));
		const char *dst = ms_whole_str(rs_pv_item(pair, 1));
		ms_alias *a;

		if (!pv_list(pair) || rs_pv_len(pair) != 2 || !src || !dst)
			goto bad;
		if (rs_array_reserve(&m->aliases, cap, m->naliases + 1,
				     sizeof(ms_alias)))
			return -ENOMEM;
		a = &m->aliases[m->naliases++];
		a->src = join_name(path, plen, src);
		a->dst = join_name(path, plen, dst);
		if (!a->src || !a->dst)
			return -ENOMEM;
	}
	return 0;
bad:
	rs_diag_add(d, "%s: shard_metadata: shared_param_info of \"%s\" is not a list of (src, dst) name pairs",
		    where, path);
	return -EINVAL;
}

/* Two flat params of one key would be two answers for one state-dict
 * entry. */
static int check_unique(const ms_meta *m, const char *where, rs_diag *d)
{
	for (size_t i = 0; i < m->nflats; i++)
		for (size_t j = 0; j < i; j++)
			if (strcmp(m->flats[i].key, m->flats[j].key) == 0) {
				rs_diag_add(d, "%s: names flat param %s twice",
					    where, m->flats[i].key);
				return -EINVAL;
			}
	return 0;
}

int ms_meta_from_pickle(const rs_pvalue *sm, const char *where, ms_meta *m,
			rs_diag *d)
{
	const rs_pvalue *items, *pm, *bufs;
	size_t cap_flats = 0, cap_aliases = 0;
	int err = 0;

	memset(m, 0, sizeof(*m));
	if (!sm || rs_pv_kind(sm) == RS_PV_NONE)
		return 0;
	if (!ms_dict(sm, &items)) {
		rs_diag_add(d, "%s: shard_metadata is not a dict", where);
		return -EINVAL;
	}
	if (rs_pv_len(items) == 0)
		return 0;       /* reshard_fsdp's unflattened output */
	pm = rs_pv_get(items, "param_metadata");
	bufs = rs_pv_get(items, "buffer_names");
	if (!pv_list(pm) || (bufs && !pv_list(bufs))) {
		rs_diag_add(d, "%s: shard_metadata has no param_metadata list (or a buffer_names that is not a list)",
			    where);
		return -EINVAL;
	}
	m->present = true;
	for (size_t i = 0; i < rs_pv_len(pm) && !err; i++) {
		const rs_pvalue *inst, *params, *nb;
		const char *path;
		bool rank0_only = false;

		if (!ms_dict(rs_pv_item(pm, i), &inst) ||
		    !(path = ms_whole_str(rs_pv_get(inst, "fsdp_path"))) ||
		    !ms_dict(rs_pv_get(inst, "params"), &params)) {
			rs_diag_add(d, "%s: shard_metadata: param_metadata[%zu] needs an fsdp_path string and a params dict",
				    where, i);
			return -EINVAL;
		}
		nb = rs_pv_get(inst, "no_broadcast_optim_state");
		if (nb && rs_pv_kind(nb) != RS_PV_NONE &&
		    rs_pv_bool(nb, &rank0_only) != 0) {
			rs_diag_add(d, "%s: shard_metadata: no_broadcast_optim_state of \"%s\" is not a bool",
				    where, path);
			return -EINVAL;
		}
		for (size_t k = 0; k < rs_pv_len(params) && !err; k++) {
			const char *flat = ms_whole_str(rs_pv_key(params, k));

			if (!flat || !*flat) {
				rs_diag_add(d, "%s: shard_metadata: a params key of \"%s\" is not a non-empty string without NULs",
					    where, path);
				return -EINVAL;
			}
			err = pickle_flat(m, &cap_flats, path, flat,
					  rs_pv_val(params, k), rank0_only,
					  where, d);
		}
		if (!err)
			err = pickle_aliases(m, &cap_aliases, path,
					     rs_pv_get(inst, "shared_param_info"),
					     where, d);
	}
	if (err)
		return err;
	m->buffers = calloc(rs_pv_len(bufs) + 1, sizeof(char *));
	if (!m->buffers)
		return -ENOMEM;
	for (size_t i = 0; i < rs_pv_len(bufs); i++) {
		const char *b = ms_whole_str(rs_pv_item(bufs, i));

		if (!b) {
			rs_diag_add(d, "%s: shard_metadata: buffer_names[%zu] is not a string without NULs",
				    where, i);
			return -EINVAL;
		}
		if (!(m->buffers[m->nbuffers++] = strdup(b)))
			return -ENOMEM;
	}
	return check_unique(m, where, d);
}

/* ---- -o params=FILE ---------------------------------------------------- */

static bool json_dims(const cJSON *v, uint64_t *out, int *n)
{
	const cJSON *it;

	if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > RS_MAX_DIMS)
		return false;
	*n = 0;
	cJSON_ArrayForEach(it, v)
		if (!rs_json_u64(it, &out[(*n)++]))
			return false;
	return true;
}

/* {"names": [...], "shapes": [[...]], "numels": [...]?} of flat `key`
 * (its module path the first plen bytes). */
static int json_flat(ms_meta *m, size_t *cap, char *key, size_t plen,
		     const cJSON *info, const char *path, rs_diag *d)
{
	const cJSON *names = cJSON_GetObjectItemCaseSensitive(info, "names");
	const cJSON *shapes = cJSON_GetObjectItemCaseSensitive(info, "shapes");
	const cJSON *numels = cJSON_GetObjectItemCaseSensitive(info, "numels");
	int n = cJSON_GetArraySize(names);
	ms_flat *f;

	if (!cJSON_IsObject(info) || !cJSON_IsArray(names) ||
	    !cJSON_IsArray(shapes) || cJSON_GetArraySize(shapes) != n ||
	    (unsigned)n > MS_MAX_PARAMS ||
	    (numels && (!cJSON_IsArray(numels) ||
			cJSON_GetArraySize(numels) != n))) {
		rs_diag_add(d, "%s: %s needs arrays \"names\" and \"shapes\" (and \"numels\", if given) of one length (at most %u)",
			    path, key ? key : "?", MS_MAX_PARAMS);
		free(key);
		return key ? -EINVAL : -ENOMEM;
	}
	f = flat_add(m, cap, key, plen, (size_t)n);
	if (!f)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		const cJSON *name = cJSON_GetArrayItem(names, i);
		uint64_t shape[RS_MAX_DIMS], numel = 0;
		int ndim = 0, err;

		if (!json_dims(cJSON_GetArrayItem(shapes, i), shape, &ndim) ||
		    (numels &&
		     !rs_json_u64(cJSON_GetArrayItem(numels, i), &numel))) {
			rs_diag_add(d, "%s: %s: shape %d is not a list of at most %d non-negative integers (or its numel is not one)",
				    path, f->key, i, RS_MAX_DIMS);
			return -EINVAL;
		}
		err = flat_param(f, path,
				 cJSON_IsString(name) ? name->valuestring : NULL,
				 shape, ndim, numels != NULL, numel, d);
		if (err)
			return err;
	}
	return 0;
}

/* The flat-param map form: {"decoder.layers.0.flat_param_0": {...}}. */
static int json_map(ms_meta *m, const cJSON *root, const char *path,
		    rs_diag *d)
{
	const cJSON *it;
	size_t cap = 0;
	int err = 0;

	cJSON_ArrayForEach(it, root) {
		const char *dot = strrchr(it->string, '.');

		if (!*it->string) {
			rs_diag_add(d, "%s: a flat param key is empty", path);
			return -EINVAL;
		}
		err = json_flat(m, &cap, strdup(it->string),
				dot ? (size_t)(dot - it->string) : 0, it, path,
				d);
		if (err)
			return err;
	}
	return 0;
}

/* fairscale's shard_metadata written as JSON. */
static int json_fairscale(ms_meta *m, const cJSON *root, const char *path,
			  rs_diag *d)
{
	const cJSON *pm = cJSON_GetObjectItemCaseSensitive(root, "param_metadata");
	const cJSON *bufs = cJSON_GetObjectItemCaseSensitive(root, "buffer_names");
	const cJSON *inst, *it;
	size_t cap = 0, cap_aliases = 0;
	int err;

	if (!cJSON_IsArray(pm) || (bufs && !cJSON_IsArray(bufs))) {
		rs_diag_add(d, "%s: \"param_metadata\" is not an array (or \"buffer_names\" is not)",
			    path);
		return -EINVAL;
	}
	cJSON_ArrayForEach(inst, pm) {
		const cJSON *fp = cJSON_GetObjectItemCaseSensitive(inst, "fsdp_path");
		const cJSON *params = cJSON_GetObjectItemCaseSensitive(inst, "params");
		const cJSON *shared = cJSON_GetObjectItemCaseSensitive(inst, "shared_param_info");
		size_t plen;

		if (!cJSON_IsString(fp) || !cJSON_IsObject(params) ||
		    (shared && !cJSON_IsArray(shared))) {
			rs_diag_add(d, "%s: each param_metadata item needs an \"fsdp_path\" string and a \"params\" object",
				    path);
			return -EINVAL;
		}
		plen = strlen(fp->valuestring);
		cJSON_ArrayForEach(it, params) {
			err = json_flat(m, &cap, join_name(fp->valuestring, plen,
							   it->string),
					plen, it, path, d);
			if (err)
				return err;
		}
		cJSON_ArrayForEach(it, shared) {
			const cJSON *s = cJSON_GetArrayItem(it, 0);
			const cJSON *t = cJSON_GetArrayItem(it, 1);
			ms_alias *a;

			if (cJSON_GetArraySize(it) != 2 || !cJSON_IsString(s) ||
			    !cJSON_IsString(t)) {
				rs_diag_add(d, "%s: shared_param_info of \"%s\" is not a list of [src, dst] name pairs",
					    path, fp->valuestring);
				return -EINVAL;
			}
			if (rs_array_reserve(&m->aliases, &cap_aliases,
					     m->naliases + 1, sizeof(ms_alias)))
				return -ENOMEM;
			a = &m->aliases[m->naliases++];
			a->src = join_name(fp->valuestring, plen,
					   s->valuestring);
			a->dst = join_name(fp->valuestring, plen,
					   t->valuestring);
			if (!a->src || !a->dst)
				return -ENOMEM;
		}
	}
	m->buffers = calloc((size_t)cJSON_GetArraySize(bufs) + 1,
			    sizeof(char *));
	if (!m->buffers)
		return -ENOMEM;
	cJSON_ArrayForEach(it, bufs) {
		if (!cJSON_IsString(it)) {
			rs_diag_add(d, "%s: \"buffer_names\" holds a non-string", path);
			return -EINVAL;
		}
		if (!(m->buffers[m->nbuffers++] = strdup(it->valuestring)))
			return -ENOMEM;
	}
	return 0;
}

int ms_meta_from_json(const char *path, ms_meta *m, rs_diag *d)
{
	char why[100], *text;
	cJSON *root = NULL;
	size_t len = 0;
	int err;

	memset(m, 0, sizeof(*m));
	text = rs_user_file_read(path, MS_PARAMS_MAX_BYTES, "params file", &len,
				 d);
	if (!text)
		return -EINVAL;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s", path, why);
	if (!err) {
		m->present = true;
		err = cJSON_GetObjectItemCaseSensitive(root, "param_metadata")
			? json_fairscale(m, root, path, d)
			: json_map(m, root, path, d);
	}
	if (!err)
		err = check_unique(m, path, d);
	if (err)
		ms_meta_free(m);
	cJSON_Delete(root);
	free(text);
	return err;
}
