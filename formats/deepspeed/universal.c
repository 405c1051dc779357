/* The universal checkpoint view (formats/deepspeed/deepspeed.h): what
 * DeepSpeed's engine.load_checkpoint reads with load_universal, at any
 * world size, without ds_to_universal.py or its temporary files.
 *
 *   latest_universal                 the tag below (no newline)
 *   <tag>_universal/
 *     mp_rank_00_model_states.pt               rank 0's model-states file,
 *     zero_pp_rank_0_mp_rank_00_model_states.pt  as stored, under the name
 *                                              each stage's engine looks for
 *     zero/optimizer_state.pt          loss scaler, ds_version, the
 *                                      param groups, and the step where a
 *                                      stage 3 engine looks for it
 *     zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt
 *                                      {'cat_dim': 0, 'param': float32
 *                                      tensor of the param's shape}
 *     zero/<param>/step.pt             its group's step, a 0-d float32
 *
 * One folder serves an engine of any ZeRO stage: each finds the files
 * and keys it reads (the stage 1-2 engine every *.pt of a param's
 * directory, 'param' of each, step.pt, ds_version and param_groups; the
 * stage 3 one fp32/exp_avg/exp_avg_sq and optimizer_state_dict's step and
 * param_groups).  DeepSpeed restores neither frozen params nor buffers
 * from a universal checkpoint, so none are written.
 */
#include "formats/deepspeed/deepspeed.h"
#include "formats/deepspeed/deepspeed_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/torch_tensor.h"
#include "planner/plan.h"

/* What optimizer_state.pt copies from the source's pickle. */
static const char *const copy_allow[] = {
	"deepspeed.runtime.fp16.loss_scaler.LossScaler",
	"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
	"collections.OrderedDict",
	"_codecs.encode",
	NULL,
};

typedef struct {
	const rs_checkpoint *ck;
	const rs_ds_state *st;
	rs_vtree *t;
	rs_diag *d;
} builder;

/* A torch.save file `name` in dir: pickle pkl over one storage, the
 * whole of catalog tensor `ten` (float32) or the 4 literal bytes of
 * `scalar`. */
static int add_pt(builder *b, uint32_t dir, const char *name,
		  const uint8_t *pkl, size_t pkl_len, const rs_tensor *ten,
		  float scalar)
{
	char archive[64];
	rs_zip_layout z = { 0 };
	uint64_t size = 4;
	uint32_t file;
	int err;

	snprintf(archive, sizeof(archive), "%.*s", (int)(strlen(name) - 3), name);
	if (ten) {
		for (int i = 0; i < ten->ndim; i++)
			size *= ten->shape[i];
	}
	err = rs_zip_layout_torch_save(&z, archive, pkl, pkl_len, &size, 1);
	if (!err)
		err = rs_vtree_add_file(b->t, dir, name, b->ck->root_mtime, &file);
	for (size_t p = 0; p < z.npieces && !err; p++) {
		const rs_zip_piece *pc = &z.pieces[p];
		rs_box box = { .ndim = ten ? ten->ndim : 0 };
		rs_plan plan;

		if (pc->kind == RS_ZIP_PIECE_LITERAL) {
			err = rs_vtree_append_literal(b->t, file, pc->bytes,
						      pc->length);
			continue;
		}
		if (!ten) {
			err = rs_vtree_append_literal(b->t, file, &scalar, 4);
			continue;
		}
		memcpy(box.len, ten->shape, sizeof(box.len));
		err = rs_plan_box(ten, &box, box.len, &plan);
		if (!err)
			err = rs_vtree_append_plan(b->t, file, &plan,
						   ten->dtype, ten->dtype);
	}
	rs_zip_layout_free(&z);
	return err;
}

/* zero/<param>/: fp32, exp_avg, exp_avg_sq and step. */
static int add_param(builder *b, uint32_t zero, const rs_ds_param *p,
		     float step)
{
	uint8_t *pkl = NULL;
	size_t len = 0;
	uint32_t dir;
	rs_pwriter w;
	int err = rs_vtree_add_dir(b->t, zero, p->name, b->ck->root_mtime,
				   &dir);

	for (int s = 0; s < DS_NSTATES && !err; s++) {
		const rs_tensor *ten = &b->ck->catalog.tensors[p->tensor[s]];
		char file[40];

		rs_pw_init(&w, 2);
		rs_pw_dict_begin(&w);
		rs_pw_cstr(&w, "cat_dim");
		rs_pw_int(&w, 0);
		rs_pw_cstr(&w, "param");
		rs_pw_torch_tensor(&w, ten->dtype, ten->shape, ten->ndim, "0");
		rs_pw_dict_end(&w);
		err = rs_pw_finish(&w, &pkl, &len);
		snprintf(file, sizeof(file), "%s.pt", rs_ds_state_names[s]);
		if (!err)
			err = add_pt(b, dir, file, pkl, len, ten, 0);
		free(pkl);
		pkl = NULL;
	}
	if (err)
		return err;
	rs_pw_init(&w, 2);
	rs_pw_torch_tensor(&w, RS_DTYPE_F32, NULL, 0, "0");
	err = rs_pw_finish(&w, &pkl, &len);
	if (!err)
		err = add_pt(b, dir, "step.pt", pkl, len, NULL, step);
	free(pkl);
	return err;
}

/* zero/optimizer_state.pt: what both engines' loaders read of it. */
static int add_optimizer_state(builder *b, uint32_t zero, float step)
{
	static const char *const scalars[] = {
		"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
	};
	const rs_pvalue *osd = rs_pv_get(rs_pickle_root(b->st->opt0),
					 "optimizer_state_dict");
	const rs_pvalue *groups = rs_pv_get(
		rs_pv_get(osd, b->st->stage < 3 ? "base_optimizer_state"
						 : "optimizer_state_dict"),
		"param_groups");
	char why[300];
	uint8_t *pkl = NULL;
	size_t len = 0;
	rs_pwriter w;
	int err = 0;

	if (rs_pv_kind(groups) != RS_PV_LIST) {
		rs_diag_add(b->d, "%s: rank 0's optimizer file holds no param_groups, which a universal checkpoint needs",
			    b->ck->dir_path);
		return -EINVAL;
	}
	rs_pw_init(&w, 2);
	rs_pw_dict_begin(&w);
	for (size_t i = 0; i < sizeof(scalars) / sizeof(*scalars) && !err; i++) {
		const rs_pvalue *v = rs_pv_get(osd, scalars[i]);

		if (!v)
			continue;
		rs_pw_cstr(&w, scalars[i]);
		err = rs_pw_value(&w, v, copy_allow, NULL, why, sizeof(why));
	}
	rs_pw_cstr(&w, "ds_version");
	rs_pw_cstr(&w, b->st->ds_version ? b->st->ds_version : "0.0.0");
	for (int k = 0; k < 2 && !err; k++) {
		rs_pw_cstr(&w, k ? "optimizer_state_dict" : "param_groups");
		if (k) {
			rs_pw_dict_begin(&w);
			rs_pw_cstr(&w, "state");
			rs_pw_dict_begin(&w);
			rs_pw_int(&w, 0);
			rs_pw_dict_begin(&w);
			rs_pw_cstr(&w, "step");
			rs_pw_torch_tensor(&w, RS_DTYPE_F32, NULL, 0, "0");
			rs_pw_dict_end(&w);
			rs_pw_dict_end(&w);
			rs_pw_cstr(&w, "param_groups");
		}
		err = rs_pw_value(&w, groups, copy_allow, NULL, why, sizeof(why));
		if (k)
			rs_pw_dict_end(&w);
	}
	rs_pw_dict_end(&w);
	if (err) {
		rs_pw_free(&w);
		if (err == -EINVAL || err == -E2BIG) {
			rs_diag_add(b->d, "%s: rank 0's optimizer state cannot be copied into the universal checkpoint: %s",
				    b->ck->dir_path, why);
			err = -EINVAL;
		}
		return err;
	}
	err = rs_pw_finish(&w, &pkl, &len);
	if (!err)
		err = add_pt(b, zero, "optimizer_state.pt", pkl, len, NULL, step);
	free(pkl);
	return err;
}

/* What the view needs that a save may lack, and what it cannot change. */
static int check(builder *b, const rs_layout *l)
{
	const rs_ds_state *st = b->st;

	if (b->ck->format != &rs_deepspeed_format || b->st->universal) {
		rs_diag_add(b->d, "%s: the universal view is made from DeepSpeed ZeRO saves only (this is %s)",
			    b->ck->dir_path, b->ck->format == &rs_deepspeed_format
			    ? "a universal checkpoint already" : b->ck->format->name);
		return -EINVAL;
	}
	if (l->tp != 1 || (l->dtype && l->dtype != RS_DTYPE_F32)) {
		rs_diag_add(b->d, "%s: the universal view holds whole float32 params: mount it without tp= and dtype=",
			    b->ck->dir_path);
		return -EINVAL;
	}
	if (!st->has_state[DS_EXP_AVG] || !st->has_state[DS_EXP_AVG_SQ] ||
	    !st->groups || isnan(st->step[0])) {
		rs_diag_add(b->d, "%s: the optimizer files hold no exp_avg, exp_avg_sq and step (a save before the first step, or not Adam), which a universal checkpoint holds",
			    b->ck->dir_path);
		return -EINVAL;
	}
	return 0;
}

int rs_universal_build_view(const rs_checkpoint *ck, const rs_layout *l,
			    rs_vtree *t, rs_diag *d)
{
	builder b = { .ck = ck, .st = ck->extra, .t = t, .d = d };
	const rs_ds_state *st = b.st;
	char tag[300];
	uint64_t size;
	uint32_t file, dir, zero;
	int err = check(&b, l);

	if (err)
		return err;
	snprintf(tag, sizeof(tag), "%s_universal",
		 st->tag[0] ? st->tag : "checkpoint");
	err = rs_vtree_add_file(t, 0, "latest_universal", ck->root_mtime, &file);
	if (!err)
		err = rs_vtree_append_literal(t, file, tag, strlen(tag));
	if (!err)
		err = rs_vtree_add_dir(t, 0, tag, ck->root_mtime, &dir);
	size = rs_sources_id(ck->sources, st->model_states)->size;
	for (int k = 0; k < 2 && !err; k++) {
		err = rs_vtree_add_file(t, dir, k ? "zero_pp_rank_0_mp_rank_00_model_states.pt"
						  : "mp_rank_00_model_states.pt",
					ck->root_mtime, &file);
		if (!err)
			err = rs_vtree_append_source(t, file, st->model_states,
						     0, size);
	}
	if (!err)
		err = rs_vtree_add_dir(t, dir, "zero", ck->root_mtime, &zero);
	if (!err)
		err = add_optimizer_state(&b, zero, (float)st->step[0]);
	for (size_t p = 0; p < st->nparams && !err; p++) {
		uint32_t g = st->stage < 3 && st->params[p].group < st->groups
			? st->params[p].group : 0;

		err = add_param(&b, zero, &st->params[p], (float)st->step[g]);
	}
	if (err == -EEXIST) {
		rs_diag_add(d, "%s: a param's name is the name of a file of the universal view",
			    ck->dir_path);
		err = -EINVAL;
	}
	return err;
}

const rs_format_def rs_universal_format = {
	.name = "universal",
	.build_view = rs_universal_build_view,
};
