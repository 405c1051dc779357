/* The bridge's engine (formats/bridge/): pattern matching, the family
 * files (Llama's, Qwen3-MoE's experts, Phi-3's fused qkv) applied both
 * ways, and malformed family files refused.  The oracle of the round trip is the stored
 * tensors themselves: HF -> megatron-core -> HF must read every element
 * from the byte it was stored at, whatever pieces the two tables cut. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/bridge/bridge_int.h"
#include "tests/unit/hf_llama_catalog.h"
#include "tests/unit/check.h"
#include "tests/unit/families.h"

static bool match(const char *pat, const char *name, bool stacked,
		  const char *n0, const char *n1)
{
	char nums[2][24];
	int n = 0;

	if (!rs_map_match(pat, name, stacked, nums, &n))
		return false;
	return (!n0 || (n >= 1 && strcmp(nums[0], n0) == 0)) &&
	       (!n1 || (n >= 2 && strcmp(nums[1], n1) == 0)) &&
	       n == (n0 != NULL) + (n1 != NULL);
}

static void test_match(void)
{
	CHECK(match("a.#.b", "a.12.b", false, "12", NULL));
	CHECK(!match("a.#.b", "a..b", false, NULL, NULL));
	CHECK(!match("a.#.b", "a.1x.b", false, NULL, NULL));
	CHECK(match("a.#.b", "a.b", true, NULL, NULL));          /* stacked */
	CHECK(!match("a.#.b", "a.b", false, NULL, NULL));
	CHECK(!match("a.b", "a.b", true, NULL, NULL));           /* no layer */
	CHECK(match("l.#.e.#.w", "l.e.7.w", true, "7", NULL));
	CHECK(match("l.#.e.#.w", "l.3.e.7.w", false, "3", "7"));
	CHECK(match("optimizer.*", "optimizer.state.exp_avg.x", false, NULL, NULL));
	CHECK(!match("optimizer.*", "optimizers", false, NULL, NULL));
	CHECK(match("*.inv_freq", "model.layers.0.inv_freq", false, NULL, NULL));
	CHECK(!match("a.#", "a.123456789012345678901", false, NULL, NULL));
	/* '*' with '#' and a stacked name (drop rows) */
	CHECK(match("l.#.*.w", "l.3.x.y.w", false, NULL, NULL));
	CHECK(match("l.#.*.w", "l.x.y.w", true, NULL, NULL));
	CHECK(!match("l.#.*.w", "l.x.y.w", false, NULL, NULL));
	CHECK(!match("l.*.w", "l.x.w", true, NULL, NULL));       /* no layer */
	CHECK(match("*#", "ab12", false, NULL, NULL));
	CHECK(!match("*#", "ab12x", false, NULL, NULL));
	CHECK(match("**", "", false, NULL, NULL));
	CHECK(!match("*a*b", "xbxa", false, NULL, NULL));
	CHECK(!match("*#", "a#", false, NULL, NULL));   /* '#' is no letter */
}

/* Many '*'s against a long name that almost matches: a backtracking
 * matcher tries about C(name, stars) splits (never finishing); the
 * automaton is |pat| x |name| steps. */
static void test_match_bounded(void)
{
	char pat[200] = "", name[4200] = "";

	for (int i = 0; i < 40; i++)
		strcat(pat, "*.");
	strcat(pat, "end");
	for (int i = 0; i < 1000; i++)
		strcat(name, "ab.");
	CHECK(!match(pat, name, false, NULL, NULL));
	strcat(name, "end");
	CHECK(match(pat, name, false, NULL, NULL));
}

/* An HF Llama of L layers (tests/unit/hf_llama_catalog.h): H heads in G
 * groups of D rows, hidden HID, ffn FFN, vocab V. */
enum { L = 3, H = HFL_H, G = HFL_G, D = HFL_D, HID = HFL_HID, FFN = HFL_FFN,
       V = HFL_V };

static void add(rs_catalog *c, const char *name, uint64_t rows, uint64_t cols)
{
	CHECK(hfl_add(c, name, RS_DTYPE_F32, rows, cols) == 0);
}

static void hf_llama(rs_catalog *c)
{
	CHECK(hfl_catalog(c, L, HFL_PER_LAYER) == 0);   /* all float32 */
}

/* Where element idx of t is stored: its source and byte offset. */
static bool locate(const rs_tensor *t, const uint64_t *idx, uint32_t *src,
		   uint64_t *off)
{
	int hits = 0;

	for (size_t i = 0; i < t->nfrags; i++) {
		const rs_fragment *f = &t->frags[i];
		uint64_t o = f->offset;
		bool in = true;

		for (int a = 0; a < t->ndim && in; a++) {
			in = idx[a] >= f->box.off[a] &&
			     idx[a] < f->box.off[a] + f->box.len[a];
			o += (idx[a] - f->box.off[a]) * f->stride[a] * 4;
		}
		if (in) {
			*src = f->source;
			*off = o;
			hits++;
		}
	}
	return hits == 1;
}

static const rs_tensor *find(const rs_catalog *c, const char *name)
{
	for (size_t i = 0; i < c->count; i++)
		if (strcmp(c->tensors[i].name, name) == 0)
			return &c->tensors[i];
	return NULL;
}

/* Every element of every tensor of `a` stored where `b`'s same-named
 * tensor has it. */
static bool same_bytes(const rs_catalog *a, const rs_catalog *b)
{
	if (a->count != b->count)
		return false;
	for (size_t i = 0; i < a->count; i++) {
		const rs_tensor *x = &a->tensors[i], *y = find(b, x->name);
		uint64_t rows, cols;

		if (!y || y->ndim != x->ndim ||
		    memcmp(y->shape, x->shape, sizeof(x->shape)))
			return false;
		rows = x->shape[0];
		cols = x->ndim > 1 ? x->shape[1] : 1;
		for (uint64_t r = 0; r < rows; r++)
			for (uint64_t k = 0; k < cols; k++) {
				uint64_t idx[2] = { r, k }, o1, o2;
				uint32_t s1, s2;

				if (!locate(x, idx, &s1, &o1) ||
				    !locate(y, idx, &s2, &o2) || s1 != s2 ||
				    o1 != o2) {
					fprintf(stderr, "%s [%llu, %llu] differs\n",
						x->name, (unsigned long long)r,
						(unsigned long long)k);
					return false;
				}
			}
	}
	return true;
}

static void test_round_trip(void)
{
	rs_checkpoint ck;
	rs_catalog orig;
	rs_diag *d = rs_diag_new();
	const rs_family *to_m = family_find("llama", "hf", "mcore");
	const rs_family *to_h = family_find("llama", "mcore", "hf");
	rs_map_dims dims = { H, G, V, false, false, 0 };
	const rs_tensor *qkv, *fc1;

	memset(&ck, 0, sizeof(ck));
	ck.dir_path = "ckpt";
	rs_catalog_init(&ck.catalog);
	rs_catalog_init(&orig);
	hf_llama(&ck.catalog);
	hf_llama(&orig);
	CHECK(to_m && to_h && d);
	CHECK(rs_remap(&ck, to_m, NULL, 0, "rules.json", &dims, d) == 0);
	CHECK(ck.catalog.count == 9);
	qkv = find(&ck.catalog, "decoder.layers.self_attention.linear_qkv.weight");
	fc1 = find(&ck.catalog, "decoder.layers.mlp.linear_fc1.weight");
	CHECK(qkv && qkv->ndim == 3 && qkv->shape[0] == L &&
	      qkv->shape[1] == (H + 2 * G) * D && !qkv->regular);
	/* [gate; up] as two halves on a grid: the layout's gated fc1 */
	CHECK(fc1 && fc1->shape[1] == 2 * FFN && fc1->regular &&
	      fc1->grid[1] == FFN);
	CHECK(rs_remap(&ck, to_h, NULL, 0, "rules.json", &dims, d) == 0);
	CHECK(same_bytes(&orig, &ck.catalog));
	for (size_t i = 0; rs_diag_line(d, i); i++)
		fprintf(stderr, "%s\n", rs_diag_line(d, i));
	rs_catalog_free(&ck.catalog);
	rs_catalog_free(&orig);
	rs_diag_free(d);
}

/* A tensor no row takes, a missing partner and an odd qkv are refused
 * with a line naming them; the catalog is left as it was. */
static void test_refusals(void)
{
	rs_checkpoint ck;
	rs_diag *d = rs_diag_new();
	const rs_family *to_m = family_find("llama", "hf", "mcore");
	rs_map_dims dims = { H, G, 0, false, false, 0 }, odd = { 3, 1, 0, false, false, 0 };
	static const rs_map_row user[] = {
		{ NULL, RS_MAP_SAME, { "model.extra.*" }, RS_WHEN_ALWAYS, 0 },
	};

	memset(&ck, 0, sizeof(ck));
	ck.dir_path = "ckpt";
	rs_catalog_init(&ck.catalog);
	hf_llama(&ck.catalog);
	add(&ck.catalog, "model.extra.thing", 2, 2);
	CHECK(rs_remap(&ck, to_m, NULL, 0, "rules.json", &dims, d) == -EINVAL);
	CHECK(rs_diag_count(d) == 1 && strstr(rs_diag_line(d, 0), "model.extra.thing has no mcore name"));
	CHECK(find(&ck.catalog, "model.embed_tokens.weight") != NULL);
	/* a user row that leaves it out */
	CHECK(rs_remap(&ck, to_m, user, 1, "rules.json", &dims, d) == 0);
	rs_catalog_free(&ck.catalog);

	rs_catalog_init(&ck.catalog);
	hf_llama(&ck.catalog);
	CHECK(rs_remap(&ck, to_m, NULL, 0, "rules.json", &odd, d) == -EINVAL);
	CHECK(strstr(rs_diag_line(d, rs_diag_count(d) - 1), "do not divide into the heads"));
	rs_catalog_free(&ck.catalog);

	rs_catalog_init(&ck.catalog);
	add(&ck.catalog, "model.layers.0.mlp.gate_proj.weight", FFN, HID);
	CHECK(rs_remap(&ck, to_m, NULL, 0, "rules.json", &dims, d) == -EINVAL);
	CHECK(strstr(rs_diag_line(d, rs_diag_count(d) - 1), "model.layers.0.mlp.up_proj.weight"));
	rs_catalog_free(&ck.catalog);
	rs_diag_free(d);
}

/* A drop row by the per-layer pattern drops a stacked tensor too. */
static void test_drop_stacked(void)
{
	static const rs_map_row drop[] = {
		{ NULL, RS_MAP_SAME,
		  { "decoder.layers.#.self_attention.linear_qkv.layer_norm_weight" },
		  RS_WHEN_ALWAYS, 0 },
	};
	rs_checkpoint ck;
	rs_diag *d = rs_diag_new();
	rs_map_dims dims = { H, G, V, false, false, 0 };

	memset(&ck, 0, sizeof(ck));
	ck.dir_path = "ckpt";
	rs_catalog_init(&ck.catalog);
	hf_llama(&ck.catalog);
	CHECK(rs_remap(&ck, family_find("llama", "hf", "mcore"), NULL, 0,
		       "rules.json", &dims, d) == 0);
	CHECK(rs_remap(&ck, family_find("llama", "mcore", "hf"), drop, 1,
		       "rules.json", &dims, d) == 0);
	CHECK(find(&ck.catalog, "model.layers.0.input_layernorm.weight") == NULL);
	CHECK(find(&ck.catalog, "model.layers.0.post_attention_layernorm.weight") != NULL);
	rs_catalog_free(&ck.catalog);
	rs_diag_free(d);
}

/* HF -> megatron-core -> HF of family `fam`, from the catalog `hf`:
 * every element back at the byte it was stored at. */
static void round_trip_family(const char *fam, rs_catalog *hf,
			      const rs_map_dims *dims, bool packed_back)
{
	rs_checkpoint ck;
	rs_catalog orig;
	rs_diag *d = rs_diag_new();
	rs_map_dims back = *dims;

	memset(&ck, 0, sizeof(ck));
	ck.dir_path = "ckpt";
	rs_catalog_init(&orig);
	for (size_t i = 0; i < hf->count; i++) {
		const rs_tensor *t = &hf->tensors[i];

		add(&orig, t->name, t->shape[0], t->ndim > 1 ? t->shape[1] : 0);
	}
	ck.catalog = *hf;
	CHECK(rs_remap(&ck, family_find(fam, "hf", "mcore"), NULL, 0, NULL,
		       dims, d) == 0);
	back.packed = packed_back;
	CHECK(rs_remap(&ck, family_find(fam, "mcore", "hf"), NULL, 0, NULL,
		       &back, d) == 0);
	for (size_t i = 0; i < rs_diag_count(d); i++)
		fprintf(stderr, "%s\n", rs_diag_line(d, i));
	CHECK(same_bytes(&ck.catalog, &orig));
	rs_catalog_free(&ck.catalog);
	rs_catalog_free(&orig);
	rs_diag_free(d);
}

/* Experts: per-expert HF tensors gathered into megatron's [L, E, ...]
 * and split back (Qwen3-MoE's names); a missing expert refused. */
static void test_experts(void)
{
	enum { NL = 2, E = 3, F = 2 };
	rs_map_dims dims = { H, G, 0, false, false, E };
	rs_catalog c;
	char name[128];

	rs_catalog_init(&c);
	for (int l = 0; l < NL; l++) {
		snprintf(name, sizeof(name), "model.layers.%d.mlp.gate.weight", l);
		add(&c, name, E, HID);
		for (int e = 0; e < E; e++) {
			static const char *const w[] = { "gate_proj", "up_proj" };

			for (int k = 0; k < 2; k++) {
				snprintf(name, sizeof(name),
					 "model.layers.%d.mlp.experts.%d.%s.weight",
					 l, e, w[k]);
				add(&c, name, F, HID);
			}
			snprintf(name, sizeof(name),
				 "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
			add(&c, name, HID, F);
		}
	}
	round_trip_family("qwen3_moe", &c, &dims, false);

	/* expert 1 of layer 1 missing */
	{
		rs_checkpoint ck;
		rs_diag *d = rs_diag_new();

		memset(&ck, 0, sizeof(ck));
		ck.dir_path = "ckpt";
		rs_catalog_init(&ck.catalog);
		for (int e = 0; e < E; e++)
			for (int l = 0; l < NL; l++) {
				if (l == 1 && e == 1)
					continue;
				snprintf(name, sizeof(name),
					 "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
				add(&ck.catalog, name, HID, F);
			}
		CHECK(rs_remap(&ck, family_find("qwen3_moe", "hf", "mcore"), NULL,
			       0, NULL, &dims, d) == -EINVAL);
		CHECK(rs_diag_count(d) >= 1 &&
		      strstr(rs_diag_line(d, 0), "layer 1 has no expert 1"));
		rs_catalog_free(&ck.catalog);
		rs_diag_free(d);
	}
}

/* Phi-3's fused [q; k; v] and [gate; up] to megatron and back. */
static void test_flat_qkv(void)
{
	rs_map_dims dims = { H, G, 0, false, false, 0 };
	rs_catalog c;

	rs_catalog_init(&c);
	add(&c, "model.layers.0.self_attn.qkv_proj.weight", (H + 2 * G) * D, HID);
	add(&c, "model.layers.0.mlp.gate_up_proj.weight", 2 * FFN, HID);
	round_trip_family("phi3", &c, &dims, false);
}

/* Where q head hh's row k sits in megatron's grouped qkv and in the
 * flat [q; k; v]: qkv_flat moves each to the other (an oracle written
 * from the layouts, not from ops.c). */
static void test_qkv_flat_rows(void)
{
	enum { h = 6, g = 2, d = 3 };
	rs_map_dims dims = { h, g, 0, false, false, 0 };
	rs_map_job j;
	uint64_t rows = (h + 2 * g) * d, to[(h + 2 * g) * d];

	memset(&j, 0, sizeof(j));
	j.op = RS_MAP_QKV_FLAT;
	j.dims = &dims;
	j.nsrc = 1;
	j.ndim[0] = 1;
	j.shape[0][0] = rows;
	CHECK(rs_map_run(&j) == 0);
	for (size_t p = 0; p < j.npcs; p++)
		for (uint64_t r = j.pcs[p].lo; r < j.pcs[p].hi; r++)
			to[r] = j.pcs[p].at + (r - j.pcs[p].lo);
	for (uint64_t hh = 0; hh < h; hh++)
		for (uint64_t k = 0; k < d; k++) {
			uint64_t grp = hh / (h / g), in = hh % (h / g);
			uint64_t mrow = grp * (h / g + 2) * d + in * d + k;

			CHECK(to[mrow] == hh * d + k);
		}
	for (uint64_t gg = 0; gg < g; gg++)
		for (uint64_t k = 0; k < d; k++) {
			uint64_t base = gg * (h / g + 2) * d + (h / g) * d;

			CHECK(to[base + k] == h * d + gg * d + k);           /* k */
			CHECK(to[base + d + k] == (h + g) * d + gg * d + k); /* v */
		}
	free(j.pcs);
}

/* Family files as hostile input: each malformed one refused with a line
 * naming the file; a good one replaces the built-in family. */
static void test_family_files(void)
{
	static const struct {
		const char *json, *needle;
	} bad[] = {
		{ "{\"families\": 3}", "must be a list" },
		{ "{\"families\": [{\"family\": \"x\", \"config\": [{\"hf\": \"a\", \"type\": \"float\"}]}]}",
		  "\"type\" must be" },
		{ "{\"families\": [{\"family\": \"Bad Name\"}]}", "\"family\" must name it" },
		{ "{\"families\": [{\"family\": \"x\", \"base\": \"nope\"}]}", "base nope is no family" },
		{ "{\"families\": [{\"family\": \"x\", \"base\": \"y\"}, {\"family\": \"y\", \"base\": \"x\"}]}",
		  "too deep" },
		{ "{\"families\": [{\"family\": \"x\", \"names\": [{\"from\": \"hf\", \"to\": \"hf\", \"target\": null, \"sources\": [\"a\"]}]}]}",
		  "two of mcore, hf and metaseq" },
		{ "{\"families\": [{\"family\": \"x\", \"checks\": [{\"hf\": \"a\"}]}]}", "a check needs" },
		{ "{\"families\": [{\"family\": \"x\", \"family\": \"y\"}]}", "given twice" },
		{ "{\"families\": [{\"family\": \"x\", \"config\": [{\"hf\": \"a\", \"type\": \"int\", \"axis\": 9}]}]}",
		  "\"axis\" must be" },
	};
	char path[] = "/tmp/rs_family_XXXXXX";
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	close(fd);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		FILE *f = fopen(path, "w");
		rs_families *fs = NULL;
		rs_diag *d = rs_diag_new();

		fputs(bad[i].json, f);
		fclose(f);
		CHECK(rs_families_load(path, &fs, d) == -EINVAL && !fs);
		CHECK(rs_diag_count(d) >= 1 &&
		      strstr(rs_diag_line(d, 0), path) &&
		      strstr(rs_diag_line(d, 0), bad[i].needle));
		if (!(rs_diag_count(d) >= 1 && strstr(rs_diag_line(d, 0), bad[i].needle)))
			fprintf(stderr, "case %zu: %s\n", i,
				rs_diag_count(d) ? rs_diag_line(d, 0) : "(none)");
		rs_diag_free(d);
	}
	{
		FILE *f = fopen(path, "w");
		rs_families *fs = NULL;
		rs_diag *d = rs_diag_new();
		const rs_family *q;

		fputs("{\"families\": [{\"family\": \"qwen2\", \"base\": \"llama\", \"architectures\": [\"Qwen2ForCausalLM\"]}]}", f);
		fclose(f);
		CHECK(rs_families_load(path, &fs, d) == 0);
		q = rs_families_by_arch(fs, "Qwen2ForCausalLM", NULL, "hf", "mcore");
		CHECK(q && strcmp(q->info->path, path) == 0);
		rs_families_free(fs);
		rs_diag_free(d);
	}
	unlink(path);
}

int main(void)
{
	test_experts();
	test_flat_qkv();
	test_qkv_flat_rows();
	test_family_files();
	test_match();
	test_match_bounded();
	test_round_trip();
	test_drop_stacked();
	test_refusals();
	return CHECK_DONE();
}
