/* megatron-core's dp_reshardable distributed-optimizer state as model-space
 * tensors (docs/FORMATS.md, "Distributed optimizer").
 *
 * A dp_reshardable save holds, per TP rank g (`dp_group_idx_<g>`), grad
 * buffer and bucket, one 1-d tensor per optimizer state: the bucket's
 * elements up to its unpadded size, params and the alignment gaps between
 * them.  Where each param sits is not stored.  It is recomputed the way
 * megatron-core's param-and-grad buffer lays a bucket out: the params in
 * reverse module order, each starting on a multiple of 64 elements, a bucket
 * closing where the unpadded size the checkpoint stores is reached.  The
 * module order is first taken from the order of the model's keys in
 * `.metadata` (megatron-core writes its sharded state dict in module
 * order), layers stacked under `decoder.layers.` expanded layer by layer;
 * where a fully parallel save moved keys, the fp32 main params, which the
 * stored weights are rounded from, tell which param sits where.
 *
 * The layout is accepted only if it accounts for every bucket element
 * exactly, no stored chunk straddles a param's edge (megatron-core saves
 * every param piece and every gap as a chunk of its own) and every param's
 * main params round to its weights on every TP rank; else the mount is
 * refused with what did not fit.  Each param's range then becomes
 * fragments of `optimizer.state.<state>.<key>` (a flat range of a box is a
 * few boxes), the shape of the model tensor.  The bucket tensors and the
 * per-group records are dropped, and the view's common.pt says the state is
 * fully_reshardable, with the optimizer's param groups from group 0's
 * record: the form megatron-core loads at any layout.
 */
#include "formats/torch_dist/torch_dist_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"
#include "formats/checkpoint.h"
#include "planner/array.h"
#include "planner/cast_bits.h"
#include "planner/rules.h"

#define PREFIX "optimizer.distributed.dp_group_idx_"
#define MAX_STATES 8
#define MAX_GBUFS 8
#define PARAM_ALIGN 64          /* elements (docs/FORMATS.md) */
#define MAX_CANDIDATES 512      /* params tried for one place */

/* One bucket tensor, by its parsed name. */
typedef struct {
	unsigned group, gbuf, bucket, state;
	size_t tensor;
} bucket_ref;

/* A model param of one layer, in module order, and where it sits. */
typedef struct {
	size_t tensor;
	uint64_t layer;         /* with a layer axis; else 0 */
	uint64_t numel;         /* of one TP rank's shard */
	unsigned gbuf, bucket;
	uint64_t start, end;    /* in the bucket */
} param_slot;

/* What a model tensor's grid says of its TP shards. */
typedef struct {
	int layer_axes;         /* 0 or 1 */
	int axis;               /* TP axis, -1 when replicated */
	uint64_t multiplier;    /* chunks per rank along it */
} tp_split;

typedef struct {
	rs_checkpoint *ck;
	rs_diag *d;
	const char *meta_path;
	unsigned groups, gbufs, states;
	char state_names[MAX_STATES][64];
	rs_dtype gbuf_dtype[MAX_GBUFS];
	unsigned nbuckets[MAX_GBUFS];
	bucket_ref *refs;       /* sorted by (group, gbuf, bucket, state) */
	size_t nrefs, cap_refs;
	param_slot *slots;      /* module order */
	size_t nslots, cap_slots;
	tp_split *split;        /* per catalog tensor */
	int param_state;        /* index of the "param" state */
} distopt;

static bool is_word(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!(*s == '_' || (*s >= 'a' && *s <= 'z') ||
		      (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
			return false;
	return true;
}

/* dp_group_idx_G.gbuf_idx_B.dtype_(torch.P, torch.Q).bucket_idx_K.STATE */
static bool parse_name(const char *name, unsigned *g, unsigned *b,
		       unsigned *k, char *pdtype, char *state)
{
	char grad[32];
	int end = -1;

	if (sscanf(name, PREFIX "%u.gbuf_idx_%u.dtype_(torch.%31[a-z0-9_], torch.%31[a-z0-9_]).bucket_idx_%u.%63s%n",
		   g, b, pdtype, grad, k, state, &end) != 6 || end < 0 ||
	    name[end] != 0)
		return false;
	return is_word(state);
}

static int state_index(distopt *o, const char *state)
{
	for (unsigned s = 0; s < o->states; s++)
		if (strcmp(o->state_names[s], state) == 0)
			return (int)s;
	if (o->states == MAX_STATES)
		return -1;
	snprintf(o->state_names[o->states], sizeof(o->state_names[0]), "%s",
		 state);
	return (int)o->states++;
}

static int cmp_ref(const void *a, const void *b)
{
	const bucket_ref *x = a, *y = b;
	unsigned kx[4] = { x->group, x->gbuf, x->bucket, x->state };
	unsigned ky[4] = { y->group, y->gbuf, y->bucket, y->state };

	for (int i = 0; i < 4; i++)
		if (kx[i] != ky[i])
			return kx[i] < ky[i] ? -1 : 1;
	return 0;
}

static int cmp_frag_start(const void *a, const void *b)
{
	uint64_t x = ((const rs_fragment *)a)->box.off[0];
	uint64_t y = ((const rs_fragment *)b)->box.off[0];

	return x < y ? -1 : x > y;
}

/* The first fragment of a bucket tensor (sorted by start) ending past x. */
static size_t first_frag_after(const rs_tensor *t, uint64_t x)
{
	size_t lo = 0, hi = t->nfrags;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const rs_fragment *f = &t->frags[mid];

		if (f->box.off[0] + f->box.len[0] <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static const rs_tensor *bucket_tensor(const distopt *o, unsigned g,
				      unsigned b, unsigned k, unsigned s)
{
	bucket_ref key = { g, b, k, s, 0 };
	const bucket_ref *r = bsearch(&key, o->refs, o->nrefs, sizeof(key),
				      cmp_ref);

	return r ? &o->ck->catalog.tensors[r->tensor] : NULL;
}

/* Finds the bucket tensors (none: o->nrefs 0) and checks that every group
 * has every bucket of every buffer in every state, the states of a bucket
 * of one size and the same sizes in every group. */
static int find_buckets(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	char pdtype[32], state[64];
	unsigned g, b, k;
	int err;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		rs_dtype pd;
		int s;

		if (strncmp(t->name, PREFIX, strlen(PREFIX)) != 0)
			continue;
		if (!parse_name(t->name, &g, &b, &k, pdtype, state) ||
		    b >= MAX_GBUFS || t->ndim != 1 ||
		    (pd = rs_dtype_from_torch(pdtype, false)) == RS_DTYPE_INVALID) {
			rs_diag_add(o->d, "%s: %s: not a megatron-core dp_reshardable bucket (dp_group_idx_G.gbuf_idx_B.dtype_(param, grad).bucket_idx_K.STATE, 1-d, at most %d buffers)",
				    o->meta_path, t->name, MAX_GBUFS);
			return -EINVAL;
		}
		s = state_index(o, state);
		if (s < 0) {
			rs_diag_add(o->d, "%s: %s: more than %d optimizer states",
				    o->meta_path, t->name, MAX_STATES);
			return -EINVAL;
		}
		if (o->gbuf_dtype[b] != RS_DTYPE_INVALID && o->gbuf_dtype[b] != pd) {
			rs_diag_add(o->d, "%s: %s: grad buffer %u holds params of two dtypes",
				    o->meta_path, t->name, b);
			return -EINVAL;
		}
		o->gbuf_dtype[b] = pd;
		err = rs_array_reserve(&o->refs, &o->cap_refs, o->nrefs + 1,
				       sizeof(*o->refs));
		if (err)
			return err;
		o->refs[o->nrefs++] = (bucket_ref){ g, b, k, (unsigned)s, i };
		if (g >= o->groups)
			o->groups = g + 1;
		if (b >= o->gbufs)
			o->gbufs = b + 1;
		if (k >= o->nbuckets[b])
			o->nbuckets[b] = k + 1;
	}
	if (!o->nrefs)
		return 0;
	/* by start, for lookups by position (they tile: checked on read) */
	for (size_t i = 0; i < o->nrefs; i++) {
		rs_tensor *t = &o->ck->catalog.tensors[o->refs[i].tensor];

		qsort(t->frags, t->nfrags, sizeof(*t->frags), cmp_frag_start);
	}
	qsort(o->refs, o->nrefs, sizeof(*o->refs), cmp_ref);
	for (size_t i = 1; i < o->nrefs; i++)
		if (cmp_ref(&o->refs[i - 1], &o->refs[i]) == 0) {
			rs_diag_add(o->d, "%s: %s: given twice", o->meta_path,
				    c->tensors[o->refs[i].tensor].name);
			return -EINVAL;
		}
	for (b = 0; b < o->gbufs; b++)
		for (k = 0; k < o->nbuckets[b]; k++)
			for (g = 0; g < o->groups; g++)
				for (unsigned s = 0; s < o->states; s++) {
					const rs_tensor *t = bucket_tensor(o, g, b, k, s);
					const rs_tensor *t0 = bucket_tensor(o, 0, b, k, 0);

					if (!t || !t0) {
						rs_diag_add(o->d, "%s: dp_reshardable state %s of bucket %u of grad buffer %u of group %u is missing",
							    o->meta_path, o->state_names[s], k, b, g);
						return -EINVAL;
					}
					if (t->shape[0] != t0->shape[0]) {
						rs_diag_add(o->d, "%s: %s: %llu elements, but %s has %llu",
							    o->meta_path, t->name,
							    (unsigned long long)t->shape[0], t0->name,
							    (unsigned long long)t0->shape[0]);
						return -EINVAL;
					}
				}
	return 0;
}

static bool is_model_tensor(const rs_tensor *t)
{
	return strncmp(t->name, "optimizer.", 10) != 0;
}

/* The TP split of model tensor t from its grid: the one non-layer axis cut
 * into several chunks, a multiple of the group count. */
static int split_of(distopt *o, const rs_tensor *t, tp_split *sp)
{
	int la = rs_rules_layer_axes(t->name);

	sp->layer_axes = la;
	sp->axis = -1;
	sp->multiplier = 1;
	if (la > 1 || la > t->ndim || !t->regular) {
		rs_diag_add(o->d, "%s: %s: %s; dp_reshardable optimizer state is read only for models whose tensors are stored on a regular grid with at most one layer axis",
			    o->meta_path, t->name,
			    !t->regular ? "stored off a regular grid"
					: "more than one layer axis");
		return -EINVAL;
	}
	for (int i = la; i < t->ndim; i++) {
		if (t->grid_count[i] <= 1)
			continue;
		if (sp->axis >= 0 || t->grid_count[i] % o->groups != 0) {
			rs_diag_add(o->d, "%s: %s: its grid (axis %d in %llu chunks) is not a TP split over the %u dp_reshardable groups",
				    o->meta_path, t->name, i,
				    (unsigned long long)t->grid_count[i], o->groups);
			return -EINVAL;
		}
		sp->axis = i;
		sp->multiplier = t->grid_count[i] / o->groups;
	}
	if (la && t->grid[0] != 1) {
		rs_diag_add(o->d, "%s: %s: its layers are not stored one by one",
			    o->meta_path, t->name);
		return -EINVAL;
	}
	if (sp->multiplier > 1 && sp->axis != la) {
		rs_diag_add(o->d, "%s: %s: %llu chunks per TP rank along axis %d; only the first axis may hold several",
			    o->meta_path, t->name,
			    (unsigned long long)sp->multiplier, sp->axis);
		return -EINVAL;
	}
	return 0;
}

/* One group per TP rank: the source TP, the fewest chunks any model
 * tensor is cut into along an axis, must be the group count.  More groups
 * mean pipeline stages (a group per stage and TP rank, each stage's
 * buffers holding its own layers), which are not read. */
static int check_groups(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	uint64_t tp = 0;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		int la = rs_rules_layer_axes(t->name);

		if (!is_model_tensor(t) || !t->regular)
			continue;
		for (int a = la; a < t->ndim; a++)
			if (t->grid_count[a] > 1 && (!tp || t->grid_count[a] < tp))
				tp = t->grid_count[a];
	}
	if (!tp)
		tp = 1;
	if (tp != o->groups) {
		rs_diag_add(o->d, "%s: %u dp_reshardable groups, but the model is stored at tp=%llu: a save with pipeline stages, whose buffers hold each stage's layers, is not read",
			    o->meta_path, o->groups, (unsigned long long)tp);
		return -EINVAL;
	}
	return 0;
}

static int add_slot(distopt *o, size_t tensor, uint64_t layer)
{
	const rs_tensor *t = &o->ck->catalog.tensors[tensor];
	const tp_split *sp = &o->split[tensor];
	uint64_t numel = 1;
	int err;

	for (int i = sp->layer_axes; i < t->ndim; i++)
		numel *= t->shape[i];   /* a checked tensor: no overflow */
	if (sp->axis >= 0)
		numel /= o->groups;
	if (!numel)
		return 0;
	err = rs_array_reserve(&o->slots, &o->cap_slots, o->nslots + 1,
			       sizeof(*o->slots));
	if (err)
		return err;
	o->slots[o->nslots++] = (param_slot){ .tensor = tensor, .layer = layer,
					      .numel = numel };
	return 0;
}

/* The model's params in the order megatron-core's sharded state dict
 * lists them, as far as .metadata keeps it: the keys before the first
 * stacked layer key, then every stacked key layer by layer, then the
 * rest.  A save that spreads its writes over ranks (Megatron-LM's
 * --ckpt-fully-parallel-save) reorders keys; place() repairs that. */
static int module_order(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	size_t first = SIZE_MAX;
	uint64_t layers = 0;
	int err;

	o->split = calloc(c->count ? c->count : 1, sizeof(*o->split));
	if (!o->split)
		return -ENOMEM;
	err = check_groups(o);
	if (err)
		return err;
	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];

		if (!is_model_tensor(t))
			continue;
		if (strstr(t->name, ".experts.")) {
			rs_diag_add(o->d, "%s: %s: expert params have buffers of their own; dp_reshardable state of MoE models is not read",
				    o->meta_path, t->name);
			return -EINVAL;
		}
		err = split_of(o, t, &o->split[i]);
		if (err)
			return err;
		if (!o->split[i].layer_axes)
			continue;
		if (first == SIZE_MAX) {
			first = i;
			layers = t->shape[0];
		} else if (t->shape[0] != layers) {
			rs_diag_add(o->d, "%s: %s: %llu layers, but %s has %llu",
				    o->meta_path, t->name,
				    (unsigned long long)t->shape[0],
				    c->tensors[first].name,
				    (unsigned long long)layers);
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < c->count; i++) {
		if (!is_model_tensor(&c->tensors[i]))
			continue;
		if (i == first)
			for (uint64_t l = 0; l < layers; l++)
				for (size_t j = first; j < c->count; j++)
					if (is_model_tensor(&c->tensors[j]) &&
					    o->split[j].layer_axes &&
					    (err = add_slot(o, j, l)) != 0)
						return err;
		if (o->split[i].layer_axes)
			continue;
		err = add_slot(o, i, 0);
		if (err)
			return err;
	}
	return 0;
}

/* The shape of one stored chunk of a TP rank's shard of t, one layer of
 * it (a rank's shard is `multiplier` of them along the TP axis); returns
 * its element count. */
static uint64_t sub_chunk_shape(const rs_tensor *t, const tp_split *sp,
				uint64_t *len)
{
	uint64_t n = 1;

	for (int i = 0; i < t->ndim; i++)
		len[i] = t->shape[i];
	if (sp->layer_axes)
		len[0] = 1;
	if (sp->axis >= 0)
		len[sp->axis] = t->grid[sp->axis];
	for (int i = 0; i < t->ndim; i++)
		n *= len[i];
	return n;
}

static uint64_t align_up(uint64_t x)
{
	return (x + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
}

/* Byte offset of global element `at` in its fragment of tensor t: a
 * model tensor (on its grid) or a bucket (1-d, sorted by start). */
static bool element_offset(const rs_tensor *t, const uint64_t *at,
			   uint32_t *source, uint64_t *offset)
{
	uint64_t cell[RS_MAX_DIMS], e = 0;
	const rs_fragment *fr;
	size_t f;
	int i;

	if (t->regular) {
		for (i = 0; i < t->ndim; i++)
			cell[i] = at[i] / t->grid[i];
		f = (size_t)rs_tensor_grid_index(t, cell);
	} else if (t->ndim == 1) {
		f = first_frag_after(t, at[0]);
	} else {
		return false;
	}
	if (f >= t->nfrags)
		return false;
	fr = &t->frags[f];
	for (i = 0; i < t->ndim; i++) {
		if (at[i] < fr->box.off[i] || at[i] - fr->box.off[i] >= fr->box.len[i])
			return false;
		e += (at[i] - fr->box.off[i]) * fr->stride[i];
	}
	*source = fr->source;
	*offset = fr->offset + e * rs_dtype_size(t->dtype);
	return true;
}

static int read_element(distopt *o, const rs_tensor *t, const uint64_t *at,
			uint8_t *out)
{
	uint32_t src;
	uint64_t off;

	if (!element_offset(t, at, &src, &off))
		return -ENODATA;
	return rs_sources_pread(o->ck->sources, src, out, rs_dtype_size(t->dtype),
				off);
}

/* Elements of a slot compared: its first few and its last. */
#define CHECK_HEAD 8

/* Whether slot p's fp32 main params on TP rank g, where p is placed,
 * round to its stored weights: megatron-core copies them into the model
 * after every step, so a param put in another's place shows.  1 or 0; a
 * negative errno (reported) when an element cannot be read. */
static int slot_matches(distopt *o, const param_slot *p, unsigned g)
{
	const rs_tensor *t = &o->ck->catalog.tensors[p->tensor];
	const tp_split *sp = &o->split[p->tensor];
	const rs_tensor *bt = bucket_tensor(o, g, p->gbuf, p->bucket,
					    (unsigned)o->param_state);
	uint64_t len[RS_MAX_DIMS], sub;

	sub = sub_chunk_shape(t, sp, len);
	for (uint64_t q = 0; q <= CHECK_HEAD; q++) {
		uint64_t u = q < CHECK_HEAD ? q : p->numel - 1;
		uint64_t v = u % sub, x = p->start + u, at[RS_MAX_DIMS];
		uint8_t main_bytes[4], model[8] = { 0 }, want[8] = { 0 };
		uint32_t bits;
		int err;

		if (u >= p->numel)
			continue;
		for (int i = t->ndim; i-- > 0;) {
			at[i] = v % len[i];
			v /= len[i];
		}
		if (sp->layer_axes)
			at[0] = p->layer;
		if (sp->axis >= 0)
			at[sp->axis] += (u / sub * o->groups + g) * len[sp->axis];
		err = read_element(o, bt, &x, main_bytes);
		if (!err)
			err = read_element(o, t, at, model);
		if (err == -ENODATA)
			return 0;       /* past the bucket's stored part */
		if (err) {
			rs_diag_add(o->d, "%s: %s: cannot read an element to check the dp_reshardable layout: %s",
				    o->meta_path, t->name, strerror(-err));
			return -EINVAL;
		}
		memcpy(&bits, main_bytes, 4);
		rs_store_f32_bits(t->dtype, want, bits);
		if (memcmp(want, model, rs_dtype_size(t->dtype)) != 0)
			return 0;
	}
	return 1;
}

/* Every placed slot on every other rank too. */
static int check_values(distopt *o)
{
	for (size_t n = 0; n < o->nslots; n++)
		for (unsigned g = 1; g < o->groups; g++) {
			const param_slot *p = &o->slots[n];
			int m = slot_matches(o, p, g);

			if (m < 0)
				return m;
			if (!m) {
				rs_diag_add(o->d, "%s: %s (layer %llu, TP rank %u): its fp32 main params at element %llu of bucket %u do not round to its stored weights; the recomputed bucket layout does not match the checkpoint",
					    o->meta_path,
					    o->ck->catalog.tensors[p->tensor].name,
					    (unsigned long long)p->layer, g,
					    (unsigned long long)p->start, p->bucket);
				return -EINVAL;
			}
		}
	return 0;
}

/* Lays the params of each buffer out in its buckets, in reverse module
 * order: each starts on a multiple of PARAM_ALIGN elements, and a bucket
 * closes where its stored size is reached.  At each place the param the
 * key order gives is tried first; if its main params do not round to its
 * weights there (slot_matches), every other param left of the layer
 * being laid out (or outside the layers) is tried, and exactly one must
 * fit. */
static int place(distopt *o)
{
	size_t *order = malloc((o->nslots ? o->nslots : 1) * sizeof(*order));
	int err = 0;

	if (!order)
		return -ENOMEM;
	for (unsigned b = 0; b < o->gbufs && !err; b++) {
		size_t n = 0;
		unsigned k = 0;
		uint64_t pos = 0;

		for (size_t i = o->nslots; i-- > 0;)
			if (o->ck->catalog.tensors[o->slots[i].tensor].dtype ==
			    o->gbuf_dtype[b])
				order[n++] = i;
		for (size_t at = 0; at < n && !err; at++) {
			const param_slot *want = &o->slots[order[at]];
			size_t pick = SIZE_MAX;
			const rs_tensor *bt;
			uint64_t start, here;

			if (k >= o->nbuckets[b]) {
				rs_diag_add(o->d, "%s: %s: grad buffer %u's %u buckets are full before this param; the recomputed bucket layout does not match the checkpoint",
					    o->meta_path,
					    o->ck->catalog.tensors[want->tensor].name,
					    b, o->nbuckets[b]);
				err = -EINVAL;
				break;
			}
			bt = bucket_tensor(o, 0, b, k, 0);
			start = pos ? align_up(pos) : 0;
			/* the layer being laid out: that of the first layer
			 * param left (they keep their descending order) */
			here = UINT64_MAX;
			for (size_t c = at; c < n && c - at < MAX_CANDIDATES; c++)
				if (o->split[o->slots[order[c]].tensor].layer_axes) {
					here = o->slots[order[c]].layer;
					break;
				}
			for (size_t c = at, tried = 0; c < n && !err; c++) {
				param_slot *p = &o->slots[order[c]];
				int m;

				if (c != at && o->split[p->tensor].layer_axes &&
				    p->layer != here)
					continue;
				/* a layer's params and the few outside layers:
				 * a real model tries tens; a hostile one may
				 * not make the mount quadratic */
				if (++tried > MAX_CANDIDATES)
					break;
				if (start + p->numel > bt->shape[0])
					continue;
				p->gbuf = b;
				p->bucket = k;
				p->start = start;
				p->end = start + p->numel;
				m = slot_matches(o, p, 0);
				if (m < 0)
					err = m;
				else if (m && c == at) {
					pick = c;
					break;
				} else if (m && pick != SIZE_MAX) {
					rs_diag_add(o->d, "%s: %s and %s both fit at element %llu of %s; the bucket layout is ambiguous",
						    o->meta_path,
						    o->ck->catalog.tensors[o->slots[order[pick]].tensor].name,
						    o->ck->catalog.tensors[p->tensor].name,
						    (unsigned long long)start, bt->name);
					err = -EINVAL;
				} else if (m) {
					pick = c;
				}
			}
			if (err)
				break;
			if (pick == SIZE_MAX) {
				rs_diag_add(o->d, "%s: no param fits at element %llu of %s (the key order gives %s, layer %llu): its fp32 main params match no stored weights there; the recomputed bucket layout does not match the checkpoint",
					    o->meta_path, (unsigned long long)start,
					    bt->name,
					    o->ck->catalog.tensors[want->tensor].name,
					    (unsigned long long)want->layer);
				err = -EINVAL;
				break;
			}
			/* the pick takes this place (its slot was set when it
			 * was tried); the others keep their order */
			{
				size_t chosen = order[pick];

				memmove(&order[at + 1], &order[at],
					(pick - at) * sizeof(*order));
				order[at] = chosen;
				pos = o->slots[chosen].end;
			}
			if (pos == bt->shape[0]) {
				k++;
				pos = 0;
			}
		}
		if (!err && (k != o->nbuckets[b] || pos != 0)) {
			rs_diag_add(o->d, "%s: grad buffer %u: its params fill %u of its %u buckets%s; the recomputed bucket layout does not match the checkpoint",
				    o->meta_path, b, k, o->nbuckets[b],
				    pos ? " and part of the next" : "");
			err = -EINVAL;
		}
	}
	free(order);
	return err;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* megatron-core saves each param piece and each gap between params as a
 * chunk of its own: a chunk across a param's edge means the layout is not
 * the one it saved. */
static int check_chunks(distopt *o)
{
	uint64_t *edges = NULL;
	size_t cap = 0;
	int err = 0;

	for (unsigned b = 0; b < o->gbufs && !err; b++)
		for (unsigned k = 0; k < o->nbuckets[b] && !err; k++) {
			size_t n = 0;

			for (size_t i = 0; i < o->nslots && !err; i++) {
				const param_slot *p = &o->slots[i];

				if (p->gbuf != b || p->bucket != k ||
				    o->ck->catalog.tensors[p->tensor].dtype != o->gbuf_dtype[b])
					continue;
				err = rs_array_reserve(&edges, &cap, n + 2,
						       sizeof(*edges));
				if (!err) {
					edges[n++] = p->start;
					edges[n++] = p->end;
				}
			}
			if (err)
				break;
			qsort(edges, n, sizeof(*edges), cmp_u64);
			for (unsigned g = 0; g < o->groups && !err; g++)
				for (unsigned s = 0; s < o->states && !err; s++) {
					const rs_tensor *t = bucket_tensor(o, g, b, k, s);

					for (size_t f = 0; f < t->nfrags; f++) {
						uint64_t a = t->frags[f].box.off[0];
						uint64_t e = a + t->frags[f].box.len[0];
						size_t lo = 0, hi = n;

						/* first edge > a */
						while (lo < hi) {
							size_t mid = (lo + hi) / 2;

							if (edges[mid] <= a)
								lo = mid + 1;
							else
								hi = mid;
						}
						if (lo < n && edges[lo] < e) {
							rs_diag_add(o->d, "%s: %s: chunk [%llu, %llu) crosses a param's edge at %llu; the recomputed bucket layout does not match the checkpoint",
								    o->meta_path, t->name,
								    (unsigned long long)a,
								    (unsigned long long)e,
								    (unsigned long long)edges[lo]);
							err = -EINVAL;
							break;
						}
					}
				}
		}
	free(edges);
	return err;
}

/* The fragments of param slot p's state s on TP rank g: its bucket range
 * through the bucket tensor's chunks, cut where the rank's sub-chunks
 * along the TP axis meet, each piece as boxes. */
static int slot_fragments(distopt *o, const param_slot *p, unsigned g,
			  unsigned s, rs_frag_list *fl)
{
	const rs_tensor *t = &o->ck->catalog.tensors[p->tensor];
	const tp_split *sp = &o->split[p->tensor];
	const rs_tensor *bt = bucket_tensor(o, g, p->gbuf, p->bucket, s);
	unsigned esize = rs_dtype_size(bt->dtype);
	uint64_t len[RS_MAX_DIMS], sub;
	int err;

	sub = sub_chunk_shape(t, sp, len);
	for (size_t f = first_frag_after(bt, p->start); f < bt->nfrags; f++) {
		const rs_fragment *bf = &bt->frags[f];
		uint64_t a = bf->box.off[0], e = a + bf->box.len[0];

		if (a >= p->end)
			break;
		if (a < p->start)
			a = p->start;
		if (e > p->end)
			e = p->end;
		/* local flat [a - start, e - start), in sub-chunks of `sub` */
		for (uint64_t u = a - p->start; u < e - p->start;) {
			uint64_t j = u / sub, stop = (j + 1) * sub;
			uint64_t base[RS_MAX_DIMS] = { 0 };
			rs_fragment first = *bf;

			if (stop > e - p->start)
				stop = e - p->start;
			if (sp->layer_axes)
				base[0] = p->layer;
			if (sp->axis >= 0)
				base[sp->axis] = (j * o->groups + g) * len[sp->axis];
			/* the fragment for sub-chunk j's element 0 (maybe
			 * outside this bucket chunk: only its offset is used,
			 * and only with indices inside it) */
			first.offset = bf->offset -
				       (bf->box.off[0] - p->start - j * sub) *
					       bf->stride[0] * esize;
			err = rs_frag_list_add_flat(fl, &first, esize, t->ndim,
						    base, len, u - j * sub,
						    stop - j * sub);
			if (err)
				return err;
			u = stop;
		}
	}
	return 0;
}

/* optimizer.state.<state>.<key> for every model tensor and state. */
static int build_states(distopt *o)
{
	rs_catalog *c = &o->ck->catalog;
	size_t nmodel = c->count;
	rs_frag_list fl = { 0 };
	char *name = NULL;
	int err = 0;

	for (unsigned s = 0; s < o->states && !err; s++)
		for (size_t i = 0; i < nmodel && !err; i++) {
			const rs_tensor *t = &c->tensors[i];
			const rs_tensor *bt = NULL;
			unsigned groups = o->split[i].axis >= 0 ? o->groups : 1;
			uint64_t tiled_a, tiled_b, shape[RS_MAX_DIMS];
			size_t index, fa = 0, fb = 0;
			rs_tensor *out;

			if (!is_model_tensor(t))
				continue;
			fl.n = 0;
			for (size_t n = 0; n < o->nslots && !err; n++) {
				if (o->slots[n].tensor != i)
					continue;
				bt = bucket_tensor(o, 0, o->slots[n].gbuf, 0, s);
				for (unsigned g = 0; g < groups && !err; g++)
					err = slot_fragments(o, &o->slots[n], g, s,
							     &fl);
			}
			if (err)
				break;
			if (!bt) {
				rs_diag_add(o->d, "%s: %s: no dp_reshardable grad buffer holds it (params of %s)",
					    o->meta_path, t->name,
					    rs_dtype_name(t->dtype));
				err = -EINVAL;
				break;
			}
			free(name);
			if (asprintf(&name, "optimizer.state.%s.%s",
				     o->state_names[s], t->name) < 0) {
				name = NULL;
				err = -ENOMEM;
				break;
			}
			for (size_t j = 0; j < c->count; j++)
				if (strcmp(c->tensors[j].name, name) == 0) {
					rs_diag_add(o->d, "%s: %s is stored and also in dp_reshardable buckets",
						    o->meta_path, name);
					err = -EINVAL;
				}
			if (err)
				break;
			/* the shape is copied: adding may move the array */
			memcpy(shape, t->shape, sizeof(shape));
			err = rs_catalog_add_fragments(c, name, bt->dtype, t->ndim,
						       shape, fl.n, &index);
			if (err)
				break;
			t = &c->tensors[i];     /* the array may have moved */
			out = &c->tensors[index];
			memcpy(out->frags, fl.v, fl.n * sizeof(*fl.v));
			err = rs_catalog_set_origin(c, index, o->meta_path);
			if (err)
				break;
			rs_tensor_make_regular(out);
			if (rs_tensor_check_tiling(out, &fa, &fb, &tiled_a,
						   &tiled_b) != 0) {
				rs_diag_add(o->d, "%s: %s: the recomputed bucket layout covers %llu of its %llu elements",
					    o->meta_path, name,
					    (unsigned long long)tiled_a,
					    (unsigned long long)tiled_b);
				err = -EINVAL;
			}
		}
	free(name);
	free(fl.v);
	return err;
}

/* The view's common.pt: the optimizer's param groups (and grad scaler)
 * from group 0's records, the form fully_reshardable. */
static int make_common(distopt *o)
{
	static const char group0[] = PREFIX "0.";
	rs_pickle *objs[RS_COMMON_MAX_ITEMS] = { 0 };
	const char *keys[RS_COMMON_MAX_ITEMS];
	size_t nobjs = 0, klen[RS_COMMON_MAX_ITEMS];
	char msg[RS_ZIP_MSG_SIZE];
	int err = 0;

	for (size_t i = 0; i < o->ck->nblobs && !err; i++) {
		const rs_blob *b = &o->ck->blobs[i];
		const char *k = b->fqn + strlen(group0), *slash;

		if (strncmp(b->fqn, group0, strlen(group0)) != 0 ||
		    !(slash = strchr(k, '/')) ||
		    strncmp(k, "per_bucket_numel", 16) == 0)
			continue;
		if (nobjs == RS_COMMON_MAX_ITEMS || !b->listed) {
			rs_diag_add(o->d, "%s: %s: not a dp_reshardable optimizer record",
				    o->meta_path, b->fqn);
			err = -EINVAL;
			break;
		}
		keys[nobjs] = k;
		klen[nobjs] = (size_t)(slash - k);
		err = rs_checkpoint_read_pickle(o->ck, b->source, b->offset,
						b->length, false, &objs[nobjs],
						msg, sizeof(msg));
		if (err)
			rs_diag_add(o->d, "%s: %s: %s", o->meta_path, b->fqn, msg);
		if (!err && (rs_pv_kind(rs_pickle_root(objs[nobjs])) != RS_PV_LIST ||
			     rs_pv_len(rs_pickle_root(objs[nobjs])) != 1)) {
			rs_diag_add(o->d, "%s: %s: not a one-item list",
				    o->meta_path, b->fqn);
			err = -EINVAL;
		}
		nobjs++;
	}
	if (!err) {
		rs_common_items items = { .n = nobjs, .keys = keys,
					  .klen = klen, .objs = objs };

		err = rs_torch_dist_make_common(o->ck, o->d, "dp_reshardable",
						&items);
	}
	for (size_t j = 0; j < nobjs; j++)
		rs_pickle_free(objs[j]);
	return err;
}

int rs_torch_dist_read_distopt(rs_checkpoint *ck, const char *meta_path,
			       rs_diag *d)
{
	distopt o = { .ck = ck, .d = d, .meta_path = meta_path };
	int err;

	for (int b = 0; b < MAX_GBUFS; b++)
		o.gbuf_dtype[b] = RS_DTYPE_INVALID;
	err = find_buckets(&o);
	if (err || !o.nrefs)
		goto out;
	o.param_state = -1;
	for (unsigned s = 0; s < o.states; s++)
		if (strcmp(o.state_names[s], "param") == 0)
			o.param_state = (int)s;
	if (o.param_state < 0) {
		rs_diag_add(d, "%s: the dp_reshardable buckets hold no 'param' state (the fp32 main params), which the bucket layout is checked by",
			    meta_path);
		err = -EINVAL;
		goto out;
	}
	for (size_t i = 0; i < o.nrefs; i++)
		if (o.refs[i].state == (unsigned)o.param_state &&
		    ck->catalog.tensors[o.refs[i].tensor].dtype != RS_DTYPE_F32) {
			rs_diag_add(d, "%s: %s: main params stored as %s, not float32 (a precision-aware optimizer); the bucket layout cannot be checked against the weights",
				    meta_path, ck->catalog.tensors[o.refs[i].tensor].name,
				    rs_dtype_name(ck->catalog.tensors[o.refs[i].tensor].dtype));
			err = -EINVAL;
			goto out;
		}
	err = module_order(&o);
	if (!err)
		err = place(&o);
	if (!err)
		err = check_chunks(&o);
	if (!err)
		err = check_values(&o);
	if (!err)
		err = build_states(&o);
	if (!err)
		err = make_common(&o);
	/* The bucket tensors and every group's records hold the source's
	 * DP layout, which no view keeps. */
	if (!err) {
		rs_catalog_drop_prefix(&ck->catalog, PREFIX);
		rs_checkpoint_drop_blobs(ck, PREFIX);
	}
out:
	free(o.refs);
	free(o.slots);
	free(o.split);
	return err;
}
