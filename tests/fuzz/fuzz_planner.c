/* fuzz_planner: copy plans for random layouts, checked byte by byte.
 *
 * The input is read as a stream of small choices (exhausted: zeros): a
 * dtype, a shape of 0-4 axes of up to 12 elements (fewer for 3-4 axes),
 * and how it is stored -
 *   - a regular zarr grid (rs_catalog_add_regular, chunks maybe larger
 *     than the shape: edge chunks stored whole), or
 *   - fragments on irregular per-axis cuts, each stored with its own
 *     element strides (any axis order, padded rows, stride 0 as an
 *     expanded torch tensor has), in shuffled order, some cells left out
 *     (holes read as zeros), then perhaps made regular
 *     (rs_tensor_make_regular);
 * then a target: a shape grown or shrunk per axis (vocab padding), a chunk
 * grid over it and destination extents, plus a few boxes anywhere.
 *
 * The oracle is provenance, not values: executing a plan on paper gives,
 * for every destination byte, how many ops wrote it and from which
 * (source, byte offset).  Each byte of a destination element inside the
 * box and the tensor, and held by a fragment, must be written exactly once,
 * from that fragment's source at offset + (sum (g - off) * stride) * esize;
 * every other byte (padding, outside the tensor, holes) never.  The same
 * holds for rs_plan_slice of random ranges (relative to the range) and for
 * rs_plan_unroll_rows, which must also keep its own contract.
 */
#include <errno.h>
#include <string.h>

#include "planner/catalog.h"
#include "planner/plan.h"
#include "tests/fuzz/fuzz.h"

/* Small enough for thousands of inputs a second: every destination byte
 * of every plan is checked one by one. */
#define MAX_AXIS 12u            /* elements along an axis of a 1-2 d shape */
#define MAX_AXIS_3D 8u
#define MAX_AXIS_4D 5u
#define MAX_DST_BYTES (1u << 13)
#define MAX_BOXES 8

typedef struct {
	const uint8_t *p;
	size_t n;
} input;

static unsigned byte(input *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

/* A choice in [0, n). */
static uint64_t pick(input *in, uint64_t n)
{
	uint64_t v;

	if (n <= 1)
		return 0;
	v = byte(in);
	if (n > 256)
		v = v << 8 | byte(in);
	return v % n;
}

typedef struct {
	rs_catalog cat;
	rs_tensor *t;
	int *owner;             /* fragment of each element (C order), or -1 */
	uint64_t shape_elems;
	unsigned esize;
} layout;

/* What executing a plan writes: per destination byte. */
typedef struct {
	uint8_t *hits;
	uint32_t *src;
	uint64_t *off;
	uint64_t size;
} bytemap;

static void map_init(bytemap *m, uint64_t size)
{
	m->size = size;
	m->hits = calloc(size ? size : 1, 1);
	m->src = calloc(size ? size : 1, sizeof(*m->src));
	m->off = calloc(size ? size : 1, sizeof(*m->off));
	RS_FUZZ_CHECK(m->hits && m->src && m->off);
}

static void map_free(bytemap *m)
{
	free(m->hits);
	free(m->src);
	free(m->off);
}

/* Runs p on paper; checks the plan's own bookkeeping on the way.  Ops of
 * a slice keep their plan's order, which need not be sorted. */
static void execute(const rs_plan *p, bool sorted, bytemap *m)
{
	uint64_t written = 0;

	map_init(m, p->size);
	for (size_t k = 0; k < p->count; k++) {
		const rs_copy_op *op = &p->ops[k];

		RS_FUZZ_CHECK(op->count >= 1 && op->len >= 1);
		/* Sorted by destination, as the header says. */
		RS_FUZZ_CHECK(!sorted || k == 0 ||
			      p->ops[k - 1].dst_off <= op->dst_off);
		for (uint64_t r = 0; r < op->count; r++)
			for (uint64_t j = 0; j < op->len; j++) {
				uint64_t d = op->dst_off + r * op->dst_stride + j;

				RS_FUZZ_CHECK(d < p->size);
				if (m->hits[d] < 255)
					m->hits[d]++;
				m->src[d] = op->source;
				m->off[d] = op->src_off + r * op->src_stride + j;
				written++;
			}
	}
	RS_FUZZ_CHECK(written == p->covered);
}

static bool same_bytes(const bytemap *a, uint64_t at, const bytemap *b)
{
	for (uint64_t d = 0; d < b->size; d++) {
		if (a->hits[at + d] != b->hits[d])
			return false;
		if (b->hits[d] && (a->src[at + d] != b->src[d] ||
				   a->off[at + d] != b->off[d]))
			return false;
	}
	return true;
}

/* The oracle for a box planned into `extent`. */
static void check_box(const layout *L, const rs_box *box,
		      const uint64_t *extent, const bytemap *m)
{
	const rs_tensor *t = L->t;
	uint64_t pos[RS_MAX_DIMS] = { 0 }, elems;

	RS_FUZZ_CHECK(rs_product(extent, t->ndim, &elems));
	RS_FUZZ_CHECK(m->size == elems * L->esize);
	for (uint64_t el = 0; el < elems; el++) {
		const rs_fragment *f = NULL;
		bool inside = true;
		uint64_t g = 0, so = 0;

		for (int i = 0; i < t->ndim; i++) {
			uint64_t gi = box->off[i] + pos[i];

			inside = inside && pos[i] < box->len[i] && gi < t->shape[i];
			g = g * t->shape[i] + gi;
		}
		if (inside && L->owner[g] >= 0) {
			f = &t->frags[L->owner[g]];
			for (int i = 0; i < t->ndim; i++)
				so += (box->off[i] + pos[i] - f->box.off[i]) *
				      f->stride[i];
		}
		for (unsigned b = 0; b < L->esize; b++) {
			uint64_t d = el * L->esize + b;

			if (!f) {
				RS_FUZZ_CHECK(m->hits[d] == 0);
				continue;
			}
			RS_FUZZ_CHECK(m->hits[d] == 1);
			RS_FUZZ_CHECK(m->src[d] == f->source);
			RS_FUZZ_CHECK(m->off[d] == f->offset + so * L->esize + b);
		}
		for (int i = t->ndim - 1; i >= 0 && ++pos[i] == extent[i]; i--)
			pos[i] = 0;
	}
}

static rs_plan copy_plan(const rs_plan *p)
{
	rs_plan c = *p;

	c.ops = malloc(p->count ? p->count * sizeof(*p->ops) : 1);
	RS_FUZZ_CHECK(c.ops);
	if (p->count)
		memcpy(c.ops, p->ops, p->count * sizeof(*p->ops));
	c.cap = p->count;
	return c;
}

static void check_slices(input *in, const rs_plan *p, const bytemap *whole)
{
	for (int s = 0; s < 3 && p->size; s++) {
		uint64_t a = pick(in, p->size);
		uint64_t b = a + 1 + pick(in, p->size - a);
		rs_plan sl;
		bytemap m;

		if (rs_plan_slice(p, a, b, &sl) != 0)
			continue;
		RS_FUZZ_CHECK(sl.size == b - a);
		execute(&sl, false, &m);
		RS_FUZZ_CHECK(same_bytes(whole, a, &m));
		map_free(&m);
		rs_plan_free(&sl);
	}
}

static void check_unroll(input *in, const rs_plan *p, const bytemap *whole)
{
	uint64_t min_len = pick(in, 4) ? pick(in, 64) : 0, rows = 0;
	size_t max_runs = pick(in, 2) ? SIZE_MAX : (size_t)pick(in, 64);
	bool short_rows = false;
	rs_plan u = copy_plan(p);
	bytemap m;
	int err;

	for (size_t k = 0; k < p->count; k++) {
		rows += p->ops[k].count;
		short_rows |= p->ops[k].count > 1 && p->ops[k].len < min_len;
	}
	err = rs_plan_unroll_rows(&u, min_len, max_runs);
	RS_FUZZ_CHECK(err == 0 || err == -E2BIG || err == -ENOMEM);
	if (err) {
		/* Refused: unchanged, and for a reason the header gives. */
		RS_FUZZ_CHECK(err != -E2BIG || short_rows || rows > max_runs);
		RS_FUZZ_CHECK(u.count == p->count &&
			      memcmp(u.ops, p->ops, p->count * sizeof(*p->ops)) == 0);
		rs_plan_free(&u);
		return;
	}
	RS_FUZZ_CHECK(!short_rows && u.count <= max_runs);
	RS_FUZZ_CHECK(rs_plan_is_runs(&u) && u.size == p->size &&
		      u.covered == p->covered);
	for (size_t k = 1; k < u.count; k++)
		RS_FUZZ_CHECK(u.ops[k - 1].dst_off + u.ops[k - 1].len <=
			      u.ops[k].dst_off);
	execute(&u, true, &m);
	RS_FUZZ_CHECK(same_bytes(whole, 0, &m));
	map_free(&m);
	check_slices(in, &u, whole);
	rs_plan_free(&u);
}

static void plan_and_check(input *in, const layout *L, const rs_box *box,
			   const uint64_t *extent)
{
	uint64_t bytes;
	rs_plan p;
	bytemap m;

	if (!rs_product(extent, L->t->ndim, &bytes) ||
	    bytes > MAX_DST_BYTES / L->esize)
		return;
	if (rs_plan_box(L->t, box, extent, &p) != 0)
		return;
	RS_FUZZ_CHECK(p.covered <= p.size);
	execute(&p, true, &m);
	check_box(L, box, extent, &m);
	check_slices(in, &p, &m);
	check_unroll(in, &p, &m);
	map_free(&m);
	rs_plan_free(&p);
}

/* Dense strides over `ext` with axes laid out in `order` (outermost
 * first), so any permutation is some transpose's storage. */
static void strides_for(const uint64_t *ext, const int *order, int n,
			uint64_t *stride)
{
	uint64_t s = 1;

	for (int k = n - 1; k >= 0; k--) {
		stride[order[k]] = s;
		s *= ext[order[k]];
	}
}

/* Fragments on irregular cuts: axis i is cut at the positions the input
 * picks; every cell is a fragment unless `holes` drops it. */
static int add_cut_fragments(input *in, layout *L, rs_dtype dtype, int n,
			     const uint64_t *shape, bool holes)
{
	uint64_t cuts[RS_MAX_DIMS][MAX_AXIS + 1], ncuts[RS_MAX_DIMS];
	uint64_t cells = 1, idx[RS_MAX_DIMS] = { 0 };
	size_t ti, nf = 0;
	rs_fragment *frags;

	for (int i = 0; i < n; i++) {
		ncuts[i] = 0;
		cuts[i][ncuts[i]++] = 0;
		for (uint64_t x = 1; x < shape[i]; x++)
			if (pick(in, 3) == 0)
				cuts[i][ncuts[i]++] = x;
		/* ncuts[i] cells along the axis (one when it is empty) */
		cells *= ncuts[i];
	}
	frags = calloc(cells, sizeof(*frags));
	RS_FUZZ_CHECK(frags);
	for (uint64_t c = 0; c < cells; c++) {
		rs_fragment f = { .box.ndim = n };
		uint64_t ext[RS_MAX_DIMS];
		int order[RS_MAX_DIMS];

		for (int i = 0; i < n; i++) {
			uint64_t lo = cuts[i][idx[i]];
			uint64_t hi = idx[i] + 1 < ncuts[i] ? cuts[i][idx[i] + 1]
							    : shape[i];

			f.box.off[i] = lo;
			f.box.len[i] = hi - lo;
			ext[i] = f.box.len[i] + (pick(in, 4) == 0);
			order[i] = i;
		}
		for (int i = n - 1; i > 0; i--) {
			int j = (int)pick(in, (uint64_t)i + 1), tmp = order[i];

			order[i] = order[j];
			order[j] = tmp;
		}
		strides_for(ext, order, n, f.stride);
		for (int i = 0; i < n; i++)
			if (pick(in, 16) == 0)
				f.stride[i] = 0; /* expanded: one element repeated */
		f.source = (uint32_t)pick(in, 3);
		f.offset = pick(in, 1u << 16);
		if (!holes || pick(in, 4) != 0)
			frags[nf++] = f;
		for (int i = n - 1; i >= 0 && ++idx[i] == ncuts[i]; i--)
			idx[i] = 0;
	}
	/* Any order: the reader keeps .metadata's. */
	for (size_t i = nf; i > 1; i--) {
		size_t j = (size_t)pick(in, i);
		rs_fragment tmp = frags[i - 1];

		frags[i - 1] = frags[j];
		frags[j] = tmp;
	}
	if (rs_catalog_add_fragments(&L->cat, "t", dtype, n, shape, nf, &ti)) {
		free(frags);
		return -1;
	}
	L->t = &L->cat.tensors[ti];
	if (nf)
		memcpy(L->t->frags, frags, nf * sizeof(*frags));
	free(frags);
	if (pick(in, 4) != 0)
		rs_tensor_make_regular(L->t);
	return 0;
}

static int add_regular(input *in, layout *L, rs_dtype dtype, int n,
		       const uint64_t *shape)
{
	uint64_t chunk[RS_MAX_DIMS];
	size_t ti;

	for (int i = 0; i < n; i++)
		chunk[i] = 1 + pick(in, shape[i] + 2);
	if (rs_catalog_add_regular(&L->cat, "t", dtype, n, shape, chunk, &ti))
		return -1;
	L->t = &L->cat.tensors[ti];
	for (uint64_t g = 0; g < L->t->nfrags; g++) {
		uint64_t idx[RS_MAX_DIMS];

		rs_grid_coords(g, L->t->grid_count, n, idx);
		rs_catalog_set_chunk(L->t, idx, (uint32_t)pick(in, 3),
				     pick(in, 1u << 16));
	}
	return 0;
}

/* Which fragment holds each element; fragments are disjoint by
 * construction, and the check keeps the generator honest. */
static void fill_owner(layout *L)
{
	const rs_tensor *t = L->t;

	L->owner = malloc((L->shape_elems ? L->shape_elems : 1) * sizeof(int));
	RS_FUZZ_CHECK(L->owner);
	for (uint64_t g = 0; g < L->shape_elems; g++)
		L->owner[g] = -1;
	for (size_t k = 0; k < t->nfrags; k++) {
		const rs_box *b = &t->frags[k].box;
		uint64_t pos[RS_MAX_DIMS] = { 0 }, n;

		if (!rs_product(b->len, t->ndim, &n))
			continue;
		for (uint64_t e = 0; e < n; e++) {
			uint64_t g = 0;

			for (int i = 0; i < t->ndim; i++)
				g = g * t->shape[i] + b->off[i] + pos[i];
			RS_FUZZ_CHECK(L->owner[g] == -1);
			L->owner[g] = (int)k;
			for (int i = t->ndim - 1; i >= 0 && ++pos[i] == b->len[i]; i--)
				pos[i] = 0;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const rs_dtype dtypes[] = { RS_DTYPE_U8, RS_DTYPE_BF16,
					   RS_DTYPE_F32, RS_DTYPE_F64 };
	input in = { data, size };
	uint64_t shape[RS_MAX_DIMS] = { 0 }, tshape[RS_MAX_DIMS] = { 0 };
	uint64_t tchunk[RS_MAX_DIMS] = { 0 }, extent[RS_MAX_DIMS] = { 0 };
	uint64_t count[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 };
	rs_dtype dtype = dtypes[pick(&in, 4)];
	int n = (int)pick(&in, 5), mode = (int)pick(&in, 3), boxes = 0;
	layout L = { .esize = rs_dtype_size(dtype), .shape_elems = 1 };
	bool empty = false;

	rs_catalog_init(&L.cat);
	for (int i = 0; i < n; i++) {
		shape[i] = pick(&in, (n == 4 ? MAX_AXIS_4D : n == 3 ? MAX_AXIS_3D
								: MAX_AXIS) + 1);
		L.shape_elems *= shape[i];
	}
	if ((mode == 0 ? add_regular(&in, &L, dtype, n, shape)
		       : add_cut_fragments(&in, &L, dtype, n, shape, mode == 2)) != 0)
		goto out;
	fill_owner(&L);

	/* The target grid: a shape grown or shrunk by a few (vocab), chunks
	 * over it, extents at least the chunk (a zarr edge chunk is whole). */
	for (int i = 0; i < n; i++) {
		uint64_t delta = pick(&in, 6);

		tshape[i] = shape[i] + delta >= 2 ? shape[i] + delta - 2 : 0;
		tchunk[i] = 1 + pick(&in, tshape[i] + 1);
		extent[i] = tchunk[i] + (pick(&in, 4) == 0 ? pick(&in, 3) : 0);
	}
	rs_grid_count(tshape, tchunk, n, count);
	for (int i = 0; i < n; i++)
		empty |= count[i] == 0;
	while (!empty && boxes++ < MAX_BOXES) {
		rs_box box = { .ndim = n };

		for (int i = 0; i < n; i++) {
			uint64_t end = (idx[i] + 1) * tchunk[i];

			box.off[i] = idx[i] * tchunk[i];
			box.len[i] = (end > tshape[i] ? tshape[i] : end) - box.off[i];
		}
		plan_and_check(&in, &L, &box, extent);
		if (!rs_grid_next(idx, count, n))
			break;
	}
	/* And boxes anywhere, partly or wholly outside the tensor. */
	for (int k = 0; k < 2; k++) {
		rs_box box = { .ndim = n };
		uint64_t ext[RS_MAX_DIMS];

		for (int i = 0; i < n; i++) {
			box.off[i] = pick(&in, shape[i] + 3);
			box.len[i] = pick(&in, shape[i] + 2);
			ext[i] = box.len[i] + pick(&in, 2);
			if (ext[i] == 0)
				ext[i] = 1;
		}
		plan_and_check(&in, &L, &box, ext);
	}
out:
	free(L.owner);
	rs_catalog_free(&L.cat);
	return 0;
}
