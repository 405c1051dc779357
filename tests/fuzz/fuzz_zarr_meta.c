/* fuzz_zarr_meta: a .zarray text, parsed and then rewritten.
 *
 * The input is the whole .zarray.  rs_zarr_parse_meta must accept it or
 * refuse it with one line naming the file.  Whatever it said, the
 * byte-preserving rewrite the zarr view applies ("shape" and "chunks",
 * formats/codec/json_text.h) must stay inside the text.  When the parse succeeded
 * the rewrite is checked as the view relies on it: a rewritten text that
 * comes back must parse again, to exactly the new shape and chunks and the
 * same dtype, so a loader reading the view's .zarray sees the grid the
 * view's chunk files follow.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"
#include "formats/zarr/zarr.h"
#include "tests/fuzz/fuzz.h"

#define PATH "a/.zarray"

/* A new grid for the parsed tensor, as a view would ask: each axis cut in
 * 1..4 pieces by the input's last bytes (past the object cJSON reads, so
 * free for the fuzzer to vary).  Falls back to the stored grid
 * when the new chunk's bytes would overflow (a shape with a 0 axis). */
static void new_grid(const rs_tensor *t, const uint8_t *data, size_t size,
		     uint64_t *chunk)
{
	uint64_t bytes = rs_dtype_size(t->dtype);
	bool ok = true;

	for (int i = 0; i < t->ndim; i++) {
		uint64_t k = 1 + (i < (int)size ? data[size - 1 - i] % 4 : 0);

		chunk[i] = t->shape[i] ? t->shape[i] / k + (t->shape[i] % k != 0)
				       : 1;
		ok = ok && rs_mul_u64(bytes, chunk[i], &bytes);
	}
	if (!ok)
		memcpy(chunk, t->grid, sizeof(t->grid));
}

static void check_rewrite(const char *text, size_t len, const rs_tensor *t,
			  const uint8_t *data, size_t size)
{
	const char *keys[2] = { "shape", "chunks" };
	uint64_t chunk[RS_MAX_DIMS] = { 0 };
	const uint64_t *values[2] = { t->shape, chunk };
	const int counts[2] = { t->ndim, t->ndim };
	rs_catalog again;
	rs_diag *d;
	char *out = NULL;
	size_t out_len, index;
	int err;

	new_grid(t, data, size, chunk);
	err = rs_json_replace_lists(text, len, keys, values, counts, 2, &out,
				    &out_len);
	/* A refusal is safe: the mount then stops with a line. */
	if (err)
		return;
	d = rs_diag_new();
	rs_catalog_init(&again);
	err = rs_zarr_parse_meta(out, out_len, PATH, "a", &again, &index, d);
	if (err != -ENOMEM) {
		const rs_tensor *u;

		if (err)
			fprintf(stderr, "rewritten .zarray refused: %s\n%.*s\n",
				rs_diag_line(d, 0), (int)out_len, out);
		RS_FUZZ_CHECK(err == 0);
		u = &again.tensors[index];
		RS_FUZZ_CHECK(u->ndim == t->ndim && u->dtype == t->dtype);
		RS_FUZZ_CHECK(memcmp(u->shape, t->shape,
				     (size_t)t->ndim * sizeof(uint64_t)) == 0);
		RS_FUZZ_CHECK(memcmp(u->grid, chunk,
				     (size_t)t->ndim * sizeof(uint64_t)) == 0);
	}
	rs_catalog_free(&again);
	rs_diag_free(d);
	free(out);
}

/* The rewrite on text that did not parse: bounds-safe, any answer. */
static void poke_rewrite(const char *text, size_t len)
{
	static const uint64_t v[3] = { 1, 22, 333 };
	const char *keys[2] = { "chunks", "shape" };
	const uint64_t *values[2] = { v, v };
	const int counts[2] = { 3, 0 };
	char *out = NULL;
	size_t out_len, start, end;

	if (rs_json_replace_lists(text, len, keys, values, counts, 2, &out,
				  &out_len) == 0)
		free(out);
	if (rs_json_value_span(text, len, "dtype", &start, &end) == 0)
		RS_FUZZ_CHECK(start <= end && end <= len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data;
	rs_diag *d = rs_diag_new();
	rs_catalog c;
	size_t index;
	int err;

	rs_catalog_init(&c);
	err = rs_zarr_parse_meta(text, size, PATH, "a", &c, &index, d);
	rs_fuzz_check_diag(d, err, PATH ": ");
	if (err == 0)
		check_rewrite(text, size, &c.tensors[index], data, size);
	else
		poke_rewrite(text, size);
	rs_catalog_free(&c);
	rs_diag_free(d);
	return 0;
}
