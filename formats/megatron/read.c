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
	}
	free(st->tensors);
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
	rank_dir *ranks;        /* [p * T + t] */
	bool suffix;            /* names carry the _PPP suffix */
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

/* Rank directories: their (tp, pp) ranks, all of a full grid. */
static int find_ranks(finder *f)
{
	rs_checkpoint *ck = f->ck;
	uint32_t T = 0, P = 0;
	int suffixed = -1, err = 0;
	long *file_of;

	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t t, p = 0;
		const char *s;

		if (!is_rank_dir(e, -1))
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
	file_of = malloc((ck->nentries + 1) * sizeof(*file_of));
	if (!f->ranks || !file_of) {
		free(file_of);
		return -ENOMEM;
	}
	/* Each rank directory's model_optim_rng.pt, in one pass. */
	for (size_t i = 0; i < ck->nentries; i++)
		file_of[i] = -1;
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent >= 0 && !ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, RANK_FILE) == 0)
			file_of[ck->entries[i].parent] = (long)i;
	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t t, p = 0;
		const char *s;
		rank_dir *rd;

		if (!is_rank_dir(e, -1))
			continue;
		s = parse_rank(e->name + 8, &t);
		if (*s == '_')
			parse_rank(s + 1, &p);
		rd = &f->ranks[(size_t)p * T + t];
		if (rd->dir) {
			rs_diag_add(f->d, "%s: %s and %s are the same rank", f->iter_path,
				    ck->entries[rd->dir - 1].name, e->name);
			free(file_of);
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
			file = file_of[rd->dir];
			if (file < 0) {
				rs_diag_add(f->d, "%s/%s/%s: missing", f->iter_path,
					    ck->entries[rd->dir].name, RANK_FILE);
				err = -EINVAL;
				continue;
			}
			rd->src = ck->entries[file].source;
		}
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
	err = rs_checkpoint_charge(f->ck, pkl->size, path, f->d);
	if (err) {
		free(buf);
		return err;
	}
	rs_pickle_limits_default(&lim);
	lim.allow = rs_megatron_allow;
	lim.torch_persids = true;
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

/* The word embeddings under every name this reader takes: Megatron-LM's
 * legacy model, and megatron-core's that Megatron-LM's --ckpt-format
 * torch writes.  The view re-pads it and rewrites args.padded_vocab_size
 * from its rows. */
static const char *const word_embedding_names[] = {
	"language_model.embedding.word_embeddings.weight",
	"embedding.word_embeddings.weight",
	NULL,
};

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
	if (!err && p == 0 && t == 0)
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
