/* remap: a family's rows applied to a catalog (formats/model.h): each
 * target tensor is pieces (formats/bridge/ops.c) of stored tensors'
 * fragments, clipped along the layer axis and the row axis and moved
 * into place. */
#include "formats/bridge/bridge_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

#define NAME_SIZE 512
/* Layers a stacked target may gather (far beyond real models). */
#define MAX_LAYERS (1u << 16)

/* A pattern holding '*' (a drop row's: rows.c refuses it elsewhere), by
 * simulating its automaton - positions of the pattern, plus "inside the
 * digits of the '#' at i" - over the name once: time |pat| x |name|,
 * whatever the pattern (a backtracking matcher is exponential in the
 * number of '*'s).  '#' is one or more digits here; nothing is captured. */
static bool match_glob(const char *pat, const char *name)
{
	size_t n = strlen(pat);
	bool at[4 * (RS_MAP_PATTERN_MAX + 1)] = { false };
	bool *run, *nat, *nrun;

	if (n > RS_MAP_PATTERN_MAX)
		return false;
	run = at + (n + 1);
	nat = run + (n + 1);
	nrun = nat + (n + 1);
	at[0] = true;
	for (const char *c = name;; c++) {
		/* the moves that read nothing: past a '*', out of a digit run */
		for (size_t i = 0; i < n; i++)
			if (run[i] || (at[i] && pat[i] == '*'))
				at[i + 1] = true;
		if (!*c)
			break;
		memset(nat, 0, 2 * (n + 1) * sizeof(bool));
		for (size_t i = 0; i < n; i++) {
			bool digit = *c >= '0' && *c <= '9';

			if (!at[i])
				;
			else if (pat[i] == '*')
				nat[i] = true;
			else if (pat[i] == '#')
				nrun[i] = nrun[i] || digit;
			else if (pat[i] == *c)
				nat[i + 1] = true;
			if (run[i] && digit)
				nrun[i] = true;
		}
		memcpy(at, nat, 2 * (n + 1) * sizeof(bool));
	}
	return at[n];
}

bool rs_map_match(const char *pat, const char *name, bool stacked,
		  char nums[2][24], int *nnums)
{
	bool elided = !stacked;

	if (strchr(pat, '*')) {
		const char *layer = strstr(pat, "#.");
		char p[RS_MAP_PATTERN_MAX + 1];
		size_t at;

		if (!stacked)
			return match_glob(pat, name);
		if (!layer || strlen(pat) > RS_MAP_PATTERN_MAX)
			return false;
		/* the pattern without its first "#." */
		at = (size_t)(layer - pat);
		memcpy(p, pat, at);
		strcpy(p + at, layer + 2);
		return match_glob(p, name);
	}
	/* No '*': each character of the pattern takes one place in the
	 * name, each '#' all the digits there - one pass. */
	for (; *pat; pat++) {
		if (!elided && pat[0] == '#' && pat[1] == '.') {
			elided = true;
			pat++;
			continue;
		}
		if (*pat == '#') {
			size_t n = strspn(name, "0123456789");

			if (n == 0 || n > 20 || *nnums == 2)
				return false;
			memcpy(nums[*nnums], name, n);
			nums[(*nnums)++][n] = 0;
			name += n;
		} else if (*pat != *name++) {
			return false;
		}
	}
	return *name == 0 && elided;
}

/* Pattern `pat` with its '#'s replaced by vals[0..nvals) in order (the
 * first "#." left out with `elide`); -ENAMETOOLONG, or -EINVAL when
 * the pattern has more '#'s than values. */
static int subst(const char *pat, bool elide, char vals[][24], int nvals,
		 char *out, size_t size)
{
	size_t at = 0;
	int used = 0;

	for (; *pat; pat++) {
		const char *piece = pat;
		size_t n = 1;

		if (elide && pat[0] == '#' && pat[1] == '.') {
			elide = false;
			pat++;
			continue;
		}
		if (*pat == '#') {
			if (used >= nvals)      /* nvals < 0: none at all */
				return -EINVAL;
			piece = vals[used++];
			n = strlen(piece);
		}
		if (at + n >= size)
			return -ENAMETOOLONG;
		memcpy(out + at, piece, n);
		at += n;
	}
	out[at] = 0;
	return 0;
}

static const char *skip_prefix(const rs_family *f, const char *name)
{
	size_t n = f->strip ? strlen(f->strip) : 0;

	return n && strncmp(name, f->strip, n) == 0 ? name + n : name;
}

size_t rs_bridge_find(const rs_checkpoint *ck, const rs_family *f,
		      const char *name)
{
	for (size_t i = 0; i < ck->catalog.count; i++)
		if (strcmp(skip_prefix(f, ck->catalog.tensors[i].name),
			   name) == 0)
			return i;
	return SIZE_MAX;
}

/* ---- the target names made so far, and what made each -------------- */

typedef struct {
	char *name;
	const rs_map_row *row;  /* the row that made it */
	const char *src;        /* from this stored tensor (its source 0) */
} made_name;

typedef struct {
	made_name *slot;
	size_t cap, n;
} name_set;

static uint64_t hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* 1 when added, 0 when there already (*had: what made it), -ENOMEM. */
static int set_add(name_set *s, const char *name, const rs_map_row *row,
		   const char *src, const made_name **had)
{
	size_t i;

	if (2 * (s->n + 1) > s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 256;
		made_name *slot = calloc(cap, sizeof(*slot));

		if (!slot)
			return -ENOMEM;
		for (size_t k = 0; k < s->cap; k++) {
			if (!s->slot[k].name)
				continue;
			for (i = hash(s->slot[k].name) & (cap - 1); slot[i].name;
			     i = (i + 1) & (cap - 1))
				;
			slot[i] = s->slot[k];
		}
		free(s->slot);
		s->slot = slot;
		s->cap = cap;
	}
	for (i = hash(name) & (s->cap - 1); s->slot[i].name;
	     i = (i + 1) & (s->cap - 1))
		if (strcmp(s->slot[i].name, name) == 0) {
			*had = &s->slot[i];
			return 0;
		}
	s->slot[i].name = strdup(name);
	if (!s->slot[i].name)
		return -ENOMEM;
	s->slot[i].row = row;
	s->slot[i].src = src;
	s->n++;
	return 1;
}

static void set_free(name_set *s)
{
	for (size_t k = 0; k < s->cap; k++)
		free(s->slot[k].name);
	free(s->slot);
}

/* ---- sources ------------------------------------------------------- */

typedef struct {
	const rs_tensor *t;
	int64_t layer;          /* the layer on axis 0, -1: not stacked */
	int64_t expert;         /* the expert on the next axis, -1: none */
} src_ref;

/* The axes a reference takes one index of: its layer's, its expert's. */
static int lead_axes(const src_ref *s)
{
	return (s->layer >= 0) + (s->expert >= 0);
}

/* One layer's (one expert's) view of a source: its shape without those
 * axes. */
static int layer_shape(const src_ref *s, uint64_t *shape)
{
	int a0 = lead_axes(s);

	for (int i = a0; i < s->t->ndim; i++)
		shape[i - a0] = s->t->shape[i];
	return s->t->ndim - a0;
}

/* ---- fragments ----------------------------------------------------- */

typedef struct {
	rs_fragment *f;
	size_t n, cap;
} frag_list;

/* Source s's fragments inside piece p, moved to the target's
 * coordinates: lead[0..nlead) are the target's leading indices (its layer
 * on a stacked target's axis 0, its expert on the next), each one wide. */
static int place(frag_list *fl, const src_ref *s, const rs_map_piece *p,
		 const int64_t *lead, const uint64_t *lead_stride, int nlead)
{
	const rs_tensor *t = s->t;
	size_t esz = rs_dtype_size(t->dtype);
	int a0 = lead_axes(s);
	int64_t at[2] = { s->layer >= 0 ? s->layer : s->expert, s->expert };
	int err;

	for (size_t i = 0; i < t->nfrags; i++) {
		const rs_fragment *f = &t->frags[i];
		rs_fragment o;
		uint64_t off = f->offset;
		int oa = nlead;
		bool inside = true;

		memset(&o, 0, sizeof(o));
		/* the source's layer (and expert) indices: inside the
		 * fragment, and the offset moved to them */
		for (int ax = 0; ax < a0 && inside; ax++) {
			uint64_t x = (uint64_t)at[ax];

			inside = x >= f->box.off[ax] &&
				 x < f->box.off[ax] + f->box.len[ax];
			off += (x - f->box.off[ax]) * f->stride[ax] * esz;
		}
		if (!inside)
			continue;
		for (int ax = 0; ax < nlead; ax++) {
			o.box.off[ax] = (uint64_t)lead[ax];
			o.box.len[ax] = 1;
			o.stride[ax] = lead_stride[ax];
		}
		for (int ax = a0; ax < t->ndim; ax++) {
			o.box.off[oa + ax - a0] = f->box.off[ax];
			o.box.len[oa + ax - a0] = f->box.len[ax];
			o.stride[oa + ax - a0] = f->stride[ax];
		}
		if (a0 < t->ndim) {       /* clip the rows */
			uint64_t fo = f->box.off[a0], fe = fo + f->box.len[a0];
			uint64_t st = fo > p->lo ? fo : p->lo;
			uint64_t en = fe < p->hi ? fe : p->hi;

			if (st >= en)
				continue;
			off += (st - fo) * f->stride[a0] * esz;
			o.box.off[oa] = st - p->lo + p->at;
			o.box.len[oa] = en - st;
		}
		o.box.ndim = oa + t->ndim - a0;
		o.source = f->source;
		o.offset = off;
		err = rs_array_reserve(&fl->f, &fl->cap, fl->n + 1,
				       sizeof(*fl->f));
		if (err)
			return err;
		fl->f[fl->n++] = o;
	}
	return 0;
}

/* ---- the rows ------------------------------------------------------ */

typedef struct {
	rs_checkpoint *ck;
	const rs_family *f;
	const rs_map_dims *dims;
	rs_diag *d;
	const rs_map_row *user;         /* the user's rows, from user_path */
	size_t nuser;
	const char *user_path;
	rs_catalog out;
	name_set made;
	bool *taken, *dropped;
	unsigned *tier;                 /* the lowest tier of a built-in row
					 * that took each tensor */
} remap_ctx;

static bool user_row(const remap_ctx *c, const rs_map_row *r)
{
	return c->nuser && r >= c->user && r < c->user + c->nuser;
}

/* Row r as messages name it: its patterns, and whose it is. */
static void row_name(const remap_ctx *c, const rs_map_row *r, char *out,
		     size_t size)
{
	bool user = user_row(c, r);

	if (user)
		snprintf(out, size, "the names row \"%s\" <- \"%s\" of %s",
			 r->to ? r->to : "null", r->from[0],
			 c->user_path ? c->user_path : "-o rules=");
	else
		snprintf(out, size, "the row \"%s\" <- \"%s\" of family %s (%s)",
			 r->to ? r->to : "null", r->from[0], c->f->name,
			 c->f->info ? c->f->info->path : "built in");
}

/* Target `name` about to be made by row r from stored tensor `src`: 1
 * when it is new; 0 when it is made already and this is no clash - row r
 * made it and `again` allows that (a row gathering every layer into one
 * target meets each layer), or an earlier row made it from the same
 * tensor (a user's row overriding a built-in one).  A clash - two rows
 * from two tensors, or one row from two - is refused: the second maker
 * would hide the first one's tensor from the view. */
static int claim(remap_ctx *c, const rs_map_row *r, const char *name,
		 const char *src, bool again)
{
	const made_name *had = NULL;
	char a[1100], b[1100];
	int added = set_add(&c->made, name, r, src, &had);

	if (added != 0 || (again && had->row == r) ||
	    (had->row != r && strcmp(had->src, src) == 0))
		return added;
	row_name(c, had->row, a, sizeof(a));
	row_name(c, r, b, sizeof(b));
	if (had->row == r)
		rs_diag_add(c->d, "%s: %s would be made twice by %s: from %s and from %s; a target is made from one tensor (or one per layer when the pattern has \"#.\")",
			    c->ck->dir_path, name, a, had->src, src);
	else
		rs_diag_add(c->d, "%s: %s would be made twice: by %s from %s, and by %s from %s; a target is made once (a row with a null \"target\" leaves a stored tensor out)",
			    c->ck->dir_path, name, a, had->src, b, src);
	return -EINVAL;
}

static int name_err(remap_ctx *c, const char *what, int err)
{
	if (err == -ENAMETOOLONG || err == -EINVAL)
		rs_diag_add(c->d, "%s: %s: the name is too long or its pattern has more '#' than its source",
			    c->ck->dir_path, what);
	return err == -ENOMEM ? err : -EINVAL;
}

/* Target `name` of row r from one source reference per slot
 * (refs[slot * nsrc + k]): with `stack`, slots / nexp layers on its axis
 * 0; with nexp, nexp experts on the next (slot = layer * nexp + expert);
 * else one slot. */
static int emit(remap_ctx *c, const rs_map_row *r, const char *name,
		const src_ref *refs, int nsrc, size_t slots, bool stack,
		size_t nexp)
{
	rs_map_job j;
	frag_list fl = { 0 };
	uint64_t shape[RS_MAX_DIMS], covered, total;
	size_t idx, a, b;
	int ndim = 0, err = 0, nlead = stack + (nexp > 0);

	/* A tensor has one dtype: pieces of another would be read as this
	 * one's, running into the bytes stored after them. */
	for (size_t i = 1; i < slots * (size_t)nsrc && !err; i++)
		if (refs[i].t->dtype != refs[0].t->dtype) {
			rs_diag_add(c->d, "%s: %s would be made of %s (%s) and %s (%s), but a tensor has one dtype: store the model in one dtype",
				    c->ck->dir_path, name, refs[0].t->name,
				    rs_dtype_name(refs[0].t->dtype), refs[i].t->name,
				    rs_dtype_name(refs[i].t->dtype));
			err = -EINVAL;
		}
	for (size_t s = 0; s < slots && !err; s++) {
		memset(&j, 0, sizeof(j));
		j.op = r->op;
		j.dims = c->dims;
		j.nsrc = nsrc;
		for (int k = 0; k < nsrc; k++)
			j.ndim[k] = layer_shape(&refs[s * nsrc + k], j.shape[k]);
		err = rs_map_run(&j);
		if (err == -EINVAL)
			rs_diag_add(c->d, "%s: %s (from %s, %s): %s",
				    c->ck->dir_path, name, refs[s * nsrc].t->name,
				    rs_map_op_name(r->op), j.why);
		if (!err && s == 0) {
			ndim = j.out_ndim + nlead;
			if (stack)
				shape[0] = nexp ? slots / nexp : slots;
			if (nexp)
				shape[stack] = nexp;
			memcpy(shape + nlead, j.out_shape,
			       (size_t)j.out_ndim * sizeof(uint64_t));
		} else if (!err && (j.out_ndim + nlead != ndim ||
				    memcmp(shape + nlead, j.out_shape,
					   (size_t)j.out_ndim * sizeof(uint64_t)))) {
			rs_diag_add(c->d, "%s: %s: %s %zu's %s has another shape than the first's",
				    c->ck->dir_path, name, nexp ? "expert" : "layer",
				    s, refs[s * nsrc].t->name);
			err = -EINVAL;
		}
		for (size_t p = 0; p < j.npcs && !err; p++) {
			int64_t lead[2];
			uint64_t stride[2], numel = 1;
			int n = 0;

			for (int i = 0; i < j.out_ndim; i++)
				numel *= j.out_shape[i];
			if (stack) {
				stride[n] = numel * (nexp ? nexp : 1);
				lead[n++] = (int64_t)(nexp ? s / nexp : s);
			}
			if (nexp) {
				stride[n] = numel;
				lead[n++] = (int64_t)(s % nexp);
			}
			err = place(&fl, &refs[s * nsrc + j.pcs[p].k], &j.pcs[p],
				    lead, stride, n);
		}
		free(j.pcs);
	}
	if (!err)
		err = rs_catalog_add_fragments(&c->out, name, refs[0].t->dtype,
					       ndim, shape, fl.n, &idx);
	if (err == -EOVERFLOW || err == -E2BIG) {
		rs_diag_add(c->d, "%s: %s: too large", c->ck->dir_path, name);
		err = -EINVAL;
	}
	/* A user's row is named where its target's name matters later (a
	 * view file of that name, a layout that does not fit). */
	if (!err && user_row(c, r)) {
		char o[1100];

		row_name(c, r, o, sizeof(o));
		err = rs_catalog_set_origin(&c->out, idx, o);
	} else if (!err && refs[0].t->origin) {
		err = rs_catalog_set_origin(&c->out, idx, refs[0].t->origin);
	}
	if (!err) {
		rs_tensor *t = &c->out.tensors[idx];

		memcpy(t->frags, fl.f, fl.n * sizeof(*fl.f));
		/* A hole would read as zeros and an overlap as two answers. */
		err = rs_tensor_check_tiling(t, &a, &b, &covered, &total);
		if (err && err != -ENOMEM) {
			rs_diag_add(c->d, "%s: %s: its pieces do not tile it (%llu of %llu elements covered, or overlapping)",
				    c->ck->dir_path, name,
				    (unsigned long long)covered,
				    (unsigned long long)total);
			err = -EINVAL;
		}
		/* Targets for megatron-core (a stacking family) are split
		 * again by the layout, and a regular grid is what tells it a
		 * gated fc1's two halves ([gate; up] per rank); fused qkv
		 * pieces must not read as a grid, they are merged rows.  An
		 * HF model is one file: its tensors are merged, whatever
		 * chunks they came from. */
		if (!err && strcmp(c->f->to, "mcore") == 0 &&
		    r->op != RS_MAP_FUSE_QKV)
			rs_tensor_make_regular(t);
	}
	free(fl.f);
	return err;
}

/* The other sources of row r for a match of source 0 (nums as matched,
 * `stacked` as it was), into refs[1..] with layer `layer`. */
static int other_sources(remap_ctx *c, const rs_map_row *r, int nsrc,
			 char nums[2][24], int nnums, bool stacked,
			 int64_t layer, int64_t expert, src_ref *refs,
			 const char *target)
{
	for (int k = 1; k < nsrc; k++) {
		char name[NAME_SIZE];
		size_t i;
		int err = subst(r->from[k], stacked, nums, nnums, name,
				sizeof(name));

		if (err)
			return name_err(c, r->from[k], err);
		i = rs_bridge_find(c->ck, c->f, name);
		if (i == SIZE_MAX) {
			rs_diag_add(c->d, "%s: %s needs %s beside %s, and SOURCE has no such tensor",
				    c->ck->dir_path, target, name, refs[0].t->name);
			return -EINVAL;
		}
		c->taken[i] = true;
		refs[k] = (src_ref){ &c->ck->catalog.tensors[i], layer, expert };
	}
	return 0;
}

/* A per-layer source matched by a stacking row: every layer of it, by
 * the same row, into one target. */
static int gather_layers(remap_ctx *c, const rs_map_row *r, int nsrc,
			 char nums[2][24], int nnums, const char *target)
{
	const rs_catalog *cat = &c->ck->catalog;
	size_t *at = NULL, nl = 0;
	src_ref *refs = NULL;
	int err = 0;

	at = malloc(MAX_LAYERS * sizeof(*at));
	if (!at)
		return -ENOMEM;
	for (size_t i = 0; i < MAX_LAYERS; i++)
		at[i] = SIZE_MAX;
	for (size_t i = 0; i < cat->count; i++) {
		char n2[2][24];
		int nn = 0;
		unsigned long long l;
		char *end;

		if (c->dropped[i] ||
		    !rs_map_match(r->from[0], skip_prefix(c->f, cat->tensors[i].name),
				  false, n2, &nn) ||
		    nn != nnums || (nn == 2 && strcmp(n2[1], nums[1])))
			continue;
		l = strtoull(n2[0], &end, 10);
		if (l >= MAX_LAYERS || (n2[0][0] == '0' && n2[0][1])) {
			rs_diag_add(c->d, "%s: %s: layer %s is not a layer number below %u",
				    c->ck->dir_path, cat->tensors[i].name, n2[0],
				    MAX_LAYERS);
			err = -EINVAL;
			goto out;
		}
		at[l] = i;
		nl = l + 1 > nl ? l + 1 : nl;
	}
	refs = calloc(nl * (size_t)nsrc + 1, sizeof(*refs));
	if (!refs) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t l = 0; l < nl && !err; l++) {
		char n2[2][24];

		if (at[l] == SIZE_MAX) {
			rs_diag_add(c->d, "%s: %s: layer %zu of %s is missing, and the layers must run from 0",
				    c->ck->dir_path, target, l, r->from[0]);
			err = -EINVAL;
			break;
		}
		c->taken[at[l]] = true;
		refs[l * nsrc] = (src_ref){ &cat->tensors[at[l]], -1, -1 };
		snprintf(n2[0], sizeof(n2[0]), "%zu", l);
		memcpy(n2[1], nums[1], sizeof(n2[1]));
		err = other_sources(c, r, nsrc, n2, nnums, false, -1, -1,
				    &refs[l * nsrc], target);
	}
	if (!err)
		err = emit(c, r, target, refs, nsrc, nl, true, 0);
out:
	free(refs);
	free(at);
	return err;
}

/* A stacked source into a stacked target: the op on each layer. */
static int stacked_to_stacked(remap_ctx *c, const rs_map_row *r,
			      const rs_tensor *t, int nsrc, char nums[2][24],
			      int nnums)
{
	char name[NAME_SIZE];
	src_ref *refs;
	int err = subst(r->to, true, nums, nnums, name, sizeof(name));

	if (err)
		return name_err(c, r->to, err);
	err = claim(c, r, name, t->name, false);
	if (err <= 0)
		return err;
	err = 0;
	if (t->ndim < 1 || t->shape[0] > MAX_LAYERS) {
		rs_diag_add(c->d, "%s: %s: no layer axis", c->ck->dir_path, t->name);
		return -EINVAL;
	}
	refs = calloc(t->shape[0] * (size_t)nsrc + 1, sizeof(*refs));
	if (!refs)
		return -ENOMEM;
	for (uint64_t l = 0; l < t->shape[0] && !err; l++) {
		refs[l * nsrc] = (src_ref){ t, (int64_t)l, -1 };
		err = other_sources(c, r, nsrc, nums, nnums, true, (int64_t)l,
				    -1, &refs[l * nsrc], name);
	}
	if (!err)
		err = emit(c, r, name, refs, nsrc, t->shape[0], true, 0);
	free(refs);
	return err;
}

/* How many numbers ('#') a pattern holds. */
static int hashes(const char *pat)
{
	int n = 0;

	for (; *pat; pat++)
		n += *pat == '#';
	return n;
}

#define MAX_EXPERTS 65536u

/* A source into one target per layer (a stacked source's axis 0) and,
 * with `experts`, per expert (the next axis: megatron's
 * experts.linear_fc1 [L, E, ...], or [E, ...] per layer, into HF's
 * experts.<e>.gate_proj). */
static int split_slots(remap_ctx *c, const rs_map_row *r, const rs_tensor *t,
		       int nsrc, char nums[2][24], int nnums, bool stacked,
		       bool experts)
{
	uint64_t layers = stacked ? (t->ndim ? t->shape[0] : 0) : 1;
	uint64_t ne = !experts ? 1 : t->ndim > stacked ? t->shape[stacked] : 0;

	if (!layers || layers > MAX_LAYERS) {
		rs_diag_add(c->d, "%s: %s: no layer axis", c->ck->dir_path, t->name);
		return -EINVAL;
	}
	if (!ne || ne > MAX_EXPERTS) {
		rs_diag_add(c->d, "%s: %s: no %s axis of experts for %s",
			    c->ck->dir_path, t->name, stacked ? "second" : "first",
			    r->to);
		return -EINVAL;
	}
	for (uint64_t l = 0; l < layers; l++)
		for (uint64_t e = 0; e < ne; e++) {
			char vals[4][24], name[NAME_SIZE];
			src_ref refs[RS_MAP_MAX_FROM];
			int n = 0, err, added;

			if (stacked)
				snprintf(vals[n++], 24, "%llu", (unsigned long long)l);
			for (int k = 0; k < nnums; k++)
				memcpy(vals[n++], nums[k], 24);
			if (experts)
				snprintf(vals[n++], 24, "%llu", (unsigned long long)e);
			err = subst(r->to, false, vals, n, name, sizeof(name));
			if (err)
				return name_err(c, r->to, err);
			added = claim(c, r, name, t->name, false);
			if (added < 0)
				return added;
			if (!added)
				continue;
			refs[0] = (src_ref){ t, stacked ? (int64_t)l : -1,
					     experts ? (int64_t)e : -1 };
			err = other_sources(c, r, nsrc, nums, nnums, stacked,
					    refs[0].layer, refs[0].expert, refs,
					    name);
			if (!err)
				err = emit(c, r, name, refs, nsrc, 1, false, 0);
			if (err)
				return err;
		}
	return 0;
}

typedef struct {
	uint64_t l, e;
	size_t i;
} expert_at;

static int by_layer_expert(const void *a, const void *b)
{
	const expert_at *x = a, *y = b;

	if (x->l != y->l)
		return x->l < y->l ? -1 : 1;
	return x->e < y->e ? -1 : x->e > y->e;
}

static bool number(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (*end || (s[0] == '0' && s[1]) || v >= max)
		return false;
	*out = v;
	return true;
}

/* Sources one per layer and expert (HF's experts.<e>.gate_proj) into one
 * target of every layer, stacked [L, E, ...] (megatron's
 * experts.linear_fc1), or with `layer` (its number, else NULL) one of
 * that layer, [E, ...].  Every layer must hold experts 0..E-1. */
static int gather_experts(remap_ctx *c, const rs_map_row *r, int nsrc,
			  const char *target, const char *layer)
{
	const rs_catalog *cat = &c->ck->catalog;
	expert_at *at = calloc(cat->count + 1, sizeof(*at));
	src_ref *refs = NULL;
	size_t n = 0;
	uint64_t nl = 0, ne = 0;
	int err = 0;

	if (!at)
		return -ENOMEM;
	for (size_t i = 0; i < cat->count && !err; i++) {
		char n2[2][24];
		int nn = 0;

		if (c->dropped[i] ||
		    !rs_map_match(r->from[0], skip_prefix(c->f, cat->tensors[i].name),
				  false, n2, &nn) || nn != 2 ||
		    (layer && strcmp(n2[0], layer)))
			continue;
		if (!number(n2[0], MAX_LAYERS, &at[n].l) ||
		    !number(n2[1], MAX_EXPERTS, &at[n].e)) {
			rs_diag_add(c->d, "%s: %s: not a layer below %u and an expert below %u",
				    c->ck->dir_path, cat->tensors[i].name,
				    MAX_LAYERS, MAX_EXPERTS);
			err = -EINVAL;
			break;
		}
		at[n].i = i;
		nl = at[n].l + 1 > nl ? at[n].l + 1 : nl;
		ne = at[n].e + 1 > ne ? at[n].e + 1 : ne;
		n++;
	}
	qsort(at, n, sizeof(*at), by_layer_expert);
	/* one layer: its number is not a place in a stack */
	for (size_t k = 0; layer && k < n; k++)
		at[k].l = 0;
	if (layer)
		nl = n ? 1 : 0;
	/* the grid, whole: n == nl * ne, and each (l, e) in order once */
	for (size_t k = 0; k < n && !err; k++)
		if (at[k].l != k / ne || at[k].e != k % ne) {
			rs_diag_add(c->d, "%s: %s: layer %llu has no expert %llu of %s (every layer holds experts 0 to %llu)",
				    c->ck->dir_path, target,
				    (unsigned long long)(k / ne),
				    (unsigned long long)(k % ne), r->from[0],
				    (unsigned long long)(ne - 1));
			err = -EINVAL;
		}
	if (!err && n != nl * ne) {
		rs_diag_add(c->d, "%s: %s: layer %llu has no expert %llu of %s",
			    c->ck->dir_path, target, (unsigned long long)(n / ne),
			    (unsigned long long)(n % ne), r->from[0]);
		err = -EINVAL;
	}
	if (!err && !(refs = calloc(n * (size_t)nsrc + 1, sizeof(*refs))))
		err = -ENOMEM;
	for (size_t k = 0; k < n && !err; k++) {
		char n2[2][24];

		c->taken[at[k].i] = true;
		refs[k * nsrc] = (src_ref){ &cat->tensors[at[k].i], -1, -1 };
		if (layer)
			snprintf(n2[0], 24, "%s", layer);
		else
			snprintf(n2[0], 24, "%llu", (unsigned long long)at[k].l);
		snprintf(n2[1], 24, "%llu", (unsigned long long)at[k].e);
		err = other_sources(c, r, nsrc, n2, 2, false, -1, -1,
				    &refs[k * nsrc], target);
	}
	if (!err)
		err = emit(c, r, target, refs, nsrc, n, !layer, ne);
	free(refs);
	free(at);
	return err;
}

/* Row r on source tensor i (matched: nums, stacked). */
static int apply_match(remap_ctx *c, const rs_map_row *r, size_t i,
		       char nums[2][24], int nnums, bool stacked)
{
	const rs_tensor *t = &c->ck->catalog.tensors[i];
	int nsrc = rs_map_op_sources(r->op);
	bool has_layer = strstr(r->to, "#.") != NULL;
	char name[NAME_SIZE];
	src_ref refs[RS_MAP_MAX_FROM];
	int err, added;

	/* the target numbers one more thing than the source: its experts */
	if ((stacked || nnums >= 1) && hashes(r->to) == nnums + stacked + 1)
		return split_slots(c, r, t, nsrc, nums, nnums, stacked, true);
	/* the source numbers its experts, the stacked target does not */
	if (!stacked && nnums == 2 && hashes(r->to) == 1 && has_layer) {
		err = subst(r->to, c->f->stack, nums, c->f->stack ? 0 : 1, name,
			    sizeof(name));
		if (err)
			return name_err(c, r->to, err);
		added = claim(c, r, name, t->name, true);
		if (added <= 0)
			return added;
		return gather_experts(c, r, nsrc, name,
				      c->f->stack ? NULL : nums[0]);
	}
	if (stacked && c->f->stack && has_layer)
		return stacked_to_stacked(c, r, t, nsrc, nums, nnums);
	if (!has_layer || (!stacked && !c->f->stack)) {
		/* one target, layer for layer */
		err = subst(r->to, stacked, nums, nnums, name, sizeof(name));
		if (err)
			return name_err(c, r->to, err);
		added = claim(c, r, name, t->name, false);
		if (added <= 0)
			return added;
		refs[0] = (src_ref){ t, -1, -1 };
		err = other_sources(c, r, nsrc, nums, nnums, stacked, -1, -1,
				    refs, name);
		return err ? err : emit(c, r, name, refs, nsrc, 1, false, 0);
	}
	if (!stacked) {
		/* per-layer sources into one stacked target */
		err = subst(r->to, true, nums + 1, nnums - 1, name, sizeof(name));
		if (err)
			return name_err(c, r->to, err);
		added = claim(c, r, name, t->name, true);
		if (added <= 0)
			return added;
		return gather_layers(c, r, nsrc, nums, nnums, name);
	}
	/* a stacked source into one target per layer */
	return split_slots(c, r, t, nsrc, nums, nnums, true, false);
}

static bool row_applies(const rs_map_row *r, const rs_map_dims *dims)
{
	switch (r->when) {
	case RS_WHEN_TIED:
		return dims->tied;
	case RS_WHEN_UNTIED:
		return !dims->tied;
	case RS_WHEN_PACKED:
		return dims->packed;
	case RS_WHEN_PER_EXPERT:
		return !dims->packed;
	default:
		return true;
	}
}

static int apply_row(remap_ctx *c, const rs_map_row *r)
{
	const rs_catalog *cat = &c->ck->catalog;

	if (!row_applies(r, c->dims))
		return 0;
	for (size_t i = 0; i < cat->count; i++) {
		const char *name = skip_prefix(c->f, cat->tensors[i].name);
		char nums[2][24];
		int nn = 0, err;
		bool stacked = false;

		if (c->dropped[i] || (!user_row(c, r) && c->tier[i] < r->tier))
			continue;
		if (!rs_map_match(r->from[0], name, false, nums, &nn)) {
			nn = 0;
			if (cat->tensors[i].ndim < 1 ||
			    !rs_map_match(r->from[0], name, true, nums, &nn))
				continue;
			stacked = true;
		}
		c->taken[i] = true;
		if (!user_row(c, r) && r->tier < c->tier[i])
			c->tier[i] = r->tier;
		if (!r->to) {
			c->dropped[i] = true;
			continue;
		}
		err = apply_match(c, r, i, nums, nn, stacked);
		if (err)
			return err;
	}
	return 0;
}

int rs_remap(rs_checkpoint *ck, const rs_family *f, const rs_map_row *user,
	     size_t nuser, const char *user_path, const rs_map_dims *dims,
	     rs_diag *d)
{
	remap_ctx c = { ck, f, dims, d, user, nuser, user_path, { 0 }, { 0 },
			NULL, NULL, NULL };
	size_t n = ck->catalog.count, missing = 0;
	int err = 0;

	rs_catalog_init(&c.out);
	c.taken = calloc(n + 1, sizeof(bool));
	c.dropped = calloc(n + 1, sizeof(bool));
	c.tier = malloc((n + 1) * sizeof(unsigned));
	if (!c.taken || !c.dropped || !c.tier) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		c.tier[i] = ~0u;
	for (size_t i = 0; i < nuser && !err; i++)
		err = apply_row(&c, &user[i]);
	for (const rs_map_row *r = f->rows; r->from[0] && !err; r++)
		err = apply_row(&c, r);
	for (size_t i = 0; i < n && !err; i++) {
		if (c.taken[i])
			continue;
		/* the first few: one missing row usually misses every layer */
		if (missing++ < 8)
			rs_diag_add(d, "%s: %s has no %s name in family %s (%s; the \"names\" of a -o rules= file can add one)",
				    ck->dir_path, ck->catalog.tensors[i].name,
				    f->to, f->name,
				    f->info ? f->info->path : "built in");
	}
	if (!err && missing)
		err = -EINVAL;
	if (!err) {
		rs_catalog_free(&ck->catalog);
		ck->catalog = c.out;
		rs_catalog_init(&c.out);
	}
out:
	rs_catalog_free(&c.out);
	set_free(&c.made);
	free(c.taken);
	free(c.dropped);
	free(c.tier);
	return err;
}
