/* ZeRO's flat partitions cut into params (formats/deepspeed/zero.c).  The
 * oracle is a direct walk of DeepSpeed's layouts, element by element: in
 * stages 1-2 a param's element i is element offset+i of its group's
 * ranks' partitions laid end to end; in stage 3 it is element i % part of
 * rank i / part's part, at the param's offset in that rank's groups.
 * Every element of every param and state must be read from that byte, and
 * layouts whose params do not fill the partitions (or whose sizes
 * overflow) must be refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/deepspeed/deepspeed_int.h"
#include "tests/unit/check.h"

#define MAXP 8

typedef struct {
	int stage;
	uint32_t world, groups;
	size_t np;
	uint64_t numel[MAXP];           /* 1-d params, or 2 x n/2 with twod */
	uint32_t group[MAXP];
	uint64_t flat[4][4];            /* [rank][group] elements */
	bool twod;
} layout;

/* The byte of a flat's element: each (state, rank, group) its own file
 * region, so a wrong one is seen. */
static uint64_t flat_base(int s, uint32_t r, uint32_t g)
{
	return 1000000ull * (uint64_t)(s + 1) + 10000ull * r + 100000ull * g;
}

static void state_of(const layout *L, rs_ds_state *st, rs_ds_param *params,
		     rs_ds_flat *flats)
{
	memset(st, 0, sizeof(*st));
	st->stage = L->stage;
	st->world = L->world;
	st->groups = L->groups;
	st->params = params;
	st->nparams = L->np;
	st->flats = flats;
	for (int s = 0; s < DS_NSTATES; s++)
		st->has_state[s] = true;
	for (size_t p = 0; p < L->np; p++) {
		memset(&params[p], 0, sizeof(params[p]));
		params[p].name = malloc(16);
		snprintf(params[p].name, 16, "p%zu", p);
		params[p].numel = L->numel[p];
		params[p].group = L->group[p];
		params[p].ndim = L->twod ? 2 : 1;
		params[p].shape[0] = L->twod ? 2 : L->numel[p];
		params[p].shape[1] = L->numel[p] / 2;
	}
	for (int s = 0; s < DS_NSTATES; s++)
		for (uint32_t r = 0; r < L->world; r++)
			for (uint32_t g = 0; g < L->groups; g++) {
				rs_ds_flat *f = &flats[((size_t)s * L->world + r) * L->groups + g];

				f->source = r;
				f->offset = flat_base(s, r, g);
				f->numel = L->flat[r][g];
				f->present = true;
			}
}

/* Where element i of param p is, by DeepSpeed's layout: rank, group and
 * element of that flat. */
static void oracle(const layout *L, size_t p, uint64_t i, uint32_t *rank,
		   uint32_t *group, uint64_t *at)
{
	if (L->stage < 3) {
		uint64_t o = 0, pos;

		for (size_t q = 0; q < p; q++)
			if (L->group[q] == L->group[p])
				o += L->numel[q];
		pos = o + i;
		*group = L->group[p];
		for (*rank = 0; pos >= L->flat[*rank][*group]; (*rank)++)
			pos -= L->flat[*rank][*group];
		*at = pos;
		return;
	}
	{
		uint64_t part = (L->numel[p] + L->world - 1) / L->world, o = 0, pos;

		for (size_t q = 0; q < p; q++)
			o += (L->numel[q] + L->world - 1) / L->world;
		*rank = (uint32_t)(i / part);
		pos = o + i % part;
		for (*group = 0; pos >= L->flat[*rank][*group]; (*group)++)
			pos -= L->flat[*rank][*group];
		*at = pos;
	}
}

/* The source and byte the catalog reads element (row, col) of t from;
 * false when no fragment (or two) holds it. */
static bool byte_of(const rs_tensor *t, uint64_t row, uint64_t col,
		    uint32_t *source, uint64_t *offset)
{
	int found = 0;

	for (size_t f = 0; f < t->nfrags; f++) {
		const rs_fragment *fr = &t->frags[f];
		uint64_t idx[2] = { row, col }, off = 0;
		bool in = true;

		for (int d = 0; d < t->ndim; d++) {
			in &= idx[d] >= fr->box.off[d] &&
			      idx[d] < fr->box.off[d] + fr->box.len[d];
			off += (idx[d] - fr->box.off[d]) * fr->stride[d];
		}
		if (in) {
			*source = fr->source;
			*offset = fr->offset + off * 4;
			found++;
		}
	}
	return found == 1;
}

/* Cuts L; returns the error, and with 0 checks every element. */
static int cut(const layout *L)
{
	rs_ds_param params[MAXP];
	rs_ds_flat flats[DS_NSTATES * 4 * 4];
	rs_ds_state st;
	rs_checkpoint ck;
	rs_diag *d = rs_diag_new();
	int err;

	memset(&ck, 0, sizeof(ck));
	rs_catalog_init(&ck.catalog);
	state_of(L, &st, params, flats);
	err = rs_ds_add_params(&ck, &st, "test", d);
	if (err) {
		CHECK(rs_diag_count(d) == 1);
		goto out;
	}
	CHECK(ck.catalog.count == L->np * DS_NSTATES);
	for (size_t p = 0; p < L->np; p++)
		if (L->numel[p] > 1000) {
			CHECK(!"a layout that must be refused was cut");
			goto out;
		}
	for (size_t p = 0; p < L->np; p++)
		for (int s = 0; s < DS_NSTATES; s++) {
			const rs_tensor *t = &ck.catalog.tensors[p * DS_NSTATES + s];
			bool all = true;

			for (uint64_t i = 0; i < L->numel[p]; i++) {
				uint32_t rank, group, src = 0;
				uint64_t at, byte = 0;
				uint64_t row = L->twod ? i / (L->numel[p] / 2) : i;
				uint64_t col = L->twod ? i % (L->numel[p] / 2) : 0;

				oracle(L, p, i, &rank, &group, &at);
				all &= byte_of(t, row, col, &src, &byte) &&
				       src == rank &&
				       byte == flat_base(s, rank, group) + 4 * at;
			}
			CHECK(all);
		}
out:
	rs_catalog_free(&ck.catalog);
	for (size_t p = 0; p < L->np; p++)
		free(params[p].name);
	rs_diag_free(d);
	return err;
}

int main(void)
{
	/* stage 2: params 5, 3, 4 over partitions 6 | 6; one crosses */
	layout a = { .stage = 2, .world = 2, .groups = 1, .np = 3,
		     .numel = { 5, 3, 4 }, .flat = { { 6 }, { 6 } } };
	/* padding: 9 elements in 6 | 6 (both 12 rounded up to 2 x 2) */
	layout b = { .stage = 1, .world = 2, .groups = 1, .np = 2,
		     .numel = { 5, 4 }, .flat = { { 6 }, { 6 } } };
	/* two groups, 2-d params */
	layout c = { .stage = 2, .world = 2, .groups = 2, .np = 3,
		     .numel = { 6, 4, 8 }, .group = { 0, 1, 0 }, .twod = true,
		     .flat = { { 7, 2 }, { 7, 2 } } };
	/* stage 3: parts 3, 2, 2 at 0, 3, 5 of each rank's 7, in groups of
	 * 4 and 3 (param 1 crosses them) */
	layout e = { .stage = 3, .world = 2, .groups = 2, .np = 3,
		     .numel = { 5, 3, 4 }, .flat = { { 4, 3 }, { 4, 3 } } };
	/* stage 3, 4 ranks, a param smaller than the world */
	layout f = { .stage = 3, .world = 4, .groups = 1, .np = 2,
		     .numel = { 2, 9 }, .flat = { { 4 }, { 4 }, { 4 }, { 4 } } };
	layout bad = a, bad3 = e, huge = a;

	CHECK(cut(&a) == 0);
	CHECK(cut(&b) == 0);
	CHECK(cut(&c) == 0);
	CHECK(cut(&e) == 0);
	CHECK(cut(&f) == 0);
	/* params that do not fill the partitions, or pass them */
	bad.numel[2] = 0;
	bad.np = 2;                     /* 8 of 12 */
	CHECK(cut(&bad) == -EINVAL);
	bad.np = 3;
	bad.numel[2] = 9;               /* 17 of 12 */
	CHECK(cut(&bad) == -EINVAL);
	bad3.flat[0][1] = bad3.flat[1][1] = 4;
	CHECK(cut(&bad3) == -EINVAL);
	bad3.flat[1][1] = 3;            /* ranks that differ */
	CHECK(cut(&bad3) == -EINVAL);
	/* sizes whose sum wraps around to exactly the partitions' 12 */
	huge.numel[0] = huge.numel[1] = 1ull << 63;
	huge.numel[2] = 12;
	CHECK(cut(&huge) == -EINVAL);
	return CHECK_DONE();
}
