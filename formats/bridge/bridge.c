/* bridge: which family a mount's options ask for, and its application
 * (formats/bridge/bridge.h). */
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "formats/codec/torch_object.h"
#include "planner/array.h"
#include "planner/user_file.h"

#define RULES_MAX (1u << 20)

static bool is(const rs_format_def *f, const char *name)
{
	return f && strcmp(f->name, name) == 0;
}

static bool megatron_source(const rs_checkpoint *ck)
{
	return is(ck->format, "zarr") || is(ck->format, "torch_dist") ||
	       is(ck->format, "megatron");
}

/* The family the options ask for, or NULL. */
static const rs_family *family_of(const rs_checkpoint *ck,
				  const rs_bridge_opts *o)
{
	if (o->names)
		return rs_family_find("llama", "hf", "mcore");
	if (is(o->view, "hf") && megatron_source(ck))
		return rs_family_find("llama", "mcore", "hf");
	if (is(o->view, "hf") && ck->model.family)
		return ck->model.family;        /* the reader's (metaseq: OPT) */
	return NULL;
}

int rs_bridge_wanted(const rs_checkpoint *ck, const rs_bridge_opts *o,
		     rs_diag *d)
{
	if (o->names && strcmp(o->names, "mcore")) {
		rs_diag_add(d, "-o names=%s: the names a view can take are mcore (megatron-core's, of an HF Llama)",
			    o->names);
		return -EINVAL;
	}
	if (o->names && !is(ck->format, "safetensors")) {
		rs_diag_add(d, "-o names=mcore: %s is a %s checkpoint; names=mcore takes an HF transformers model directory (config.json and safetensors)",
			    ck->dir_path, ck->format->name);
		return -EINVAL;
	}
	if (o->names && (is(o->view, "hf") || is(o->view, "metaseq") ||
			 is(o->view, "safetensors"))) {
		rs_diag_add(d, "-o names=mcore: the %s view cannot take megatron-core names; choose -o format=zarr or torch_dist",
			    o->view->name);
		return -EINVAL;
	}
	if (o->hf_config && !(is(o->view, "hf") && megatron_source(ck))) {
		rs_diag_add(d, "-o hf_config=%s: only the hf view of a Megatron checkpoint (-o format=hf) takes an hf_config",
			    o->hf_config);
		return -EINVAL;
	}
	return family_of(ck, o) != NULL;
}

/* The user's rows for family f, from the rules file. */
static int user_rows(const rs_bridge_opts *o, const rs_family *f,
		     rs_map_row **rows, size_t *n, rs_diag *d)
{
	size_t len = 0;
	char *text, why[160];
	cJSON *root = NULL;
	int err;

	*rows = NULL;
	*n = 0;
	if (!o->rules_file)
		return 0;
	text = rs_user_file_read(o->rules_file, RULES_MAX, "rules file", &len, d);
	if (!text)
		return -EINVAL;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s", o->rules_file, why);
	if (!err)
		err = rs_bridge_rows_parse(root, f, o->rules_file, rows, n, d);
	cJSON_Delete(root);
	free(text);
	return err;
}

/* A tied output projection is left for the target to tie: it must be
 * the embeddings (the same stored bytes), not a tensor of its own. */
static int check_tied(const rs_checkpoint *ck, const rs_family *f,
		      const rs_map_dims *dims, rs_diag *d)
{
	size_t e = f->embed ? rs_bridge_find(ck, f, f->embed) : SIZE_MAX;

	if (!dims->tied || strcmp(f->to, "hf") || e == SIZE_MAX)
		return 0;
	for (const rs_map_row *r = f->rows; r->from[0]; r++) {
		size_t o;
		const rs_tensor *te, *to;

		if (r->when != RS_WHEN_TIED || r->to ||
		    (o = rs_bridge_find(ck, f, r->from[0])) == SIZE_MAX)
			continue;
		te = &ck->catalog.tensors[e];
		to = &ck->catalog.tensors[o];
		if (te->nfrags == to->nfrags &&
		    memcmp(te->frags, to->frags, te->nfrags * sizeof(*te->frags)) == 0)
			continue;
		rs_diag_add(d, "%s: %s says the output projection is tied to the embeddings, but %s is stored apart",
			    ck->dir_path, ck->model.from, to->name);
		return -EINVAL;
	}
	return 0;
}

/* pickle protocol 2 of None, [None] and {}, as torch.save writes them */
static const char pkl_none[] = "\x80\x02N.";
static const char pkl_list_none[] = "\x80\x02]q\x00Na.";
static const char pkl_dict[] = "\x80\x02}q\x00.";

/* megatron-core's view of a model: the objects its strict load asks for
 * (family f's, None in every layer), and a common.pt holding the empty
 * common state that dist_checkpointing.load reads first. */
static int make_mcore_files(rs_checkpoint *ck, const rs_family *f,
			    rs_diag *d)
{
	size_t qkv = rs_bridge_find(ck, f,
				    "decoder.layers.self_attention.linear_qkv.weight");
	uint64_t layers = qkv == SIZE_MAX ? 0 : ck->catalog.tensors[qkv].shape[0];
	int err = 0;

	if (rs_checkpoint_top_entry(ck, "common.pt")) {
		rs_diag_add(d, "%s/common.pt: an HF model directory holding megatron-core's common.pt; the view writes its own",
			    ck->dir_path);
		return -EINVAL;
	}
	for (size_t k = 0; f->objects && f->objects[k] && !err; k++) {
		const char *pat = f->objects[k], *at = strstr(pat, "#.");

		for (uint64_t l = 0; l < layers && !err; l++) {
			rs_blob *b;

			err = rs_array_reserve(&ck->blobs, &ck->cap_blobs,
					       ck->nblobs + 1, sizeof(*b));
			if (err)
				break;
			b = &ck->blobs[ck->nblobs];
			memset(b, 0, sizeof(*b));
			if (!at || asprintf(&b->fqn, "%.*s%s/shard_%llu_%llu",
					    (int)(at - pat), pat, at + 2,
					    (unsigned long long)l,
					    (unsigned long long)layers) < 0) {
				b->fqn = NULL;
				err = at ? -ENOMEM : -EINVAL;
				break;
			}
			ck->nblobs++;
			err = rs_torch_object_make(pkl_none, sizeof(pkl_none) - 1,
						   &b->made[0], &b->made_len[0]);
			if (!err)
				err = rs_torch_object_make(pkl_list_none,
							   sizeof(pkl_list_none) - 1,
							   &b->made[1], &b->made_len[1]);
		}
	}
	if (!err) {
		ck->made = calloc(1, sizeof(*ck->made));
		if (!ck->made || !(ck->made[0].name = strdup("common.pt")))
			err = -ENOMEM;
		else
			ck->nmade = 1;
	}
	if (!err)
		err = rs_torch_object_make(pkl_dict, sizeof(pkl_dict) - 1,
					   &ck->made[0].bytes, &ck->made[0].len);
	return err;
}

/* An HF model directory holds none of Megatron's own records: a dist
 * checkpoint's common.pt (its args, optimizer groups, rng state) is left
 * out of the hf view. */
static void hide_megatron_records(rs_checkpoint *ck)
{
	rs_entry *common = rs_checkpoint_top_entry(ck, "common.pt");

	if (common && !common->is_dir)
		common->hidden = true;
}

int rs_bridge_apply(rs_checkpoint *ck, const rs_bridge_opts *o, rs_diag *d)
{
	const rs_family *f = family_of(ck, o);
	rs_map_dims dims = { 0 };
	rs_map_row *rows = NULL;
	size_t nrows = 0;
	int err;

	if (!f)
		return 0;
	if (strcmp(f->from, "mcore") == 0)
		err = rs_llama_from_mcore(ck, f, o, &dims, d);
	else if (strcmp(f->from, "hf") == 0)
		err = rs_llama_from_hf(ck, f, &dims, d);
	else {
		dims = (rs_map_dims){ ck->model.heads, ck->model.heads,
				      ck->model.vocab, ck->model.tied };
		err = 0;
	}
	if (!err)
		err = check_tied(ck, f, &dims, d);
	if (!err)
		err = user_rows(o, f, &rows, &nrows, d);
	if (!err)
		err = rs_remap(ck, f, rows, nrows, o->rules_file, &dims, d);
	if (!err && strcmp(f->from, "mcore") == 0)
		err = rs_llama_check_mcore(ck, o, d);
	if (!err && strcmp(f->to, "mcore") == 0) {
		size_t e = rs_bridge_find(ck, f, "embedding.word_embeddings.weight");

		/* the true vocab: the embedding rows HF stores */
		if (e != SIZE_MAX && ck->catalog.tensors[e].ndim == 2)
			ck->model.vocab = ck->catalog.tensors[e].shape[0];
	}
	if (!err && strcmp(f->to, "mcore") == 0)
		err = make_mcore_files(ck, f, d);
	if (!err && strcmp(f->from, "mcore") == 0)
		hide_megatron_records(ck);
	if (!err && strcmp(f->to, "hf") == 0)
		ck->model.family = f;
	rs_bridge_rows_free(rows, nrows);
	return err;
}
