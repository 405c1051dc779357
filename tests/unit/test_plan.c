/* Plan math against an independent oracle.
 *
 * A test tensor stores element g (global C-order index) as the uint32
 * value g+1, one buffer per chunk, with edge-chunk padding filled with
 * garbage.  A plan for a target box is executed by a reference copier and
 * compared, element by element, with the value formula: g+1 inside the
 * stored tensor, 0 outside it (vocab rows past the stored ones, padding).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planner/catalog.h"
#include "planner/plan.h"
#include "planner/vtree.h"
#include "tests/unit/check.h"

typedef struct {
	rs_catalog cat;
	rs_tensor *t;
	uint8_t **chunks;   /* stored bytes of each chunk, by grid index */
} fixture;

static uint64_t linear(const uint64_t *idx, const uint64_t *shape, int n)
{
	uint64_t g = 0;

	for (int i = 0; i < n; i++)
		g = g * shape[i] + idx[i];
	return g;
}

static void make(fixture *f, int n, const uint64_t *shape,
		 const uint64_t *chunk)
{
	size_t ti;
	uint64_t cb;

	rs_catalog_init(&f->cat);
	rs_catalog_add_regular(&f->cat, "t", RS_DTYPE_F32, n, shape, chunk, &ti);
	f->t = &f->cat.tensors[ti];
	cb = rs_tensor_chunk_bytes(f->t);
	f->chunks = calloc(f->t->nfrags, sizeof(uint8_t *));
	for (uint64_t gi = 0; gi < f->t->nfrags; gi++) {
		uint64_t idx[RS_MAX_DIMS], rest = gi, pos[RS_MAX_DIMS] = { 0 };
		uint32_t *buf = malloc(cb);

		for (int i = n - 1; i >= 0; i--) {
			idx[i] = rest % f->t->grid_count[i];
			rest /= f->t->grid_count[i];
		}
		rs_catalog_set_chunk(f->t, idx, (uint32_t)gi, 0);
		for (uint64_t e = 0; e < cb / 4; e++) {
			uint64_t g[RS_MAX_DIMS];
			int inside = 1;

			for (int i = 0; i < n; i++) {
				g[i] = idx[i] * chunk[i] + pos[i];
				inside &= g[i] < shape[i];
			}
			buf[e] = inside ? (uint32_t)linear(g, shape, n) + 1 : 0xEEEEEEEEu;
			for (int i = n - 1; i >= 0 && ++pos[i] == chunk[i]; i--)
				pos[i] = 0;
		}
		f->chunks[gi] = (uint8_t *)buf;
	}
}

static void drop(fixture *f)
{
	for (uint64_t i = 0; i < f->t->nfrags; i++)
		free(f->chunks[i]);
	free(f->chunks);
	rs_catalog_free(&f->cat);
}

/* The reference executor: row by row, memcpy. */
static void run(const fixture *f, const rs_plan *p, uint8_t *dst)
{
	memset(dst, 0, p->size);
	for (size_t k = 0; k < p->count; k++) {
		const rs_copy_op *op = &p->ops[k];

		for (uint64_t r = 0; r < op->count; r++)
			memcpy(dst + op->dst_off + r * op->dst_stride,
			       f->chunks[op->source] + op->src_off + r * op->src_stride,
			       op->len);
	}
}

/* Plans and checks every box of a target grid; returns how many plans
 * were pure runs (served straight from the source). */
static int check_grid(fixture *f, const uint64_t *tshape, const uint64_t *tchunk)
{
	int n = f->t->ndim, runs = 0;
	uint64_t count[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 };

	for (int i = 0; i < n; i++)
		count[i] = (tshape[i] + tchunk[i] - 1) / tchunk[i];
	for (;;) {
		rs_box box = { .ndim = n };
		rs_plan p;
		uint8_t *dst;
		uint64_t pos[RS_MAX_DIMS] = { 0 }, elems = 1, bad = 0;

		for (int i = 0; i < n; i++) {
			uint64_t end = (idx[i] + 1) * tchunk[i];

			box.off[i] = idx[i] * tchunk[i];
			box.len[i] = (end > tshape[i] ? tshape[i] : end) - box.off[i];
			elems *= tchunk[i];
		}
		CHECK(rs_plan_box(f->t, &box, tchunk, &p) == 0);
		CHECK(p.size == elems * 4);
		CHECK(p.covered <= p.size);
		dst = malloc(p.size);
		run(f, &p, dst);
		for (uint64_t e = 0; e < elems; e++) {
			uint64_t g[RS_MAX_DIMS];
			int inside = 1;
			uint32_t want, got;

			for (int i = 0; i < n; i++) {
				g[i] = box.off[i] + pos[i];
				inside &= pos[i] < box.len[i] && g[i] < f->t->shape[i];
			}
			want = inside ? (uint32_t)linear(g, f->t->shape, n) + 1 : 0;
			memcpy(&got, dst + e * 4, 4);
			bad += want != got;
			for (int i = n - 1; i >= 0 && ++pos[i] == tchunk[i]; i--)
				pos[i] = 0;
		}
		CHECK(bad == 0);
		runs += rs_plan_is_runs(&p);

		/* Unrolled into one run per row, the plan builds the same bytes;
		 * rows shorter than asked leave it unchanged. */
		{
			rs_plan u = p;
			uint8_t *again = malloc(p.size);
			bool strided = !rs_plan_is_runs(&p);

			u.ops = malloc(p.count * sizeof(*p.ops) + 1);
			memcpy(u.ops, p.ops, p.count * sizeof(*p.ops));
			u.cap = p.count;
			CHECK(rs_plan_unroll_rows(&u, UINT64_MAX, SIZE_MAX) ==
			      (strided ? -E2BIG : 0));
			CHECK(u.count == p.count || !strided);
			CHECK(rs_plan_unroll_rows(&u, 1, SIZE_MAX) == 0);
			CHECK(rs_plan_is_runs(&u) && u.covered == p.covered);
			for (size_t k = 1; k < u.count; k++)
				CHECK(u.ops[k - 1].dst_off + u.ops[k - 1].len <=
				      u.ops[k].dst_off);
			run(f, &u, again);
			CHECK(memcmp(again, dst, p.size) == 0);
			free(again);
			rs_plan_free(&u);
		}

		/* Any slice of the plan builds the same bytes as the whole. */
		for (int s = 0; s < 20 && p.size > 1; s++) {
			uint64_t a = (uint64_t)rand() % p.size;
			uint64_t b = a + 1 + (uint64_t)rand() % (p.size - a);
			rs_plan sl;
			uint8_t *part;

			CHECK(rs_plan_slice(&p, a, b, &sl) == 0);
			part = malloc(b - a);
			run(f, &sl, part);
			CHECK(memcmp(part, dst + a, b - a) == 0);
			free(part);
			rs_plan_free(&sl);
		}
		free(dst);
		rs_plan_free(&p);
		int i = n - 1;

		while (i >= 0 && ++idx[i] == count[i])
			idx[i--] = 0;
		if (i < 0)
			return runs;
	}
}

/* A fragment stored transposed (column-major strides), as a torch.save
 * of t.T is: plans must follow its strides, one element per row. */
static void test_strided_fragment(void)
{
	uint64_t shape[] = { 6, 10 }, stride[] = { 1, 6 };
	rs_catalog c;
	rs_tensor *t;
	size_t ti;
	uint32_t src[60];
	uint8_t *chunks[1] = { (uint8_t *)src };
	fixture f;

	for (uint64_t i = 0; i < 6; i++)
		for (uint64_t j = 0; j < 10; j++)
			src[j * 6 + i] = (uint32_t)(i * 10 + j) + 1;
	rs_catalog_init(&c);
	CHECK(rs_catalog_add_fragments(&c, "t", RS_DTYPE_F32, 2, shape, 1, &ti) == 0);
	t = &c.tensors[ti];
	t->frags[0].box = (rs_box){ .ndim = 2, .off = { 0, 0 }, .len = { 6, 10 } };
	memcpy(t->frags[0].stride, stride, sizeof(stride));
	CHECK(rs_tensor_make_regular(t) && t->grid[0] == 6 && t->grid[1] == 10);
	f.cat = c;
	f.t = t;
	f.chunks = chunks;
	{
		uint64_t t1[] = { 4, 3 }, t2[] = { 6, 10 };

		/* values are checked inside; an edge box one column wide is
		 * contiguous in this storage, so some plans may be runs */
		check_grid(&f, shape, t1);
		CHECK(check_grid(&f, shape, t2) == 0);
	}
	rs_catalog_free(&c);
}

/* Fragments in any order that tile the shape become a regular grid;
 * overlaps and holes never do. */
static void test_make_regular(void)
{
	uint64_t shape[] = { 4, 6 };
	const rs_box tiles[] = {
		{ 2, { 2, 3 }, { 2, 3 } }, { 2, { 0, 0 }, { 2, 3 } },
		{ 2, { 0, 3 }, { 2, 3 } }, { 2, { 2, 0 }, { 2, 3 } },
	};
	const rs_box overlap[] = {
		{ 2, { 0, 0 }, { 2, 3 } }, { 2, { 0, 0 }, { 2, 3 } },
		{ 2, { 0, 3 }, { 2, 3 } }, { 2, { 2, 0 }, { 2, 3 } },
	};
	const rs_box *cases[] = { tiles, overlap };

	for (int k = 0; k < 2; k++) {
		rs_catalog c;
		size_t ti;

		rs_catalog_init(&c);
		CHECK(rs_catalog_add_fragments(&c, "t", RS_DTYPE_F32, 2, shape, 4, &ti) == 0);
		for (int i = 0; i < 4; i++) {
			c.tensors[ti].frags[i].box = cases[k][i];
			c.tensors[ti].frags[i].source = (uint32_t)i;
		}
		CHECK(rs_tensor_make_regular(&c.tensors[ti]) == (k == 0));
		if (k == 0)
			/* ordered by grid index: (0,0) first, (1,1) last */
			CHECK(c.tensors[ti].frags[0].source == 1 &&
			      c.tensors[ti].frags[3].source == 0);
		rs_catalog_free(&c);
	}
}

/* Fragments off any grid are served only when they tile the tensor:
 * exact tilings pass; an overlap (also one a sweep along the wrong axis
 * would compare late), a hole, a fragment outside, and a 0-d tensor with
 * two fragments or none are refused with what is wrong. */
static void test_check_tiling(void)
{
	static const struct {
		int ndim, n, want;
		uint64_t shape[2];
		rs_box f[3];
	} cases[] = {
		{ 1, 3, 0, { 10 }, { { 1, { 0 }, { 3 } }, { 1, { 7 }, { 3 } },
				    { 1, { 3 }, { 4 } } } },
		{ 1, 2, -ENODATA, { 10 }, { { 1, { 0 }, { 3 } },
					   { 1, { 7 }, { 3 } } } },
		{ 1, 2, -EINVAL, { 10 }, { { 1, { 0 }, { 5 } },
					  { 1, { 3 }, { 7 } } } },
		{ 2, 3, -EINVAL, { 4, 4 }, { { 2, { 0, 0 }, { 4, 1 } },
					    { 2, { 0, 1 }, { 4, 1 } },
					    { 2, { 0, 1 }, { 4, 3 } } } },
		{ 1, 2, 0, { 4 }, { { 1, { 0 }, { 4 } }, { 1, { 4 }, { 0 } } } },
		{ 1, 1, -ERANGE, { 4 }, { { 1, { 2 }, { 3 } } } },
		{ 0, 2, -EINVAL, { 0 }, { { 0 }, { 0 } } },
		{ 0, 0, -ENODATA, { 0 }, { { 0 } } },
	};

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		uint64_t covered = 0, total = 0;
		size_t a = 9, b = 9, ti;
		rs_catalog c;
		int err;

		rs_catalog_init(&c);
		CHECK(rs_catalog_add_fragments(&c, "t", RS_DTYPE_F32,
					       cases[k].ndim, cases[k].shape,
					       (size_t)cases[k].n, &ti) == 0);
		for (int i = 0; i < cases[k].n; i++)
			c.tensors[ti].frags[i].box = cases[k].f[i];
		rs_tensor_make_regular(&c.tensors[ti]);
		err = rs_tensor_check_tiling(&c.tensors[ti], &a, &b, &covered,
					     &total);
		CHECK(err == cases[k].want);
		if (err != cases[k].want)
			fprintf(stderr, "tiling case %zu: %d\n", k, err);
		if (err == -EINVAL && cases[k].ndim)
			CHECK(a < b && b < (size_t)cases[k].n);
		if (k == 1)
			CHECK(covered == 6 && total == 10);
		rs_catalog_free(&c);
	}
}

/* The tree's (directory, name) index: the same names in two directories,
 * thousands of children (the index grows several times), duplicates
 * refused, misses reported. */
static void test_vtree_names(void)
{
	struct timespec now = { 0 };
	uint32_t dirs[2], idx, got, n = 5000;
	rs_vtree t;
	char name[32];
	bool ok = true;

	CHECK(rs_vtree_init(&t, now) == 0);
	CHECK(rs_vtree_lookup(&t, 0, "a", &got) == -ENOENT);
	CHECK(rs_vtree_add_dir(&t, 0, "a", now, &dirs[0]) == 0);
	CHECK(rs_vtree_add_dir(&t, 0, "b", now, &dirs[1]) == 0);
	CHECK(rs_vtree_add_dir(&t, 0, "a", now, &idx) == -EEXIST);
	for (uint32_t i = 0; i < n; i++)
		for (int d = 0; d < 2; d++) {
			snprintf(name, sizeof(name), "%u.0", i);
			ok &= rs_vtree_add_file(&t, dirs[d], name, now, &idx) == 0;
			ok &= idx == 3 + 2 * i + (uint32_t)d;
		}
	CHECK(ok);
	CHECK(t.count == 3 + 2 * n);
	CHECK(rs_vtree_add_file(&t, dirs[1], "17.0", now, &idx) == -EEXIST);
	CHECK(rs_vtree_add_dir(&t, dirs[0], "4999.0", now, &idx) == -EEXIST);
	for (uint32_t i = 0; i < n; i++)
		for (int d = 0; d < 2; d++) {
			snprintf(name, sizeof(name), "%u.0", i);
			ok &= rs_vtree_lookup(&t, dirs[d], name, &got) == 0 &&
			      got == 3 + 2 * i + (uint32_t)d;
		}
	CHECK(ok);
	CHECK(rs_vtree_lookup(&t, dirs[0], "5000.0", &got) == -ENOENT);
	CHECK(rs_vtree_lookup(&t, 0, "17.0", &got) == -ENOENT);
	CHECK(rs_vtree_lookup(&t, 0, "b", &got) == 0 && got == dirs[1]);
	CHECK(t.nodes[dirs[0]].nchildren == n && t.nodes[0].nchildren == 2);
	rs_vtree_free(&t);
}

/* Literal segments sharing one kept buffer (rs_vtree_keep /
 * rs_vtree_append_kept) beside copied ones: offsets and sizes as for
 * copies, the bytes not copied (every segment points into the buffer), a
 * file's first segment allocating room for one only,
 * and rs_vtree_free frees the buffer once and each copy once (valgrind
 * and ASan runs of the unit tests see a double free or a leak). */
static void test_vtree_kept(void)
{
	struct timespec now = { 0 };
	uint32_t f[2];
	rs_vtree t;
	char *buf = malloc(8);

	CHECK(buf != NULL);
	memcpy(buf, "HEADtail", 8);
	CHECK(rs_vtree_init(&t, now) == 0);
	CHECK(rs_vtree_add_file(&t, 0, "a", now, &f[0]) == 0);
	CHECK(rs_vtree_add_file(&t, 0, "b", now, &f[1]) == 0);
	CHECK(rs_vtree_keep(&t, buf) == 0);
	/* room for exactly one segment in a file of one (most files) */
	CHECK(rs_vtree_append_kept(&t, f[0], buf, 4) == 0);
	CHECK(t.nodes[f[0]].nsegs == 1 && t.nodes[f[0]].cap_segs == 1);
	t.nodes[f[0]].nsegs = 0;
	t.nodes[f[0]].size = 0;
	for (int k = 0; k < 3; k++) {
		CHECK(rs_vtree_append_kept(&t, f[k & 1], buf, 4) == 0);
		CHECK(rs_vtree_append_literal(&t, f[k & 1], "xy", 2) == 0);
		CHECK(rs_vtree_append_kept(&t, f[k & 1], buf + 4, 4) == 0);
	}
	CHECK(rs_vtree_append_kept(&t, f[1], buf, 0) == 0);
	CHECK(t.nodes[f[0]].size == 20 && t.nodes[f[0]].nsegs == 6);
	CHECK(t.nodes[f[1]].size == 10 && t.nodes[f[1]].nsegs == 3);
	for (uint32_t s = 0; s < t.nodes[f[0]].nsegs; s++) {
		const rs_segment *g = &t.nodes[f[0]].segs[s];

		CHECK(g->kind == RS_SEG_LITERAL && g->offset == 10 * (s / 3) +
		      (s % 3 == 0 ? 0 : s % 3 == 1 ? 4 : 6));
		CHECK(g->kept == (s % 3 != 1));
		if (g->kept)
			CHECK(g->u.bytes == (const uint8_t *)buf + (s % 3 ? 4 : 0));
		else
			CHECK(memcmp(g->u.bytes, "xy", 2) == 0);
	}
	CHECK(memcmp(t.nodes[f[1]].segs[2].u.bytes, "tail", 4) == 0);
	CHECK(t.nkept == 1);
	rs_vtree_free(&t);
}

/* rs_frag_list_add_flat: every flat range [a, b) of a [3, 4, 5] box at a
 * global origin, its elements each in exactly one box, each box's byte
 * offsets those of C-order flat indices (the oracle: the index computed
 * from the coordinates), at most 2 * ndim - 1 boxes. */
static void test_flat_range(void)
{
	const uint64_t len[] = { 3, 4, 5 }, base[] = { 6, 0, 10 };
	const uint64_t numel = 60, origin = 1000, step = 3;
	const unsigned esize = 2;
	rs_fragment first = { 0 };

	first.source = 4;
	first.stride[0] = step;
	for (uint64_t a = 0; a <= numel; a++)
		for (uint64_t b = a; b <= numel; b++) {
			rs_frag_list fl = { 0 };
			int seen[60] = { 0 };
			bool ok = true;

			/* element 0 sits a elements before the first one held */
			first.offset = origin - a * step * esize;
			CHECK(rs_frag_list_add_flat(&fl, &first, esize, 3, base, len,
						    a, b) == 0);
			CHECK(fl.n <= 5);
			for (size_t k = 0; k < fl.n; k++) {
				const rs_fragment *f = &fl.v[k];

				ok &= f->source == 4 && f->box.ndim == 3;
				for (uint64_t i = 0; i < f->box.len[0]; i++)
					for (uint64_t j = 0; j < f->box.len[1]; j++)
						for (uint64_t m = 0; m < f->box.len[2]; m++) {
							uint64_t x = f->box.off[0] + i - base[0];
							uint64_t y = f->box.off[1] + j - base[1];
							uint64_t z = f->box.off[2] + m - base[2];
							uint64_t flat = (x * 4 + y) * 5 + z;
							uint64_t at = f->offset +
								(i * f->stride[0] + j * f->stride[1] +
								 m * f->stride[2]) * esize;

							ok &= x < 3 && y < 4 && z < 5;
							if (flat >= numel)
								continue;
							seen[flat]++;
							ok &= at == origin + (flat - a) * step * esize;
						}
			}
			for (uint64_t e = 0; e < numel; e++)
				ok &= seen[e] == (e >= a && e < b);
			CHECK(ok);
			free(fl.v);
		}
}

int main(void)
{
	fixture f;

	test_strided_fragment();
	test_make_regular();
	test_check_tiling();
	test_vtree_names();
	test_vtree_kept();
	test_flat_range();

	srand(7);
	{ /* column-parallel split tp2 -> tp8: contiguous ranges only */
		uint64_t shape[] = { 4, 256, 64 }, chunk[] = { 1, 128, 64 };
		uint64_t tchunk[] = { 1, 32, 64 };

		make(&f, 3, shape, chunk);
		CHECK(check_grid(&f, shape, tchunk) == 4 * 8);
		drop(&f);
	}
	{ /* column-parallel merge tp8 -> tp2: concatenated ranges */
		uint64_t shape[] = { 4, 256, 64 }, chunk[] = { 1, 32, 64 };
		uint64_t tchunk[] = { 1, 128, 64 };

		make(&f, 3, shape, chunk);
		CHECK(check_grid(&f, shape, tchunk) == 4 * 2);
		drop(&f);
	}
	{ /* row-parallel merge tp8 -> tp1: strided */
		uint64_t shape[] = { 4, 64, 128 }, chunk[] = { 1, 64, 16 };
		uint64_t tchunk[] = { 1, 64, 128 };

		make(&f, 3, shape, chunk);
		CHECK(check_grid(&f, shape, tchunk) == 0);
		drop(&f);
	}
	{ /* row-parallel split tp1 -> tp8: strided */
		uint64_t shape[] = { 2, 32, 128 }, chunk[] = { 1, 32, 128 };
		uint64_t tchunk[] = { 1, 32, 16 };

		make(&f, 3, shape, chunk);
		CHECK(check_grid(&f, shape, tchunk) == 0);
		drop(&f);
	}
	{ /* edge chunks on both sides, grids that do not align */
		uint64_t shape[] = { 10, 7 }, chunk[] = { 4, 3 };
		uint64_t t1[] = { 5, 7 }, t2[] = { 3, 2 }, t3[] = { 10, 7 };

		make(&f, 2, shape, chunk);
		check_grid(&f, shape, t1);
		check_grid(&f, shape, t2);
		check_grid(&f, shape, t3);
		drop(&f);
	}
	{ /* vocab grown past the stored rows: zeros; and shrunk */
		uint64_t shape[] = { 1000, 8 }, chunk[] = { 500, 8 };
		uint64_t grow[] = { 1024, 8 }, gchunk[] = { 128, 8 };
		uint64_t shrink[] = { 896, 8 }, schunk[] = { 896, 8 };

		make(&f, 2, shape, chunk);
		check_grid(&f, grow, gchunk);
		check_grid(&f, shrink, schunk);
		drop(&f);
	}
	{ /* 4-d, split on the last axis with a layer axis in front */
		uint64_t shape[] = { 2, 3, 4, 12 }, chunk[] = { 1, 3, 4, 6 };
		uint64_t tchunk[] = { 1, 3, 4, 4 }, tchunk2[] = { 2, 3, 4, 12 };

		make(&f, 4, shape, chunk);
		check_grid(&f, shape, tchunk);
		check_grid(&f, shape, tchunk2);
		drop(&f);
	}
	{ /* 0-d tensor */
		uint64_t none[1] = { 0 };

		make(&f, 0, none, none);
		CHECK(check_grid(&f, none, none) == 1);
		drop(&f);
	}
	return CHECK_DONE();
}
