/* What surrounds a DeepSpeed save's tensors (formats/deepspeed/deepspeed.h):
 * the config.json the hf view writes from, which of SOURCE's files the
 * views pass through, and the lines --dry-run prints. */
#include "formats/deepspeed/deepspeed_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/codec/json_text.h"
#include "planner/user_file.h"

/* config.json for the hf view: -o hf_config=, else the save directory's,
 * else the one beside a tag directory mounted itself. */
int rs_ds_read_config(rs_ds_reader *r, const rs_open_opts *o)
{
	rs_checkpoint *ck = r->ck;
	char *text = NULL, path[4400], why[160];
	size_t len = 0;
	cJSON *root = NULL;
	int err = 0;

	if (o->hf_config) {
		snprintf(path, sizeof(path), "%s", o->hf_config);
		text = rs_user_file_read(path, RS_DS_CONFIG_MAX, "hf_config file",
					 &len, r->d);
		if (!text)
			return -EINVAL;
	} else if (r->tag >= 0) {
		snprintf(path, sizeof(path), "%s/config.json", ck->root_path);
		err = rs_checkpoint_read_file(ck, "config.json", RS_DS_CONFIG_MAX,
					      &text, &len, NULL, r->d);
		if (err == -ENOENT)
			return 0;
	} else {
		struct stat sb;

		snprintf(path, sizeof(path), "%s/../config.json", ck->root_path);
		if (stat(path, &sb) != 0)
			return 0;
		text = rs_user_file_read(path, RS_DS_CONFIG_MAX, "config.json",
					 &len, r->d);
		if (!text)
			return -EINVAL;
	}
	if (err)
		return err;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(r->d, "%s: %s", path, why);
	cJSON_Delete(root);
	if (!err) {
		ck->model.hf_config_out = text;
		text = NULL;
		ck->model.hf_config_from = strdup(path);
		if (!ck->model.hf_config_from)
			err = -ENOMEM;
	}
	free(text);
	return err;
}

/* The save directory's own files are not the view's: the tag
 * directories, the tracker, DeepSpeed's scripts, and the HF Trainer's
 * copy of the weights and config.json (the views write their own). */
static bool save_file(const char *name, bool is_dir)
{
	static const char *const exact[] = {
		RS_DS_TRACKER, "zero_to_fp32.py", "zero_to_torch.py",
		"config.json", "model.safetensors.index.json",
		"pytorch_model.bin.index.json", NULL,
	};
	size_t n = strlen(name);

	if (is_dir)
		return strncmp(name, "global_step", 11) == 0;
	for (int i = 0; exact[i]; i++)
		if (strcmp(name, exact[i]) == 0)
			return true;
	return (strncmp(name, "model", 5) == 0 && n > 12 &&
		strcmp(name + n - 12, ".safetensors") == 0) ||
	       (strncmp(name, "pytorch_model", 13) == 0 && n > 4 &&
		strcmp(name + n - 4, ".bin") == 0);
}

void rs_ds_hide_entries(rs_ds_reader *r)
{
	rs_checkpoint *ck = r->ck;

	for (size_t i = 0; i < ck->nentries; i++) {
		rs_entry *e = &ck->entries[i];
		char kind;
		long dp, mp;
		bool bf16;

		if (e->parent >= 0)
			e->hidden = ck->entries[e->parent].hidden ||
				    (e->parent == r->tag &&
				     rs_ds_rank_name(e->name, &kind, &dp, &mp, &bf16));
		else if (r->tag >= 0)
			e->hidden = (long)i == r->tag ||
				    save_file(e->name, e->is_dir);
		else
			e->hidden = rs_ds_rank_name(e->name, &kind, &dp, &mp, &bf16);
	}
}

/* --dry-run's lines on what SOURCE holds and what each view makes of
 * it, and the note a mount prints when the HF Trainer's weights are
 * beside DeepSpeed's. */
int rs_ds_describe(rs_ds_reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_state *st = r->st;
	const char *hf = NULL;
	char steps[64] = "none stored";
	int n;

	for (size_t i = 0; i < ck->nentries && r->tag >= 0 && !hf; i++)
		if (ck->entries[i].parent < 0 && !ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, "config.json") &&
		    save_file(ck->entries[i].name, false) &&
		    strstr(ck->entries[i].name, "model"))
			hf = ck->entries[i].name;

	if (st->groups && !isnan(st->step[0]))
		snprintf(steps, sizeof(steps), "%.17g", st->step[0]);
	if (st->universal)
		n = asprintf(&ck->describe,
			     "deepspeed: a universal checkpoint (zero/<param>/), saved by %u data-parallel ranks%s%s%s%s%s%s\n"
			     "params: %zu trainable, %zu frozen params and buffers, %zu shared; optimizer state: %s, step %s\n"
			     "config.json: %s\n"
			     "views: hf and safetensors hold the fp32 params (safetensors also the optimizer state)\n",
			     st->world, st->ds_version ? ", deepspeed " : "",
			     st->ds_version ? st->ds_version : "",
			     st->tag[0] ? ", tag " : "", st->tag,
			     st->tracker ? " from " : "",
			     st->tracker ? st->tracker : "",
			     st->nparams, st->nfrozen + st->nbuffers, st->nshared,
			     st->nparams ? "exp_avg, exp_avg_sq" : "none", steps,
			     ck->model.hf_config_from ? ck->model.hf_config_from
						      : "none (the hf view needs -o hf_config=FILE)");
	else
		n = asprintf(&ck->describe,
		     "deepspeed: ZeRO stage %d, %u data-parallel ranks, %u parameter group%s, trained in %s with fp32 master weights%s%s%s%s%s%s\n"
		     "params: %zu trainable, %zu frozen, %zu shared, %zu buffers; optimizer state: %s%s, step %s\n"
		     "config.json: %s\n"
		     "views: hf and safetensors hold the fp32 masters (safetensors also the optimizer state); universal holds zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt and the model-states file\n",
		     st->stage, st->world, st->groups, st->groups == 1 ? "" : "s",
		     rs_dtype_name(st->trained),
		     st->ds_version ? ", deepspeed " : "",
		     st->ds_version ? st->ds_version : "",
		     st->tag[0] ? ", tag " : "", st->tag,
		     st->tracker ? " from " : "", st->tracker ? st->tracker : "",
		     st->nparams, st->nfrozen, st->nshared, st->nbuffers,
		     st->has_state[DS_EXP_AVG] ? "exp_avg" : "none",
		     st->has_state[DS_EXP_AVG_SQ] ? ", exp_avg_sq" : "", steps,
		     ck->model.hf_config_from ? ck->model.hf_config_from
					      : "none (the hf view needs -o hf_config=FILE)");
	if (n < 0) {
		ck->describe = NULL;
		return -ENOMEM;
	}
	if (hf && asprintf(&ck->notice, "%s holds the HF Trainer's %s and DeepSpeed's %s (named by %s): reading DeepSpeed's fp32 master weights; mount a directory holding only the HF weights to read that copy instead",
			   ck->root_path, hf, st->tag, st->tracker) < 0) {
		ck->notice = NULL;
		return -ENOMEM;
	}
	return 0;
}
