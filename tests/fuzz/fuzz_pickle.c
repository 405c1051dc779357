/* fuzz_pickle: the restricted pickle machine on a hostile pickle.
 *
 * The input is the whole pickle.  It is parsed twice: with the default
 * limits and the torch allowlist (what the DCP and torch.save readers
 * use), and with tight limits and a narrower allowlist, so every limit is
 * reached too.  A parse either fails with a "offset N: " line or gives a
 * value graph, which is walked with the public accessors, each node once
 * (values are shared and may form cycles), checking what the header
 * promises: every GLOBAL passed the allowlist (a getattr result: its
 * class did, and its attribute is a public identifier), no container,
 * string or long is over its limit, strings are NUL-terminated, and every
 * accessor
 * answers NULL/0/-EINVAL for the wrong kind instead of crashing.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "formats/codec/pickle.h"
#include "tests/fuzz/fuzz.h"

/* Pointer set: open addressing, grown at half load. */
typedef struct {
	const rs_pvalue **slot;
	size_t cap, n;
} seen_set;

static size_t hash_ptr(const void *p, size_t cap)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;

	return (size_t)(h >> 17) & (cap - 1);
}

/* True when v was not in the set (it is now). */
static bool seen_add(seen_set *s, const rs_pvalue *v)
{
	size_t i;

	if (2 * (s->n + 1) > s->cap) {
		seen_set g = { calloc(s->cap ? 2 * s->cap : 64, sizeof(*g.slot)),
			       s->cap ? 2 * s->cap : 64, 0 };

		RS_FUZZ_CHECK(g.slot);
		for (size_t k = 0; k < s->cap; k++)
			if (s->slot[k]) {
				i = hash_ptr(s->slot[k], g.cap);
				while (g.slot[i])
					i = (i + 1) & (g.cap - 1);
				g.slot[i] = s->slot[k];
				g.n++;
			}
		free(s->slot);
		*s = g;
	}
	for (i = hash_ptr(v, s->cap); s->slot[i]; i = (i + 1) & (s->cap - 1))
		if (s->slot[i] == v)
			return false;
	s->slot[i] = v;
	s->n++;
	return true;
}

typedef struct {
	const rs_pickle_limits *lim;
	seen_set seen;
	const rs_pvalue **todo;
	size_t ntodo, cap;
	uint64_t sum;           /* every byte read, so none is skipped */
} walker;

static void visit(walker *w, const rs_pvalue *v)
{
	if (!v || !seen_add(&w->seen, v))
		return;
	if (w->ntodo == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 64;
		w->todo = realloc(w->todo, w->cap * sizeof(*w->todo));
		RS_FUZZ_CHECK(w->todo);
	}
	w->todo[w->ntodo++] = v;
}

static void touch(walker *w, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		w->sum += b[i];
}

/* Every accessor on one node; the kind decides which must answer. */
static void check_node(walker *w, const rs_pvalue *v)
{
	rs_pkind k = rs_pv_kind(v);
	bool b;
	int64_t i;
	double f;
	size_t n = 0, len;
	const char *s;
	const uint8_t *bytes;

	RS_FUZZ_CHECK(k >= RS_PV_NONE && k <= RS_PV_PERSID);
	RS_FUZZ_CHECK((rs_pv_bool(v, &b) == 0) == (k == RS_PV_BOOL));
	RS_FUZZ_CHECK((rs_pv_int(v, &i) == 0) == (k == RS_PV_INT));
	RS_FUZZ_CHECK((rs_pv_float(v, &f) == 0) ==
		      (k == RS_PV_INT || k == RS_PV_FLOAT));

	s = rs_pv_str(v, &len);
	RS_FUZZ_CHECK(!s == (k != RS_PV_STR));
	if (s) {
		touch(w, s, len);
		RS_FUZZ_CHECK(s[len] == '\0');
		RS_FUZZ_CHECK(len <= w->lim->max_str);
		RS_FUZZ_CHECK(rs_pv_str(v, NULL) == s);
		RS_FUZZ_CHECK(rs_pv_str_is(v, s) == (strlen(s) == len));
	}
	bytes = rs_pv_bytes(v, &len);
	RS_FUZZ_CHECK(!bytes == (k != RS_PV_BYTES && k != RS_PV_BIGINT));
	if (bytes) {
		touch(w, bytes, len);
		RS_FUZZ_CHECK(len <= (k == RS_PV_BIGINT ? w->lim->max_long
							 : w->lim->max_str));
		/* Narrower longs are INT. */
		RS_FUZZ_CHECK(k != RS_PV_BIGINT || len > 8);
	}

	n = rs_pv_len(v);
	RS_FUZZ_CHECK(n <= w->lim->max_items);
	if (k == RS_PV_TUPLE || k == RS_PV_LIST || k == RS_PV_SET) {
		for (size_t j = 0; j < n; j++) {
			const rs_pvalue *item = rs_pv_item(v, j);

			RS_FUZZ_CHECK(item);
			visit(w, item);
		}
		RS_FUZZ_CHECK(rs_pv_item(v, n) == NULL);
		RS_FUZZ_CHECK(rs_pv_key(v, 0) == NULL && rs_pv_val(v, 0) == NULL);
	} else if (k == RS_PV_DICT) {
		for (size_t j = 0; j < n; j++) {
			RS_FUZZ_CHECK(rs_pv_key(v, j) && rs_pv_val(v, j));
			visit(w, rs_pv_key(v, j));
			visit(w, rs_pv_val(v, j));
		}
		RS_FUZZ_CHECK(rs_pv_key(v, n) == NULL && rs_pv_val(v, n) == NULL);
		RS_FUZZ_CHECK(rs_pv_item(v, 0) == NULL);
		(void)rs_pv_get(v, "storage_data");
		(void)rs_pv_get(v, "");
	} else {
		RS_FUZZ_CHECK(n == 0 && rs_pv_item(v, 0) == NULL);
		RS_FUZZ_CHECK(rs_pv_get(v, "x") == NULL);
	}

	if (k == RS_PV_GLOBAL) {
		const char *mod = rs_pv_global_module(v);
		const char *name = rs_pv_global_name(v);

		const char *attr = rs_pv_global_attr(v);

		RS_FUZZ_CHECK(mod && name);
		touch(w, mod, strlen(mod));
		touch(w, name, strlen(name));
		if (attr) {
			/* getattr(cls, attr): cls allowed, attr a public
			 * identifier ending the name. */
			size_t clen = (size_t)(attr - name);
			char *cls = strndup(name, clen ? clen - 1 : 0);

			RS_FUZZ_CHECK(cls && clen > 1 && name[clen - 1] == '.');
			RS_FUZZ_CHECK(rs_pickle_allowed(w->lim->allow, mod, cls));
			RS_FUZZ_CHECK(attr[0] && attr[0] != '_' &&
				      !(attr[0] >= '0' && attr[0] <= '9'));
			RS_FUZZ_CHECK(strspn(attr, "abcdefghijklmnopqrstuvwxyz"
					     "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
					     "0123456789_") == strlen(attr));
			free(cls);
		} else {
			/* Nothing outside the allowlist ever gets this far. */
			RS_FUZZ_CHECK(rs_pickle_allowed(w->lim->allow, mod, name));
		}
		(void)rs_pv_global_is(v, "torch._utils._rebuild_tensor_v2");
	} else {
		RS_FUZZ_CHECK(!rs_pv_global_module(v) && !rs_pv_global_name(v) &&
			      !rs_pv_global_attr(v));
		RS_FUZZ_CHECK(!rs_pv_global_is(v, "torch.Size"));
	}

	if (k == RS_PV_REDUCE || k == RS_PV_OBJECT) {
		const rs_pvalue *func = rs_pv_func(v);

		RS_FUZZ_CHECK(func);
		visit(w, func);
		visit(w, rs_pv_args(v));
		visit(w, rs_pv_kwargs(v));
		visit(w, rs_pv_state(v));
		visit(w, rs_pv_listitems(v));
		visit(w, rs_pv_dictitems(v));
		RS_FUZZ_CHECK(!rs_pv_listitems(v) ||
			      rs_pv_kind(rs_pv_listitems(v)) == RS_PV_LIST);
		RS_FUZZ_CHECK(!rs_pv_dictitems(v) ||
			      rs_pv_kind(rs_pv_dictitems(v)) == RS_PV_DICT);
		(void)rs_pv_call_is(v, "collections.OrderedDict");
	} else {
		RS_FUZZ_CHECK(!rs_pv_func(v) && !rs_pv_args(v) &&
			      !rs_pv_kwargs(v) && !rs_pv_state(v) &&
			      !rs_pv_listitems(v) && !rs_pv_dictitems(v));
		RS_FUZZ_CHECK(!rs_pv_call_is(v, "torch.Size"));
	}

	if (k == RS_PV_PERSID)
		visit(w, rs_pv_persid(v));
	else
		RS_FUZZ_CHECK(rs_pv_persid(v) == NULL);
}

static void walk(const rs_pickle *p, const rs_pickle_limits *lim)
{
	walker w = { .lim = lim };

	RS_FUZZ_CHECK(rs_pickle_root(p));
	visit(&w, rs_pickle_root(p));
	while (w.ntodo)
		check_node(&w, w.todo[--w.ntodo]);
	free(w.todo);
	free(w.seen.slot);
}

static void parse(const uint8_t *data, size_t size, const rs_pickle_limits *lim)
{
	rs_pickle *p = NULL;
	char err[200];
	int rc;

	memset(err, 0, sizeof(err));
	rc = rs_pickle_parse(data, size, lim, &p, err, sizeof(err));
	RS_FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -E2BIG || rc == -ENOMEM);
	if (rc) {
		RS_FUZZ_CHECK(strncmp(err, "offset ", 7) == 0 || rc == -ENOMEM);
		RS_FUZZ_CHECK(memchr(err, 0, sizeof(err)));
		rs_pickle_free(p);
		return;
	}
	walk(p, lim);
	rs_pickle_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const narrow[] = { "torch._utils.*", "builtins.set",
					      NULL };
	rs_pickle_limits lim;

	rs_pickle_limits_default(&lim);
	lim.allow = rs_pickle_allow_torch;
	parse(data, size, &lim);

	lim = (rs_pickle_limits){
		.max_input = 1u << 16, .max_ops = 4096, .max_alloc = 1u << 14,
		.max_stack = 32, .max_depth = 4, .max_memo = 8,
		.max_items = 16, .max_str = 64, .max_long = 12,
		.allow = narrow,
	};
	parse(data, size, &lim);
	return 0;
}
