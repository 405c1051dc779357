/* metaseq stitcher: merges the unflattened model parts into the catalog
 * as metaseq's stitch_fsdp_ckpt.py (reshard_megatron_parts) does. */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- merging the model parts ------------------------------------------ */

/* What stitch_fsdp_ckpt.py's reshard_megatron_parts does with a key, by
 * the same substring tests in the same order. */
typedef enum { TAKE_PART0, CONCAT, SPLIT_QKV } merge_how;

static merge_how merge_rule(const char *name, int *dim)
{
	size_t n = strlen(name);
	bool bias = n >= 4 && strcmp(name + n - 4, "bias") == 0;

	*dim = 0;
	if (strstr(name, "qkv"))
		return SPLIT_QKV;
	if (strstr(name, "ffn_layernorm"))
		return CONCAT;
	if (strstr(name, "layer_norm"))
		return TAKE_PART0;
	if (strstr(name, "fc1") || strstr(name, "k_proj") ||
	    strstr(name, "q_proj") || strstr(name, "v_proj"))
		return CONCAT;
	if (strstr(name, "fc2") || strstr(name, "out_proj")) {
		if (bias)
			return TAKE_PART0;      /* row-parallel: replicated */
		*dim = 1;
		return CONCAT;
	}
	if (strstr(name, "embed_tokens.weight"))
		return CONCAT;
	/* Not in stitch_fsdp_ckpt.py, whose models all tie it: an untied
	 * output projection is column-parallel (vocab rows per part), as the
	 * flat params cfg implies hold it (formats/metaseq/cfg.c). */
	if (strstr(name, "output_projection.weight"))
		return CONCAT;
	return TAKE_PART0;
}

/* Part p's tensor t, its extent [lo, hi) along `axis` put at `at` of the
 * output (axis -1: all of it, where it is). */
typedef struct {
	const ms_ptensor *t;
	int axis;
	uint64_t lo, hi, at;
} piece;

/* f clipped to the piece and moved to the output's coordinates; false
 * when they do not meet. */
static bool place(const piece *pc, const rs_fragment *f, rs_fragment *out)
{
	uint64_t o, e, s, end;
	int ax = pc->axis;

	*out = *f;
	if (ax < 0)
		return true;
	o = f->box.off[ax];
	e = o + f->box.len[ax];
	s = o > pc->lo ? o : pc->lo;
	end = e < pc->hi ? e : pc->hi;
	if (s >= end)
		return false;
	out->offset += (s - o) * f->stride[ax] * rs_dtype_size(pc->t->dtype);
	out->box.off[ax] = s - pc->lo + pc->at;
	out->box.len[ax] = end - s;
	return true;
}

/* The output tensor `name` of `shape` (dtype and rank of pcs[0].t). */
static int emit(ms_ctx *c, const char *name, const uint64_t *shape,
		const piece *pcs, size_t npcs)
{
	const ms_ptensor *like = pcs[0].t;
	uint64_t covered, total;
	size_t nfr = 0, index, a = 0, b = 0;
	rs_fragment tmp;
	rs_tensor *t;
	int err;

	for (size_t i = 0; i < npcs; i++)
		for (size_t f = 0; f < pcs[i].t->nfrags; f++)
			nfr += place(&pcs[i], &pcs[i].t->frags[f], &tmp);
	err = rs_catalog_add_fragments(&c->ck->catalog, name, like->dtype,
				       like->ndim, shape, nfr, &index);
	if (err == -EOVERFLOW || err == -E2BIG) {
		rs_diag_add(c->d, "%s: %s: shape or fragment count too large",
			    c->where, name);
		return -EINVAL;
	}
	if (!err)
		err = rs_catalog_set_origin(&c->ck->catalog, index, c->where);
	if (err)
		return err;
	t = &c->ck->catalog.tensors[index];
	nfr = 0;
	/* Through tmp: place writes its output before it knows the fragment
	 * meets the piece, and t->frags has room for the ones that do. */
	for (size_t i = 0; i < npcs; i++)
		for (size_t f = 0; f < pcs[i].t->nfrags; f++)
			if (place(&pcs[i], &pcs[i].t->frags[f], &tmp))
				t->frags[nfr++] = tmp;
	/* Never made regular: a grid that FSDP's shard boundaries happen to
	 * draw says nothing of the tensor's parallel layout, and the layout
	 * would take it for one. */
	/* The pieces tile by construction; a hole would read as zeros and an
	 * overlap as two answers, so make sure. */
	err = rs_tensor_check_tiling(t, &a, &b, &covered, &total);
	if (err == -ENOMEM)
		return err;
	if (err) {
		rs_diag_add(c->d, "%s: %s: its pieces do not tile it (%llu of %llu elements covered, or overlapping)",
			    c->where, name, (unsigned long long)covered,
			    (unsigned long long)total);
		return -EINVAL;
	}
	return 0;
}

static void shape_text(const ms_ptensor *t, char *out, size_t size)
{
	size_t at = (size_t)snprintf(out, size, "[");

	for (int i = 0; i < t->ndim && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%llu",
				       i ? ", " : "", (unsigned long long)t->shape[i]);
	if (at < size)
		snprintf(out + at, size - at, "]");
}

/* Part p's tensor pt must match part 0's t0 in every extent but `skip`
 * (-1: all). */
static int same_shape(ms_ctx *c, const ms_part *pp, const ms_ptensor *t0,
		      const ms_ptensor *pt, int skip)
{
	char x[RS_MAX_DIMS * 22 + 4], y[RS_MAX_DIMS * 22 + 4];
	bool same = pt->ndim == t0->ndim;

	for (int i = 0; same && i < t0->ndim; i++)
		same = i == skip || pt->shape[i] == t0->shape[i];
	if (same)
		return 0;
	shape_text(pt, x, sizeof(x));
	shape_text(t0, y, sizeof(y));
	rs_diag_add(c->d, "%s/%s: %s has shape %s but %s in model part 0",
		    c->ck->dir_path, pp->file->name, t0->name, x, y);
	return -EINVAL;
}

/* k_proj, v_proj, q_proj out of a fused qkv_proj name; NULL on ENOMEM. */
static char *qkv_name(const char *name, const char *what)
{
	const char *at = strstr(name, ".qkv_proj.");
	char *out;

	if (asprintf(&out, "%.*s.%s.%s", (int)(at - name), name, what,
		     at + strlen(".qkv_proj.")) < 0)
		return NULL;
	return out;
}

/* A fused [k; v; q] per part: each third concatenated over the parts,
 * as three tensors (HF OPT's k_proj/v_proj/q_proj) when the name says
 * qkv_proj, else one [K; V; Q] as metaseq's stitch keeps it. */
static int merge_qkv(ms_ctx *c, const ms_ptensor **pt, uint32_t nparts,
		     piece *pcs)
{
	static const char *const split[3] = { "k_proj", "v_proj", "q_proj" };
	const ms_ptensor *t0 = pt[0];
	uint64_t shape[RS_MAX_DIMS], h = t0->ndim ? t0->shape[0] / 3 : 0;
	bool apart = strstr(t0->name, ".qkv_proj.") != NULL;
	int err = 0;

	if (t0->ndim < 1 || t0->shape[0] % 3) {
		rs_diag_add(c->d, "%s: %s: a fused qkv needs a first extent divisible by 3",
			    c->where, t0->name);
		return -EINVAL;
	}
	memcpy(shape, t0->shape, sizeof(shape));
	if (!rs_mul_u64(h, (uint64_t)nparts * (apart ? 1 : 3), &shape[0])) {
		rs_diag_add(c->d, "%s: %s: merged shape overflows", c->where,
			    t0->name);
		return -EINVAL;
	}
	for (int s = 0; s < 3; s++)
		for (uint32_t p = 0; p < nparts; p++)
			pcs[s * nparts + p] = (piece){
				pt[p], 0, s * h, (s + 1) * h,
				(apart ? 0 : s * nparts * h) + p * h,
			};
	if (!apart)
		return emit(c, t0->name, shape, pcs, 3 * (size_t)nparts);
	/* HF order: q, k, v. */
	for (int s = 2; s < 5 && !err; s++) {
		char *name = qkv_name(t0->name, split[s % 3]);

		err = name ? emit(c, name, shape, pcs + (s % 3) * nparts, nparts)
			   : -ENOMEM;
		free(name);
	}
	return err;
}

/* Output tensor(s) of part 0's tensor t0 (pt[p]: part p's of that name). */
static int merge_one(ms_ctx *c, const ms_part *parts, uint32_t nparts,
		     const ms_ptensor **pt, piece *pcs)
{
	const ms_ptensor *t0 = pt[0];
	uint64_t shape[RS_MAX_DIMS];
	int dim, err = 0;
	merge_how how = merge_rule(t0->name, &dim);

	for (uint32_t p = 1; p < nparts && !err; p++)
		err = same_shape(c, &parts[p], t0, pt[p],
				 how == CONCAT ? dim : -1);
	if (err)
		return err;
	if (how == SPLIT_QKV)
		return merge_qkv(c, pt, nparts, pcs);
	if (how == TAKE_PART0) {
		pcs[0] = (piece){ t0, -1, 0, 0, 0 };
		return emit(c, t0->name, t0->shape, pcs, 1);
	}
	if (t0->ndim <= dim) {
		rs_diag_add(c->d, "%s: %s: has %d dims, so it cannot be joined along dim %d",
			    c->where, t0->name, t0->ndim, dim);
		return -EINVAL;
	}
	memcpy(shape, t0->shape, sizeof(shape));
	shape[dim] = 0;
	for (uint32_t p = 0; p < nparts; p++) {
		pcs[p] = (piece){ pt[p], dim, 0, pt[p]->shape[dim], shape[dim] };
		if (!rs_add_u64(shape[dim], pt[p]->shape[dim], &shape[dim])) {
			rs_diag_add(c->d, "%s: %s: merged shape overflows",
				    c->where, t0->name);
			return -EINVAL;
		}
	}
	return emit(c, t0->name, shape, pcs, nparts);
}

/* Every part holds the names part 0 does, of part 0's dtype. */
static int peers(ms_ctx *c, const ms_part *parts, uint32_t nparts, size_t i,
		 const ms_ptensor **pt)
{
	pt[0] = &parts[0].t[i];
	for (uint32_t p = 1; p < nparts; p++) {
		pt[p] = ms_part_find(&parts[p], pt[0]->name);
		if (!pt[p]) {
			rs_diag_add(c->d, "%s/%s: has no %s, which model part 0 has",
				    c->ck->dir_path, parts[p].file->name,
				    pt[0]->name);
			return -EINVAL;
		}
		if (pt[p]->dtype != pt[0]->dtype) {
			rs_diag_add(c->d, "%s/%s: %s is %s, but %s in model part 0",
				    c->ck->dir_path, parts[p].file->name,
				    pt[0]->name, rs_dtype_name(pt[p]->dtype),
				    rs_dtype_name(pt[0]->dtype));
			return -EINVAL;
		}
	}
	return 0;
}

/* Part p has a name part 0 has not (the counts differ). */
static int extra_names(ms_ctx *c, const ms_part *parts, uint32_t nparts)
{
	for (uint32_t p = 1; p < nparts; p++)
		for (size_t i = 0; parts[p].n != parts[0].n && i < parts[p].n;
		     i++)
			if (!ms_part_find(&parts[0], parts[p].t[i].name)) {
				rs_diag_add(c->d, "%s/%s: has %s, which model part 0 has not",
					    c->ck->dir_path, parts[p].file->name,
					    parts[p].t[i].name);
				return -EINVAL;
			}
	return 0;
}

/* A shared param (fairscale's shared_param_info, e.g. OPT's tied
 * decoder.output_projection.weight): dst is the merged src under another
 * name.  Taken from part 0's description: all parts share it. */
static int add_alias(ms_ctx *c, size_t base, const ms_alias *al)
{
	rs_catalog *cat = &c->ck->catalog;
	size_t si = cat->count, index;
	rs_tensor *t;
	int err;

	for (size_t i = base; i < cat->count; i++)
		if (strcmp(cat->tensors[i].name, al->src) == 0)
			si = i;
	if (si == cat->count) {
		rs_diag_add(c->d, "%s: shared_param_info names %s, which is not a tensor",
			    c->where, al->src);
		return -EINVAL;
	}
	if (!ms_name_ok(al->dst)) {
		rs_diag_add(c->d, "%s: \"%s\" cannot be a tensor name (empty, '/', a control byte or over 255 bytes)",
			    c->where, al->dst);
		return -EINVAL;
	}
	err = rs_catalog_add_fragments(cat, al->dst, cat->tensors[si].dtype,
				       cat->tensors[si].ndim,
				       cat->tensors[si].shape,
				       cat->tensors[si].nfrags, &index);
	if (!err)
		err = rs_catalog_set_origin(cat, index, c->where);
	if (err)
		return err;
	/* add may have moved the table */
	t = &cat->tensors[index];
	memcpy(t->frags, cat->tensors[si].frags,
	       t->nfrags * sizeof(rs_fragment));
	return 0;
}

static int cmp_tname(const void *a, const void *b, void *arg)
{
	const rs_tensor *t = arg;

	return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* A split qkv_proj beside a stored q_proj would be two tensors of one
 * name. */
static int unique_outputs(ms_ctx *c, size_t base)
{
	const rs_catalog *cat = &c->ck->catalog;
	size_t n = cat->count - base, *ix = malloc((n ? n : 1) * sizeof(size_t));
	int err = 0;

	if (!ix)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ix[i] = base + i;
	qsort_r(ix, n, sizeof(size_t), cmp_tname, cat->tensors);
	for (size_t i = 1; i < n && !err; i++)
		if (strcmp(cat->tensors[ix[i]].name,
			   cat->tensors[ix[i - 1]].name) == 0) {
			rs_diag_add(c->d, "%s: two tensors are named %s once the model parts are merged",
				    c->ck->dir_path, cat->tensors[ix[i]].name);
			err = -EINVAL;
		}
	free(ix);
	return err;
}

int ms_stitch(rs_checkpoint *ck, const ms_file *files, size_t n,
	      uint32_t nparts, const ms_meta *params, rs_diag *d)
{
	ms_ctx c = { .ck = ck, .d = d };
	ms_part *parts = calloc(nparts, sizeof(*parts));
	const ms_ptensor **pt = calloc(nparts, sizeof(*pt));
	piece *pcs = calloc(3 * (size_t)nparts, sizeof(*pcs));
	size_t base = ck->catalog.count;
	const ms_meta *aliases;
	int err = 0;

	if (!parts || !pt || !pcs) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0, p = 0; i < n && !err; p++) {
		size_t j = i;

		while (j < n && files[j].part == files[i].part)
			j++;
		err = ms_part_build(&c, &parts[p], &files[i], j - i, params);
		i = j;
	}
	if (!err)
		err = extra_names(&c, parts, nparts);
	ms_set_where(&c, parts[0].file);
	for (size_t i = 0; !err && i < parts[0].n; i++) {
		err = peers(&c, parts, nparts, i, pt);
		if (!err)
			err = merge_one(&c, parts, nparts, pt, pcs);
	}
	aliases = parts[0].meta;
	for (size_t a = 0; !err && aliases && a < aliases->naliases; a++)
		err = add_alias(&c, base, &aliases->aliases[a]);
	if (!err)
		err = unique_outputs(&c, base);
out:
	for (uint32_t p = 0; parts && p < nparts; p++)
		ms_part_free(&parts[p]);
	free(parts);
	free(pt);
	free(pcs);
	return err;
}
