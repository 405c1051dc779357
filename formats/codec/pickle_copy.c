/* Copying parsed pickle values into a writer (rs_pw_value, pickle.h).
 *
 * A view re-emits values it read, e.g. a legacy checkpoint's argparse
 * Namespace with a few fields changed.  The values come from a hostile
 * file, so nothing is trusted: every GLOBAL is checked against the
 * caller's allowlist again (the writer must not emit what the reader would
 * refuse), and since the memo lets a value be referenced many times (or
 * hold itself), depth and output count are bounded rather than assuming a
 * tree.
 */
#include "formats/codec/pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
	rs_pwriter *w;
	const char *const *allow;
	const rs_pw_member *members;
	uint64_t written;
	char *err;
	size_t errlen;
} copier;

__attribute__((format(printf, 3, 4)))
static int refuse(copier *c, int code, const char *fmt, ...)
{
	va_list ap;

	if (c->err && c->errlen) {
		va_start(ap, fmt);
		vsnprintf(c->err, c->errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

static int copy(copier *c, const rs_pvalue *v, unsigned depth);

/* Items i of a sequence, in order. */
static int copy_items(copier *c, const rs_pvalue *seq, unsigned depth)
{
	for (size_t i = 0; i < rs_pv_len(seq); i++) {
		int err = copy(c, rs_pv_item(seq, i), depth);

		if (err)
			return err;
	}
	return 0;
}

static int copy_pairs(copier *c, const rs_pvalue *dict, unsigned depth)
{
	for (size_t i = 0; i < rs_pv_len(dict); i++) {
		int err = copy(c, rs_pv_key(dict, i), depth);

		if (!err)
			err = copy(c, rs_pv_val(dict, i), depth);
		if (err)
			return err;
	}
	return 0;
}

/* REDUCE(callable, args) or NEWOBJ(cls, args), then what Python's
 * save_reduce writes after it: list items, dict items, BUILD state. */
static int copy_call(copier *c, const rs_pvalue *v, unsigned depth)
{
	const rs_pvalue *list = rs_pv_listitems(v), *dict = rs_pv_dictitems(v);
	const rs_pvalue *state = rs_pv_state(v);
	int err;

	if (rs_pv_kwargs(v))
		return refuse(c, -EINVAL, "an object built with keyword arguments (NEWOBJ_EX) cannot be written");
	err = copy(c, rs_pv_func(v), depth);
	if (!err)
		err = copy(c, rs_pv_args(v), depth);
	if (err)
		return err;
	if (rs_pv_kind(v) == RS_PV_REDUCE)
		rs_pw_reduce(c->w);
	else
		rs_pw_newobj(c->w);
	if (list && rs_pv_len(list)) {
		rs_pw_appends_begin(c->w);
		err = copy_items(c, list, depth);
		rs_pw_list_end(c->w);
	}
	if (!err && dict && rs_pv_len(dict)) {
		rs_pw_setitems_begin(c->w);
		err = copy_pairs(c, dict, depth);
		rs_pw_dict_end(c->w);
	}
	if (!err && state) {
		err = copy(c, state, depth);
		rs_pw_build(c->w);
	}
	return err;
}

/* getattr(cls, name): as cls(value) when the member's value is known -
 * what Python 3.11.5+ write and weights_only loaders can rebuild - else
 * as the getattr it was read from. */
static int copy_member(copier *c, const rs_pvalue *v)
{
	const char *mod = rs_pv_global_module(v), *name = rs_pv_global_name(v);
	const char *attr = rs_pv_global_attr(v);
	size_t mlen = strlen(mod), clen = (size_t)(attr - name) - 1;
	char cls[256];

	if (memchr(name, '.', clen) || clen >= sizeof(cls))
		return refuse(c, -EINVAL, "GLOBAL %s.%s: a qualified name cannot be written under protocol 2",
			      mod, name);
	memcpy(cls, name, clen);
	cls[clen] = 0;
	for (const rs_pw_member *m = c->members; m && m->cls; m++)
		if (strncmp(m->cls, mod, mlen) == 0 && m->cls[mlen] == '.' &&
		    strcmp(m->cls + mlen + 1, cls) == 0 &&
		    strcmp(m->name, attr) == 0) {
			rs_pw_global(c->w, mod, cls);
			rs_pw_int(c->w, m->value);
			rs_pw_tuple_n(c->w, 1);
			rs_pw_reduce(c->w);
			return 0;
		}
	rs_pw_global(c->w, "builtins", "getattr");
	rs_pw_global(c->w, mod, cls);
	rs_pw_cstr(c->w, attr);
	rs_pw_tuple_n(c->w, 2);
	rs_pw_reduce(c->w);
	return 0;
}

static int copy(copier *c, const rs_pvalue *v, unsigned depth)
{
	const char *mod, *name;
	const uint8_t *b;
	size_t n;
	double f;
	int64_t i;
	bool t;
	int err = 0;

	if (depth >= RS_PW_COPY_MAX_DEPTH)
		return refuse(c, -E2BIG, "values nested deeper than %u",
			      RS_PW_COPY_MAX_DEPTH);
	if (++c->written > RS_PW_COPY_MAX_VALUES)
		return refuse(c, -E2BIG, "more than %u values to write",
			      RS_PW_COPY_MAX_VALUES);
	depth++;
	switch (rs_pv_kind(v)) {
	case RS_PV_NONE:
		rs_pw_none(c->w);
		break;
	case RS_PV_BOOL:
		rs_pv_bool(v, &t);
		rs_pw_bool(c->w, t);
		break;
	case RS_PV_INT:
		rs_pv_int(v, &i);
		rs_pw_int(c->w, i);
		break;
	case RS_PV_BIGINT:
		b = rs_pv_bytes(v, &n);
		rs_pw_bigint(c->w, b, n);
		break;
	case RS_PV_FLOAT:
		rs_pv_float(v, &f);
		rs_pw_float(c->w, f);
		break;
	case RS_PV_STR:
		name = rs_pv_str(v, &n);
		rs_pw_str(c->w, name, n);
		break;
	case RS_PV_BYTES:
		b = rs_pv_bytes(v, &n);
		rs_pw_bytes(c->w, b, n);
		break;
	case RS_PV_TUPLE:
		rs_pw_tuple_begin(c->w);
		err = copy_items(c, v, depth);
		rs_pw_tuple_end(c->w);
		break;
	case RS_PV_LIST:
		rs_pw_list_begin(c->w);
		err = copy_items(c, v, depth);
		rs_pw_list_end(c->w);
		break;
	case RS_PV_DICT:
		rs_pw_dict_begin(c->w);
		err = copy_pairs(c, v, depth);
		rs_pw_dict_end(c->w);
		break;
	case RS_PV_SET:
		if (!rs_pickle_allowed(c->allow, "builtins", "set"))
			return refuse(c, -EINVAL, "GLOBAL builtins.set is not allowed");
		rs_pw_global(c->w, "builtins", "set");
		rs_pw_list_begin(c->w);
		err = copy_items(c, v, depth);
		rs_pw_list_end(c->w);
		rs_pw_tuple_n(c->w, 1);
		rs_pw_reduce(c->w);
		break;
	case RS_PV_GLOBAL:
		mod = rs_pv_global_module(v);
		name = rs_pv_global_name(v);
		if (!rs_pickle_allowed(c->allow, mod, name))
			return refuse(c, -EINVAL, "GLOBAL %s.%s is not allowed",
				      mod, name);
		if (rs_pv_global_attr(v))
			err = copy_member(c, v);
		else if (strchr(name, '.'))
			return refuse(c, -EINVAL, "GLOBAL %s.%s: a qualified name cannot be written under protocol 2",
				      mod, name);
		else
			rs_pw_global(c->w, mod, name);
		break;
	case RS_PV_REDUCE:
	case RS_PV_OBJECT:
		err = copy_call(c, v, depth);
		break;
	case RS_PV_PERSID:
		return refuse(c, -EINVAL, "a persistent id (a tensor or storage) cannot be copied");
	default:
		return refuse(c, -EINVAL, "no value to write");
	}
	if (!err && c->w->err)
		err = refuse(c, c->w->err, "the pickle writer failed: %s",
			     c->w->err == -ENOMEM ? "out of memory" : "bad value");
	return err;
}

int rs_pw_value(rs_pwriter *w, const rs_pvalue *v, const char *const *allow,
		const rs_pw_member *members, char *err, size_t errlen)
{
	copier c = { .w = w, .allow = allow, .members = members, .err = err,
		     .errlen = errlen };

	if (err && errlen)
		err[0] = 0;
	return copy(&c, v, 0);
}
