/* Legacy Megatron reader: SOURCE -> rank files -> catalog (megatron.h).
 *
 * This file finds the iteration and its rank directories, parses each
 * rank's data.pkl, checks the args and the dict around the model against
 * the directories and against each other, and hands each file's models to
 * megatron_model.c.  Args decide what the model walk cannot see: the
 * virtual stages, the layers per chunk, gating and tied embeddings.
 */
#include "formats/megatron.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/zarr.h"

#define TRACKER "latest_checkpointed_iteration.txt"
#define RANK_FILE "model_optim_rng.pt"
/* data.pkl holds the structure of model, optimizer and rng state (a few
 * hundred bytes a tensor); anything near this is not a checkpoint. */
#define RS_MEGATRON_PKL_MAX (256u << 20)
/* Far beyond real models; bounds what args may make us allocate. */
#define RS_MEGATRON_MAX_LAYERS (1u << 16)
#define RS_MEGATRON_MAX_RANKS (1u << 16)

const char *const rs_megatron_allow[] = {
	"torch.*",
	"collections.OrderedDict",
	"_codecs.encode",
	"builtins.set",
	"builtins.frozenset",
	"builtins.bytearray",
	"argparse.Namespace",
	"types.SimpleNamespace",
	"pathlib.PosixPath",
	/* np.random.get_state() in rng_state */
	"numpy.core.multiarray._reconstruct",
	"numpy._core.multiarray._reconstruct",
	"numpy.core.multiarray.scalar",
	"numpy._core.multiarray.scalar",
	"numpy.ndarray",
	"numpy.dtype",
	"numpy.dtypes.*",
	/* enum members args hold (model_type, attention_backend, fp8_recipe)
	 * and the rerun state, as megatron/core/safe_globals.py lists them;
	 * older Megatron-LM kept the enums under megatron.model. */
	"megatron.core.enums.*",
	"megatron.core.transformer.enums.*",
	"megatron.core.rerun_state_machine.RerunDiagnostic",
	"megatron.core.rerun_state_machine.RerunMode",
	"megatron.core.rerun_state_machine.RerunState",
	"megatron.legacy.model.enums.*",
	"megatron.model.enums.*",
	NULL,
};

void rs_meg_state_free(void *state)
{
	rs_meg_state *st = state;

	if (!st)
		return;
	for (size_t i = 0; i < st->ntensors; i++) {
		for (int k = 0; k < st->tensors[i].nkeys; k++)
			free(st->tensors[i].keys[k]);
		free(st->tensors[i].keys);
	}
	free(st->tensors);
	free(st->carry);
	free(st->iter_dir);
	rs_pickle_free(st->pk);
	free(st);
}

/* One rank directory of the iteration. */
typedef struct {
	long dir;               /* its entry */
	uint32_t src;           /* model_optim_rng.pt */
	bool found;
} rank_dir;

typedef struct {
	rs_checkpoint *ck;
	rs_meg_state *st;
	rs_diag *d;
	long iter_entry;        /* -1: SOURCE is the iteration directory */
	char iter_path[4200];   /* for messages */
	rank_dir *ranks;        /* [p * T + t] */
	bool suffix;            /* names carry the _PPP suffix */
} finder;

static long child(const rs_checkpoint *ck, long parent, const char *name,
		  bool is_dir)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent == parent &&
		    ck->entries[i].is_dir == is_dir &&
		    strcmp(ck->entries[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* digits up to 6 of them: a rank number. */
static const char *parse_rank(const char *s, uint32_t *out)
{
	uint32_t v = 0;
	int n = 0;

	for (; *s >= '0' && *s <= '9' && n < 7; s++, n++)
		v = v * 10 + (uint32_t)(*s - '0');
	if (!n || n > 6)
		return NULL;
	*out = v;
	return s;
}

/* The root form: the tracker names the iteration directory. */
static int find_iteration(finder *f)
{
	char *text = NULL, *s, *e;
	size_t len;
	int err = rs_checkpoint_read_file(f->ck, TRACKER, 64, &text, &len, NULL,
					  f->d);

	if (err == -ENOENT) {
		rs_diag_add(f->d, "%s: no mp_rank_* directories and no %s",
			    f->ck->root_path, TRACKER);
		return -EINVAL;
	}
	if (err)
		return err;
	for (s = text; *s == ' ' || *s == '\n' || *s == '\r' || *s == '\t'; s++)
		;
	for (e = s + strlen(s); e > s && (e[-1] == ' ' || e[-1] == '\n' ||
					  e[-1] == '\r' || e[-1] == '\t'); e--)
		;
	*e = 0;
	if (strcmp(s, "release") == 0) {
		f->st->iter_dir = strdup("release");
	} else {
		char *end;
		unsigned long long it = strtoull(s, &end, 10);

		if (!*s || *end || *s == '-' || *s == '+' || it > 9999999999ull) {
			rs_diag_add(f->d, "%s/%s: holds neither an iteration number nor 'release'",
				    f->ck->root_path, TRACKER);
			free(text);
			return -EINVAL;
		}
		if (asprintf(&f->st->iter_dir, "iter_%07llu", it) < 0)
			f->st->iter_dir = NULL;
	}
	free(text);
	if (!f->st->iter_dir)
		return -ENOMEM;
	f->iter_entry = child(f->ck, -1, f->st->iter_dir, true);
	if (f->iter_entry < 0) {
		rs_diag_add(f->d, "%s/%s: names %s, which is missing", f->ck->root_path,
			    TRACKER, f->st->iter_dir);
		return -EINVAL;
	}
	return 0;
}

static bool is_rank_dir(const rs_entry *e, long parent)
{
	return e->is_dir && e->parent == parent &&
	       strncmp(e->name, "mp_rank_", 8) == 0;
}

/* Rank directories: their (tp, pp) ranks, all of a full grid. */
static int find_ranks(finder *f)
{
	rs_checkpoint *ck = f->ck;
	uint32_t T = 0, P = 0;
	int suffixed = -1, err = 0;

	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t t, p = 0;
		const char *s;

		if (!is_rank_dir(e, f->iter_entry))
			continue;
		s = parse_rank(e->name + 8, &t);
		if (s && *s == '_')
			s = parse_rank(s + 1, &p);
		else if (s && !*s)
			p = UINT32_MAX;   /* no suffix */
		if (s && *s == '_') {
			rs_diag_add(f->d, "%s/%s: expert-parallel rank directories are not supported",
				    f->iter_path, e->name);
			return -EINVAL;
		}
		if (!s || *s) {
			rs_diag_add(f->d, "%s/%s: not a rank directory name (mp_rank_TT or mp_rank_TT_PPP)",
				    f->iter_path, e->name);
			return -EINVAL;
		}
		if (suffixed >= 0 && suffixed != (p != UINT32_MAX)) {
			rs_diag_add(f->d, "%s: some rank directories have a pipeline suffix, some not",
				    f->iter_path);
			return -EINVAL;
		}
		suffixed = p != UINT32_MAX;
		if (p == UINT32_MAX)
			p = 0;
		T = t + 1 > T ? t + 1 : T;
		P = p + 1 > P ? p + 1 : P;
	}
	if (!T) {
		rs_diag_add(f->d, "%s: holds no mp_rank_* directories (a distributed checkpoint's iteration directory is mounted itself)",
			    f->iter_path);
		return -EINVAL;
	}
	if ((uint64_t)T * P > RS_MEGATRON_MAX_RANKS) {
		rs_diag_add(f->d, "%s: rank directories name %u x %u ranks, more than %u",
			    f->iter_path, T, P, RS_MEGATRON_MAX_RANKS);
		return -EINVAL;
	}
	f->suffix = suffixed == 1;
	f->st->tp = T;
	f->st->pp = P;
	f->ranks = calloc((size_t)T * P, sizeof(rank_dir));
	if (!f->ranks)
		return -ENOMEM;
	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t t, p = 0;
		const char *s;
		rank_dir *rd;

		if (!is_rank_dir(e, f->iter_entry))
			continue;
		s = parse_rank(e->name + 8, &t);
		if (*s == '_')
			parse_rank(s + 1, &p);
		rd = &f->ranks[(size_t)p * T + t];
		if (rd->dir) {
			rs_diag_add(f->d, "%s: %s and %s are the same rank", f->iter_path,
				    ck->entries[rd->dir - 1].name, e->name);
			return -EINVAL;
		}
		rd->dir = (long)i + 1;
	}
	for (uint32_t p = 0; p < P; p++)
		for (uint32_t t = 0; t < T; t++) {
			rank_dir *rd = &f->ranks[(size_t)p * T + t];
			char name[40];
			long file;

			if (f->suffix)
				snprintf(name, sizeof(name), "mp_rank_%02u_%03u", t, p);
			else
				snprintf(name, sizeof(name), "mp_rank_%02u", t);
			if (!rd->dir) {
				rs_diag_add(f->d, "%s/%s/%s: missing (the rank directories make tp=%u, pp=%u)",
					    f->iter_path, name, RANK_FILE, T, P);
				err = -EINVAL;
				continue;
			}
			rd->dir--;
			file = child(ck, rd->dir, RANK_FILE, false);
			if (file < 0) {
				rs_diag_add(f->d, "%s/%s/%s: missing", f->iter_path,
					    ck->entries[rd->dir].name, RANK_FILE);
				err = -EINVAL;
				continue;
			}
			rd->src = ck->entries[file].source;
			rd->found = true;
		}
	return err;
}

/* Rank directories (and, in the root form, every iteration directory) are
 * what views rewrite: hidden from all of them.  The megatron view also
 * carries the rest of the iteration it writes. */
static int mark_entries(finder *f)
{
	rs_checkpoint *ck = f->ck;
	bool *rank_tree = calloc(ck->nentries + 1, sizeof(bool));
	bool *iter_tree = calloc(ck->nentries + 1, sizeof(bool));
	int err = -ENOMEM;

	f->st->carry = calloc(ck->nentries + 1, sizeof(bool));
	if (!rank_tree || !iter_tree || !f->st->carry)
		goto out;
	for (size_t i = 0; i < ck->nentries; i++) {
		rs_entry *e = &ck->entries[i];
		bool top_iter = e->parent < 0 && e->is_dir && f->iter_entry >= 0 &&
				(strncmp(e->name, "iter_", 5) == 0 ||
				 strcmp(e->name, "release") == 0);

		/* parents come before their children */
		rank_tree[i] = is_rank_dir(e, f->iter_entry) ||
			       (e->parent >= 0 && rank_tree[e->parent]);
		iter_tree[i] = top_iter || (e->parent >= 0 && iter_tree[e->parent]);
		e->hidden = rank_tree[i] || iter_tree[i];
		f->st->carry[i] = !rank_tree[i] &&
			(!iter_tree[i] || (long)i == f->iter_entry ||
			 (e->parent >= 0 && f->st->carry[e->parent] &&
			  iter_tree[e->parent]));
	}
	err = 0;
out:
	free(rank_tree);
	free(iter_tree);
	return err;
}

static const rs_pvalue *arg(const rs_meg_state *st, const char *name)
{
	return rs_pv_get(rs_pv_state(st->args), name);
}

/* A set value: not absent, None, False or 0. */
static bool arg_set(const rs_meg_state *st, const char *name)
{
	const rs_pvalue *v = arg(st, name);
	int64_t i;
	bool b;

	if (!v || rs_pv_kind(v) == RS_PV_NONE)
		return false;
	if (rs_pv_bool(v, &b) == 0)
		return b;
	if (rs_pv_int(v, &i) == 0)
		return i != 0;
	return true;
}

/* An int arg: 0 absent (or None), 1 read, -1 not a non-negative int. */
static int arg_u64(const rs_meg_state *st, const char *name, uint64_t *out)
{
	const rs_pvalue *v = arg(st, name);
	int64_t i;

	if (!v || rs_pv_kind(v) == RS_PV_NONE)
		return 0;
	if (rs_pv_int(v, &i) != 0 || i < 0)
		return -1;
	*out = (uint64_t)i;
	return 1;
}

/* The args of the first rank file decide the layout the model walk
 * checks; what this reader cannot map is refused here. */
static int read_args(finder *f, rs_meg_reader *r, const char *path)
{
	static const char *const uneven[] = {
		"standalone_embedding_stage", "decoder_first_pipeline_num_layers",
		"decoder_last_pipeline_num_layers",
		"num_layers_in_first_pipeline_stage",
		"num_layers_in_last_pipeline_stage",
		"account_for_embedding_in_pipeline_split",
		"account_for_loss_in_pipeline_split",
		"pipeline_model_parallel_layout",
	};
	rs_meg_state *st = f->st;
	uint64_t v, layers = 0;
	const char *name = NULL;
	int got;

	st->args = rs_pv_get(st->top, "args");
	if (!(rs_pv_call_is(st->args, "argparse.Namespace")) ||
	    rs_pv_kind(rs_pv_state(st->args)) != RS_PV_DICT) {
		rs_diag_add(f->d, "%s: 'args' is not an argparse.Namespace", path);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(uneven) / sizeof(uneven[0]); i++)
		if (arg_set(st, uneven[i])) {
			rs_diag_add(f->d, "%s: args.%s is set: uneven pipeline stages are not supported",
				    path, uneven[i]);
			return -EINVAL;
		}
	if (arg_u64(st, "expert_model_parallel_size", &v) > 0 && v > 1) {
		rs_diag_add(f->d, "%s: args.expert_model_parallel_size is %llu: expert parallelism is not supported",
			    path, (unsigned long long)v);
		return -EINVAL;
	}
	if (arg_u64(st, "num_layers", &layers) <= 0 || !layers ||
	    layers > RS_MEGATRON_MAX_LAYERS) {
		rs_diag_add(f->d, "%s: args.num_layers is not a layer count from 1 to %u",
			    path, RS_MEGATRON_MAX_LAYERS);
		return -EINVAL;
	}
	st->layers = layers;
	got = arg_u64(st, "tensor_model_parallel_size", &v);
	if (!got) {
		got = arg_u64(st, "model_parallel_size", &v);
		name = "model_parallel_size";
	}
	if (got && (got < 0 || v != st->tp)) {
		rs_diag_add(f->d, "%s: args.%s is not %u, the number of TP rank directories",
			    path, name ? name : "tensor_model_parallel_size", st->tp);
		return -EINVAL;
	}
	got = arg_u64(st, "pipeline_model_parallel_size", &v);
	if (got && (got < 0 || v != st->pp)) {
		rs_diag_add(f->d, "%s: args.pipeline_model_parallel_size is not %u, the number of pipeline rank directories",
			    path, st->pp);
		return -EINVAL;
	}
	st->vpp = 1;
	got = arg_u64(st, "virtual_pipeline_model_parallel_size", &v);
	if (got < 0 || (got && (v == 0 || v > RS_MEGATRON_MAX_LAYERS))) {
		rs_diag_add(f->d, "%s: args.virtual_pipeline_model_parallel_size is not a positive count",
			    path);
		return -EINVAL;
	}
	if (got)
		st->vpp = (uint32_t)v;
	if (layers % ((uint64_t)st->pp * st->vpp)) {
		rs_diag_add(f->d, "%s: args.num_layers %llu does not divide into %u pipeline stages x %u virtual stages",
			    path, (unsigned long long)layers, st->pp, st->vpp);
		return -EINVAL;
	}
	r->lpc = layers / ((uint64_t)st->pp * st->vpp);
	r->gated = arg_set(st, "swiglu");
	st->tied = !arg_set(st, "untie_embeddings_and_output_weights");
	return 0;
}

/* Two scalar values alike (absent counts as a value). */
static bool same(const rs_pvalue *a, const rs_pvalue *b)
{
	double x, y;
	int64_t i, j;
	bool p, q;

	if (rs_pv_kind(a) != rs_pv_kind(b))
		return false;
	if (!a)
		return true;   /* absent from both */
	switch (rs_pv_kind(a)) {
	case RS_PV_NONE:
		return true;
	case RS_PV_INT:
		return !rs_pv_int(a, &i) && !rs_pv_int(b, &j) && i == j;
	case RS_PV_FLOAT:
		return !rs_pv_float(a, &x) && !rs_pv_float(b, &y) && x == y;
	case RS_PV_BOOL:
		return !rs_pv_bool(a, &p) && !rs_pv_bool(b, &q) && p == q;
	case RS_PV_STR:
		return rs_pv_str_is(b, rs_pv_str(a, NULL));
	default:
		return false;
	}
}

/* Every rank file must be of the same save as the first. */
static int check_same(finder *f, const rs_pvalue *top, const char *path)
{
	static const char *const fields[] = {
		"num_layers", "hidden_size", "tensor_model_parallel_size",
		"pipeline_model_parallel_size",
		"virtual_pipeline_model_parallel_size", "padded_vocab_size",
		"swiglu", "untie_embeddings_and_output_weights",
	};
	const rs_pvalue *args = rs_pv_state(rs_pv_get(top, "args"));

	if (!same(rs_pv_get(top, "iteration"), rs_pv_get(f->st->top, "iteration")) ||
	    !same(rs_pv_get(top, "checkpoint_version"),
		  rs_pv_get(f->st->top, "checkpoint_version"))) {
		rs_diag_add(f->d, "%s: iteration or checkpoint_version differs from TP rank 0, stage 0's",
			    path);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if (!same(rs_pv_get(args, fields[i]), arg(f->st, fields[i]))) {
			rs_diag_add(f->d, "%s: args.%s differs from TP rank 0, stage 0's",
				    path, fields[i]);
			return -EINVAL;
		}
	return 0;
}

/* The version decides how query_key_value rows are ordered. */
static int check_version(finder *f, const char *path)
{
	double v = 0;
	const rs_pvalue *cv = rs_pv_get(f->st->top, "checkpoint_version");

	if ((cv && rs_pv_float(cv, &v) != 0) || v < 2.0) {
		rs_diag_add(f->d, "%s: checkpoint_version %g: before 2.0 query_key_value rows are ordered per rank; not supported",
			    path, v);
		return -EINVAL;
	}
	return 0;
}

/* Parses one rank file's zip and data.pkl. */
static int open_rank(finder *f, uint32_t src, const char *path, rs_zip *z,
		     rs_pickle **pk)
{
	char msg[RS_ZIP_MSG_SIZE], perr[300];
	const rs_zip_entry *pkl;
	rs_pickle_limits lim;
	uint8_t *buf = NULL;
	int fd, err;

	err = rs_sources_fd(f->ck->sources, src, &fd);
	if (err) {
		rs_diag_add(f->d, "%s: cannot open: %s", path, strerror(-err));
		return -EINVAL;
	}
	err = rs_zip_open(z, fd, 0, rs_sources_id(f->ck->sources, src)->size,
			  msg, sizeof(msg));
	if (err) {
		rs_diag_add(f->d, "%s: %s", path, msg);
		return err == -ENOMEM ? err : -EINVAL;
	}
	pkl = rs_zip_find(z, "data.pkl");
	if (!pkl || pkl->size > RS_MEGATRON_PKL_MAX ||
	    !(buf = malloc(pkl->size ? pkl->size : 1)) ||
	    rs_pread_full(fd, buf, pkl->size, pkl->offset)) {
		rs_diag_add(f->d, "%s: no readable data.pkl of at most %u bytes",
			    path, RS_MEGATRON_PKL_MAX);
		free(buf);
		return -EINVAL;
	}
	rs_pickle_limits_default(&lim);
	lim.allow = rs_megatron_allow;
	err = rs_pickle_parse(buf, pkl->size, &lim, pk, perr, sizeof(perr));
	free(buf);
	if (err) {
		rs_diag_add(f->d, "%s: data.pkl: %s", path, perr);
		return err == -ENOMEM ? err : -EINVAL;
	}
	if (rs_pv_kind(rs_pickle_root(*pk)) != RS_PV_DICT) {
		rs_diag_add(f->d, "%s: data.pkl is not a dict", path);
		return -EINVAL;
	}
	return 0;
}

static int read_rank(finder *f, rs_meg_reader *r, uint32_t p, uint32_t t)
{
	uint32_t src = f->ranks[(size_t)p * f->st->tp + t].src;
	char path[4400];
	rs_pickle *pk = NULL;
	rs_zip z = { 0 };
	const rs_pvalue *top;
	int err;

	snprintf(path, sizeof(path), "%s/%s", f->ck->root_path,
		 rs_sources_path(f->ck->sources, src));
	err = open_rank(f, src, path, &z, &pk);
	if (err)
		goto out;
	top = rs_pickle_root(pk);
	if (p == 0 && t == 0) {
		f->st->pk = pk;
		f->st->top = top;
		pk = NULL;
		err = read_args(f, r, path);
		if (!err)
			err = check_version(f, path);
		if (!err) {
			r->group = calloc(2 * (size_t)f->st->pp * f->st->vpp,
					  sizeof(size_t));
			err = r->group ? 0 : -ENOMEM;
		}
	} else {
		err = check_same(f, top, path);
	}
	if (!err)
		err = rs_meg_add_rank(r, &z, top, p, t, src, path);
	if (!err && p == 0 && t == 0)
		for (size_t i = 0; i < f->ck->catalog.count; i++)
			if (strcmp(f->ck->catalog.tensors[i].name,
				   "language_model.embedding.word_embeddings.weight") == 0)
				f->st->word_emb = (long)i;
out:
	rs_pickle_free(pk);
	rs_zip_free(&z);
	return err;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Each tensor complete, regular and named once. */
static int check_catalog(finder *f)
{
	rs_catalog *c = &f->ck->catalog;
	const char **names = malloc((c->count + 1) * sizeof(*names));
	int err = 0;

	if (!names)
		return -ENOMEM;
	for (size_t i = 0; i < c->count; i++) {
		rs_tensor *t = &c->tensors[i];

		names[i] = t->name;
		if (!err && !rs_tensor_make_regular(t)) {
			rs_diag_add(f->d, "%s: %s: the ranks' shards do not tile the tensor",
				    t->origin, t->name);
			err = -EINVAL;
		}
	}
	qsort(names, c->count, sizeof(*names), cmp_name);
	for (size_t i = 1; i < c->count && !err; i++)
		if (strcmp(names[i - 1], names[i]) == 0) {
			rs_diag_add(f->d, "%s: two model entries are named %s",
				    f->iter_path, names[i]);
			err = -EINVAL;
		}
	free(names);
	return err;
}

int rs_megatron_read(rs_checkpoint *ck, rs_diag *d)
{
	rs_meg_state *st = calloc(1, sizeof(*st));
	finder f = { .ck = ck, .st = st, .d = d, .iter_entry = -1 };
	rs_meg_reader r = { .ck = ck, .st = st, .d = d };
	rs_rules *rules = NULL;
	int err;

	if (!st)
		return -ENOMEM;
	st->word_emb = -1;
	ck->extra = st;
	ck->extra_free = rs_meg_state_free;
	err = rs_zarr_read(ck, d);
	if (err)
		return err;
	if (ck->narrays) {
		rs_diag_add(d, "%s: a per-rank Megatron checkpoint with zarr arrays in it",
			    ck->root_path);
		return -EINVAL;
	}
	/* Rank directories at the top: SOURCE is the iteration itself. */
	bool top_ranks = false;

	for (size_t i = 0; i < ck->nentries; i++)
		top_ranks |= is_rank_dir(&ck->entries[i], -1);
	if (!top_ranks) {
		err = find_iteration(&f);
		if (err)
			return err;
	}
	snprintf(f.iter_path, sizeof(f.iter_path), "%s%s%s", ck->root_path,
		 st->iter_dir ? "/" : "", st->iter_dir ? st->iter_dir : "");
	err = find_ranks(&f);
	if (!err)
		err = mark_entries(&f);
	if (!err)
		err = rs_rules_new(&rules);
	r.rules = rules;
	for (uint32_t p = 0; p < st->pp && !err; p++)
		for (uint32_t t = 0; t < st->tp && !err; t++)
			err = read_rank(&f, &r, p, t);
	if (!err)
		err = check_catalog(&f);
	rs_rules_free(rules);
	free(r.group);
	free(r.filled);
	free(f.ranks);
	return err;
}
