/* The model families and their name tables (formats/model.h). */
#include "formats/model.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* OPT: metaseq's TransformerDecoder names, the fused qkv_proj already
 * split into k/v/q_proj by the reader (formats/metaseq/stitch.c), to HF
 * transformers' OPTForCausalLM (the names its OPTDecoder registers). */
static const rs_name_pair opt_metaseq_hf[] = {
	{ "decoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", 0 },
	{ "decoder.embed_positions.weight", "model.decoder.embed_positions.weight", 0 },
	{ "decoder.layer_norm.weight", "model.decoder.final_layer_norm.weight", 0 },
	{ "decoder.layer_norm.bias", "model.decoder.final_layer_norm.bias", 0 },
	{ "decoder.layers.#.self_attn.q_proj.weight", "model.decoder.layers.#.self_attn.q_proj.weight", 0 },
	{ "decoder.layers.#.self_attn.q_proj.bias", "model.decoder.layers.#.self_attn.q_proj.bias", 0 },
	{ "decoder.layers.#.self_attn.k_proj.weight", "model.decoder.layers.#.self_attn.k_proj.weight", 0 },
	{ "decoder.layers.#.self_attn.k_proj.bias", "model.decoder.layers.#.self_attn.k_proj.bias", 0 },
	{ "decoder.layers.#.self_attn.v_proj.weight", "model.decoder.layers.#.self_attn.v_proj.weight", 0 },
	{ "decoder.layers.#.self_attn.v_proj.bias", "model.decoder.layers.#.self_attn.v_proj.bias", 0 },
	{ "decoder.layers.#.self_attn.out_proj.weight", "model.decoder.layers.#.self_attn.out_proj.weight", 0 },
	{ "decoder.layers.#.self_attn.out_proj.bias", "model.decoder.layers.#.self_attn.out_proj.bias", 0 },
	{ "decoder.layers.#.self_attn_layer_norm.weight", "model.decoder.layers.#.self_attn_layer_norm.weight", 0 },
	{ "decoder.layers.#.self_attn_layer_norm.bias", "model.decoder.layers.#.self_attn_layer_norm.bias", 0 },
	{ "decoder.layers.#.fc1.weight", "model.decoder.layers.#.fc1.weight", 0 },
	{ "decoder.layers.#.fc1.bias", "model.decoder.layers.#.fc1.bias", 0 },
	{ "decoder.layers.#.fc2.weight", "model.decoder.layers.#.fc2.weight", 0 },
	{ "decoder.layers.#.fc2.bias", "model.decoder.layers.#.fc2.bias", 0 },
	{ "decoder.layers.#.final_layer_norm.weight", "model.decoder.layers.#.final_layer_norm.weight", 0 },
	{ "decoder.layers.#.final_layer_norm.bias", "model.decoder.layers.#.final_layer_norm.bias", 0 },
	/* HF ties lm_head.weight to the embeddings and saves it not at all */
	{ "decoder.output_projection.weight", NULL, RS_WHEN_TIED },
	{ "decoder.output_projection.weight", "lm_head.weight", RS_WHEN_UNTIED },
	{ "decoder.version", NULL, 0 },
	{ NULL, NULL, 0 },
};

static const rs_family families[] = {
	{ "opt", "metaseq", "hf", opt_metaseq_hf },
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

/* Whether name matches pattern; *num (at most 20 digits) receives what
 * '#' stood for. */
static bool match(const char *pat, const char *name, char *num)
{
	num[0] = 0;
	for (; *pat; pat++) {
		if (*pat == '#') {
			size_t n = strspn(name, "0123456789");

			if (n == 0 || n > 20)
				return false;
			memcpy(num, name, n);
			num[n] = 0;
			name += n;
		} else if (*pat != *name++) {
			return false;
		}
	}
	return *name == 0;
}

int rs_family_rename(const rs_family *f, bool tied, const char *name,
		     char *out, size_t size)
{
	for (const rs_name_pair *p = f->pairs; p->from; p++) {
		char num[24];
		size_t at = 0;

		if ((p->when == RS_WHEN_TIED && !tied) ||
		    (p->when == RS_WHEN_UNTIED && tied) ||
		    !match(p->from, name, num))
			continue;
		if (!p->to)
			return 0;
		for (const char *s = p->to; *s; s++) {
			const char *piece = *s == '#' ? num : s;
			size_t n = *s == '#' ? strlen(num) : 1;

			if (at + n >= size)
				return -ENAMETOOLONG;
			memcpy(out + at, piece, n);
			at += n;
		}
		out[at] = 0;
		return 1;
	}
	return -ENOENT;
}
