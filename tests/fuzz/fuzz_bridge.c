/* fuzz_bridge: the bridge's parsers of user and checkpoint text, and its
 * name matcher (formats/bridge/, formats/facts.c).
 *
 * The input is up to four parts split at NUL bytes:
 *   0  a -o rules= file: its "names" rows for both Llama families
 *      (rs_bridge_rows_parse), then applied to a small HF Llama catalog
 *      (rs_remap) - a refusal is lines naming the file or the checkpoint;
 *      accepted rows have printable patterns and '*' only where the target
 *      is null, and an accepted remap has every target's pieces tiling it
 *      in one dtype;
 *   1  a config.json (rs_facts_from_hf): a refusal is lines naming the
 *      file; accepted facts are in range, the groups dividing the heads;
 *   2  an hf_config (rs_facts_hf_number of every LlamaConfig field): a
 *      number is returned only if finite and non-negative;
 *   3  "pattern\nname": rs_map_match against a backtracking reference (both
 *      at most 24 bytes, so the reference stays small), and captures that
 *      spell the name back.
 */
#include <cjson/cJSON.h>
#include <math.h>

#include "formats/bridge/bridge_int.h"
#include "formats/codec/json_text.h"
#include "formats/facts.h"
#include "tests/fuzz/fuzz.h"
#include "tests/unit/hf_llama_catalog.h"
#include "tests/unit/families.h"

#define RULES "fuzz/rules.json"
#define CONFIG "fuzz/config.json"
#define DIR "fuzz"

/* ---- part 0: rows, applied ------------------------------------------ */

static void check_rows(const rs_map_row *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (int k = 0; k < RS_MAP_MAX_FROM && rows[i].from[k]; k++) {
			RS_FUZZ_CHECK(*rows[i].from[k]);
			RS_FUZZ_CHECK(rows[i].to == NULL ||
				      !strchr(rows[i].from[k], '*'));
		}
		RS_FUZZ_CHECK(rows[i].from[0]);
	}
}

static void check_catalog(const rs_catalog *c)
{
	for (size_t i = 0; i < c->count; i++) {
		rs_tensor t = c->tensors[i];
		size_t a, b;
		uint64_t covered, total;

		RS_FUZZ_CHECK(rs_tensor_check_tiling(&t, &a, &b, &covered,
						     &total) == 0);
	}
}

static void rules_part(const uint8_t *p, size_t n)
{
	static const char *const dirs[2][2] = { { "hf", "mcore" },
						{ "mcore", "hf" } };
	char why[160];
	cJSON *root = NULL;

	if (rs_json_parse_object((const char *)p, n, &root, why, sizeof(why)))
		return;
	for (int k = 0; k < 2; k++) {
		const rs_family *f = family_find("llama", dirs[k][0], dirs[k][1]);
		rs_diag *d = rs_diag_new();
		rs_map_row *rows = NULL;
		size_t nrows = 0;
		int err;

		if (!f || !d)
			abort();
		err = rs_bridge_rows_parse(root, f, RULES, &rows, &nrows, d);
		rs_fuzz_check_diag(d, err, RULES);
		if (!err && k == 0) {
			rs_checkpoint ck;
			rs_map_dims dims = { 4, 2, 10, false, false, 0 };
			rs_diag *d2 = rs_diag_new();

			check_rows(rows, nrows);
			memset(&ck, 0, sizeof(ck));
			ck.dir_path = DIR;
			rs_catalog_init(&ck.catalog);
			/* the last byte picks a layer-1 tensor stored in
			 * float16, so that stacks of two dtypes are met */
			hfl_catalog(&ck.catalog, 2,
				    n ? p[n - 1] % (HFL_PER_LAYER + 3)
				      : HFL_PER_LAYER);
			err = rs_remap(&ck, f, rows, nrows, RULES, &dims, d2);
			rs_fuzz_check_diag(d2, err, DIR);
			if (!err)
				check_catalog(&ck.catalog);
			rs_catalog_free(&ck.catalog);
			rs_diag_free(d2);
		}
		rs_bridge_rows_free(rows, nrows);
		rs_diag_free(d);
	}
	cJSON_Delete(root);
}

/* ---- parts 1 and 2: config.json and hf_config ----------------------- */

static void config_part(const uint8_t *p, size_t n)
{
	char why[160];
	cJSON *cfg = NULL;
	rs_model_facts f;
	rs_diag *d = rs_diag_new();
	int err;

	if (!d)
		abort();
	rs_facts_init(&f);
	if (rs_json_parse_object((const char *)p, n, &cfg, why, sizeof(why)) == 0) {
		err = rs_facts_from_hf(&f, cfg, CONFIG, d);
		rs_fuzz_check_diag(d, err, CONFIG);
		if (!err && f.heads) {
			RS_FUZZ_CHECK(f.heads <= 65536 && f.query_groups >= 1);
			RS_FUZZ_CHECK(f.heads % f.query_groups == 0);
			RS_FUZZ_CHECK(isnan(f.norm_eps) || isfinite(f.norm_eps));
			RS_FUZZ_CHECK(isnan(f.rope_theta) || isfinite(f.rope_theta));
		}
	}
	rs_facts_free(&f);
	cJSON_Delete(cfg);
	rs_diag_free(d);
}

static void hf_config_part(const uint8_t *p, size_t n)
{
	static const char *const fields[] = {
		"num_attention_heads", "num_key_value_heads", "vocab_size",
		"max_position_embeddings", "rms_norm_eps", "rope_theta",
		"tie_word_embeddings", "hidden_size", "intermediate_size",
		"num_hidden_layers", "head_dim",
	};
	char why[160];
	cJSON *cfg = NULL;

	if (rs_json_parse_object((const char *)p, n, &cfg, why, sizeof(why)))
		return;
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		rs_diag *d = rs_diag_new();
		double v = NAN;
		int got;

		if (!d)
			abort();
		got = rs_facts_hf_number(cfg, fields[i], RULES, &v, d);
		RS_FUZZ_CHECK(got <= 0 || (isfinite(v) && v >= 0));
		rs_fuzz_check_diag(d, got < 0 ? got : 0, RULES);
		rs_diag_free(d);
	}
	cJSON_Delete(cfg);
}

/* ---- part 3: the matcher -------------------------------------------- */

/* The rules of formats/model.h by backtracking ('#' one or more digits,
 * '*' any run), for patterns and names short enough. */
static bool reference(const char *p, const char *s)
{
	if (!*p)
		return !*s;
	if (*p == '*')
		return reference(p + 1, s) || (*s && reference(p, s + 1));
	if (*p == '#') {
		if (!(*s >= '0' && *s <= '9'))
			return false;
		for (s++;; s++) {
			if (reference(p + 1, s))
				return true;
			if (!(*s >= '0' && *s <= '9'))
				return false;
		}
	}
	return *p == *s && reference(p + 1, s + 1);
}

static void match_part(const uint8_t *p, size_t n)
{
	char pat[25], name[25], nums[2][24], spelt[80];
	const uint8_t *nl = memchr(p, '\n', n);
	size_t pl = nl ? (size_t)(nl - p) : n, nlen = nl ? n - pl - 1 : 0;
	int nn = 0;
	bool got;

	if (pl > 24 || nlen > 24 || memchr(p, 0, n))
		return;
	memcpy(pat, p, pl);
	pat[pl] = 0;
	memcpy(name, nl ? (const char *)nl + 1 : "", nlen);
	name[nlen] = 0;
	got = rs_map_match(pat, name, false, nums, &nn);
	if (strchr(pat, '*')) {
		const char *layer = strstr(pat, "#.");
		char elided[25];
		int n2 = 0;

		RS_FUZZ_CHECK(got == reference(pat, name));
		/* a stacked name: the pattern's first "#." left out */
		got = rs_map_match(pat, name, true, nums, &n2);
		if (!layer) {
			RS_FUZZ_CHECK(!got);
			return;
		}
		memcpy(elided, pat, (size_t)(layer - pat));
		strcpy(elided + (layer - pat), layer + 2);
		RS_FUZZ_CHECK(got == reference(elided, name));
		return;
	}
	/* '#' takes all the digits there: a match is one by the reference */
	RS_FUZZ_CHECK(!got || reference(pat, name));
	if (!got)
		return;
	/* without '*': the captures put back in the pattern spell the name */
	{
		size_t at = 0;
		int used = 0;

		for (const char *c = pat; *c && at + 24 < sizeof(spelt); c++) {
			if (*c == '#') {
				RS_FUZZ_CHECK(used < nn);
				at += (size_t)snprintf(spelt + at, sizeof(spelt) - at,
						       "%s", nums[used++]);
			} else {
				spelt[at++] = *c;
			}
		}
		spelt[at] = 0;
		RS_FUZZ_CHECK(used == nn && strcmp(spelt, name) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	void (*const parts[])(const uint8_t *, size_t) = {
		rules_part, config_part, hf_config_part, match_part,
	};
	size_t k = 0;

	while (k < sizeof(parts) / sizeof(parts[0])) {
		const uint8_t *end = memchr(data, 0, size);
		size_t n = end ? (size_t)(end - data) : size;

		parts[k++](data, n);
		if (!end)
			break;
		data += n + 1;
		size -= n + 1;
	}
	return 0;
}
