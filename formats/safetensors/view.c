/* safetensors view builder: catalog + layout -> one .safetensors file per
 * target TP rank (names and contents: formats/safetensors/safetensors.h). */
#include "formats/safetensors/safetensors.h"
#include "formats/safetensors/safetensors_int.h"
#include "formats/codec/utf8.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"
#include "planner/names.h"

/* Pieces one shard may be cut into: with a multiplier m > 1 and axes in
 * front of the TP axis (a layer-stacked gated fc1), rank r's [W_r; V_r]
 * interleaves per layer, one plan per (layer, piece). */
#define MAX_PIECES (1u << 16)

/* A growing text; `err` sticks at the first failure. */
typedef struct {
	char *s;
	size_t len, cap;
	int err;
} text;

static void put(text *b, const char *s, size_t n)
{
	if (b->err)
		return;
	b->err = rs_array_reserve(&b->s, &b->cap, b->len + n + 1, 1);
	if (b->err)
		return;
	memcpy(b->s + b->len, s, n);
	b->len += n;
}

static void puts_(text *b, const char *s)
{
	put(b, s, strlen(s));
}

static void put_u64(text *b, uint64_t v)
{
	char num[24];

	put(b, num, (size_t)snprintf(num, sizeof(num), "%llu",
				     (unsigned long long)v));
}

/* A JSON string as serde_json writes it (the reference writer): `"` and
 * `\` escaped, control bytes as \b \t \n \f \r or \u00xx, the rest - UTF-8
 * included - as it is. */
static void put_str(text *b, const char *s)
{
	put(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];

		switch (c) {
		case '"': puts_(b, "\\\""); continue;
		case '\\': puts_(b, "\\\\"); continue;
		case '\b': puts_(b, "\\b"); continue;
		case '\t': puts_(b, "\\t"); continue;
		case '\n': puts_(b, "\\n"); continue;
		case '\f': puts_(b, "\\f"); continue;
		case '\r': puts_(b, "\\r"); continue;
		}
		if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			puts_(b, esc);
		} else {
			put(b, s, 1);
		}
	}
	put(b, "\"", 1);
}

/* The reference writer orders tensors by its Dtype enum, descending (so
 * every tensor's data is aligned to its element size), then by name. */
static int dtype_order(rs_dtype t)
{
	switch (t) {
	case RS_DTYPE_BOOL: return 0;
	case RS_DTYPE_U8: return 1;
	case RS_DTYPE_I8: return 2;
	case RS_DTYPE_F8E5M2: return 3;
	case RS_DTYPE_F8E4M3: return 4;
	case RS_DTYPE_I16: return 5;
	case RS_DTYPE_F16: return 7;
	case RS_DTYPE_BF16: return 8;
	case RS_DTYPE_I32: return 9;
	case RS_DTYPE_F32: return 11;
	case RS_DTYPE_F64: return 12;
	case RS_DTYPE_I64: return 13;
	default: return -1;
	}
}

/* One tensor of every rank's file: its shard's shape and data range
 * (the same for every rank: TP splits are even). */
typedef struct {
	size_t tensor;
	const char *name;
	int order;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t begin, end;
} member;

typedef struct {
	const rs_checkpoint *ck;
	const rs_layout *l;
	rs_vtree *t;
	rs_diag *d;
	const char *const *names;       /* NULL: the catalog's */
	member *members;
	size_t nmembers;
} builder;

static int cmp_member(const void *a, const void *b)
{
	const member *x = a, *y = b;

	if (x->order != y->order)
		return x->order > y->order ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Shapes, order and data ranges of every tensor. */
static int plan_members(builder *b)
{
	const rs_catalog *c = &b->ck->catalog;
	uint64_t at = 0;

	b->members = calloc(c->count + 1, sizeof(member));
	if (!b->members)
		return -ENOMEM;
	for (size_t i = 0; i < c->count; i++) {
		const rs_tensor *ten = &c->tensors[i];
		const rs_target *tg = &b->l->targets[i];
		member *m;
		int a = tg->axis;
		uint64_t numel, bytes, parts;

		if (b->names && !b->names[i])
			continue;       /* left out of this view */
		m = &b->members[b->nmembers++];
		m->tensor = i;
		m->name = b->names ? b->names[i] : ten->name;
		m->order = dtype_order(tg->dtype);
		if (m->order < 0 || !rs_safetensors_dtype_name(tg->dtype)) {
			rs_diag_add(b->d, "%s: dtype %s has no safetensors spelling",
				    ten->name, rs_dtype_name(tg->dtype));
			return -EINVAL;
		}
		if (!rs_utf8_valid(m->name, strlen(m->name), false)) {
			rs_diag_add(b->d, "%s: tensor name \"%s\" is not valid UTF-8; a safetensors header cannot hold it",
				    b->ck->dir_path, m->name);
			return -EINVAL;
		}
		if (strcmp(m->name, "__metadata__") == 0) {
			rs_diag_add(b->d, "%s: a tensor named \"__metadata__\" would be read as the safetensors header's metadata",
				    b->ck->dir_path);
			return -EINVAL;
		}
		memcpy(m->shape, tg->shape, sizeof(m->shape));
		if (a >= 0 && tg->shape[a] > 0) {
			m->shape[a] = tg->chunk[a] * tg->multiplier;
			/* The layout made the split even; a shard that does
			 * not tile the axis would lose rows. */
			if (!rs_mul_u64(m->shape[a], b->l->tp, &parts) ||
			    parts != tg->shape[a]) {
				rs_diag_add(b->d, "%s: axis %d of size %llu does not split into %u shards of %llu",
					    ten->name, a,
					    (unsigned long long)tg->shape[a],
					    b->l->tp,
					    (unsigned long long)m->shape[a]);
				return -EINVAL;
			}
		}
		/* Plans are made in the stored dtype, the file holds the
		 * view's: neither size may overflow. */
		if (!rs_product(m->shape, ten->ndim, &numel) ||
		    !rs_mul_u64(numel, rs_dtype_size(ten->dtype), &bytes) ||
		    !rs_mul_u64(numel, rs_dtype_size(tg->dtype), &bytes)) {
			rs_diag_add(b->d, "%s: shard size overflows", ten->name);
			return -EINVAL;
		}
		m->end = bytes;         /* the length, until sorted */
	}
	if (b->nmembers > 1)
		qsort(b->members, b->nmembers, sizeof(member), cmp_member);
	for (size_t i = 0; i < b->nmembers; i++) {
		member *m = &b->members[i];
		uint64_t len = m->end;

		m->begin = at;
		if (!rs_add_u64(at, len, &m->end)) {
			rs_diag_add(b->d, "%s: a safetensors file of every tensor would be over 2^64 bytes",
				    b->ck->dir_path);
			return -EINVAL;
		}
		at = m->end;
	}
	return 0;
}

/* A header cannot hold one key twice (the catalogs of other formats keep
 * names unique; a safetensors header's loaders would keep one). */
static int check_unique(builder *b)
{
	size_t dup;
	int err = rs_names_first_dup(b->members, b->nmembers, sizeof(member),
				     offsetof(member, name), &dup);

	if (!err && dup != SIZE_MAX) {
		rs_diag_add(b->d, "%s: two tensors are named \"%s\"",
			    b->ck->dir_path, b->members[dup].name);
		err = -EINVAL;
	}
	return err;
}

/* The 8-byte length and the JSON header, as the reference writer lays
 * them out: compact, "__metadata__" first, tensors in data order, spaces
 * up to a multiple of 8 so the data starts aligned. */
static int header(builder *b, text *h, size_t from, size_t to)
{
	uint64_t base = from < to ? b->members[from].begin : 0;
	const rs_safetensors_meta *meta =
		b->ck->format == &rs_safetensors_format ? b->ck->extra : NULL;
	bool has_format = false;
	uint64_t n;

	put(h, "\0\0\0\0\0\0\0\0", 8);
	puts_(h, "{\"__metadata__\":{");
	for (size_t i = 0; meta && i < meta->n; i++) {
		if (i)
			puts_(h, ",");
		put_str(h, meta->pairs[i].key);
		puts_(h, ":");
		put_str(h, meta->pairs[i].value);
		has_format |= strcmp(meta->pairs[i].key, "format") == 0;
	}
	/* transformers refuses a file whose __metadata__ has no "format"
	 * (pt, tf, flax or mlx). */
	if (!has_format)
		puts_(h, meta && meta->n ? ",\"format\":\"pt\"" : "\"format\":\"pt\"");
	puts_(h, "}");
	for (size_t i = from; i < to; i++) {
		const member *m = &b->members[i];
		const rs_tensor *ten = &b->ck->catalog.tensors[m->tensor];

		puts_(h, ",");
		put_str(h, m->name);
		puts_(h, ":{\"dtype\":\"");
		puts_(h, rs_safetensors_dtype_name(b->l->targets[m->tensor].dtype));
		puts_(h, "\",\"shape\":[");
		for (int k = 0; k < ten->ndim; k++) {
			if (k)
				puts_(h, ",");
			put_u64(h, m->shape[k]);
		}
		puts_(h, "],\"data_offsets\":[");
		put_u64(h, m->begin - base);
		puts_(h, ",");
		put_u64(h, m->end - base);
		puts_(h, "]}");
	}
	puts_(h, "}");
	while (!h->err && (h->len - 8) % 8)
		puts_(h, " ");
	if (h->err)
		return h->err;
	n = h->len - 8;
	if (n > RS_SAFETENSORS_HEADER_MAX) {
		rs_diag_add(b->d, "%s: the safetensors header would be %llu bytes, over the %llu loaders accept",
			    b->ck->dir_path, (unsigned long long)n,
			    RS_SAFETENSORS_HEADER_MAX);
		return -EINVAL;
	}
	for (int i = 0; i < 8; i++)
		h->s[i] = (char)(n >> (8 * i) & 0xff);
	return 0;
}

static int append_box(builder *b, uint32_t file, const rs_tensor *ten,
		      const rs_target *tg, const rs_box *box)
{
	rs_plan plan;
	int err = rs_plan_box(ten, box, box->len, &plan);

	if (!err)
		err = rs_vtree_append_plan(b->t, file, &plan, ten->dtype,
					   tg->dtype);
	return err;
}

/* Rank r's shard of a tensor: the whole tensor when it is not split;
 * else its chunks r, r+tp, ... along the TP axis (target grid), in
 * order - one box when there is one chunk per rank, else one box per
 * chunk and position along the axes in front of the TP axis. */
static int append_shard(builder *b, uint32_t file, const member *m,
			uint32_t rank)
{
	const rs_tensor *ten = &b->ck->catalog.tensors[m->tensor];
	const rs_target *tg = &b->l->targets[m->tensor];
	uint64_t idx[RS_MAX_DIMS] = { 0 }, outer = 1, c;
	rs_box box = { .ndim = ten->ndim };
	int a = tg->axis, err;

	memcpy(box.len, tg->shape, sizeof(box.len));
	if (m->end == m->begin)
		return 0;       /* empty: nothing to serve */
	if (a < 0 || tg->shape[a] == 0)
		return append_box(b, file, ten, tg, &box);
	c = tg->chunk[a];
	box.len[a] = c;
	if (tg->multiplier == 1) {
		box.off[a] = rs_target_piece_offset(tg, b->l->tp, rank, 0);
		return append_box(b, file, ten, tg, &box);
	}
	for (int k = 0; k < a; k++) {
		outer *= tg->shape[k];   /* <= numel: no overflow */
		box.len[k] = 1;
	}
	if (outer > MAX_PIECES / tg->multiplier) {
		rs_diag_add(b->d, "%s: its shards interleave in %llu x %u pieces along axis %d; too many for a safetensors view",
			    ten->name, (unsigned long long)outer,
			    tg->multiplier, a);
		return -EINVAL;
	}
	do {
		memcpy(box.off, idx, (size_t)a * sizeof(uint64_t));
		for (uint32_t j = 0; j < tg->multiplier; j++) {
			box.off[a] = rs_target_piece_offset(tg, b->l->tp,
							    rank, j);
			err = append_box(b, file, ten, tg, &box);
			if (err)
				return err;
		}
	} while (a > 0 && rs_grid_next(idx, tg->shape, a));
	return 0;
}

static int cmp_member_name(const void *a, const void *b)
{
	return strcmp((*(const member *const *)a)->name,
		      (*(const member *const *)b)->name);
}

/* One file of members [from, to) at the top of the tree. */
static int write_file(builder *b, const char *name, size_t from, size_t to,
		      uint32_t rank)
{
	text h = { 0 };
	uint32_t file;
	int err = header(b, &h, from, to);

	if (!err)
		err = rs_vtree_add_file(b->t, 0, name, b->ck->root_mtime, &file);
	if (err == -EEXIST) {
		rs_diag_add(b->d, "%s/%s: the %s view writes a file of this name itself",
			    b->ck->dir_path, name,
			    b->names ? "hf" : "safetensors");
		err = -EINVAL;
	}
	if (!err)
		err = rs_vtree_append_literal(b->t, file, h.s, h.len);
	for (size_t i = from; i < to && !err; i++)
		err = append_shard(b, file, &b->members[i], rank);
	free(h.s);
	return err;
}

/* HF's sharded form: model-0000k-of-0000n.safetensors of at most
 * shard_max data bytes each (a larger tensor alone in its file), members
 * in the writer's order, and model.safetensors.index.json mapping every
 * name to its file. */
static int write_sharded(builder *b, uint64_t shard_max)
{
	size_t *first = calloc(b->nmembers + 1, sizeof(size_t)), nfiles = 0;
	const member **byname = calloc(b->nmembers + 1, sizeof(*byname));
	text idx = { 0 };
	uint32_t file;
	int err = 0;

	if (!first || !byname) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < b->nmembers; i++) {
		uint64_t start = nfiles ? b->members[first[nfiles - 1]].begin : 0;

		if (i == 0 || b->members[i].end - start > shard_max)
			first[nfiles++] = i;
	}
	first[nfiles] = b->nmembers;
	if (nfiles > 99999) {
		rs_diag_add(b->d, "%s: the hf view would need %zu files",
			    b->ck->dir_path, nfiles);
		err = -EINVAL;
		goto out;
	}
	puts_(&idx, "{\n  \"metadata\": {\n    \"total_size\": ");
	put_u64(&idx, b->nmembers ? b->members[b->nmembers - 1].end : 0);
	puts_(&idx, "\n  },\n  \"weight_map\": {");
	for (size_t k = 0; k < nfiles && !err; k++) {
		char name[64];

		snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors",
			 k + 1, nfiles);
		err = write_file(b, name, first[k], first[k + 1], 0);
	}
	/* weight_map sorted by name, as transformers writes it */
	for (size_t i = 0; i < b->nmembers; i++)
		byname[i] = &b->members[i];
	if (b->nmembers > 1)
		qsort(byname, b->nmembers, sizeof(*byname), cmp_member_name);
	for (size_t n = 0; n < b->nmembers && !err; n++) {
		size_t at = (size_t)(byname[n] - b->members), k = 0;
		char name[64];

		while (first[k + 1] <= at)
			k++;
		snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors",
			 k + 1, nfiles);
		puts_(&idx, n ? ",\n    " : "\n    ");
		put_str(&idx, byname[n]->name);
		puts_(&idx, ": ");
		put_str(&idx, name);
	}
	puts_(&idx, "\n  }\n}\n");
	err = err ? err : idx.err;
	if (!err)
		err = rs_vtree_add_file(b->t, 0, "model.safetensors.index.json",
					b->ck->root_mtime, &file);
	if (err == -EEXIST) {
		rs_diag_add(b->d, "%s/model.safetensors.index.json: the hf view writes a file of this name itself",
			    b->ck->dir_path);
		err = -EINVAL;
	}
	if (!err)
		err = rs_vtree_append_literal(b->t, file, idx.s, idx.len);
out:
	free(idx.s);
	free(byname);
	free(first);
	return err;
}

int rs_safetensors_write(const rs_checkpoint *ck, const rs_layout *l,
			 rs_vtree *t, const char *const *names,
			 uint64_t shard_max, rs_diag *d)
{
	builder b = { .ck = ck, .l = l, .t = t, .d = d, .names = names };
	int err = rs_checkpoint_carry(ck, t);

	if (!err)
		err = plan_members(&b);
	if (!err)
		err = check_unique(&b);
	if (!err && l->tp == 1 && shard_max && b.nmembers &&
	    b.members[b.nmembers - 1].end > shard_max)
		err = write_sharded(&b, shard_max);
	else if (!err && l->tp == 1)
		err = write_file(&b, "model.safetensors", 0, b.nmembers, 0);
	for (uint32_t r = 0; l->tp > 1 && r < l->tp && !err; r++) {
		char name[64];

		snprintf(name, sizeof(name), "model-rank-%u-part-0.safetensors",
			 r);
		err = write_file(&b, name, 0, b.nmembers, r);
	}
	free(b.members);
	return err;
}

int rs_safetensors_build_view(const rs_checkpoint *ck, const rs_layout *l,
			      rs_vtree *t, rs_diag *d)
{
	/* A rank file holds every expert, cut like the dense weights: right
	 * only when expert TP is TP and experts are not spread over ranks. */
	if (l->experts && (l->ep > 1 || l->etp != l->tp)) {
		rs_diag_add(d, "%s: a safetensors view holds every expert in each TP rank's file; ep=%u etp=%u (other than ep=1, etp=tp=%u) is offered by the torch_dist, zarr and megatron views",
			    ck->dir_path, l->ep, l->etp, l->tp);
		return -EINVAL;
	}
	return rs_safetensors_write(ck, l, t, NULL, 0, d);
}
