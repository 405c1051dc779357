/* pickle reader: the pickle machine with inert values (see pickle.h).
 *
 * It follows CPython's Lib/pickle.py _Unpickler opcode by opcode, with one
 * flat stack plus a list of mark positions standing in for Python's
 * stack/metastack pair: a value below the innermost mark is out of reach,
 * as it is in Python.  Where Python would call something (REDUCE, NEWOBJ,
 * BUILD, append on a non-list) a value recording the call is built instead.
 */
#include "formats/codec/pickle.h"
#include "formats/codec/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opcodes the reader knows: name, byte. */
#define RS_PICKLE_OPS(X)                                                    \
	X(MARK, '(') X(STOP, '.') X(POP, '0') X(POP_MARK, '1') X(DUP, '2')  \
	X(FLOAT, 'F') X(INT, 'I') X(BININT, 'J') X(BININT1, 'K')            \
	X(BININT2, 'M') X(NONE, 'N') X(PERSID, 'P') X(BINPERSID, 'Q')       \
	X(REDUCE, 'R') X(BINSTRING, 'T') X(SHORT_BINSTRING, 'U')            \
	X(BINUNICODE, 'X') X(APPEND, 'a') X(BUILD, 'b') X(GLOBAL, 'c')      \
	X(DICT, 'd') X(EMPTY_DICT, '}') X(APPENDS, 'e') X(GET, 'g')         \
	X(BINGET, 'h') X(LONG_BINGET, 'j') X(LIST, 'l') X(EMPTY_LIST, ']')  \
	X(PUT, 'p') X(BINPUT, 'q') X(LONG_BINPUT, 'r') X(SETITEM, 's')      \
	X(TUPLE, 't') X(EMPTY_TUPLE, ')') X(SETITEMS, 'u') X(BINFLOAT, 'G') \
	X(PROTO, 0x80) X(NEWOBJ, 0x81) X(TUPLE1, 0x85) X(TUPLE2, 0x86)      \
	X(TUPLE3, 0x87) X(NEWTRUE, 0x88) X(NEWFALSE, 0x89) X(LONG1, 0x8a)   \
	X(LONG4, 0x8b) X(BINBYTES, 'B') X(SHORT_BINBYTES, 'C')              \
	X(SHORT_BINUNICODE, 0x8c) X(BINUNICODE8, 0x8d) X(BINBYTES8, 0x8e)   \
	X(EMPTY_SET, 0x8f) X(ADDITEMS, 0x90) X(FROZENSET, 0x91)             \
	X(NEWOBJ_EX, 0x92) X(STACK_GLOBAL, 0x93) X(MEMOIZE, 0x94)           \
	X(FRAME, 0x95) X(BYTEARRAY8, 0x96) X(NEXT_BUFFER, 0x97)             \
	X(READONLY_BUFFER, 0x98)

enum {
#define X(name, byte) OP_##name = byte,
	RS_PICKLE_OPS(X)
#undef X
};

/* FLOAT (text) is in the table only so its name prints; it is refused, and
 * so are NEXT_BUFFER and READONLY_BUFFER. */
static const char *opname(int op)
{
	switch (op) {
#define X(name, byte) case byte: return #name;
	RS_PICKLE_OPS(X)
#undef X
	}
	return NULL;
}

/* The callables a pickle may name only in one shape (see pickle.h,
 * "Construction forms"): the GLOBAL gives a token, not a value. */
enum {
	SP_NONE,
	SP_GETATTR,		/* builtins.getattr */
	SP_RECONSTRUCTOR,	/* copyreg._reconstructor */
	SP_NEWOBJ,		/* copyreg.__newobj__ */
	SP_NEWOBJ_EX,		/* copyreg.__newobj_ex__ */
	SP_OBJECT,		/* builtins.object, the base of _reconstructor */
};

struct rs_pvalue {
	rs_pvalue *next;	/* every allocated value of a parse */
	rs_pkind kind;
	/* The token this value is (a GLOBAL with `special`) or a tuple holds;
	 * such a value may only be consumed by its form's REDUCE. */
	const rs_pvalue *taint;
	union {
		bool b;
		int64_t i;
		double f;
		struct {
			char *p;	/* just past the struct, NUL-ended */
			size_t n;
		} s;			/* STR, BYTES, BIGINT */
		struct {
			rs_pvalue **v;
			size_t n, cap;	/* DICT: n = 2 * pairs */
		} seq;			/* TUPLE, LIST, DICT, SET */
		struct {
			char *module, *name;
			char *attr;	/* getattr(cls, attr): in name */
			int special;	/* SP_* */
		} g;
		struct {
			rs_pvalue *func, *args, *kwargs, *state;
			rs_pvalue *list, *dict;
		} call;			/* REDUCE, OBJECT */
		rs_pvalue *pid;
	} u;
};

struct rs_pickle {
	rs_pvalue *all;
	rs_pvalue *root;
	uint64_t alloc;		/* bytes charged against max_alloc */
	rs_pvalue none, yes, no; /* shared, not on `all` */
};

/* Memo: open addressing on index + 1 (0 = empty).  A hash and not an
 * array because indices come from the input: one LONG_BINPUT 4e9 must not
 * cost 32 GB. */
struct memo {
	uint64_t *keys;
	rs_pvalue **vals;
	size_t cap, n;
};

struct parser {
	const uint8_t *buf;
	size_t len, pos, at;	/* at: offset of the current opcode */
	const rs_pickle_limits *lim;
	rs_pickle *p;
	rs_pvalue **stack;
	size_t sp, scap;
	size_t *marks;
	size_t nmarks, mcap;
	struct memo memo;
	int proto;
	char *err;
	size_t errlen;
};

static const rs_pickle_limits defaults = {
	.max_input = 256u << 20,
	.max_ops = 64u << 20,
	.max_alloc = 1u << 30,
	.max_stack = 1u << 20,
	.max_depth = 1000,
	.max_memo = 16u << 20,
	.max_items = 16u << 20,
	.max_str = 256u << 20,
	.max_long = 256,
	.allow = NULL,
};

const char *const rs_pickle_allow_torch[] = {
	"torch.*",
	"collections.OrderedDict",
	"pathlib.*",
	"megatron.core.dist_checkpointing.*",
	"_codecs.encode",
	"builtins.set",
	"builtins.frozenset",
	"builtins.bytearray",
	NULL,
};

void rs_pickle_limits_default(rs_pickle_limits *lim)
{
	*lim = defaults;
}

__attribute__((format(printf, 3, 4)))
static int fail(struct parser *ps, int code, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!ps->err || ps->errlen == 0)
		return code;
	n = snprintf(ps->err, ps->errlen, "offset %zu: ", ps->at);
	if (n >= 0 && (size_t)n < ps->errlen) {
		va_start(ap, fmt);
		vsnprintf(ps->err + n, ps->errlen - n, fmt, ap);
		va_end(ap);
	}
	return code;
}

static int oom(struct parser *ps)
{
	return fail(ps, -ENOMEM, "out of memory");
}

static int charge(struct parser *ps, uint64_t bytes)
{
	if (bytes > ps->lim->max_alloc - ps->p->alloc)
		return fail(ps, -E2BIG, "values exceed %llu bytes",
			    (unsigned long long)ps->lim->max_alloc);
	ps->p->alloc += bytes;
	return 0;
}

/* ---- values ------------------------------------------------------------ */

static int new_value(struct parser *ps, rs_pkind kind, size_t extra,
		     rs_pvalue **out)
{
	rs_pvalue *v;
	int err;

	*out = NULL;
	if (extra > SIZE_MAX - sizeof(*v))
		return fail(ps, -E2BIG, "value too large");
	err = charge(ps, sizeof(*v) + extra);
	if (err)
		return err;
	v = calloc(1, sizeof(*v) + extra);
	if (!v)
		return oom(ps);
	v->kind = kind;
	v->next = ps->p->all;
	ps->p->all = v;
	*out = v;
	return 0;
}

/* STR, BYTES or BIGINT holding a copy of src[0, n). */
static int new_blob(struct parser *ps, rs_pkind kind, const uint8_t *src,
		    size_t n, rs_pvalue **out)
{
	int err;

	if (n == SIZE_MAX)
		return fail(ps, -E2BIG, "string too large");
	err = new_value(ps, kind, n + 1, out);
	if (err)
		return err;
	(*out)->u.s.p = (char *)(*out + 1);
	(*out)->u.s.n = n;
	if (n)
		memcpy((*out)->u.s.p, src, n);
	return 0;
}

/* A construction token outside its own REDUCE (as_value), or that REDUCE
 * with arguments of another shape. */
static int refuse_form(struct parser *ps, const rs_pvalue *tok, bool as_value)
{
	static const char *const shape[] = {
		[SP_GETATTR] = "getattr(class, 'name')",
		[SP_RECONSTRUCTOR] = "copyreg._reconstructor(class, object, None)",
		[SP_NEWOBJ] = "copyreg.__newobj__(class, *args)",
		[SP_NEWOBJ_EX] = "copyreg.__newobj_ex__(class, args, kwargs)",
		[SP_OBJECT] = "the base class of copyreg._reconstructor",
	};

	return fail(ps, -EINVAL, "%s.%s %s: it is only read as %s",
		    tok->u.g.module, tok->u.g.name,
		    as_value ? "used as a value" : "called with other arguments",
		    shape[tok->u.g.special]);
}

static int misuse(struct parser *ps, const rs_pvalue *tok)
{
	return refuse_form(ps, tok, true);
}

static bool is_seq(rs_pkind k)
{
	return k == RS_PV_TUPLE || k == RS_PV_LIST || k == RS_PV_DICT ||
	       k == RS_PV_SET;
}

/* Appends items[0, n) to the sequence v, growing it by doubling. */
static int seq_add(struct parser *ps, rs_pvalue *v, rs_pvalue *const *items,
		   size_t n)
{
	size_t need, cap;
	rs_pvalue **nv;
	int err;

	if (n > ps->lim->max_items || v->u.seq.n > ps->lim->max_items - n)
		return fail(ps, -E2BIG, "container over %llu items",
			    (unsigned long long)ps->lim->max_items);
	/* A tuple may carry a token to its form's REDUCE (a tuple is never
	 * added to later); no other container may hold one. */
	for (size_t i = 0; i < n; i++) {
		if (!items[i]->taint)
			continue;
		if (v->kind != RS_PV_TUPLE)
			return misuse(ps, items[i]->taint);
		if (!v->taint)
			v->taint = items[i]->taint;
	}
	need = v->u.seq.n + n;
	if (need > v->u.seq.cap) {
		cap = v->u.seq.cap ? v->u.seq.cap : 4;
		while (cap < need)
			cap *= 2;	/* need <= max_items: no overflow */
		if (cap > SIZE_MAX / sizeof(*nv))
			return fail(ps, -E2BIG, "container too large");
		err = charge(ps, (uint64_t)(cap - v->u.seq.cap) * sizeof(*nv));
		if (err)
			return err;
		nv = realloc(v->u.seq.v, cap * sizeof(*nv));
		if (!nv)
			return oom(ps);
		v->u.seq.v = nv;
		v->u.seq.cap = cap;
	}
	if (n)
		memcpy(v->u.seq.v + v->u.seq.n, items, n * sizeof(*items));
	v->u.seq.n = need;
	return 0;
}

static int new_seq(struct parser *ps, rs_pkind kind, rs_pvalue *const *items,
		   size_t n, rs_pvalue **out)
{
	int err = new_value(ps, kind, 0, out);

	return err ? err : seq_add(ps, *out, items, n);
}

/* ---- stack and memo ---------------------------------------------------- */

/* Lowest stack slot reachable: values below the innermost mark are not. */
static size_t base(const struct parser *ps)
{
	return ps->nmarks ? ps->marks[ps->nmarks - 1] : 0;
}

static int push(struct parser *ps, rs_pvalue *v)
{
	if (ps->sp == ps->scap) {
		size_t cap = ps->scap ? ps->scap * 2 : 64;
		rs_pvalue **ns;

		if (ps->sp >= ps->lim->max_stack)
			return fail(ps, -E2BIG, "stack over %u values",
				    ps->lim->max_stack);
		if (cap > ps->lim->max_stack)
			cap = ps->lim->max_stack;
		ns = realloc(ps->stack, cap * sizeof(*ns));
		if (!ns)
			return oom(ps);
		ps->stack = ns;
		ps->scap = cap;
	}
	ps->stack[ps->sp++] = v;
	return 0;
}

static int pop(struct parser *ps, int op, rs_pvalue **out)
{
	*out = NULL;
	if (ps->sp <= base(ps))
		return fail(ps, -EINVAL, "%s: stack underflow", opname(op));
	*out = ps->stack[--ps->sp];
	return 0;
}

static int top(struct parser *ps, int op, rs_pvalue **out)
{
	*out = NULL;
	if (ps->sp <= base(ps))
		return fail(ps, -EINVAL, "%s: stack underflow", opname(op));
	*out = ps->stack[ps->sp - 1];
	return 0;
}

/* Closes the innermost mark.  The items stay valid until the next push. */
static int pop_mark(struct parser *ps, int op, rs_pvalue ***items, size_t *n)
{
	size_t m;

	*items = NULL;
	*n = 0;
	if (!ps->nmarks)
		return fail(ps, -EINVAL, "%s: no MARK", opname(op));
	m = ps->marks[--ps->nmarks];
	/* The stack is NULL until the first push: NULL + 0 is undefined. */
	*items = ps->sp > m ? ps->stack + m : NULL;
	*n = ps->sp - m;
	ps->sp = m;
	return 0;
}

static int mark(struct parser *ps)
{
	if (ps->nmarks == ps->mcap) {
		size_t cap = ps->mcap ? ps->mcap * 2 : 16;
		size_t *nm;

		if (ps->nmarks >= ps->lim->max_depth)
			return fail(ps, -E2BIG, "MARK: nesting over %u",
				    ps->lim->max_depth);
		if (cap > ps->lim->max_depth)
			cap = ps->lim->max_depth;
		nm = realloc(ps->marks, cap * sizeof(*nm));
		if (!nm)
			return oom(ps);
		ps->marks = nm;
		ps->mcap = cap;
	}
	ps->marks[ps->nmarks++] = ps->sp;
	return 0;
}

static size_t memo_slot(const struct memo *m, uint64_t key)
{
	size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull) & (m->cap - 1);

	while (m->keys[i] && m->keys[i] != key)
		i = (i + 1) & (m->cap - 1);
	return i;
}

static int memo_put(struct parser *ps, int op, uint64_t idx)
{
	struct memo *m = &ps->memo;
	uint64_t key = idx + 1;
	rs_pvalue *v;
	size_t i;
	int err;

	err = top(ps, op, &v);
	if (err)
		return err;
	if (idx > UINT32_MAX)
		return fail(ps, -EINVAL, "%s: memo index %llu out of range",
			    opname(op), (unsigned long long)idx);
	/* Keep the load under one half so probes stay short. */
	if (m->n + 1 > m->cap / 2) {
		struct memo nm = { 0 };

		if (m->n >= ps->lim->max_memo)
			return fail(ps, -E2BIG, "memo over %u entries",
				    ps->lim->max_memo);
		nm.cap = m->cap ? m->cap * 2 : 64;
		nm.keys = calloc(nm.cap, sizeof(*nm.keys));
		nm.vals = calloc(nm.cap, sizeof(*nm.vals));
		if (!nm.keys || !nm.vals) {
			free(nm.keys);
			free(nm.vals);
			return oom(ps);
		}
		for (size_t j = 0; j < m->cap; j++) {
			if (!m->keys[j])
				continue;
			i = memo_slot(&nm, m->keys[j]);
			nm.keys[i] = m->keys[j];
			nm.vals[i] = m->vals[j];
		}
		nm.n = m->n;
		free(m->keys);
		free(m->vals);
		*m = nm;
	}
	i = memo_slot(m, key);
	if (!m->keys[i]) {
		if (m->n >= ps->lim->max_memo)
			return fail(ps, -E2BIG, "memo over %u entries",
				    ps->lim->max_memo);
		m->keys[i] = key;
		m->n++;
	}
	m->vals[i] = v;
	return 0;
}

static int memo_get(struct parser *ps, int op, uint64_t idx)
{
	struct memo *m = &ps->memo;
	size_t i;

	if (idx > UINT32_MAX || !m->cap)
		goto missing;
	i = memo_slot(m, idx + 1);
	if (!m->keys[i])
		goto missing;
	return push(ps, m->vals[i]);
missing:
	return fail(ps, -EINVAL, "%s: memo index %llu missing", opname(op),
		    (unsigned long long)idx);
}

/* ---- reading ----------------------------------------------------------- */

static int take(struct parser *ps, int op, uint64_t n, const uint8_t **out)
{
	*out = NULL;
	if (n > ps->len - ps->pos)
		return fail(ps, -EINVAL, "%s: truncated (%llu bytes needed, %zu left)",
			    opname(op), (unsigned long long)n,
			    ps->len - ps->pos);
	*out = ps->buf + ps->pos;
	ps->pos += n;
	return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int take_le(struct parser *ps, int op, int n, uint64_t *out)
{
	const uint8_t *p;
	int err = take(ps, op, n, &p);

	*out = err ? 0 : le(p, n);
	return err;
}

/* A text argument: the bytes up to '\n', which is consumed. */
static int take_line(struct parser *ps, int op, const uint8_t **s, size_t *n)
{
	const uint8_t *start = ps->buf + ps->pos;
	const uint8_t *nl = memchr(start, '\n', ps->len - ps->pos);

	if (!nl)
		return fail(ps, -EINVAL, "%s: truncated (no newline)",
			    opname(op));
	*s = start;
	*n = (size_t)(nl - start);
	if (*n > ps->lim->max_str)
		return fail(ps, -E2BIG, "%s: line over %llu bytes", opname(op),
			    (unsigned long long)ps->lim->max_str);
	ps->pos += *n + 1;
	return 0;
}

/* Decimal text as Python writes it for INT/PUT/GET: [-]digits. */
static int parse_dec(struct parser *ps, int op, const uint8_t *s, size_t n,
		     int64_t *out)
{
	bool neg = n && s[0] == '-';
	uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : INT64_MAX;
	size_t i = neg;

	if (i == n)
		goto bad;
	for (; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			goto bad;
		if (v > (lim - (s[i] - '0')) / 10)
			return fail(ps, -E2BIG, "%s: integer out of range",
				    opname(op));
		v = v * 10 + (s[i] - '0');
	}
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
bad:
	return fail(ps, -EINVAL, "%s: bad integer text", opname(op));
}

static int take_index(struct parser *ps, int op, uint64_t *idx)
{
	const uint8_t *s;
	size_t n;
	int64_t v;
	int err = take_line(ps, op, &s, &n);

	if (!err)
		err = parse_dec(ps, op, s, n, &v);
	if (err)
		return err;
	if (v < 0)
		return fail(ps, -EINVAL, "%s: negative memo index", opname(op));
	*idx = (uint64_t)v;
	return 0;
}

/* A length-prefixed STR/BYTES whose length field is `width` bytes. */
static int load_blob(struct parser *ps, int op, int width, bool is_signed,
		     rs_pkind kind)
{
	const uint8_t *p;
	uint64_t n;
	rs_pvalue *v;
	int err = take_le(ps, op, width, &n);

	if (err)
		return err;
	if (is_signed && (n & 0x80000000u))
		return fail(ps, -EINVAL, "%s: negative length", opname(op));
	if (n > ps->lim->max_str)
		return fail(ps, -E2BIG, "%s: length %llu over %llu", opname(op),
			    (unsigned long long)n,
			    (unsigned long long)ps->lim->max_str);
	err = take(ps, op, n, &p);
	if (!err)
		err = new_blob(ps, kind, p, n, &v);
	return err ? err : push(ps, v);
}

/* A str as Python decodes it (UTF-8, surrogatepass): bytes it would not
 * decode are refused, never read as a name it would not have. */
static int load_unicode(struct parser *ps, int op, int width)
{
	int err = load_blob(ps, op, width, false, RS_PV_STR);
	const rs_pvalue *v = err ? NULL : ps->stack[ps->sp - 1];

	if (v && !rs_utf8_valid(v->u.s.p, v->u.s.n, true))
		return fail(ps, -EINVAL, "%s: not UTF-8 (Python would not decode it)",
			    opname(op));
	return err;
}

static int push_int(struct parser *ps, int64_t i)
{
	rs_pvalue *v;
	int err = new_value(ps, RS_PV_INT, 0, &v);

	if (err)
		return err;
	v->u.i = i;
	return push(ps, v);
}

static int load_long(struct parser *ps, int op, int width)
{
	const uint8_t *p;
	uint64_t n;
	rs_pvalue *v;
	int err = take_le(ps, op, width, &n);

	if (err)
		return err;
	if (width == 4 && (n & 0x80000000u))
		return fail(ps, -EINVAL, "%s: negative length", opname(op));
	if (n > ps->lim->max_long)
		return fail(ps, -E2BIG, "%s: length %llu over %u", opname(op),
			    (unsigned long long)n, ps->lim->max_long);
	err = take(ps, op, n, &p);
	if (err)
		return err;
	if (n > 8) {
		err = new_blob(ps, RS_PV_BIGINT, p, n, &v);
		return err ? err : push(ps, v);
	}
	/* Little-endian two's complement, sign-extended from n bytes. */
	uint64_t u = le(p, (int)n);

	if (n && n < 8 && (p[n - 1] & 0x80))
		u |= ~0ull << (8 * n);
	return push_int(ps, (int64_t)u);
}

static int check_name(struct parser *ps, const rs_pvalue *v)
{
	if (v->kind != RS_PV_STR || memchr(v->u.s.p, 0, v->u.s.n) ||
	    v->u.s.n == 0)
		return fail(ps, -EINVAL, "STACK_GLOBAL: module and name must be strings");
	return 0;
}

/* Which construction token a GLOBAL is.  getattr and the copyreg
 * functions always are (allowed or not, they are only read in their
 * shape); builtins.object is one unless the caller allows it as a value. */
static int special_of(const struct parser *ps, const char *mod,
		      const char *name)
{
	static const struct {
		const char *mod, *name;
		int special;
	} forms[] = {
		{ "builtins", "getattr", SP_GETATTR },
		{ "copyreg", "_reconstructor", SP_RECONSTRUCTOR },
		{ "copyreg", "__newobj__", SP_NEWOBJ },
		{ "copyreg", "__newobj_ex__", SP_NEWOBJ_EX },
	};

	for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++)
		if (!strcmp(mod, forms[i].mod) && !strcmp(name, forms[i].name))
			return forms[i].special;
	if (!strcmp(mod, "builtins") && !strcmp(name, "object") &&
	    !rs_pickle_allowed(ps->lim->allow, mod, name))
		return SP_OBJECT;
	return SP_NONE;
}

static bool match(const char *pat, const char *mod, const char *name);

/* An allowlist entry without a wildcard names module.name. */
static bool allowed_exactly(const char *const *allow, const char *mod,
			    const char *name)
{
	for (; allow && *allow; allow++) {
		size_t n = strlen(*allow);

		if (n && (*allow)[n - 1] != '*' && match(*allow, mod, name))
			return true;
	}
	return false;
}

/* "a.b.c" where each part is an ASCII identifier (what Python's import
 * system and attribute access take; module names of installed packages
 * and class qualnames are these). */
static bool dotted_identifiers(const uint8_t *s, size_t n)
{
	bool start = true;

	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];

		if (c == '.') {
			if (start)
				return false;
			start = true;
			continue;
		}
		if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (!start && c >= '0' && c <= '9')))
			return false;
		start = false;
	}
	return !start;
}

/* Builds the GLOBAL value, mapping Python 2 module names the way Python's
 * unpickler does (fix_imports) for protocols below 3. */
static int push_global(struct parser *ps, const uint8_t *mod, size_t mlen,
		       const uint8_t *name, size_t nlen)
{
	static const char *const py2[][2] = {
		{ "__builtin__", "builtins" },
		{ "copy_reg", "copyreg" },
	};
	rs_pvalue *v;
	int err;

	if (!mlen || !nlen || memchr(mod, 0, mlen) || memchr(name, 0, nlen))
		return fail(ps, -EINVAL, "GLOBAL: empty or NUL in name");
	if (!dotted_identifiers(mod, mlen) || !dotted_identifiers(name, nlen))
		return fail(ps, -EINVAL, "GLOBAL %.*s.%.*s: the module and name must be dotted identifiers",
			    (int)(mlen > 80 ? 80 : mlen), (const char *)mod,
			    (int)(nlen > 80 ? 80 : nlen), (const char *)name);
	if (ps->proto < 3) {
		for (size_t i = 0; i < sizeof(py2) / sizeof(py2[0]); i++) {
			if (strlen(py2[i][0]) == mlen &&
			    !memcmp(mod, py2[i][0], mlen)) {
				mod = (const uint8_t *)py2[i][1];
				mlen = strlen(py2[i][1]);
			}
		}
	}
	if (mlen > SIZE_MAX / 2 - nlen)
		return fail(ps, -E2BIG, "GLOBAL: name too long");
	err = new_value(ps, RS_PV_GLOBAL, mlen + nlen + 2, &v);
	if (err)
		return err;
	v->u.g.module = (char *)(v + 1);
	v->u.g.name = v->u.g.module + mlen + 1;
	memcpy(v->u.g.module, mod, mlen);
	memcpy(v->u.g.name, name, nlen);
	v->u.g.special = special_of(ps, v->u.g.module, v->u.g.name);
	if (v->u.g.special)
		v->taint = v;
	else if (!rs_pickle_allowed(ps->lim->allow, v->u.g.module, v->u.g.name))
		return fail(ps, -EINVAL, "GLOBAL %s.%s is not allowed",
			    v->u.g.module, v->u.g.name);
	/* Python resolves a dotted name (protocol 4's qualname) attribute by
	 * attribute: under an allowed module, "x.y.eval" could reach any
	 * object.  Only an entry naming it whole allows one, never a
	 * wildcard.  (getattr(cls, 'member') is read apart: load_getattr.) */
	else if (strchr(v->u.g.name, '.') &&
		 !allowed_exactly(ps->lim->allow, v->u.g.module, v->u.g.name))
		return fail(ps, -EINVAL, "GLOBAL %s.%s: a dotted name is allowed only by an entry that names it whole",
			    v->u.g.module, v->u.g.name);
	return push(ps, v);
}

/* The LIST or DICT that APPEND(S)/SETITEM(S) add to: the target itself,
 * or the one recorded on a REDUCE/OBJECT (list/dict subclasses). */
static int add_target(struct parser *ps, int op, rs_pkind want, rs_pvalue **out)
{
	rs_pvalue *t, **slot;
	int err = top(ps, op, &t);

	*out = NULL;
	if (err)
		return err;
	if (t->kind == want) {
		*out = t;
		return 0;
	}
	if (t->kind != RS_PV_REDUCE && t->kind != RS_PV_OBJECT)
		return fail(ps, -EINVAL, "%s on a value that is not a %s",
			    opname(op), want == RS_PV_LIST ? "list" :
			    want == RS_PV_DICT ? "dict" : "set");
	if (want == RS_PV_SET)
		return fail(ps, -EINVAL, "%s on an object", opname(op));
	slot = want == RS_PV_LIST ? &t->u.call.list : &t->u.call.dict;
	if (!*slot) {
		err = new_value(ps, want, 0, slot);
		if (err)
			return err;
	}
	*out = *slot;
	return 0;
}

static int add_items(struct parser *ps, int op, rs_pkind want,
		     rs_pvalue **items, size_t n)
{
	rs_pvalue *t;
	int err;

	if (want == RS_PV_DICT && n % 2)
		return fail(ps, -EINVAL, "%s: odd number of items", opname(op));
	err = add_target(ps, op, want, &t);
	return err ? err : seq_add(ps, t, items, n);
}

/* A class a form may construct or take an attribute of: an allowed
 * GLOBAL, neither a token nor a getattr result. */
static bool plain_global(const rs_pvalue *v)
{
	return v->kind == RS_PV_GLOBAL && !v->u.g.special && !v->u.g.attr;
}

static int push_call(struct parser *ps, rs_pkind kind, rs_pvalue *func,
		     rs_pvalue *args, rs_pvalue *kwargs)
{
	rs_pvalue *v;
	int err = new_value(ps, kind, 0, &v);

	if (err)
		return err;
	v->u.call.func = func;
	v->u.call.args = args;
	v->u.call.kwargs = kwargs;
	return push(ps, v);
}

/* An attribute name getattr may take: an ASCII identifier that does not
 * start with '_', so no dunder (__class__, __globals__, __subclasses__)
 * nor private member is reached. */
static bool public_name(const rs_pvalue *s)
{
	if (s->kind != RS_PV_STR || s->u.s.n == 0 || s->u.s.p[0] == '_' ||
	    (s->u.s.p[0] >= '0' && s->u.s.p[0] <= '9'))
		return false;
	for (size_t i = 0; i < s->u.s.n; i++) {
		char c = s->u.s.p[i];

		if (!(c == '_' || (c >= '0' && c <= '9') ||
		      (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
			return false;
	}
	return true;
}

/* getattr(cls, 'name'), as Python 3.11.0-3.11.4 pickle an Enum member and
 * protocols below 4 a nested class: the GLOBAL module.Cls.name, inert like
 * any GLOBAL, which protocol 4 would spell STACK_GLOBAL(module, 'Cls.name'). */
static int load_getattr(struct parser *ps, const rs_pvalue *func,
			const rs_pvalue *args)
{
	const rs_pvalue *cls, *name;
	size_t mlen, clen, alen;
	rs_pvalue *v;
	int err;

	if (args->u.seq.n == 3)
		return fail(ps, -EINVAL, "builtins.getattr with a default (3 arguments) is not read");
	if (args->u.seq.n != 2)
		return refuse_form(ps, func, false);
	cls = args->u.seq.v[0];
	name = args->u.seq.v[1];
	if (cls->taint)
		return misuse(ps, cls->taint);
	if (cls->kind == RS_PV_GLOBAL && cls->u.g.attr)
		return fail(ps, -EINVAL, "getattr on a getattr result (%s.%s) is not read",
			    cls->u.g.module, cls->u.g.name);
	if (!plain_global(cls))
		return fail(ps, -EINVAL, "builtins.getattr on a value that is not an allowed GLOBAL is not read");
	if (name->kind != RS_PV_STR)
		return fail(ps, -EINVAL, "getattr(%s.%s, ...) with a name that is not a string is not read",
			    cls->u.g.module, cls->u.g.name);
	if (!public_name(name))
		return fail(ps, -EINVAL, "getattr(%s.%s, '%.60s') is not read: the name must be an identifier not starting with '_'",
			    cls->u.g.module, cls->u.g.name, name->u.s.p);
	mlen = strlen(cls->u.g.module);
	clen = strlen(cls->u.g.name);
	alen = name->u.s.n;
	if (alen > SIZE_MAX / 4 - mlen - clen)
		return fail(ps, -E2BIG, "getattr: name too long");
	err = new_value(ps, RS_PV_GLOBAL, mlen + clen + alen + 3, &v);
	if (err)
		return err;
	v->u.g.module = (char *)(v + 1);
	v->u.g.name = v->u.g.module + mlen + 1;
	v->u.g.attr = v->u.g.name + clen + 1;
	memcpy(v->u.g.module, cls->u.g.module, mlen);
	memcpy(v->u.g.name, cls->u.g.name, clen);
	v->u.g.name[clen] = '.';
	memcpy(v->u.g.attr, name->u.s.p, alen);
	return push(ps, v);
}

/* The copyreg reconstructors protocols 0 and 1 write for objects, read as
 * the OBJECT that NEWOBJ / NEWOBJ_EX give for the same object under
 * protocols 2 and 4:
 *   _reconstructor(cls, object, None)    -> OBJECT(cls, ())
 *   __newobj__(cls, *args)               -> OBJECT(cls, args)
 *   __newobj_ex__(cls, args, kwargs)     -> OBJECT(cls, args, kwargs) */
static int load_copyreg(struct parser *ps, const rs_pvalue *func,
			rs_pvalue *args)
{
	rs_pvalue **a = args->u.seq.v, *rest;
	size_t n = args->u.seq.n;
	int special = func->u.g.special;
	int err;

	if (n >= 1 && a[0]->taint)
		return misuse(ps, a[0]->taint);
	if (n < 1 || !plain_global(a[0]))
		goto bad;
	if (special == SP_RECONSTRUCTOR) {
		/* object.__new__(cls): any other base would run its own
		 * __new__/__init__ on the state. */
		if (n != 3 || a[2]->kind != RS_PV_NONE ||
		    a[1]->kind != RS_PV_GLOBAL ||
		    strcmp(a[1]->u.g.module, "builtins") != 0 ||
		    strcmp(a[1]->u.g.name, "object") != 0)
			goto bad;
		err = new_seq(ps, RS_PV_TUPLE, NULL, 0, &rest);
		return err ? err : push_call(ps, RS_PV_OBJECT, a[0], rest, NULL);
	}
	if (special == SP_NEWOBJ) {
		err = new_seq(ps, RS_PV_TUPLE, n > 1 ? a + 1 : NULL, n - 1, &rest);
		if (err)
			return err;
		if (rest->taint)
			return misuse(ps, rest->taint);
		return push_call(ps, RS_PV_OBJECT, a[0], rest, NULL);
	}
	if (n != 3 || a[1]->kind != RS_PV_TUPLE || a[2]->kind != RS_PV_DICT)
		goto bad;
	if (a[1]->taint)
		return misuse(ps, a[1]->taint);
	return push_call(ps, RS_PV_OBJECT, a[0], a[1], a[2]);
bad:
	return refuse_form(ps, func, false);
}

static int load_call(struct parser *ps, int op)
{
	rs_pvalue *func, *args, *kwargs = NULL;
	int err = 0;

	if (op == OP_NEWOBJ_EX)
		err = pop(ps, op, &kwargs);
	if (!err)
		err = pop(ps, op, &args);
	if (!err)
		err = pop(ps, op, &func);
	if (err)
		return err;
	if (args->kind != RS_PV_TUPLE)
		return fail(ps, -EINVAL, "%s: arguments are not a tuple",
			    opname(op));
	if (kwargs && kwargs->kind != RS_PV_DICT)
		return fail(ps, -EINVAL, "%s: keyword arguments are not a dict",
			    opname(op));
	if (func->kind == RS_PV_GLOBAL && op == OP_REDUCE &&
	    func->u.g.special == SP_GETATTR)
		return load_getattr(ps, func, args);
	if (func->kind == RS_PV_GLOBAL && op == OP_REDUCE &&
	    func->u.g.special && func->u.g.special != SP_OBJECT)
		return load_copyreg(ps, func, args);
	if (func->taint)
		return misuse(ps, func->taint);
	if (args->taint)
		return misuse(ps, args->taint);
	/* An attribute is data (an Enum member); calling one would reach
	 * methods the allowlist never named. */
	if (func->kind == RS_PV_GLOBAL && func->u.g.attr)
		return fail(ps, -EINVAL, "%s of getattr(%s.%.*s, '%s') is not read: a getattr result is not called",
			    opname(op), func->u.g.module,
			    (int)(func->u.g.attr - func->u.g.name - 1),
			    func->u.g.name, func->u.g.attr);
	return push_call(ps, op == OP_REDUCE ? RS_PV_REDUCE : RS_PV_OBJECT,
			 func, args, kwargs);
}

static int load_build(struct parser *ps)
{
	rs_pvalue *state, *obj;
	int err = pop(ps, OP_BUILD, &state);

	if (!err)
		err = top(ps, OP_BUILD, &obj);
	if (err)
		return err;
	if (state->taint)
		return misuse(ps, state->taint);
	if (obj->kind != RS_PV_REDUCE && obj->kind != RS_PV_OBJECT)
		return fail(ps, -EINVAL, "BUILD on a value that is not an object");
	if (obj->u.call.state)
		return fail(ps, -EINVAL, "BUILD on an object that has state");
	obj->u.call.state = state;
	return 0;
}

static int load_tuple_n(struct parser *ps, int op, size_t n)
{
	rs_pvalue *v;
	int err;

	if (ps->sp - base(ps) < n)
		return fail(ps, -EINVAL, "%s: stack underflow", opname(op));
	ps->sp -= n;
	/* The stack is NULL until the first push: NULL + 0 is undefined. */
	err = new_seq(ps, RS_PV_TUPLE, n ? ps->stack + ps->sp : NULL, n, &v);
	return err ? err : push(ps, v);
}

/* MARK-closing opcodes that build a new container. */
static int load_marked(struct parser *ps, int op, rs_pkind kind)
{
	rs_pvalue **items, *v;
	size_t n;
	int err = pop_mark(ps, op, &items, &n);

	if (err)
		return err;
	if (kind == RS_PV_DICT && n % 2)
		return fail(ps, -EINVAL, "%s: odd number of items", opname(op));
	err = new_seq(ps, kind, items, n, &v);
	return err ? err : push(ps, v);
}

static int push_persid(struct parser *ps, rs_pvalue *pid)
{
	rs_pvalue *v;
	int err;

	if (pid->taint)
		return misuse(ps, pid->taint);
	err = new_value(ps, RS_PV_PERSID, 0, &v);
	if (err)
		return err;
	v->u.pid = pid;
	return push(ps, v);
}

static int push_new(struct parser *ps, rs_pkind kind)
{
	rs_pvalue *v;
	int err = new_value(ps, kind, 0, &v);

	return err ? err : push(ps, v);
}

/* BYTEARRAY8 (protocol 5): the REDUCE(builtins.bytearray, (bytes,)) that
 * protocols 3 and 4 write for the same bytearray. */
static int load_bytearray(struct parser *ps)
{
	static const uint8_t mod[] = "builtins", name[] = "bytearray";
	rs_pvalue *bytes, *cls, *args;
	int err = load_blob(ps, OP_BYTEARRAY8, 8, false, RS_PV_BYTES);

	if (!err)
		err = pop(ps, OP_BYTEARRAY8, &bytes);
	if (!err)
		err = push_global(ps, mod, sizeof(mod) - 1, name, sizeof(name) - 1);
	if (!err)
		err = pop(ps, OP_BYTEARRAY8, &cls);
	if (!err)
		err = new_seq(ps, RS_PV_TUPLE, &bytes, 1, &args);
	return err ? err : push_call(ps, RS_PV_REDUCE, cls, args, NULL);
}

/* ---- the machine ------------------------------------------------------- */

/* One opcode; sets *done at STOP. */
static int step(struct parser *ps, int op, bool *done)
{
	const uint8_t *p, *q;
	size_t n, m;
	uint64_t u;
	rs_pvalue *v, *w, **items;
	int64_t i;
	int err;

	switch (op) {
	case OP_PROTO:
		err = take_le(ps, op, 1, &u);
		if (err)
			return err;
		if (u > 5)
			return fail(ps, -EINVAL, "unsupported protocol %llu",
				    (unsigned long long)u);
		ps->proto = (int)u;
		return 0;
	case OP_FRAME:
		/* Frames only batch reads; the length must still fit. */
		err = take_le(ps, op, 8, &u);
		if (!err && u > ps->len - ps->pos)
			err = fail(ps, -EINVAL, "FRAME: truncated (%llu bytes needed, %zu left)",
				   (unsigned long long)u, ps->len - ps->pos);
		return err;
	case OP_STOP:
		err = pop(ps, op, &v);
		if (err)
			return err;
		if (v->taint)
			return misuse(ps, v->taint);
		ps->p->root = v;
		*done = true;
		return 0;
	case OP_MARK:
		return mark(ps);
	case OP_POP:
		if (ps->sp > base(ps)) {
			ps->sp--;
			return 0;
		}
		if (ps->nmarks)
			return pop_mark(ps, op, &items, &n);
		return fail(ps, -EINVAL, "POP: stack underflow");
	case OP_POP_MARK:
		return pop_mark(ps, op, &items, &n);
	case OP_DUP:
		err = top(ps, op, &v);
		return err ? err : push(ps, v);
	case OP_NONE:
		return push(ps, &ps->p->none);
	case OP_NEWTRUE:
		return push(ps, &ps->p->yes);
	case OP_NEWFALSE:
		return push(ps, &ps->p->no);
	case OP_INT:
		err = take_line(ps, op, &p, &n);
		if (err)
			return err;
		/* Protocol 0 spells bools "I01" and "I00". */
		if (n == 2 && p[0] == '0' && (p[1] == '0' || p[1] == '1'))
			return push(ps, p[1] == '1' ? &ps->p->yes : &ps->p->no);
		err = parse_dec(ps, op, p, n, &i);
		return err ? err : push_int(ps, i);
	case OP_BININT:
		err = take_le(ps, op, 4, &u);
		return err ? err : push_int(ps, (int32_t)(uint32_t)u);
	case OP_BININT1:
		err = take_le(ps, op, 1, &u);
		return err ? err : push_int(ps, (int64_t)u);
	case OP_BININT2:
		err = take_le(ps, op, 2, &u);
		return err ? err : push_int(ps, (int64_t)u);
	case OP_LONG1:
		return load_long(ps, op, 1);
	case OP_LONG4:
		return load_long(ps, op, 4);
	case OP_BINFLOAT: {
		double d;

		err = take(ps, op, 8, &p);
		if (err)
			return err;
		/* Big-endian IEEE 754 binary64. */
		u = 0;
		for (int k = 0; k < 8; k++)
			u = u << 8 | p[k];
		memcpy(&d, &u, sizeof(d));
		err = new_value(ps, RS_PV_FLOAT, 0, &v);
		if (err)
			return err;
		v->u.f = d;
		return push(ps, v);
	}
	case OP_SHORT_BINUNICODE:
		return load_unicode(ps, op, 1);
	case OP_BINUNICODE:
		return load_unicode(ps, op, 4);
	case OP_BINUNICODE8:
		return load_unicode(ps, op, 8);
	case OP_SHORT_BINSTRING:
		return load_blob(ps, op, 1, false, RS_PV_STR);
	case OP_BINSTRING:
		return load_blob(ps, op, 4, true, RS_PV_STR);
	case OP_SHORT_BINBYTES:
		return load_blob(ps, op, 1, false, RS_PV_BYTES);
	case OP_BINBYTES:
		return load_blob(ps, op, 4, false, RS_PV_BYTES);
	case OP_BINBYTES8:
		return load_blob(ps, op, 8, false, RS_PV_BYTES);
	case OP_BYTEARRAY8:
		return load_bytearray(ps);
	case OP_NEXT_BUFFER:
	case OP_READONLY_BUFFER:
		/* Their buffers travel beside the pickle (buffer_callback);
		 * a file holds none. */
		return fail(ps, -EINVAL, "%s: out-of-band buffers (pickle protocol 5) cannot be read from a file",
			    opname(op));
	case OP_EMPTY_TUPLE:
		return load_tuple_n(ps, op, 0);
	case OP_TUPLE1:
		return load_tuple_n(ps, op, 1);
	case OP_TUPLE2:
		return load_tuple_n(ps, op, 2);
	case OP_TUPLE3:
		return load_tuple_n(ps, op, 3);
	case OP_TUPLE:
		return load_marked(ps, op, RS_PV_TUPLE);
	case OP_LIST:
		return load_marked(ps, op, RS_PV_LIST);
	case OP_DICT:
		return load_marked(ps, op, RS_PV_DICT);
	case OP_FROZENSET:
		return load_marked(ps, op, RS_PV_SET);
	case OP_EMPTY_LIST:
		return push_new(ps, RS_PV_LIST);
	case OP_EMPTY_DICT:
		return push_new(ps, RS_PV_DICT);
	case OP_EMPTY_SET:
		return push_new(ps, RS_PV_SET);
	case OP_APPEND:
		err = pop(ps, op, &v);
		return err ? err : add_items(ps, op, RS_PV_LIST, &v, 1);
	case OP_SETITEM: {
		rs_pvalue *kv[2];

		err = pop(ps, op, &kv[1]);
		if (!err)
			err = pop(ps, op, &kv[0]);
		return err ? err : add_items(ps, op, RS_PV_DICT, kv, 2);
	}
	case OP_APPENDS:
	case OP_SETITEMS:
	case OP_ADDITEMS:
		err = pop_mark(ps, op, &items, &n);
		if (err)
			return err;
		/* add_items reads only below the old mark, which the popped
		 * items still sit above: they are intact. */
		return add_items(ps, op, op == OP_APPENDS ? RS_PV_LIST :
				 op == OP_SETITEMS ? RS_PV_DICT : RS_PV_SET,
				 items, n);
	case OP_GLOBAL:
		err = take_line(ps, op, &p, &n);
		if (!err)
			err = take_line(ps, op, &q, &m);
		return err ? err : push_global(ps, p, n, q, m);
	case OP_STACK_GLOBAL:
		err = pop(ps, op, &w);
		if (!err)
			err = pop(ps, op, &v);
		if (!err)
			err = check_name(ps, v);
		if (!err)
			err = check_name(ps, w);
		if (err)
			return err;
		return push_global(ps, (const uint8_t *)v->u.s.p, v->u.s.n,
				   (const uint8_t *)w->u.s.p, w->u.s.n);
	case OP_REDUCE:
	case OP_NEWOBJ:
	case OP_NEWOBJ_EX:
		return load_call(ps, op);
	case OP_BUILD:
		return load_build(ps);
	case OP_BINPERSID:
		err = pop(ps, op, &w);
		/* torch.load's persistent_load takes a tuple: anything else
		 * makes it raise, so it is no storage here either. */
		if (!err && ps->lim->torch_persids && w->kind != RS_PV_TUPLE)
			return fail(ps, -EINVAL, "BINPERSID: a persistent id that is not a tuple (torch.load would raise)");
		return err ? err : push_persid(ps, w);
	case OP_PERSID:
		if (ps->lim->torch_persids)
			return fail(ps, -EINVAL, "PERSID: a text persistent id (torch.load would raise)");
		err = take_line(ps, op, &p, &n);
		if (!err)
			err = new_blob(ps, RS_PV_STR, p, n, &w);
		return err ? err : push_persid(ps, w);
	case OP_BINPUT:
		err = take_le(ps, op, 1, &u);
		return err ? err : memo_put(ps, op, u);
	case OP_LONG_BINPUT:
		err = take_le(ps, op, 4, &u);
		return err ? err : memo_put(ps, op, u);
	case OP_PUT:
		err = take_index(ps, op, &u);
		return err ? err : memo_put(ps, op, u);
	case OP_MEMOIZE:
		return memo_put(ps, op, ps->memo.n);
	case OP_BINGET:
		err = take_le(ps, op, 1, &u);
		return err ? err : memo_get(ps, op, u);
	case OP_LONG_BINGET:
		err = take_le(ps, op, 4, &u);
		return err ? err : memo_get(ps, op, u);
	case OP_GET:
		err = take_index(ps, op, &u);
		return err ? err : memo_get(ps, op, u);
	}
	if (opname(op))
		return fail(ps, -EINVAL, "unsupported opcode %s", opname(op));
	if (op >= 0x20 && op < 0x7f)
		return fail(ps, -EINVAL, "unsupported opcode 0x%02x ('%c')", op,
			    op);
	return fail(ps, -EINVAL, "unsupported opcode 0x%02x", op);
}

int rs_pickle_parse(const uint8_t *buf, size_t len,
		    const rs_pickle_limits *lim, rs_pickle **out, char *err,
		    size_t errlen)
{
	struct parser ps = {
		.buf = buf, .len = len, .lim = lim ? lim : &defaults,
		.err = err, .errlen = errlen,
	};
	uint64_t nops = 0;
	bool done = false;
	int rc;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (len > ps.lim->max_input) {
		rc = fail(&ps, -E2BIG, "pickle of %zu bytes is over %llu",
			  len, (unsigned long long)ps.lim->max_input);
		goto cleanup;
	}
	ps.p = calloc(1, sizeof(*ps.p));
	if (!ps.p) {
		rc = oom(&ps);
		goto cleanup;
	}
	ps.p->none.kind = RS_PV_NONE;
	ps.p->yes.kind = RS_PV_BOOL;
	ps.p->yes.u.b = true;
	ps.p->no.kind = RS_PV_BOOL;
	while (!done) {
		ps.at = ps.pos;
		if (ps.pos >= len) {
			rc = fail(&ps, -EINVAL, "truncated (no STOP)");
			goto cleanup;
		}
		if (++nops > ps.lim->max_ops) {
			rc = fail(&ps, -E2BIG, "over %llu opcodes",
				  (unsigned long long)ps.lim->max_ops);
			goto cleanup;
		}
		rc = step(&ps, buf[ps.pos++], &done);
		if (rc)
			goto cleanup;
	}
	*out = ps.p;
	ps.p = NULL;
cleanup:
	free(ps.memo.vals);
	free(ps.memo.keys);
	free(ps.marks);
	free(ps.stack);
	rs_pickle_free(ps.p);
	return rc;
}

void rs_pickle_free(rs_pickle *p)
{
	rs_pvalue *v, *next;

	if (!p)
		return;
	for (v = p->all; v; v = next) {
		next = v->next;
		if (is_seq(v->kind))
			free(v->u.seq.v);
		free(v);
	}
	free(p);
}

const rs_pvalue *rs_pickle_root(const rs_pickle *p)
{
	return p ? p->root : NULL;
}

/* Compares "module.name" with a pattern without building the string. */
static bool match(const char *pat, const char *mod, const char *name)
{
	size_t plen = strlen(pat), mlen = strlen(mod), nlen = strlen(name);
	bool star = plen && pat[plen - 1] == '*';
	size_t want = star ? plen - 1 : plen, full = mlen + 1 + nlen;

	if (star ? full < want : full != want)
		return false;
	if (want <= mlen)
		return memcmp(pat, mod, want) == 0;
	return memcmp(pat, mod, mlen) == 0 && pat[mlen] == '.' &&
	       memcmp(pat + mlen + 1, name, want - mlen - 1) == 0;
}

bool rs_pickle_allowed(const char *const *allow, const char *module,
		       const char *name)
{
	for (; allow && *allow; allow++)
		if (match(*allow, module, name))
			return true;
	return false;
}

/* ---- accessors --------------------------------------------------------- */

rs_pkind rs_pv_kind(const rs_pvalue *v)
{
	return v ? v->kind : 0;
}

int rs_pv_bool(const rs_pvalue *v, bool *out)
{
	if (rs_pv_kind(v) != RS_PV_BOOL)
		return -EINVAL;
	*out = v->u.b;
	return 0;
}

int rs_pv_int(const rs_pvalue *v, int64_t *out)
{
	if (rs_pv_kind(v) != RS_PV_INT)
		return -EINVAL;
	*out = v->u.i;
	return 0;
}

int rs_pv_float(const rs_pvalue *v, double *out)
{
	if (rs_pv_kind(v) == RS_PV_INT)
		*out = (double)v->u.i;
	else if (rs_pv_kind(v) == RS_PV_FLOAT)
		*out = v->u.f;
	else
		return -EINVAL;
	return 0;
}

const char *rs_pv_str(const rs_pvalue *v, size_t *len)
{
	if (rs_pv_kind(v) != RS_PV_STR)
		return NULL;
	if (len)
		*len = v->u.s.n;
	return v->u.s.p;
}

const uint8_t *rs_pv_bytes(const rs_pvalue *v, size_t *len)
{
	if (rs_pv_kind(v) != RS_PV_BYTES && rs_pv_kind(v) != RS_PV_BIGINT)
		return NULL;
	if (len)
		*len = v->u.s.n;
	return (const uint8_t *)v->u.s.p;
}

bool rs_pv_str_is(const rs_pvalue *v, const char *s)
{
	size_t n = strlen(s);

	return rs_pv_kind(v) == RS_PV_STR && v->u.s.n == n &&
	       memcmp(v->u.s.p, s, n) == 0;
}

const char *rs_pv_text(const rs_pvalue *v, char *buf, size_t size)
{
	const char *s;
	size_t len;
	int64_t i;
	double f;
	bool b;

	if (!v) {
		snprintf(buf, size, "missing");
		return buf;
	}
	switch (v->kind) {
	case RS_PV_INT:
		rs_pv_int(v, &i);
		snprintf(buf, size, "%lld", (long long)i);
		break;
	case RS_PV_BIGINT:
		snprintf(buf, size, "an int wider than 64 bits");
		break;
	case RS_PV_FLOAT:
		rs_pv_float(v, &f);
		/* 15 digits when they read back as f, else all 17 */
		snprintf(buf, size, "%.15g", f);
		if (strtod(buf, NULL) != f && f == f)
			snprintf(buf, size, "%.17g", f);
		snprintf(buf + strlen(buf), size - strlen(buf), " (a float)");
		break;
	case RS_PV_BOOL:
		rs_pv_bool(v, &b);
		snprintf(buf, size, "%s (a bool)", b ? "True" : "False");
		break;
	case RS_PV_STR:
		s = rs_pv_str(v, &len);
		snprintf(buf, size, "'%.40s%s' (a str)", s, len > 40 ? "..." : "");
		break;
	case RS_PV_NONE:
		snprintf(buf, size, "None");
		break;
	default:
		snprintf(buf, size, "a value of another type");
		break;
	}
	return buf;
}

size_t rs_pv_len(const rs_pvalue *v)
{
	if (!v || !is_seq(v->kind))
		return 0;
	return v->kind == RS_PV_DICT ? v->u.seq.n / 2 : v->u.seq.n;
}

const rs_pvalue *rs_pv_item(const rs_pvalue *v, size_t i)
{
	if (!v || !is_seq(v->kind) || v->kind == RS_PV_DICT ||
	    i >= v->u.seq.n)
		return NULL;
	return v->u.seq.v[i];
}

const rs_pvalue *rs_pv_key(const rs_pvalue *dict, size_t i)
{
	if (rs_pv_kind(dict) != RS_PV_DICT || i >= dict->u.seq.n / 2)
		return NULL;
	return dict->u.seq.v[2 * i];
}

const rs_pvalue *rs_pv_val(const rs_pvalue *dict, size_t i)
{
	if (rs_pv_kind(dict) != RS_PV_DICT || i >= dict->u.seq.n / 2)
		return NULL;
	return dict->u.seq.v[2 * i + 1];
}

const rs_pvalue *rs_pv_get(const rs_pvalue *dict, const char *key)
{
	if (rs_pv_kind(dict) != RS_PV_DICT)
		return NULL;
	for (size_t i = dict->u.seq.n / 2; i-- > 0;)
		if (rs_pv_str_is(dict->u.seq.v[2 * i], key))
			return dict->u.seq.v[2 * i + 1];
	return NULL;
}

const char *rs_pv_global_module(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_GLOBAL ? v->u.g.module : NULL;
}

const char *rs_pv_global_name(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_GLOBAL ? v->u.g.name : NULL;
}

const char *rs_pv_global_attr(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_GLOBAL ? v->u.g.attr : NULL;
}

bool rs_pv_global_is(const rs_pvalue *v, const char *full)
{
	return rs_pv_kind(v) == RS_PV_GLOBAL && strchr(full, '*') == NULL &&
	       match(full, v->u.g.module, v->u.g.name);
}

static bool is_call(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_REDUCE || rs_pv_kind(v) == RS_PV_OBJECT;
}

const rs_pvalue *rs_pv_func(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.func : NULL;
}

const rs_pvalue *rs_pv_args(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.args : NULL;
}

const rs_pvalue *rs_pv_kwargs(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.kwargs : NULL;
}

const rs_pvalue *rs_pv_state(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.state : NULL;
}

const rs_pvalue *rs_pv_listitems(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.list : NULL;
}

const rs_pvalue *rs_pv_dictitems(const rs_pvalue *v)
{
	return is_call(v) ? v->u.call.dict : NULL;
}

bool rs_pv_dict_like(const rs_pvalue *v, const rs_pvalue **pairs)
{
	if (rs_pv_kind(v) == RS_PV_DICT) {
		*pairs = v;
		return true;
	}
	if (rs_pv_call_is(v, "collections.OrderedDict")) {
		*pairs = rs_pv_dictitems(v);   /* a DICT, or NULL: empty */
		return true;
	}
	return false;
}

bool rs_pv_call_is(const rs_pvalue *v, const char *full)
{
	return rs_pv_global_is(rs_pv_func(v), full);
}

bool rs_pv_u64(const rs_pvalue *v, uint64_t *out)
{
	int64_t i;

	if (rs_pv_int(v, &i) != 0 || i < 0)
		return false;
	*out = (uint64_t)i;
	return true;
}

bool rs_pv_dims(const rs_pvalue *v, uint64_t *out, int *n, int max)
{
	const rs_pvalue *t = v;

	if (rs_pv_kind(v) == RS_PV_REDUCE) {
		if (!rs_pv_call_is(v, "torch.Size"))
			return false;
		t = rs_pv_item(rs_pv_args(v), 0);
	}
	if (rs_pv_kind(t) != RS_PV_TUPLE && rs_pv_kind(t) != RS_PV_LIST)
		return false;
	if (rs_pv_len(t) > (size_t)max)
		return false;
	*n = (int)rs_pv_len(t);
	for (int i = 0; i < *n; i++)
		if (!rs_pv_u64(rs_pv_item(t, (size_t)i), &out[i]))
			return false;
	return true;
}

const rs_pvalue *rs_pv_persid(const rs_pvalue *v)
{
	return rs_pv_kind(v) == RS_PV_PERSID ? v->u.pid : NULL;
}
