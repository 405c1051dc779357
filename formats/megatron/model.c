/* Legacy Megatron reader, one rank file: model dicts -> catalog fragments.
 *
 * The model of a rank is what megatron/legacy/model's
 * state_dict_for_save_checkpoint returns: dicts (plain, or the
 * OrderedDicts of module.state_dict()) down to tensors.  Each tensor is
 * found by its keys; TP rank 0 of a stage creates the catalog tensor and
 * the other ranks must hold the same one, in the same dtype and local
 * shape, adding their fragment along the split axis.
 */
#include "formats/megatron/megatron.h"
#include "formats/megatron/megatron_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

/* Model dicts one file may hold.  A real rank file has a handful; the
 * bound keeps the check below cheap. */
#define RS_MEG_MAX_DICTS 4096

/* The walk of one file's model chunk. */
typedef struct {
	rs_meg_reader *r;
	const rs_zip *z;
	uint32_t p, c, t, e, src;
	uint32_t visit;         /* files of the stage merged before: e*T + t */
	const char *path;
	const char *keys[RS_MEGATRON_MAX_NESTING];
	int nkeys;
	size_t next;            /* ranks > 0: the catalog index expected next */
	uint8_t *seen;          /* rank 0: layers of the chunk found */
	size_t recent[4];       /* expert weights met last (find_in_chunk) */
	size_t nrecent;
	const rs_pvalue *dicts[RS_MEG_MAX_DICTS];   /* dicts walked so far */
	size_t ndicts;
} walker;

/* A key naming a layer: "layers.<n>.<rest>" (the legacy model's nested
 * dicts), or "<prefix>.layers.<n>.<rest>" (megatron-core's flat state
 * dict keys: decoder.layers.3.mlp.linear_fc1.weight).  n, where "<n>."
 * starts (*at) and where rest starts. */
static bool layer_key(const char *k, uint64_t *n, size_t *at,
		      const char **rest)
{
	static const char pre[] = "layers.";

	for (const char *p = k; (p = strstr(p, pre)); p++) {
		const char *s = p + sizeof(pre) - 1;
		uint64_t v = 0;
		int digits = 0;

		if (p != k && p[-1] != '.')
			continue;
		for (; *s >= '0' && *s <= '9' && digits < 10; s++, digits++)
			v = v * 10 + (uint64_t)(*s - '0');
		if (!digits || *s != '.' || !s[1])
			continue;
		*n = v;
		*at = (size_t)(p - k) + sizeof(pre) - 1;
		*rest = s + 1;
		return true;
	}
	return false;
}

/* The catalog name of the tensor at w->keys, with its global layer. */
static int flat_name(const walker *w, int lk, uint64_t layer, size_t at_key,
		     const char *rest, char *out, size_t size)
{
	size_t at = 0;

	for (int i = 0; i < w->nkeys; i++) {
		int n = i == lk
			? snprintf(out + at, size - at, "%s%.*s%llu.%s",
				   i ? "." : "", (int)at_key, w->keys[i],
				   (unsigned long long)layer, rest)
			: snprintf(out + at, size - at, "%s%s", i ? "." : "",
				   w->keys[i]);

		if (n < 0 || (size_t)n >= size - at)
			return -ENAMETOOLONG;
		at += (size_t)n;
	}
	return 0;
}

static void frag_set(rs_fragment *f, const rs_torch_tensor *tt, uint32_t src,
		     const uint64_t *off, const uint64_t *len, uint64_t offset)
{
	f->box.ndim = tt->ndim;
	memcpy(f->box.off, off, sizeof(f->box.off));
	memcpy(f->box.len, len, sizeof(f->box.len));
	memcpy(f->stride, tt->stride, sizeof(f->stride));
	f->source = src;
	f->offset = offset;
}

/* Rank t's fragment(s) of tensor `ten` (split along `axis`, or -1). */
static int place_rank(walker *w, rs_tensor *ten, int axis,
		      const rs_torch_tensor *tt)
{
	uint32_t T = w->r->st->tp, t = w->t;
	uint64_t off[RS_MAX_DIMS] = { 0 }, len[RS_MAX_DIMS];
	uint64_t half, skip;

	memcpy(len, tt->shape, sizeof(len));
	if (axis < 0) {
		frag_set(&ten->frags[0], tt, w->src, off, len, tt->offset);
		return 0;
	}
	if (ten->nfrags == T) {
		off[axis] = (uint64_t)t * tt->shape[axis];
		frag_set(&ten->frags[t], tt, w->src, off, len, tt->offset);
		return 0;
	}
	/* gated: rows [0, half) are W_t, [half, 2*half) V_t */
	half = tt->shape[0] / 2;
	len[0] = half;
	off[0] = (uint64_t)t * half;
	frag_set(&ten->frags[t], tt, w->src, off, len, tt->offset);
	off[0] = (uint64_t)T * half + (uint64_t)t * half;
	if (!rs_mul_u64(half, tt->stride[0], &skip) ||
	    !rs_mul_u64(skip, rs_dtype_size(tt->dtype), &skip) ||
	    !rs_add_u64(skip, tt->offset, &skip))
		return -EOVERFLOW;
	frag_set(&ten->frags[T + t], tt, w->src, off, len, half ? skip : tt->offset);
	return 0;
}

static bool is_gated_name(const char *name)
{
	size_t n = strlen(name);
	static const char *const ends[] = { "mlp.dense_h_to_4h.weight",
					    "mlp.dense_h_to_4h.bias",
					    "mlp.linear_fc1.weight",
					    "mlp.linear_fc1.bias",
					    "mlp.shared_experts.linear_fc1.weight",
					    "mlp.shared_experts.linear_fc1.bias" };

	for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
		size_t m = strlen(ends[i]);

		if (n >= m && strcmp(name + n - m, ends[i]) == 0 &&
		    (n == m || name[n - m - 1] == '.'))
			return true;
	}
	return false;
}

/* Split axis of a catalog name (-1: replicated) by the built-in rules;
 * -EINVAL (reported) when the rule does not fit or no rule knows a tensor
 * that T > 1 ranks each hold a copy of. */
static int split_axis(walker *w, const char *name, const rs_torch_tensor *tt,
		      int *axis)
{
	int layer_axes = 0;
	const rs_rule *rule = rs_rules_match(w->r->rules, name, &layer_axes);

	*axis = -1;
	if (!rule) {
		if (w->r->st->tp == 1)
			return 0;
		rs_diag_add(w->r->d, "%s: %s: no sharding rule knows this tensor, so its %u per-rank copies cannot be merged",
			    w->path, name, w->r->st->tp);
		return -EINVAL;
	}
	if (rule->split == RS_SPLIT_NONE)
		return 0;
	*axis = layer_axes + rule->axis;
	if (*axis >= tt->ndim) {
		rs_diag_add(w->r->d, "%s: %s: rule '%s' splits axis %d, but the tensor has %d axes",
			    w->path, name, rule->match, *axis, tt->ndim);
		return -EINVAL;
	}
	return 0;
}

static int add_meta(walker *w, size_t index, int lk, uint64_t layer,
		    size_t at_key, const char *rest, rs_meg_place place,
		    int axis)
{
	rs_meg_reader *r = w->r;
	rs_meg_tensor *mt;
	int err = rs_array_reserve(&r->st->tensors, &r->cap_tensors, index + 1,
				   sizeof(rs_meg_tensor));

	if (!err)
		err = rs_array_reserve(&r->filled, &r->cap_filled, index + 1,
				       sizeof(*r->filled));
	if (err)
		return err;
	r->filled[index] = 1;
	mt = &r->st->tensors[index];
	memset(mt, 0, sizeof(*mt));
	r->st->ntensors = index + 1;
	mt->keys = calloc((size_t)w->nkeys, sizeof(char *));
	if (!mt->keys)
		return -ENOMEM;
	mt->nkeys = w->nkeys;
	for (int i = 0; i < w->nkeys; i++) {
		if (i == lk)
			err = asprintf(&mt->keys[i], "%.*s%s", (int)at_key,
				       w->keys[i], rest) < 0 ? -ENOMEM : 0;
		else if (!(mt->keys[i] = strdup(w->keys[i])))
			err = -ENOMEM;
		if (err) {
			mt->keys[i] = NULL;
			return err;
		}
	}
	mt->expert_param = -1;
	mt->layer_key = lk;
	mt->layer_at = at_key;
	mt->axis = axis;
	mt->layer = layer;
	mt->place = place;
	return 0;
}

/* Rank 0 of a stage: a new catalog tensor. */
static int create(walker *w, const char *name, const rs_torch_tensor *tt,
		  int lk, uint64_t layer, size_t at_key, const char *rest,
		  rs_meg_place place)
{
	rs_meg_reader *r = w->r;
	uint32_t T = r->st->tp;
	uint64_t shape[RS_MAX_DIMS];
	size_t index, nfrags = 1;
	int axis, err;
	bool gated = false;

	err = split_axis(w, name, tt, &axis);
	if (err)
		return err;
	memcpy(shape, tt->shape, sizeof(shape));
	if (axis >= 0) {
		gated = r->gated && axis == 0 && is_gated_name(name);
		if (gated && tt->shape[0] % 2) {
			rs_diag_add(r->d, "%s: %s: a gated (swiglu) tensor of %llu rows, not [W; V] halves",
				    w->path, name, (unsigned long long)tt->shape[0]);
			return -EINVAL;
		}
		nfrags = gated ? 2 * (size_t)T : T;
		if (!rs_mul_u64(shape[axis], T, &shape[axis])) {
			rs_diag_add(r->d, "%s: %s: global size overflows", w->path,
				    name);
			return -EINVAL;
		}
	}
	err = rs_catalog_add_fragments(&r->ck->catalog, name, tt->dtype,
				       tt->ndim, shape, nfrags, &index);
	if (err) {
		rs_diag_add(r->d, "%s: %s: shape too large", w->path, name);
		return -EINVAL;
	}
	err = rs_catalog_set_origin(&r->ck->catalog, index, w->path);
	if (!err)
		err = add_meta(w, index, lk, layer, at_key, rest, place, axis);
	if (!err)
		err = place_rank(w, &r->ck->catalog.tensors[index], axis, tt);
	return err;
}

/* Ranks > 0: the tensor must be rank 0's, dtype and shape alike. */
static int match(walker *w, const char *name, const rs_torch_tensor *tt)
{
	rs_meg_reader *r = w->r;
	size_t g = 2 * ((size_t)w->p * r->st->vpp + w->c);
	size_t begin = r->group[g], end = r->group[g + 1], i = w->next;
	uint64_t want[RS_MAX_DIMS];
	rs_tensor *ten;
	int axis;

	if (i >= end || strcmp(r->ck->catalog.tensors[i].name, name) != 0)
		for (i = begin; i < end; i++)
			if (strcmp(r->ck->catalog.tensors[i].name, name) == 0)
				break;
	if (i >= end) {
		rs_diag_add(r->d, "%s: holds %s, which TP rank 0 of its stage lacks",
			    w->path, name);
		return -EINVAL;
	}
	if (r->st->tensors[i].expert_param >= 0) {
		rs_diag_add(r->d, "%s: holds %s outside an expert module", w->path,
			    name);
		return -EINVAL;
	}
	ten = &r->ck->catalog.tensors[i];
	axis = r->st->tensors[i].axis;
	memcpy(want, ten->shape, sizeof(want));
	if (axis >= 0)
		want[axis] /= r->st->tp;   /* the global shape is T local ones */
	if (tt->dtype != ten->dtype || tt->ndim != ten->ndim ||
	    memcmp(tt->shape, want, (size_t)tt->ndim * sizeof(uint64_t)) != 0) {
		rs_diag_add(r->d, "%s: %s differs in dtype or shape from TP rank 0's",
			    w->path, name);
		return -EINVAL;
	}
	if (r->filled[i] != w->visit) {
		rs_diag_add(r->d, "%s: holds %s twice", w->path, name);
		return -EINVAL;
	}
	/* EP ranks hold different experts under the same local names: one
	 * this reader does not know as an expert weight (the legacy model's
	 * SwitchMLP) would pass for a copy of EP rank 0's */
	if (w->e > 0 && strstr(name, "local_experts.")) {
		rs_diag_add(r->d, "%s: %s: an expert weight outside megatron-core's expert modules; expert parallelism is read only for those",
			    w->path, name);
		return -EINVAL;
	}
	r->filled[i]++;
	w->next = i + 1;
	/* replicated: TP rank 0's copy is served; EP ranks > 0 hold copies
	 * of what EP rank 0 holds (checked for shape and dtype only) */
	if (axis < 0 || w->e > 0)
		return 0;
	return place_rank(w, ten, axis, tt);
}

/* word_embeddings_for_head: the last stage's copy of tied embeddings. */
static int check_head(walker *w, const rs_torch_tensor *tt)
{
	rs_meg_reader *r = w->r;
	const rs_tensor *we = r->st->word_emb >= 0
		? &r->ck->catalog.tensors[r->st->word_emb] : NULL;

	if (!we || tt->dtype != we->dtype || tt->ndim != 2 ||
	    tt->shape[1] != we->shape[1] || we->shape[0] % r->st->tp ||
	    tt->shape[0] != we->shape[0] / r->st->tp) {
		rs_diag_add(r->d, "%s: word_embeddings_for_head.weight does not match the word embeddings",
			    w->path);
		return -EINVAL;
	}
	return 0;
}

/* The catalog tensor `name` of the chunk being walked (rank 0 creates
 * it), found from the last few expert weights met: a file names its
 * experts' weights in turn. */
static long find_in_chunk(walker *w, const char *name)
{
	rs_meg_reader *r = w->r;
	size_t g = 2 * ((size_t)w->p * r->st->vpp + w->c);
	size_t end = w->visit == 0 ? r->ck->catalog.count : r->group[g + 1];

	for (size_t k = 0; k < 4; k++) {
		size_t i = w->recent[k];

		if (i >= r->group[g] && i < end &&
		    strcmp(r->ck->catalog.tensors[i].name, name) == 0)
			return (long)i;
	}
	for (size_t i = r->group[g]; i < end; i++)
		if (strcmp(r->ck->catalog.tensors[i].name, name) == 0) {
			w->recent[w->nrecent++ % 4] = i;
			return (long)i;
		}
	return -1;
}

/* Fragment(s) of rank (e, t)'s experts [x0, x0 + n) of expert weight
 * `ten`: `len` one expert's local extents, `stride` its element strides
 * (xstride between experts), `offset` where expert x0 starts.  A gated
 * fc1 is [W_t; V_t] per expert: two fragments, as dense fc1 (place_rank). */
static void place_experts(walker *w, rs_tensor *ten, const rs_meg_tensor *mt,
			  bool gated, uint64_t x0, uint64_t n, const uint64_t *len,
			  const uint64_t *stride, uint64_t xstride,
			  uint64_t offset, size_t slot, unsigned esize)
{
	uint32_t T = w->r->st->tp;
	int k = ten->ndim - 1, a = mt->axis - 1;
	uint64_t off[RS_MAX_DIMS] = { 0 }, ln[RS_MAX_DIMS] = { 0 };
	rs_fragment *f = &ten->frags[slot * (gated ? 2 : 1)];

	off[0] = x0;
	ln[0] = n;
	for (int i = 0; i < k; i++)
		ln[i + 1] = len[i];
	if (gated)
		ln[1] = len[0] / 2;
	if (a >= 0)
		off[a + 1] = (uint64_t)w->t * ln[a + 1];
	f->box.ndim = ten->ndim;
	memcpy(f->box.off, off, sizeof(off));
	memcpy(f->box.len, ln, sizeof(ln));
	memset(f->stride, 0, sizeof(f->stride));
	f->stride[0] = xstride;
	for (int i = 0; i < k; i++)
		f->stride[i + 1] = stride[i];
	f->source = w->src;
	f->offset = offset;
	if (!gated)
		return;
	f[1] = f[0];
	f[1].box.off[1] = (uint64_t)T * ln[1] + off[1];
	f[1].offset = offset + ln[1] * stride[0] * esize;
}

/* One expert weight key of a rank file (megatron_int.h, rs_meg_experts):
 * local expert `local` (GroupedMLP: all of them) of EP rank w->e, TP
 * rank w->t's shard, becomes part of the catalog tensor
 * <prefix>experts.<param> of shape (experts, out, in). */
static int expert_leaf(walker *w, const char *name, const rs_torch_tensor *tt,
		       int lk, uint64_t layer, size_t at_key, const char *rest,
		       size_t at, rs_meg_experts form, int param, long local)
{
	rs_meg_reader *r = w->r;
	rs_meg_state *st = r->st;
	const rs_meg_expert_param *ep = &rs_meg_expert_params[param];
	uint32_t T = st->tp;
	uint64_t E = st->experts, L, one[RS_MAX_DIMS] = { 0 };
	uint64_t stride[RS_MAX_DIMS] = { 0 }, shape[RS_MAX_DIMS] = { 0 };
	uint64_t xstride = 0, x0, n;
	unsigned esize = rs_dtype_size(tt->dtype);
	char cname[1024], crest[512];
	size_t head = strlen(name) - strlen(rest) + at;
	int k, a = ep->tp_axis - 1, err;
	bool gated;
	long i;
	rs_meg_tensor *mt;
	rs_tensor *ten;

	if (!E) {
		rs_diag_add(r->d, "%s: %s: an expert weight, but args.num_experts is not set",
			    w->path, name);
		return -EINVAL;
	}
	L = E / st->ep;
	if (st->form != RS_MEG_EXPERTS_NONE && st->form != form) {
		rs_diag_add(r->d, "%s: %s: another expert module's key form than the other expert weights'",
			    w->path, name);
		return -EINVAL;
	}
	st->form = form;
	if (local >= 0 && (uint64_t)local >= L) {
		rs_diag_add(r->d, "%s: %s: local expert %ld, but args.num_experts %llu over %u EP ranks makes %llu per rank",
			    w->path, name, local, (unsigned long long)E, st->ep,
			    (unsigned long long)L);
		return -EINVAL;
	}
	/* One expert's extents and strides, in (out, in) order. */
	k = tt->ndim;
	if (form != RS_MEG_EXPERTS_GROUPED) {
		if (k < 1 || k > 2 || (ep->tp_axis > k)) {
			rs_diag_add(r->d, "%s: %s: an expert weight of %d axes", w->path,
				    name, k);
			return -EINVAL;
		}
		memcpy(one, tt->shape, sizeof(uint64_t) * (size_t)k);
		memcpy(stride, tt->stride, sizeof(uint64_t) * (size_t)k);
		x0 = (uint64_t)r->ep_rank * L + (uint64_t)local;
		n = 1;
	} else {
		/* GroupedMLP keeps weight1 [in, L*out] and weight2 [L*in, out]
		 * and views them as [L, in, out]: expert l's (out, in) matrix
		 * transposed, one after another in memory. */
		uint64_t c0 = tt->shape[0], c1 = tt->shape[1];

		if (k != 2 || tt->stride[1] != 1 || tt->stride[0] != c1 ||
		    (param == 0 ? c1 % L : c0 % L)) {
			rs_diag_add(r->d, "%s: %s: not a contiguous matrix of %llu experts",
				    w->path, name, (unsigned long long)L);
			return -EINVAL;
		}
		one[0] = param == 0 ? c1 / L : c1;       /* out */
		one[1] = param == 0 ? c0 : c0 / L;       /* in */
		stride[0] = 1;
		stride[1] = one[0];
		xstride = one[0] * one[1];
		x0 = (uint64_t)r->ep_rank * L;
		n = L;
	}
	gated = r->gated && ep->fc1;
	if (gated && one[0] % 2) {
		rs_diag_add(r->d, "%s: %s: a gated (swiglu) expert fc1 of %llu rows, not [W; V] halves",
			    w->path, name, (unsigned long long)one[0]);
		return -EINVAL;
	}
	shape[0] = E;
	memcpy(shape + 1, one, sizeof(uint64_t) * (size_t)k);
	if (a >= 0 && !rs_mul_u64(shape[a + 1], T, &shape[a + 1])) {
		rs_diag_add(r->d, "%s: %s: global size overflows", w->path, name);
		return -EINVAL;
	}
	if (snprintf(cname, sizeof(cname), "%.*sexperts.%s", (int)head, name,
		     ep->param) >= (int)sizeof(cname) ||
	    snprintf(crest, sizeof(crest), "%.*sexperts.%s", (int)at, rest,
		     ep->param) >= (int)sizeof(crest)) {
		rs_diag_add(r->d, "%s: a model key path is longer than %zu bytes",
			    w->path, sizeof(crest) - 1);
		return -EINVAL;
	}
	i = find_in_chunk(w, cname);
	if (i < 0 && w->visit > 0) {
		rs_diag_add(r->d, "%s: holds %s, which TP rank 0, EP rank 0 of its stage lacks",
			    w->path, name);
		return -EINVAL;
	}
	if (i < 0) {
		size_t index, nfrags = (size_t)(form == RS_MEG_EXPERTS_GROUPED
						 ? st->ep : E) * (a >= 0 ? T : 1) *
				       (gated ? 2 : 1);

		err = rs_catalog_add_fragments(&r->ck->catalog, cname, tt->dtype,
					       k + 1, shape, nfrags, &index);
		if (err) {
			rs_diag_add(r->d, "%s: %s: shape too large", w->path, name);
			return -EINVAL;
		}
		err = rs_catalog_set_origin(&r->ck->catalog, index, w->path);
		if (!err)
			err = add_meta(w, index, lk, layer, at_key, crest,
				       RS_MEG_LAYER, a >= 0 ? ep->tp_axis : -1);
		if (err)
			return err;
		mt = &st->tensors[index];
		mt->expert_param = param;
		mt->expert_at = at_key + at;
		mt->have = calloc((size_t)E * T, 1);
		if (!mt->have)
			return -ENOMEM;
		r->filled[index] = 0;
		i = (long)index;
		w->recent[w->nrecent++ % 4] = index;
	}
	ten = &r->ck->catalog.tensors[i];
	mt = &st->tensors[i];
	if (mt->expert_param != param || ten->dtype != tt->dtype ||
	    ten->ndim != k + 1 ||
	    memcmp(ten->shape, shape, sizeof(uint64_t) * (size_t)(k + 1))) {
		rs_diag_add(r->d, "%s: %s differs in dtype or shape from the other experts' (%s)",
			    w->path, name, ten->origin);
		return -EINVAL;
	}
	if (r->filled[i] != w->visit && r->filled[i] != w->visit + 1) {
		rs_diag_add(r->d, "%s: %s: an expert weight that an earlier rank file lacks",
			    w->path, name);
		return -EINVAL;
	}
	r->filled[i] = w->visit + 1;
	for (uint64_t x = x0; x < x0 + n; x++) {
		uint8_t *h = &mt->have[x * T + w->t];

		if (*h) {
			rs_diag_add(r->d, "%s: %s: holds global expert %llu twice",
				    w->path, name, (unsigned long long)x);
			return -EINVAL;
		}
		*h = 1;
	}
	/* a replicated expert weight (fc2's bias) is served from TP rank 0 */
	if (a < 0 && w->t > 0)
		return 0;
	place_experts(w, ten, mt, gated, x0, n, one, stride, xstride, tt->offset,
		      (form == RS_MEG_EXPERTS_GROUPED ? (size_t)r->ep_rank
						      : (size_t)x0) *
			      (a >= 0 ? T : 1) + (a >= 0 ? w->t : 0),
		      esize);
	return 0;
}

static int leaf(walker *w, const rs_pvalue *v)
{
	rs_meg_reader *r = w->r;
	uint32_t P = r->st->pp, V = r->st->vpp;
	uint64_t n = 0, layer = 0;
	size_t at_key = 0;
	const char *rest = NULL;
	char name[1024], why[200];
	rs_meg_place place = RS_MEG_LAST;
	bool first = w->p == 0 && w->c == 0;
	bool last = w->p == P - 1 && w->c == V - 1;
	rs_torch_tensor tt;
	int lk = -1;

	for (int i = 0; i < w->nkeys && lk < 0; i++)
		if (layer_key(w->keys[i], &n, &at_key, &rest))
			lk = i;
	if (lk >= 0) {
		if (n >= r->lpc) {
			rs_diag_add(r->d, "%s: model chunk %u holds layer %llu, but chunks have %llu layers",
				    w->path, w->c, (unsigned long long)n,
				    (unsigned long long)r->lpc);
			return -EINVAL;
		}
		layer = ((uint64_t)w->c * P + w->p) * r->lpc + n;
		place = RS_MEG_LAYER;
	} else {
		for (int i = 0; i < w->nkeys; i++)
			if (strcmp(w->keys[i], "embedding") == 0 ||
			    strncmp(w->keys[i], "embedding.", 10) == 0)
				place = RS_MEG_FIRST;
	}
	if (flat_name(w, lk, layer, at_key, rest, name, sizeof(name))) {
		rs_diag_add(r->d, "%s: a model key path is longer than %zu bytes",
			    w->path, sizeof(name) - 1);
		return -EINVAL;
	}
	if (rs_torch_tensor_read(w->z, v, &tt, why, sizeof(why))) {
		rs_diag_add(r->d, "%s: %s %s", w->path, name, why);
		return -EINVAL;
	}
	if ((place == RS_MEG_FIRST && !first) || (place == RS_MEG_LAST && !last)) {
		rs_diag_add(r->d, "%s: %s belongs to the %s model chunk, but is in chunk %u of stage %u",
			    w->path, name, place == RS_MEG_FIRST ? "first" : "last",
			    w->c, w->p);
		return -EINVAL;
	}
	if (r->st->tied && strcmp(name, "word_embeddings_for_head.weight") == 0)
		return check_head(w, &tt);
	if (lk == w->nkeys - 1) {
		rs_meg_experts form;
		int param;
		long local;
		size_t at;

		if (rs_meg_expert_key(rest, &form, &param, &local, &at)) {
			if (w->visit == 0)
				w->seen[n] = 1;
			return expert_leaf(w, name, &tt, lk, layer, at_key,
						  rest, at, form, param, local);
		}
	}
	if (w->visit > 0)
		return match(w, name, &tt);
	if (lk >= 0)
		w->seen[n] = 1;
	return create(w, name, &tt, lk, layer, at_key, rest, place);
}

/* The pickle memo lets one dict appear under many keys (and inside
 * itself): walked once per reference, a few hundred bytes could name
 * billions of tensors.  Megatron never shares a model dict, so a dict met
 * twice is refused. */
static int enter(walker *w, const rs_pvalue *pairs)
{
	for (size_t i = 0; i < w->ndicts; i++)
		if (w->dicts[i] == pairs) {
			rs_diag_add(w->r->d, "%s: a model dict appears twice",
				    w->path);
			return -EINVAL;
		}
	if (w->ndicts == RS_MEG_MAX_DICTS) {
		rs_diag_add(w->r->d, "%s: more than %d model dicts", w->path,
			    RS_MEG_MAX_DICTS);
		return -EINVAL;
	}
	w->dicts[w->ndicts++] = pairs;
	return 0;
}

static int walk(walker *w, const rs_pvalue *pairs)
{
	int err = pairs ? enter(w, pairs) : 0;

	if (err)
		return err;
	for (size_t i = 0; i < rs_pv_len(pairs); i++) {
		const rs_pvalue *v = rs_pv_val(pairs, i), *sub;
		size_t len;
		const char *k = rs_pv_str(rs_pv_key(pairs, i), &len);

		if (!k || !len || strlen(k) != len || strchr(k, '/')) {
			rs_diag_add(w->r->d, "%s: a model dict key is not a plain string",
				    w->path);
			return -EINVAL;
		}
		if (w->nkeys == RS_MEGATRON_MAX_NESTING) {
			rs_diag_add(w->r->d, "%s: model dicts nested deeper than %d",
				    w->path, RS_MEGATRON_MAX_NESTING);
			return -EINVAL;
		}
		/* megatron-core's linear layers save an _extra_state, None
		 * without Transformer Engine's fp8 state: no tensor, and
		 * nothing a view needs. */
		if (rs_pv_kind(v) == RS_PV_NONE && len >= 12 &&
		    strcmp(k + len - 12, "_extra_state") == 0)
			continue;
		w->keys[w->nkeys++] = k;
		if (rs_torch_is_tensor(v))
			err = leaf(w, v);
		else if (rs_pv_dict_like(v, &sub))
			err = walk(w, sub);
		else {
			rs_diag_add(w->r->d, "%s: model entry %s is neither a tensor nor a dict",
				    w->path, k);
			err = -EINVAL;
		}
		w->nkeys--;
		if (err)
			return err;
	}
	return 0;
}

/* Rank file (e, t) must hold every one of its EP rank's local experts of
 * each expert weight of the chunk: no holes, whatever the key form. */
static int check_experts(walker *w)
{
	rs_meg_reader *r = w->r;
	size_t g = 2 * ((size_t)w->p * r->st->vpp + w->c);
	uint64_t L = r->st->experts / r->st->ep;

	for (size_t i = r->group[g]; i < r->group[g + 1]; i++) {
		const rs_meg_tensor *mt = &r->st->tensors[i];

		if (mt->expert_param < 0)
			continue;
		for (uint64_t l = 0; l < L; l++) {
			uint64_t x = w->e * L + l;

			if (!mt->have[x * r->st->tp + w->t]) {
				rs_diag_add(r->d, "%s: %s: lacks local expert %llu (global expert %llu of %llu)",
					    w->path, r->ck->catalog.tensors[i].name,
					    (unsigned long long)l, (unsigned long long)x,
					    (unsigned long long)r->st->experts);
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* After rank t's chunk: everything TP rank 0 had must have been found. */
static int check_group(walker *w)
{
	rs_meg_reader *r = w->r;
	size_t g = 2 * ((size_t)w->p * r->st->vpp + w->c);

	if (w->visit == 0) {
		for (uint64_t n = 0; n < r->lpc; n++)
			if (!w->seen[n]) {
				rs_diag_add(r->d, "%s: model chunk %u holds no tensor of its layer %llu",
					    w->path, w->c, (unsigned long long)n);
				return -EINVAL;
			}
		return check_experts(w);
	}
	for (size_t i = r->group[g]; i < r->group[g + 1]; i++)
		if (r->filled[i] != w->visit + 1) {
			rs_diag_add(r->d, "%s: lacks %s, which TP rank 0 of its stage holds",
				    w->path, r->ck->catalog.tensors[i].name);
			return -EINVAL;
		}
	return check_experts(w);
}

int rs_meg_add_rank(rs_meg_reader *r, const rs_zip *z, const rs_pvalue *top,
		    uint32_t p, uint32_t t, uint32_t src, const char *path)
{
	walker *w = calloc(1, sizeof(*w));
	int err = -ENOMEM;

	if (!w)
		return err;
	*w = (walker){ .r = r, .z = z, .p = p, .t = t, .e = r->ep_rank,
		       .visit = r->ep_rank * r->st->tp + t, .src = src,
		       .path = path };
	w->seen = calloc(r->lpc ? r->lpc : 1, 1);
	if (!w->seen)
		goto out;
	err = 0;
	for (uint32_t c = 0; c < r->st->vpp && !err; c++) {
		size_t g = 2 * ((size_t)p * r->st->vpp + c);
		const rs_pvalue *model, *pairs;
		char key[32];

		if (r->st->vpp == 1)
			snprintf(key, sizeof(key), "model");
		else
			snprintf(key, sizeof(key), "model%u", c);
		model = rs_pv_get(top, key);
		if (!rs_pv_dict_like(model, &pairs)) {
			rs_diag_add(r->d, "%s: no '%s' dict (args say %u virtual pipeline stage%s)",
				    path, key, r->st->vpp, r->st->vpp > 1 ? "s" : "");
			err = -EINVAL;
			break;
		}
		w->c = c;
		memset(w->seen, 0, r->lpc ? r->lpc : 1);
		if (w->visit == 0)
			r->group[g] = r->ck->catalog.count;
		w->next = r->group[g];
		err = walk(w, pairs);
		if (w->visit == 0)
			r->group[g + 1] = r->ck->catalog.count;
		if (!err)
			err = check_group(w);
	}
out:
	free(w->seen);
	free(w);
	return err;
}

/* After every rank file: experts in exactly the layers args.moe_layer_freq
 * makes MoE layers, naming the file of the first layer that differs. */
int rs_meg_check_moe_layers(rs_meg_reader *r)
{
	rs_meg_state *st = r->st;
	uint8_t *has;
	int err = 0;

	if (st->ep > 1 && st->form == RS_MEG_EXPERTS_NONE) {
		rs_diag_add(r->d, "%s: %u expert-parallel rank directories, but no expert weights of megatron-core's expert modules (mlp.experts.*)",
			    st->first_path, st->ep);
		return -EINVAL;
	}
	if (!st->experts)
		return 0;
	has = calloc(st->layers, 1);
	if (!has)
		return -ENOMEM;
	for (size_t i = 0; i < st->ntensors; i++)
		if (st->tensors[i].expert_param >= 0 &&
		    st->tensors[i].layer < st->layers)
			has[st->tensors[i].layer] = 1;
	for (uint64_t n = 0; n < st->layers && !err; n++) {
		const char *file = st->first_path;

		if (has[n] == st->moe_layer[n])
			continue;
		for (size_t i = 0; i < st->ntensors; i++)
			if (st->tensors[i].place == RS_MEG_LAYER &&
			    st->tensors[i].layer == n) {
				file = r->ck->catalog.tensors[i].origin;
				break;
			}
		rs_diag_add(r->d, "%s: layer %llu %s, but args.moe_layer_freq says it is %s",
			    file, (unsigned long long)n,
			    has[n] ? "holds experts" : "holds no experts",
			    has[n] ? "dense" : "an MoE layer");
		err = -EINVAL;
	}
	free(has);
	return err;
}
