/* The flat partitions of a ZeRO optimizer cut into params
 * (formats/deepspeed/deepspeed.h, "Reader"). */
#include "formats/deepspeed/deepspeed_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"
#include "planner/catalog.h"

const char *const rs_ds_state_names[DS_NSTATES] = {
	"fp32", "exp_avg", "exp_avg_sq",
};

/* One run of a param's elements [a, b) inside one flat, from element
 * `at` of it. */
typedef struct {
	uint64_t a, b;
	uint32_t rank, group;
	uint64_t at;
} piece;

typedef struct {
	piece *v;
	size_t n, cap;
} pieces;

static int push(pieces *ps, uint64_t a, uint64_t b, uint32_t rank,
		uint32_t group, uint64_t at)
{
	int err = a == b ? 0 : rs_array_reserve(&ps->v, &ps->cap, ps->n + 1,
						 sizeof(*ps->v));

	if (!err && a != b)
		ps->v[ps->n++] = (piece){ a, b, rank, group, at };
	return err;
}

static const rs_ds_flat *flat(const rs_ds_state *st, int state, uint32_t rank,
			   uint32_t g)
{
	return &st->flats[((size_t)state * st->world + rank) * st->groups + g];
}

/* Param elements [a, b) found at element `pos` of rank r's groups laid
 * end to end: one piece per group they touch. */
static int cut_by_groups(const rs_ds_state *st, pieces *ps, uint32_t r,
			 uint64_t pos, uint64_t a, uint64_t b)
{
	uint64_t start = 0;

	for (uint32_t g = 0; g < st->groups && a < b; g++) {
		uint64_t n = flat(st, DS_FP32, r, g)->numel, end = start + n;

		if (pos < end) {
			uint64_t take = end - pos < b - a ? end - pos : b - a;
			int err = push(ps, a, a + take, r, g, pos - start);

			if (err)
				return err;
			a += take;
			pos += take;
		}
		start = end;
	}
	return a < b ? -ERANGE : 0;
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
	return (x + to - 1) / to * to;
}

/* Stages 1-2: group g's flat is the ranks' partitions end to end. */
static int place_partitioned(const rs_ds_state *st, size_t p,
			     const uint64_t *offset, pieces *ps)
{
	const rs_ds_param *q = &st->params[p];
	uint64_t start = 0, o = offset[p];

	for (uint32_t r = 0; r < st->world; r++) {
		uint64_t n = flat(st, DS_FP32, r, q->group)->numel;
		uint64_t lo = o > start ? o : start;
		uint64_t hi = o + q->numel < start + n ? o + q->numel : start + n;
		int err = lo < hi ? push(ps, lo - o, hi - o, r, q->group,
					 lo - start) : 0;

		if (err)
			return err;
		start += n;
	}
	return 0;
}

/* *sum += x, false on overflow (hostile shapes or sizes). */
static bool add(uint64_t *sum, uint64_t x)
{
	return rs_add_u64(*sum, x, sum);
}

/* Where each param starts: stages 1-2 in its group's flat (checked to
 * fill the flat as DeepSpeed's own merge checks it), stage 3 in every
 * rank's groups end to end (checked to fill them).  Sizes are bounded by
 * the files (flats) and by 2^61 elements a param (shapes), so only their
 * sums can overflow. */
static int offsets(const rs_ds_state *st, uint64_t *offset,
		   const char *where, rs_diag *d)
{
	bool ok = true;

	if (st->stage < 3) {
		for (uint32_t g = 0; g < st->groups; g++) {
			uint64_t o = 0, total = 0, align = 2ull * st->world;

			for (uint32_t r = 0; r < st->world; r++)
				ok &= add(&total, flat(st, DS_FP32, r, g)->numel);
			for (size_t p = 0; p < st->nparams; p++)
				if (st->params[p].group == g) {
					offset[p] = o;
					ok &= add(&o, st->params[p].numel);
				}
			ok &= total < (1ull << 62);     /* round_up stays in range */
			if (!ok || o > total || round_up(o, align) != round_up(total, align)) {
				rs_diag_add(d, "%s: param_shapes of group %u hold %llu elements, but the ranks' fp32 partitions of that group hold %llu (not the same when both are rounded up to 2 x %u ranks)",
					    where, g, (unsigned long long)o,
					    (unsigned long long)total, st->world);
				return -EINVAL;
			}
		}
		return 0;
	}
	{
		uint64_t o = 0, total = 0;

		for (uint32_t g = 0; g < st->groups; g++)
			ok &= add(&total, flat(st, DS_FP32, 0, g)->numel);
		for (uint32_t r = 1; r < st->world; r++)
			for (uint32_t g = 0; g < st->groups; g++)
				if (flat(st, DS_FP32, r, g)->numel !=
				    flat(st, DS_FP32, 0, g)->numel) {
					rs_diag_add(d, "%s: rank %u's fp32 partition of group %u holds %llu elements, rank 0's %llu (stage 3 partitions are equal)",
						    where, r, g,
						    (unsigned long long)flat(st, DS_FP32, r, g)->numel,
						    (unsigned long long)flat(st, DS_FP32, 0, g)->numel);
					return -EINVAL;
				}
		for (size_t p = 0; p < st->nparams; p++) {
			offset[p] = o;
			ok &= add(&o, (st->params[p].numel + st->world - 1) / st->world);
		}
		if (!ok || o != total) {
			rs_diag_add(d, "%s: param_shapes need %llu elements of each rank's fp32 partitions (a 1/%u part of every param), but they hold %llu",
				    where, (unsigned long long)o, st->world,
				    (unsigned long long)total);
			return -EINVAL;
		}
	}
	return 0;
}

/* Stage 3: rank r holds elements [r*part, (r+1)*part) of every param. */
static int place_split(const rs_ds_state *st, size_t p,
		       const uint64_t *offset, pieces *ps)
{
	const rs_ds_param *q = &st->params[p];
	uint64_t part = (q->numel + st->world - 1) / st->world;

	for (uint32_t r = 0; r < st->world; r++) {
		uint64_t a = (uint64_t)r * part;
		uint64_t b = a + part < q->numel ? a + part : q->numel;
		int err = a < b ? cut_by_groups(st, ps, r, offset[p], a, b) : 0;

		if (err)
			return err;
	}
	return 0;
}

static int add_state(rs_checkpoint *ck, const rs_ds_state *st, int state,
		     rs_ds_param *q, const pieces *ps, const char *where)
{
	char *name = NULL;
	rs_frag_list fl = { 0 };
	size_t idx;
	int err = 0;

	if (state == DS_FP32)
		name = strdup(q->name);
	else if (asprintf(&name, "optimizer.state.%s.%s",
			  rs_ds_state_names[state], q->name) < 0)
		name = NULL;
	if (!name)
		return -ENOMEM;
	for (size_t i = 0; i < ps->n && !err; i++) {
		const piece *pc = &ps->v[i];
		const rs_ds_flat *f = flat(st, state, pc->rank, pc->group);
		uint64_t base[RS_MAX_DIMS] = { 0 };
		rs_fragment first = { .source = f->source };

		/* the byte of the param's element 0, were the run to reach
		 * back that far (only elements [a, b) are formed) */
		first.offset = f->offset + (pc->at - pc->a) * 4u;
		first.stride[0] = 1;
		err = rs_frag_list_add_flat(&fl, &first, 4, q->ndim, base,
					    q->shape, pc->a, pc->b);
	}
	if (!err)
		err = rs_catalog_add_fragments(&ck->catalog, name, RS_DTYPE_F32,
					       q->ndim, q->shape, fl.n, &idx);
	if (!err) {
		memcpy(ck->catalog.tensors[idx].frags, fl.v,
		       fl.n * sizeof(*fl.v));
		err = rs_catalog_set_origin(&ck->catalog, idx, where);
		q->tensor[state] = idx;
	}
	free(fl.v);
	free(name);
	return err;
}

int rs_ds_add_params(rs_checkpoint *ck, rs_ds_state *st,
		     const char *where, rs_diag *d)
{
	uint64_t *offset = calloc(st->nparams + 1, sizeof(*offset));
	pieces ps = { 0 };
	int err = offset ? offsets(st, offset, where, d) : -ENOMEM;

	for (size_t p = 0; p < st->nparams && !err; p++) {
		ps.n = 0;
		err = st->stage < 3 ? place_partitioned(st, p, offset, &ps)
				    : place_split(st, p, offset, &ps);
		if (err == -ERANGE) {
			rs_diag_add(d, "%s: %s lies past the end of the fp32 partitions",
				    where, st->params[p].name);
			err = -EINVAL;
		}
		for (int s = 0; s < DS_NSTATES && !err; s++)
			if (st->has_state[s])
				err = add_state(ck, st, s, &st->params[p], &ps,
						where);
	}
	free(ps.v);
	free(offset);
	return err;
}
