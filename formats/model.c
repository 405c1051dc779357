/* The model families' tables (formats/model.h): which tensor of one
 * ecosystem is made of which of another's, and how. */
#include "formats/model.h"

#include <stdlib.h>
#include <string.h>

#define ROW(to, op, ...) { to, RS_MAP_##op, { __VA_ARGS__ }, RS_WHEN_ALWAYS }
#define ROW_IF(when, to, op, ...) { to, RS_MAP_##op, { __VA_ARGS__ }, RS_WHEN_##when }
#define END { NULL, 0, { NULL }, 0 }

/* OPT: metaseq's TransformerDecoder names, the fused qkv_proj already
 * split into k/v/q_proj by the reader (formats/metaseq/stitch.c), to HF
 * transformers' OPTForCausalLM (the names its OPTDecoder registers). */
static const rs_map_row opt_metaseq_hf[] = {
	ROW("model.decoder.embed_tokens.weight", SAME, "decoder.embed_tokens.weight"),
	ROW("model.decoder.embed_positions.weight", SAME, "decoder.embed_positions.weight"),
	ROW("model.decoder.final_layer_norm.weight", SAME, "decoder.layer_norm.weight"),
	ROW("model.decoder.final_layer_norm.bias", SAME, "decoder.layer_norm.bias"),
	ROW("model.decoder.layers.#.self_attn.q_proj.weight", SAME, "decoder.layers.#.self_attn.q_proj.weight"),
	ROW("model.decoder.layers.#.self_attn.q_proj.bias", SAME, "decoder.layers.#.self_attn.q_proj.bias"),
	ROW("model.decoder.layers.#.self_attn.k_proj.weight", SAME, "decoder.layers.#.self_attn.k_proj.weight"),
	ROW("model.decoder.layers.#.self_attn.k_proj.bias", SAME, "decoder.layers.#.self_attn.k_proj.bias"),
	ROW("model.decoder.layers.#.self_attn.v_proj.weight", SAME, "decoder.layers.#.self_attn.v_proj.weight"),
	ROW("model.decoder.layers.#.self_attn.v_proj.bias", SAME, "decoder.layers.#.self_attn.v_proj.bias"),
	ROW("model.decoder.layers.#.self_attn.out_proj.weight", SAME, "decoder.layers.#.self_attn.out_proj.weight"),
	ROW("model.decoder.layers.#.self_attn.out_proj.bias", SAME, "decoder.layers.#.self_attn.out_proj.bias"),
	ROW("model.decoder.layers.#.self_attn_layer_norm.weight", SAME, "decoder.layers.#.self_attn_layer_norm.weight"),
	ROW("model.decoder.layers.#.self_attn_layer_norm.bias", SAME, "decoder.layers.#.self_attn_layer_norm.bias"),
	ROW("model.decoder.layers.#.fc1.weight", SAME, "decoder.layers.#.fc1.weight"),
	ROW("model.decoder.layers.#.fc1.bias", SAME, "decoder.layers.#.fc1.bias"),
	ROW("model.decoder.layers.#.fc2.weight", SAME, "decoder.layers.#.fc2.weight"),
	ROW("model.decoder.layers.#.fc2.bias", SAME, "decoder.layers.#.fc2.bias"),
	ROW("model.decoder.layers.#.final_layer_norm.weight", SAME, "decoder.layers.#.final_layer_norm.weight"),
	ROW("model.decoder.layers.#.final_layer_norm.bias", SAME, "decoder.layers.#.final_layer_norm.bias"),
	/* HF ties lm_head.weight to the embeddings and saves it not at all */
	ROW_IF(TIED, NULL, SAME, "decoder.output_projection.weight"),
	ROW_IF(UNTIED, "lm_head.weight", SAME, "decoder.output_projection.weight"),
	ROW(NULL, SAME, "decoder.version"),
	END,
};

/* Llama (RMSNorm, SwiGLU, RoPE, no biases) from megatron-core's GPTModel
 * to HF's LlamaForCausalLM.  Both of megatron-core's layer specs save the
 * norms in the fused names of TE's layers (the local spec maps
 * input_layernorm and pre_mlp_layernorm to them in its
 * sharded_state_dict); a plain state dict of the local spec (per-rank
 * files) keeps the separate names.  Optimizer states have no place in an
 * HF model directory. */
static const rs_map_row llama_mcore_hf[] = {
	ROW("model.embed_tokens.weight", VOCAB, "embedding.word_embeddings.weight"),
	ROW_IF(UNTIED, "lm_head.weight", VOCAB, "output_layer.weight"),
	ROW_IF(TIED, NULL, SAME, "output_layer.weight"),
	ROW("model.norm.weight", SAME, "decoder.final_layernorm.weight"),
	ROW("model.layers.#.self_attn.q_proj.weight", QKV_Q, "decoder.layers.#.self_attention.linear_qkv.weight"),
	ROW("model.layers.#.self_attn.k_proj.weight", QKV_K, "decoder.layers.#.self_attention.linear_qkv.weight"),
	ROW("model.layers.#.self_attn.v_proj.weight", QKV_V, "decoder.layers.#.self_attention.linear_qkv.weight"),
	ROW("model.layers.#.self_attn.o_proj.weight", SAME, "decoder.layers.#.self_attention.linear_proj.weight"),
	ROW("model.layers.#.input_layernorm.weight", SAME, "decoder.layers.#.self_attention.linear_qkv.layer_norm_weight"),
	ROW("model.layers.#.input_layernorm.weight", SAME, "decoder.layers.#.input_layernorm.weight"),
	ROW("model.layers.#.post_attention_layernorm.weight", SAME, "decoder.layers.#.mlp.linear_fc1.layer_norm_weight"),
	ROW("model.layers.#.post_attention_layernorm.weight", SAME, "decoder.layers.#.pre_mlp_layernorm.weight"),
	ROW("model.layers.#.mlp.gate_proj.weight", HALF_0, "decoder.layers.#.mlp.linear_fc1.weight"),
	ROW("model.layers.#.mlp.up_proj.weight", HALF_1, "decoder.layers.#.mlp.linear_fc1.weight"),
	ROW("model.layers.#.mlp.down_proj.weight", SAME, "decoder.layers.#.mlp.linear_fc2.weight"),
	/* Megatron-LM's legacy GPT model (per-rank files of
	 * --normalization RMSNorm --swiglu --disable-bias-linear
	 * --position-embedding-type rope) */
	ROW("model.embed_tokens.weight", VOCAB, "language_model.embedding.word_embeddings.weight"),
	ROW_IF(UNTIED, "lm_head.weight", VOCAB, "language_model.output_layer.weight"),
	ROW_IF(TIED, NULL, SAME, "language_model.output_layer.weight"),
	ROW("model.norm.weight", SAME, "language_model.encoder.final_norm.weight"),
	ROW("model.layers.#.self_attn.q_proj.weight", QKV_Q, "language_model.encoder.layers.#.self_attention.query_key_value.weight"),
	ROW("model.layers.#.self_attn.k_proj.weight", QKV_K, "language_model.encoder.layers.#.self_attention.query_key_value.weight"),
	ROW("model.layers.#.self_attn.v_proj.weight", QKV_V, "language_model.encoder.layers.#.self_attention.query_key_value.weight"),
	ROW("model.layers.#.self_attn.o_proj.weight", SAME, "language_model.encoder.layers.#.self_attention.dense.weight"),
	ROW("model.layers.#.input_layernorm.weight", SAME, "language_model.encoder.layers.#.input_norm.weight"),
	ROW("model.layers.#.post_attention_layernorm.weight", SAME, "language_model.encoder.layers.#.post_attention_norm.weight"),
	ROW("model.layers.#.mlp.gate_proj.weight", HALF_0, "language_model.encoder.layers.#.mlp.dense_h_to_4h.weight"),
	ROW("model.layers.#.mlp.up_proj.weight", HALF_1, "language_model.encoder.layers.#.mlp.dense_h_to_4h.weight"),
	ROW("model.layers.#.mlp.down_proj.weight", SAME, "language_model.encoder.layers.#.mlp.dense_4h_to_h.weight"),
	ROW(NULL, SAME, "optimizer.*"),
	END,
};

/* The reverse: an HF Llama under megatron-core GPTModel's dist
 * checkpoint names, layers stacked, as both layer specs load them. */
static const rs_map_row llama_hf_mcore[] = {
	ROW("embedding.word_embeddings.weight", SAME, "model.embed_tokens.weight"),
	ROW_IF(UNTIED, "output_layer.weight", SAME, "lm_head.weight"),
	ROW_IF(TIED, NULL, SAME, "lm_head.weight"),
	ROW("decoder.final_layernorm.weight", SAME, "model.norm.weight"),
	ROW("decoder.layers.#.self_attention.linear_qkv.weight", FUSE_QKV,
	    "model.layers.#.self_attn.q_proj.weight",
	    "model.layers.#.self_attn.k_proj.weight",
	    "model.layers.#.self_attn.v_proj.weight"),
	ROW("decoder.layers.#.self_attention.linear_qkv.layer_norm_weight", SAME, "model.layers.#.input_layernorm.weight"),
	ROW("decoder.layers.#.self_attention.linear_proj.weight", SAME, "model.layers.#.self_attn.o_proj.weight"),
	ROW("decoder.layers.#.mlp.linear_fc1.layer_norm_weight", SAME, "model.layers.#.post_attention_layernorm.weight"),
	ROW("decoder.layers.#.mlp.linear_fc1.weight", CAT,
	    "model.layers.#.mlp.gate_proj.weight",
	    "model.layers.#.mlp.up_proj.weight"),
	ROW("decoder.layers.#.mlp.linear_fc2.weight", SAME, "model.layers.#.mlp.down_proj.weight"),
	/* older transformers saved RoPE's inverse frequencies */
	ROW(NULL, SAME, "model.layers.#.self_attn.rotary_emb.inv_freq"),
	END,
};

/* megatron-core's linear layers save an _extra_state (None without
 * Transformer Engine's fp8 state) that its strict load asks for. */
static const char *const mcore_extra_state[] = {
	"decoder.layers.#.self_attention.linear_qkv._extra_state",
	"decoder.layers.#.self_attention.linear_proj._extra_state",
	"decoder.layers.#.mlp.linear_fc1._extra_state",
	"decoder.layers.#.mlp.linear_fc2._extra_state",
	NULL,
};

static const rs_family families[] = {
	{ "opt", "metaseq", "hf", opt_metaseq_hf, false, NULL,
	  "decoder.embed_tokens.weight", NULL },
	{ "llama", "mcore", "hf", llama_mcore_hf, false, "model.",
	  "embedding.word_embeddings.weight", NULL },
	{ "llama", "hf", "mcore", llama_hf_mcore, true, NULL,
	  "model.embed_tokens.weight", mcore_extra_state },
};

const rs_family *rs_family_find(const char *name, const char *from,
				const char *to)
{
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
		if (strcmp(families[i].name, name) == 0 &&
		    strcmp(families[i].from, from) == 0 &&
		    strcmp(families[i].to, to) == 0)
			return &families[i];
	return NULL;
}

static const struct {
	const char *name;
	int sources;
} ops[] = {
	[RS_MAP_SAME] = { "same", 1 },
	[RS_MAP_QKV_Q] = { "qkv_q", 1 },
	[RS_MAP_QKV_K] = { "qkv_k", 1 },
	[RS_MAP_QKV_V] = { "qkv_v", 1 },
	[RS_MAP_FUSE_QKV] = { "fuse_qkv", 3 },
	[RS_MAP_HALF_0] = { "half_0", 1 },
	[RS_MAP_HALF_1] = { "half_1", 1 },
	[RS_MAP_CAT] = { "cat", 2 },
	[RS_MAP_VOCAB] = { "vocab", 1 },
};

int rs_map_op_from_name(const char *s)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(ops[i].name, s) == 0)
			return (int)i;
	return -1;
}

const char *rs_map_op_name(rs_map_op op)
{
	return (size_t)op < sizeof(ops) / sizeof(ops[0]) ? ops[op].name : NULL;
}

int rs_map_op_sources(rs_map_op op)
{
	return (size_t)op < sizeof(ops) / sizeof(ops[0]) ? ops[op].sources : 0;
}

void rs_model_config_free(rs_model_config *m)
{
	free(m->hf_config);
	m->hf_config = NULL;
}
