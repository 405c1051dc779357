/* ops: which rows of which source make a target tensor
 * (formats/model.h, rs_map_op): each op as a list of row pieces. */
#include "formats/bridge/bridge_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int need(rs_map_job *j, bool ok, const char *why)
{
	if (!ok)
		snprintf(j->why, sizeof(j->why), "%s", why);
	return ok ? 0 : -EINVAL;
}

/* Sources k > 0 must match source 0 in every axis but the rows. */
static int same_cols(rs_map_job *j)
{
	for (int k = 1; k < j->nsrc; k++) {
		bool same = j->ndim[k] == j->ndim[0];

		for (int i = 1; same && i < j->ndim[0]; i++)
			same = j->shape[k][i] == j->shape[0][i];
		if (!same)
			return need(j, false, "its sources' shapes differ past the first axis");
	}
	return 0;
}

static int add(rs_map_job *j, int k, uint64_t lo, uint64_t hi, uint64_t at)
{
	j->pcs[j->npcs++] = (rs_map_piece){ k, lo, hi, at };
	return 0;
}

/* A fused qkv's rows as H query heads and G k and v heads of d rows
 * each: d, and q = the query rows of one group. */
static int qkv_rows(rs_map_job *j, uint64_t *d, uint64_t *q)
{
	uint64_t rows = j->shape[0][0], h = j->dims->heads, g = j->dims->groups;
	int err = need(j, h && g, "the head and query group counts are unknown");

	if (!err && (h % g || rows % (h + 2 * g))) {
		snprintf(j->why, sizeof(j->why), "its %llu rows are not %llu query groups of %llu heads and a k and a v head each (num_attention_heads %llu, num_key_value_heads %llu)",
			 (unsigned long long)rows, (unsigned long long)g,
			 (unsigned long long)(g ? h / g : 0),
			 (unsigned long long)h, (unsigned long long)g);
		err = -EINVAL;
	}
	if (err)
		return err;
	*d = rows / (h + 2 * g);
	*q = h / g * *d;
	return 0;
}

static int qkv_split(rs_map_job *j)
{
	uint64_t h = j->dims->heads, g = j->dims->groups, d, q;
	int which = j->op - RS_MAP_QKV_Q;       /* 0 q, 1 k, 2 v */
	int err = qkv_rows(j, &d, &q);

	if (err)
		return err;
	for (uint64_t i = 0; i < g; i++) {
		uint64_t base = i * (q + 2 * d);

		if (which == 0)
			add(j, 0, base, base + q, i * q);
		else
			add(j, 0, base + q + (uint64_t)(which - 1) * d,
			    base + q + (uint64_t)which * d, i * d);
	}
	j->out_shape[0] = which == 0 ? h * d : g * d;
	return 0;
}

static int qkv_fuse(rs_map_job *j)
{
	uint64_t h = j->dims->heads, g = j->dims->groups, d, q;
	int err = need(j, h && g, "the head and query group counts are unknown");

	if (!err)
		err = same_cols(j);
	if (!err)
		err = need(j, h % g == 0 && j->shape[1][0] == j->shape[2][0] &&
			      j->shape[1][0] % g == 0 &&
			      j->shape[0][0] == h * (j->shape[1][0] / g),
			   "q, k and v do not divide into the heads and query groups");
	if (err)
		return err;
	d = j->shape[1][0] / g;
	q = h / g * d;
	for (uint64_t i = 0; i < g; i++) {
		uint64_t base = i * (q + 2 * d);

		add(j, 0, i * q, (i + 1) * q, base);
		add(j, 1, i * d, (i + 1) * d, base + q);
		add(j, 2, i * d, (i + 1) * d, base + q + d);
	}
	j->out_shape[0] = g * (q + 2 * d);
	return 0;
}

/* Between megatron's groups [q (H/G heads); k; v] x G and one flat
 * [q (H heads); k (G); v (G)]: the same 3G pieces, one way or back. */
static int qkv_flat(rs_map_job *j, bool to_flat)
{
	uint64_t h = j->dims->heads, g = j->dims->groups, d, q;
	int err = qkv_rows(j, &d, &q);

	if (err)
		return err;
	for (uint64_t i = 0; i < g; i++) {
		uint64_t grp = i * (q + 2 * d);         /* megatron's rows */
		uint64_t fq = i * q, fk = h * d + i * d, fv = (h + g) * d + i * d;

		if (to_flat) {
			add(j, 0, grp, grp + q, fq);
			add(j, 0, grp + q, grp + q + d, fk);
			add(j, 0, grp + q + d, grp + q + 2 * d, fv);
		} else {
			add(j, 0, fq, fq + q, grp);
			add(j, 0, fk, fk + d, grp + q);
			add(j, 0, fv, fv + d, grp + q + d);
		}
	}
	return 0;
}

int rs_map_run(rs_map_job *j)
{
	uint64_t rows = j->ndim[0] ? j->shape[0][0] : 0;
	size_t cap = 2;
	int err;

	for (int k = 0; k < j->nsrc; k++)
		if (j->ndim[k] < 1 && j->op != RS_MAP_SAME)
			return need(j, false, "a source has no rows");
	if ((j->op >= RS_MAP_QKV_Q && j->op <= RS_MAP_FUSE_QKV) ||
	    j->op == RS_MAP_QKV_FLAT || j->op == RS_MAP_FLAT_QKV)
		cap = 3 * (size_t)(j->dims->groups ? j->dims->groups : 1);
	j->pcs = calloc(cap, sizeof(*j->pcs));
	if (!j->pcs)
		return -ENOMEM;
	j->out_ndim = j->ndim[0];
	memcpy(j->out_shape, j->shape[0], sizeof(j->out_shape));
	switch (j->op) {
	case RS_MAP_SAME:
		return add(j, 0, 0, rows, 0);
	case RS_MAP_QKV_Q:
	case RS_MAP_QKV_K:
	case RS_MAP_QKV_V:
		return qkv_split(j);
	case RS_MAP_FUSE_QKV:
		return qkv_fuse(j);
	case RS_MAP_HALF_0:
	case RS_MAP_HALF_1:
		err = need(j, rows % 2 == 0, "its rows do not halve");
		if (!err)
			add(j, 0, j->op == RS_MAP_HALF_0 ? 0 : rows / 2,
			    j->op == RS_MAP_HALF_0 ? rows / 2 : rows, 0);
		j->out_shape[0] = rows / 2;
		return err;
	case RS_MAP_CAT:
		err = same_cols(j);
		if (!err) {
			add(j, 0, 0, rows, 0);
			add(j, 1, 0, j->shape[1][0], rows);
			j->out_shape[0] = rows + j->shape[1][0];
		}
		return err;
	case RS_MAP_QKV_FLAT:
	case RS_MAP_FLAT_QKV:
		return qkv_flat(j, j->op == RS_MAP_QKV_FLAT);
	case RS_MAP_VOCAB:
		err = need(j, j->dims->vocab && j->dims->vocab <= rows,
			   "the true vocab size is unknown or above its rows");
		if (!err) {
			add(j, 0, 0, j->dims->vocab, 0);
			j->out_shape[0] = j->dims->vocab;
		}
		return err;
	}
	return need(j, false, "unknown op");
}
