/* Layout resolution, sharding rules and vocab padding. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/layout.h"
#include "tests/unit/check.h"

static size_t add(rs_catalog *c, const char *name, int n, const uint64_t *shape,
		  const uint64_t *chunk)
{
	size_t i = 0;

	CHECK(rs_catalog_add_regular(c, name, RS_DTYPE_BF16, n, shape, chunk, &i) == 0);
	return i;
}

static bool diag_has(const rs_diag *d, const char *a, const char *b)
{
	for (size_t i = 0; rs_diag_line(d, i); i++)
		if (strstr(rs_diag_line(d, i), a) && (!b || strstr(rs_diag_line(d, i), b)))
			return true;
	return false;
}

/* A GPT saved at source tp=ts (vocab rows `rows`). */
static void gpt(rs_catalog *c, uint64_t ts, uint64_t rows, const char *prefix)
{
	char name[200];
	uint64_t qkv[] = { 4, 256, 64 }, qkvc[] = { 1, 256 / ts, 64 };
	uint64_t fc1[] = { 4, 256, 64 }, fc1c[] = { 1, 256 / (2 * ts), 64 };
	uint64_t fc2[] = { 4, 64, 128 }, fc2c[] = { 1, 64, 128 / ts };
	uint64_t emb[] = { rows, 64 }, embc[] = { rows / ts, 64 };
	uint64_t ln[] = { 4, 64 };

	snprintf(name, sizeof(name), "%sdecoder.layers.self_attention.linear_qkv.weight", prefix);
	add(c, name, 3, qkv, qkvc);
	snprintf(name, sizeof(name), "%sdecoder.layers.mlp.linear_fc1.weight", prefix);
	add(c, name, 3, fc1, fc1c);
	snprintf(name, sizeof(name), "optimizer.state.exp_avg.%sdecoder.layers.mlp.linear_fc2.weight", prefix);
	add(c, name, 3, fc2, fc2c);
	snprintf(name, sizeof(name), "%sembedding.word_embeddings.weight", prefix);
	add(c, name, 2, emb, embc);
	snprintf(name, sizeof(name), "%sdecoder.layers.mlp.linear_fc1.layer_norm_weight", prefix);
	add(c, name, 2, ln, ln);
	snprintf(name, sizeof(name), "%sunknown.thing", prefix);
	add(c, name, 2, ln, ln);
}

static void test_resolve(void)
{
	rs_rules *r;
	rs_catalog c;
	rs_layout l;
	rs_layout_opts o = { .tp = 8 };
	rs_diag *d = rs_diag_new();

	rs_rules_new(&r);
	rs_catalog_init(&c);
	gpt(&c, 2, 1024, "model.");
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.src_tp == 2 && l.tp == 8 && l.layers == 4);
	CHECK(l.targets[0].axis == 1 && l.targets[0].chunk[1] == 32);
	CHECK(l.targets[1].multiplier == 2 && l.targets[1].chunk[1] == 16);
	CHECK(l.targets[2].axis == 2 && l.targets[2].chunk[2] == 16);
	CHECK(l.targets[3].axis == 0 && l.targets[3].shape[0] == 1024 &&
	      l.targets[3].chunk[0] == 128);
	CHECK(l.targets[4].has_rule && l.targets[4].axis == -1 && !l.targets[4].changed);
	CHECK(!l.targets[5].has_rule && !l.targets[5].changed);
	rs_layout_free(&l);

	/* tp=1 source: fc1's 2 chunks do not make the source tp 2. */
	rs_catalog_free(&c);
	rs_catalog_init(&c);
	gpt(&c, 1, 1024, "");
	o.tp = 4;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.src_tp == 1 && l.targets[1].multiplier == 2 &&
	      l.targets[1].chunk[1] == 256 / 8);
	rs_layout_free(&l);

	/* Uneven split: tensor, axis and sizes are named. */
	o.tp = 3;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "decoder.layers.self_attention.linear_qkv.weight: axis 1 of size 256", "3 chunks"));

	/* Vocab: stored padding kept when it divides, else vocab_size asked. */
	rs_diag_free(d);
	d = rs_diag_new();
	rs_catalog_free(&c);
	rs_catalog_init(&c);
	gpt(&c, 2, 1000, "");
	o.tp = 16;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "embedding.word_embeddings.weight", "vocab_size"));
	o.vocab_size = 1000;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.targets[3].shape[0] == 2048 && l.targets[3].changed);
	rs_layout_free(&l);
	o.tp = 8;
	o.vocab_size = 1001;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "vocab_size=1001 exceeds", NULL));

	/* pp must divide the layer count. */
	o.vocab_size = 1000;
	o.pp = 3;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "pp=3", "4 layers"));
	o.pp = 2;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	rs_layout_free(&l);

	rs_catalog_free(&c);
	rs_rules_free(r);
	rs_diag_free(d);
}

/* An MoE layer stack saved at tp=2, etp=2: 8 experts, gated fc1. */
static void test_experts(void)
{
	uint64_t fc1[] = { 2, 8, 64, 64 }, fc1c[] = { 1, 1, 16, 64 };
	uint64_t fc2[] = { 2, 8, 64, 32 }, fc2c[] = { 1, 1, 64, 16 };
	uint64_t qkv[] = { 2, 128, 64 }, qkvc[] = { 1, 64, 64 };
	uint64_t rt[] = { 2, 8, 64 };
	uint64_t odd[] = { 2, 6, 64, 32 };
	rs_layout_opts o = { .tp = 1, .ep = 4, .etp = 1 };
	rs_diag *d = rs_diag_new();
	rs_catalog c;
	rs_layout l;
	rs_rules *r;

	rs_rules_new(&r);
	rs_catalog_init(&c);
	add(&c, "decoder.layers.mlp.experts.experts.linear_fc1.weight", 4, fc1, fc1c);
	add(&c, "decoder.layers.mlp.experts.experts.linear_fc2.weight", 4, fc2, fc2c);
	add(&c, "decoder.layers.self_attention.linear_qkv.weight", 3, qkv, qkvc);
	add(&c, "decoder.layers.mlp.router.weight", 3, rt, rt);
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.experts == 8 && l.ep == 4 && l.etp == 1 && l.src_etp == 2 &&
	      l.src_tp == 2 && l.tp == 1);
	CHECK(l.targets[0].expert_axis == 1 && l.targets[0].by_etp &&
	      l.targets[0].axis == 2 && l.targets[0].multiplier == 2 &&
	      l.targets[0].chunk[1] == 1 && l.targets[0].chunk[2] == 32);
	CHECK(l.targets[1].axis == 3 && l.targets[1].chunk[3] == 32);
	CHECK(l.targets[2].expert_axis == -1 && !l.targets[2].by_etp &&
	      l.targets[2].chunk[1] == 128);
	CHECK(l.targets[3].has_rule && l.targets[3].axis == -1);
	rs_layout_free(&l);

	/* etp apart from tp; etp defaults to tp. */
	o.tp = 2;
	o.etp = 0;
	o.ep = 0;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.etp == 2 && l.ep == 1 && l.targets[0].chunk[2] == 16);
	rs_layout_free(&l);
	o.tp = 1;
	o.etp = 4;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.targets[2].chunk[1] == 128 && l.targets[0].chunk[2] == 8 &&
	      l.targets[1].chunk[3] == 8);
	rs_layout_free(&l);

	/* ep must divide the experts: the refusal lists what does. */
	o.etp = 0;
	o.ep = 3;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "ep=3: the checkpoint's 8 experts", "ep can be 1, 2, 4, 8"));

	/* Expert weights that disagree on the expert count are refused. */
	add(&c, "decoder.layers.mlp.experts.experts.linear_fc2.bias", 4, odd, odd);
	o.ep = 2;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "linear_fc2.bias holds 6 experts", "holds 8"));
	rs_catalog_free(&c);

	/* Per-expert keys (singleton_local_shards): the count from names. */
	rs_catalog_init(&c);
	{
		uint64_t w[] = { 32, 64 }, wc[] = { 16, 64 };
		char name[128];

		for (int e = 0; e < 8; e++) {
			snprintf(name, sizeof(name),
				 "decoder.layers.1.mlp.experts.experts.%d.linear_fc1.weight_w", e);
			add(&c, name, 2, w, wc);
		}
		o.ep = 4;
		o.etp = 1;
		CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
		CHECK(l.experts == 8 && l.targets[5].expert == 5 &&
		      l.targets[5].by_etp && l.targets[5].chunk[0] == 32 &&
		      l.targets[5].expert_axis == -1);
		rs_layout_free(&l);
		/* ... which must agree with the expert weights' axis */
		add(&c, "decoder.layers.mlp.experts.experts.linear_fc2.weight", 4,
		    (uint64_t[]){ 2, 4, 64, 32 }, (uint64_t[]){ 1, 1, 64, 16 });
		CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
		CHECK(diag_has(d, "names expert 7, but the expert weights hold 4", NULL));
	}
	rs_catalog_free(&c);

	/* ep on a dense model is a mistake, ep=1 is not. */
	o.ep = 2;
	rs_catalog_init(&c);
	add(&c, "decoder.layers.self_attention.linear_qkv.weight", 3, qkv, qkvc);
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == -EINVAL);
	CHECK(diag_has(d, "ep=2: the checkpoint has no expert weights", NULL));
	o.ep = 1;
	CHECK(rs_layout_resolve(&c, r, &o, &l, d) == 0);
	CHECK(l.experts == 0 && l.src_etp == l.src_tp);
	rs_layout_free(&l);
	rs_catalog_free(&c);
	rs_rules_free(r);
	rs_diag_free(d);
}

static void test_padding(void)
{
	CHECK(rs_padded_vocab(128256, 128, 1) == 128256);
	CHECK(rs_padded_vocab(128256, 128, 4) == 128512);
	CHECK(rs_padded_vocab(128256, 128, 8) == 129024);
	CHECK(rs_padded_vocab(1, 128, 8) == 1024);
	CHECK(rs_padded_vocab(UINT64_MAX, 128, 8) == 0);
}

static void test_rules(void)
{
	rs_rules *r;
	rs_diag *d = rs_diag_new();
	int layers;
	const rs_rule *hit;
	char path[] = "/tmp/rs_rules_XXXXXX";
	int fd;
	FILE *f;

	CHECK(rs_glob_match("*a.b", "x.a.b"));
	CHECK(!rs_glob_match("*a.b", "x.a.bc"));
	CHECK(rs_glob_match("a*c*e", "abcde"));
	CHECK(strcmp(rs_rules_base_name("optimizer.state.exp_avg.model.embedding.x"),
		     "embedding.x") == 0);
	rs_rules_new(&r);
	hit = rs_rules_match(r, "decoder.layers.3.mlp.linear_fc2.weight", &layers);
	CHECK(hit && hit->axis == 1 && layers == 0);
	hit = rs_rules_match(r, "model.decoder.layers.mlp.linear_fc2.weight", &layers);
	CHECK(hit && layers == 1);
	hit = rs_rules_match(r, "decoder.layers.self_attention.linear_qkv.layer_norm_weight", &layers);
	CHECK(hit && hit->split == RS_SPLIT_NONE);
	/* Built-in expert rows. */
	/* The expert a per-expert key names. */
	hit = rs_rules_match(r, "decoder.layers.3.mlp.experts.experts.12.linear_fc2.weight", &layers);
	CHECK(hit && rs_rule_expert_of_name(hit, "optimizer.state.exp_avg.decoder.layers.3.mlp.experts.experts.12.linear_fc2.weight") == 12);
	CHECK(rs_rule_expert_of_name(hit, "decoder.layers.3.mlp.experts.experts.1234567890.linear_fc2.weight") == -1);
	CHECK(rs_rule_expert_of_name(hit, "decoder.layers.3.mlp.experts.experts.x.linear_fc2.weight") == -1);
	hit = rs_rules_match(r, "decoder.layers.mlp.experts.experts.linear_fc2.weight", &layers);
	CHECK(hit && hit->expert_axis == 0 && hit->etp && hit->axis == 2 && layers == 1);
	hit = rs_rules_match(r, "decoder.layers.3.mlp.experts.experts.5.linear_fc1.weight_v", &layers);
	CHECK(hit && hit->expert_axis == -1 && hit->etp && hit->axis == 0 && layers == 0);
	hit = rs_rules_match(r, "decoder.layers.mlp.shared_experts.linear_fc2.weight", &layers);
	CHECK(hit && hit->expert_axis == -1 && !hit->etp && hit->axis == 1);

	fd = mkstemp(path);
	f = fdopen(fd, "w");
	fputs("{\"rules\": [{\"match\": \"*.my_proj.weight\", \"split\": \"row\"},"
	      " {\"match\": \"*linear_fc2.weight\", \"split\": \"replicated\"},"
	      " {\"match\": \"*.deep\", \"axis\": 2, \"layer_axes\": 1}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == 0);
	hit = rs_rules_match(r, "x.my_proj.weight", &layers);
	CHECK(hit && hit->split == RS_SPLIT_AXIS && hit->axis == 1);
	hit = rs_rules_match(r, "decoder.layers.mlp.linear_fc2.weight", &layers);
	CHECK(hit && hit->split == RS_SPLIT_NONE);   /* user rule overrides */
	hit = rs_rules_match(r, "a.deep", &layers);
	CHECK(hit && hit->axis == 2 && layers == 1);

	/* A user's expert rule. */
	f = fopen(path, "w");
	fputs("{\"rules\": [{\"match\": \"*.w_in\", \"split\": \"column\","
	      " \"expert_axis\": 1, \"etp\": true}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == 0);
	hit = rs_rules_match(r, "moe.w_in", &layers);
	CHECK(hit && hit->expert_axis == 1 && hit->etp && hit->axis == 0);
	f = fopen(path, "w");
	fputs("{\"rules\": [{\"match\": \"*.ex*.w\", \"axis\": 1, \"expert_key\": \".ex\"}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == 0);
	hit = rs_rules_match(r, "moe.ex7.w", &layers);
	CHECK(hit && rs_rule_expert_of_name(hit, "moe.ex7.w") == 7);
	f = fopen(path, "w");
	fputs("{\"rules\": [{\"match\": \"x\", \"axis\": 1, \"expert_axis\": 1}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == -EINVAL);
	CHECK(diag_has(d, path, "cannot be the expert axis"));
	f = fopen(path, "w");
	fputs("{\"rules\": [{\"match\": \"x\", \"axis\": 1, \"etp\": 1}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == -EINVAL);
	CHECK(diag_has(d, path, "\"etp\" must be true or false"));

	f = fopen(path, "w");
	fputs("{\"rules\": [{\"match\": \"x\", \"split\": \"diagonal\"}]}", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == -EINVAL);
	CHECK(diag_has(d, path, "\"split\" must be"));
	f = fopen(path, "w");
	fputs("{\"rules\": 3", f);
	fclose(f);
	CHECK(rs_rules_load_json(r, path, d) == -EINVAL);
	CHECK(diag_has(d, path, "not valid JSON"));
	unlink(path);
	rs_rules_free(r);
	rs_diag_free(d);
}

/* Hostile names reach diag lines: control bytes and invalid UTF-8 are
 * escaped, valid UTF-8 is kept. */
static void test_diag_sanitizes(void)
{
	rs_diag *d = rs_diag_new();

	rs_diag_add(d, "%s: bad", "a\x1b[31mb\xff\xc3\xa9\n");
	CHECK(strcmp(rs_diag_line(d, 0), "a\\x1b[31mb\\xff\xc3\xa9\\x0a: bad") == 0);
	rs_diag_free(d);
}

int main(void)
{
	test_diag_sanitizes();
	test_padding();
	test_rules();
	test_resolve();
	test_experts();
	return CHECK_DONE();
}
