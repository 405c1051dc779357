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

/* config.json: the bridge's (its family's facts), with the dtype the
 * view writes. */
static int config_text(const rs_checkpoint *ck, rs_dtype dtype, char **out,
		       size_t *len)
{
	cJSON *c = cJSON_Parse(ck->model.hf_config_out);
	char *text = NULL;
	size_t n;
	int err = c ? 0 : -ENOMEM;

	if (!err) {
		cJSON_DeleteItemFromObjectCaseSensitive(c, "torch_dtype");
		if (!cJSON_AddStringToObject(c, "torch_dtype", torch_dtype(dtype)) ||
		    !(text = cJSON_Print(c)))
			err = -ENOMEM;
	}
	cJSON_Delete(c);
	if (err)
		return err;
	n = strlen(text);
	*out = malloc(n + 2);
	if (!*out) {
		free(text);
		return -ENOMEM;
	}
	memcpy(*out, text, n);
	(*out)[n] = '\n';
	(*out)[n + 1] = 0;
	*len = n + 1;
	free(text);
	return 0;
}

/* What the family's HF model cannot hold, refused with the reason. */
static int check_model(const rs_checkpoint *ck, const rs_layout *l,
		       rs_diag *d)
{
	const rs_model_config *m = &ck->model;

	if (m->hf_names) {
		/* named as HF names them; config.json the source's */
		if (!m->hf_config_out) {
			rs_diag_add(d, "%s: the hf view needs the model's config.json, and there is none in the save directory or beside the tag directory; give it with -o hf_config=FILE",
				    ck->dir_path);
			return -EINVAL;
		}
	} else if (!m->family && m->why[0]) {
		rs_diag_add(d, "%s (the hf view needs the model's architecture)",
			    m->why);
		return -EINVAL;
	} else if (!m->family || !m->hf_config_out) {
		rs_diag_add(d, "%s: the hf view needs the model's architecture, and this %s checkpoint does not say it (a metaseq checkpoint's cfg with decoder_layers, decoder_embed_dim, decoder_ffn_embed_dim, decoder_attention_heads and max_target_positions)",
			    ck->dir_path, ck->format->name);
		return -EINVAL;
	}
	if (l->tp != 1) {
		rs_diag_add(d, "%s: the hf view is one model directory: mount it without tp= (or with tp=1)",
			    ck->dir_path);
		return -EINVAL;
	}
	return 0;
}

/* config.json at the top of the view. */
static int add_config(const rs_checkpoint *ck, rs_dtype dtype, rs_vtree *t,
		      rs_diag *d)
{
	char *config = NULL;
	size_t len = 0;
	uint32_t file;
	int err = config_text(ck, dtype, &config, &len);

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

/* A source whose reader named its tensors as HF does (DeepSpeed's save
 * of an HF model): the model's tensors as named, no optimizer state;
 * config.json the source's, its torch_dtype the view's. */
static int hf_names_view(const rs_checkpoint *ck, const rs_layout *l,
			 rs_vtree *t, rs_diag *d)
{
	const rs_catalog *c = &ck->catalog;
	const char **names = calloc(c->count + 1, sizeof(*names));
	rs_dtype dtype = RS_DTYPE_INVALID;
	int err = names ? 0 : -ENOMEM;

	for (size_t i = 0; !err && i < c->count; i++) {
		if (strncmp(c->tensors[i].name, "optimizer.", 10) == 0)
			continue;
		names[i] = c->tensors[i].name;
		if (!torch_dtype(dtype) && torch_dtype(l->targets[i].dtype))
			dtype = l->targets[i].dtype;
	}
	if (!err && !torch_dtype(dtype)) {
		rs_diag_add(d, "%s: the hf view needs weights in float16, bfloat16 or float32",
			    ck->dir_path);
		err = -EINVAL;
	}
	if (!err)
		err = rs_safetensors_write(ck, l, t, names,
					   l->shard_size ? l->shard_size : HF_SHARD_MAX,
					   d);
	if (!err)
		err = add_config(ck, dtype, t, d);
	free(names);
	return err;
}

int rs_hf_build_view(const rs_checkpoint *ck, const rs_layout *l,
		     rs_vtree *t, rs_diag *d)
{
	const rs_catalog *c = &ck->catalog;
	const char *embed;
	rs_dtype dtype = RS_DTYPE_INVALID;
	uint64_t vocab = 0;
	int err = check_model(ck, l, d);

	if (err)
		return err;
	if (ck->model.hf_names)
		return hf_names_view(ck, l, t, d);
	/* The catalog is under HF names already (the bridge renamed it). */
	embed = ck->model.family->info->eco[1].embed;
	for (size_t i = 0; embed && i < c->count; i++)
		if (strcmp(c->tensors[i].name, embed) == 0) {
			vocab = l->targets[i].shape[0];
			dtype = l->targets[i].dtype;
		}
	if (!vocab || !torch_dtype(dtype)) {
		rs_diag_add(d, "%s: the hf view needs %s in float16, bfloat16 or float32",
			    ck->dir_path, embed ? embed : "the family's embeddings (its \"embed\" for hf)");
		return -EINVAL;
	}
	err = rs_safetensors_write(ck, l, t, NULL,
				   l->shard_size ? l->shard_size : HF_SHARD_MAX,
				   d);
	return err ? err : add_config(ck, dtype, t, d);
}

const rs_format_def rs_hf_format = {
	.name = "hf",
	.build_view = rs_hf_build_view,
};
