/* Legacy Megatron reader: the values of a rank file's data.pkl.
 *
 * Args (an argparse.Namespace) decide what the model walk cannot see -
 * virtual stages, layers per chunk, gating, tied embeddings - and must be
 * alike across ranks (megatron.h).  Tensors are read by
 * formats/codec/torch_tensor.h.
 */
#include "formats/megatron/megatron.h"
#include "formats/megatron/megatron_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Far beyond real models; bounds what args may make the reader allocate. */
#define RS_MEGATRON_MAX_LAYERS (1u << 16)
#define RS_MEGATRON_MAX_EXPERTS (1u << 16)

static const rs_pvalue *arg(const rs_meg_state *st, const char *name)
{
	return rs_pv_get(rs_pv_state(st->args), name);
}

/* A set value: not absent, None, False or 0. */
static bool arg_set(const rs_meg_state *st, const char *name)
{
	const rs_pvalue *v = arg(st, name);
	int64_t i;
	bool b;

	if (!v || rs_pv_kind(v) == RS_PV_NONE)
		return false;
	if (rs_pv_bool(v, &b) == 0)
		return b;
	if (rs_pv_int(v, &i) == 0)
		return i != 0;
	return true;
}

/* An int arg: 0 absent (or None), 1 read, -1 not a non-negative int. */
static int arg_u64(const rs_meg_state *st, const char *name, uint64_t *out)
{
	const rs_pvalue *v = arg(st, name);
	int64_t i;

	if (!v || rs_pv_kind(v) == RS_PV_NONE)
		return 0;
	if (rs_pv_int(v, &i) != 0 || i < 0)
		return -1;
	*out = (uint64_t)i;
	return 1;
}

/* The version decides how query_key_value rows are ordered. */
static int check_version(rs_meg_reader *r, const char *path)
{
	double v = 0;
	const rs_pvalue *cv = rs_pv_get(r->st->top, "checkpoint_version");

	if ((cv && rs_pv_float(cv, &v) != 0) || v < 2.0) {
		rs_diag_add(r->d, "%s: checkpoint_version %g: before 2.0 query_key_value rows are ordered per rank; not supported",
			    path, v);
		return -EINVAL;
	}
	return 0;
}

/* Which layers args.moe_layer_freq makes MoE layers: an int N, every
 * N-th from layer 0; a list, one 0/1 per layer (Megatron-LM's
 * arguments.py moe_freq_type, as megatron-core's
 * get_gpt_decoder_block_spec reads it). */
static int read_moe_layers(rs_meg_reader *r, const char *path)
{
	rs_meg_state *st = r->st;
	const rs_pvalue *v = arg(st, "moe_layer_freq");
	int64_t n = 1;

	st->moe_layer = calloc(st->layers, 1);
	if (!st->moe_layer)
		return -ENOMEM;
	if (v && (rs_pv_kind(v) == RS_PV_LIST || rs_pv_kind(v) == RS_PV_TUPLE)) {
		if (rs_pv_len(v) != st->layers) {
			rs_diag_add(r->d, "%s: args.moe_layer_freq lists %zu layers, but args.num_layers is %llu",
				    path, rs_pv_len(v), (unsigned long long)st->layers);
			return -EINVAL;
		}
		for (size_t i = 0; i < st->layers; i++) {
			int64_t b;

			if (rs_pv_int(rs_pv_item(v, i), &b) || (b != 0 && b != 1)) {
				rs_diag_add(r->d, "%s: args.moe_layer_freq[%zu] is not 0 or 1",
					    path, i);
				return -EINVAL;
			}
			st->moe_layer[i] = (uint8_t)b;
		}
		return 0;
	}
	if (v && rs_pv_kind(v) != RS_PV_NONE && (rs_pv_int(v, &n) || n < 1)) {
		rs_diag_add(r->d, "%s: args.moe_layer_freq is neither a positive integer nor a list of 0/1 per layer",
			    path);
		return -EINVAL;
	}
	for (uint64_t i = 0; i < st->layers; i++)
		st->moe_layer[i] = i % (uint64_t)n == 0;
	return 0;
}

/* Expert parallelism: args must agree with the EP rank directories, and
 * the expert TP must be the dense TP.  Megatron-LM names a rank file by
 * its (TP, PP, EP) ranks only (checkpointing.py get_checkpoint_name), and
 * the ranks of expert-data-parallel rank 0 write them: with an expert TP
 * other than the TP those names do not form a grid, or two ranks holding
 * different expert shards write one name. */
static int read_expert_args(rs_meg_reader *r, const char *path)
{
	rs_meg_state *st = r->st;
	uint64_t ep = 1, etp = st->tp, n = 0;
	int got;

	got = arg_u64(st, "expert_model_parallel_size", &ep);
	if (got < 0 || (got && ep != st->ep) || (!got && st->ep > 1)) {
		rs_diag_add(r->d, "%s: args.expert_model_parallel_size is not %u, the number of EP rank directories",
			    path, st->ep);
		return -EINVAL;
	}
	got = arg_u64(st, "expert_tensor_parallel_size", &etp);
	if (got < 0 || etp != st->tp) {
		rs_diag_add(r->d, "%s: args.expert_tensor_parallel_size is not tensor_model_parallel_size (%u): per-rank files are named by TP, PP and EP rank only, so they cannot hold another expert TP",
			    path, st->tp);
		return -EINVAL;
	}
	got = arg_u64(st, "num_experts", &n);
	if (got < 0 || n > RS_MEGATRON_MAX_EXPERTS ||
	    (got && n && n % st->ep)) {
		rs_diag_add(r->d, "%s: args.num_experts is not an expert count up to %u that divides by the %u EP ranks",
			    path, RS_MEGATRON_MAX_EXPERTS, st->ep);
		return -EINVAL;
	}
	/* bounds the reader's per-expert bookkeeping (a bit per expert
	 * and TP rank of each expert weight) as the catalog bounds
	 * fragments */
	if ((uint64_t)n * st->tp > RS_CATALOG_MAX_FRAGS) {
		rs_diag_add(r->d, "%s: args.num_experts %llu x %u TP ranks: more than %u expert shards",
			    path, (unsigned long long)n, st->tp, RS_CATALOG_MAX_FRAGS);
		return -EINVAL;
	}
	if (!n && st->ep > 1) {
		rs_diag_add(r->d, "%s: args.num_experts is not set, but there are %u EP rank directories",
			    path, st->ep);
		return -EINVAL;
	}
	st->experts = n;
	return n ? read_moe_layers(r, path) : 0;
}

/* The args of the first rank file decide the layout the model walk
 * checks; what this reader cannot map is refused here. */
int rs_meg_read_args(rs_meg_reader *r, const char *path)
{
	static const char *const uneven[] = {
		"standalone_embedding_stage", "decoder_first_pipeline_num_layers",
		"decoder_last_pipeline_num_layers",
		"num_layers_in_first_pipeline_stage",
		"num_layers_in_last_pipeline_stage",
		"account_for_embedding_in_pipeline_split",
		"account_for_loss_in_pipeline_split",
		"pipeline_model_parallel_layout",
	};
	rs_meg_state *st = r->st;
	uint64_t v, layers = 0;
	const char *name = NULL;
	int got, err;

	st->args = rs_pv_get(st->top, "args");
	if (!rs_pv_call_is(st->args, "argparse.Namespace") ||
	    rs_pv_kind(rs_pv_state(st->args)) != RS_PV_DICT) {
		rs_diag_add(r->d, "%s: 'args' is not an argparse.Namespace", path);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(uneven) / sizeof(uneven[0]); i++)
		if (arg_set(st, uneven[i])) {
			rs_diag_add(r->d, "%s: args.%s is set: uneven pipeline stages are not supported",
				    path, uneven[i]);
			return -EINVAL;
		}
	if (arg_u64(st, "num_layers", &layers) <= 0 || !layers ||
	    layers > RS_MEGATRON_MAX_LAYERS) {
		rs_diag_add(r->d, "%s: args.num_layers is not a layer count from 1 to %u",
			    path, RS_MEGATRON_MAX_LAYERS);
		return -EINVAL;
	}
	st->layers = layers;
	got = arg_u64(st, "tensor_model_parallel_size", &v);
	if (!got) {
		got = arg_u64(st, "model_parallel_size", &v);
		name = "model_parallel_size";
	}
	if (got && (got < 0 || v != st->tp)) {
		rs_diag_add(r->d, "%s: args.%s is not %u, the number of TP rank directories",
			    path, name ? name : "tensor_model_parallel_size", st->tp);
		return -EINVAL;
	}
	got = arg_u64(st, "pipeline_model_parallel_size", &v);
	if (got && (got < 0 || v != st->pp)) {
		rs_diag_add(r->d, "%s: args.pipeline_model_parallel_size is not %u, the number of pipeline rank directories",
			    path, st->pp);
		return -EINVAL;
	}
	st->vpp = 1;
	got = arg_u64(st, "virtual_pipeline_model_parallel_size", &v);
	if (got < 0 || (got && (v == 0 || v > RS_MEGATRON_MAX_LAYERS))) {
		rs_diag_add(r->d, "%s: args.virtual_pipeline_model_parallel_size is not a positive count",
			    path);
		return -EINVAL;
	}
	if (got)
		st->vpp = (uint32_t)v;
	if (layers % ((uint64_t)st->pp * st->vpp)) {
		rs_diag_add(r->d, "%s: args.num_layers %llu does not divide into %u pipeline stages x %u virtual stages",
			    path, (unsigned long long)layers, st->pp, st->vpp);
		return -EINVAL;
	}
	r->lpc = layers / ((uint64_t)st->pp * st->vpp);
	err = read_expert_args(r, path);
	if (err)
		return err;
	err = rs_facts_from_args(&r->ck->facts, rs_pv_state(st->args), "args",
				 path, r->d);
	if (err)
		return err;
	r->gated = arg_set(st, "swiglu");
	st->tied = !arg_set(st, "untie_embeddings_and_output_weights");
	return check_version(r, path);
}

/* Two scalar values alike (absent counts as a value). */
static bool same(const rs_pvalue *a, const rs_pvalue *b)
{
	double x, y;
	int64_t i, j;
	bool p, q;

	if (rs_pv_kind(a) != rs_pv_kind(b))
		return false;
	if (!a)
		return true;   /* absent from both */
	switch (rs_pv_kind(a)) {
	case RS_PV_NONE:
		return true;
	case RS_PV_INT:
		return !rs_pv_int(a, &i) && !rs_pv_int(b, &j) && i == j;
	case RS_PV_FLOAT:
		return !rs_pv_float(a, &x) && !rs_pv_float(b, &y) && x == y;
	case RS_PV_BOOL:
		return !rs_pv_bool(a, &p) && !rs_pv_bool(b, &q) && p == q;
	case RS_PV_STR:
		return rs_pv_str_is(b, rs_pv_str(a, NULL));
	default:
		return false;
	}
}

/* Every rank file must be of the same save as the first, and say the
 * same of the model: a view takes its facts from the first. */
int rs_meg_check_same(const rs_meg_reader *r, const rs_pvalue *top,
		      const char *path)
{
	static const char *const fields[] = {
		"num_layers", "hidden_size", "tensor_model_parallel_size",
		"pipeline_model_parallel_size",
		"virtual_pipeline_model_parallel_size", "padded_vocab_size",
		"swiglu", "untie_embeddings_and_output_weights",
		"expert_model_parallel_size", "expert_tensor_parallel_size",
		"num_experts",
	};
	const rs_pvalue *args = rs_pv_state(rs_pv_get(top, "args"));

	if (!same(rs_pv_get(top, "iteration"), rs_pv_get(r->st->top, "iteration")) ||
	    !same(rs_pv_get(top, "checkpoint_version"),
		  rs_pv_get(r->st->top, "checkpoint_version"))) {
		rs_diag_add(r->d, "%s: iteration or checkpoint_version differs from TP rank 0, stage 0's",
			    path);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if (!same(rs_pv_get(args, fields[i]), arg(r->st, fields[i]))) {
			char a[80], b[80];

			rs_pv_text(rs_pv_get(args, fields[i]), a, sizeof(a));
			rs_pv_text(arg(r->st, fields[i]), b, sizeof(b));
			rs_diag_add(r->d, "%s: args.%s is %s, but %s (TP rank 0, stage 0) says %s",
				    path, fields[i], a, r->st->first_path, b);
			return -EINVAL;
		}
	{
		rs_model_facts f;
		const char *field;
		char a[80], b[80];
		int err;

		rs_facts_init(&f);
		err = rs_facts_from_args(&f, args, "args", path, r->d);
		if (!err && rs_facts_differ(&f, &r->ck->facts, &field, a, b,
					    sizeof(a))) {
			rs_diag_add(r->d, "%s: args.%s is %s, but %s (TP rank 0, stage 0) says %s",
				    path, field, a, r->st->first_path, b);
			err = -EINVAL;
		}
		rs_facts_free(&f);
		if (err)
			return err;
	}
	return 0;
}

