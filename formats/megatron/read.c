/* Legacy Megatron reader: SOURCE -> rank files -> catalog (megatron.h).
 *
 * This file finds the iteration and its rank directories, parses each
 * rank's data.pkl, checks the args and the dict around the model against
 * the directories and against each other, and hands each file's models to
 * model.c.  Args decide what the model walk cannot see: the
 * virtual stages, the layers per chunk, gating and tied embeddings.
 */
#include "formats/megatron/megatron.h"
#include "formats/megatron/megatron_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planner/names.h"

#define RANK_FILE "model_optim_rng.pt"
/* data.pkl holds the structure of model, optimizer and rng state (a few
 * hundred bytes a tensor); anything near this is not a checkpoint. */
#define RS_MEGATRON_PKL_MAX (256u << 20)
/* Far beyond real layouts; bounds the rank table. */
#define RS_MEGATRON_MAX_RANKS (1u << 16)

void rs_meg_state_free(void *state)
{
	rs_meg_state *st = state;

	if (!st)
		return;
	for (size_t i = 0; i < st->ntensors; i++) {
		for (int k = 0; k < st->tensors[i].nkeys; k++)
			free(st->tensors[i].keys[k]);
		free(st->tensors[i].keys);
		free(st->tensors[i].have);
	}
	free(st->tensors);
	free(st->moe_layer);
	rs_pickle_free(st->pk);
	free(st->first_path);
	free(st);
}

/* One rank directory of the iteration. */
typedef struct {
	long dir;               /* its entry (+1 while being filled in) */
	uint32_t src;           /* model_optim_rng.pt */
} rank_dir;

typedef struct {
	rs_checkpoint *ck;
	rs_meg_state *st;
	rs_diag *d;
	const char *iter_path;  /* the iteration directory, for messages */
	rank_dir *ranks;        /* [(p * E + e) * T + t] */
	bool pp_field, ep_field; /* names carry _PPP, _EEE */
} finder;

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

static bool is_rank_dir(const rs_entry *e, long parent)
{
	return e->is_dir && e->parent == parent &&
	       strncmp(e->name, "mp_rank_", 8) == 0;
}

/* The numbers of a rank directory's name: 1 to 3 of them (Megatron-LM's
 * get_checkpoint_name: mp_rank_TT, then _PPP with pipeline parallelism,
 * then _EEE with expert parallelism); 0 when it is not such a name. */
static int name_numbers(const char *name, uint32_t n[3])
{
	const char *s = parse_rank(name + 8, &n[0]);
	int k = 1;

	while (s && *s == '_' && k < 3)
		s = parse_rank(s + 1, &n[k++]);
	return s && !*s ? k : 0;
}

static void rank_name(const finder *f, uint32_t t, uint32_t p, uint32_t e,
		      char *out, size_t size)
{
	int n = snprintf(out, size, "mp_rank_%02u", t);

	if (f->pp_field && n > 0 && (size_t)n < size)
		n += snprintf(out + n, size - (size_t)n, "_%03u", p);
	if (f->ep_field && n > 0 && (size_t)n < size)
		snprintf(out + n, size - (size_t)n, "_%03u", e);
}

static int open_rank(finder *f, uint32_t src, const char *path, rs_zip *z,
		     rs_pickle **pk);

/* mp_rank_TT_NNN names a pipeline or an expert rank: the args of
 * mp_rank_00_000 say which (expert_model_parallel_size > 1: EP, as
 * Megatron-LM's find_checkpoint_rank_0 tries both). */
static int two_numbers_mean_ep(finder *f, long dir, const long *file_of,
			       bool *ep)
{
	rs_checkpoint *ck = f->ck;
	char path[4400];
	rs_pickle *pk = NULL;
	rs_zip z = { 0 };
	const rs_pvalue *v;
	int64_t i = 1;
	int err;

	if (dir < 0 || file_of[dir] < 0) {
		rs_diag_add(f->d, "%s/mp_rank_00_000/%s: missing", f->iter_path,
			    RANK_FILE);
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "%s/%s", ck->root_path,
		 rs_sources_path(ck->sources, ck->entries[file_of[dir]].source));
	err = open_rank(f, ck->entries[file_of[dir]].source, path, &z, &pk);
	if (!err) {
		v = rs_pv_get(rs_pv_state(rs_pv_get(rs_pickle_root(pk), "args")),
			      "expert_model_parallel_size");
		if (v && rs_pv_kind(v) != RS_PV_NONE && rs_pv_int(v, &i)) {
			rs_diag_add(f->d, "%s: args.expert_model_parallel_size is not an integer",
				    path);
			err = -EINVAL;
		}
		*ep = i > 1;
	}
	rs_pickle_free(pk);
	rs_zip_free(&z);
	return err;
}

/* Rank directories: their (tp, pp, ep) ranks, all of a full grid. */
static int find_ranks(finder *f)
{
	rs_checkpoint *ck = f->ck;
	uint32_t max[3] = { 0, 0, 0 }, T, P, E;
	int fields = 0, err = 0;
	long *file_of, first = -1;

	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t n[3] = { 0, 0, 0 };
		int k;

		if (!is_rank_dir(e, -1))
			continue;
		k = name_numbers(e->name, n);
		if (!k) {
			rs_diag_add(f->d, "%s/%s: not a rank directory name (mp_rank_TT[_PPP][_EEE])",
				    f->iter_path, e->name);
			return -EINVAL;
		}
		if (fields && fields != k) {
			rs_diag_add(f->d, "%s: rank directory names carry different numbers of ranks (%s)",
				    f->iter_path, e->name);
			return -EINVAL;
		}
		fields = k;
		for (int j = 0; j < k; j++)
			max[j] = n[j] + 1 > max[j] ? n[j] + 1 : max[j];
		if (!n[0] && !n[1] && !n[2])
			first = (long)i;
	}
	if (!fields) {
		rs_diag_add(f->d, "%s: holds no mp_rank_* directories (a distributed checkpoint's iteration directory is mounted itself)",
			    f->iter_path);
		return -EINVAL;
	}
	file_of = malloc((ck->nentries + 1) * sizeof(*file_of));
	if (!file_of)
		return -ENOMEM;
	/* Each rank directory's model_optim_rng.pt, in one pass. */
	for (size_t i = 0; i < ck->nentries; i++)
		file_of[i] = -1;
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent >= 0 && !ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, RANK_FILE) == 0)
			file_of[ck->entries[i].parent] = (long)i;
	f->pp_field = fields == 3;
	f->ep_field = fields == 3;
	if (fields == 2) {
		bool ep = false;

		err = two_numbers_mean_ep(f, first, file_of, &ep);
		if (err)
			goto out;
		f->ep_field = ep;
		f->pp_field = !ep;
	}
	T = max[0];
	P = f->pp_field ? max[1] : 1;
	E = f->ep_field ? max[fields - 1] : 1;
	if ((uint64_t)T * P * E > RS_MEGATRON_MAX_RANKS) {
		rs_diag_add(f->d, "%s: rank directories name %u x %u x %u ranks, more than %u",
			    f->iter_path, T, P, E, RS_MEGATRON_MAX_RANKS);
		err = -EINVAL;
		goto out;
	}
	f->st->tp = T;
	f->st->pp = P;
	f->st->ep = E;
	f->ranks = calloc((size_t)T * P * E, sizeof(rank_dir));
	if (!f->ranks) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t n[3] = { 0, 0, 0 }, p, x;
		rank_dir *rd;

		if (!is_rank_dir(e, -1))
			continue;
		name_numbers(e->name, n);
		p = f->pp_field ? n[1] : 0;
		x = f->ep_field ? n[fields - 1] : 0;
		rd = &f->ranks[((size_t)p * E + x) * T + n[0]];
		if (rd->dir) {
			rs_diag_add(f->d, "%s: %s and %s are the same rank", f->iter_path,
				    ck->entries[rd->dir - 1].name, e->name);
			err = -EINVAL;
			goto out;
		}
		rd->dir = (long)i + 1;
	}
	for (uint32_t p = 0; p < P; p++)
		for (uint32_t x = 0; x < E; x++)
			for (uint32_t t = 0; t < T; t++) {
				rank_dir *rd = &f->ranks[((size_t)p * E + x) * T + t];
				char name[48];
				long file;

				rank_name(f, t, p, x, name, sizeof(name));
				if (!rd->dir) {
					char ep[24] = "";

					if (f->ep_field)
						snprintf(ep, sizeof(ep), ", ep=%u", E);
					rs_diag_add(f->d, "%s/%s/%s: missing (the rank directories make tp=%u, pp=%u%s)",
						    f->iter_path, name, RANK_FILE, T, P, ep);
					err = -EINVAL;
					continue;
				}
				rd->dir--;
				file = file_of[rd->dir];
				if (file < 0) {
					rs_diag_add(f->d, "%s/%s/%s: missing", f->iter_path,
						    ck->entries[rd->dir].name, RANK_FILE);
					err = -EINVAL;
					continue;
				}
				rd->src = ck->entries[file].source;
			}
out:
	free(file_of);
	return err;
}

/* Rank directories are what views rewrite: hidden from all of them (the
 * megatron view carries the rest of the iteration). */
static void mark_entries(finder *f)
{
	rs_checkpoint *ck = f->ck;

	for (size_t i = 0; i < ck->nentries; i++) {
		rs_entry *e = &ck->entries[i];

		/* parents come before their children */
		e->hidden = is_rank_dir(e, -1) ||
			    (e->parent >= 0 && ck->entries[e->parent].hidden);
	}
}

/* Parses one rank file's zip and data.pkl. */
static int open_rank(finder *f, uint32_t src, const char *path, rs_zip *z,
		     rs_pickle **pk)
{
	return rs_checkpoint_open_torch_dict(f->ck, src, path,
					     rs_megatron_allow,
					     RS_MEGATRON_PKL_MAX, z, pk, f->d);
}

/* The word embeddings under every name this reader takes: Megatron-LM's
 * legacy model, and megatron-core's that Megatron-LM's --ckpt-format
 * torch writes.  The view re-pads it and rewrites args.padded_vocab_size
 * from its rows. */
static const char *const word_embedding_names[] = {
	"language_model.embedding.word_embeddings.weight",
	"embedding.word_embeddings.weight",
	NULL,
};

static int read_rank(finder *f, rs_meg_reader *r, uint32_t p, uint32_t e,
		     uint32_t t)
{
	uint32_t src = f->ranks[((size_t)p * f->st->ep + e) * f->st->tp + t].src;
	bool first = p == 0 && e == 0 && t == 0;
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
	r->ep_rank = e;
	if (first) {
		f->st->pk = pk;
		f->st->top = top;
		pk = NULL;
		f->st->first_path = strdup(path);
		if (!f->st->first_path) {
			err = -ENOMEM;
			goto out;
		}
		err = rs_meg_read_args(r, path);
		if (!err) {
			r->group = calloc(2 * (size_t)f->st->pp * f->st->vpp,
					  sizeof(size_t));
			err = r->group ? 0 : -ENOMEM;
		}
	} else {
		err = rs_meg_check_same(r, top, path);
	}
	if (!err)
		err = rs_meg_add_rank(r, &z, top, p, t, src, path);
	if (!err && first)
		for (size_t i = 0; i < f->ck->catalog.count; i++)
			for (size_t k = 0; word_embedding_names[k]; k++)
				if (strcmp(f->ck->catalog.tensors[i].name,
					   word_embedding_names[k]) == 0)
					f->st->word_emb = (long)i;
out:
	rs_pickle_free(pk);
	rs_zip_free(&z);
	return err;
}

/* Each tensor complete, regular and named once. */
static int check_catalog(finder *f)
{
	rs_catalog *c = &f->ck->catalog;
	size_t dup;
	int err = 0;

	for (size_t i = 0; i < c->count && !err; i++) {
		rs_tensor *t = &c->tensors[i];

		if (!rs_tensor_make_regular(t)) {
			rs_diag_add(f->d, "%s: %s: the ranks' shards do not tile the tensor",
				    t->origin, t->name);
			err = -EINVAL;
		}
	}
	if (!err)
		err = rs_names_first_dup(c->tensors, c->count, sizeof(rs_tensor),
					 offsetof(rs_tensor, name), &dup);
	if (!err && dup != SIZE_MAX) {
		rs_diag_add(f->d, "%s: two model entries are named %s",
			    c->tensors[dup].origin, c->tensors[dup].name);
		err = -EINVAL;
	}
	return err;
}

int rs_megatron_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	const rs_rules *user_rules = o->rules;
	rs_meg_state *st = calloc(1, sizeof(*st));
	finder f = { .ck = ck, .st = st, .d = d, .iter_path = ck->dir_path };
	rs_meg_reader r = { .ck = ck, .st = st, .d = d };
	rs_rules *rules = NULL;
	int err;

	if (!st)
		return -ENOMEM;
	st->word_emb = -1;
	ck->extra = st;
	ck->extra_free = rs_meg_state_free;
	err = rs_checkpoint_walk(ck, NULL, d);
	if (err)
		return err;
	err = find_ranks(&f);
	if (!err)
		mark_entries(&f);
	if (!err && !user_rules)
		err = rs_rules_new(&rules);
	r.rules = user_rules ? user_rules : rules;
	for (uint32_t p = 0; p < st->pp && !err; p++)
		for (uint32_t e = 0; e < st->ep && !err; e++)
			for (uint32_t t = 0; t < st->tp && !err; t++)
				err = read_rank(&f, &r, p, e, t);
	if (!err)
		err = rs_meg_check_moe_layers(&r);
	if (!err)
		err = check_catalog(&f);
	for (size_t i = 0; i < st->ntensors; i++) {
		free(st->tensors[i].have);   /* the reader's alone */
		st->tensors[i].have = NULL;
	}
	rs_rules_free(rules);
	free(r.group);
	free(r.filled);
	free(f.ranks);
	return err;
}

/* Rank directories mark an iteration (a checkpoint root, with its
 * tracker file, is found by formats/open.c). */
static rs_detect detect(const char *name, mode_t mode)
{
	return S_ISDIR(mode) && strncmp(name, "mp_rank_", 8) == 0
		       ? RS_DETECT_FILES : RS_DETECT_NONE;
}

const rs_format_def rs_megatron_format = {
	.name = "megatron",
	.detect = detect,
	.looks_like = "mp_rank_* directories",
	.read = rs_megatron_read,
	.build_view = rs_megatron_build_view,
	.keeps_root = true,
};
