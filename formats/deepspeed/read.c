/* DeepSpeed ZeRO reader: SOURCE -> tag directory -> rank files -> catalog
 * (formats/deepspeed/deepspeed.h).
 *
 * This file finds the tag directory and its rank files, reads the
 * optimizer files and checks them against each other, and drives the
 * rest: the flat partitions to zero.c, the model-states files to
 * module.c, a universal checkpoint to universal_read.c, config.json and
 * what is passed through to save_dir.c.  It also holds what they share
 * (opening a file, pickle values, names).
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
bool rs_ds_rank_name(const char *name, char *kind, long *dp, long *mp,
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
			return *kind == 'm' || *dp >= 0;  /* optimizer files
							   * name their DP rank */
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
int rs_ds_open(rs_ds_reader *r, rs_ds_file *f, bool any)
{
	rs_checkpoint *ck = r->ck;
	int err;

	snprintf(f->path, sizeof(f->path), "%s/%s", ck->root_path,
		 rs_sources_path(ck->sources, f->source));
	err = (any ? rs_checkpoint_open_torch_save
		   : rs_checkpoint_open_torch_dict)(ck, f->source, f->path,
						    rs_deepspeed_allow,
						    RS_DS_PKL_MAX, &f->z, &f->pk,
						    r->d);
	return err;
}

/* The tag directory: the one `latest` names, else SOURCE. */
static int find_tag(rs_ds_reader *r)
{
	rs_checkpoint *ck = r->ck;
	rs_entry *latest = rs_checkpoint_top_entry(ck, RS_DS_TRACKER);
	const char *tracker = RS_DS_TRACKER;
	char *text = NULL, *s, *e;
	size_t len;
	bool bad;
	int err;

	r->tag = -1;
	snprintf(r->where, sizeof(r->where), "%s", ck->root_path);
	if (!latest || latest->is_dir) {
		latest = rs_checkpoint_top_entry(ck, RS_DS_TRACKER_UC);
		tracker = RS_DS_TRACKER_UC;
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
	r->tag = rs_ds_child(ck, -1, s);
	if (r->tag < 0 || !ck->entries[r->tag].is_dir) {
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
static int find_files(rs_ds_reader *r)
{
	rs_checkpoint *ck = r->ck;
	long max_dp = -1, max_model = -1;
	size_t nopt = 0, nmodel = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < ck->nentries; i++) {
			const rs_entry *e = &ck->entries[i];
			const char *why;
			rs_ds_file *f;
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
			if (!rs_ds_rank_name(e->name, &kind, &dp, &mp, &bf16))
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
		if (max_dp + 1 > (long)RS_DS_MAX_RANKS || max_model + 1 > (long)RS_DS_MAX_RANKS) {
			rs_diag_add(r->d, "%s: more than %u ranks", r->where,
				    RS_DS_MAX_RANKS);
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

/* Names sorted for lookup (deepspeed_int.h, rs_ds_index). */

static int index_names(rs_ds_index *x, size_t n)
{
	return rs_names_sort(&x->by, x->names, n, sizeof(*x->names), 0);
}

int rs_ds_index_dict(const rs_pvalue *dict, rs_ds_index *x)
{
	size_t n = rs_pv_len(dict);

	x->names = calloc(n + 1, sizeof(*x->names));
	if (!x->names)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		x->names[i] = rs_pv_str(rs_pv_key(dict, i), NULL);
		if (!x->names[i])
			x->names[i] = "";
	}
	/* Python keeps a repeated key's last value, a lookup here the
	 * first: refused rather than read differently */
	if (index_names(x, n))
		return -ENOMEM;
	return rs_names_next_dup(&x->by, 1) < n ? -EEXIST : 0;
}

int rs_ds_index_catalog(const rs_catalog *c, rs_ds_index *x)
{
	x->names = calloc(c->count + 1, sizeof(*x->names));
	if (!x->names)
		return -ENOMEM;
	for (size_t i = 0; i < c->count; i++)
		x->names[i] = c->tensors[i].name;
	return index_names(x, c->count);
}

size_t rs_ds_index_find(const rs_ds_index *x, const char *name)
{
	return name ? rs_names_find(&x->by, name) : SIZE_MAX;
}

void rs_ds_index_free(rs_ds_index *x)
{
	rs_names_free(&x->by);
	free(x->names);
}

/* A name from a pickle that becomes a tensor's name (and in the
 * universal view a directory's): safe as a path component, printable. */
bool rs_ds_name_ok(const char *s, size_t len)
{
	if (!s || strlen(s) != len || !rs_name_is_safe(s) || len > 1000)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/* A tensor record of file f, checked against its zip. */
int rs_ds_tensor(rs_ds_reader *r, rs_ds_file *f, const rs_pvalue *v,
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
static int flat_of(rs_ds_reader *r, rs_ds_file *f, const rs_pvalue *v,
		   const char *what, rs_ds_flat *out)
{
	rs_torch_tensor t;
	int err = rs_ds_tensor(r, f, v, what, &t);

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

static rs_ds_flat *flat_at(rs_ds_state *st, int state, uint32_t rank,
			uint32_t g)
{
	return &st->flats[((size_t)state * st->world + rank) * st->groups + g];
}

/* The stored step of one group: a 0-d tensor (read now: 8 bytes at most
 * of metadata) or a number. */
int rs_ds_read_step(rs_ds_reader *r, rs_ds_file *f, const rs_pvalue *v, double *out)
{
	union { float f; int64_t i; } x;
	rs_torch_tensor t;
	int fd;

	if (rs_pv_kind(v) == RS_PV_INT || rs_pv_kind(v) == RS_PV_FLOAT)
		return rs_pv_float(v, out);
	if (rs_ds_tensor(r, f, v, "step", &t))
		return -EINVAL;
	if (t.ndim != 0 || (t.dtype != RS_DTYPE_F32 && t.dtype != RS_DTYPE_I64)) {
		rs_diag_add(r->d, "%s: step is not a float32 or int64 scalar",
			    f->path);
		return -EINVAL;
	}
	if (rs_sources_fd(r->ck->sources, f->source, &fd) != 0 ||
	    rs_pread_full(fd, &x, rs_dtype_size(t.dtype), t.offset) != 0) {
		rs_diag_add(r->d, "%s: cannot read step", f->path);
		return -EINVAL;
	}
	*out = t.dtype == RS_DTYPE_F32 ? x.f : (double)x.i;
	return 0;
}

/* What one optimizer file says: stage, partition count, its flats. */
static int read_optim(rs_ds_reader *r, uint32_t rank)
{
	rs_ds_state *st = r->st;
	rs_ds_file *f = &r->optim[rank];
	const rs_pvalue *osd, *fp32, *pc, *states = NULL, *v;
	int stage, err = rs_ds_open(r, f, false);
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
	if (count < 1 || count > (int64_t)RS_DS_MAX_RANKS) {
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
	    rs_pv_len(fp32) > RS_DS_MAX_GROUPS) {
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
			rs_ds_flat *fl = flat_at(st, s, rank, g);

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
			err = rs_ds_read_step(r, f, rs_pv_get(gs, "step"), &st->step[g]);
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

/* The name DeepSpeed gives rank k's optimizer file. */
static void optim_name(const rs_ds_reader *r, uint32_t k, char *out, size_t size)
{
	snprintf(out, size, "%szero_pp_rank_%u_mp_rank_00_optim_states.pt",
		 r->bf16_prefix ? "bf16_" : "", k);
}

/* Every rank of partition_count has its optimizer file, and no other
 * rank does (rank 0's is read first: it says the count). */
static int check_ranks(rs_ds_reader *r)
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

static int read_all(rs_ds_reader *r, const rs_open_opts *o)
{
	rs_ds_state *st = r->st;
	size_t dup;
	int err = rs_checkpoint_walk(r->ck, NULL, r->d);

	if (!err)
		err = find_tag(r);
	if (!err) {
		r->zero = rs_ds_child(r->ck, r->tag, "zero");
		if (r->zero >= 0 && (!r->ck->entries[r->zero].is_dir ||
				     rs_ds_child(r->ck, r->zero, "optimizer_state.pt") < 0))
			r->zero = -1;
		err = find_files(r);
	}
	if (!err && r->zero >= 0) {
		err = rs_ds_read_universal(r);
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
		err = rs_ds_open(r, &r->model[k], false);
	if (!err)
		err = rs_ds_read_param_shapes(r, &r->model[0]);
	if (!err)
		err = rs_ds_add_params(r->ck, st, r->where, r->d);
	if (!err)
		err = rs_ds_read_frozen(r);
	if (!err)
		err = rs_ds_read_buffers(r);
	if (!err)
		err = rs_ds_read_module_frozen(r);
	if (!err)
		err = rs_ds_read_shared(r);
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
	rs_ds_module_facts(r, &r->model[0]);
	st->model_states = r->model[0].source;
	if (!st->universal) {
		st->opt0 = r->optim[0].pk;
		r->optim[0].pk = NULL;
	}
	r->ck->model.hf_names = true;
	err = rs_ds_read_config(r, o);
	if (!err) {
		rs_ds_hide_entries(r);
		err = rs_ds_describe(r);
	}
	return err;
}

int rs_deepspeed_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	rs_ds_state *st = calloc(1, sizeof(*st));
	rs_ds_reader r = { .ck = ck, .st = st, .d = d, .zero = -1 };
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
	if (strcmp(name, RS_DS_TRACKER) == 0 || strcmp(name, RS_DS_TRACKER_UC) == 0)
		return RS_DETECT_MARKER;
	return rs_ds_rank_name(name, &kind, &dp, &mp, &bf16) ? RS_DETECT_FILES
						       : RS_DETECT_NONE;
}

const rs_format_def rs_deepspeed_format = {
	.name = "deepspeed",
	.detect = detect,
	.looks_like = "a DeepSpeed save (latest, latest_universal, *_model_states.pt)",
	.read = rs_deepspeed_read,
	.default_view = "safetensors",
};
