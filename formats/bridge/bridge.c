/* bridge: which family a mount's options ask for, and its application
 * (formats/bridge/bridge.h). */
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/bridge/family.h"
#include "formats/codec/json_text.h"
#include "formats/codec/torch_object.h"
#include "planner/array.h"
#include "planner/user_file.h"

#define RULES_MAX (1u << 20)
#define CONFIG_MAX (1u << 20)

static bool is(const rs_format_def *f, const char *name)
{
	return f && strcmp(f->name, name) == 0;
}

static bool megatron_source(const rs_checkpoint *ck)
{
	return is(ck->format, "zarr") || is(ck->format, "torch_dist") ||
	       is(ck->format, "megatron");
}

/* Whether the options ask for a bridge from SOURCE: the table's
 * direction, or NULL. */
static const char *direction(const rs_checkpoint *ck, const rs_bridge_opts *o,
			     const char **to)
{
	*to = o->names ? "mcore" : "hf";
	if (o->names)
		return "hf";
	if (is(o->view, "hf") && megatron_source(ck))
		return "mcore";
	if (ck->model.hf_names)
		return NULL;            /* the hf view writes them as named */
	if (is(o->view, "hf") && ck->model.family_name)
		return "metaseq";       /* the reader's (metaseq: OPT) */
	return NULL;
}

/* What a config object names: its first architecture and model_type. */
static void names_of(const cJSON *cfg, const char **arch, const char **type)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
	const cJSON *a0 = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;

	*arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
	*type = cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A Megatron source that does not name its family: the family whose
 * "detect" tensors SOURCE stores, the one with the most of them. */
static const rs_family *guess(const rs_checkpoint *ck, const rs_families *fs)
{
	const rs_family *best = NULL;
	size_t most = 0;

	for (size_t i = 0; i < fs->ndirs; i++) {
		const rs_family *f = &fs->dirs[i];
		const rs_family_info *fi = f->info;
		bool all = true;

		if (strcmp(f->from, "mcore") || strcmp(f->to, "hf") ||
		    !fi->guessable || (best && fi->ndetect <= most))
			continue;
		for (size_t k = 0; k < fi->ndetect && all; k++) {
			bool found = false;

			for (size_t t = 0; t < ck->catalog.count && !found; t++) {
				char nums[2][24];
				int nn = 0;
				const char *name = ck->catalog.tensors[t].name;

				if (f->strip && strncmp(name, f->strip, strlen(f->strip)) == 0)
					name += strlen(f->strip);
				found = rs_map_match(fi->detect[k], name, false, nums, &nn);
				nn = 0;
				found = found || rs_map_match(fi->detect[k], name, true,
							      nums, &nn);
			}
			all = found;
		}
		if (all) {
			best = f;
			most = fi->ndetect;
		}
	}
	return best;
}

/* The family the options and SOURCE ask for: by the names of the user's
 * hf_config (toward HF) or of config.json (from HF), else guessed from
 * SOURCE's tensors.  NULL with a line in d when none fits. */
static const rs_family *pick(const rs_checkpoint *ck, const rs_bridge_opts *o,
			     const rs_families *fs, const cJSON *named,
			     const char *named_path, rs_diag *d)
{
	const char *to, *from = direction(ck, o, &to), *arch = NULL, *type = NULL;
	const rs_family *f;

	if (strcmp(from, "metaseq") == 0) {
		f = rs_families_find(fs, ck->model.family_name, from, to);
		if (!f)
			rs_diag_add(d, "%s: no family file maps %s from metaseq to hf (families: %s, in %s)",
				    ck->dir_path, ck->model.family_name, fs->list,
				    fs->dir);
		return f;
	}
	if (named)
		names_of(named, &arch, &type);
	if (arch || type) {
		f = rs_families_by_arch(fs, arch, type, from, to);
		if (!f)
			rs_diag_add(d, "%s: architectures %s%s%s (model_type %s) is no family this reshardfs knows (%s, in %s); add one with -o rules=FILE, a \"families\" list in the schema of those files (reshardfs(1), FAMILY FILES)",
				    named_path, arch ? "\"" : "",
				    arch ? arch : "not given", arch ? "\"" : "",
				    type ? type : "not given", fs->list, fs->dir);
		return f;
	}
	if (strcmp(from, "hf") == 0) {
		rs_diag_add(d, "%s: names neither architectures nor model_type, so its family is unknown; add \"architectures\" to it",
			    named_path);
		return NULL;
	}
	f = guess(ck, fs);
	if (!f)
		rs_diag_add(d, "%s: no family file describes this checkpoint's tensors (families: %s, in %s); name its family in -o hf_config=FILE (\"architectures\")",
			    ck->dir_path, fs->list, fs->dir);
	return f;
}

int rs_bridge_wanted(const rs_checkpoint *ck, const rs_bridge_opts *o,
		     rs_diag *d)
{
	if (o->names && strcmp(o->names, "mcore")) {
		rs_diag_add(d, "-o names=%s: the names a view can take are mcore (megatron-core's, of an HF model directory of a known family)",
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
	if (o->hf_config && !(is(o->view, "hf") &&
			      (megatron_source(ck) || ck->model.hf_names))) {
		rs_diag_add(d, "-o hf_config=%s: only the hf view of a Megatron or DeepSpeed checkpoint (-o format=hf) takes an hf_config",
			    o->hf_config);
		return -EINVAL;
	}
	{
		const char *to;

		return direction(ck, o, &to) != NULL;
	}
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
		rs_diag_add(d, "%s: tie_word_embeddings is true (family %s), but %s is stored apart from the embeddings",
			    ck->dir_path, f->name, to->name);
		return -EINVAL;
	}
	return 0;
}

/* pickle protocol 2 of None, [None] and {}, as torch.save writes them */
static const char pkl_none[] = "\x80\x02N.";
static const char pkl_list_none[] = "\x80\x02]q\x00Na.";
static const char pkl_dict[] = "\x80\x02}q\x00.";

/* megatron-core's view of a model: the objects its strict load asks for
 * (family f's, None in every layer - and in every expert, for a pattern
 * with a second "#."), and a common.pt holding the empty common state
 * that dist_checkpointing.load reads first. */
static int add_object(rs_checkpoint *ck, const char *key, const char *shard)
{
	rs_blob *b;
	int err = rs_array_reserve(&ck->blobs, &ck->cap_blobs, ck->nblobs + 1,
				   sizeof(*b));

	if (err)
		return err;
	b = &ck->blobs[ck->nblobs];
	memset(b, 0, sizeof(*b));
	if (asprintf(&b->fqn, "%s/shard_%s", key, shard) < 0) {
		b->fqn = NULL;
		return -ENOMEM;
	}
	ck->nblobs++;
	err = rs_torch_object_make(pkl_none, sizeof(pkl_none) - 1,
				   &b->made[0], &b->made_len[0]);
	if (!err)
		err = rs_torch_object_make(pkl_list_none,
					   sizeof(pkl_list_none) - 1,
					   &b->made[1], &b->made_len[1]);
	return err;
}

/* Object pattern `pat` (its layer's "#." at `at`, an expert's at `ex`)
 * for a model whose layers megatron keys apart: one object per layer
 * that stores the weight beside it (<name>.weight), per expert of that
 * weight's first axis for an expert pattern. */
static int per_layer_objects(rs_checkpoint *ck, const char *pat,
			     const char *at, const char *ex)
{
	char weight[600];
	const char *tail = ex ? ex + 2 : at + 2;
	size_t n = strlen(tail), suffix = strlen("._extra_state");
	int err = 0;

	if (n < suffix || strcmp(tail + n - suffix, "._extra_state") ||
	    strlen(pat) >= sizeof(weight) - 8)
		return 0;
	/* the weight's pattern: the expert's "#." left out, .weight */
	snprintf(weight, sizeof(weight), "%.*s%.*s.weight",
		 ex ? (int)(ex - pat) : 0, pat,
		 ex ? (int)(n - suffix) : (int)(strlen(pat) - suffix),
		 ex ? tail : pat);
	for (size_t i = 0; i < ck->catalog.count && !err; i++) {
		const rs_tensor *t = &ck->catalog.tensors[i];
		char nums[2][24], key[700];
		uint64_t ne = 1;
		int nn = 0;

		if (!rs_map_match(weight, t->name, false, nums, &nn) || nn != 1)
			continue;
		if (ex) {
			if (t->ndim < 1)
				continue;
			ne = t->shape[0];
		}
		snprintf(key, sizeof(key), "%.*s%s%.*s", (int)(at - pat), pat,
			 nums[0], (int)(strlen(weight) - (size_t)(at - pat) - 1 - 7),
			 weight + (at - pat) + 1);
		strcat(key, "._extra_state");
		for (uint64_t e = 0; e < ne && !err; e++) {
			char shard[64];

			snprintf(shard, sizeof(shard), "%llu_%llu",
				 (unsigned long long)(ex ? e : 0),
				 (unsigned long long)ne);
			err = add_object(ck, key, shard);
		}
	}
	return err;
}

static int make_mcore_files(rs_checkpoint *ck, const rs_family *f,
			    const rs_map_dims *dims, rs_diag *d)
{
	uint64_t layers = 0;
	int err = 0;

	/* the layers: axis 0 of any stacked layer tensor */
	for (size_t i = 0; i < ck->catalog.count && !layers; i++)
		if (strncmp(ck->catalog.tensors[i].name, "decoder.layers.", 15) == 0 &&
		    ck->catalog.tensors[i].ndim > 0)
			layers = ck->catalog.tensors[i].shape[0];
	if (rs_checkpoint_top_entry(ck, "common.pt")) {
		rs_diag_add(d, "%s/common.pt: an HF model directory holding megatron-core's common.pt; the view writes its own",
			    ck->dir_path);
		return -EINVAL;
	}
	for (size_t k = 0; f->objects && f->objects[k] && !err; k++) {
		const char *pat = f->objects[k], *at = strstr(pat, "#.");
		const char *ex = at ? strstr(at + 2, "#.") : NULL;
		char key[600];
		uint64_t ne = ex ? dims->experts : 1;

		if (!at || (ex && !ne) || strlen(pat) >= sizeof(key)) {
			rs_diag_add(d, "%s: object %s: needs a \"#.\" for the layer%s",
				    f->info->path, pat,
				    ex ? ", and a number of experts (the family's \"experts\" fact)" : "");
			return -EINVAL;
		}
		if (!f->stack) {
			err = per_layer_objects(ck, pat, at, ex);
			continue;
		}
		/* the key: the pattern without its "#."s */
		snprintf(key, sizeof(key), "%.*s%.*s%s", (int)(at - pat), pat,
			 ex ? (int)(ex - at - 2) : (int)strlen(at + 2), at + 2,
			 ex ? ex + 2 : "");
		for (uint64_t l = 0; l < layers && !err; l++)
			for (uint64_t e = 0; e < ne && !err; e++) {
				char shard[100];

				if (ex)
					snprintf(shard, sizeof(shard), "%llu.%llu_%llu.%llu",
						 (unsigned long long)l, (unsigned long long)e,
						 (unsigned long long)layers,
						 (unsigned long long)ne);
				else
					snprintf(shard, sizeof(shard), "%llu_%llu",
						 (unsigned long long)l,
						 (unsigned long long)layers);
				err = add_object(ck, key, shard);
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

/* What names SOURCE's family: toward HF the user's hf_config (its text
 * kept in ck->model.hf_config), from HF config.json; *named NULL when
 * there is none.  *path names the file for messages. */
static int read_named(rs_checkpoint *ck, const rs_bridge_opts *o, bool from_hf,
		      cJSON **named, char *path, size_t size, rs_diag *d)
{
	char *text = NULL, why[160];
	size_t len = 0;
	int err;

	*named = NULL;
	if (from_hf) {
		snprintf(path, size, "%s/config.json", ck->dir_path);
		err = rs_checkpoint_read_file(ck, "config.json", CONFIG_MAX, &text,
					      &len, NULL, d);
		if (err == -ENOENT) {
			rs_diag_add(d, "%s: missing; -o names=mcore takes an HF transformers model directory (save_pretrained's config.json and safetensors)",
				    path);
			return -EINVAL;
		}
	} else {
		if (!o->hf_config)
			return 0;
		snprintf(path, size, "%s", o->hf_config);
		text = rs_user_file_read(o->hf_config, CONFIG_MAX, "hf_config file",
					 &len, d);
		err = text ? 0 : -EINVAL;
	}
	if (err)
		return err;
	err = rs_json_parse_object(text, len, named, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s%s", path, why,
			    from_hf ? "" : " (-o hf_config= takes a JSON object of config.json fields)");
	if (!err && !from_hf) {
		free(ck->model.hf_config);
		ck->model.hf_config = text;
		text = NULL;
	}
	free(text);
	return err;
}

int rs_bridge_apply(rs_checkpoint *ck, const rs_bridge_opts *o, rs_diag *d)
{
	const char *to, *from = direction(ck, o, &to);
	const rs_family *f = NULL;
	rs_families *fs = NULL;
	cJSON *named = NULL;
	char path[PATH_MAX + 16];
	rs_map_dims dims = { 0 };
	rs_map_row *rows = NULL;
	rs_config_eval *st = NULL;
	size_t nrows = 0;
	int err;

	if (!from)
		return 0;
	err = rs_families_load(o->rules_file, &fs, d);
	if (!err)
		err = read_named(ck, o, strcmp(from, "hf") == 0, &named, path,
				 sizeof(path), d);
	if (!err && !(f = pick(ck, o, fs, named, path, d)))
		err = -EINVAL;
	if (!err && strcmp(from, "hf") == 0)
		err = rs_config_from_hf(ck, f, named, path, &dims, d);
	else if (!err)
		err = rs_config_to_hf(ck, f, o, &dims, &st, d);
	dims.packed = o->packed;
	if (!err)
		err = check_tied(ck, f, &dims, d);
	if (!err)
		err = user_rows(o, f, &rows, &nrows, d);
	if (!err)
		err = rs_remap(ck, f, rows, nrows, o->rules_file, &dims, d);
	if (!err && st) {
		err = rs_config_to_hf_finish(st, d);
		st = NULL;
	}
	rs_config_eval_free(st);
	if (!err && strcmp(to, "mcore") == 0) {
		size_t e = f->info->eco[0].embed
				   ? rs_bridge_find(ck, f, f->info->eco[0].embed)
				   : SIZE_MAX;

		/* the true vocab: the embedding rows HF stores */
		if (e != SIZE_MAX && ck->catalog.tensors[e].ndim == 2)
			ck->model.vocab = ck->catalog.tensors[e].shape[0];
		err = make_mcore_files(ck, f, &dims, d);
	}
	if (!err && strcmp(from, "mcore") == 0)
		hide_megatron_records(ck);
	cJSON_Delete(named);
	rs_bridge_rows_free(rows, nrows);
	if (err) {
		rs_families_free(fs);
		return err;
	}
	ck->model.family = f;
	rs_families_free(ck->model.families);
	ck->model.families = fs;
	return 0;
}
