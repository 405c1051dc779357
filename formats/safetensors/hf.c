/* hf view: an HF transformers model directory - config.json from what
 * the reader and the bridge know of the architecture (ck->model), the
 * weights (already under the family's HF names: formats/bridge/bridge.h)
 * in safetensors files, SOURCE's other files (tokenizer files) passed
 * through (formats/safetensors/safetensors.h, "hf view"). */
#include "formats/safetensors/safetensors.h"
#include "formats/safetensors/safetensors_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* transformers' save_pretrained default, max_shard_size "5GB"; -o
 * shard_size= sets another. */
#define HF_SHARD_MAX 5000000000ull

static const char *torch_dtype(rs_dtype t)
{
	switch (t) {
	case RS_DTYPE_F16: return "float16";
	case RS_DTYPE_BF16: return "bfloat16";
	case RS_DTYPE_F32: return "float32";
	default: return NULL;
	}
}

/* OPTConfig's fields (transformers' configuration_opt.py), the ones a
 * metaseq OPT model fixes; the token ids are metaseq's dictionary's
 * (<s> 0, <pad> 1, </s> 2). */
static int opt_config(const rs_checkpoint *ck, rs_dtype dtype, uint64_t vocab,
		      char **out, size_t *len)
{
	const rs_model_config *m = &ck->model;
	int n = asprintf(out,
		"{\n"
		"  \"_name_or_path\": \"\",\n"
		"  \"activation_dropout\": 0.0,\n"
		"  \"activation_function\": \"%s\",\n"
		"  \"architectures\": [\n    \"OPTForCausalLM\"\n  ],\n"
		"  \"attention_dropout\": 0.0,\n"
		"  \"bos_token_id\": 2,\n"
		"  \"do_layer_norm_before\": %s,\n"
		"  \"dropout\": 0.0,\n"
		"  \"enable_bias\": true,\n"
		"  \"eos_token_id\": 2,\n"
		"  \"ffn_dim\": %u,\n"
		"  \"hidden_size\": %u,\n"
		"  \"init_std\": 0.02,\n"
		"  \"layer_norm_elementwise_affine\": true,\n"
		"  \"layerdrop\": 0.0,\n"
		"  \"max_position_embeddings\": %llu,\n"
		"  \"model_type\": \"opt\",\n"
		"  \"num_attention_heads\": %u,\n"
		"  \"num_hidden_layers\": %u,\n"
		"  \"pad_token_id\": 1,\n"
		"  \"tie_word_embeddings\": %s,\n"
		"  \"torch_dtype\": \"%s\",\n"
		"  \"use_cache\": true,\n"
		"  \"vocab_size\": %llu,\n"
		"  \"word_embed_proj_dim\": %u,\n"
		"  \"_remove_final_layer_norm\": %s\n"
		"}\n",
		m->activation, m->pre_norm ? "true" : "false", m->ffn,
		m->hidden, (unsigned long long)m->max_positions, m->heads,
		m->layers, m->tied ? "true" : "false", torch_dtype(dtype),
		(unsigned long long)vocab, m->hidden,
		m->pre_norm && !m->final_norm ? "true" : "false");

	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

/* LlamaConfig (transformers' configuration_llama.py): the user's
 * hf_config fields, then what the bridge knows over them. */
static int llama_config(const rs_checkpoint *ck, rs_dtype dtype,
			uint64_t vocab, char **out, size_t *len)
{
	const rs_model_config *m = &ck->model;
	cJSON *c = m->hf_config ? cJSON_Parse(m->hf_config) : cJSON_CreateObject();
	cJSON *arch = cJSON_CreateStringArray((const char *[]){ "LlamaForCausalLM" }, 1);
	const struct {
		const char *key;
		double v;
	} nums[] = {
		{ "hidden_size", m->hidden },
		{ "intermediate_size", m->ffn },
		{ "num_hidden_layers", m->layers },
		{ "num_attention_heads", m->heads },
		{ "num_key_value_heads", m->kv_heads },
		{ "head_dim", m->head_dim },
		{ "vocab_size", (double)vocab },
		{ "max_position_embeddings", (double)m->max_positions },
		{ "rms_norm_eps", m->norm_eps },
		{ "rope_theta", m->rope_theta },
	};
	int err = c && arch ? 0 : -ENOMEM;

	cJSON_DeleteItemFromObjectCaseSensitive(c, "architectures");
	if (!err && !cJSON_AddItemToObject(c, "architectures", arch))
		err = -ENOMEM;
	else if (err)
		cJSON_Delete(arch);
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]) && !err; i++) {
		cJSON_DeleteItemFromObjectCaseSensitive(c, nums[i].key);
		if (!cJSON_AddNumberToObject(c, nums[i].key, nums[i].v))
			err = -ENOMEM;
	}
	{
		const char *strs[][2] = {
			{ "model_type", "llama" },
			{ "hidden_act", "silu" },
			{ "torch_dtype", torch_dtype(dtype) },
		};
		const char *bools[] = { "attention_bias", "mlp_bias",
					"tie_word_embeddings" };

		for (size_t i = 0; i < 3 && !err; i++) {
			cJSON_DeleteItemFromObjectCaseSensitive(c, strs[i][0]);
			if (!cJSON_AddStringToObject(c, strs[i][0], strs[i][1]))
				err = -ENOMEM;
		}
		for (size_t i = 0; i < 3 && !err; i++) {
			cJSON_DeleteItemFromObjectCaseSensitive(c, bools[i]);
			if (!cJSON_AddBoolToObject(c, bools[i],
						   i == 2 ? m->tied : false))
				err = -ENOMEM;
		}
	}
	if (!err) {
		char *text = cJSON_Print(c);
		size_t n = text ? strlen(text) : 0;

		*out = text ? malloc(n + 2) : NULL;
		if (*out) {
			memcpy(*out, text, n);
			(*out)[n] = '\n';
			(*out)[n + 1] = 0;
			*len = n + 1;
		} else {
			err = -ENOMEM;
		}
		free(text);
	}
	cJSON_Delete(c);
	return err;
}

/* What the family's HF model cannot hold, refused with the reason. */
static int check_model(const rs_checkpoint *ck, const rs_layout *l,
		       rs_diag *d)
{
	const rs_model_config *m = &ck->model;
	static const char *const acts[] = { "relu", "gelu", "gelu_new",
					    "silu", "tanh", NULL };
	bool act_ok = false;

	if (!m->family && m->why[0]) {
		rs_diag_add(d, "%s (the hf view needs the model's architecture)",
			    m->why);
		return -EINVAL;
	}
	if (!m->family) {
		rs_diag_add(d, "%s: the hf view needs the model's architecture, and this %s checkpoint does not say it (a metaseq checkpoint's cfg with decoder_layers, decoder_embed_dim, decoder_ffn_embed_dim, decoder_attention_heads and max_target_positions)",
			    ck->dir_path, ck->format->name);
		return -EINVAL;
	}
	if (l->tp != 1) {
		rs_diag_add(d, "%s: the hf view is one model directory: mount it without tp= (or with tp=1)",
			    ck->dir_path);
		return -EINVAL;
	}
	if (strcmp(m->family->name, "opt"))
		return 0;
	if (m->embed_scaled) {
		rs_diag_add(d, "%s: %s: no_scale_embedding is false (embeddings times sqrt(%u)), which HF's OPT cannot express",
			    ck->dir_path, m->from, m->hidden);
		return -EINVAL;
	}
	for (int i = 0; acts[i]; i++)
		act_ok = act_ok || strcmp(acts[i], m->activation) == 0;
	if (!act_ok) {
		rs_diag_add(d, "%s: %s: activation_fn \"%s\" has no HF OPT counterpart",
			    ck->dir_path, m->from, m->activation);
		return -EINVAL;
	}
	return 0;
}

int rs_hf_build_view(const rs_checkpoint *ck, const rs_layout *l,
		     rs_vtree *t, rs_diag *d)
{
	const rs_catalog *c = &ck->catalog;
	char *config = NULL;
	bool opt;
	const char *embed;
	rs_dtype dtype = RS_DTYPE_INVALID;
	uint64_t vocab = 0;
	size_t len = 0;
	uint32_t file;
	int err = check_model(ck, l, d);

	if (err)
		return err;
	/* The catalog is under HF names already (the bridge renamed it). */
	opt = strcmp(ck->model.family->name, "opt") == 0;
	embed = opt ? "model.decoder.embed_tokens.weight"
		    : "model.embed_tokens.weight";
	for (size_t i = 0; i < c->count; i++)
		if (strcmp(c->tensors[i].name, embed) == 0) {
			vocab = l->targets[i].shape[0];
			dtype = l->targets[i].dtype;
		}
	if (!vocab || !torch_dtype(dtype)) {
		rs_diag_add(d, "%s: the hf view needs %s in float16, bfloat16 or float32",
			    ck->dir_path, embed);
		return -EINVAL;
	}
	err = rs_safetensors_write(ck, l, t, NULL,
				   l->shard_size ? l->shard_size : HF_SHARD_MAX,
				   d);
	if (!err)
		err = opt ? opt_config(ck, dtype, vocab, &config, &len)
			  : llama_config(ck, dtype, vocab, &config, &len);
	if (!err)
		err = rs_vtree_add_file(t, 0, "config.json", ck->root_mtime,
					&file);
	if (err == -EEXIST) {
		rs_diag_add(d, "%s/config.json: the hf view writes a file of this name itself",
			    ck->dir_path);
		err = -EINVAL;
	}
	if (!err)
		err = rs_vtree_append_literal(t, file, config, len);
	free(config);
	return err;
}

const rs_format_def rs_hf_format = {
	.name = "hf",
	.build_view = rs_hf_build_view,
};
