#include "planner/rules.h"
#include "planner/user_file.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rs_rules {
	rs_rule *user;
	size_t nuser;
};

/* Megatron-core GPT/Llama names (docs/FORMATS.md, "Megatron-core dist
 * checkpoints"), then the other families.  Replicated tensors need no
 * rule to be served correctly, but listing them keeps them out of the
 * "no rule knows this array" log. */
/* Per-expert keys (singleton_local_shards) name the global expert here. */
#define SINGLETON "experts.experts."

static const rs_rule builtin[] = {
	/* Mixture-of-Experts (docs/FORMATS.md, "Mixture-of-Experts"): expert
	 * weights carry a global expert axis first and are split by expert TP
	 * (etp), fc1 by its rows, fc2 by its columns.  With
	 * singleton_local_shards each expert is a key of its own (no expert
	 * axis) and a gated fc1 is two keys, W and V.  Routers are replicated;
	 * shared experts are a dense MLP split by TP. */
	{ "*mlp.experts.experts.linear_fc1.weight", RS_SPLIT_AXIS, 1, -1, 0, true, NULL },
	{ "*mlp.experts.experts.linear_fc1.bias", RS_SPLIT_AXIS, 1, -1, 0, true, NULL },
	{ "*mlp.experts.experts.linear_fc2.weight", RS_SPLIT_AXIS, 2, -1, 0, true, NULL },
	{ "*mlp.experts.experts.linear_fc2.bias", RS_SPLIT_NONE, 0, -1, 0, false, NULL },
	{ "*mlp.experts.experts.*.linear_fc1.weight", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc1.weight_w", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc1.weight_v", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc1.bias", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc1.bias_w", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc1.bias_v", RS_SPLIT_AXIS, 0, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc2.weight", RS_SPLIT_AXIS, 1, -1, -1, true, SINGLETON },
	{ "*mlp.experts.experts.*.linear_fc2.bias", RS_SPLIT_NONE, 0, -1, -1, false, SINGLETON },
	{ "*mlp.router.weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*mlp.router.expert_bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*mlp.shared_experts.linear_fc1.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.shared_experts.linear_fc1.weight_w", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.shared_experts.linear_fc1.weight_v", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.shared_experts.linear_fc1.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.shared_experts.linear_fc2.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*mlp.shared_experts.gate_weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.weight_w", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.weight_v", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.bias_w", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.bias_v", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_qkv.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_qkv.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc1.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_proj.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	/* multi-latent attention (DeepSeek-V3): the down and up projections
	 * are column-parallel, split by their rows */
	{ "*self_attention.linear_q_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_q_down_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_q_up_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_kv_down_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.linear_kv_up_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.linear_fc2.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*embedding.word_embeddings.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*output_layer.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*linear_proj.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*linear_fc2.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*layer_norm_weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*layer_norm_bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*layernorm.weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*layernorm.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*final_layernorm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*position_embeddings.weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	/* Legacy Megatron-LM / NeMo per-rank names (docs/FORMATS.md, "Legacy Megatron"); a gated
	 * dense_h_to_4h is [W; V], its multiplier 2 read from the grid. */
	{ "*self_attention.query_key_value.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.query_key_value.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attention.dense.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*self_attention.dense.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*.attention.query_key_value.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*.attention.query_key_value.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*.attention.dense.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*.attention.dense.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*mlp.dense_h_to_4h.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.dense_h_to_4h.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.dense_4h_to_h.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*mlp.dense_4h_to_h.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*word_embeddings.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*word_embeddings_for_head.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*input_norm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*post_attention_norm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*input_layernorm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*post_attention_layernorm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*final_norm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	/* HF Llama-style names (safetensors): q/k/v/gate/up column, o/down
	 * row, embed_tokens/lm_head vocab. */
	{ "*self_attn.q_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.q_proj.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.k_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.k_proj.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.v_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.v_proj.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*self_attn.o_proj.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*self_attn.o_proj.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*mlp.gate_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.up_proj.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*mlp.down_proj.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*embed_tokens.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*lm_head.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*norm.weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	/* metaseq / OPT names (docs/FORMATS.md, "metaseq"): q/k/v and fc1 on dim 0,
	 * out_proj and fc2 on dim 1. */
	{ "*self_attn.out_proj.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*self_attn.out_proj.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*.fc1.weight", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*.fc1.bias", RS_SPLIT_AXIS, 0, -1, -1, false, NULL },
	{ "*.fc2.weight", RS_SPLIT_AXIS, 1, -1, -1, false, NULL },
	{ "*.fc2.bias", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*embed_positions.weight", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
	{ "*output_projection.weight", RS_SPLIT_VOCAB, 0, -1, -1, false, NULL },
	{ "*layer_norm.*", RS_SPLIT_NONE, 0, -1, -1, false, NULL },
};
#define N_BUILTIN (sizeof(builtin) / sizeof(builtin[0]))

int rs_rules_new(rs_rules **out)
{
	*out = calloc(1, sizeof(rs_rules));
	return *out ? 0 : -ENOMEM;
}

void rs_rules_free(rs_rules *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nuser; i++) {
		free(r->user[i].match);
		free(r->user[i].expert_key);
	}
	free(r->user);
	free(r);
}

bool rs_glob_match(const char *p, const char *s)
{
	const char *star = NULL, *resume = NULL;

	while (*s) {
		if (*p == '*') {
			star = p++;
			resume = s;
		} else if (*p == *s) {
			p++;
			s++;
		} else if (star) {
			p = star + 1;
			s = ++resume;
		} else {
			return false;
		}
	}
	while (*p == '*')
		p++;
	return *p == 0;
}

static const char *strip_prefix(const char *s, const char *prefix)
{
	size_t n = strlen(prefix);

	return strncmp(s, prefix, n) == 0 ? s + n : s;
}

const char *rs_rules_base_name(const char *key)
{
	const char *s = strip_prefix(key, "optimizer.state.");

	if (s != key) {
		const char *dot = strchr(s, '.');   /* past "<state>." */

		s = dot ? dot + 1 : key;
	}
	return strip_prefix(s, "model.");
}

static int infer_layer_axes(const char *base)
{
	static const char layers[] = "decoder.layers.";

	if (strncmp(base, layers, sizeof(layers) - 1) != 0)
		return 0;
	return isdigit((unsigned char)base[sizeof(layers) - 1]) ? 0 : 1;
}

int rs_rules_layer_axes(const char *key)
{
	return infer_layer_axes(rs_rules_base_name(key));
}

int64_t rs_rule_expert_of_name(const rs_rule *r, const char *key)
{
	const char *base = rs_rules_base_name(key), *at;
	uint64_t v = 0;
	int digits = 0;

	if (!r->expert_key || !(at = strstr(base, r->expert_key)))
		return -1;
	for (at += strlen(r->expert_key); *at >= '0' && *at <= '9'; at++) {
		if (++digits > 9)
			return -1;
		v = v * 10 + (uint64_t)(*at - '0');
	}
	return digits && *at == '.' ? (int64_t)v : -1;
}

const rs_rule *rs_rules_match(const rs_rules *r, const char *key,
			      int *layer_axes)
{
	const char *base = rs_rules_base_name(key);
	const rs_rule *hit = NULL;

	for (size_t i = 0; r && i < r->nuser && !hit; i++)
		if (rs_glob_match(r->user[i].match, base))
			hit = &r->user[i];
	for (size_t i = 0; i < N_BUILTIN && !hit; i++)
		if (rs_glob_match(builtin[i].match, base))
			hit = &builtin[i];
	*layer_axes = (hit && hit->layer_axes >= 0) ? hit->layer_axes
						    : infer_layer_axes(base);
	return hit;
}

/* A rule's axis count or index: an integer from 0 to RS_RULE_MAX_AXIS - 1,
 * checked before it is narrowed. */
static int axis_field(const cJSON *v, const char *name, int *out,
		      const char *path, size_t index, rs_diag *d)
{
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
	    v->valuedouble >= RS_RULE_MAX_AXIS ||
	    v->valuedouble != (int)v->valuedouble) {
		rs_diag_add(d, "%s: rule %zu: \"%s\" must be an integer from 0 to %d",
			    path, index, name, RS_RULE_MAX_AXIS - 1);
		return -EINVAL;
	}
	*out = (int)v->valuedouble;
	return 0;
}

static int parse_rule(const cJSON *item, rs_rule *rule, const char *path,
		      size_t index, rs_diag *d)
{
	const cJSON *match = cJSON_GetObjectItemCaseSensitive(item, "match");
	const cJSON *split = cJSON_GetObjectItemCaseSensitive(item, "split");
	const cJSON *axis = cJSON_GetObjectItemCaseSensitive(item, "axis");
	const cJSON *layers = cJSON_GetObjectItemCaseSensitive(item, "layer_axes");
	const cJSON *experts = cJSON_GetObjectItemCaseSensitive(item, "expert_axis");
	const cJSON *etp = cJSON_GetObjectItemCaseSensitive(item, "etp");
	const cJSON *key = cJSON_GetObjectItemCaseSensitive(item, "expert_key");

	memset(rule, 0, sizeof(*rule));
	rule->layer_axes = -1;
	rule->expert_axis = -1;
	if (!cJSON_IsObject(item) || !cJSON_IsString(match) ||
	    !match->valuestring[0]) {
		rs_diag_add(d, "%s: rule %zu: needs a non-empty string \"match\"",
			    path, index);
		return -EINVAL;
	}
	if (split && axis) {
		rs_diag_add(d, "%s: rule %zu: give \"split\" or \"axis\", not both",
			    path, index);
		return -EINVAL;
	}
	if (split) {
		const char *s = cJSON_IsString(split) ? split->valuestring : "";

		if (strcmp(s, "column") == 0) {
			rule->split = RS_SPLIT_AXIS;
			rule->axis = 0;
		} else if (strcmp(s, "row") == 0) {
			rule->split = RS_SPLIT_AXIS;
			rule->axis = 1;
		} else if (strcmp(s, "vocab") == 0) {
			rule->split = RS_SPLIT_VOCAB;
		} else if (strcmp(s, "replicated") == 0) {
			rule->split = RS_SPLIT_NONE;
		} else {
			rs_diag_add(d, "%s: rule %zu: \"split\" must be column, row, vocab or replicated",
				    path, index);
			return -EINVAL;
		}
	} else if (axis) {
		if (axis_field(axis, "axis", &rule->axis, path, index, d))
			return -EINVAL;
		rule->split = RS_SPLIT_AXIS;
	} else {
		rs_diag_add(d, "%s: rule %zu: needs \"split\" or \"axis\"", path,
			    index);
		return -EINVAL;
	}
	if (layers && axis_field(layers, "layer_axes", &rule->layer_axes,
				 path, index, d))
		return -EINVAL;
	if (experts) {
		if (axis_field(experts, "expert_axis", &rule->expert_axis, path,
			       index, d))
			return -EINVAL;
		if (rule->split != RS_SPLIT_NONE &&
		    rule->axis == rule->expert_axis) {
			rs_diag_add(d, "%s: rule %zu: the split axis cannot be the expert axis",
				    path, index);
			return -EINVAL;
		}
	}
	if (etp) {
		if (!cJSON_IsBool(etp)) {
			rs_diag_add(d, "%s: rule %zu: \"etp\" must be true or false",
				    path, index);
			return -EINVAL;
		}
		rule->etp = cJSON_IsTrue(etp);
	}
	if (key && (!cJSON_IsString(key) || !key->valuestring[0] ||
		    strlen(key->valuestring) > RS_RULE_KEY_MAX ||
		    rule->expert_axis >= 0)) {
		rs_diag_add(d, "%s: rule %zu: \"expert_key\" must be a non-empty string of at most %d bytes, in a rule without \"expert_axis\"",
			    path, index, RS_RULE_KEY_MAX);
		return -EINVAL;
	}
	rule->match = strdup(match->valuestring);
	if (rule->match && key &&
	    !(rule->expert_key = strdup(key->valuestring))) {
		free(rule->match);
		rule->match = NULL;
	}
	return rule->match ? 0 : -ENOMEM;
}

/* Rules files are small; anything larger is a mistake, not a rules file. */
#define RS_RULES_MAX_BYTES (1u << 20)

int rs_rules_load_json(rs_rules *r, const char *path, rs_diag *d)
{
	char *text = rs_user_file_read(path, RS_RULES_MAX_BYTES, "rules file",
				       NULL, d);
	cJSON *root = NULL;
	const cJSON *list, *item;
	rs_rule *rules = NULL;
	size_t n = 0, i = 0;
	int err = -EINVAL;

	if (!text)
		return -EINVAL;
	root = cJSON_Parse(text);
	if (!root) {
		rs_diag_add(d, "%s: not valid JSON", path);
		goto out_text;
	}
	list = cJSON_GetObjectItemCaseSensitive(root, "rules");
	/* A file may hold only "names" rows or "families" (the bridge reads
	 * those: formats/bridge/rows.c, family.c). */
	if (!list && cJSON_IsObject(root) &&
	    (cJSON_GetObjectItemCaseSensitive(root, "names") ||
	     cJSON_GetObjectItemCaseSensitive(root, "families"))) {
		err = 0;
		goto out_json;
	}
	if (!cJSON_IsArray(list)) {
		rs_diag_add(d, "%s: needs a top-level object with a \"rules\" array (or a \"names\" or \"families\" list)",
			    path);
		goto out_json;
	}
	n = (size_t)cJSON_GetArraySize(list);
	rules = calloc(n ? n : 1, sizeof(*rules));
	if (!rules) {
		err = -ENOMEM;
		goto out_json;
	}
	cJSON_ArrayForEach(item, list) {
		err = parse_rule(item, &rules[i], path, i, d);
		if (err)
			goto out_rules;
		i++;
	}
	/* Later files go in front: the last -o rules= wins, like any option. */
	{
		rs_rule *all = malloc((n + r->nuser + 1) * sizeof(*all));

		if (!all) {
			err = -ENOMEM;
			goto out_rules;
		}
		memcpy(all, rules, n * sizeof(*all));
		if (r->nuser)
			memcpy(all + n, r->user, r->nuser * sizeof(*all));
		free(r->user);
		r->user = all;
		r->nuser += n;
		free(rules);
		rules = NULL;
		i = 0;
	}
	err = 0;
out_rules:
	for (size_t k = 0; k < i; k++) {
		free(rules[k].match);
		free(rules[k].expert_key);
	}
	free(rules);
out_json:
	cJSON_Delete(root);
out_text:
	free(text);
	return err;
}
