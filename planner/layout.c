#include "planner/layout.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t rs_padded_vocab(uint64_t v, uint32_t div, uint32_t tp)
{
	uint64_t m = (uint64_t)div * tp, n;

	if (m == 0)
		return 0;
	n = v / m + (v % m != 0);
	return rs_mul_u64(n, m, &n) ? n : 0;
}

/* Number of layers from non-stacked keys "<prefix><N>." (max N+1). */
static uint64_t layers_from_names(const rs_catalog *c)
{
	/* mcore and OPT, legacy Megatron, HF Llama */
	static const char *const pres[] = {
		"decoder.layers.", "language_model.encoder.layers.", "layers.",
	};
	uint64_t best = 0;

	for (size_t i = 0; i < c->count; i++) {
		const char *b = rs_rules_base_name(c->tensors[i].name);

		for (size_t k = 0; k < sizeof(pres) / sizeof(pres[0]); k++) {
			size_t n = strlen(pres[k]);
			unsigned long long v;
			char *end;

			if (strncmp(b, pres[k], n) != 0 ||
			    !isdigit((unsigned char)b[n]))
				continue;
			v = strtoull(b + n, &end, 10);
			if (*end == '.' && v + 1 > best)
				best = v + 1;
		}
	}
	return best;
}

/* An expert weight's expert axis: its size is the layer's expert count,
 * which every expert weight must agree on. */
static int classify_experts(const rs_tensor *t, const rs_rule *r,
			    int layer_axes, rs_layout *l, size_t *first,
			    size_t i, const rs_catalog *c, rs_diag *d)
{
	rs_target *tg = &l->targets[i];
	int a = layer_axes + r->expert_axis;

	if (a >= t->ndim) {
		rs_diag_add(d, "%s: rule '%s' numbers experts along axis %d but the tensor has %d axes",
			    t->name, r->match, a, t->ndim);
		return -EINVAL;
	}
	tg->expert_axis = a;
	if (!l->experts) {
		l->experts = t->shape[a];
		*first = i;
	} else if (t->shape[a] != l->experts) {
		rs_diag_add(d, "%s: tensor %s holds %llu experts (axis %d), but %s holds %llu",
			    t->origin ? t->origin : t->name, t->name,
			    (unsigned long long)t->shape[a], a,
			    c->tensors[*first].name,
			    (unsigned long long)l->experts);
		return -EINVAL;
	}
	/* One expert per chunk, whatever the source's grid. */
	tg->chunk[a] = 1;
	tg->changed = tg->changed || (t->regular ? t->grid[a] : t->shape[a]) != 1;
	return 0;
}

/* First pass: rule, split axis and stored fragmentation of each tensor;
 * *named: one past the highest expert a per-expert key names. */
static int classify(const rs_catalog *c, const rs_rules *rules,
		    rs_layout *l, uint64_t *stacked_layers, uint64_t *named,
		    rs_diag *d)
{
	size_t first_expert = 0;
	int err = 0;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		rs_target *tg = &l->targets[i];
		int layer_axes = 0;
		const rs_rule *r = rs_rules_match(rules, t->name, &layer_axes);

		memcpy(tg->shape, t->shape, sizeof(tg->shape));
		memcpy(tg->chunk, t->grid, sizeof(tg->chunk));
		/* Fragments off any grid: a view shows the tensor as one chunk. */
		for (int k = 0; k < t->ndim && !t->regular; k++)
			tg->chunk[k] = t->shape[k] ? t->shape[k] : 1;
		tg->axis = -1;
		tg->expert_axis = -1;
		tg->expert = r ? rs_rule_expert_of_name(r, t->name) : -1;
		if (tg->expert >= 0 && (uint64_t)tg->expert >= *named)
			*named = (uint64_t)tg->expert + 1;
		tg->multiplier = 1;
		tg->has_rule = r != NULL;
		if (layer_axes > 0 && layer_axes <= t->ndim && t->ndim > 0 &&
		    t->shape[0] > *stacked_layers)
			*stacked_layers = t->shape[0];
		if (r && r->expert_axis >= 0 &&
		    classify_experts(t, r, layer_axes, l, &first_expert, i, c, d)) {
			err = -EINVAL;
			continue;
		}
		if (!r || r->split == RS_SPLIT_NONE)
			continue;
		tg->by_etp = r->etp;
		/* Fragments off any grid (metaseq's FSDP pieces) are split
		 * too: retarget takes such a tensor as merged. */
		if (layer_axes + r->axis >= t->ndim) {
			rs_diag_add(d, "%s: rule '%s' splits axis %d but the tensor has %d axes",
				    t->name, r->match, layer_axes + r->axis,
				    t->ndim);
			err = -EINVAL;
			continue;
		}
		tg->split = r->split;
		tg->axis = layer_axes + r->axis;
		if (t->regular && t->shape[tg->axis] % t->grid[tg->axis] != 0) {
			rs_diag_add(d, "%s: tensor %s is split by TP along axis %d, but its size %llu is not a whole number of chunks of %llu",
				    t->origin ? t->origin : t->name, t->name, tg->axis,
				    (unsigned long long)t->shape[tg->axis],
				    (unsigned long long)t->grid[tg->axis]);
			/* Reported: retarget and src_tp inference skip it. */
			tg->axis = -1;
			err = -EINVAL;
		}
	}
	return err;
}

/* The source's TP (by_etp false) or expert TP (true): the smallest
 * stored fragmentation of a split axis of such tensors; 0 when none. */
static uint32_t infer_src_tp(const rs_catalog *c, const rs_layout *l,
			     bool by_etp)
{
	uint64_t best = 0;

	for (size_t i = 0; i < c->count; i++) {
		const rs_target *tg = &l->targets[i];
		uint64_t f;

		/* Only stored grids say anything about the source TP; a
		 * tensor off any grid (below) is taken as merged. */
		if (tg->axis < 0 || tg->by_etp != by_etp ||
		    c->tensors[i].shape[tg->axis] == 0 ||
		    !c->tensors[i].regular)
			continue;
		f = c->tensors[i].grid_count[tg->axis];
		if (f && (best == 0 || f < best))
			best = f;
	}
	return best <= UINT32_MAX ? (uint32_t)best : 0;
}

static int vocab_rows(const rs_tensor *t, const rs_target *tg,
		      const rs_layout_opts *o, uint32_t tp, uint64_t *rows,
		      rs_diag *d)
{
	uint64_t stored = t->shape[tg->axis];

	if (!o->vocab_size) {
		if (stored % tp != 0) {
			rs_diag_add(d, "%s: stored padded vocab %llu does not divide by tp=%u; give -o vocab_size=<unpadded vocab>",
				    t->name, (unsigned long long)stored, tp);
			return -EINVAL;
		}
		*rows = stored;
		return 0;
	}
	if (o->vocab_size > stored) {
		rs_diag_add(d, "%s: vocab_size=%llu exceeds the %llu stored rows",
			    t->name, (unsigned long long)o->vocab_size,
			    (unsigned long long)stored);
		return -EINVAL;
	}
	*rows = rs_padded_vocab(o->vocab_size, o->vocab_divisor ? o->vocab_divisor
						 : RS_DEFAULT_VOCAB_DIVISOR, tp);
	return *rows ? 0 : -EOVERFLOW;
}

/* How many chunks along axis a a tensor off any grid stands for: those of
 * a regular tensor of its base name and shape (an optimizer state laid
 * out like its param, whose pieces do not follow the grid: a gated fc1's
 * state is [W; V] like the weight), else the source TP's. */
static uint64_t merged_chunks(const rs_catalog *c, const rs_tensor *t, int a,
			      uint32_t src_tp)
{
	const char *base = rs_rules_base_name(t->name);

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *u = &c->tensors[i];

		if (u->regular && u->ndim == t->ndim &&
		    memcmp(u->shape, t->shape, sizeof(t->shape)) == 0 &&
		    strcmp(rs_rules_base_name(u->name), base) == 0)
			return u->grid_count[a];
	}
	return src_tp;
}

/* Second pass: target shape and chunks of every split tensor. */
static int retarget(const rs_catalog *c, const rs_layout_opts *o, rs_layout *l,
		    rs_diag *d)
{
	int err = 0;

	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *t = &c->tensors[i];
		rs_target *tg = &l->targets[i];
		uint64_t frag, parts;
		uint32_t src = tg->by_etp ? l->src_etp : l->src_tp;
		uint32_t tp = rs_layout_tp_of(l, tg);
		int a = tg->axis;

		if (a < 0)
			continue;
		/* A tensor whose fragments lie off any grid (metaseq's FSDP
		 * pieces, an odd torch_dist chunking, optimizer state from
		 * dp_reshardable buckets) is taken as merged: as many chunks
		 * as its param has, or multiplier 1. */
		frag = t->regular ? t->grid_count[a]
				  : merged_chunks(c, t, a, src);
		if (t->shape[a] == 0)
			continue;
		if (frag % src != 0) {
			rs_diag_add(d, "%s: axis %d is stored in %llu chunks, not a multiple of the source %s=%u",
				    t->name, a, (unsigned long long)frag,
				    tg->by_etp ? "etp" : "tp", src);
			err = -EINVAL;
			continue;
		}
		tg->multiplier = (uint32_t)(frag / src);
		if (tg->split == RS_SPLIT_VOCAB &&
		    vocab_rows(t, tg, o, tp, &tg->shape[a], d)) {
			err = -EINVAL;
			continue;
		}
		parts = (uint64_t)tg->multiplier * tp;
		if (tg->shape[a] % parts != 0) {
			rs_diag_add(d, "%s: axis %d of size %llu cannot be split evenly into %llu chunks (%s=%u x %u)",
				    t->name, a, (unsigned long long)tg->shape[a],
				    (unsigned long long)parts,
				    tg->by_etp ? "etp" : "tp", tp,
				    tg->multiplier);
			err = -EINVAL;
			continue;
		}
		tg->chunk[a] = tg->shape[a] / parts;
		tg->changed = tg->changed ||
			      tg->chunk[a] != (t->regular ? t->grid[a] : t->shape[a]) ||
			      tg->shape[a] != t->shape[a];
	}
	return err;
}

/* ep must divide the experts; the refusal lists the ep values that do,
 * the first 24 of those up to 2^20 (bounded work on a hostile shape;
 * real models have at most a few thousand experts). */
static int check_experts(const rs_layout *l, rs_diag *d)
{
	char ok[512];
	size_t at = 0;
	int listed = 0;

	if ((uint64_t)l->ep * l->etp > RS_LAYOUT_MAX_RANKS) {
		rs_diag_add(d, "ep=%u x etp=%u: more than %u expert ranks",
			    l->ep, l->etp, RS_LAYOUT_MAX_RANKS);
		return -EINVAL;
	}
	if (l->experts && l->experts % l->ep == 0)
		return 0;
	if (!l->experts) {
		if (!l->ep_given || l->ep == 1)
			return 0;
		rs_diag_add(d, "ep=%u: the checkpoint has no expert weights (no Mixture-of-Experts layer); leave ep out",
			    l->ep);
		return -EINVAL;
	}
	ok[0] = 0;
	for (uint64_t e = 1; e <= l->experts && e <= (1u << 20); e++) {
		int n;

		if (l->experts % e)
			continue;
		if (listed == 24) {
			snprintf(ok + at, sizeof(ok) - at, ", ...");
			break;
		}
		n = snprintf(ok + at, sizeof(ok) - at, "%s%llu",
			     listed ? ", " : "", (unsigned long long)e);
		if (n < 0 || (size_t)n >= sizeof(ok) - at)
			break;
		at += (size_t)n;
		listed++;
	}
	rs_diag_add(d, "ep=%u: the checkpoint's %llu experts per layer do not divide into %u expert-parallel ranks; ep can be %s",
		    l->ep, (unsigned long long)l->experts, l->ep, ok);
	return -EINVAL;
}

int rs_layout_resolve(const rs_catalog *c, const rs_rules *rules,
		      const rs_layout_opts *opts, rs_layout *out, rs_diag *d)
{
	uint64_t stacked = 0, named = 0;
	int err;

	memset(out, 0, sizeof(*out));
	out->targets = calloc(c->count ? c->count : 1, sizeof(rs_target));
	if (!out->targets)
		return -ENOMEM;
	out->count = c->count;

	err = classify(c, rules, out, &stacked, &named, d);
	if (named && !out->experts) {
		out->experts = named;
	} else if (named > out->experts) {
		rs_diag_add(d, "a per-expert key names expert %llu, but the expert weights hold %llu experts",
			    (unsigned long long)named - 1,
			    (unsigned long long)out->experts);
		err = -EINVAL;
	}
	out->src_tp = opts->src_tp ? opts->src_tp : infer_src_tp(c, out, false);
	if (!out->src_tp)
		out->src_tp = 1;
	out->src_etp = infer_src_tp(c, out, true);
	if (!out->src_etp)
		out->src_etp = out->src_tp;
	out->tp = opts->tp ? opts->tp : out->src_tp;
	out->etp = opts->etp ? opts->etp : out->tp;
	out->ep = opts->ep ? opts->ep : 1;
	out->ep_given = opts->ep != 0;
	out->expert_keys = opts->expert_keys;
	if (check_experts(out, d))
		err = -EINVAL;
	out->layers = stacked ? stacked : layers_from_names(c);
	out->pp = opts->pp ? opts->pp : 1;
	out->vpp = opts->vpp ? opts->vpp : 1;
	out->pp_given = opts->pp != 0;
	out->vpp_given = opts->vpp != 0;
	if (out->layers && out->vpp > 1 &&
	    out->layers % ((uint64_t)out->pp * out->vpp)) {
		rs_diag_add(d, "pp=%u vpp=%u: the checkpoint has %llu layers, which do not divide into %u x %u model chunks",
			    out->pp, out->vpp, (unsigned long long)out->layers,
			    out->pp, out->vpp);
		err = -EINVAL;
	} else if (out->layers && (out->pp > out->layers ||
				   out->layers % out->pp)) {
		rs_diag_add(d, "pp=%u: the checkpoint has %llu layers, which do not divide into %u pipeline stages",
			    out->pp, (unsigned long long)out->layers, out->pp);
		err = -EINVAL;
	}
	if (retarget(c, opts, out, d))
		err = -EINVAL;
	out->dtype = opts->dtype;
	out->shard_size = opts->shard_size;
	for (size_t i = 0; i < c->count; i++) {
		rs_target *tg = &out->targets[i];

		tg->dtype = c->tensors[i].dtype;
		if (opts->dtype && rs_dtype_is_float(tg->dtype) &&
		    tg->dtype != opts->dtype) {
			tg->dtype = opts->dtype;
			tg->changed = true;
		}
	}
	if (err)
		rs_layout_free(out);
	return err;
}

void rs_layout_free(rs_layout *l)
{
	free(l->targets);
	memset(l, 0, sizeof(*l));
}

void rs_target_shard_shape(const rs_target *tg, uint64_t shape[RS_MAX_DIMS])
{
	memcpy(shape, tg->shape, sizeof(tg->shape));
	if (tg->axis >= 0)
		shape[tg->axis] = tg->chunk[tg->axis] * tg->multiplier;
}
