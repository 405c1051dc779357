/* DeepSpeed ZeRO reader: SOURCE -> tag directory -> rank files -> catalog
 * (formats/deepspeed/deepspeed.h).
 *
 * This file finds the tag directory and its rank files, parses each
 * file's data.pkl, checks the files against each other, and hands the
 * flat partitions to zero.c.  Frozen params, buffers and shared params
 * are read here: they are whole tensors (or, in stage 3, parts laid end
 * to end), not flat partitions.
 */
#include "formats/deepspeed/deepspeed.h"
#include "formats/deepspeed/deepspeed_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "formats/codec/torch_tensor.h"
#include "planner/names.h"
#include "planner/user_file.h"

/* A model-states or optimizer pickle holds a few hundred bytes per
 * tensor; anything near this is not a checkpoint. */
#define DS_PKL_MAX (256u << 20)
#define DS_MAX_RANKS (1u << 16)
#define DS_MAX_GROUPS 4096u
#define DS_CONFIG_MAX (1u << 20)
#define DS_TRACKER "latest"
/* where ds_to_universal.py names its output folder */
#define DS_TRACKER_UC "latest_universal"

const char *const rs_deepspeed_allow[] = {
	"torch.*",
	"collections.OrderedDict",
	"_codecs.encode",
	/* an optimizer file's loss scaler, stage and stage 1-2 param slice
	 * mappings: read as inert data, never built */
	"deepspeed.runtime.fp16.loss_scaler.LossScaler",
	"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
	"deepspeed.runtime.zero.config.ZeroStageEnum",
	"deepspeed.utils.tensor_fragment.fragment_address",
	NULL,
};

void rs_ds_state_free(void *state)
{
	rs_ds_state *st = state;

	if (!st)
		return;
	for (size_t i = 0; st->params && i < st->nparams; i++)
		free(st->params[i].name);
	free(st->params);
	free(st->flats);
	free(st->step);
	free(st->tag);
	free(st->ds_version);
	rs_pickle_free(st->opt0);
	free(st);
}

/* One rank file of the tag directory. */
typedef struct {
	long entry;             /* -1: not found */
	uint32_t source;
	char path[4400];        /* as messages name it */
	rs_zip z;
	rs_pickle *pk;
} ds_file;

typedef struct {
	rs_checkpoint *ck;
	rs_ds_state *st;
	rs_diag *d;
	long tag;               /* the tag directory's entry, -1: SOURCE */
	char where[4200];       /* the tag directory, for messages */
	ds_file *model;         /* [world] in stage 3, [1] else */
	ds_file *optim;         /* [world] */
	uint32_t nmodel, noptim;
	int64_t count;          /* rank 0's partition_count */
	bool zero3_names;       /* zero_pp_rank_D_mp_rank_00_model_states.pt */
	long zero;              /* a universal checkpoint's zero/ entry, -1 */
	bool bf16_prefix;
} reader;

static bool is_digits(const char *s, size_t n)
{
	if (!n || n > 6)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

/* "<digits>" then `rest` at s: the number, or -1. */
static long number_then(const char *s, const char *rest)
{
	size_t n = strspn(s, "0123456789");

	if (!is_digits(s, n) || strcmp(s + n, rest) != 0)
		return -1;
	return strtol(s, NULL, 10);
}

/* A rank file's name: [bf16_]zero_pp_rank_D_mp_rank_MM_{model,optim}_states.pt
 * or mp_rank_MM_model_states.pt.  *kind 'm' or 'o', *dp (-1: none) and
 * *mp; false for any other name. */
static bool rank_name(const char *name, char *kind, long *dp, long *mp,
		      bool *bf16)
{
	static const char *const tails[] = { "_model_states.pt", "_optim_states.pt" };
	const char *s = name;

	*bf16 = strncmp(s, "bf16_", 5) == 0;
	if (*bf16)
		s += 5;
	*dp = -1;
	if (strncmp(s, "zero_pp_rank_", 13) == 0) {
		size_t n = strspn(s + 13, "0123456789");

		if (!is_digits(s + 13, n) || strncmp(s + 13 + n, "_mp_rank_", 9))
			return false;
		*dp = strtol(s + 13, NULL, 10);
		s += 13 + n + 1;
	}
	if (strncmp(s, "mp_rank_", 8) != 0)
		return false;
	for (int k = 0; k < 2; k++) {
		*mp = number_then(s + 8, tails[k]);
		if (*mp >= 0) {
			*kind = k ? 'o' : 'm';
			return (*kind == 'o') == (*dp >= 0) || *kind == 'm';
		}
	}
	return false;
}

/* Files of layouts this reader does not read, refused by name. */
static const char *unread_layout(const char *name)
{
	if (strncmp(name, "layer_", 6) == 0 && strstr(name, "_expert_"))
		return "an expert-parallel (MoE) DeepSpeed save";
	if (strncmp(name, "layer_", 6) == 0)
		return "a DeepSpeed pipeline save (PipelineModule layer files)";
	if (strncmp(name, "expp_rank_", 10) == 0)
		return "an expert-parallel (MoE) DeepSpeed save";
	return NULL;
}

/* Opens f for its pickle: a dict, but for a universal checkpoint's
 * state files (`any`: a bare tensor). */
static int open_pickle(reader *r, ds_file *f, bool any)
{
	rs_checkpoint *ck = r->ck;
	int err;

	snprintf(f->path, sizeof(f->path), "%s/%s", ck->root_path,
		 rs_sources_path(ck->sources, f->source));
	err = (any ? rs_checkpoint_open_torch_save
		   : rs_checkpoint_open_torch_dict)(ck, f->source, f->path,
						    rs_deepspeed_allow,
						    DS_PKL_MAX, &f->z, &f->pk,
						    r->d);
	return err;
}

/* The tag directory: the one `latest` names, else SOURCE. */
static int find_tag(reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_entry *latest = rs_checkpoint_top_entry(ck, DS_TRACKER);
	const char *tracker = DS_TRACKER;
	char *text = NULL, *s, *e;
	size_t len;
	bool bad;
	int err;

	r->tag = -1;
	snprintf(r->where, sizeof(r->where), "%s", ck->root_path);
	if (!latest || latest->is_dir) {
		latest = rs_checkpoint_top_entry(ck, DS_TRACKER_UC);
		tracker = DS_TRACKER_UC;
	}
	if (!latest || latest->is_dir)
		return (r->st->tag = strdup("")) ? 0 : -ENOMEM;
	r->st->tracker = tracker;
	err = rs_checkpoint_read_file(ck, tracker, 256, &text, &len, NULL,
				      r->d);
	if (err)
		return err == -ENOENT ? -EINVAL : err;
	bad = memchr(text, 0, len) != NULL;
	for (s = text; *s && strchr(" \t\n\r", *s); s++)
		;
	for (e = text + len; e > s && strchr(" \t\n\r", e[-1]); e--)
		;
	*e = 0;
	if (bad || !rs_name_is_safe(s) ||
	    strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != strlen(s)) {
		rs_diag_add(r->d, "%s/%s: does not hold a tag directory's name",
			    ck->root_path, tracker);
		free(text);
		return -EINVAL;
	}
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent < 0 && ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, s) == 0)
			r->tag = (long)i;
	if (r->tag < 0) {
		rs_diag_add(r->d, "%s/%s: names the tag directory %s, which is missing",
			    ck->root_path, tracker, s);
		free(text);
		return -EINVAL;
	}
	snprintf(r->where, sizeof(r->where), "%s/%s", ck->root_path, s);
	r->st->tag = strdup(s);
	free(text);
	return r->st->tag ? 0 : -ENOMEM;
}

/* The rank files of the tag directory, each in its place (the world
 * size is checked against partition_count later). */
static int find_files(reader *r)
{
	rs_checkpoint *ck = r->ck;
	long max_dp = -1, max_model = -1;
	size_t nopt = 0, nmodel = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < ck->nentries; i++) {
			const rs_entry *e = &ck->entries[i];
			const char *why;
			ds_file *f;
			long dp, mp;
			char kind;
			bool bf16;

			if (e->parent != r->tag || e->is_dir)
				continue;
			if ((why = unread_layout(e->name))) {
				rs_diag_add(r->d, "%s/%s: %s, which reshardfs does not read (ZeRO stages 1-3 of one model-parallel rank are read)",
					    r->where, e->name, why);
				return -EINVAL;
			}
			if (!rank_name(e->name, &kind, &dp, &mp, &bf16))
				continue;
			if (mp != 0) {
				rs_diag_add(r->d, "%s/%s: model-parallel rank %ld: a Megatron-DeepSpeed save with tensor or pipeline parallelism, which reshardfs does not read yet (only mp_rank_00)",
					    r->where, e->name, mp);
				return -EINVAL;
			}
			if (pass == 0) {
				if (kind == 'o') {
					max_dp = dp > max_dp ? dp : max_dp;
					nopt++;
				} else {
					max_model = dp > max_model ? dp : max_model;
					nmodel++;
				}
				continue;
			}
			if (kind == 'm' && (dp >= 0) != r->zero3_names) {
				rs_diag_add(r->d, "%s: holds model-states files of both stage 1-2 and stage 3 names (%s)",
					    r->where, e->name);
				return -EINVAL;
			}
			f = kind == 'o' ? &r->optim[dp] : &r->model[dp < 0 ? 0 : dp];
			if (f->entry >= 0) {
				rs_diag_add(r->d, "%s: holds two files of one rank (%s and %s)",
					    r->where, ck->entries[f->entry].name,
					    e->name);
				return -EINVAL;
			}
			if (kind == 'o')
				r->bf16_prefix = bf16;
			f->entry = (long)i;
			f->source = e->source;
		}
		if (pass)
			break;
		if (!nmodel || (!nopt && r->zero < 0)) {
			rs_diag_add(r->d, "%s: holds no %s files (a DeepSpeed save's tag directory holds mp_rank_00_model_states.pt or zero_pp_rank_0_mp_rank_00_model_states.pt, and *_optim_states.pt with the fp32 master weights)",
				    r->where, nmodel ? "*_optim_states.pt" : "*_model_states.pt");
			return -EINVAL;
		}
		if (max_dp + 1 > (long)DS_MAX_RANKS || max_model + 1 > (long)DS_MAX_RANKS) {
			rs_diag_add(r->d, "%s: more than %u ranks", r->where,
				    DS_MAX_RANKS);
			return -EINVAL;
		}
		r->zero3_names = max_model >= 0;
		r->st->world = (uint32_t)(max_dp + 1);
		r->nmodel = r->zero3_names ? (uint32_t)(max_model + 1) : 1;
		r->noptim = r->st->world;
		r->optim = calloc(r->st->world + 1, sizeof(*r->optim));
		r->model = calloc(r->nmodel + 1, sizeof(*r->model));
		if (!r->optim || !r->model)
			return -ENOMEM;
		for (uint32_t k = 0; k < r->st->world; k++)
			r->optim[k].entry = -1;
		for (uint32_t k = 0; k < r->nmodel; k++)
			r->model[k].entry = -1;
	}
	return 0;
}

/* -- values of the pickles -- */

/* A dict, or an OrderedDict's items (NULL when it is empty). */
static bool dict_of(const rs_pvalue *v, const rs_pvalue **pairs)
{
	if (rs_pv_kind(v) == RS_PV_DICT) {
		*pairs = v;
		return true;
	}
	if (rs_pv_call_is(v, "collections.OrderedDict")) {
		*pairs = rs_pv_dictitems(v);
		return !*pairs || rs_pv_kind(*pairs) == RS_PV_DICT;
	}
	return false;
}

/* The value of an int key of a dict (a torch optimizer's state). */
static const rs_pvalue *int_key(const rs_pvalue *dict, int64_t key)
{
	const rs_pvalue *found = NULL;

	for (size_t i = 0; i < rs_pv_len(dict); i++) {
		int64_t k;

		if (rs_pv_int(rs_pv_key(dict, i), &k) == 0 && k == key)
			found = rs_pv_val(dict, i);
	}
	return found;
}

/* ZeroStageEnum as pickled (getattr(cls, 'name') or cls(value)), or a
 * plain int: the stage, -1 when it is none of them. */
static int zero_stage(const rs_pvalue *v)
{
	static const char *const names[] = {
		"ZeroStageEnum.disabled", "ZeroStageEnum.optimizer_states",
		"ZeroStageEnum.gradients", "ZeroStageEnum.weights",
	};
	int64_t i = -1;

	if (rs_pv_kind(v) == RS_PV_GLOBAL &&
	    strcmp(rs_pv_global_module(v), "deepspeed.runtime.zero.config") == 0) {
		for (int k = 0; k < 4; k++)
			if (strcmp(rs_pv_global_name(v), names[k]) == 0)
				return k;
		return -1;
	}
	if (rs_pv_call_is(v, "deepspeed.runtime.zero.config.ZeroStageEnum"))
		v = rs_pv_item(rs_pv_args(v), 0);
	if (rs_pv_int(v, &i) != 0 || i < 0 || i > 3)
		return -1;
	return (int)i;
}

/* A name from a pickle that becomes a tensor's name (and in the
 * universal view a directory's): safe as a path component, printable. */
static bool name_ok(const char *s, size_t len)
{
	if (!s || strlen(s) != len || !rs_name_is_safe(s) || len > 1000)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/* A tensor record of file f, checked against its zip. */
static int tensor_of(reader *r, ds_file *f, const rs_pvalue *v,
		     const char *what, rs_torch_tensor *t)
{
	char why[200];

	if (rs_torch_tensor_read(&f->z, v, t, why, sizeof(why)) != 0) {
		rs_diag_add(r->d, "%s: %s %s", f->path, what, why);
		return -EINVAL;
	}
	return 0;
}

/* A 1-d fp32 tensor laid out densely: a flat partition. */
static int flat_of(reader *r, ds_file *f, const rs_pvalue *v,
		   const char *what, ds_flat *out)
{
	rs_torch_tensor t;
	int err = tensor_of(r, f, v, what, &t);

	if (err)
		return err;
	if (t.dtype != RS_DTYPE_F32 || t.ndim != 1 ||
	    (t.shape[0] > 1 && t.stride[0] != 1)) {
		rs_diag_add(r->d, "%s: %s is not a dense 1-d float32 tensor (a ZeRO flat partition is)",
			    f->path, what);
		return -EINVAL;
	}
	out->source = f->source;
	out->offset = t.offset;
	out->numel = t.shape[0];
	out->present = true;
	return 0;
}

/* -- the optimizer files -- */

static ds_flat *flat_at(rs_ds_state *st, int state, uint32_t rank,
			uint32_t g)
{
	return &st->flats[((size_t)state * st->world + rank) * st->groups + g];
}

/* The stored step of one group: a 0-d tensor (read now: 8 bytes at most
 * of metadata) or a number. */
static int read_step(reader *r, ds_file *f, const rs_pvalue *v, double *out)
{
	rs_torch_tensor t;
	int fd;

	if (rs_pv_kind(v) == RS_PV_INT || rs_pv_kind(v) == RS_PV_FLOAT) {
		r->st->step_is_tensor = false;
		return rs_pv_float(v, out);
	}
	if (tensor_of(r, f, v, "step", &t))
		return -EINVAL;
	if (t.ndim != 0 || (t.dtype != RS_DTYPE_F32 && t.dtype != RS_DTYPE_I64)) {
		rs_diag_add(r->d, "%s: step is not a float32 or int64 scalar",
			    f->path);
		return -EINVAL;
	}
	if (rs_sources_fd(r->ck->sources, f->source, &fd) == 0) {
		if (t.dtype == RS_DTYPE_F32) {
			float x;

			if (rs_pread_full(fd, &x, 4, t.offset) == 0) {
				*out = x;
				r->st->step_is_tensor = true;
				return 0;
			}
		} else {
			int64_t x;

			if (rs_pread_full(fd, &x, 8, t.offset) == 0) {
				*out = (double)x;
				r->st->step_is_tensor = true;
				return 0;
			}
		}
	}
	rs_diag_add(r->d, "%s: cannot read step", f->path);
	return -EINVAL;
}

/* What one optimizer file says: stage, partition count, its flats. */
static int read_optim(reader *r, uint32_t rank)
{
	rs_ds_state *st = r->st;
	ds_file *f = &r->optim[rank];
	const rs_pvalue *osd, *fp32, *pc, *states = NULL, *v;
	int stage, err = open_pickle(r, f, false);
	int64_t count = -1;

	if (err)
		return err;
	osd = rs_pv_get(rs_pickle_root(f->pk), "optimizer_state_dict");
	stage = zero_stage(rs_pv_get(osd, "zero_stage"));
	if (stage < 1) {
		rs_diag_add(r->d, "%s: optimizer_state_dict has no ZeRO stage 1, 2 or 3 (zero_stage)",
			    f->path);
		return -EINVAL;
	}
	if (rank == 0)
		st->stage = stage;
	else if (stage != st->stage) {
		rs_diag_add(r->d, "%s: ZeRO stage %d, but rank 0's file says %d",
			    f->path, stage, st->stage);
		return -EINVAL;
	}
	pc = rs_pv_get(osd, "partition_count");
	if (rs_pv_kind(pc) == RS_PV_LIST && rs_pv_len(pc) > 0) {
		for (size_t g = 0; g < rs_pv_len(pc); g++) {
			int64_t c;

			if (rs_pv_int(rs_pv_item(pc, g), &c) || (g && c != count)) {
				count = -1;
				break;
			}
			count = c;
		}
	} else if (rs_pv_int(pc, &count)) {
		count = -1;
	}
	if (count < 1 || count > (int64_t)DS_MAX_RANKS) {
		rs_diag_add(r->d, "%s: partition_count is not one number of ranks", f->path);
		return -EINVAL;
	}
	if (rank == 0)
		r->count = count;
	else if (count != r->count) {
		rs_diag_add(r->d, "%s: partition_count is %lld, but rank 0's file says %lld",
			    f->path, (long long)count, (long long)r->count);
		return -EINVAL;
	}
	fp32 = rs_pv_get(osd, stage < 3 ? "single_partition_of_fp32_groups"
					: "fp32_flat_groups");
	if (rs_pv_kind(fp32) != RS_PV_LIST || !rs_pv_len(fp32) ||
	    rs_pv_len(fp32) > DS_MAX_GROUPS) {
		rs_diag_add(r->d, "%s: no list %s of fp32 partitions", f->path,
			    stage < 3 ? "single_partition_of_fp32_groups"
				      : "fp32_flat_groups");
		return -EINVAL;
	}
	if (rank == 0) {
		st->groups = (uint32_t)rs_pv_len(fp32);
		st->flats = calloc((size_t)DS_NSTATES * st->world * st->groups,
				   sizeof(*st->flats));
		st->step = malloc(st->groups * sizeof(*st->step));
		if (!st->flats || !st->step)
			return -ENOMEM;
		for (uint32_t g = 0; g < st->groups; g++)
			st->step[g] = NAN;
	} else if (rs_pv_len(fp32) != st->groups) {
		rs_diag_add(r->d, "%s: %zu parameter groups, but rank 0's file has %u",
			    f->path, rs_pv_len(fp32), st->groups);
		return -EINVAL;
	}
	/* the optimizer's own state, per group index */
	v = stage < 3 ? rs_pv_get(osd, "base_optimizer_state")
		      : rs_pv_get(osd, "optimizer_state_dict");
	if (rs_pv_kind(v) == RS_PV_DICT)
		states = rs_pv_get(v, "state");
	for (uint32_t g = 0; g < st->groups; g++) {
		const rs_pvalue *gs = NULL;
		char what[80];

		snprintf(what, sizeof(what), "fp32 partition of group %u", g);
		err = flat_of(r, f, rs_pv_item(fp32, g), what,
			      flat_at(st, DS_FP32, rank, g));
		if (err)
			return err;
		if (rs_pv_kind(states) == RS_PV_DICT)
			gs = int_key(states, g);
		else if (rs_pv_kind(v) == RS_PV_LIST)
			gs = rs_pv_item(v, g);  /* older: a state dict per group */
		for (int s = DS_EXP_AVG; s < DS_NSTATES; s++) {
			const rs_pvalue *sv = rs_pv_get(gs, rs_ds_state_names[s]);
			ds_flat *fl = flat_at(st, s, rank, g);

			if (!sv)
				continue;
			snprintf(what, sizeof(what), "%s of group %u",
				 rs_ds_state_names[s], g);
			err = flat_of(r, f, sv, what, fl);
			if (!err && fl->numel != flat_at(st, DS_FP32, rank, g)->numel) {
				rs_diag_add(r->d, "%s: %s holds %llu elements, the fp32 partition %llu",
					    f->path, what, (unsigned long long)fl->numel,
					    (unsigned long long)flat_at(st, DS_FP32, rank, g)->numel);
				err = -EINVAL;
			}
			if (err)
				return err;
		}
		if (rank == 0 && rs_pv_get(gs, "step")) {
			err = read_step(r, f, rs_pv_get(gs, "step"), &st->step[g]);
			if (err)
				return err;
		}
	}
	return 0;
}

/* Every state is kept only when every rank and group has it. */
static void states_present(rs_ds_state *st)
{
	for (int s = 0; s < DS_NSTATES; s++) {
		st->has_state[s] = true;
		for (uint32_t k = 0; k < st->world; k++)
			for (uint32_t g = 0; g < st->groups; g++)
				st->has_state[s] &= flat_at(st, s, k, g)->present;
	}
}

/* -- the model-states files -- */

static int add_param(reader *r, const ds_file *f, const char *name,
		     size_t len, const rs_pvalue *shape, uint32_t group)
{
	rs_ds_state *st = r->st;
	ds_param *p;
	uint64_t numel = 1;
	void *grown;

	if (!name_ok(name, len)) {
		rs_diag_add(r->d, "%s: param_shapes holds a name that cannot be a tensor's name", f->path);
		return -EINVAL;
	}
	grown = realloc(st->params, (st->nparams + 1) * sizeof(*st->params));
	if (!grown)
		return -ENOMEM;
	st->params = grown;
	p = &st->params[st->nparams];
	memset(p, 0, sizeof(*p));
	if (!rs_pv_dims(shape, p->shape, &p->ndim, RS_MAX_DIMS) || p->ndim < 1) {
		rs_diag_add(r->d, "%s: param_shapes[%s] is not a torch.Size of 1 to %d dimensions",
			    f->path, name, RS_MAX_DIMS);
		return -EINVAL;
	}
	for (int k = 0; k < p->ndim; k++) {
		if (p->shape[k] && numel > UINT64_MAX / 8 / p->shape[k]) {
			rs_diag_add(r->d, "%s: param_shapes[%s] is too large", f->path, name);
			return -EINVAL;
		}
		numel *= p->shape[k];
	}
	p->name = strdup(name);
	if (!p->name)
		return -ENOMEM;
	p->numel = numel;
	p->group = group;
	st->nparams++;
	return 0;
}

static int read_param_shapes(reader *r, ds_file *f)
{
	const rs_pvalue *ps = rs_pv_get(rs_pickle_root(f->pk), "param_shapes");
	int err = 0;

	if (rs_pv_kind(ps) != RS_PV_LIST) {
		rs_diag_add(r->d, "%s: no param_shapes list", f->path);
		return -EINVAL;
	}
	if (r->st->stage < 3 && rs_pv_len(ps) != r->st->groups) {
		rs_diag_add(r->d, "%s: param_shapes has %zu groups, the optimizer files %u",
			    f->path, rs_pv_len(ps), r->st->groups);
		return -EINVAL;
	}
	for (size_t g = 0; g < rs_pv_len(ps) && !err; g++) {
		const rs_pvalue *items;

		if (!dict_of(rs_pv_item(ps, g), &items)) {
			rs_diag_add(r->d, "%s: param_shapes[%zu] is not a dict", f->path, g);
			return -EINVAL;
		}
		for (size_t i = 0; i < rs_pv_len(items) && !err; i++) {
			size_t len = 0;
			const char *name = rs_pv_str(rs_pv_key(items, i), &len);

			err = add_param(r, f, name, len, rs_pv_val(items, i),
					(uint32_t)g);
		}
	}
	return err;
}

/* The catalog tensor `name` of shape[ndim]: one stored tensor of that
 * shape (with its strides), or the first elements of dense 1-d parts
 * laid end to end (stage 3's frozen params: one part per rank). */
static int add_stored(reader *r, const char *name, size_t len,
		      const rs_torch_tensor *parts, const uint32_t *sources,
		      uint32_t nparts, const uint64_t *shape, int ndim,
		      const char *path)
{
	rs_checkpoint *ck = r->ck;
	rs_frag_list fl = { 0 };
	uint64_t numel = 1, at = 0;
	size_t idx;
	int err = 0;

	if (!name_ok(name, len)) {
		rs_diag_add(r->d, "%s: holds a name that cannot be a tensor's name", path);
		return -EINVAL;
	}
	for (int k = 0; k < ndim; k++)
		numel *= shape[k];
	for (uint32_t k = 0; k < nparts && at < numel && !err; k++) {
		const rs_torch_tensor *t = &parts[k];
		uint64_t base[RS_MAX_DIMS] = { 0 }, n = 1, take;
		unsigned es = (unsigned)rs_dtype_size(t->dtype);
		rs_fragment first = { .source = sources[k] };

		for (int j = 0; j < t->ndim; j++)
			n *= t->shape[j];
		if (nparts == 1 && t->ndim == ndim &&
		    memcmp(t->shape, shape, (size_t)ndim * sizeof(*shape)) == 0) {
			/* whole, with its own strides: one fragment */
			fl.v = calloc(1, sizeof(*fl.v));
			if (!fl.v)
				return -ENOMEM;
			fl.n = fl.cap = 1;
			fl.v[0].source = sources[0];
			fl.v[0].offset = t->offset;
			fl.v[0].box.ndim = ndim;
			for (int j = 0; j < ndim; j++) {
				fl.v[0].box.len[j] = shape[j];
				fl.v[0].stride[j] = t->stride[j];
			}
			at = numel;
			break;
		}
		if (t->ndim != 1 || (n > 1 && t->stride[0] != 1) ||
		    (k && t->dtype != parts[0].dtype)) {
			rs_diag_add(r->d, "%s: %s is not a dense 1-d part of %s elements",
				    path, name, "its param's");
			return -EINVAL;
		}
		take = numel - at < n ? numel - at : n;
		first.offset = t->offset - at * es;
		first.stride[0] = 1;
		err = rs_frag_list_add_flat(&fl, &first, es, ndim, base, shape,
					    at, at + take);
		at += take;
	}
	if (!err && at != numel) {
		rs_diag_add(r->d, "%s: the parts of %s hold fewer than its %llu elements",
			    path, name, (unsigned long long)numel);
		err = -EINVAL;
	}
	if (!err)
		err = rs_catalog_add_fragments(&ck->catalog, name, parts[0].dtype,
					       ndim, shape, fl.n, &idx);
	if (!err) {
		memcpy(ck->catalog.tensors[idx].frags, fl.v, fl.n * sizeof(*fl.v));
		err = rs_catalog_set_origin(&ck->catalog, idx, path);
	}
	free(fl.v);
	return err;
}

/* The name DeepSpeed gives rank k's optimizer file. */
static void optim_name(const reader *r, uint32_t k, char *out, size_t size)
{
	snprintf(out, size, "%szero_pp_rank_%u_mp_rank_00_optim_states.pt",
		 r->bf16_prefix ? "bf16_" : "", k);
}

/* Every rank of partition_count has its optimizer file, and no other
 * rank does (rank 0's is read first: it says the count). */
static int check_ranks(reader *r)
{
	rs_ds_state *st = r->st;
	uint64_t want = r->count > 0 ? (uint64_t)r->count : st->world;
	uint32_t found = 0, missing = UINT32_MAX;
	char name[128];

	for (uint32_t k = 0; k < st->world; k++) {
		if (r->optim[k].entry >= 0)
			found++;
		else if (missing == UINT32_MAX)
			missing = k;
	}
	if (missing == UINT32_MAX && want > st->world)
		missing = st->world;
	if (missing != UINT32_MAX) {
		optim_name(r, missing, name, sizeof(name));
		rs_diag_add(r->d, "%s: expected %llu *_optim_states.pt files (one per data-parallel rank), found %u: rank %u's %s is missing",
			    r->where, (unsigned long long)want, found, missing, name);
		return -EINVAL;
	}
	if (want < st->world) {
		optim_name(r, (uint32_t)want, name, sizeof(name));
		rs_diag_add(r->d, "%s/%s: a rank past partition_count %llu (rank 0's file says the save has %llu ranks)",
			    r->where, name, (unsigned long long)want,
			    (unsigned long long)want);
		return -EINVAL;
	}
	return 0;
}

/* What the model-states files say of the module: the dtype it trained
 * in (its first param's), the version. */
static void read_module_facts(reader *r, ds_file *f)
{
	const rs_pvalue *root = rs_pickle_root(f->pk), *module;
	const char *v;
	size_t len;

	r->st->trained = RS_DTYPE_F32;
	if (dict_of(rs_pv_get(root, "module"), &module) && r->st->params) {
		const rs_pvalue *t = rs_pv_get(module, r->st->params[0].name);
		rs_torch_tensor tt;
		char why[200];

		if (t && rs_torch_tensor_read(&f->z, t, &tt, why, sizeof(why)) == 0)
			r->st->trained = tt.dtype;
	}
	v = rs_pv_str(rs_pv_get(root, "ds_version"), &len);
	if (v && len < 40 && name_ok(v, len))
		r->st->ds_version = strdup(v);
}

/* Frozen params: whole in stages 1-2, one part per rank in stage 3. */
static int read_frozen(reader *r)
{
	ds_file *f0 = &r->model[0];
	const rs_pvalue *shapes;
	rs_torch_tensor *parts = NULL;
	uint32_t *sources = NULL, n = r->st->stage < 3 ? 1 : r->nmodel;
	int err = 0;

	if (!dict_of(rs_pv_get(rs_pickle_root(f0->pk), "frozen_param_shapes"), &shapes) ||
	    !rs_pv_len(shapes))
		return 0;
	parts = calloc(n, sizeof(*parts));
	sources = calloc(n, sizeof(*sources));
	if (!parts || !sources) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < rs_pv_len(shapes) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_key(shapes, i), &len);
		uint64_t shape[RS_MAX_DIMS];
		int ndim = 0;

		if (!name || !rs_pv_dims(rs_pv_val(shapes, i), shape, &ndim,
					 RS_MAX_DIMS) || ndim < 1) {
			rs_diag_add(r->d, "%s: frozen_param_shapes holds an entry that is not a name and a torch.Size",
				    f0->path);
			err = -EINVAL;
			break;
		}
		for (uint32_t k = 0; k < n && !err; k++) {
			ds_file *f = &r->model[k];
			const rs_pvalue *fr, *t;

			if (!dict_of(rs_pv_get(rs_pickle_root(f->pk), "frozen_param_fragments"), &fr) ||
			    !(t = rs_pv_get(fr, name))) {
				rs_diag_add(r->d, "%s: frozen_param_fragments lacks %s",
					    f->path, name);
				err = -EINVAL;
				break;
			}
			sources[k] = f->source;
			err = tensor_of(r, f, t, name, &parts[k]);
		}
		if (!err)
			err = add_stored(r, name, len, parts, sources, n, shape,
					 ndim, f0->path);
		r->st->nfrozen++;
	}
out:
	free(parts);
	free(sources);
	return err;
}

/* Stage 1 saves no frozen_param_shapes: its frozen params are the
 * module's other entries (not trainable, not buffers, not shared), as
 * stored. */
static int read_module_frozen(reader *r)
{
	ds_file *f = &r->model[0];
	const rs_pvalue *root = rs_pickle_root(f->pk), *module, *sh = NULL;
	rs_catalog *c = &r->ck->catalog;
	int err = 0;

	if (r->st->stage == 3 || rs_pv_get(root, "frozen_param_shapes") == NULL ||
	    rs_pv_kind(rs_pv_get(root, "frozen_param_shapes")) != RS_PV_NONE ||
	    !dict_of(rs_pv_get(root, "module"), &module))
		return 0;
	dict_of(rs_pv_get(root, "shared_params"), &sh);
	for (size_t i = 0; i < rs_pv_len(module) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_key(module, i), &len);
		bool known = !name || rs_pv_get(sh, name) != NULL;
		rs_torch_tensor tt;

		for (size_t k = 0; !known && k < c->count; k++)
			known = strcmp(c->tensors[k].name, name) == 0;
		if (known)
			continue;
		err = tensor_of(r, f, rs_pv_val(module, i), name, &tt);
		if (!err)
			err = add_stored(r, name, len, &tt, &f->source, 1,
					 tt.shape, tt.ndim, f->path);
		r->st->nfrozen++;
	}
	return err;
}

/* Buffers: the module's entries buffer_names lists, as stored. */
static int read_buffers(reader *r)
{
	ds_file *f = &r->model[0];
	const rs_pvalue *root = rs_pickle_root(f->pk), *module = NULL;
	const rs_pvalue *names = rs_pv_get(root, "buffer_names");
	int err = 0;

	if (!rs_pv_len(names))
		return 0;
	if (rs_pv_kind(names) != RS_PV_LIST ||
	    !dict_of(rs_pv_get(root, "module"), &module)) {
		rs_diag_add(r->d, "%s: buffer_names is not a list of the module's entries",
			    f->path);
		return -EINVAL;
	}
	for (size_t i = 0; i < rs_pv_len(names) && !err; i++) {
		size_t len = 0;
		const char *name = rs_pv_str(rs_pv_item(names, i), &len);
		const rs_pvalue *t = name ? rs_pv_get(module, name) : NULL;
		rs_torch_tensor tt;

		if (!t) {
			rs_diag_add(r->d, "%s: buffer %s is not in module",
				    f->path, name ? name : "(not a name)");
			return -EINVAL;
		}
		err = tensor_of(r, f, t, name, &tt);
		if (!err)
			err = add_stored(r, name, len, &tt, &f->source, 1,
					 tt.shape, tt.ndim, f->path);
		r->st->nbuffers++;
	}
	return err;
}

/* shared_params: a name for another param's tensor (a tied output
 * layer): the same fragments under a second name. */
static int read_shared(reader *r)
{
	ds_file *f = &r->model[0];
	rs_catalog *c = &r->ck->catalog;
	const rs_pvalue *sh;
	int err = 0;

	if (!dict_of(rs_pv_get(rs_pickle_root(f->pk), "shared_params"), &sh))
		return 0;
	for (size_t i = 0; i < rs_pv_len(sh) && !err; i++) {
		size_t len = 0, tlen = 0, to = SIZE_MAX, idx;
		const char *name = rs_pv_str(rs_pv_key(sh, i), &len);
		const char *target = rs_pv_str(rs_pv_val(sh, i), &tlen);

		for (size_t k = 0; target && k < c->count; k++)
			if (strcmp(c->tensors[k].name, target) == 0)
				to = k;
		if (!name_ok(name, len) || to == SIZE_MAX) {
			rs_diag_add(r->d, "%s: shared_params names %s for %s, which is no param",
				    f->path, name && name_ok(name, len) ? name : "a tensor",
				    target && name_ok(target, tlen) ? target : "a name");
			return -EINVAL;
		}
		err = rs_catalog_add_fragments(c, name, c->tensors[to].dtype,
					       c->tensors[to].ndim,
					       c->tensors[to].shape,
					       c->tensors[to].nfrags, &idx);
		if (!err) {
			rs_tensor *t = &c->tensors[idx], *s = &c->tensors[to];

			memcpy(t->frags, s->frags, s->nfrags * sizeof(*s->frags));
			err = rs_catalog_set_origin(c, idx, f->path);
		}
		r->st->nshared++;
	}
	return err;
}

/* config.json for the hf view: -o hf_config=, else the save directory's,
 * else the one beside a tag directory mounted itself. */
static int read_config(reader *r, const rs_open_opts *o)
{
	rs_checkpoint *ck = r->ck;
	char *text = NULL, path[4400], why[160];
	size_t len = 0;
	cJSON *root = NULL;
	int err = 0;

	if (o->hf_config) {
		snprintf(path, sizeof(path), "%s", o->hf_config);
		text = rs_user_file_read(path, DS_CONFIG_MAX, "hf_config file",
					 &len, r->d);
		if (!text)
			return -EINVAL;
	} else if (r->tag >= 0) {
		snprintf(path, sizeof(path), "%s/config.json", ck->root_path);
		err = rs_checkpoint_read_file(ck, "config.json", DS_CONFIG_MAX,
					      &text, &len, NULL, r->d);
		if (err == -ENOENT)
			return 0;
	} else {
		struct stat sb;

		snprintf(path, sizeof(path), "%s/../config.json", ck->root_path);
		if (stat(path, &sb) != 0)
			return 0;
		text = rs_user_file_read(path, DS_CONFIG_MAX, "config.json",
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
		DS_TRACKER, "zero_to_fp32.py", "zero_to_torch.py",
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

static void hide_entries(reader *r)
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
				     rank_name(e->name, &kind, &dp, &mp, &bf16));
		else if (r->tag >= 0)
			e->hidden = (long)i == r->tag ||
				    save_file(e->name, e->is_dir);
		else
			e->hidden = rank_name(e->name, &kind, &dp, &mp, &bf16);
	}
}

/* --dry-run's lines on what SOURCE holds and what each view makes of
 * it, and the note a mount prints when the HF Trainer's weights are
 * beside DeepSpeed's. */
static int describe(reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_state *st = r->st;
	const rs_entry *hf = rs_checkpoint_top_entry(ck, "model.safetensors");
	char steps[64] = "none stored";
	int n;

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
	if (hf && r->tag >= 0 &&
	    asprintf(&ck->notice, "%s holds the HF Trainer's model.safetensors and DeepSpeed's %s (named by latest): reading DeepSpeed's fp32 master weights; mount a directory holding only model.safetensors to read that copy instead",
		     ck->root_path, st->tag) < 0) {
		ck->notice = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* -- a universal checkpoint (formats/deepspeed/deepspeed.h) -- */

/* The entry of `name` in directory `dir`, -1. */
static long child(const rs_checkpoint *ck, long dir, const char *name)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent == dir &&
		    strcmp(ck->entries[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* One zero/<param>/<state>.pt: its 'param' (or, as ds_to_universal
 * writes stage 3's, the bare flat tensor) as catalog tensor `name`, in
 * the param's shape (param_shapes') when it is stored flat. */
static int universal_state(reader *r, long file, const char *name,
			   const rs_pvalue *shapes, const char *param,
			   bool *is_step)
{
	rs_checkpoint *ck = r->ck;
	ds_file f = { .entry = file, .source = ck->entries[file].source };
	const rs_pvalue *v, *shape = rs_pv_get(shapes, param);
	uint64_t dims[RS_MAX_DIMS], numel = 1, n = 1;
	int ndim = 0, err = open_pickle(r, &f, true);
	rs_torch_tensor t;

	if (err)
		goto out;
	v = rs_pickle_root(f.pk);
	if (rs_pv_kind(v) == RS_PV_DICT)
		v = rs_pv_get(v, "param");
	err = tensor_of(r, &f, v, "param", &t);
	if (err)
		goto out;
	if (is_step) {
		double step;

		*is_step = true;
		err = read_step(r, &f, v, &step);
		if (!err && r->st->groups && isnan(r->st->step[0]))
			r->st->step[0] = step;
		goto out;
	}
	if (t.dtype != RS_DTYPE_F32) {
		rs_diag_add(r->d, "%s: param is not float32", f.path);
		err = -EINVAL;
		goto out;
	}
	for (int k = 0; k < t.ndim; k++)
		n *= t.shape[k];
	if (t.ndim == 1 && shape && rs_pv_dims(shape, dims, &ndim, RS_MAX_DIMS)) {
		for (int k = 0; k < ndim; k++)
			numel *= dims[k];
		if (numel != n || ndim < 1) {
			rs_diag_add(r->d, "%s: holds %llu elements, param_shapes says %s has %llu",
				    f.path, (unsigned long long)n, param,
				    (unsigned long long)numel);
			err = -EINVAL;
			goto out;
		}
	} else {
		ndim = t.ndim;
		memcpy(dims, t.shape, sizeof(dims));
	}
	err = add_stored(r, name, strlen(name), &t, &f.source, 1, dims, ndim,
			 f.path);
out:
	rs_pickle_free(f.pk);
	rs_zip_free(&f.z);
	return err;
}

/* Every zero/<param>/ directory: a trainable param (fp32, exp_avg,
 * exp_avg_sq, step), or what ds_to_universal writes fp32.pt alone for
 * (frozen params, buffers); tied names come from shared_params. */
static int read_universal(reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_ds_state *st = r->st;
	ds_file *f0 = &r->model[0];
	const rs_pvalue *root, *ps, *shapes = NULL, *shared = NULL;
	int64_t world = 0;
	int err = open_pickle(r, f0, false);

	if (err)
		return err;
	root = rs_pickle_root(f0->pk);
	ps = rs_pv_get(root, "param_shapes");
	if (rs_pv_kind(ps) == RS_PV_LIST && rs_pv_len(ps))
		dict_of(rs_pv_item(ps, 0), &shapes);    /* stage 3: the only group */
	dict_of(rs_pv_get(root, "shared_params"), &shared);
	if (rs_pv_int(rs_pv_get(root, "dp_world_size"), &world) == 0 &&
	    world > 0 && world <= (int64_t)DS_MAX_RANKS)
		st->world = (uint32_t)world;
	st->universal = true;
	st->groups = 1;
	st->step = malloc(sizeof(*st->step));
	if (!st->step)
		return -ENOMEM;
	st->step[0] = NAN;
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		bool trainable;

		if (e->parent != r->zero || !e->is_dir ||
		    rs_pv_get(shared, e->name))
			continue;
		if (child(ck, (long)i, "fp32.pt") < 0) {
			rs_diag_add(r->d, "%s/zero/%s: holds no fp32.pt", r->where,
				    e->name);
			return -EINVAL;
		}
		trainable = child(ck, (long)i, "exp_avg.pt") >= 0;
		for (int s = 0; s < DS_NSTATES && !err; s++) {
			long file = child(ck, (long)i, s ? (s == DS_EXP_AVG ? "exp_avg.pt" : "exp_avg_sq.pt") : "fp32.pt");
			char *name = NULL;

			if (file < 0) {
				if (trainable && s) {
					rs_diag_add(r->d, "%s/zero/%s: holds exp_avg.pt but no exp_avg_sq.pt",
						    r->where, e->name);
					err = -EINVAL;
				}
				continue;
			}
			if (s && asprintf(&name, "optimizer.state.%s.%s",
					  rs_ds_state_names[s], e->name) < 0)
				return -ENOMEM;
			err = universal_state(r, file, s ? name : e->name, shapes,
					      e->name, NULL);
			free(name);
		}
		if (!err && trainable && child(ck, (long)i, "step.pt") >= 0) {
			bool step = false;

			err = universal_state(r, child(ck, (long)i, "step.pt"),
					      e->name, NULL, e->name, &step);
		}
		if (trainable)
			st->nparams++;
		else
			st->nfrozen++;
	}
	st->has_state[DS_FP32] = true;
	st->has_state[DS_EXP_AVG] = st->has_state[DS_EXP_AVG_SQ] = st->nparams > 0;
	/* From a stage 3 save ds_to_universal copies every rank's
	 * model-states file and writes no directory for frozen params and
	 * buffers: they are in those files, as in the save. */
	st->stage = r->zero3_names ? 3 : 0;
	for (uint32_t k = 1; k < r->nmodel && r->zero3_names && !err; k++)
		err = r->model[k].entry < 0 ? 0 : open_pickle(r, &r->model[k], false);
	if (!err && r->zero3_names && r->nmodel == st->world)
		err = read_frozen(r);
	if (!err && r->zero3_names)
		err = read_buffers(r);
	return err ? err : read_shared(r);
}

static int read_all(reader *r, const rs_open_opts *o)
{
	rs_ds_state *st = r->st;
	size_t dup;
	int err = rs_checkpoint_walk(r->ck, NULL, r->d);

	if (!err)
		err = find_tag(r);
	if (!err) {
		r->zero = child(r->ck, r->tag, "zero");
		if (r->zero >= 0 && (!r->ck->entries[r->zero].is_dir ||
				     child(r->ck, r->zero, "optimizer_state.pt") < 0))
			r->zero = -1;
		err = find_files(r);
	}
	if (!err && r->zero >= 0) {
		err = read_universal(r);
		goto model;
	}
	if (!err && r->optim[0].entry < 0)
		err = check_ranks(r);
	if (!err)
		err = read_optim(r, 0);
	if (!err)
		err = check_ranks(r);
	for (uint32_t k = 1; k < st->world && !err; k++)
		err = read_optim(r, k);
	if (err)
		return err;
	states_present(st);
	if (r->zero3_names != (st->stage == 3)) {
		rs_diag_add(r->d, "%s: ZeRO stage %d, but its model-states files are named as stage %s writes them",
			    r->where, st->stage, r->zero3_names ? "3" : "1 and 2");
		return -EINVAL;
	}
	for (uint32_t k = 0; k < r->nmodel; k++)
		if (r->model[k].entry < 0 || (st->stage == 3 && r->nmodel != st->world)) {
			rs_diag_add(r->d, "%s: expected %u zero_pp_rank_*_mp_rank_00_model_states.pt files, one per rank: rank %u's is missing",
				    r->where, st->world,
				    r->model[k].entry < 0 ? k : r->nmodel);
			return -EINVAL;
		}
	for (uint32_t k = 0; k < r->nmodel && !err; k++)
		err = open_pickle(r, &r->model[k], false);
	if (!err)
		err = read_param_shapes(r, &r->model[0]);
	if (!err)
		err = rs_ds_add_params(r->ck, st, r->where, r->d);
	if (!err)
		err = read_frozen(r);
	if (!err)
		err = read_buffers(r);
	if (!err)
		err = read_module_frozen(r);
	if (!err)
		err = read_shared(r);
model:
	if (!err)
		err = rs_names_first_dup(r->ck->catalog.tensors,
					 r->ck->catalog.count, sizeof(rs_tensor),
					 offsetof(rs_tensor, name), &dup);
	if (!err && dup != SIZE_MAX) {
		rs_diag_add(r->d, "%s: names %s twice (as a param, frozen param, buffer or shared param)",
			    r->where, r->ck->catalog.tensors[dup].name);
		err = -EINVAL;
	}
	if (err)
		return err;
	read_module_facts(r, &r->model[0]);
	st->model_states = r->model[0].source;
	if (!st->universal) {
		st->opt0 = r->optim[0].pk;
		r->optim[0].pk = NULL;
	}
	r->ck->model.hf_names = true;
	err = read_config(r, o);
	if (!err) {
		hide_entries(r);
		err = describe(r);
	}
	return err;
}

int rs_deepspeed_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	rs_ds_state *st = calloc(1, sizeof(*st));
	reader r = { .ck = ck, .st = st, .d = d, .zero = -1 };
	int err;

	if (!st)
		return -ENOMEM;
	ck->extra = st;
	ck->extra_free = rs_ds_state_free;
	err = read_all(&r, o);
	for (uint32_t k = 0; r.optim && k < r.noptim; k++) {
		rs_pickle_free(r.optim[k].pk);
		rs_zip_free(&r.optim[k].z);
	}
	for (uint32_t k = 0; r.model && k < r.nmodel; k++) {
		rs_pickle_free(r.model[k].pk);
		rs_zip_free(&r.model[k].z);
	}
	free(r.optim);
	free(r.model);
	return err;
}

static rs_detect detect(const char *name, mode_t mode)
{
	char kind;
	long dp, mp;
	bool bf16;

	if (!S_ISREG(mode))
		return RS_DETECT_NONE;
	/* `latest` decides alone: an HF Trainer's checkpoint-N holds
	 * model.safetensors beside it, and DeepSpeed's state is the fuller
	 * one (the mount says so: rs_checkpoint.notice). */
	if (strcmp(name, DS_TRACKER) == 0 || strcmp(name, DS_TRACKER_UC) == 0)
		return RS_DETECT_MARKER;
	return rank_name(name, &kind, &dp, &mp, &bf16) ? RS_DETECT_FILES
						       : RS_DETECT_NONE;
}

const rs_format_def rs_deepspeed_format = {
	.name = "deepspeed",
	.detect = detect,
	.looks_like = "a DeepSpeed save (latest, latest_universal, *_model_states.pt)",
	.read = rs_deepspeed_read,
	.default_view = "safetensors",
};
