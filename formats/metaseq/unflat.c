/* metaseq unflattening: one model part's FSDP shards into tensors made of
 * fragments of the stored bytes, as fairscale's consolidate_shard_weights
 * rebuilds them. */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

void ms_set_where(ms_ctx *c, const ms_file *f)
{
	snprintf(c->where, sizeof(c->where), "%s/%s", c->ck->dir_path, f->name);
}

void ms_part_free(ms_part *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->t[i].name);
		free(p->t[i].frags);
	}
	free(p->t);
	rs_names_free(&p->by_name);
}

/* A new tensor of the part, named `name` (taken over). */
static ms_ptensor *add_ptensor(ms_part *p, char *name, rs_dtype dtype,
			       int ndim, const uint64_t *shape)
{
	ms_ptensor *t;

	if (!name || rs_array_reserve(&p->t, &p->cap, p->n + 1,
				      sizeof(ms_ptensor))) {
		free(name);
		return NULL;
	}
	t = &p->t[p->n++];
	memset(t, 0, sizeof(*t));
	t->name = name;
	t->dtype = dtype;
	t->ndim = ndim;
	memcpy(t->shape, shape, (size_t)ndim * sizeof(uint64_t));
	return t;
}

static rs_fragment *add_frag(ms_ptensor *t)
{
	rs_fragment *f;

	if (t->nfrags >= RS_CATALOG_MAX_FRAGS ||
	    rs_array_reserve(&t->frags, &t->cap, t->nfrags + 1,
			     sizeof(rs_fragment)))
		return NULL;
	f = &t->frags[t->nfrags++];
	memset(f, 0, sizeof(*f));
	f->box.ndim = t->ndim;
	return f;
}

/* Covers the C-order elements [a, b) of t with boxes; element a lies at
 * byte `off` of source `src` and the rest follow it contiguously.  Greedy:
 * from a, the outermost axis a whole step of which starts at a and fits
 * gives the next box (a partial first row, whole rows, a partial last row,
 * axis by axis), so a run costs at most 2*ndim-1 boxes. */
static int add_run(ms_ptensor *t, uint64_t a, uint64_t b, uint32_t src,
		   uint64_t off, unsigned esize)
{
	uint64_t inner[RS_MAX_DIMS], a0 = a;
	int n = t->ndim;

	if (n == 0) {           /* a 0-d param: one element */
		rs_fragment *f = add_frag(t);

		if (!f)
			return -E2BIG;
		f->source = src;
		f->offset = off;
		return 0;
	}
	inner[n - 1] = 1;
	for (int k = n - 2; k >= 0; k--)
		inner[k] = inner[k + 1] * t->shape[k + 1]; /* <= numel */
	while (a < b) {
		rs_fragment *f = add_frag(t);
		uint64_t idx, cnt;
		int k = 0;

		if (!f)
			return -E2BIG;
		while (a % inner[k] || b - a < inner[k])
			k++;    /* stops at n-1: inner is 1 there */
		idx = (a / inner[k]) % t->shape[k];
		cnt = (b - a) / inner[k];
		if (cnt > t->shape[k] - idx)
			cnt = t->shape[k] - idx;
		for (int j = 0; j < n; j++) {
			f->box.off[j] = j < k ? (a / inner[j]) % t->shape[j]
				      : j == k ? idx : 0;
			f->box.len[j] = j < k ? 1 : j == k ? cnt : t->shape[j];
			f->stride[j] = inner[j];
		}
		f->source = src;
		f->offset = off + (a - a0) * esize;
		a += cnt * inner[k];
	}
	return 0;
}

/* "<module>.<name>" of a param of flat param fl. */
static char *param_name(const ms_flat *fl, const char *name)
{
	char *out;

	if (!fl->prefix_len)
		return strdup(name);
	if (asprintf(&out, "%.*s.%s", (int)fl->prefix_len, fl->key, name) < 0)
		return NULL;
	return out;
}

/* How many elements of each shard's flat param are data (the rest is
 * padding at its end).  Recorded: size less the shard's padding.
 * params=FILE: as FSDP's and metaseq reshard_mp.py's torch.chunk split
 * lays them out, shard r holding elements [r*S, (r+1)*S) of the total,
 * S = ceil(total/D) = shard 0's size; a short last shard is padded to S,
 * or not (reshard_mp.py --no-pad). */
static int data_lengths(ms_ctx *c, const ms_file *f, size_t nranks, size_t k,
			const ms_flat *fl, const ms_tensor **ts, uint64_t *len)
{
	uint64_t held = 0, stored = 0, size = ts[0]->shape[0];
	bool ok = true;

	for (size_t r = 0; r < nranks; r++) {
		uint64_t got = ts[r]->shape[0], pad, start;

		stored += got;  /* sizes of tensors in files: no overflow */
		if (fl->has_padding) {
			pad = f[r].meta.flats[k].padding;
			if (pad > got) {
				rs_diag_add(c->d, "%s/%s: %s: padding %llu is more than the %llu elements the shard holds",
					    c->ck->dir_path, f[r].name, fl->key,
					    (unsigned long long)pad,
					    (unsigned long long)got);
				return -EINVAL;
			}
			len[r] = got - pad;
		} else {
			if (!rs_mul_u64(size, r, &start))
				start = UINT64_MAX;
			len[r] = start >= fl->total ? 0 : fl->total - start;
			if (len[r] > size)
				len[r] = size;
			ok = ok && (got == size || got == len[r]);
		}
		held += len[r];
	}
	if (!fl->has_padding)
		ok = ok && nranks && size == fl->total / nranks +
					     (fl->total % nranks != 0);
	if (held != fl->total || !ok) {
		rs_diag_add(c->d, "%s: %s: numels add up to %llu but the shards hold %llu",
			    c->where, fl->key, (unsigned long long)fl->total,
			    (unsigned long long)(fl->has_padding ? held
								 : stored));
		return -EINVAL;
	}
	return 0;
}

/* The shards' flat tensors of flat param fl: 1-d, contiguous, of one
 * dtype. */
static int flat_tensors(ms_ctx *c, const ms_file *f, size_t nranks,
			const ms_flat *fl, const ms_tensor **ts)
{
	for (size_t r = 0; r < nranks; r++) {
		const ms_tensor *t = ms_file_find(&f[r], fl->key);

		if (!t) {
			rs_diag_add(c->d, "%s/%s: model has no %s (its param list names it)",
				    c->ck->dir_path, f[r].name, fl->key);
			return -EINVAL;
		}
		if (t->ndim != 1 || (t->shape[0] > 1 && t->stride[0] != 1) ||
		    (r > 0 && t->dtype != ts[0]->dtype)) {
			rs_diag_add(c->d, "%s/%s: %s is not a contiguous 1-d tensor of shard 0's dtype",
				    c->ck->dir_path, f[r].name, fl->key);
			return -EINVAL;
		}
		ts[r] = t;
	}
	return 0;
}

/* Flat param k (fl) of the part whose shards are f[0..nshards): each of
 * its params becomes a tensor of the part. */
static int unflatten(ms_ctx *c, ms_part *p, const ms_file *f, size_t nshards,
		     size_t k, const ms_flat *fl, bool *used)
{
	size_t nranks = fl->rank0_only ? 1 : nshards, r = 0;
	const ms_tensor **ts = calloc(nranks, sizeof(*ts));
	uint64_t *len = calloc(nranks, sizeof(*len));
	uint64_t pstart = 0, rbase = 0;
	unsigned esize;
	int err = -ENOMEM;

	if (!ts || !len)
		goto out;
	err = flat_tensors(c, f, nranks, fl, ts);
	if (!err)
		err = data_lengths(c, f, nranks, k, fl, ts, len);
	if (err)
		goto out;
	used[ts[0] - f[0].tensors] = true;
	esize = rs_dtype_size(ts[0]->dtype);
	/* The params lie end to end in the shards' data, laid end to end in
	 * rank order; the sums were checked to agree. */
	for (size_t i = 0; i < fl->nparams && !err; i++) {
		const ms_param *pm = &fl->params[i];
		ms_ptensor *t = add_ptensor(p, param_name(fl, pm->name),
					 ts[0]->dtype, pm->ndim, pm->shape);
		uint64_t a = pstart, end = pstart + pm->numel;

		if (!t) {
			err = -ENOMEM;
			break;
		}
		while (a < end && !err) {
			uint64_t b;

			while (a >= rbase + len[r])
				rbase += len[r++];
			b = rbase + len[r] < end ? rbase + len[r] : end;
			err = add_run(t, a - pstart, b - pstart, f[r].source,
				      ts[r]->offset + (a - rbase) * esize, esize);
			a = b;
		}
		pstart = end;
		if (err == -E2BIG)
			rs_diag_add(c->d, "%s: %s: %s is cut into more than %u fragments",
				    c->where, fl->key, t->name,
				    RS_CATALOG_MAX_FRAGS);
	}
	err = err == -E2BIG ? -EINVAL : err;
out:
	free(ts);
	free(len);
	return err;
}

/* Shard r's shard_metadata must describe shard 0's flat params: the
 * unflattening takes names and shapes from shard 0, paddings from each. */
static int same_meta(ms_ctx *c, const ms_file *f0, const ms_file *fr)
{
	const ms_meta *a = &f0->meta, *b = &fr->meta;

	if (!b->present) {
		rs_diag_add(c->d, "%s/%s: has no shard_metadata, but %s has",
			    c->ck->dir_path, fr->name, f0->name);
		return -EINVAL;
	}
	if (a->nflats != b->nflats)
		goto differ;
	for (size_t k = 0; k < a->nflats; k++) {
		const ms_flat *x = &a->flats[k], *y = &b->flats[k];

		if (strcmp(x->key, y->key) != 0 || x->nparams != y->nparams ||
		    x->rank0_only != y->rank0_only)
			goto differ;
		for (size_t i = 0; i < x->nparams; i++) {
			const ms_param *u = &x->params[i], *v = &y->params[i];

			if (strcmp(u->name, v->name) != 0 || u->ndim != v->ndim ||
			    memcmp(u->shape, v->shape,
				   (size_t)u->ndim * sizeof(uint64_t)) != 0)
				goto differ;
		}
	}
	return 0;
differ:
	rs_diag_add(c->d, "%s/%s: shard_metadata differs from %s's",
		    c->ck->dir_path, fr->name, f0->name);
	return -EINVAL;
}

bool ms_holds_flat_key(const ms_file *f)
{
	for (size_t i = 0; i < f->ntensors; i++) {
		const char *dot = strrchr(f->tensors[i].key, '.');
		const char *last = dot ? dot + 1 : f->tensors[i].key;

		if (strncmp(last, "flat_param_", 11) == 0)
			return true;
	}
	return false;
}

/* A stored tensor as it is: one fragment with its own strides. */
static int add_plain(ms_part *p, const ms_tensor *s, uint32_t source)
{
	ms_ptensor *t = add_ptensor(p, strdup(s->key), s->dtype, s->ndim,
				 s->shape);
	uint64_t numel;
	rs_fragment *f;

	if (!t)
		return -ENOMEM;
	rs_product(s->shape, s->ndim, &numel);  /* inside its storage */
	if (!numel)
		return 0;
	if (!(f = add_frag(t)))
		return -ENOMEM;
	memcpy(f->box.len, s->shape, sizeof(s->shape));
	memcpy(f->stride, s->stride, sizeof(s->stride));
	f->source = source;
	f->offset = s->offset;
	return 0;
}

/* Plain, unique names, sorted for lookup. */
static int index_part(ms_ctx *c, ms_part *p)
{
	size_t at;
	int err;

	for (size_t i = 0; i < p->n; i++)
		if (!ms_name_ok(p->t[i].name)) {
			rs_diag_add(c->d, "%s: \"%s\" cannot be a tensor name (empty, '/', a control byte or over 255 bytes)",
				    c->where, p->t[i].name);
			return -EINVAL;
		}
	err = rs_names_sort(&p->by_name, p->t, p->n, sizeof(ms_ptensor),
			    offsetof(ms_ptensor, name));
	if (err)
		return err;
	at = rs_names_next_dup(&p->by_name, 1);
	if (at < p->n) {
		rs_diag_add(c->d, "%s: two tensors are named %s once unflattened",
			    c->where, rs_names_at(&p->by_name, at));
		return -EINVAL;
	}
	return 0;
}

const ms_ptensor *ms_part_find(const ms_part *p, const char *name)
{
	size_t i = rs_names_find(&p->by_name, name);

	return i == SIZE_MAX ? NULL : &p->t[i];
}

int ms_part_build(ms_ctx *c, ms_part *p, const ms_file *f, size_t nshards,
		  const ms_meta *params)
{
	const ms_meta *meta = f[0].meta.present ? &f[0].meta : NULL;
	bool *used = NULL;
	int err = 0;

	ms_set_where(c, &f[0]);
	p->file = &f[0];
	for (size_t r = 1; r < nshards && !err; r++) {
		if (meta) {
			err = same_meta(c, &f[0], &f[r]);
		} else if (f[r].meta.present) {
			rs_diag_add(c->d, "%s/%s: has shard_metadata, but %s has none",
				    c->ck->dir_path, f[r].name, f[0].name);
			err = -EINVAL;
		}
	}
	if (err)
		return err;
	if (!meta && params->present)
		meta = params;
	if (!meta && (nshards > 1 || ms_holds_flat_key(&f[0]))) {
		rs_diag_add(c->d, "%s: has no shard_metadata to unflatten its FSDP flat params with: pass -o params=FILE (names and shapes of the flat params)",
			    c->where);
		return -EINVAL;
	}
	p->meta = meta;
	used = calloc(f[0].ntensors + 1, sizeof(bool));
	if (!used)
		return -ENOMEM;
	for (size_t k = 0; meta && k < meta->nflats && !err; k++)
		err = unflatten(c, p, f, nshards, k, &meta->flats[k], used);
	for (size_t b = 0; meta && b < meta->nbuffers && !err; b++)
		if (!ms_file_find(&f[0], meta->buffers[b])) {
			rs_diag_add(c->d, "%s: buffer %s (named in buffer_names) is not in model",
				    c->where, meta->buffers[b]);
			err = -EINVAL;
		}
	/* Buffers and anything else not flat: shard 0's, as fairscale takes
	 * buffers. */
	for (size_t i = 0; i < f[0].ntensors && !err; i++)
		if (!used[i])
			err = add_plain(p, &f[0].tensors[i], f[0].source);
	free(used);
	return err ? err : index_part(c, p);
}
