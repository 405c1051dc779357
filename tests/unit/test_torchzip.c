/* torchzip: real torch.save zips read back against torch's own offsets,
 * hostile zips refused, and laid-out zips that equal torch's byte for
 * byte, pass `python3 -m zipfile -t` and load in torch. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "formats/codec/torchzip.h"
#include "tests/unit/check.h"

/* The Python whose torch loads the zips we lay out, for the checks run as
 * `test_torchzip torch` (ctest test_torchzip_torch): $RS_TORCH_PYTHON or the
 * repo's .venv-mcore (scripts/setup), if it imports torch.  NULL in the
 * plain run, which leaves those checks to that one. */
static const char *torch_py;

/* Sets torch_py, or says why there is none in why. */
static int find_torch_python(char *why, size_t len)
{
	static char repo[512], cmd[1024];
	const char *py = getenv("RS_TORCH_PYTHON");
	const char *from = "RS_TORCH_PYTHON";

	if (!py || !*py) {
		snprintf(repo, sizeof(repo), "%s/.venv-mcore/bin/python",
			 RS_SOURCE_DIR);
		py = repo;
		from = "the repo's .venv-mcore";
		if (access(py, X_OK) != 0) {
			snprintf(why, len, "no RS_TORCH_PYTHON and no %s "
				 "(scripts/setup makes it)", py);
			return -ENOENT;
		}
	}
	snprintf(cmd, sizeof(cmd), "'%s' -c 'import torch' >/dev/null 2>&1", py);
	if (system(cmd) != 0) {
		snprintf(why, len, "%s (%s) cannot import torch", py, from);
		return -ENOENT;
	}
	torch_py = py;
	return 0;
}

static char tmpdir[] = "/tmp/rs_torchzip_XXXXXX";

typedef struct {
	char name[256];
	unsigned long long ho, off, size;
	unsigned long crc;
} want_entry;

typedef struct {
	char archive[64];
	want_entry e[32];
	size_t n;
} want;

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n + 1)) &&
	    fread(p, 1, (size_t)n, f) == (size_t)n)
		*len = (size_t)n;
	else {
		free(p);
		p = NULL;
	}
	fclose(f);
	return p;
}

static int write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(p, 1, n, f) == n;

	if (f && fclose(f) != 0)
		ok = 0;
	return ok ? 0 : -1;
}

static int load_want(const char *path, want *w)
{
	FILE *f = fopen(path, "r");

	memset(w, 0, sizeof(*w));
	if (!f || fscanf(f, "archive %63s", w->archive) != 1) {
		if (f)
			fclose(f);
		return -1;
	}
	while (w->n < 32) {
		want_entry *e = &w->e[w->n];

		if (fscanf(f, "%255s %llu %llu %llu %lu", e->name, &e->ho,
			   &e->off, &e->size, &e->crc) != 5)
			break;
		w->n++;
	}
	fclose(f);
	return 0;
}

/* Parses the zip in [base, base+len) of a file. */
static int parse_file(const char *path, uint64_t base, uint64_t len,
		      rs_zip *z, char *msg)
{
	int fd = open(path, O_RDONLY), err;

	if (fd < 0)
		return -errno;
	err = rs_zip_open(z, fd, base, len, msg, RS_ZIP_MSG_SIZE);
	close(fd);
	return err;
}

static int parse_buf(const uint8_t *p, size_t n, rs_zip *z, char *msg)
{
	char path[64];

	snprintf(path, sizeof(path), "%s/t.zip", tmpdir);
	if (write_file(path, p, n))
		return -EIO;
	return parse_file(path, 0, n, z, msg);
}

static bool matches(const rs_zip *z, const want *w)
{
	bool ok = z->count == w->n && strcmp(z->archive, w->archive) == 0;

	for (size_t i = 0; ok && i < w->n; i++) {
		const rs_zip_entry *e = &z->entries[i];

		ok = strcmp(e->name, w->e[i].name) == 0 &&
		     e->header_offset == w->e[i].ho && e->offset == w->e[i].off &&
		     e->size == w->e[i].size && e->crc32 == w->e[i].crc &&
		     rs_zip_find(z, e->record) == e;
		if (!ok)
			fprintf(stderr, "entry %zu: %s %llu %llu\n", i, e->name,
				(unsigned long long)e->offset,
				(unsigned long long)e->size);
	}
	return ok;
}

/* Both fixtures read back as torch itself reads them, alone and embedded
 * at an offset of a bigger file (a .distcp item). */
static void test_fixtures(void)
{
	static const char *names[] = { "torchzip_tensors", "torchzip_buffer" };

	for (size_t f = 0; f < 2; f++) {
		char path[512], txt[512], emb[64], msg[RS_ZIP_MSG_SIZE];
		size_t len = 0;
		uint8_t *raw, *big;
		want w;
		rs_zip z;

		snprintf(path, sizeof(path), "%s/%s.pt", RS_TEST_DATA, names[f]);
		snprintf(txt, sizeof(txt), "%s/%s.txt", RS_TEST_DATA, names[f]);
		raw = slurp(path, &len);
		CHECK(raw && load_want(txt, &w) == 0 && w.n > 0);
		if (!raw)
			continue;
		CHECK(parse_file(path, 0, len, &z, msg) == 0);
		CHECK(z.zip64 && matches(&z, &w));
		CHECK(rs_zip_find(&z, "data.pkl") && rs_zip_find(&z, "version"));
		CHECK(rs_zip_find(&z, "nope") == NULL);
		rs_zip_free(&z);

		big = malloc(len + 1000 + 333);
		memset(big, 'P', len + 1333);
		memcpy(big + 1000, raw, len);
		snprintf(emb, sizeof(emb), "%s/emb.bin", tmpdir);
		CHECK(write_file(emb, big, len + 1333) == 0);
		CHECK(parse_file(emb, 1000, len, &z, msg) == 0);
		CHECK(matches(&z, &w));
		rs_zip_free(&z);
		/* The wrong range is refused, not misread. */
		CHECK(parse_file(emb, 999, len, &z, msg) == -EINVAL);
		CHECK(parse_file(emb, 1000, len + 1, &z, msg) == -EINVAL);
		CHECK(parse_file(emb, 1000 + len, 1000, &z, msg) == -EINVAL);
		/* A range past the file's end is a short read. */
		CHECK(parse_file(emb, 1000, len + 334, &z, msg) == -EINVAL);
		CHECK(strncmp(msg, "zip: ", 5) == 0);
		free(big);
		free(raw);
	}
}

/* Every prefix of a real zip is refused with a message. */
static void test_truncated(void)
{
	char path[512], msg[RS_ZIP_MSG_SIZE];
	size_t len = 0, bad = 0;
	uint8_t *raw;
	rs_zip z;

	snprintf(path, sizeof(path), "%s/torchzip_tensors.pt", RS_TEST_DATA);
	raw = slurp(path, &len);
	CHECK(raw != NULL);
	if (!raw)
		return;
	for (size_t n = 0; n < len; n++) {
		int err = parse_file(path, 0, n, &z, msg);

		if (err != -EINVAL || strncmp(msg, "zip: ", 5) != 0 ||
		    !strstr(msg, "(offset ")) {
			bad++;
			fprintf(stderr, "truncated at %zu: %d %s\n", n, err, msg);
		}
		rs_zip_free(&z);
	}
	/* Cut from the front, too. */
	for (size_t k = 1; k < len; k += 7) {
		if (parse_file(path, k, len - k, &z, msg) != -EINVAL)
			bad++;
	}
	CHECK(bad == 0);
	free(raw);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Copies a string (no NUL) into b[off...], inside its n bytes. */
static void set(uint8_t *b, size_t n, size_t off, const char *s)
{
	size_t k = strlen(s);

	if (off <= n && k <= n - off)
		memcpy(b + off, s, k);
}

/* Position of central record i. */
static size_t cdrec(const uint8_t *raw, size_t cd, size_t i)
{
	while (i--)
		cd += 46 + get16(raw + cd + 28) + get16(raw + cd + 30) +
		      get16(raw + cd + 32);
	return cd;
}

static void expect_bad(const uint8_t *p, size_t n, const char *what, int line)
{
	char msg[RS_ZIP_MSG_SIZE];
	rs_zip z;
	int err = parse_buf(p, n, &z, msg);

	if (err != -EINVAL || !strstr(msg, what) || strncmp(msg, "zip: ", 5)) {
		fprintf(stderr, "line %d: got %d \"%s\", want \"%s\"\n", line,
			err, msg, what);
		CHECK(!"hostile zip refused with the right message");
	} else {
		CHECK(z.count == 0 && z.entries == NULL);
	}
	rs_zip_free(&z);
}

#define BAD(what) expect_bad(b, n, what, __LINE__)

/* Corrupted end records and entries, each refused for its own reason. */
static void test_hostile(void)
{
	char path[512], msg[RS_ZIP_MSG_SIZE];
	size_t len = 0, n, cd, eocd, loc, rec, r1, r4;
	uint8_t *raw, *b;
	rs_zip z;

	snprintf(path, sizeof(path), "%s/torchzip_tensors.pt", RS_TEST_DATA);
	raw = slurp(path, &len);
	CHECK(raw && parse_file(path, 0, len, &z, msg) == 0);
	if (!raw)
		return;
	cd = (size_t)z.cd_offset;
	rs_zip_free(&z);
	eocd = len - 22;
	loc = eocd - 20;
	rec = loc - 56;
	r1 = cdrec(raw, cd, 1);         /* .format_version */
	r4 = cdrec(raw, cd, 4);         /* data/0 */
	b = malloc(len + 64);
	n = len;

#define RESET() (memcpy(b, raw, len), n = len)
	RESET(); b[eocd] = 'X'; BAD("no end of central directory");
	RESET(); n = len + 1; b[len] = 0; BAD("no end of central directory");
	RESET(); put32(b + eocd + 16, (uint32_t)cd + 1); BAD("disagrees");
	RESET(); put16(b + eocd + 8, 3); put16(b + eocd + 10, 3); BAD("disagrees");
	RESET(); put16(b + eocd + 4, 1); BAD("multi-disk");
	RESET(); b[loc + 8]++; BAD("zip64 end record");
	RESET(); put32(b + loc + 16, 2); BAD("multi-disk");
	RESET(); b[rec] = 'X'; BAD("bad zip64 end record signature");
	RESET(); b[rec + 4]++; BAD("does not reach the locator");
	RESET(); b[rec + 48]++; put32(b + eocd + 16, 0xFFFFFFFFu);
	BAD("does not end at its end record");
	RESET(); b[rec + 40]++; put32(b + eocd + 12, 0xFFFFFFFFu);
	BAD("does not end at its end record");
	RESET(); b[rec + 32] = b[rec + 24] = 0; put16(b + eocd + 8, 0);
	put16(b + eocd + 10, 0); BAD("no entries");
	RESET(); put32(b + rec + 32, 0x7fffffff); put32(b + rec + 24, 0x7fffffff);
	put16(b + eocd + 8, 0xFFFF); put16(b + eocd + 10, 0xFFFF);
	BAD("over the limit");
	RESET(); b[rec + 32]--; b[rec + 24]--; put16(b + eocd + 8, get16(b + eocd + 8) - 1);
	put16(b + eocd + 10, get16(b + eocd + 10) - 1);
	BAD("after the last central record");
	RESET(); b[r1] = 'X'; BAD("bad central directory signature");
	RESET(); put16(b + r1 + 10, 8); BAD("compressed entry (method 8)");
	RESET(); b[r1 + 8] |= 1; BAD("encrypted");
	RESET(); put16(b + r1 + 34, 1); BAD("disk 1");
	RESET(); put32(b + r1 + 20, 2); BAD("compressed size 2 != size 1");
	RESET(); put16(b + r1 + 28, 0); BAD("name of 0 bytes");
	RESET(); put16(b + r1 + 30, 3); BAD("extra field");
	RESET(); put32(b + r1 + 20, 0xFFFFFFFFu); put32(b + r1 + 24, 0xFFFFFFFFu);
	BAD("saturated field without a zip64 extra");
	RESET(); put32(b + r1 + 42, (uint32_t)cd); BAD("before the central directory");
	RESET(); put32(b + r1 + 42, 0); BAD("local name differs");
	RESET(); put32(b + r1 + 42, (uint32_t)len); BAD("before the central directory");
	/* The first entry's data swallows the second's header. */
	RESET(); put32(b + cdrec(raw, cd, 0) + 20, 700); put32(b + cdrec(raw, cd, 0) + 24, 700);
	BAD("overlapping entries");
	/* An entry past the end of the data area. */
	RESET(); put32(b + r4 + 20, 100000); put32(b + r4 + 24, 100000);
	BAD("runs past the central directory");
	/* The local header: signature, method, name. */
	{
		size_t lh = 1046;       /* data/0, from torchzip_tensors.txt */

		RESET(); b[lh] = 'X'; BAD("bad local header signature");
		RESET(); put16(b + lh + 8, 8); BAD("compressed entry (method 8)");
		RESET(); b[lh + 6] |= 1; BAD("encrypted");
		RESET(); b[lh + 30 + 17 + 5] = '9'; BAD("local name differs");
	}
	/* Names: NUL, "..", outside the archive, a duplicate (the record
	 * "data/1" renamed "data/0" in both headers). */
	RESET(); b[r4 + 46 + 18] = 0; BAD("NUL in entry name");
	RESET(); set(b, len, r4 + 46 + 17, "a/../0"); set(b, len, 1046 + 30 + 17, "a/../0");
	BAD("bad entry name");
	RESET(); b[r4 + 46] = 'X'; BAD("outside archive");
	RESET(); b[r1 + 46 + 18] = '\\'; b[700 + 30 + 18] = '\\'; BAD("bad entry name");
	{
		size_t r5 = cdrec(raw, cd, 5);

		RESET(); b[r5 + 46 + 22] = '0'; b[1296 + 30 + 22] = '0';
		BAD("duplicate entry");
	}
	RESET(); b[cd + 46 + 16] = 'X'; BAD("first entry");

	/* A trailing comment is legal. */
	RESET(); set(b, len + 64, len, "hello"); put16(b + eocd + 20, 5); n = len + 5;
	CHECK(parse_buf(b, n, &z, msg) == 0 && z.count == 11);
	rs_zip_free(&z);
	free(b);
	free(raw);
}

static bool have_python(const char *py)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "%s -c 'import zipfile' >/dev/null 2>&1", py);
	return system(cmd) == 0;
}

/* Zips written by another writer (CPython's zipfile): stored ones read,
 * deflated ones are refused. */
static void test_other_writer(void)
{
	char cmd[1024], path[256], msg[RS_ZIP_MSG_SIZE];
	rs_zip z;

	if (!have_python("python3")) {
		printf("SKIP other writer: no python3\n");
		return;
	}
	snprintf(cmd, sizeof(cmd),
		 "cd %s && python3 -c \"import zipfile\n"
		 "for name, c, z64 in (('s', 0, False), ('s64', 0, True), ('d', 8, False)):\n"
		 "  with zipfile.ZipFile(name + '.zip', 'w', c) as z:\n"
		 "    with z.open('a/x', 'w', force_zip64=z64) as f: f.write(b'x' * 100)\n"
		 "    z.writestr('a/y/z', b'hello')\n\"", tmpdir);
	CHECK(system(cmd) == 0);
	snprintf(path, sizeof(path), "%s/s.zip", tmpdir);
	{
		struct stat st;

		CHECK(stat(path, &st) == 0);
		CHECK(parse_file(path, 0, (uint64_t)st.st_size, &z, msg) == 0);
		CHECK(z.count == 2 && !z.zip64 && strcmp(z.archive, "a") == 0);
		CHECK(rs_zip_find(&z, "x") && rs_zip_find(&z, "x")->size == 100);
		CHECK(rs_zip_find(&z, "y/z") && rs_zip_find(&z, "y/z")->size == 5);
		rs_zip_free(&z);
		snprintf(path, sizeof(path), "%s/s64.zip", tmpdir);
		CHECK(stat(path, &st) == 0);
		CHECK(parse_file(path, 0, (uint64_t)st.st_size, &z, msg) == 0);
		CHECK(z.count == 2 && rs_zip_find(&z, "x")->size == 100);
		rs_zip_free(&z);
		snprintf(path, sizeof(path), "%s/d.zip", tmpdir);
		CHECK(stat(path, &st) == 0);
		CHECK(parse_file(path, 0, (uint64_t)st.st_size, &z, msg) == -EINVAL);
		CHECK(strstr(msg, "compressed entry (method 8)") != NULL);
	}
}

/* Assembles a layout: literal pieces as laid out, provided entries from
 * `data` (indexed like the entries). */
static uint8_t *assemble(const rs_zip_layout *l, uint8_t *const *data)
{
	uint8_t *out = malloc(l->size ? l->size : 1);
	uint64_t at = 0;
	bool ok = true;

	for (size_t i = 0; i < l->npieces; i++) {
		const rs_zip_piece *p = &l->pieces[i];

		ok = ok && p->offset == at && p->length > 0;
		if (p->kind == RS_ZIP_PIECE_LITERAL) {
			memcpy(out + at, p->bytes, p->length);
		} else {
			ok = ok && p->offset == l->entries[p->entry].offset &&
			     p->length == l->entries[p->entry].size;
			memcpy(out + at, data[p->entry], p->length);
		}
		at += p->length;
	}
	CHECK(ok && at == l->size);
	return out;
}

typedef struct {
	rs_zip z;
	uint8_t *raw;
	size_t len;
	rs_zip_input in[32];
	uint8_t *data[32];
} source_zip;

/* Reads a fixture into inputs, data/... records marked provided. */
static int load_source(const char *name, source_zip *s)
{
	char path[512], msg[RS_ZIP_MSG_SIZE];

	memset(s, 0, sizeof(*s));
	snprintf(path, sizeof(path), "%s/%s.pt", RS_TEST_DATA, name);
	s->raw = slurp(path, &s->len);
	if (!s->raw || parse_file(path, 0, s->len, &s->z, msg) || s->z.count > 32)
		return -1;
	for (size_t i = 0; i < s->z.count; i++) {
		const rs_zip_entry *e = &s->z.entries[i];

		s->data[i] = s->raw + e->offset;
		s->in[i] = (rs_zip_input){ .record = e->record, .size = e->size,
					   .bytes = s->raw + e->offset,
					   .provided = strncmp(e->record, "data/", 5) == 0 };
	}
	return 0;
}

static void free_source(source_zip *s)
{
	rs_zip_free(&s->z);
	free(s->raw);
}

/* The layout of a real zip's records, in its order, is that zip byte for
 * byte once the provided CRCs are patched. */
static void test_write_exact(void)
{
	static const char *names[] = { "torchzip_tensors", "torchzip_buffer" };

	for (size_t f = 0; f < 2; f++) {
		source_zip s;
		rs_zip_layout l;
		size_t provided = 0;
		uint8_t *out;

		CHECK(load_source(names[f], &s) == 0);
		CHECK(rs_zip_layout_build(&l, s.z.archive, s.in, s.z.count, 0, 0) == 0);
		CHECK(l.size == s.len && l.count == s.z.count);
		for (size_t i = 0; i < l.count; i++) {
			const rs_zip_layout_entry *e = &l.entries[i];

			CHECK(e->offset == s.z.entries[i].offset &&
			      e->header_offset == s.z.entries[i].header_offset);
			CHECK(e->offset % 64 == 0);
			if (!e->provided)
				CHECK(e->crc32 == s.z.entries[i].crc32);
			provided += e->provided && e->size;
			CHECK(e->crc_pending == (e->provided && e->size > 0));
		}
		CHECK(provided > 0 && rs_zip_layout_pending(&l) == provided);
		out = assemble(&l, s.data);
		CHECK(memcmp(out, s.raw, s.len) != 0); /* CRCs not yet patched */
		free(out);
		for (size_t i = 0; i < l.count; i++)
			if (l.entries[i].provided)
				CHECK(rs_zip_patch_crc(&l, i, (uint32_t)crc32(0,
					s.data[i], (uInt)s.in[i].size)) == 0);
		CHECK(rs_zip_layout_pending(&l) == 0);
		CHECK(rs_zip_patch_crc(&l, 0, 1) == -EINVAL); /* data.pkl: literal */
		out = assemble(&l, s.data);
		CHECK(memcmp(out, s.raw, s.len) == 0);
		free(out);
		rs_zip_layout_free(&l);
		free_source(&s);
	}
}

static int run(const char *fmt, const char *a, const char *b)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), fmt, a, b);
	return system(cmd);
}

/* Records renamed under another archive and reordered: our reader reads
 * it back as laid out, CPython's zipfile tests every CRC, and torch loads
 * the same tensors as from the original. */
static void test_write_load(void)
{
	source_zip s;
	rs_zip_layout l;
	rs_zip z;
	rs_zip_input in[32];
	uint8_t *data[32], *out;
	char path[256], orig[512], zero[256], msg[RS_ZIP_MSG_SIZE];
	size_t n;

	CHECK(load_source("torchzip_tensors", &s) == 0);
	n = s.z.count;
	for (size_t i = 0; i < n; i++) {    /* reversed: data.pkl last */
		in[i] = s.in[n - 1 - i];
		data[i] = s.data[n - 1 - i];
	}
	CHECK(rs_zip_layout_build(&l, "other", in, n, 0, 0) == 0);
	for (size_t i = 0; i < n; i++)
		if (l.entries[i].provided)
			rs_zip_patch_crc(&l, i, (uint32_t)crc32(0, data[i],
							 (uInt)in[i].size));
	out = assemble(&l, data);
	snprintf(path, sizeof(path), "%s/other.pt", tmpdir);
	CHECK(write_file(path, out, l.size) == 0);
	CHECK(parse_file(path, 0, l.size, &z, msg) == 0);
	CHECK(z.count == n && strcmp(z.archive, "other") == 0);
	for (size_t i = 0; i < z.count && i < n; i++) {
		CHECK(strcmp(z.entries[i].record, in[i].record) == 0);
		CHECK(z.entries[i].offset == l.entries[i].offset &&
		      z.entries[i].size == in[i].size &&
		      z.entries[i].header_offset == l.entries[i].header_offset &&
		      z.entries[i].crc32 == s.z.entries[n - 1 - i].crc32);
		CHECK(memcmp(out + z.entries[i].offset, data[i], in[i].size) == 0);
	}
	rs_zip_free(&z);
	free(out);
	rs_zip_layout_free(&l);

	/* CRC 0 mode: our reader does not care, a strict tool does. */
	CHECK(rs_zip_layout_build(&l, "other", in, n, 0, RS_ZIP_CRC_ZERO) == 0);
	CHECK(rs_zip_layout_pending(&l) == 0);
	out = assemble(&l, data);
	snprintf(zero, sizeof(zero), "%s/zero.pt", tmpdir);
	CHECK(write_file(zero, out, l.size) == 0);
	free(out);
	rs_zip_layout_free(&l);

	/* zipfile -t exits 0 either way; a bad CRC is a "corrupted" line. */
	if (have_python("python3")) {
		static const char t[] = "out=$(python3 -m zipfile -t %s 2>&1) && "
			"echo \"$out\" | grep -q '^Done testing' && "
			"! echo \"$out\" | grep -q %s";

		CHECK(run(t, path, "corrupted") == 0);
		CHECK(run(t, zero, "corrupted") != 0);
	} else {
		printf("SKIP zipfile -t: no python3\n");
	}
	snprintf(orig, sizeof(orig), "%s/torchzip_tensors.pt", RS_TEST_DATA);
	if (torch_py) {
		char script[256], cmd[1024];
		static const char py[] =
			"import sys, torch\n"
			"a = torch.load(sys.argv[1], weights_only=True)\n"
			"b = torch.load(sys.argv[2], weights_only=True)\n"
			"def same(x, y):\n"
			"    if isinstance(x, torch.Tensor):\n"
			"        return (type(x) is type(y) and x.dtype == y.dtype and\n"
			"                x.shape == y.shape and x.stride() == y.stride() and\n"
			"                x.storage_offset() == y.storage_offset() and\n"
			"                torch.equal(x, y))\n"
			"    if isinstance(x, dict):\n"
			"        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)\n"
			"    if isinstance(x, (list, tuple)):\n"
			"        return len(x) == len(y) and all(map(same, x, y))\n"
			"    return x == y\n"
			"shared = (b['view'].untyped_storage().data_ptr() ==\n"
			"          b['w'].untyped_storage().data_ptr())\n"
			"sys.exit(0 if same(a, b) and shared else 1)\n";

		snprintf(script, sizeof(script), "%s/same.py", tmpdir);
		CHECK(write_file(script, py, sizeof(py) - 1) == 0);
		snprintf(cmd, sizeof(cmd), "'%s' %s %%s %%s", torch_py, script);
		CHECK(run(cmd, orig, path) == 0);
		/* torch.load ignores CRCs, so CRC 0 mode loads too. */
		CHECK(run(cmd, orig, zero) == 0);
	}
	free_source(&s);
}

/* Entries of 4 GiB and more, and past 4 GiB, get ZIP64 extra fields and
 * 64-bit descriptors; checked in a sparse file by our reader and CPython. */
static void test_write_zip64(void)
{
	static const uint8_t pkl[] = "\x80\x02}q\x00.";
	rs_zip_input in[] = {
		{ .record = "data.pkl", .bytes = pkl, .size = sizeof(pkl) - 1 },
		{ .record = "data/0", .size = 5ull << 30, .provided = true },
		{ .record = "data/1", .size = 1000, .provided = true },
		{ .record = "data/2", .size = 0xFFFFFFFFull, .provided = true },
		{ .record = "version", .bytes = "3\n", .size = 2 },
	};
	char path[256], msg[RS_ZIP_MSG_SIZE];
	rs_zip_layout l;
	rs_zip z;
	int fd;

	CHECK(rs_zip_layout_build(&l, "big", in, 5, 0, 0) == 0);
	CHECK(l.entries[1].offset % 64 == 0 && l.entries[2].offset % 64 == 0);
	CHECK(l.entries[2].header_offset > 0xFFFFFFFFull);
	CHECK(rs_zip_layout_pending(&l) == 3);
	for (size_t i = 1; i < 4; i++)
		CHECK(rs_zip_patch_crc(&l, i, 0x12345678u + (uint32_t)i) == 0);
	snprintf(path, sizeof(path), "%s/big.zip", tmpdir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	if (fd < 0 || ftruncate(fd, (off_t)l.size) != 0) {
		printf("SKIP zip64: no sparse file of %llu bytes\n",
		       (unsigned long long)l.size);
		if (fd >= 0)
			close(fd);
		rs_zip_layout_free(&l);
		return;
	}
	for (size_t i = 0; i < l.npieces; i++)
		if (l.pieces[i].kind == RS_ZIP_PIECE_LITERAL)
			CHECK(pwrite(fd, l.pieces[i].bytes, l.pieces[i].length,
				     (off_t)l.pieces[i].offset) ==
			      (ssize_t)l.pieces[i].length);
	CHECK(rs_zip_open(&z, fd, 0, l.size, msg, sizeof(msg)) == 0);
	close(fd);
	CHECK(z.count == 5);
	for (size_t i = 0; i < z.count && i < 5; i++) {
		CHECK(z.entries[i].offset == l.entries[i].offset);
		CHECK(z.entries[i].size == in[i].size);
		CHECK(z.entries[i].header_offset == l.entries[i].header_offset);
		CHECK(z.entries[i].crc32 == l.entries[i].crc32);
	}
	CHECK(z.entries[3].crc32 == 0x1234567bu);
	rs_zip_free(&z);
	if (have_python("python3")) {
		char cmd[1024], expect_s[512];
		int len = 0;

		for (size_t i = 0; i < 5; i++)
			len += snprintf(expect_s + len, sizeof(expect_s) - (size_t)len,
					"(%llu,%llu,%u),",
					(unsigned long long)l.entries[i].header_offset,
					(unsigned long long)in[i].size,
					(unsigned)l.entries[i].crc32);
		/* open() reads each local header and checks overlaps. */
		snprintf(cmd, sizeof(cmd),
			 "python3 -c \"import zipfile, sys\n"
			 "z = zipfile.ZipFile('%s')\n"
			 "got = [(i.header_offset, i.file_size, i.CRC) for i in z.infolist()]\n"
			 "[z.open(i).close() for i in z.infolist()]\n"
			 "sys.exit(0 if got == [%s] else 1)\"", path, expect_s);
		CHECK(system(cmd) == 0);
	}
	unlink(path);
	rs_zip_layout_free(&l);
}

static void test_write_refuses(void)
{
	rs_zip_input in[2] = {
		{ .record = "a", .bytes = "x", .size = 1 },
		{ .record = "b", .size = 3, .provided = true },
	};
	rs_zip_layout l;

	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 0, 0) == 0);
	CHECK(l.npieces == 3 && l.pieces[1].kind == RS_ZIP_PIECE_DATA);
	CHECK(rs_zip_patch_crc(&l, 2, 0) == -EINVAL);
	rs_zip_layout_free(&l);
	CHECK(rs_zip_layout_build(&l, "a/b", in, 2, 0, 0) == -EINVAL);
	CHECK(rs_zip_layout_build(&l, "..", in, 2, 0, 0) == -EINVAL);
	CHECK(rs_zip_layout_build(&l, "ok", in, 0, 0, 0) == -EINVAL);
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 48, 0) == -EINVAL);
	in[1].record = "a";
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 0, 0) == -EINVAL);
	in[1].record = "x/../y";
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 0, 0) == -EINVAL);
	in[1].record = "x//y";
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 0, 0) == -EINVAL);
	in[1].record = "b";
	in[0].bytes = NULL;
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 0, 0) == -EINVAL);
	CHECK(l.entries == NULL && l.pieces == NULL);
	/* Another alignment: data lands on it. */
	in[0].bytes = "x";
	CHECK(rs_zip_layout_build(&l, "ok", in, 2, 4096, 0) == 0);
	CHECK(l.entries[0].offset == 4096 && l.entries[1].offset == 8192);
	rs_zip_layout_free(&l);
}

/* `test_torchzip` runs every check but torch's loads of the written zips;
 * `test_torchzip torch` runs those (test_write_load) and exits 77, which
 * ctest reports as skipped, with the reason printed, when no Python here
 * imports torch. */
int main(int argc, char **argv)
{
	char cmd[64], why[768];

	if (argc > 1 && strcmp(argv[1], "torch") == 0) {
		if (find_torch_python(why, sizeof(why)) != 0) {
			printf("SKIP: torch.load of written zips: %s\n", why);
			return 77;
		}
		printf("torch from %s\n", torch_py);
		if (!mkdtemp(tmpdir)) {
			perror("mkdtemp");
			return 1;
		}
		test_write_load();
		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", tmpdir);
		return CHECK_DONE();
	}
	printf("torch.load of written zips: in test_torchzip_torch\n");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_fixtures();
	test_truncated();
	test_hostile();
	test_other_writer();
	test_write_exact();
	test_write_load();
	test_write_zip64();
	test_write_refuses();
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	return CHECK_DONE();
}
