/* facts: the model facts of Megatron's args and HF config.json, by one
 * table (formats/facts.h). */
#include "formats/facts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
	COUNT32,        /* an integer into a uint32_t */
	COUNT64,        /* an integer into a uint64_t */
	REAL,           /* a finite number into a double */
	FLAG,           /* a bool into an int (0 / 1) */
	NOT_FLAG,       /* a bool, negated (untie_... -> tied) */
	TEXT,           /* a str, copied */
} kind;

/* One fact: its field in Megatron's args and in an HF config.json (NULL:
 * that record does not hold it), what it is, the values it may take
 * (counts and reals, both ends included), and where it goes.  The bounds
 * are far beyond real models and keep every product the readers and
 * views make of them below 2^64. */
typedef struct {
	const char *args, *hf;
	kind k;
	double min, max;
	size_t at;
} fact_def;

#define AT(field) offsetof(rs_model_facts, field)

static const fact_def facts[] = {
	{ "num_attention_heads", "num_attention_heads", COUNT32, 1, 65536, AT(heads) },
	{ "num_query_groups", "num_key_value_heads", COUNT32, 1, 65536, AT(query_groups) },
	{ "kv_channels", "head_dim", COUNT32, 1, 1 << 20, AT(head_dim) },
	{ "vocab_size", "vocab_size", COUNT64, 1, 68719476736.0 /* 2^36 */, AT(vocab) },
	{ "max_position_embeddings", "max_position_embeddings", COUNT64, 1,
	  1099511627776.0 /* 2^40 */, AT(max_positions) },
	{ "norm_epsilon", "rms_norm_eps", REAL, 0, 1, AT(norm_eps) },
	{ "rotary_base", "rope_theta", REAL, 0, 1e18, AT(rope_theta) },
	{ "untie_embeddings_and_output_weights", NULL, NOT_FLAG, 0, 1, AT(tied) },
	{ NULL, "tie_word_embeddings", FLAG, 0, 1, AT(tied) },
	{ "swiglu", NULL, FLAG, 0, 1, AT(gated) },
	{ "normalization", NULL, TEXT, 0, 0, AT(normalization) },
	{ "position_embedding_type", NULL, TEXT, 0, 0, AT(position) },
};

#define NFACTS (sizeof(facts) / sizeof(facts[0]))

void rs_facts_init(rs_model_facts *f)
{
	memset(f, 0, sizeof(*f));
	f->norm_eps = f->rope_theta = NAN;
	f->tied = f->gated = -1;
}

void rs_facts_free(rs_model_facts *f)
{
	cJSON_Delete(f->record);
	free(f->normalization);
	free(f->position);
	rs_facts_init(f);
}

static void *slot(rs_model_facts *f, const fact_def *def)
{
	return (char *)f + def->at;
}

/* What a fact's values must be, for messages. */
static void wanted(const fact_def *def, char *out, size_t size)
{
	switch (def->k) {
	case COUNT32:
	case COUNT64:
		snprintf(out, size, "an integer from %.0f to %.0f", def->min,
			 def->max);
		break;
	case REAL:
		snprintf(out, size, "a finite number from %g to %g", def->min,
			 def->max);
		break;
	case FLAG:
	case NOT_FLAG:
		snprintf(out, size, "true or false");
		break;
	case TEXT:
		snprintf(out, size, "a string");
		break;
	}
}

/* Whether v is a value of a count or real fact. */
static bool fits(const fact_def *def, double v)
{
	return (def->k == COUNT32 || def->k == COUNT64 || def->k == REAL) &&
	       isfinite(v) && v >= def->min && v <= def->max &&
	       (def->k == REAL || v == floor(v));
}

/* A checked number (or flag) into the fact's slot. */
static bool store_number(rs_model_facts *f, const fact_def *def, double v)
{
	if (def->k == FLAG || def->k == NOT_FLAG) {
		*(int *)slot(f, def) = def->k == NOT_FLAG ? v == 0 : v != 0;
		return true;
	}
	if (!fits(def, v))
		return false;
	if (def->k == COUNT32)
		*(uint32_t *)slot(f, def) = (uint32_t)v;
	else if (def->k == COUNT64)
		*(uint64_t *)slot(f, def) = (uint64_t)v;
	else
		*(double *)slot(f, def) = v;
	return true;
}

static int store_text(rs_model_facts *f, const fact_def *def, const char *s,
		      size_t len)
{
	char **to = slot(f, def), *copy;

	if (strlen(s) != len)
		return -EINVAL;         /* a NUL inside: not a name */
	copy = strdup(s);
	if (!copy)
		return -ENOMEM;
	free(*to);
	*to = copy;
	return 0;
}

/* Facts f read from a record (`args`: Megatron's, else an HF config) into
 * *out, when what they say holds together: the query groups divide the
 * heads (the table's first two rows). */
static int settle(rs_model_facts *out, rs_model_facts *f, bool args,
		  const char *from, const char *where, rs_diag *d)
{
	if (f->heads % f->query_groups) {
		rs_diag_add(d, "%s: %s%s %u does not divide %s%s %u", where,
			    args ? "args." : "",
			    args ? facts[1].args : facts[1].hf, f->query_groups,
			    args ? "args." : "",
			    args ? facts[0].args : facts[0].hf, f->heads);
		rs_facts_free(f);
		return -EINVAL;
	}
	f->from = from;
	rs_facts_free(out);
	*out = *f;
	return 0;
}

/* ---- Megatron's args ------------------------------------------------ */

/* One args field into f: 0 (absent or None: unknown), -EINVAL reported. */
static int arg_fact(rs_model_facts *f, const rs_pvalue *args,
		    const fact_def *def, const char *where, rs_diag *d)
{
	const rs_pvalue *v = rs_pv_get(args, def->args);
	char got[100], want[80];
	int64_t i;
	double x;
	bool b, ok;
	size_t len;
	const char *s;
	int err;

	if (!v || rs_pv_kind(v) == RS_PV_NONE)
		return 0;
	switch (def->k) {
	case COUNT32:
	case COUNT64:
		ok = rs_pv_int(v, &i) == 0 && store_number(f, def, (double)i);
		break;
	case REAL:
		ok = rs_pv_bool(v, &b) != 0 && rs_pv_float(v, &x) == 0 &&
		     store_number(f, def, x);
		break;
	case FLAG:
	case NOT_FLAG:
		ok = rs_pv_bool(v, &b) == 0 && store_number(f, def, b);
		break;
	default:
		s = rs_pv_str(v, &len);
		err = s ? store_text(f, def, s, len) : -EINVAL;
		if (err == -ENOMEM)
			return err;
		ok = err == 0;
		break;
	}
	if (ok)
		return 0;
	rs_pv_text(v, got, sizeof(got));
	wanted(def, want, sizeof(want));
	rs_diag_add(d, "%s: args.%s is %s, not %s", where, def->args, got, want);
	return -EINVAL;
}

/* A plain pickle value as JSON (NULL: not a plain value, or None). */
static cJSON *plain_json(const rs_pvalue *v, int depth)
{
	bool b;
	int64_t i;
	double x;
	size_t len;
	const char *s;

	switch (rs_pv_kind(v)) {
	case RS_PV_BOOL:
		return rs_pv_bool(v, &b) == 0 ? cJSON_CreateBool(b) : NULL;
	case RS_PV_INT:
		return rs_pv_int(v, &i) == 0 ? cJSON_CreateNumber((double)i) : NULL;
	case RS_PV_FLOAT:
		return rs_pv_float(v, &x) == 0 && isfinite(x)
			       ? cJSON_CreateNumber(x) : NULL;
	case RS_PV_STR:
		s = rs_pv_str(v, &len);
		return s && strlen(s) == len && len <= 4096 ? cJSON_CreateString(s)
							   : NULL;
	case RS_PV_LIST:
	case RS_PV_TUPLE: {
		cJSON *a;

		if (depth > 0 || rs_pv_len(v) > 4096 || !(a = cJSON_CreateArray()))
			return NULL;
		for (size_t k = 0; k < rs_pv_len(v); k++) {
			cJSON *it = plain_json(rs_pv_item(v, k), depth + 1);

			if (!it) {
				cJSON_Delete(a);
				return NULL;
			}
			cJSON_AddItemToArray(a, it);
		}
		return a;
	}
	default:
		return NULL;
	}
}

/* Megatron's args' plain fields as a JSON object; NULL on no memory. */
static cJSON *args_record(const rs_pvalue *args)
{
	cJSON *o = cJSON_CreateObject();
	size_t n = rs_pv_kind(args) == RS_PV_DICT ? rs_pv_len(args) : 0;

	for (size_t k = 0; o && k < n && k < 65536; k++) {
		size_t len;
		const char *key = rs_pv_str(rs_pv_key(args, k), &len);
		cJSON *v;

		if (!key || strlen(key) != len || len > 200)
			continue;
		v = plain_json(rs_pv_val(args, k), 0);
		if (!v)
			continue;
		/* the last pair wins, as in Python */
		cJSON_DeleteItemFromObjectCaseSensitive(o, key);
		cJSON_AddItemToObject(o, key, v);
	}
	return o;
}

int rs_facts_from_args(rs_model_facts *out, const rs_pvalue *args,
		       const char *from, const char *where, rs_diag *d)
{
	rs_model_facts f;
	bool gqa = false;
	int err = 0;

	rs_facts_init(&f);
	for (size_t i = 0; i < NFACTS; i++) {
		int e;

		if (!facts[i].args)
			continue;
		e = arg_fact(&f, args, &facts[i], where, d);
		if (e == -ENOMEM) {
			err = e;
			break;
		}
		if (e)
			err = -EINVAL;
	}
	if (err || !f.heads) {
		rs_facts_free(&f);
		return err;
	}
	/* num_query_groups counts only under group_query_attention */
	if (rs_pv_bool(rs_pv_get(args, "group_query_attention"), &gqa) != 0 ||
	    !gqa || !f.query_groups)
		f.query_groups = f.heads;
	f.record = args_record(args);
	if (!f.record) {
		rs_facts_free(&f);
		return -ENOMEM;
	}
	return settle(out, &f, true, from, where, d);
}

/* ---- HF config.json ------------------------------------------------- */

static const fact_def *hf_def(const char *field)
{
	for (size_t i = 0; i < NFACTS; i++)
		if (facts[i].hf && strcmp(facts[i].hf, field) == 0)
			return &facts[i];
	return NULL;
}

/* A JSON value as messages show it. */
static void json_text(const cJSON *v, char *out, size_t size)
{
	if (cJSON_IsNumber(v))
		snprintf(out, size, "%.17g", v->valuedouble);
	else if (cJSON_IsString(v))
		snprintf(out, size, "\"%.60s%s\"", v->valuestring,
			 strlen(v->valuestring) > 60 ? "..." : "");
	else if (cJSON_IsBool(v))
		snprintf(out, size, "%s", cJSON_IsTrue(v) ? "true" : "false");
	else
		snprintf(out, size, "%s", cJSON_IsArray(v) ? "a list" : "an object");
}

int rs_facts_hf_number(const cJSON *cfg, const char *field,
		       const char *where, double *out, rs_diag *d)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, field);
	const fact_def *def = hf_def(field);
	bool flag = def && (def->k == FLAG || def->k == NOT_FLAG);
	char got[100], want[80] = "a finite non-negative number";
	bool ok;

	if (!v || cJSON_IsNull(v))
		return 0;
	/* a field the table does not know: a bool, or a number >= 0 */
	if (cJSON_IsBool(v))
		ok = !def || flag;
	else
		ok = cJSON_IsNumber(v) &&
		     (def ? fits(def, v->valuedouble)
			  : isfinite(v->valuedouble) && v->valuedouble >= 0);
	if (ok) {
		*out = cJSON_IsBool(v) ? cJSON_IsTrue(v) : v->valuedouble;
		return 1;
	}
	json_text(v, got, sizeof(got));
	if (def)
		wanted(def, want, sizeof(want));
	rs_diag_add(d, "%s: %s is %s, not %s", where, field, got, want);
	return -EINVAL;
}

int rs_facts_from_hf(rs_model_facts *out, const cJSON *cfg, const char *where,
		     rs_diag *d)
{
	rs_model_facts f;
	int err = 0;

	rs_facts_init(&f);
	for (size_t i = 0; i < NFACTS; i++) {
		double v;
		int got;

		if (!facts[i].hf)
			continue;
		got = rs_facts_hf_number(cfg, facts[i].hf, where, &v, d);
		if (got < 0)
			err = -EINVAL;
		else if (got)
			store_number(&f, &facts[i], v);
	}
	if (err || !f.heads) {
		rs_facts_free(&f);
		return err;
	}
	if (!f.query_groups)
		f.query_groups = f.heads;
	f.record = cJSON_Duplicate(cfg, true);
	if (!f.record) {
		rs_facts_free(&f);
		return -ENOMEM;
	}
	return settle(out, &f, false, "config.json", where, d);
}

/* ---- comparing two records ------------------------------------------ */

static void fact_text(const rs_model_facts *f, const fact_def *def,
		      char *out, size_t size)
{
	const void *p = (const char *)f + def->at;

	switch (def->k) {
	case COUNT32:
		if (*(const uint32_t *)p)
			snprintf(out, size, "%u", *(const uint32_t *)p);
		else
			snprintf(out, size, "unknown");
		break;
	case COUNT64:
		if (*(const uint64_t *)p)
			snprintf(out, size, "%llu",
				 (unsigned long long)*(const uint64_t *)p);
		else
			snprintf(out, size, "unknown");
		break;
	case REAL:
		if (isnan(*(const double *)p))
			snprintf(out, size, "unknown");
		else
			snprintf(out, size, "%.17g", *(const double *)p);
		break;
	case FLAG:
	case NOT_FLAG:
		/* shown as the args field says it */
		if (*(const int *)p < 0)
			snprintf(out, size, "unknown");
		else
			snprintf(out, size, "%s",
				 (*(const int *)p != 0) == (def->k == FLAG)
					 ? "True" : "False");
		break;
	case TEXT:
		if (*(char *const *)p)
			snprintf(out, size, "'%.60s'", *(char *const *)p);
		else
			snprintf(out, size, "unknown");
		break;
	}
}

bool rs_facts_differ(const rs_model_facts *a, const rs_model_facts *b,
		     const char **field, char *va, char *vb, size_t size)
{
	for (size_t i = 0; i < NFACTS; i++) {
		if (!facts[i].args)
			continue;
		fact_text(a, &facts[i], va, size);
		fact_text(b, &facts[i], vb, size);
		if (facts[i].k == TEXT) {
			const char *x = *(char *const *)((const char *)a + facts[i].at);
			const char *y = *(char *const *)((const char *)b + facts[i].at);

			if (!x != !y || (x && strcmp(x, y))) {
				*field = facts[i].args;
				return true;
			}
		} else if (strcmp(va, vb)) {
			*field = facts[i].args;
			return true;
		}
	}
	return false;
}
