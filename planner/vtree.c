#include "planner/vtree.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

/* Room for one more element in an array indexed by uint32_t.  A node's
 * first element gets room for exactly one, later ones double: most files
 * are one segment reading one source (every chunk file of a zarr view,
 * 1.8 x 10^5 of them for DeepSeek-V3 with its optimizer states), and
 * rs_array_reserve's first 8 would be 280 bytes of unused segments each. */
static int grow(void *arr, size_t *cap, uint32_t count, size_t size)
{
	void **p = arr;
	void *one;

	if (count == UINT32_MAX)
		return -E2BIG;
	if (*cap)
		return rs_array_reserve(arr, cap, (size_t)count + 1, size);
	one = realloc(*p, size);
	if (!one)
		return -ENOMEM;
	*p = one;
	*cap = 1;
	return 0;
}

int rs_vtree_init(rs_vtree *t, struct timespec root_mtime)
{
	memset(t, 0, sizeof(*t));
	t->nodes = calloc(64, sizeof(rs_vnode));
	if (!t->nodes)
		return -ENOMEM;
	t->cap = 64;
	t->count = 1;
	t->nodes[0].name = strdup("");
	t->nodes[0].is_dir = true;
	t->nodes[0].mtime = root_mtime;
	return t->nodes[0].name ? 0 : -ENOMEM;
}

void rs_vtree_free(rs_vtree *t)
{
	for (uint32_t i = 0; i < t->count; i++) {
		rs_vnode *n = &t->nodes[i];

		for (uint32_t s = 0; s < n->nsegs; s++)
			if (n->segs[s].kind == RS_SEG_LITERAL &&
			    !n->segs[s].kept)
				free((void *)n->segs[s].u.bytes);
		free(n->name);
		free(n->children);
		free(n->segs);
		free(n->sources);
	}
	for (uint64_t c = 0; c < t->nchunks; c++) {
		rs_plan_free(&t->chunks[c]->plan);
		free(t->chunks[c]->sources);
		free(t->chunks[c]);
	}
	for (size_t k = 0; k < t->nkept; k++)
		free(t->kept[k]);
	free(t->kept);
	free(t->chunks);
	free(t->nodes);
	free(t->slots);
	memset(t, 0, sizeof(*t));
}

static uint64_t name_hash(uint32_t dir, const char *name)
{
	uint64_t h = 1469598103934665603ull ^ dir;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h ^ (h >> 31);
}

static void index_insert(uint32_t *slots, uint64_t mask, const rs_vtree *t,
			 uint32_t node)
{
	uint64_t s = name_hash(t->nodes[node].parent, t->nodes[node].name) &
		     mask;

	while (slots[s])
		s = (s + 1) & mask;
	slots[s] = node + 1;
}

/* Room in the index for one more node (nodes 1 .. count). */
static int index_reserve(rs_vtree *t)
{
	uint64_t size = t->slots ? t->mask + 1 : 64;
	uint32_t *slots;

	if (t->slots && ((uint64_t)t->count + 1) * 2 <= size)
		return 0;
	while (((uint64_t)t->count + 1) * 2 > size)
		size *= 2;
	slots = calloc(size, sizeof(uint32_t));
	if (!slots)
		return -ENOMEM;
	for (uint32_t i = 1; i < t->count; i++)
		index_insert(slots, size - 1, t, i);
	free(t->slots);
	t->slots = slots;
	t->mask = size - 1;
	return 0;
}

int rs_vtree_lookup(const rs_vtree *t, uint32_t dir, const char *name,
		    uint32_t *index)
{
	if (!t->slots)
		return -ENOENT;
	for (uint64_t s = name_hash(dir, name) & t->mask; t->slots[s];
	     s = (s + 1) & t->mask) {
		const rs_vnode *n = &t->nodes[t->slots[s] - 1];

		if (n->parent == dir && strcmp(n->name, name) == 0) {
			*index = t->slots[s] - 1;
			return 0;
		}
	}
	return -ENOENT;
}

static int add_node(rs_vtree *t, uint32_t parent, const char *name,
		    bool is_dir, struct timespec mtime, uint32_t *index)
{
	rs_vnode *n;
	uint32_t dummy;
	int err;

	if (rs_vtree_lookup(t, parent, name, &dummy) == 0) {
		t->clash = dummy + 1;
		return -EEXIST;
	}
	err = grow(&t->nodes, &t->cap, t->count, sizeof(rs_vnode));
	if (err)
		return err;
	err = grow(&t->nodes[parent].children,
		   &t->nodes[parent].cap_children, t->nodes[parent].nchildren,
		   sizeof(uint32_t));
	if (err)
		return err;
	err = index_reserve(t);
	if (err)
		return err;
	n = &t->nodes[t->count];
	memset(n, 0, sizeof(*n));
	n->name = strdup(name);
	if (!n->name)
		return -ENOMEM;
	n->parent = parent;
	n->is_dir = is_dir;
	n->mtime = mtime;
	t->nodes[parent].children[t->nodes[parent].nchildren++] = t->count;
	index_insert(t->slots, t->mask, t, t->count);
	*index = t->count++;
	return 0;
}

int rs_vtree_add_dir(rs_vtree *t, uint32_t parent, const char *name,
		     struct timespec mtime, uint32_t *index)
{
	return add_node(t, parent, name, true, mtime, index);
}

int rs_vtree_add_file(rs_vtree *t, uint32_t parent, const char *name,
		      struct timespec mtime, uint32_t *index)
{
	return add_node(t, parent, name, false, mtime, index);
}

void rs_vtree_path(const rs_vtree *t, uint32_t node, char *out, size_t size)
{
	uint32_t chain[64];
	size_t depth = 0, at = 0;

	if (!size)
		return;
	out[0] = 0;
	for (; node && node < t->count && depth < 64; node = t->nodes[node].parent)
		chain[depth++] = node;
	while (depth-- > 0 && at + 1 < size) {
		int n = snprintf(out + at, size - at, "%s%s", at ? "/" : "",
				 t->nodes[chain[depth]].name);

		if (n < 0)
			break;
		at += (size_t)n;
	}
}

int rs_vtree_nest(rs_vtree *t, const char *name, struct timespec mtime,
		  uint32_t *dir)
{
	rs_vnode *root, *d;
	uint32_t *moved;
	uint32_t n;
	int err;

	err = rs_vtree_add_dir(t, 0, name, mtime, dir);
	if (err)
		return err;
	root = &t->nodes[0];
	d = &t->nodes[*dir];
	n = root->nchildren - 1;        /* the new directory is the last */
	moved = malloc((n ? n : 1) * sizeof(uint32_t));
	if (!moved)
		return -ENOMEM;
	memcpy(moved, root->children, n * sizeof(uint32_t));
	for (uint32_t i = 0; i < n; i++)
		t->nodes[moved[i]].parent = *dir;
	free(d->children);
	d->children = moved;
	d->nchildren = n;
	d->cap_children = n ? n : 1;
	root->children[0] = *dir;
	root->nchildren = 1;
	/* (parent, name) keys changed: index every node again. */
	memset(t->slots, 0, (t->mask + 1) * sizeof(uint32_t));
	for (uint32_t i = 1; i < t->count; i++)
		index_insert(t->slots, t->mask, t, i);
	return 0;
}

/* Adds `source` to the sorted, distinct list v[0, *n) (capacity *cap). */
static int insert_source(uint32_t **v, uint32_t *n, size_t *cap,
			 uint32_t source)
{
	uint32_t lo = 0, hi = *n;
	int err;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if ((*v)[mid] == source)
			return 0;
		if ((*v)[mid] < source)
			lo = mid + 1;
		else
			hi = mid;
	}
	err = grow(v, cap, *n, sizeof(uint32_t));
	if (err)
		return err;
	memmove(&(*v)[lo + 1], &(*v)[lo], (*n - lo) * sizeof(uint32_t));
	(*v)[lo] = source;
	(*n)++;
	return 0;
}

/* Records that `file` reads `source`. */
static int note_source(rs_vnode *n, uint32_t source)
{
	return insert_source(&n->sources, &n->nsources, &n->cap_sources,
			     source);
}


static int append(rs_vtree *t, uint32_t file, rs_segment seg)
{
	rs_vnode *n = &t->nodes[file];
	int err;

	if (seg.length == 0)
		return 0;
	if (!rs_add_u64(n->size, seg.length, &seg.offset))
		return -EOVERFLOW;
	err = grow(&n->segs, &n->cap_segs, n->nsegs,
		   sizeof(rs_segment));
	if (err)
		return err;
	seg.offset = n->size;
	n->segs[n->nsegs++] = seg;
	n->size += seg.length;
	return 0;
}

int rs_vtree_append_literal(rs_vtree *t, uint32_t file, const void *bytes,
			    uint64_t len)
{
	rs_segment seg = { .kind = RS_SEG_LITERAL, .length = len };
	uint8_t *copy;
	int err;

	if (len == 0)
		return 0;
	copy = malloc(len);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, bytes, len);
	seg.u.bytes = copy;
	err = append(t, file, seg);
	if (err)
		free(copy);
	return err;
}

int rs_vtree_keep(rs_vtree *t, void *buf)
{
	int err = rs_array_reserve(&t->kept, &t->cap_kept, t->nkept + 1,
				   sizeof(void *));

	if (err)
		return err;
	t->kept[t->nkept++] = buf;
	return 0;
}

int rs_vtree_append_kept(rs_vtree *t, uint32_t file, const void *bytes,
			 uint64_t len)
{
	rs_segment seg = { .kind = RS_SEG_LITERAL, .kept = true,
			   .length = len, .u.bytes = bytes };

	return append(t, file, seg);
}

int rs_vtree_append_zero(rs_vtree *t, uint32_t file, uint64_t len)
{
	rs_segment seg = { .kind = RS_SEG_ZERO, .length = len };

	return append(t, file, seg);
}

int rs_vtree_append_source(rs_vtree *t, uint32_t file, uint32_t source,
			   uint64_t offset, uint64_t len)
{
	rs_segment seg = { .kind = RS_SEG_SOURCE, .length = len };
	int err = note_source(&t->nodes[file], source);

	if (err)
		return err;
	seg.u.source.index = source;
	seg.u.source.offset = offset;
	return append(t, file, seg);
}

int rs_vtree_append_tensor(rs_vtree *t, uint32_t file, const rs_chunk *c,
			   uint64_t offset, uint64_t len)
{
	rs_segment seg = { .kind = RS_SEG_TENSOR, .length = len };

	for (size_t i = 0; i < c->plan.count; i++) {
		int err = note_source(&t->nodes[file], c->plan.ops[i].source);

		if (err)
			return err;
	}
	seg.u.tensor.chunk = c;
	seg.u.tensor.offset = offset;
	return append(t, file, seg);
}

int rs_vtree_add_chunk(rs_vtree *t, rs_plan *plan, rs_dtype from, rs_dtype to,
		       const rs_chunk **out)
{
	unsigned fs = rs_dtype_size(from), ts = rs_dtype_size(to);
	rs_chunk *c;

	int err = rs_array_reserve(&t->chunks, &t->cap_chunks,
				   t->nchunks + 1, sizeof(*t->chunks));

	if (err)
		return err;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	for (size_t i = 0, cap = 0; i < plan->count && !err; i++)
		err = insert_source(&c->sources, &c->nsources, &cap,
				    plan->ops[i].source);
	if (err) {
		free(c->sources);
		free(c);
		return err;
	}
	c->id = t->nchunks;
	c->plan = *plan;
	c->from = c->to = RS_DTYPE_INVALID;
	c->size = plan->size;
	if (from != to) {
		/* The caller checked the cast; sizes divide exactly. */
		c->from = from;
		c->to = to;
		c->size = plan->size / fs * ts;
	}
	rs_plan_init(plan);
	t->chunks[t->nchunks++] = c;
	*out = c;
	return 0;
}

int rs_vtree_append_plan(rs_vtree *t, uint32_t file, rs_plan *plan,
			 rs_dtype from, rs_dtype to)
{
	const rs_chunk *c;
	uint64_t at = 0;
	int err = 0;

	if (from != to ||
	    (!rs_plan_is_runs(plan) &&
	     rs_plan_unroll_rows(plan, RS_VTREE_DIRECT_MIN_ROW,
				 RS_VTREE_DIRECT_MAX_RUNS) != 0)) {
		err = rs_vtree_add_chunk(t, plan, from, to, &c);
		if (err)
			goto out;
		return rs_vtree_append_tensor(t, file, c, 0, c->size);
	}
	/* Runs are sorted by destination: gaps between them are zeros. */
	for (size_t i = 0; i < plan->count && !err; i++) {
		const rs_copy_op *op = &plan->ops[i];

		err = rs_vtree_append_zero(t, file, op->dst_off - at);
		if (!err)
			err = rs_vtree_append_source(t, file, op->source,
						     op->src_off, op->len);
		at = op->dst_off + op->len;
	}
	if (!err)
		err = rs_vtree_append_zero(t, file, plan->size - at);
out:
	rs_plan_free(plan);
	return err;
}

uint32_t rs_vtree_find_segment(const rs_vnode *n, uint64_t off)
{
	uint32_t lo = 0, hi = n->nsegs;

	while (hi - lo > 1) {
		uint32_t mid = (lo + hi) / 2;

		if (n->segs[mid].offset <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}
