/* llama: the hyperparameters of a Llama-family model (RMSNorm, SwiGLU,
 * RoPE, no biases) for the bridge - from Megatron's args and the user's
 * hf_config, checked against the shapes (to HF), or from an HF config.json
 * (to megatron-core). */
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "planner/user_file.h"

#define CONFIG_MAX (1u << 20)

/* One fact: its LlamaConfig field, what the args said (NAN unknown), and
 * where it goes. */
typedef struct {
	const char *field;
	double args;
	double *out;
	bool needed;
} fact;

static void fmt(char *out, size_t size, const char *field, double v)
{
	if (strcmp(field, "tie_word_embeddings") == 0)
		snprintf(out, size, "%s", v ? "true" : "false");
	else
		snprintf(out, size, "%.17g", v);
}

/* The user's hf_config file, parsed (NULL when not given). */
static int read_user(rs_checkpoint *ck, const char *path, cJSON **out,
		     rs_diag *d)
{
	char why[160];
	size_t len = 0;
	char *text;
	int err;

	*out = NULL;
	if (!path)
		return 0;
	text = rs_user_file_read(path, CONFIG_MAX, "hf_config file", &len, d);
	if (!text)
		return -EINVAL;
	err = rs_json_parse_object(text, len, out, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s (-o hf_config= takes a JSON object of LlamaConfig fields)",
			    path, why);
	if (err)
		free(text);
	else
		ck->model.hf_config = text;
	return err;
}

/* The args' and the user's value of each fact, which must agree. */
static int settle(const rs_checkpoint *ck, const rs_bridge_opts *o,
		  const cJSON *user, fact *facts, size_t n, rs_diag *d)
{
	char missing[300] = "";
	size_t at = 0;
	int err = 0;

	for (size_t i = 0; i < n; i++) {
		fact *f = &facts[i];
		double u = NAN;
		int got = user ? rs_facts_hf_number(user, f->field, o->hf_config,
						    &u, d) : 0;
		char x[40], y[40];

		if (got < 0) {
			err = -EINVAL;
			continue;
		}
		if (got > 0 && !isnan(f->args) && u != f->args) {
			fmt(x, sizeof(x), f->field, u);
			fmt(y, sizeof(y), f->field, f->args);
			rs_diag_add(d, "%s: %s is %s, but %s of %s say %s",
				    o->hf_config, f->field, x,
				    ck->facts.from, ck->dir_path, y);
			err = -EINVAL;
			continue;
		}
		*f->out = got > 0 ? u : f->args;
		if (f->needed && isnan(*f->out))
			at += (size_t)snprintf(missing + at,
					       at < sizeof(missing) ? sizeof(missing) - at : 0,
					       "%s%s", at ? ", " : "", f->field);
	}
	if (at && !err) {
		rs_diag_add(d, "%s: the hf view needs %s, which this checkpoint does not record: give %s in -o hf_config=FILE (a JSON object of LlamaConfig fields)",
			    ck->dir_path, missing, strchr(missing, ',') ? "them" : "it");
		err = -EINVAL;
	}
	return err;
}

static double known_u(uint64_t v)
{
	return v ? (double)v : NAN;
}

int rs_llama_from_mcore(rs_checkpoint *ck, const rs_family *f,
			const rs_bridge_opts *o, rs_map_dims *dims,
			rs_diag *d)
{
	const rs_model_facts *a = &ck->facts;
	rs_model_config *m = &ck->model;
	double heads, groups, vocab, maxpos, tied, eps, theta;
	double vocab_args = known_u(a->vocab);
	bool stored_out =
		rs_bridge_find(ck, f, "output_layer.weight") != SIZE_MAX ||
		rs_bridge_find(ck, f, "language_model.output_layer.weight") != SIZE_MAX;
	cJSON *user = NULL;
	int err;

	if (o->vocab_size) {
		if (!isnan(vocab_args) && vocab_args != (double)o->vocab_size) {
			rs_diag_add(d, "-o vocab_size=%llu: %s of %s say vocab_size %llu",
				    (unsigned long long)o->vocab_size, a->from,
				    ck->dir_path, (unsigned long long)a->vocab);
			return -EINVAL;
		}
		vocab_args = (double)o->vocab_size;
	}
	err = read_user(ck, o->hf_config, &user, d);
	if (err)
		return err;
	{
		fact facts[] = {
			{ "num_attention_heads", known_u(a->heads), &heads, true },
			{ "num_key_value_heads", known_u(a->query_groups), &groups, true },
			{ "vocab_size", vocab_args, &vocab, true },
			{ "max_position_embeddings", known_u(a->max_positions), &maxpos, true },
			{ "rms_norm_eps", a->norm_eps, &eps, true },
			{ "rope_theta", a->rope_theta, &theta, true },
			{ "tie_word_embeddings", a->tied < 0 ? NAN : a->tied, &tied, false },
		};

		err = settle(ck, o, user, facts, sizeof(facts) / sizeof(facts[0]), d);
	}
	/* An output layer stored is an untied one (megatron-core saves none
	 * when it shares the embeddings). */
	if (!err && !isnan(tied) && (tied != 0) == stored_out) {
		rs_diag_add(d, "%s: tie_word_embeddings is %s (%s), but SOURCE %s output_layer.weight",
			    ck->dir_path, tied ? "true" : "false",
			    user && cJSON_GetObjectItemCaseSensitive(user, "tie_word_embeddings")
				    ? o->hf_config : a->from,
			    stored_out ? "stores" : "has no");
		err = -EINVAL;
	}
	if (!err && a->normalization && strcmp(a->normalization, "RMSNorm")) {
		rs_diag_add(d, "%s: %s say normalization %s; the hf view writes Llama, whose norms are RMSNorm",
			    ck->dir_path, a->from, a->normalization);
		err = -EINVAL;
	}
	if (!err && a->gated == 0) {
		rs_diag_add(d, "%s: %s say swiglu is false; the hf view writes Llama, whose MLP is SwiGLU",
			    ck->dir_path, a->from);
		err = -EINVAL;
	}
	if (!err && a->position && strcmp(a->position, "rope")) {
		rs_diag_add(d, "%s: %s say position_embedding_type %s; the hf view writes Llama, which uses RoPE",
			    ck->dir_path, a->from, a->position);
		err = -EINVAL;
	}
	if (!err && (heads < 1 || groups < 1 || heads > UINT32_MAX ||
		     groups > UINT32_MAX || (uint32_t)heads % (uint32_t)groups)) {
		rs_diag_add(d, "%s: %.0f attention heads do not divide into %.0f key/value heads",
			    ck->dir_path, heads, groups);
		err = -EINVAL;
	}
	cJSON_Delete(user);
	if (err)
		return err;
	m->from = a->from ? a->from : "hf_config";
	m->heads = (uint32_t)heads;
	m->kv_heads = (uint32_t)groups;
	m->vocab = (uint64_t)vocab;
	m->max_positions = (uint64_t)maxpos;
	m->norm_eps = eps;
	m->rope_theta = theta;
	m->tied = !stored_out;
	*dims = (rs_map_dims){ m->heads, m->kv_heads, m->vocab, m->tied };
	return 0;
}

static const rs_tensor *find_out(const rs_checkpoint *ck, const char *name)
{
	for (size_t i = 0; i < ck->catalog.count; i++)
		if (strcmp(ck->catalog.tensors[i].name, name) == 0)
			return &ck->catalog.tensors[i];
	return NULL;
}

/* After the remap: what the HF tensors' shapes say, against the user's
 * fields. */
int rs_llama_check_mcore(rs_checkpoint *ck, const rs_bridge_opts *o,
			 rs_diag *d)
{
	rs_model_config *m = &ck->model;
	const rs_tensor *e = find_out(ck, "model.embed_tokens.weight");
	const rs_tensor *q = find_out(ck, "model.layers.0.self_attn.q_proj.weight");
	const rs_tensor *g = find_out(ck, "model.layers.0.mlp.gate_proj.weight");
	const rs_tensor *dn = find_out(ck, "model.layers.0.mlp.down_proj.weight");
	cJSON *user = NULL;
	char name[64];
	int err = 0;

	if (!e || e->ndim != 2 || !q || q->ndim != 2 || !g || g->ndim != 2 ||
	    !dn || dn->ndim != 2) {
		rs_diag_add(d, "%s: the hf view needs embeddings and a layer 0 with linear_qkv and linear_fc1 of two axes each",
			    ck->dir_path);
		return -EINVAL;
	}
	if (e->shape[1] > UINT32_MAX || g->shape[0] > UINT32_MAX ||
	    q->shape[0] / m->heads > UINT32_MAX) {
		rs_diag_add(d, "%s: embeddings of %llu columns or linear_fc1 of %llu rows: beyond the sizes an HF config holds",
			    ck->dir_path, (unsigned long long)e->shape[1],
			    (unsigned long long)(2 * g->shape[0]));
		return -EINVAL;
	}
	m->hidden = (uint32_t)e->shape[1];
	m->ffn = (uint32_t)g->shape[0];
	m->head_dim = (uint32_t)(q->shape[0] / m->heads);
	m->dtype = e->dtype;
	for (m->layers = 0; m->layers < (1u << 16); m->layers++) {
		snprintf(name, sizeof(name), "model.layers.%u.self_attn.q_proj.weight",
			 m->layers);
		if (!find_out(ck, name))
			break;
	}
	if (dn->shape[1] != g->shape[0]) {
		rs_diag_add(d, "%s: linear_fc1 has %llu rows, not twice linear_fc2's %llu columns: not a gated (SwiGLU) MLP, which Llama's is",
			    ck->dir_path, (unsigned long long)(2 * g->shape[0]),
			    (unsigned long long)dn->shape[1]);
		return -EINVAL;
	}
	{
		const rs_tensor *op = find_out(ck, "model.layers.0.self_attn.o_proj.weight");

		if (!op || op->ndim != 2 || op->shape[1] != q->shape[0]) {
			rs_diag_add(d, "%s: linear_proj's columns are not the %llu rows of %u query heads (num_attention_heads) that linear_qkv gives",
				    ck->dir_path, (unsigned long long)q->shape[0],
				    m->heads);
			return -EINVAL;
		}
	}
	if (ck->facts.head_dim && ck->facts.head_dim != m->head_dim) {
		rs_diag_add(d, "%s: %s say kv_channels %u, but linear_qkv's rows give %u per head",
			    ck->dir_path, ck->facts.from, ck->facts.head_dim,
			    m->head_dim);
		return -EINVAL;
	}
	if (m->hf_config && rs_json_parse_object(m->hf_config, strlen(m->hf_config),
						 &user, name, sizeof(name)) == 0) {
		const struct {
			const char *field;
			uint64_t v;
		} shown[] = {
			{ "hidden_size", m->hidden },
			{ "intermediate_size", m->ffn },
			{ "num_hidden_layers", m->layers },
			{ "head_dim", m->head_dim },
		};

		for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
			double u;

			int got = rs_facts_hf_number(user, shown[i].field,
						     o->hf_config, &u, d);

			if (got < 0)
				err = -EINVAL;
			if (got > 0 && u != (double)shown[i].v) {
				rs_diag_add(d, "%s: %s is %.17g, but the checkpoint's tensors say %llu",
					    o->hf_config, shown[i].field, u,
					    (unsigned long long)shown[i].v);
				err = -EINVAL;
			}
		}
		cJSON_Delete(user);
	}
	return err;
}

int rs_llama_from_hf(rs_checkpoint *ck, const rs_family *f,
		     rs_map_dims *dims, rs_diag *d)
{
	char *text = NULL, why[160], path[PATH_MAX + 16];
	size_t len = 0;
	cJSON *cfg = NULL;
	double bias = 0;
	const cJSON *type;
	int err = rs_checkpoint_read_file(ck, "config.json", CONFIG_MAX, &text,
					  &len, NULL, d);

	(void)f;
	snprintf(path, sizeof(path), "%s/config.json", ck->dir_path);
	if (err == -ENOENT) {
		rs_diag_add(d, "%s: missing; -o names=mcore takes an HF transformers model directory (save_pretrained's config.json and safetensors)",
			    path);
		return -EINVAL;
	}
	if (err)
		return err;
	err = rs_json_parse_object(text, len, &cfg, why, sizeof(why));
	free(text);
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s", path, why);
	if (err)
		return err;
	type = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
	if (!cJSON_IsString(type) || strcmp(type->valuestring, "llama")) {
		rs_diag_add(d, "%s: model_type is %s%s%s; -o names=mcore maps the llama family (formats/model.c)",
			    path, cJSON_IsString(type) ? "\"" : "",
			    cJSON_IsString(type) ? type->valuestring : "not given",
			    cJSON_IsString(type) ? "\"" : "");
		err = -EINVAL;
	}
	/* the heads, KV heads, vocab and tying: the safetensors reader has
	 * read them from this file into ck->facts, range-checked */
	if (!err && !ck->facts.heads) {
		rs_diag_add(d, "%s: num_attention_heads is missing", path);
		err = -EINVAL;
	}
	if (!err && ((rs_facts_hf_number(cfg, "attention_bias", path, &bias, d) > 0 && bias) ||
		     (rs_facts_hf_number(cfg, "mlp_bias", path, &bias, d) > 0 && bias))) {
		rs_diag_add(d, "%s: attention_bias or mlp_bias is set; the llama table (formats/model.c) maps models without biases",
			    path);
		err = -EINVAL;
	}
	cJSON_Delete(cfg);
	if (err)
		return err;
	ck->model.from = "config.json";
	ck->model.heads = ck->facts.heads;
	ck->model.kv_heads = ck->facts.query_groups;
	ck->model.vocab = ck->facts.vocab;
	ck->model.tied = ck->facts.tied == 1;   /* LlamaConfig's default: untied */
	*dims = (rs_map_dims){ ck->model.heads, ck->model.kv_heads, 0,
			       ck->model.tied };
	return 0;
}
