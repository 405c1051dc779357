/* Unit tests of rs_pw_value (formats/codec/pickle.h): parsed values written back.
 *
 * Python pickles a varied object (protocol 2, as torch.save; and 4); our
 * reader parses it, rs_pw_value writes it again, and Python must unpickle
 * an equal object.  Then the refusals: a GLOBAL the copy's allowlist lacks,
 * a persistent id, a value that holds itself, and a small pickle whose
 * shared values would be written out exponentially often.  The Python
 * parts are skipped without python3.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/codec/pickle.h"
#include "tests/unit/check.h"

static const char *const allow[] = {
	"collections.OrderedDict", "argparse.Namespace", "builtins.set",
	"builtins.frozenset", "_codecs.encode", "copyreg._reconstructor",
	"builtins.object", "enum_mod.*", NULL,
};

/* The object both sides build; `enum_mod` is defined inline. */
static const char py_object[] =
	"import argparse, collections, enum, sys, types\n"
	"m = types.ModuleType('enum_mod'); sys.modules['enum_mod'] = m\n"
	"class Color(enum.Enum):\n"
	"    red = 1\n"
	"    blue = 2\n"
	"Color.__module__ = 'enum_mod'; m.Color = Color\n"
	"ns = argparse.Namespace(tensor_model_parallel_size=2, lr=3e-4,\n"
	"    name='gpt', flags=[True, False, None], color=Color.red,\n"
	"    shape=(1, (2, 3)), big=2**100, neg=-2**70, huge=-2**2039,\n"
	"    raw=b'\\x00\\xff\\x80abc', s={1, 2, 3})\n"
	"od = collections.OrderedDict(a=1, b=[1.5, -0.0, 1e300])\n"
	"shared = [7, 8]\n"
	"obj = {'args': ns, 'od': od, 'x': shared, 'y': shared, 'e': {},\n"
	"       'u': '\\u00e9\\U0001f600', 'ints': [0, 255, 256, 65535, 65536,\n"
	"       -1, 2**31 - 1, -2**31, 2**31, 2**63 - 1, -2**63]}\n";

static int run(const char *cmd, char *out, size_t size)
{
	FILE *f = popen(cmd, "r");
	size_t got = 0;

	if (!f)
		return -1;
	got = fread(out, 1, size - 1, f);
	out[got] = 0;
	return pclose(f);
}

static bool have_python(void)
{
	return system("command -v python3 >/dev/null 2>&1") == 0;
}

/* Runs python3 on `body` (after the object's definition) with args. */
static int python(const char *body, const char *args, char *out, size_t size)
{
	char script[64], cmd[512];
	FILE *f;
	int rc;

	snprintf(script, sizeof(script), "/tmp/rs_pcopy_%d.py", (int)getpid());
	f = fopen(script, "w");
	if (!f)
		return -1;
	fprintf(f, "%s%s", py_object, body);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "python3 %s %s", script, args);
	rc = run(cmd, out, size);
	unlink(script);
	return rc;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = malloc(1 << 20);

	*len = f && buf ? fread(buf, 1, 1 << 20, f) : 0;
	if (f)
		fclose(f);
	return buf;
}

static void test_round_trip(int proto)
{
	char in[] = "/tmp/rs_pcopy_in_XXXXXX", outp[] = "/tmp/rs_pcopy_out_XXXXXX";
	char body[200], args[100], out[256], err[200];
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	uint8_t *buf, *copy = NULL;
	size_t len, clen;
	rs_pwriter w;
	FILE *f;
	int fd;

	fd = mkstemp(in);
	close(fd);
	fd = mkstemp(outp);
	close(fd);
	snprintf(body, sizeof(body),
		 "open(sys.argv[1], 'wb').write(__import__('pickle').dumps(obj, protocol=%d))\n",
		 proto);
	CHECK(python(body, in, out, sizeof(out)) == 0);
	buf = slurp(in, &len);
	rs_pickle_limits_default(&lim);
	lim.allow = allow;
	CHECK(rs_pickle_parse(buf, len, &lim, &pk, err, sizeof(err)) == 0);
	rs_pw_init(&w, 2);
	CHECK(rs_pw_value(&w, rs_pickle_root(pk), allow, NULL, err, sizeof(err)) == 0);
	if (err[0])
		fprintf(stderr, "protocol %d: %s\n", proto, err);
	CHECK(rs_pw_finish(&w, &copy, &clen) == 0);
	f = fopen(outp, "wb");
	CHECK(f && fwrite(copy, 1, clen, f) == clen);
	if (f)
		fclose(f);
	/* Equal, the Namespace's fields included. */
	snprintf(args, sizeof(args), "%s %s", in, outp);
	CHECK(python("import pickle\n"
		     "a = pickle.load(open(sys.argv[1], 'rb'))\n"
		     "b = pickle.load(open(sys.argv[2], 'rb'))\n"
		     "print('same' if a == b and vars(a['args']) == vars(b['args']) else 'differ')\n",
		     args, out, sizeof(out)) == 0);
	CHECK(strcmp(out, "same\n") == 0);
	if (strcmp(out, "same\n") != 0)
		fprintf(stderr, "protocol %d: python printed %s\n", proto, out);
	free(copy);
	free(buf);
	rs_pickle_free(pk);
	unlink(in);
	unlink(outp);
}

/* Parses hand-made pickle bytes with `allow`. */
static rs_pickle *parse(const char *bytes, size_t len)
{
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	char err[200];

	rs_pickle_limits_default(&lim);
	lim.allow = (const char *const[]){ "os.system", "builtins.set", NULL };
	CHECK(rs_pickle_parse((const uint8_t *)bytes, len, &lim, &pk, err,
			      sizeof(err)) == 0);
	return pk;
}

static int copy_of(const rs_pickle *pk, char *err, size_t errlen)
{
	rs_pwriter w;
	uint8_t *out = NULL;
	size_t len;
	int e;

	rs_pw_init(&w, 2);
	e = rs_pw_value(&w, rs_pickle_root(pk), allow, NULL, err, errlen);
	if (!e)
		e = rs_pw_finish(&w, &out, &len);
	rs_pw_free(&w);
	free(out);
	return e;
}

static void test_refusals(void)
{
	char err[200];
	rs_pickle *pk;

	/* a GLOBAL the copy does not allow */
	static const char g[] = "\x80\x02" "cos\nsystem\n" ".";
	pk = parse(g, sizeof(g) - 1);
	CHECK(copy_of(pk, err, sizeof(err)) == -EINVAL);
	CHECK(strstr(err, "GLOBAL os.system is not allowed") != NULL);
	rs_pickle_free(pk);

	/* a persistent id */
	static const char pid[] = "\x80\x02" "K\x01" "Q" ".";
	pk = parse(pid, sizeof(pid) - 1);
	CHECK(copy_of(pk, err, sizeof(err)) == -EINVAL);
	CHECK(strstr(err, "persistent id") != NULL);
	rs_pickle_free(pk);

	/* l = []; l.append(l): nesting is bounded */
	static const char self[] = "\x80\x02" "]q\x00" "h\x00" "a" ".";
	pk = parse(self, sizeof(self) - 1);
	CHECK(copy_of(pk, err, sizeof(err)) == -E2BIG);
	CHECK(strstr(err, "nested deeper") != NULL);
	rs_pickle_free(pk);

	/* t = (0,); 40 times t = (t, t): 2^40 values to write out */
	char dag[400];
	size_t n = 0;

	memcpy(dag, "\x80\x02" "K\x00" "\x85" "q\x00" "0", 7);
	n = 7;
	for (int i = 0; i < 40; i++, n += 8)
		memcpy(dag + n, "h\x00" "h\x00" "\x86" "q\x00" "0", 8);
	memcpy(dag + n, "h\x00" ".", 3);
	n += 3;
	pk = parse(dag, n);
	CHECK(copy_of(pk, err, sizeof(err)) == -E2BIG);
	rs_pickle_free(pk);
}

/* rs_pw_bigint and the items-on-an-object calls, read back. */
static void test_writer_calls(void)
{
	static const uint8_t big[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 0x80 };
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	const rs_pvalue *root;
	uint8_t *buf = NULL;
	const uint8_t *b;
	size_t len, blen;
	char err[200];
	rs_pwriter w;

	rs_pw_init(&w, 2);
	rs_pw_list_begin(&w);
	rs_pw_bigint(&w, big, sizeof(big));
	rs_pw_global(&w, "collections", "OrderedDict");
	rs_pw_tuple_n(&w, 0);
	rs_pw_reduce(&w);
	rs_pw_setitems_begin(&w);
	rs_pw_cstr(&w, "k");
	rs_pw_int(&w, 5);
	rs_pw_dict_end(&w);
	rs_pw_list_end(&w);
	CHECK(rs_pw_finish(&w, &buf, &len) == 0);
	rs_pickle_limits_default(&lim);
	lim.allow = allow;
	CHECK(rs_pickle_parse(buf, len, &lim, &pk, err, sizeof(err)) == 0);
	root = rs_pickle_root(pk);
	b = rs_pv_bytes(rs_pv_item(root, 0), &blen);
	CHECK(rs_pv_kind(rs_pv_item(root, 0)) == RS_PV_BIGINT && blen == 9 &&
	      b && memcmp(b, big, 9) == 0);
	CHECK(rs_pv_get(rs_pv_dictitems(rs_pv_item(root, 1)), "k") != NULL);
	rs_pickle_free(pk);
	free(buf);

	/* SETITEMS with nothing to add to is unbalanced use */
	rs_pw_init(&w, 2);
	rs_pw_setitems_begin(&w);
	CHECK(rs_pw_finish(&w, &buf, &len) == -EINVAL);
}

/* Python 3.11.2's pickle.dumps([Color.red, Color.blue], protocol=2):
 * getattr(Color, 'red'), getattr(Color, 'blue'). */
static const char enum_getattr[] =
	"\x80\x02]q\x00(c__builtin__\ngetattr\nq\x01" "cenum_mod\nColor\nq\x02"
	"X\x03\x00\x00\x00redq\x03\x86q\x04Rq\x05h\x01h\x02X\x04\x00\x00\x00"
	"blueq\x06\x86q\x07Rq\x08" "e.";

/* Copies enum_getattr with `members`; 0 or the error.  *has_getattr: the
 * copy still names builtins.getattr. */
static int copy_enum(const rs_pw_member *members, const char *const *allow_copy,
		     bool *has_getattr, char *err, size_t errlen)
{
	char path[] = "/tmp/rs_pcopy_enum_XXXXXX", out[64];
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	rs_pwriter w;
	int e, fd;

	rs_pickle_limits_default(&lim);
	lim.allow = allow;
	CHECK(rs_pickle_parse((const uint8_t *)enum_getattr,
			      sizeof(enum_getattr) - 1, &lim, &pk, err,
			      errlen) == 0);
	rs_pw_init(&w, 2);
	e = rs_pw_value(&w, rs_pickle_root(pk), allow_copy, members, err,
			errlen);
	if (!e)
		e = rs_pw_finish(&w, &buf, &len);
	rs_pw_free(&w);
	rs_pickle_free(pk);
	if (e)
		return e;
	*has_getattr = memmem(buf, len, "getattr", 7) != NULL;
	/* Python loads the copy as the members themselves. */
	if (have_python()) {
		fd = mkstemp(path);
		CHECK(fd >= 0 && write(fd, buf, len) == (ssize_t)len);
		close(fd);
		CHECK(python("import pickle\n"
			     "a = pickle.load(open(sys.argv[1], 'rb'))\n"
			     "print('same' if a == [Color.red, Color.blue] else a)\n",
			     path, out, sizeof(out)) == 0);
		CHECK(strcmp(out, "same\n") == 0);
		unlink(path);
	}
	free(buf);
	return 0;
}

static void test_members(void)
{
	static const rs_pw_member red[] = { { "enum_mod.Color", "red", 1 },
					    { NULL, NULL, 0 } };
	static const rs_pw_member both[] = { { "enum_mod.Color", "red", 1 },
					     { "enum_mod.Color", "blue", 2 },
					     { NULL, NULL, 0 } };
	static const char *const narrow[] = { "enum_mod.Color", NULL };
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	bool g = false;
	char err[200];

	/* Both known: the value form Python 3.11.5+ writes, no getattr. */
	CHECK(copy_enum(both, allow, &g, err, sizeof(err)) == 0 && !g);
	/* One known: the other keeps its getattr form; both load. */
	CHECK(copy_enum(red, allow, &g, err, sizeof(err)) == 0 && g);
	CHECK(copy_enum(NULL, allow, &g, err, sizeof(err)) == 0 && g);
	/* A member is allowed by its whole name, not by its class's. */
	CHECK(copy_enum(both, narrow, &g, err, sizeof(err)) == -EINVAL);
	CHECK(strstr(err, "GLOBAL enum_mod.Color.red is not allowed") != NULL);
	/* A protocol 4 qualified name (allowed only by an entry naming it
	 * whole) cannot be spelled by GLOBAL. */
	rs_pickle_limits_default(&lim);
	lim.allow = (const char *const[]){ "enum_mod.Color.red", NULL };
	CHECK(rs_pickle_parse((const uint8_t *)"\x80\x04\x8c\x08" "enum_mod"
			      "\x8c\x09" "Color.red\x93.", 25, &lim, &pk, err,
			      sizeof(err)) == 0);
	CHECK(copy_of(pk, err, sizeof(err)) == -EINVAL);
	CHECK(strstr(err, "GLOBAL enum_mod.Color.red: a qualified name cannot be written under protocol 2") != NULL);
	rs_pickle_free(pk);
}

int main(void)
{
	test_writer_calls();
	test_members();
	test_refusals();
	if (have_python()) {
		test_round_trip(2);
		test_round_trip(4);
	} else {
		printf("python3 not found: round trips skipped\n");
	}
	return CHECK_DONE();
}
