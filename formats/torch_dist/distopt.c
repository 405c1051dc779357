/* megatron-core's dp_reshardable distributed-optimizer state as model-space
 * tensors (docs/FORMATS.md, "Distributed optimizer").
 *
 * A dp_reshardable save holds, per model-parallel group g
 * (`dp_group_idx_<g>`: TP rank r of pipeline stage s is g = s * tp + r),
 * grad buffer and bucket, one 1-d tensor per optimizer state: the bucket's
 * elements up to its unpadded size, params and the alignment gaps between
 * them.  Each stage has buffers of its own, over its own params.  An MoE
 * model at ep > 1 has two chained optimizers, their records under
 * `chained_0.` (dense params) and `chained_1.` (expert params, whose
 * groups count the expert TP ranks, then the EP ranks, then the stages:
 * each group's buffers hold its local experts of its stage's layers); at
 * ep 1 its experts sit in the one optimizer's buffers with the rest.  A group of TP
 * ranks whose buffers hold the same params (a stage, or a stage's EP rank)
 * is a "unit" here.
 *
 * Where each param sits is not stored.  It is recomputed the way
 * megatron-core's param-and-grad buffer lays a bucket out: a unit's params
 * in reverse module order, each starting on a multiple of 64 elements, a
 * bucket closing where the unpadded size the checkpoint stores is reached.
 * The module order is first taken from the order of the model's keys in
 * `.metadata` (megatron-core writes its sharded state dict in module
 * order), layers stacked under `decoder.layers.` expanded layer by layer
 * (and expert by expert); a layer's unit follows from its number (stages
 * of equal layer counts) and an expert's from its index.  Params outside
 * the layers (embedding, final norm, output layer) are tried first on
 * the first or last stage, as their key sits before or after the layers;
 * with tied embeddings the last stage also holds the output layer's copy
 * of the embedding, saved under no key, which is placed and checked like
 * a param but whose state is the embedding's own.
 * Where keys were moved (a fully parallel save), the fp32 main params,
 * which the stored weights are rounded from, tell which param sits where.
 *
 * The layout is accepted only if it accounts for every bucket element
 * exactly, no stored chunk straddles a param's edge (megatron-core saves
 * every param piece and every gap as a chunk of its own) and every param's
 * main params round to its weights on every TP rank; else the mount is
 * refused with what did not fit.  Each param's range then becomes
 * fragments of `optimizer.state.<state>.<key>` (a flat range of a box is a
 * few boxes), the shape of the model tensor.  The bucket tensors and the
 * per-group records are dropped, and the view's common.pt says the state is
 * fully_reshardable, with each optimizer's param groups from its group 0's
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

#define RECORDS "optimizer.distributed.dp_group_idx_"
#define CHAINED "chained_"
#define MAX_CHAINED 8           /* chained_<i>. prefixes told apart */
#define MAX_STATES 8
#define MAX_GBUFS 8
#define MAX_LAYER 1000000u      /* per-layer keys: decoder.layers.<n>. */
#define PARAM_ALIGN 64          /* elements (docs/FORMATS.md) */
#define MAX_CANDIDATES 512      /* params tried for one place */
#define NO_LAYER UINT64_MAX

/* One bucket tensor, by its parsed name. */
typedef struct {
	unsigned group, gbuf, bucket, state;
	size_t tensor;
} bucket_ref;

/* A model param of one layer (and expert), in module order, and where it
 * sits. */
typedef struct {
	size_t tensor;
	uint64_t layer;         /* on the layer axis, when there is one */
	uint64_t at_layer;      /* the layer it belongs to, or NO_LAYER */
	uint64_t expert;        /* on the expert axis, when there is one */
	uint64_t numel;         /* of one TP rank's shard */
	bool before_layers;     /* outside the layers, keyed before them */
	bool placed;
	bool copy;              /* the last stage's copy of a tied embedding */
	unsigned unit;          /* whose buffers hold it */
	unsigned gbuf, bucket;
	uint64_t start, end;    /* in the bucket */
} param_slot;

/* What a model tensor's grid says of its TP shards. */
typedef struct {
	int layer_axes;         /* 0 or 1 */
	int expert_axis;        /* -1, or the axis after the layer axes */
	int axis;               /* TP axis, -1 when replicated */
	uint64_t multiplier;    /* chunks per rank along it */
} tp_split;

/* Whose params an optimizer's buffers hold: every param (the only
 * optimizer; at ep 1 megatron-core keeps experts with the others), or, of
 * two chained ones, the dense or the expert params. */
enum { ALL_PARAMS, DENSE_PARAMS, EXPERT_PARAMS };

/* One optimizer's records (of two chained ones, or the only one). */
typedef struct {
	rs_checkpoint *ck;
	rs_diag *d;
	const char *meta_path;
	char prefix[64];        /* [chained_<i>.]optimizer.distributed.dp_group_idx_ */
	int kind;               /* which params its buffers hold (ALL_PARAMS...) */
	unsigned groups, gbufs, states;
	unsigned tp, units;     /* groups = units * tp */
	unsigned pp, ep;        /* units = pp, or pp * ep for EXPERT_PARAMS */
	uint64_t layers, nexperts;
	char state_names[MAX_STATES][64];
	rs_dtype gbuf_dtype[MAX_GBUFS];
	unsigned *nbuckets;     /* [group * MAX_GBUFS + gbuf] */
	bucket_ref *refs;       /* sorted by (group, gbuf, bucket, state) */
	size_t nrefs, cap_refs;
	param_slot *slots;      /* module order */
	size_t nslots, cap_slots;
	tp_split *split;        /* per catalog tensor */
	int param_state;        /* index of the "param" state */
	/* group 0's records, for common.pt */
	rs_pickle *objs[RS_COMMON_MAX_ITEMS];
	const char *keys[RS_COMMON_MAX_ITEMS];
	size_t klen[RS_COMMON_MAX_ITEMS], nobjs;
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

/* After the prefix: G.gbuf_idx_B.dtype_(torch.P, torch.Q).bucket_idx_K.STATE */
static bool parse_name(const char *rest, unsigned *g, unsigned *b,
		       unsigned *k, char *pdtype, char *state)
{
	char grad[32];
	int end = -1;

	if (sscanf(rest, "%u.gbuf_idx_%u.dtype_(torch.%31[a-z0-9_], torch.%31[a-z0-9_]).bucket_idx_%u.%63s%n",
		   g, b, pdtype, grad, k, state, &end) != 6 || end < 0 ||
	    rest[end] != 0)
		return false;
	return is_word(state);
}

/* The chained optimizer index i of a name under chained_<i>.optimizer.,
 * else -1 (also for an index past MAX_CHAINED). */
static int chained_index(const char *name, size_t *skip)
{
	size_t n = strlen(CHAINED);
	unsigned i = 0;
	const char *p;

	if (strncmp(name, CHAINED, n) != 0)
		return -1;
	p = name + n;
	if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9'))
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		i = i * 10 + (unsigned)(*p - '0');
		if (i >= MAX_CHAINED)
			return -1;
	}
	if (strncmp(p, ".optimizer.", 11) != 0)
		return -1;
	if (skip)
		*skip = (size_t)(p + 1 - name);
	return (int)i;
}

static bool is_model_tensor(const rs_tensor *t)
{
	return strncmp(t->name, "optimizer.", 10) != 0 &&
	       chained_index(t->name, NULL) < 0;
}

/* Expert params (SequentialMLP's and TEGroupedMLP's weights under
 * `.experts.`; shared experts are `.shared_experts.`) sit in the expert
 * optimizer's buffers. */
static bool is_expert(const rs_tensor *t)
{
	return strstr(rs_rules_base_name(t->name), ".experts.") != NULL;
}

static bool in_instance(const distopt *o, const rs_tensor *t)
{
	return is_model_tensor(t) &&
	       (o->kind == ALL_PARAMS || is_expert(t) == (o->kind == EXPERT_PARAMS));
}

/* The layer of a per-layer key (decoder.layers.<n>.), else NO_LAYER. */
static uint64_t key_layer(const char *name)
{
	static const char layers[] = "decoder.layers.";
	const char *p = rs_rules_base_name(name);
	uint64_t n = 0;

	if (strncmp(p, layers, sizeof(layers) - 1) != 0)
		return NO_LAYER;
	p += sizeof(layers) - 1;
	if (*p < '0' || *p > '9')
		return NO_LAYER;
	for (; *p >= '0' && *p <= '9'; p++) {
		n = n * 10 + (uint64_t)(*p - '0');
		if (n >= MAX_LAYER)
			return NO_LAYER;
	}
	return *p == '.' ? n : NO_LAYER;
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

static unsigned *nbuckets(const distopt *o, unsigned g, unsigned b)
{
	return &o->nbuckets[(size_t)g * MAX_GBUFS + b];
}

/* Every group has every bucket of its buffers in every state, of one
 * size per bucket.  Walked in ref order, each step finds a ref or stops
 * at the missing one: at most nrefs + 1 steps. */
static int check_complete(distopt *o)
{
	size_t seen = 0;

	for (unsigned g = 0; g < o->groups; g++) {
		unsigned any = 0;

		for (unsigned b = 0; b < o->gbufs; b++) {
			any += *nbuckets(o, g, b);
			for (unsigned k = 0; k < *nbuckets(o, g, b); k++)
				for (unsigned s = 0; s < o->states; s++) {
					const rs_tensor *t = bucket_tensor(o, g, b, k, s);
					const rs_tensor *t0 = bucket_tensor(o, g, b, k, 0);

					if (!t || !t0 || ++seen > o->nrefs) {
						rs_diag_add(o->d, "%s: %s: dp_reshardable state %s of bucket %u of grad buffer %u of group %u is missing",
							    o->meta_path, o->prefix,
							    o->state_names[s], k, b, g);
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
		}
		if (!any) {
			rs_diag_add(o->d, "%s: %s: dp_reshardable group %u holds no buckets",
				    o->meta_path, o->prefix, g);
			return -EINVAL;
		}
	}
	return 0;
}

/* Finds this optimizer's bucket tensors (none: o->nrefs 0) and checks
 * that they are complete. */
static int find_buckets(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	size_t plen = strlen(o->prefix);
	char pdtype[32], state[64];
	unsigned g, b, k;
	int err;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		rs_dtype pd;
		int s;

		if (strncmp(t->name, o->prefix, plen) != 0)
			continue;
		if (!parse_name(t->name + plen, &g, &b, &k, pdtype, state) ||
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
	}
	if (!o->nrefs)
		return 0;
	/* every group has a bucket tensor: a larger index leaves one out */
	if (o->groups > o->nrefs) {
		rs_diag_add(o->d, "%s: %s%u: a dp_reshardable group index past the %zu bucket tensors; groups are missing",
			    o->meta_path, o->prefix, o->groups - 1, o->nrefs);
		return -EINVAL;
	}
	o->nbuckets = calloc((size_t)o->groups * MAX_GBUFS, sizeof(*o->nbuckets));
	if (!o->nbuckets)
		return -ENOMEM;
	for (size_t i = 0; i < o->nrefs; i++) {
		const bucket_ref *r = &o->refs[i];
		unsigned *n = nbuckets(o, r->group, r->gbuf);

		if (r->bucket >= *n)
			*n = r->bucket + 1;
	}
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
	return check_complete(o);
}

/* The TP ranks of a unit hold buffers of the same params: the same
 * buckets, of the same sizes. */
static int check_units(distopt *o)
{
	for (unsigned g = 0; g < o->groups; g++) {
		unsigned g0 = g / o->tp * o->tp;

		for (unsigned b = 0; b < o->gbufs; b++) {
			if (*nbuckets(o, g, b) != *nbuckets(o, g0, b)) {
				rs_diag_add(o->d, "%s: %s: grad buffer %u has %u buckets in group %u but %u in group %u, TP ranks of one %s",
					    o->meta_path, o->prefix, b,
					    *nbuckets(o, g, b), g, *nbuckets(o, g0, b),
					    g0, o->kind == EXPERT_PARAMS ? "expert group" : "stage");
				return -EINVAL;
			}
			for (unsigned k = 0; k < *nbuckets(o, g, b); k++) {
				const rs_tensor *t = bucket_tensor(o, g, b, k, 0);
				const rs_tensor *t0 = bucket_tensor(o, g0, b, k, 0);

				if (t->shape[0] != t0->shape[0]) {
					rs_diag_add(o->d, "%s: %s: %llu elements, but %s (a TP rank of the same %s) has %llu",
						    o->meta_path, t->name,
						    (unsigned long long)t->shape[0],
						    t0->name,
						    o->kind == EXPERT_PARAMS ? "expert group" : "stage",
						    (unsigned long long)t0->shape[0]);
					return -EINVAL;
				}
			}
		}
	}
	return 0;
}

/* The TP split of model tensor t from its grid: the one axis past the
 * layer and expert axes cut into several chunks, a multiple of the TP
 * size. */
static int split_of(distopt *o, const rs_tensor *t, tp_split *sp)
{
	int la = rs_rules_layer_axes(t->name);
	int first;

	sp->layer_axes = la;
	sp->expert_axis = is_expert(t) ? la : -1;
	sp->axis = -1;
	sp->multiplier = 1;
	first = la + (is_expert(t) ? 1 : 0);
	if (la > 1 || first > t->ndim || !t->regular) {
		rs_diag_add(o->d, "%s: %s: %s; dp_reshardable optimizer state is read only for models whose tensors are stored on a regular grid with at most one layer axis",
			    o->meta_path, t->name,
			    !t->regular ? "stored off a regular grid"
			    : la > 1 ? "more than one layer axis"
				     : "no expert axis");
		return -EINVAL;
	}
	for (int i = first; i < t->ndim; i++) {
		if (t->grid_count[i] <= 1)
			continue;
		if (sp->axis >= 0 || t->grid_count[i] % o->tp != 0) {
			rs_diag_add(o->d, "%s: %s: its grid (axis %d in %llu chunks) is not a TP split over %u ranks",
				    o->meta_path, t->name, i,
				    (unsigned long long)t->grid_count[i], o->tp);
			return -EINVAL;
		}
		sp->axis = i;
		sp->multiplier = t->grid_count[i] / o->tp;
	}
	if (la && t->grid[0] != 1) {
		rs_diag_add(o->d, "%s: %s: its layers are not stored one by one",
			    o->meta_path, t->name);
		return -EINVAL;
	}
	if (sp->expert_axis >= 0 && t->grid[sp->expert_axis] != 1) {
		rs_diag_add(o->d, "%s: %s: its experts (axis %d) are not stored one by one",
			    o->meta_path, t->name, sp->expert_axis);
		return -EINVAL;
	}
	if (sp->multiplier > 1 && sp->axis != first) {
		rs_diag_add(o->d, "%s: %s: %llu chunks per TP rank along axis %d; only the first axis may hold several",
			    o->meta_path, t->name,
			    (unsigned long long)sp->multiplier, sp->axis);
		return -EINVAL;
	}
	return 0;
}

/* The TP size of this optimizer's params: the fewest chunks any of its
 * tensors is cut into along an axis past the layer (and expert) axes, or
 * 1.  The groups are then units of that many TP ranks. */
static int find_units(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	uint64_t tp = 0;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		int first = rs_rules_layer_axes(t->name) + (is_expert(t) ? 1 : 0);

		if (!in_instance(o, t) || !t->regular)
			continue;
		for (int a = first; a < t->ndim; a++)
			if (t->grid_count[a] > 1 && (!tp || t->grid_count[a] < tp))
				tp = t->grid_count[a];
	}
	if (!tp)
		tp = 1;
	if (tp > o->groups || o->groups % tp != 0) {
		rs_diag_add(o->d, "%s: %s: %u dp_reshardable groups, not a multiple of the TP size %llu its %s params are stored at",
			    o->meta_path, o->prefix, o->groups,
			    (unsigned long long)tp,
			    o->kind == EXPERT_PARAMS ? "expert" : "model");
		return -EINVAL;
	}
	o->tp = (unsigned)tp;
	o->units = o->groups / o->tp;
	return check_units(o);
}

static int add_slot(distopt *o, size_t tensor, uint64_t layer,
		    uint64_t at_layer, uint64_t expert, bool before)
{
	const rs_tensor *t = &o->ck->catalog.tensors[tensor];
	const tp_split *sp = &o->split[tensor];
	uint64_t numel = 1;
	int err;

	for (int i = sp->layer_axes; i < t->ndim; i++)
		if (i != sp->expert_axis)
			numel *= t->shape[i];   /* a checked tensor: no overflow */
	if (sp->axis >= 0)
		numel /= o->tp;
	if (!numel)
		return 0;
	err = rs_array_reserve(&o->slots, &o->cap_slots, o->nslots + 1,
			       sizeof(*o->slots));
	if (err)
		return err;
	o->slots[o->nslots++] = (param_slot){ .tensor = tensor, .layer = layer,
					      .at_layer = at_layer,
					      .expert = expert, .numel = numel,
					      .before_layers = before };
	return 0;
}

/* A per-layer key: its layer and catalog index. */
typedef struct {
	uint64_t layer;
	size_t tensor;
} layer_key;

/* By layer, then catalog order. */
static int cmp_layer_key(const void *a, const void *b)
{
	const layer_key *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

/* The embedding, when it has no output layer beside it: tied weights,
 * which with pipeline stages megatron-core keeps on the last stage too,
 * as the output layer's param in that stage's buffers, saved under no key
 * of its own (its state is the embedding's: both get the same gradients).
 * SIZE_MAX when untied or not in this optimizer. */
static size_t tied_embedding(const distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	size_t emb = SIZE_MAX;
	bool out = false;

	for (size_t i = 0; i < c->count; i++) {
		const char *b = rs_rules_base_name(c->tensors[i].name);

		if (!in_instance(o, &c->tensors[i]))
			continue;
		if (strcmp(b, "embedding.word_embeddings.weight") == 0)
			emb = i;
		out |= strcmp(b, "output_layer.weight") == 0;
	}
	return out ? SIZE_MAX : emb;
}

/* The layer count, the expert count and the units' split of them:
 * stages of equal layer counts (megatron-core's default split; others
 * fail the layout checks), EP ranks of equal expert counts. */
static int find_layers(distopt *o, const size_t *stacked, size_t nst,
		       const layer_key *per, size_t nper)
{
	const rs_catalog *c = &o->ck->catalog;

	for (size_t n = 0; n < nst; n++) {
		const rs_tensor *t = &c->tensors[stacked[n]];

		if (n && t->shape[0] != o->layers) {
			rs_diag_add(o->d, "%s: %s: %llu layers, but %s has %llu",
				    o->meta_path, t->name,
				    (unsigned long long)t->shape[0],
				    c->tensors[stacked[0]].name,
				    (unsigned long long)o->layers);
			return -EINVAL;
		}
		o->layers = t->shape[0];
	}
	if (nper) {
		uint64_t last = per[nper - 1].layer;

		if (nst && last >= o->layers) {
			/* stacked slots would then point past their tensor */
			rs_diag_add(o->d, "%s: %s: layer %llu, past the %llu layers of %s",
				    o->meta_path, c->tensors[per[nper - 1].tensor].name,
				    (unsigned long long)last,
				    (unsigned long long)o->layers,
				    c->tensors[stacked[0]].name);
			return -EINVAL;
		}
		if (last >= o->layers)
			o->layers = last + 1;
	}
	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		uint64_t e;

		if (!in_instance(o, t) || !is_expert(t))
			continue;
		e = t->shape[o->split[i].expert_axis];
		if (o->nexperts && e != o->nexperts) {
			rs_diag_add(o->d, "%s: %s: %llu experts, but other expert params have %llu",
				    o->meta_path, t->name, (unsigned long long)e,
				    (unsigned long long)o->nexperts);
			return -EINVAL;
		}
		o->nexperts = e;
	}
	if (o->kind != EXPERT_PARAMS)
		o->pp = o->units;
	if (o->units % o->pp != 0) {
		rs_diag_add(o->d, "%s: %s: %u expert groups of TP ranks, not a multiple of the %u pipeline stages of the dense params",
			    o->meta_path, o->prefix, o->units, o->pp);
		return -EINVAL;
	}
	o->ep = o->units / o->pp;
	if (o->pp > 1 && (!o->layers || o->layers % o->pp != 0)) {
		rs_diag_add(o->d, "%s: %s: %u pipeline stages, but the %llu layers do not split evenly over them (uneven stages are not read)",
			    o->meta_path, o->prefix, o->pp,
			    (unsigned long long)o->layers);
		return -EINVAL;
	}
	if (o->kind == EXPERT_PARAMS &&
	    (!o->nexperts || o->nexperts % o->ep != 0)) {
		rs_diag_add(o->d, "%s: %s: %u EP ranks, but the %llu experts do not split evenly over them",
			    o->meta_path, o->prefix, o->ep,
			    (unsigned long long)o->nexperts);
		return -EINVAL;
	}
	return 0;
}

static unsigned unit_of(const distopt *o, const param_slot *p)
{
	unsigned stage = (unsigned)(p->at_layer / (o->layers / o->pp));

	if (o->kind != EXPERT_PARAMS)
		return stage;
	return stage * o->ep + (unsigned)(p->expert / (o->nexperts / o->ep));
}

/* Layer l's params of tensors list[0..n) (on layer axis coordinate
 * `layer`) in key order, where the first expert tensor stands for every
 * expert's params, expert by expert (each in key order): a MoE layer's
 * experts are modules of their own, in expert order. */
static int add_layer(distopt *o, const size_t *list, size_t n,
		     uint64_t layer, uint64_t l)
{
	const rs_catalog *c = &o->ck->catalog;
	bool experts_done = false;
	int err = 0;

	for (size_t i = 0; i < n && !err; i++) {
		if (!is_expert(&c->tensors[list[i]])) {
			err = add_slot(o, list[i], layer, l, 0, false);
			continue;
		}
		if (experts_done)
			continue;
		experts_done = true;
		for (uint64_t e = 0; e < o->nexperts && !err; e++)
			for (size_t j = i; j < n && !err; j++)
				if (is_expert(&c->tensors[list[j]]))
					err = add_slot(o, list[j], layer, l, e,
						       false);
	}
	return err;
}

/* The params in the order megatron-core's sharded state dict lists them,
 * as far as .metadata keeps it: the keys before the first layer key, then
 * every layer's keys (stacked ones at that layer; for the expert
 * optimizer, expert by expert), then the rest.  A save that spreads its
 * writes over ranks (Megatron-LM's --ckpt-fully-parallel-save) reorders
 * keys; place() repairs that. */
static int module_order(distopt *o)
{
	const rs_catalog *c = &o->ck->catalog;
	size_t first = SIZE_MAX, nst = 0, nper = 0, *stacked = NULL, *list = NULL;
	layer_key *per = NULL;
	size_t tied;
	int err;

	o->split = calloc(c->count ? c->count : 1, sizeof(*o->split));
	stacked = malloc((c->count ? c->count : 1) * sizeof(*stacked));
	per = malloc((c->count ? c->count : 1) * sizeof(*per));
	list = malloc((c->count ? c->count : 1) * sizeof(*list));
	if (!o->split || !stacked || !per || !list) {
		err = -ENOMEM;
		goto out;
	}
	err = find_units(o);
	for (size_t i = 0; i < c->count && !err; i++) {
		const rs_tensor *t = &c->tensors[i];

		if (!in_instance(o, t))
			continue;
		err = split_of(o, t, &o->split[i]);
		if (err)
			break;
		if (o->split[i].layer_axes)
			stacked[nst++] = i;
		else if (key_layer(t->name) != NO_LAYER)
			per[nper++] = (layer_key){ key_layer(t->name), i };
		else
			continue;
		if (first == SIZE_MAX)
			first = i;
	}
	if (err)
		goto out;
	qsort(per, nper, sizeof(*per), cmp_layer_key);
	err = find_layers(o, stacked, nst, per, nper);
	if (err)
		goto out;
	for (size_t i = 0; i < c->count && i < first && !err; i++)
		if (in_instance(o, &c->tensors[i]))
			err = add_slot(o, i, 0, NO_LAYER, 0, true);
	for (uint64_t l = 0, at = 0; l < o->layers && !err; l++) {
		size_t n = 0;

		for (; at < nper && per[at].layer == l; at++)
			list[n++] = per[at].tensor;
		err = add_layer(o, stacked, nst, l, l);
		if (!err)
			err = add_layer(o, list, n, 0, l);
	}
	for (size_t i = first; first != SIZE_MAX && i < c->count && !err; i++)
		if (in_instance(o, &c->tensors[i]) &&
		    !o->split[i].layer_axes &&
		    key_layer(c->tensors[i].name) == NO_LAYER)
			err = add_slot(o, i, 0, NO_LAYER, 0, false);
	/* the output layer's copy of a tied embedding, last in the module
	 * order of the last stage */
	if (!err && o->kind != EXPERT_PARAMS && o->pp > 1 &&
	    (tied = tied_embedding(o)) != SIZE_MAX) {
		err = add_slot(o, tied, 0, NO_LAYER, 0, false);
		if (!err)
			o->slots[o->nslots - 1].copy = true;
	}
	for (size_t n = 0; n < o->nslots && !err; n++)
		if (o->slots[n].at_layer != NO_LAYER)
			o->slots[n].unit = unit_of(o, &o->slots[n]);
out:
	free(stacked);
	free(per);
	free(list);
	return err;
}

/* The shape of one stored chunk of a TP rank's shard of t, one layer and
 * expert of it (a rank's shard is `multiplier` of them along the TP axis);
 * returns its element count. */
static uint64_t sub_chunk_shape(const rs_tensor *t, const tp_split *sp,
				uint64_t *len)
{
	uint64_t n = 1;

	for (int i = 0; i < t->ndim; i++)
		len[i] = t->shape[i];
	if (sp->layer_axes)
		len[0] = 1;
	if (sp->expert_axis >= 0)
		len[sp->expert_axis] = 1;
	if (sp->axis >= 0)
		len[sp->axis] = t->grid[sp->axis];
	for (int i = 0; i < t->ndim; i++)
		n *= len[i];
	return n;
}

/* Where sub-chunk j of slot p's shard on TP rank r starts in its tensor. */
static void sub_chunk_base(const distopt *o, const param_slot *p,
			   const tp_split *sp, const uint64_t *len,
			   uint64_t j, unsigned r, uint64_t *base)
{
	for (int i = 0; i < RS_MAX_DIMS; i++)
		base[i] = 0;
	if (sp->layer_axes)
		base[0] = p->layer;
	if (sp->expert_axis >= 0)
		base[sp->expert_axis] = p->expert;
	if (sp->axis >= 0)
		base[sp->axis] = (j * o->tp + r) * len[sp->axis];
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

/* Whether slot p's fp32 main params on TP rank r of its unit, where p is
 * placed, round to its stored weights: megatron-core copies them into the
 * model after every step, so a param put in another's place shows.  1 or
 * 0; a negative errno (reported) when an element cannot be read. */
static int slot_matches(distopt *o, const param_slot *p, unsigned r)
{
	const rs_tensor *t = &o->ck->catalog.tensors[p->tensor];
	const tp_split *sp = &o->split[p->tensor];
	const rs_tensor *bt = bucket_tensor(o, p->unit * o->tp + r, p->gbuf,
					    p->bucket, (unsigned)o->param_state);
	uint64_t len[RS_MAX_DIMS], sub;

	if (!bt)
		return 0;
	sub = sub_chunk_shape(t, sp, len);
	for (uint64_t q = 0; q <= CHECK_HEAD; q++) {
		uint64_t u = q < CHECK_HEAD ? q : p->numel - 1;
		uint64_t v = u % sub, x = p->start + u, at[RS_MAX_DIMS];
		uint64_t base[RS_MAX_DIMS];
		uint8_t main_bytes[4], model[8] = { 0 }, want[8] = { 0 };
		uint32_t bits;
		int err;

		if (u >= p->numel)
			continue;
		sub_chunk_base(o, p, sp, len, u / sub, r, base);
		for (int i = t->ndim; i-- > 0;) {
			at[i] = base[i] + v % len[i];
			v /= len[i];
		}
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

/* Every placed slot on every other TP rank of its unit too. */
static int check_values(distopt *o)
{
	for (size_t n = 0; n < o->nslots; n++)
		for (unsigned r = 1; r < o->tp; r++) {
			const param_slot *p = &o->slots[n];
			int m = slot_matches(o, p, r);

			if (m < 0)
				return m;
			if (!m) {
				rs_diag_add(o->d, "%s: %s (layer %llu, TP rank %u of group %u): its fp32 main params at element %llu of bucket %u do not round to its stored weights; the recomputed bucket layout does not match the checkpoint",
					    o->meta_path,
					    o->ck->catalog.tensors[p->tensor].name,
					    (unsigned long long)p->layer, r,
					    p->unit * o->tp + r,
					    (unsigned long long)p->start, p->bucket);
				return -EINVAL;
			}
		}
	return 0;
}

static const char *unit_word(const distopt *o)
{
	return o->kind == EXPERT_PARAMS ? "expert group" : "stage";
}

/* Lays grad buffer b of unit u out.  order[0..n) holds the slots it is
 * expected to hold in reverse module order: its layers' params and the
 * params outside the layers whose key sits on its side of them, then
 * (with several units) the other params outside the layers not yet
 * placed, which it may hold instead.  Each param starts on a multiple of
 * PARAM_ALIGN elements, and a bucket closes where its stored size is
 * reached.  At each place the expected param is tried first; if its main
 * params do not round to its weights there (slot_matches), every other
 * param left of the layer being laid out (or outside the layers) is
 * tried, and exactly one must fit. */
static int place_buffer(distopt *o, unsigned u, unsigned b, size_t *order,
			size_t n)
{
	unsigned nb = *nbuckets(o, u * o->tp, b), k = 0;
	uint64_t pos = 0;
	size_t at;
	int err = 0;

	for (at = 0; at < n && k < nb && !err; at++) {
		const param_slot *want = &o->slots[order[at]];
		const rs_tensor *bt = bucket_tensor(o, u * o->tp, b, k, 0);
		uint64_t start = pos ? align_up(pos) : 0, here = NO_LAYER;
		size_t pick = SIZE_MAX;

		/* the layer being laid out: that of the first layer param
		 * left (they keep their descending order) */
		for (size_t c = at; c < n && c - at < MAX_CANDIDATES; c++)
			if (o->slots[order[c]].at_layer != NO_LAYER) {
				here = o->slots[order[c]].at_layer;
				break;
			}
		for (size_t c = at, tried = 0; c < n && !err; c++) {
			param_slot *p = &o->slots[order[c]];
			int m;

			if (c != at && p->at_layer != NO_LAYER &&
			    p->at_layer != here)
				continue;
			/* a layer's params and the few outside layers: a real
			 * model tries tens; a hostile one may not make the
			 * mount quadratic */
			if (++tried > MAX_CANDIDATES)
				break;
			if (start + p->numel > bt->shape[0])
				continue;
			p->unit = u;
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
			rs_diag_add(o->d, "%s: no param fits at element %llu of %s (the key order gives %s, layer %lld): its fp32 main params match no stored weights there; the recomputed bucket layout does not match the checkpoint",
				    o->meta_path, (unsigned long long)start,
				    bt->name,
				    o->ck->catalog.tensors[want->tensor].name,
				    want->at_layer == NO_LAYER ? -1LL
							       : (long long)want->at_layer);
			return -EINVAL;
		}
		/* the pick takes this place (its slot was set when it was
		 * tried, last); the others keep their order */
		{
			size_t chosen = order[pick];
			param_slot *p = &o->slots[chosen];

			memmove(&order[at + 1], &order[at],
				(pick - at) * sizeof(*order));
			order[at] = chosen;
			p->unit = u;
			p->gbuf = b;
			p->bucket = k;
			p->start = start;
			p->end = start + p->numel;
			p->placed = true;
			pos = p->end;
		}
		if (pos == bt->shape[0]) {
			k++;
			pos = 0;
		}
	}
	if (err)
		return err;
	if (k != nb || pos != 0) {
		rs_diag_add(o->d, "%s: %s%u: grad buffer %u: its params fill %u of its %u buckets%s; the recomputed bucket layout does not match the checkpoint",
			    o->meta_path, o->prefix, u * o->tp, b, k, nb,
			    pos ? " and part of the next" : "");
		return -EINVAL;
	}
	for (; at < n; at++) {
		const param_slot *p = &o->slots[order[at]];

		if (p->at_layer != NO_LAYER) {
			rs_diag_add(o->d, "%s: %s (layer %llu): %s%u's grad buffer %u is full before it; the recomputed bucket layout does not match the checkpoint",
				    o->meta_path,
				    o->ck->catalog.tensors[p->tensor].name,
				    (unsigned long long)p->at_layer, o->prefix,
				    u * o->tp, b);
			return -EINVAL;
		}
	}
	return 0;
}

/* Every unit's buffers laid out; every param must then sit in exactly
 * one unit's buffers. */
static int place(distopt *o)
{
	size_t *order = malloc((o->nslots ? o->nslots : 1) * sizeof(*order));
	int err = 0;

	if (!order)
		return -ENOMEM;
	for (unsigned u = 0; u < o->units && !err; u++)
		for (unsigned b = 0; b < o->gbufs && !err; b++) {
			size_t n = 0;

			if (!*nbuckets(o, u * o->tp, b))
				continue;
			for (size_t i = o->nslots; i-- > 0;) {
				const param_slot *p = &o->slots[i];

				if (o->ck->catalog.tensors[p->tensor].dtype !=
				    o->gbuf_dtype[b] || p->placed)
					continue;
				if (p->at_layer != NO_LAYER ? p->unit == u
				    : p->before_layers ? u == 0
						       : u == o->units - 1)
					order[n++] = i;
			}
			for (size_t i = o->nslots; o->units > 1 && i-- > 0;) {
				const param_slot *p = &o->slots[i];

				if (o->ck->catalog.tensors[p->tensor].dtype ==
				    o->gbuf_dtype[b] && !p->placed &&
				    p->at_layer == NO_LAYER &&
				    !(p->before_layers ? u == 0 : u == o->units - 1))
					order[n++] = i;
			}
			err = place_buffer(o, u, b, order, n);
		}
	free(order);
	for (size_t i = 0; i < o->nslots && !err; i++) {
		const param_slot *p = &o->slots[i];

		if (!p->copy || !p->placed)
			continue;
		for (size_t j = 0; j < o->nslots && !err; j++)
			if (j != i && o->slots[j].tensor == p->tensor &&
			    o->slots[j].unit == p->unit) {
				rs_diag_add(o->d, "%s: %s: the tied embedding and its output layer copy both fit stage %u's buffers; the bucket layout is ambiguous",
					    o->meta_path,
					    o->ck->catalog.tensors[p->tensor].name,
					    p->unit);
				err = -EINVAL;
			}
	}
	for (size_t i = 0; i < o->nslots && !err; i++)
		if (!o->slots[i].placed) {
			rs_diag_add(o->d, "%s: %s (layer %lld): in no %s's dp_reshardable grad buffer (of %s)",
				    o->meta_path,
				    o->ck->catalog.tensors[o->slots[i].tensor].name,
				    o->slots[i].at_layer == NO_LAYER ? -1LL
					: (long long)o->slots[i].at_layer,
				    unit_word(o),
				    rs_dtype_name(o->ck->catalog.tensors[o->slots[i].tensor].dtype));
			err = -EINVAL;
		}
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

	for (unsigned u = 0; u < o->units && !err; u++)
		for (unsigned b = 0; b < o->gbufs && !err; b++)
			for (unsigned k = 0; k < *nbuckets(o, u * o->tp, b) && !err; k++) {
				size_t n = 0;

				for (size_t i = 0; i < o->nslots && !err; i++) {
					const param_slot *p = &o->slots[i];

					if (p->unit != u || p->gbuf != b ||
					    p->bucket != k)
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
				for (unsigned r = 0; r < o->tp && !err; r++)
					for (unsigned s = 0; s < o->states && !err; s++) {
						const rs_tensor *t = bucket_tensor(o, u * o->tp + r, b, k, s);

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

/* The fragments of param slot p's state s on TP rank r: its bucket range
 * through the bucket tensor's chunks, cut where the rank's sub-chunks
 * along the TP axis meet, each piece as boxes. */
static int slot_fragments(distopt *o, const param_slot *p, unsigned r,
			  unsigned s, rs_frag_list *fl)
{
	const rs_tensor *t = &o->ck->catalog.tensors[p->tensor];
	const tp_split *sp = &o->split[p->tensor];
	const rs_tensor *bt = bucket_tensor(o, p->unit * o->tp + r, p->gbuf,
					    p->bucket, s);
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
			uint64_t base[RS_MAX_DIMS];
			rs_fragment first = *bf;

			if (stop > e - p->start)
				stop = e - p->start;
			sub_chunk_base(o, p, sp, len, j, r, base);
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

/* optimizer.state.<state>.<key> for every param of this optimizer and
 * every state. */
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
			unsigned ranks = o->split[i].axis >= 0 ? o->tp : 1;
			uint64_t tiled_a, tiled_b, shape[RS_MAX_DIMS];
			size_t index, fa = 0, fb = 0;
			rs_tensor *out;

			if (!in_instance(o, t))
				continue;
			fl.n = 0;
			for (size_t n = 0; n < o->nslots && !err; n++) {
				const param_slot *p = &o->slots[n];

				if (p->tensor != i || p->copy)
					continue;
				bt = bucket_tensor(o, p->unit * o->tp, p->gbuf, 0, s);
				for (unsigned r = 0; r < ranks && !err; r++)
					err = slot_fragments(o, p, r, s, &fl);
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

/* Group 0's records (the optimizer's param groups, the grad scaler; not
 * per_bucket_numel*, which hold the source's DP layout) for the view's
 * common.pt. */
static int collect_records(distopt *o)
{
	char group0[sizeof(o->prefix) + 2];
	char msg[RS_ZIP_MSG_SIZE];
	int err = 0;

	snprintf(group0, sizeof(group0), "%s0.", o->prefix);
	for (size_t i = 0; i < o->ck->nblobs && !err; i++) {
		const rs_blob *b = &o->ck->blobs[i];
		const char *k = b->fqn + strlen(group0), *slash;

		if (strncmp(b->fqn, group0, strlen(group0)) != 0 ||
		    !(slash = strchr(k, '/')) ||
		    strncmp(k, "per_bucket_numel", 16) == 0)
			continue;
		if (o->nobjs == RS_COMMON_MAX_ITEMS || !b->listed) {
			rs_diag_add(o->d, "%s: %s: not a dp_reshardable optimizer record",
				    o->meta_path, b->fqn);
			return -EINVAL;
		}
		o->keys[o->nobjs] = k;
		o->klen[o->nobjs] = (size_t)(slash - k);
		err = rs_checkpoint_read_pickle(o->ck, b->source, b->offset,
						b->length, false,
						&o->objs[o->nobjs], msg,
						sizeof(msg));
		if (err) {
			rs_diag_add(o->d, "%s: %s: %s", o->meta_path, b->fqn, msg);
			break;
		}
		if (rs_pv_kind(rs_pickle_root(o->objs[o->nobjs])) != RS_PV_LIST ||
		    rs_pv_len(rs_pickle_root(o->objs[o->nobjs])) != 1) {
			rs_diag_add(o->d, "%s: %s: not a one-item list",
				    o->meta_path, b->fqn);
			err = -EINVAL;
		}
		o->nobjs++;
	}
	return err;
}

/* One optimizer's buckets as optimizer.state tensors. */
static int read_one(distopt *o)
{
	int err;

	for (int b = 0; b < MAX_GBUFS; b++)
		o->gbuf_dtype[b] = RS_DTYPE_INVALID;
	o->param_state = -1;
	err = find_buckets(o);
	if (err)
		return err;
	if (!o->nrefs) {
		rs_diag_add(o->d, "%s: %s: no dp_reshardable bucket tensors",
			    o->meta_path, o->prefix);
		return -EINVAL;
	}
	for (unsigned s = 0; s < o->states; s++)
		if (strcmp(o->state_names[s], "param") == 0)
			o->param_state = (int)s;
	if (o->param_state < 0) {
		rs_diag_add(o->d, "%s: the dp_reshardable buckets hold no 'param' state (the fp32 main params), which the bucket layout is checked by",
			    o->meta_path);
		return -EINVAL;
	}
	for (size_t i = 0; i < o->nrefs; i++) {
		const rs_tensor *t = &o->ck->catalog.tensors[o->refs[i].tensor];

		if (o->refs[i].state == (unsigned)o->param_state &&
		    t->dtype != RS_DTYPE_F32) {
			rs_diag_add(o->d, "%s: %s: main params stored as %s, not float32 (a precision-aware optimizer); the bucket layout cannot be checked against the weights",
				    o->meta_path, t->name, rs_dtype_name(t->dtype));
			return -EINVAL;
		}
	}
	err = module_order(o);
	if (!err)
		err = place(o);
	if (!err)
		err = check_chunks(o);
	if (!err)
		err = check_values(o);
	if (!err)
		err = build_states(o);
	if (!err)
		err = collect_records(o);
	return err;
}

static void free_one(distopt *o)
{
	free(o->nbuckets);
	free(o->refs);
	free(o->slots);
	free(o->split);
	for (size_t j = 0; j < o->nobjs; j++)
		rs_pickle_free(o->objs[j]);
}

/* Which optimizers' buckets .metadata holds: the one optimizer's
 * (RECORDS...) and chained optimizer i's (chained_<i>.RECORDS...), as a
 * bit mask of i.  Only bucket tensors count: the dp_zero_gather_scatter
 * form keeps byte items under the same names. */
static void find_optimizers(const rs_checkpoint *ck, bool *plain,
			    unsigned *chained, bool *experts)
{
	const rs_catalog *c = &ck->catalog;

	*plain = false;
	*chained = 0;
	*experts = false;
	for (size_t i = 0; i < c->count; i++) {
		const char *name = c->tensors[i].name;
		size_t skip;
		int k;

		if (strncmp(name, RECORDS, strlen(RECORDS)) == 0)
			*plain = true;
		else if ((k = chained_index(name, &skip)) >= 0 &&
			 strncmp(name + skip, RECORDS, strlen(RECORDS)) == 0)
			*chained |= 1u << k;
		else if (is_model_tensor(&c->tensors[i]) &&
			 is_expert(&c->tensors[i]))
			*experts = true;
	}
}

int rs_torch_dist_read_distopt(rs_checkpoint *ck, const char *meta_path,
			       rs_diag *d)
{
	distopt o[2];
	rs_common_items items[2];
	unsigned chained, n = 1;
	bool plain, experts;
	int err = 0;

	find_optimizers(ck, &plain, &chained, &experts);
	if (!plain && !chained)
		return 0;
	if (plain && chained) {
		rs_diag_add(d, "%s: holds dp_reshardable buckets of one optimizer and of chained optimizers (chained_<i>.); which to read is unclear",
			    meta_path);
		return -EINVAL;
	}
	if (chained && (chained != 3u || !experts)) {
		rs_diag_add(d, "%s: dp_reshardable state of chained optimizers (mask 0x%x of chained_<i>.) is read only as megatron-core's pair of a dense (chained_0.) and an expert (chained_1.) optimizer of an MoE model; %s",
			    meta_path, chained,
			    experts ? "other chains are not read"
				    : "this model has no expert params");
		return -EINVAL;
	}
	if (chained)
		n = 2;
	memset(o, 0, sizeof(o));
	for (unsigned i = 0; i < n; i++) {
		o[i].ck = ck;
		o[i].d = d;
		o[i].meta_path = meta_path;
		o[i].kind = !chained ? ALL_PARAMS
				     : i ? EXPERT_PARAMS : DENSE_PARAMS;
		if (chained)
			snprintf(o[i].prefix, sizeof(o[i].prefix),
				 CHAINED "%u." RECORDS, i);
		else
			snprintf(o[i].prefix, sizeof(o[i].prefix), RECORDS);
	}
	for (unsigned i = 0; i < n && !err; i++) {
		if (i)
			o[i].pp = o[0].pp;      /* the expert groups' stages */
		err = read_one(&o[i]);
		items[i] = (rs_common_items){ .n = o[i].nobjs, .keys = o[i].keys,
					      .klen = o[i].klen,
					      .objs = o[i].objs };
	}
	if (!err)
		err = rs_torch_dist_make_common(ck, d, "dp_reshardable", items, n);
	/* The bucket tensors and every group's records hold the source's
	 * DP layout, which no view keeps. */
	if (!err)
		for (unsigned i = 0; i < n; i++) {
			rs_catalog_drop_prefix(&ck->catalog, o[i].prefix);
			rs_checkpoint_drop_blobs(ck, o[i].prefix);
		}
	for (unsigned i = 0; i < n; i++)
		free_one(&o[i]);
	return err;
}
