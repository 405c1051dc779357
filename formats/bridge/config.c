/* config: a family's config facts (formats/model.h, rs_fact_def) -
 * toward HF, each config.json field from the checkpoint's records, the
 * stored shapes and the user's hf_config, all of which must agree; from
 * HF, SOURCE's config.json checked against the family and the shapes. */
#include "formats/bridge/bridge_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "planner/user_file.h"

#define CONFIG_MAX (1u << 20)
#define LINES_MAX (64u << 10)

/* ---- values ---------------------------------------------------------- */

/* v as a value of type t (a copy), or NULL when it is not one: an int
 * must be a whole number in [0, 2^53], a real finite. */
static cJSON *as_type(const cJSON *v, rs_fact_type t)
{
	switch (t) {
	case RS_FACT_INT:
		if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
		    v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
		    v->valuedouble != floor(v->valuedouble))
			return NULL;
		return cJSON_CreateNumber(v->valuedouble);
	case RS_FACT_REAL:
		return cJSON_IsNumber(v) && isfinite(v->valuedouble)
			       ? cJSON_CreateNumber(v->valuedouble) : NULL;
	case RS_FACT_BOOL:
		return cJSON_IsBool(v) ? cJSON_CreateBool(cJSON_IsTrue(v)) : NULL;
	case RS_FACT_STR:
		return cJSON_IsString(v) ? cJSON_CreateString(v->valuestring)
					 : NULL;
	case RS_FACT_OBJECT:
		return cJSON_IsObject(v) ? cJSON_Duplicate(v, true) : NULL;
	case RS_FACT_LIST:
		return cJSON_IsArray(v) ? cJSON_Duplicate(v, true) : NULL;
	}
	return NULL;
}

static const char *type_name(rs_fact_type t)
{
	static const char *const n[] = { "an integer", "a number", "true or false",
					  "a string", "an object", "a list" };

	return (unsigned)t < 6 ? n[t] : "?";
}

static void text_of(const cJSON *v, char *out, size_t size)
{
	char *s = v ? cJSON_PrintUnformatted(v) : NULL;

	snprintf(out, size, "%.120s%s", s ? s : "unknown",
		 s && strlen(s) > 120 ? "..." : "");
	free(s);
}

/* Whether two values of one fact agree (numbers by value). */
static bool agree(const cJSON *a, const cJSON *b)
{
	if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
		return a->valuedouble == b->valuedouble;
	return cJSON_Compare(a, b, true);
}

/* A dotted path ("rope_scaling.rope_type") in a JSON object. */
static const cJSON *lookup(const cJSON *o, const char *path)
{
	char part[128];

	while (o && *path) {
		size_t n = strcspn(path, ".");

		if (n >= sizeof(part))
			return NULL;
		memcpy(part, path, n);
		part[n] = 0;
		o = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, part)
				      : NULL;
		path += n + (path[n] == '.');
	}
	return o && !cJSON_IsNull(o) ? o : NULL;
}

/* ---- the reader's description (metaseq's cfg) ----------------------- */

static cJSON *model_value(const rs_model_config *m, const char *name)
{
	const struct {
		const char *name;
		double v;
		int kind;       /* 0 count (0: unknown), 1 bool, 2 text */
	} tab[] = {
		{ "layers", m->layers, 0 },
		{ "hidden", m->hidden, 0 },
		{ "ffn", m->ffn, 0 },
		{ "heads", m->heads, 0 },
		{ "vocab", (double)m->vocab, 0 },
		{ "max_positions", (double)m->max_positions, 0 },
		{ "pre_norm", m->pre_norm, 1 },
		{ "final_norm", m->final_norm, 1 },
		{ "remove_final_norm", m->pre_norm && !m->final_norm, 1 },
		{ "tied", m->tied, 1 },
		{ "embed_scaled", m->embed_scaled, 1 },
		{ "activation", 0, 2 },
	};

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		if (strcmp(tab[i].name, name))
			continue;
		if (tab[i].kind == 2)
			return m->activation[0] ? cJSON_CreateString(m->activation)
						: NULL;
		if (tab[i].kind == 1)
			return cJSON_CreateBool(tab[i].v != 0);
		return tab[i].v ? cJSON_CreateNumber(tab[i].v) : NULL;
	}
	return NULL;
}

/* ---- evaluation ------------------------------------------------------ */

typedef struct rs_config_eval {
	rs_checkpoint *ck;
	const rs_family *f;
	const rs_bridge_opts *o;
	const cJSON *user;              /* -o hf_config=, or NULL */
	const cJSON *cfg;               /* from HF: SOURCE's config.json */
	const char *cfg_path;
	bool to_hf;
	rs_diag *d;
	cJSON **val;                    /* each fact's value, or NULL */
	char (*src)[160];               /* and where it came from */
	char *lines;
	size_t at;
} eval;

static const rs_fact_def *fact_named(const eval *e, const char *hf)
{
	const rs_family_info *fi = e->f->info;

	for (size_t i = 0; hf && i < fi->nfacts; i++)
		if (strcmp(fi->facts[i].hf, hf) == 0)
			return &fi->facts[i];
	return NULL;
}

static const cJSON *value_of(const eval *e, const char *hf)
{
	const rs_fact_def *f = fact_named(e, hf);

	return f ? e->val[f - e->f->info->facts] : NULL;
}

/* Source `what` says v (owned, may be NULL) of fact f, whose value so far
 * is *have (from *src): keep the first, refuse a disagreement. */
static int offer(eval *e, const rs_fact_def *f, cJSON **have, char *src,
		 cJSON *v, const char *what)
{
	char a[140], b[140];

	if (!v)
		return 0;
	if (!*have) {
		*have = v;
		snprintf(src, 160, "%s", what);
		return 0;
	}
	if (agree(*have, v)) {
		cJSON_Delete(v);
		return 0;
	}
	text_of(*have, a, sizeof(a));
	text_of(v, b, sizeof(b));
	rs_diag_add(e->d, "%s: %s is %s by %s, but %s by %s (family %s, %s)",
		    e->ck->dir_path, f->hf, a, src, b, what, e->f->name,
		    e->f->info->path);
	cJSON_Delete(v);
	return -EINVAL;
}

/* A typed value from a record field, or a refusal naming it. */
static int typed(eval *e, const rs_fact_def *f, const cJSON *raw,
		 const char *where, cJSON **out)
{
	char t[140];

	*out = NULL;
	if (!raw)
		return 0;
	*out = as_type(raw, f->type);
	if (*out)
		return 0;
	text_of(raw, t, sizeof(t));
	rs_diag_add(e->d, "%s: %s is %s, not %s (family %s, fact %s)",
		    e->ck->dir_path, where, t, type_name(f->type), e->f->name,
		    f->hf);
	return -EINVAL;
}

/* The first stored tensor a pattern names (any layer, any expert: the
 * first layers of a model may lack what later ones have). */
static const rs_tensor *hf_tensor(const eval *e, const char *pat)
{
	const rs_catalog *c = &e->ck->catalog;

	for (size_t i = 0; i < c->count; i++) {
		char nums[2][24];
		int nn = 0;

		if (rs_map_match(pat, c->tensors[i].name, false, nums, &nn))
			return &c->tensors[i];
	}
	return NULL;
}

static uint64_t count_layers(const eval *e, const char *pat)
{
	char name[600], num[24];
	uint64_t l;

	for (l = 0; l < (1u << 16); l++) {
		size_t n = 0;
		const rs_catalog *c = &e->ck->catalog;
		bool found = false;

		snprintf(num, sizeof(num), "%llu", (unsigned long long)l);
		for (const char *p = pat; *p && n + 24 < sizeof(name); p++) {
			if (*p == '#') {
				memcpy(name + n, num, strlen(num));
				n += strlen(num);
			} else {
				name[n++] = *p;
			}
		}
		name[n] = 0;
		for (size_t i = 0; i < c->count && !found; i++)
			found = strcmp(c->tensors[i].name, name) == 0;
		if (!found)
			break;
	}
	return l;
}

/* The sources of fact f that the stored tensors give (HF names: the
 * target toward HF, SOURCE from HF). */
static int from_tensors(eval *e, const rs_fact_def *f, cJSON **have, char *src)
{
	char what[600];
	int err = 0;

	if (f->shape) {
		const rs_tensor *t = hf_tensor(e, f->shape);
		const cJSON *per = f->per ? value_of(e, f->per) : NULL;

		if (t && f->axis < t->ndim) {
			uint64_t v = t->shape[f->axis];

			if (f->per && !(cJSON_IsNumber(per) && per->valuedouble >= 1 &&
					v % (uint64_t)per->valuedouble == 0)) {
				rs_diag_add(e->d, "%s: %s: %s's %llu on axis %d do not divide by %s (%s)",
					    e->ck->dir_path, f->hf, t->name,
					    (unsigned long long)v, f->axis,
					    f->per, per ? "not a divisor" : "unknown");
				return -EINVAL;
			}
			if (per)
				v /= (uint64_t)per->valuedouble;
			snprintf(what, sizeof(what), "the shape of %s%s%s", t->name,
				 per ? " per " : "", per ? f->per : "");
			err = offer(e, f, have, src, cJSON_CreateNumber((double)v),
				    what);
		}
	}
	if (!err && f->count) {
		uint64_t n = count_layers(e, f->count);

		snprintf(what, sizeof(what), "the count of %s", f->count);
		if (n)
			err = offer(e, f, have, src, cJSON_CreateNumber((double)n),
				    what);
	}
	return err;
}

/* A fact no source gave: as another fact (same_as), the family's
 * constant, or its default, when it has one. */
static void fall_back(eval *e, const rs_fact_def *fd, size_t i)
{
	if (!e->val[i] && fd->same_as && value_of(e, fd->same_as)) {
		e->val[i] = cJSON_Duplicate(value_of(e, fd->same_as), true);
		snprintf(e->src[i], 160, "as %s", fd->same_as);
	}
	if (!e->val[i] && fd->value) {
		e->val[i] = cJSON_Duplicate(fd->value, true);
		snprintf(e->src[i], 160, "the family");
	}
	if (!e->val[i] && fd->dflt) {
		e->val[i] = cJSON_Duplicate(fd->dflt, true);
		snprintf(e->src[i], 160, "the family's default");
	}
}

/* The required facts still unknown - before the remap only those no
 * later source (shapes, counts, constants) can give - refused in one
 * line naming the option that gives them. */
static int report_missing(eval *e, bool before_remap)
{
	const rs_family_info *fi = e->f->info;
	char missing[300] = "";
	size_t n = 0;

	for (size_t i = 0; i < fi->nfacts; i++) {
		const rs_fact_def *fd = &fi->facts[i];

		if (e->val[i] || !fd->required ||
		    (before_remap && (fd->shape || fd->count || fd->value ||
				      fd->dflt)) || n++ >= 6)
			continue;
		snprintf(missing + strlen(missing),
			 sizeof(missing) - strlen(missing), "%s%s",
			 n > 1 ? ", " : "", fd->hf);
	}
	if (!n)
		return 0;
	rs_diag_add(e->d, "%s: the hf view of family %s needs %s, which this checkpoint does not record: give %s in -o hf_config=FILE (a JSON object of config.json fields)",
		    e->ck->dir_path, e->f->name, missing, n > 1 ? "them" : "it");
	return -EINVAL;
}

/* Toward HF, before the remap: the records' sources and the user's. */
static int to_hf_records(eval *e, const rs_fact_def *f, cJSON **have,
			 char *src)
{
	const cJSON *args = e->ck->facts.record;
	char what[300];
	cJSON *v = NULL;
	int err = 0;

	if (f->args && (!f->when_args || f->type == RS_FACT_OBJECT ||
			cJSON_IsTrue(lookup(args, f->when_args)))) {
		const cJSON *raw = lookup(args, f->args);
		cJSON *flipped = NULL;

		snprintf(what, sizeof(what), "%s.%s%s", e->ck->facts.from ? e->ck->facts.from : "args",
			 f->args, f->negate ? " (negated)" : "");
		if (f->negate && cJSON_IsBool(raw))
			raw = flipped = cJSON_CreateBool(!cJSON_IsTrue(raw));
		err = typed(e, f, raw, what, &v);
		cJSON_Delete(flipped);
		if (!err)
			err = offer(e, f, have, src, v, what);
	}
	/* the flag recorded false: the fact is what same_as is (no GQA: as
	 * many KV heads as heads) */
	if (!err && f->args && f->when_args && f->same_as &&
	    f->type != RS_FACT_OBJECT && lookup(args, f->when_args) &&
	    !cJSON_IsTrue(lookup(args, f->when_args)) && value_of(e, f->same_as)) {
		snprintf(what, sizeof(what), "%s.%s false: as %s",
			 e->ck->facts.from ? e->ck->facts.from : "args",
			 f->when_args, f->same_as);
		err = offer(e, f, have, src,
			    cJSON_Duplicate(value_of(e, f->same_as), true), what);
	}
	if (!err && f->model && e->ck->model.family_name) {
		snprintf(what, sizeof(what), "%s (%s)", e->ck->model.from ? e->ck->model.from : "the reader",
			 f->model);
		err = offer(e, f, have, src, model_value(&e->ck->model, f->model),
			    what);
	}
	if (!err && f->nabsent) {
		bool stored = false;

		for (size_t i = 0; i < f->nabsent; i++)
			stored = stored || rs_bridge_find(e->ck, e->f, f->absent[i]) != SIZE_MAX;
		snprintf(what, sizeof(what), "SOURCE %s %s", stored ? "storing" : "not storing",
			 f->absent[0]);
		err = offer(e, f, have, src, cJSON_CreateBool(!stored), what);
	}
	if (!err && e->o->vocab_size && strcmp(f->hf, "vocab_size") == 0)
		err = offer(e, f, have, src,
			    cJSON_CreateNumber((double)e->o->vocab_size),
			    "-o vocab_size");
	if (!err && e->user) {
		err = typed(e, f, lookup(e->user, f->hf), e->o->hf_config, &v);
		if (!err)
			err = offer(e, f, have, src, v, e->o->hf_config);
	}
	return err;
}

/* An object fact (rope_scaling) toward HF: its fields, when its args
 * flag is set (or the user gives it). */
static int to_hf_object(eval *e, const rs_fact_def *f, cJSON **have,
			char *src)
{
	const cJSON *flag = f->when_args ? lookup(e->ck->facts.record, f->when_args)
					 : NULL;
	cJSON *obj;
	int err = 0;

	if (e->user && lookup(e->user, f->hf)) {
		int err2 = typed(e, f, lookup(e->user, f->hf), e->o->hf_config,
				 have);

		if (err2)
			return err2;
		snprintf(src, 160, "%s", e->o->hf_config);
		if (flag && !cJSON_IsTrue(flag)) {
			rs_diag_add(e->d, "%s: %s gives %s, but args.%s is not set",
				    e->ck->dir_path, e->o->hf_config, f->hf,
				    f->when_args);
			return -EINVAL;
		}
		return *have ? 0 : -ENOMEM;
	}
	if (!cJSON_IsTrue(flag))
		return 0;
	obj = cJSON_CreateObject();
	if (!obj)
		return -ENOMEM;
	for (size_t i = 0; i < f->nfields && !err; i++) {
		const rs_fact_def *sub = &f->fields[i];
		cJSON *v = NULL;
		char s2[160] = "";

		err = to_hf_records(e, sub, &v, s2);
		if (!err && !v && sub->value)
			v = cJSON_Duplicate(sub->value, true);
		if (!err && !v && sub->dflt)
			v = cJSON_Duplicate(sub->dflt, true);
		if (!err && v)
			cJSON_AddItemToObject(obj, sub->hf, v);
	}
	if (err) {
		cJSON_Delete(obj);
		return err;
	}
	*have = obj;
	snprintf(src, 160, "args.%s", f->when_args);
	return 0;
}

static void line(eval *e, const char *fmt, const char *a, const char *b,
		 const char *c)
{
	if (!e->lines || e->at + 600 > LINES_MAX)
		return;
	e->at += (size_t)snprintf(e->lines + e->at, LINES_MAX - e->at, fmt, a, b, c);
}

/* The checks whose source is in this direction's records. */
static int run_checks(eval *e)
{
	const rs_family_info *fi = e->f->info;
	int err = 0;

	for (size_t i = 0; i < fi->nchecks; i++) {
		const rs_check_def *k = &fi->checks[i];
		cJSON *owned = NULL;
		const cJSON *v = NULL, *it;
		char t[140], where[300];
		bool ok = false;

		if (k->args && e->to_hf) {
			v = lookup(e->ck->facts.record, k->args);
			snprintf(where, sizeof(where), "%s.%s",
				 e->ck->facts.from ? e->ck->facts.from : "args", k->args);
		} else if (k->model && e->to_hf && e->ck->model.family_name) {
			v = owned = model_value(&e->ck->model, k->model);
			snprintf(where, sizeof(where), "%s (%s)",
				 e->ck->model.from ? e->ck->model.from : "the reader", k->model);
		} else if (k->hf && !e->to_hf) {
			v = lookup(e->cfg, k->hf);
			snprintf(where, sizeof(where), "%s: %s", e->cfg_path, k->hf);
		} else if (k->hf && e->user) {
			v = lookup(e->user, k->hf);
			snprintf(where, sizeof(where), "%s: %s", e->o->hf_config, k->hf);
		}
		if (!v)
			continue;       /* a record that does not say passes */
		cJSON_ArrayForEach(it, k->in)
			ok = ok || agree(v, it);
		if (!ok) {
			char allowed[200];

			text_of(v, t, sizeof(t));
			text_of(k->in, allowed, sizeof(allowed));
			rs_diag_add(e->d, "%s: %s is %s; family %s (%s) describes only %s",
				    e->ck->dir_path, where, t, e->f->name,
				    fi->path, allowed);
			err = -EINVAL;
		}
		cJSON_Delete(owned);
	}
	return err;
}

static void eval_free(eval *e)
{
	for (size_t i = 0; e->val && i < e->f->info->nfacts; i++)
		cJSON_Delete(e->val[i]);
	free(e->val);
	free(e->src);
	free(e->lines);
}

static int eval_init(eval *e, rs_checkpoint *ck, const rs_family *f,
		     const rs_bridge_opts *o, bool to_hf, rs_diag *d)
{
	size_t n = f->info->nfacts + 1;

	memset(e, 0, sizeof(*e));
	e->ck = ck;
	e->f = f;
	e->o = o;
	e->to_hf = to_hf;
	e->d = d;
	e->val = calloc(n, sizeof(*e->val));
	e->src = calloc(n, sizeof(*e->src));
	e->lines = calloc(1, LINES_MAX);
	return e->val && e->src && e->lines ? 0 : -ENOMEM;
}

/* The dims the ops need, from the facts. */
static void dims_of(const eval *e, rs_map_dims *dims)
{
	const cJSON *h = value_of(e, "num_attention_heads");
	const cJSON *g = value_of(e, "num_key_value_heads");
	const cJSON *v = value_of(e, "vocab_size");
	const cJSON *t = value_of(e, "tie_word_embeddings");

	memset(dims, 0, sizeof(*dims));
	if (cJSON_IsNumber(h) && h->valuedouble <= UINT32_MAX)
		dims->heads = (uint32_t)h->valuedouble;
	dims->groups = cJSON_IsNumber(g) && g->valuedouble <= UINT32_MAX
			       ? (uint32_t)g->valuedouble : dims->heads;
	if (cJSON_IsNumber(v))
		dims->vocab = (uint64_t)v->valuedouble;
	dims->tied = cJSON_IsTrue(t);
	t = e->f->info->experts ? value_of(e, e->f->info->experts) : NULL;
	if (cJSON_IsNumber(t))
		dims->experts = (uint64_t)t->valuedouble;
}

/* ---- toward HF ------------------------------------------------------- */


/* Toward HF, before the remap: the user's file, the family's checks,
 * the records' facts, the ops' dims.  *out keeps them for the finish. */
int rs_config_to_hf(rs_checkpoint *ck, const rs_family *f,
		    const rs_bridge_opts *o, rs_map_dims *dims,
		    rs_config_eval **out, rs_diag *d)
{
	const rs_family_info *fi = f->info;
	eval *e = calloc(1, sizeof(*e));
	cJSON *user = NULL;
	int err = e ? eval_init(e, ck, f, o, true, d) : -ENOMEM;

	*out = NULL;
	if (!err && ck->model.hf_config) {
		char why[160];

		if (rs_json_parse_object(ck->model.hf_config,
					 strlen(ck->model.hf_config), &user, why,
					 sizeof(why)))
			err = -EINVAL;
	}
	if (e)
		e->user = user;
	if (!err)
		err = run_checks(e);
	for (size_t i = 0; i < fi->nfacts && !err; i++) {
		const rs_fact_def *fd = &fi->facts[i];

		if (fd->type == RS_FACT_OBJECT)
			err = to_hf_object(e, fd, &e->val[i], e->src[i]);
		else
			err = to_hf_records(e, fd, &e->val[i], e->src[i]);
	}
	if (!err)
		err = report_missing(e, true);
	if (!err)
		dims_of(e, dims);
	if (err) {
		rs_config_eval_free(e);
		return err;
	}
	*out = e;
	return 0;
}

/* After the remap: the stored shapes' facts, same_as, constants and
 * defaults; then config.json (the user's fields, every fact over them)
 * and the dry run's lines. */
int rs_config_to_hf_finish(rs_config_eval *e, rs_diag *d)
{
	const rs_family_info *fi = e->f->info;
	rs_checkpoint *ck = e->ck;
	cJSON *out = NULL;
	int err = 0;

	e->d = d;
	for (size_t i = 0; i < fi->nfacts && !err; i++) {
		const rs_fact_def *fd = &fi->facts[i];

		err = from_tensors(e, fd, &e->val[i], e->src[i]);
		if (!err)
			fall_back(e, fd, i);
	}
	if (!err)
		err = report_missing(e, false);
	if (!err) {
		out = e->user ? cJSON_Duplicate(e->user, true) : cJSON_CreateObject();
		if (!out)
			err = -ENOMEM;
	}
	for (size_t i = 0; i < fi->nfacts && !err; i++) {
		char t[140];

		if (!e->val[i] && fi->facts[i].nullable &&
		    !cJSON_GetObjectItemCaseSensitive(out, fi->facts[i].hf)) {
			e->val[i] = cJSON_CreateNull();
			snprintf(e->src[i], 160, "unknown: written null");
		}
		if (!e->val[i])
			continue;
		cJSON_DeleteItemFromObjectCaseSensitive(out, fi->facts[i].hf);
		cJSON_AddItemToObject(out, fi->facts[i].hf,
				      cJSON_Duplicate(e->val[i], true));
		text_of(e->val[i], t, sizeof(t));
		line(e, "  %s = %s (%s)\n", fi->facts[i].hf, t, e->src[i]);
	}
	if (!err && fi->narch) {
		cJSON_DeleteItemFromObjectCaseSensitive(out, "architectures");
		cJSON_AddItemToObject(out, "architectures",
				      cJSON_CreateStringArray((const char *const *)fi->arch, 1));
	}
	if (!err && fi->model_type) {
		cJSON_DeleteItemFromObjectCaseSensitive(out, "model_type");
		cJSON_AddStringToObject(out, "model_type", fi->model_type);
	}
	if (!err) {
		free(ck->model.hf_config_out);
		ck->model.hf_config_out = cJSON_Print(out);
		if (!ck->model.hf_config_out)
			err = -ENOMEM;
	}
	if (!err) {
		free(ck->model.fact_lines);
		ck->model.fact_lines = e->lines;
		e->lines = NULL;
	}
	cJSON_Delete(out);
	rs_config_eval_free(e);
	return err;
}

void rs_config_eval_free(rs_config_eval *e)
{
	if (!e)
		return;
	cJSON_Delete((cJSON *)e->user);
	eval_free(e);
	free(e);
}

/* ---- from HF --------------------------------------------------------- */

int rs_config_from_hf(rs_checkpoint *ck, const rs_family *f,
		      const cJSON *cfg, const char *path, rs_map_dims *dims,
		      rs_diag *d)
{
	const rs_family_info *fi = f->info;
	rs_bridge_opts none = { 0 };
	eval e;
	int err = eval_init(&e, ck, f, &none, false, d);

	e.cfg = cfg;
	e.cfg_path = path;
	if (!err)
		err = run_checks(&e);
	for (size_t i = 0; i < fi->nfacts && !err; i++) {
		const rs_fact_def *fd = &fi->facts[i];
		cJSON *v = NULL;
		char where[300];

		snprintf(where, sizeof(where), "%s: %s", path, fd->hf);
		err = typed(&e, fd, lookup(cfg, fd->hf), where, &v);
		if (!err)
			err = offer(&e, fd, &e.val[i], e.src[i], v, "config.json");
	}
	/* then the shapes, which may divide by any fact the file gives */
	for (size_t i = 0; i < fi->nfacts && !err; i++) {
		const rs_fact_def *fd = &fi->facts[i];

		if (fd->type != RS_FACT_OBJECT)
			err = from_tensors(&e, fd, &e.val[i], e.src[i]);
		/* a constant of the family: what the file gives must be it */
		if (!err && fd->value && e.val[i] && !agree(e.val[i], fd->value)) {
			char a[140], b[140];

			text_of(e.val[i], a, sizeof(a));
			text_of(fd->value, b, sizeof(b));
			rs_diag_add(d, "%s: %s is %s; family %s (%s) describes only %s",
				    path, fd->hf, a, f->name, fi->path, b);
			err = -EINVAL;
		}
		if (!err)
			fall_back(&e, fd, i);
		if (!err && e.val[i]) {
			char t[140];

			text_of(e.val[i], t, sizeof(t));
			line(&e, "  %s = %s (%s)\n", fd->hf, t, e.src[i]);
		}
	}
	if (!err) {
		dims_of(&e, dims);
		free(ck->model.fact_lines);
		ck->model.fact_lines = e.lines;
		e.lines = NULL;
	}
	eval_free(&e);
	return err;
}
