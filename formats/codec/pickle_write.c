/* pickle writer (see pickle.h).
 *
 * Only opcodes that torch's weights_only unpickler implements are emitted
 * (torch.load reads data.pkl with it by default since 2.6): BININT*,
 * LONG1 (and LONG4 for integers of 256 bytes or more, as Python writes
 * them), BINFLOAT, BINUNICODE, NONE, NEWTRUE/NEWFALSE, the TUPLE family,
 * EMPTY_LIST + APPENDS, EMPTY_DICT + SETITEMS, GLOBAL, REDUCE, NEWOBJ,
 * BUILD, BINPERSID.  Bytes are the exception: it has no BINBYTES, so under
 * protocol 2 they are written the way Python's pickler writes them.
 */
#include "formats/codec/pickle.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum {
	MARK = '(', STOP = '.', BININT = 'J', BININT1 = 'K', BININT2 = 'M',
	NONE = 'N', BINPERSID = 'Q', REDUCE = 'R', BINUNICODE = 'X',
	BINBYTES = 'B', SHORT_BINBYTES = 'C', BUILD = 'b', GLOBAL = 'c',
	EMPTY_DICT = '}', APPENDS = 'e', EMPTY_LIST = ']', TUPLE = 't',
	EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G', PROTO = 0x80,
	NEWOBJ = 0x81, TUPLE1 = 0x85, NEWTRUE = 0x88, NEWFALSE = 0x89,
	LONG1 = 0x8a, LONG4 = 0x8b,
};

/* What a MARK opened, kept in the low bits of w->marks[i]. */
enum { M_TUPLE, M_LIST, M_DICT, M_BITS = 2 };

static void set_err(rs_pwriter *w, int err)
{
	if (!w->err)
		w->err = err;
}

static void emit(rs_pwriter *w, const void *p, size_t n)
{
	if (w->err)
		return;
	if (n > SIZE_MAX - w->len) {
		set_err(w, -E2BIG);
		return;
	}
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : 256;
		uint8_t *nb;

		while (cap < w->len + n)
			cap = cap > SIZE_MAX / 2 ? w->len + n : cap * 2;
		nb = realloc(w->buf, cap);
		if (!nb) {
			set_err(w, -ENOMEM);
			return;
		}
		w->buf = nb;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
}

static void emit1(rs_pwriter *w, uint8_t b)
{
	emit(w, &b, 1);
}

static void emit_le(rs_pwriter *w, uint64_t v, int n)
{
	uint8_t b[8];

	for (int i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	emit(w, b, n);
}

/* Lowest stack position the next opcode may consume. */
static size_t floor_(const rs_pwriter *w)
{
	return w->nmarks ? w->marks[w->nmarks - 1] >> M_BITS : 0;
}

/* An opcode that pops `in` values and pushes `out`. */
static bool op(rs_pwriter *w, uint8_t code, size_t in, size_t out)
{
	if (w->err)
		return false;
	if (w->depth - floor_(w) < in) {
		set_err(w, -EINVAL);
		return false;
	}
	emit1(w, code);
	w->depth = w->depth - in + out;
	return !w->err;
}

void rs_pw_init(rs_pwriter *w, int proto)
{
	memset(w, 0, sizeof(*w));
	w->proto = proto;
	if (proto < 2 || proto > 4) {
		w->err = -EINVAL;
		return;
	}
	emit1(w, PROTO);
	emit1(w, (uint8_t)proto);
}

void rs_pw_free(rs_pwriter *w)
{
	free(w->buf);
	free(w->marks);
	memset(w, 0, sizeof(*w));
}

void rs_pw_none(rs_pwriter *w)
{
	op(w, NONE, 0, 1);
}

void rs_pw_bool(rs_pwriter *w, bool b)
{
	op(w, b ? NEWTRUE : NEWFALSE, 0, 1);
}

void rs_pw_int(rs_pwriter *w, int64_t v)
{
	uint8_t b[8];
	int n = 8;

	if (v >= 0 && v <= 0xff) {
		if (op(w, BININT1, 0, 1))
			emit_le(w, (uint64_t)v, 1);
		return;
	}
	if (v >= 0 && v <= 0xffff) {
		if (op(w, BININT2, 0, 1))
			emit_le(w, (uint64_t)v, 2);
		return;
	}
	if (v >= INT32_MIN && v <= INT32_MAX) {
		if (op(w, BININT, 0, 1))
			emit_le(w, (uint64_t)v, 4);
		return;
	}
	/* LONG1: the shortest little-endian two's complement. */
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)v >> (8 * i));
	while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) ||
			 (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
		n--;
	if (op(w, LONG1, 0, 1)) {
		emit1(w, (uint8_t)n);
		emit(w, b, n);
	}
}

void rs_pw_float(rs_pwriter *w, double v)
{
	uint8_t b[8];
	uint64_t u;

	memcpy(&u, &v, sizeof(u));
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(u >> (56 - 8 * i));	/* big-endian */
	if (op(w, BINFLOAT, 0, 1))
		emit(w, b, 8);
}

void rs_pw_str(rs_pwriter *w, const char *s, size_t len)
{
	if (len > UINT32_MAX) {
		set_err(w, -E2BIG);
		return;
	}
	if (op(w, BINUNICODE, 0, 1)) {
		emit_le(w, len, 4);
		emit(w, s, len);
	}
}

void rs_pw_cstr(rs_pwriter *w, const char *s)
{
	rs_pw_str(w, s, strlen(s));
}

/* Protocol 2 has no bytes opcode: Python writes
 * _codecs.encode('<each byte as a code point>', 'latin1'). */
static void bytes_as_latin1(rs_pwriter *w, const uint8_t *p, size_t len)
{
	size_t n = 0;

	if (len > UINT32_MAX / 2) {
		set_err(w, -E2BIG);
		return;
	}
	for (size_t i = 0; i < len; i++)
		n += p[i] < 0x80 ? 1 : 2;
	rs_pw_global(w, "_codecs", "encode");
	if (!op(w, BINUNICODE, 0, 1))
		return;
	emit_le(w, n, 4);
	for (size_t i = 0; i < len; i++) {
		if (p[i] < 0x80) {
			emit1(w, p[i]);
		} else {
			emit1(w, (uint8_t)(0xc0 | p[i] >> 6));
			emit1(w, (uint8_t)(0x80 | (p[i] & 0x3f)));
		}
	}
	rs_pw_cstr(w, "latin1");
	rs_pw_tuple_n(w, 2);
	rs_pw_reduce(w);
}

void rs_pw_bytes(rs_pwriter *w, const void *p, size_t len)
{
	if (w->proto < 3) {
		bytes_as_latin1(w, p, len);
		return;
	}
	if (len > UINT32_MAX) {
		set_err(w, -E2BIG);
		return;
	}
	if (len < 256) {
		if (op(w, SHORT_BINBYTES, 0, 1))
			emit1(w, (uint8_t)len);
	} else if (op(w, BINBYTES, 0, 1)) {
		emit_le(w, len, 4);
	}
	emit(w, p, len);
}

void rs_pw_global(rs_pwriter *w, const char *module, const char *name)
{
	/* GLOBAL's arguments are lines. */
	if (!*module || !*name || strchr(module, '\n') || strchr(name, '\n')) {
		set_err(w, -EINVAL);
		return;
	}
	if (!op(w, GLOBAL, 0, 1))
		return;
	emit(w, module, strlen(module));
	emit1(w, '\n');
	emit(w, name, strlen(name));
	emit1(w, '\n');
}

static void open_mark(rs_pwriter *w, int kind)
{
	if (w->err)
		return;
	if (w->nmarks == w->cmarks) {
		size_t cap = w->cmarks ? w->cmarks * 2 : 8;
		size_t *nm = realloc(w->marks, cap * sizeof(*nm));

		if (!nm) {
			set_err(w, -ENOMEM);
			return;
		}
		w->marks = nm;
		w->cmarks = cap;
	}
	if (w->depth > SIZE_MAX >> M_BITS) {
		set_err(w, -E2BIG);
		return;
	}
	emit1(w, MARK);
	w->marks[w->nmarks++] = w->depth << M_BITS | (size_t)kind;
}

/* Closes a MARK of `kind`; returns the number of items above it, or
 * SIZE_MAX after an error. */
static size_t close_mark(rs_pwriter *w, int kind)
{
	size_t m;

	if (w->err)
		return SIZE_MAX;
	if (!w->nmarks || (w->marks[w->nmarks - 1] & ((1u << M_BITS) - 1)) !=
				  (size_t)kind) {
		set_err(w, -EINVAL);
		return SIZE_MAX;
	}
	m = w->marks[--w->nmarks] >> M_BITS;
	return w->depth - m;
}

void rs_pw_tuple_begin(rs_pwriter *w)
{
	open_mark(w, M_TUPLE);
}

void rs_pw_tuple_end(rs_pwriter *w)
{
	size_t n = close_mark(w, M_TUPLE);

	if (n != SIZE_MAX)
		op(w, TUPLE, n, 1);
}

void rs_pw_tuple_n(rs_pwriter *w, int n)
{
	if (n < 0 || n > 3) {
		set_err(w, -EINVAL);
		return;
	}
	op(w, n ? TUPLE1 + n - 1 : EMPTY_TUPLE, (size_t)n, 1);
}

void rs_pw_list_begin(rs_pwriter *w)
{
	if (op(w, EMPTY_LIST, 0, 1))
		open_mark(w, M_LIST);
}

void rs_pw_list_end(rs_pwriter *w)
{
	size_t n = close_mark(w, M_LIST);

	if (n != SIZE_MAX)
		op(w, APPENDS, n, 0);
}

void rs_pw_dict_begin(rs_pwriter *w)
{
	if (op(w, EMPTY_DICT, 0, 1))
		open_mark(w, M_DICT);
}

void rs_pw_dict_end(rs_pwriter *w)
{
	size_t n = close_mark(w, M_DICT);

	if (n == SIZE_MAX)
		return;
	if (n % 2)
		set_err(w, -EINVAL);
	else
		op(w, SETITEMS, n, 0);
}

/* A MARK over an object already on the stack, closed by the list or dict
 * _end: the object is below the mark, where APPENDS/SETITEMS find it. */
static void items_begin(rs_pwriter *w, int kind)
{
	if (!w->err && w->depth <= floor_(w)) {
		set_err(w, -EINVAL);
		return;
	}
	open_mark(w, kind);
}

void rs_pw_appends_begin(rs_pwriter *w)
{
	items_begin(w, M_LIST);
}

void rs_pw_setitems_begin(rs_pwriter *w)
{
	items_begin(w, M_DICT);
}

void rs_pw_bigint(rs_pwriter *w, const uint8_t *le, size_t len)
{
	if (len > UINT32_MAX) {
		set_err(w, -E2BIG);
		return;
	}
	if (len < 256) {
		if (op(w, LONG1, 0, 1))
			emit1(w, (uint8_t)len);
	} else if (op(w, LONG4, 0, 1)) {
		emit_le(w, len, 4);
	}
	emit(w, le, len);
}

void rs_pw_reduce(rs_pwriter *w)
{
	op(w, REDUCE, 2, 1);
}

void rs_pw_newobj(rs_pwriter *w)
{
	op(w, NEWOBJ, 2, 1);
}

void rs_pw_build(rs_pwriter *w)
{
	op(w, BUILD, 2, 1);
}

void rs_pw_persid(rs_pwriter *w)
{
	op(w, BINPERSID, 1, 1);
}

int rs_pw_finish(rs_pwriter *w, uint8_t **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	if (!w->err && (w->nmarks || w->depth != 1))
		set_err(w, -EINVAL);
	op(w, STOP, 1, 0);
	if (w->err) {
		int err = w->err;

		rs_pw_free(w);
		return err;
	}
	*out = w->buf;
	*len = w->len;
	w->buf = NULL;
	rs_pw_free(w);
	return 0;
}
