/* .zarray parsing (valid and hostile) and byte-preserving rewriting. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "formats/zarr/zarr.h"
#include "tests/unit/check.h"

static const char good[] =
	"{\n    \"chunks\": [\n        1,\n        64,\n        64\n    ],\n"
	"    \"compressor\": null,\n    \"dtype\": \"bfloat16\",\n"
	"    \"fill_value\": null,\n    \"filters\": null,\n"
	"    \"order\": \"C\",\n    \"shape\": [\n        4,\n        256,\n"
	"        64\n    ],\n    \"zarr_format\": 2\n}";

static int parse(const char *text, rs_diag *d)
{
	rs_catalog c;
	size_t t;
	int err;

	rs_catalog_init(&c);
	err = rs_zarr_parse_meta(text, strlen(text), "A/.zarray", "A", &c, &t, d);
	rs_catalog_free(&c);
	return err;
}

/* Every malformed .zarray is refused with a line naming the file. */
static void test_bad(void)
{
	static const char *bad[] = {
		"",
		"[1, 2]",
		"{\"zarr_format\": 2}",
		"{\"zarr_format\": 3, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [-4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4.5], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [0], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4, 4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \">f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"F\"}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\", \"compressor\": {\"id\": \"blosc\"}}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\", \"dimension_separator\": \"/\"}",
		"{\"zarr_format\": 2, \"shape\": [4294967296, 4294967296, 4294967296], \"chunks\": [1, 1, 1], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [1,1,1,1,1,1,1,1,1], \"chunks\": [1,1,1,1,1,1,1,1,1], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [100000000], \"chunks\": [1], \"dtype\": \"<f4\", \"order\": \"C\"}",
		/* What Python's json.loads reads differently from cJSON: a
		 * second "chunks" (Python keeps the last), bytes after the
		 * object, a NUL inside a string, raw or escaped. */
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"chunks\": [4], \"dtype\": \"<f4\", \"order\": \"C\"}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\", \"order\": \"C\"} {}",
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], \"dtype\": \"<f4\\u0000x\", \"order\": \"C\"}",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rs_diag *d = rs_diag_new();

		CHECK(parse(bad[i], d) == -EINVAL);
		CHECK(rs_diag_count(d) == 1);
		CHECK(rs_diag_line(d, 0) && strncmp(rs_diag_line(d, 0), "A/.zarray: ", 11) == 0);
		if (rs_diag_count(d) != 1)
			fprintf(stderr, "case %zu\n", i);
		rs_diag_free(d);
	}
}

/* A raw NUL ends a C string; the parser is given the whole length. */
static void test_raw_nul(void)
{
	static const char text[] =
		"{\"zarr_format\": 2, \"shape\": [4], \"chunks\": [2], "
		"\"dtype\": \"<f4\0x\", \"order\": \"C\"}";
	rs_diag *d = rs_diag_new();
	rs_catalog c;
	size_t t;

	rs_catalog_init(&c);
	CHECK(rs_zarr_parse_meta(text, sizeof(text) - 1, "A/.zarray", "A", &c,
				 &t, d) == -EINVAL);
	CHECK(rs_diag_count(d) == 1);
	CHECK(c.count == 0);
	rs_catalog_free(&c);
	rs_diag_free(d);
}

static void test_good(void)
{
	rs_diag *d = rs_diag_new();
	rs_catalog c;
	size_t t;

	rs_catalog_init(&c);
	CHECK(rs_zarr_parse_meta(good, strlen(good), "A/.zarray", "A", &c, &t, d) == 0);
	CHECK(c.tensors[t].ndim == 3 && c.tensors[t].dtype == RS_DTYPE_BF16);
	CHECK(c.tensors[t].grid_count[1] == 4 && c.tensors[t].nfrags == 16);
	rs_catalog_free(&c);
	rs_diag_free(d);
}

/* Replacing "chunks" and "shape" keeps every other byte, in Python's
 * json.dumps(indent=4) layout, and the inline layout too. */
static void test_rewrite(void)
{
	const char *keys[2] = { "shape", "chunks" };
	uint64_t shape[] = { 4, 1024, 64 }, chunks[] = { 1, 16, 64 };
	const uint64_t *vals[2] = { shape, chunks };
	int counts[2] = { 3, 3 };
	char *out;
	size_t len;
	const char *want =
		"{\n    \"chunks\": [\n        1,\n        16,\n        64\n    ],\n"
		"    \"compressor\": null,\n    \"dtype\": \"bfloat16\",\n"
		"    \"fill_value\": null,\n    \"filters\": null,\n"
		"    \"order\": \"C\",\n    \"shape\": [\n        4,\n        1024,\n"
		"        64\n    ],\n    \"zarr_format\": 2\n}";
	const char *inl = "{\"shape\": [4, 256, 64], \"x\": \"[1]\", \"chunks\": [1,64,64]}";
	const char *inl_want = "{\"shape\": [4, 1024, 64], \"x\": \"[1]\", \"chunks\": [1,16,64]}";
	size_t s, e;

	CHECK(rs_json_replace_lists(good, strlen(good), keys, vals, counts, 2, &out, &len) == 0);
	CHECK(len == strlen(want) && strcmp(out, want) == 0);
	free(out);
	CHECK(rs_json_replace_lists(inl, strlen(inl), keys, vals, counts, 2, &out, &len) == 0);
	CHECK(strcmp(out, inl_want) == 0);
	free(out);
	CHECK(rs_json_value_span(inl, strlen(inl), "missing", &s, &e) == -ENOENT);
	CHECK(rs_json_value_span("{\"a\": ", 6, "a", &s, &e) != 0);
}

int main(void)
{
	test_bad();
	test_raw_nul();
	test_good();
	test_rewrite();
	return CHECK_DONE();
}
