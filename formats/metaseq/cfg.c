/* metaseq cfg: the model's architecture read from a checkpoint's "cfg"
 * (or fairseq's older "args"), and the flat-param description it implies
 * (docs/FORMATS.md, "metaseq", "Deriving the flat params"). */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"
#include "planner/box.h"

/* Interpolations ("${common.model_parallel_size}") followed at most this
 * deep: a cycle is a refusal, not a hang. */
#define MS_CFG_MAX_HOPS 8
/* Interpolations followed in all, for one cfg: each hop may name a path
 * of many keys, each an interpolation again. */
#define MS_CFG_MAX_FOLLOWED 256
/* Bounds that keep every product of the derivation below 2^64 (OPT-175B:
 * 96 layers, 12288 wide, ffn 49152, 2048 positions). */
#define MS_CFG_MAX_LAYERS 100000u
#define MS_CFG_MAX_DIM (1u << 24)

/* The mapping behind v: a dict or OrderedDict, an argparse.Namespace's
 * state, an OmegaConf DictConfig's _content; NULL for anything else
 * (and for an empty OrderedDict, which holds no field either). */
static const rs_pvalue *cfg_map(const rs_pvalue *v)
{
	const rs_pvalue *items = NULL, *st;

	if (ms_dict(v, &items))
		return items;
	if (rs_pv_call_is(v, "argparse.Namespace"))
		return ms_dict(rs_pv_state(v), &items) ? items : NULL;
	if (rs_pv_call_is(v, "omegaconf.dictconfig.DictConfig")) {
		st = rs_pv_state(v);
		return ms_dict(rs_pv_get(st, "_content"), &items) ? items
								  : NULL;
	}
	return NULL;
}

/* An OmegaConf value node (omegaconf.nodes.AnyNode, IntegerNode, ...)
 * stands for its _val; anything else for itself. */
static const rs_pvalue *cfg_leaf(const rs_pvalue *v)
{
	const char *mod = rs_pv_global_module(rs_pv_func(v));

	if ((rs_pv_kind(v) == RS_PV_OBJECT || rs_pv_kind(v) == RS_PV_REDUCE) &&
	    mod && strcmp(mod, "omegaconf.nodes") == 0)
		return rs_pv_get(rs_pv_state(v), "_val");
	return v;
}

typedef struct {
	const rs_pvalue *root;          /* cfg: for interpolations */
	const rs_pvalue *sections[4];   /* where fields are looked up, in
					 * order; NULL ends */
	unsigned followed;              /* interpolations followed so far */
} cfg_scope;

/* The value at dotted `path` below the cfg root, interpolations
 * followed. */
static const rs_pvalue *cfg_path(cfg_scope *s, const char *path, int hops);

static const rs_pvalue *cfg_resolve(cfg_scope *s, const rs_pvalue *v,
				    int hops)
{
	const char *str;
	char path[128];
	size_t n;

	v = cfg_leaf(v);
	str = ms_whole_str(v);
	if (!str || strncmp(str, "${", 2) != 0)
		return v;
	n = strlen(str);
	if (hops >= MS_CFG_MAX_HOPS || s->followed >= MS_CFG_MAX_FOLLOWED ||
	    n < 4 || str[n - 1] != '}' || n - 3 >= sizeof(path))
		return NULL;
	s->followed++;
	memcpy(path, str + 2, n - 3);
	path[n - 3] = 0;
	return cfg_path(s, path, hops + 1);
}

static const rs_pvalue *cfg_path(cfg_scope *s, const char *path, int hops)
{
	const rs_pvalue *v = s->root;
	char key[128];

	while (*path) {
		size_t n = strcspn(path, ".");

		if (n >= sizeof(key))
			return NULL;
		memcpy(key, path, n);
		key[n] = 0;
		v = cfg_resolve(s, rs_pv_get(cfg_map(v), key), hops);
		if (!v)
			return NULL;
		path += n + (path[n] == '.');
	}
	return v;
}

/* Field `key` of the first section that has it (None counts as absent). */
static const rs_pvalue *field(cfg_scope *s, const char *key)
{
	for (int i = 0; i < 4 && s->sections[i]; i++) {
		const rs_pvalue *v = rs_pv_get(s->sections[i], key);

		if (v) {
			v = cfg_resolve(s, v, 0);
			if (v && rs_pv_kind(v) != RS_PV_NONE)
				return v;
		}
	}
	return NULL;
}

/* A positive int field (required unless *out is preset, the default). */
static int int_field(cfg_scope *s, const char *key, bool required,
		     uint64_t *out, const char *where, rs_diag *d)
{
	const rs_pvalue *v = field(s, key);
	int64_t x;

	if (!v && !required)
		return 0;
	if (!v || rs_pv_int(v, &x) != 0 || x <= 0 || x > (int64_t)UINT32_MAX) {
		rs_diag_add(d, "%s: cfg: model.%s is %s, not a positive integer",
			    where, key, v ? "something else" : "missing");
		return -EINVAL;
	}
	*out = (uint64_t)x;
	return 0;
}

/* A bool field; missing: the default in *out (metaseq's dataclass
 * default). */
static int bool_field(cfg_scope *s, const char *key, bool *out,
		      const char *where, rs_diag *d)
{
	const rs_pvalue *v = field(s, key);

	if (v && rs_pv_bool(v, out) != 0) {
		rs_diag_add(d, "%s: cfg: model.%s is not a bool", where, key);
		return -EINVAL;
	}
	return 0;
}

int ms_cfg_read(const rs_pvalue *top, const char *where, ms_cfg *c,
		rs_diag *d)
{
	const rs_pvalue *cfg = rs_pv_get(top, "cfg");
	const rs_pvalue *args = rs_pv_get(top, "args");
	cfg_scope s = { .root = cfg };
	const rs_pvalue *cmap = cfg_map(cfg), *model, *v;
	uint64_t layers = 0, dim = 0, ffn = 0, heads = 0, mp = 1, pos = 0,
		 in_dim = 0, out_dim = 0;
	bool learned = false, no_final = false, no_scale = false;
	const char *arch, *act;
	int64_t mpv;
	int n = 0, err;

	memset(c, 0, sizeof(*c));
	model = cfg_map(cfg_resolve(&s, rs_pv_get(cmap, "model"), 0));
	if (model)
		s.sections[n++] = model;
	if (cfg_map(args))
		s.sections[n++] = cfg_map(args);
	if (!n)
		return 0;       /* no cfg: nothing derived */
	if (cmap && cfg_map(rs_pv_get(cmap, "common")))
		s.sections[n++] = cfg_map(rs_pv_get(cmap, "common"));
	if (cmap && cfg_map(rs_pv_get(cmap, "distributed_training")))
		s.sections[n++] = cfg_map(rs_pv_get(cmap, "distributed_training"));
	c->present = true;
	err = int_field(&s, "decoder_layers", true, &layers, where, d);
	if (!err)
		err = int_field(&s, "decoder_embed_dim", true, &dim, where, d);
	if (!err)
		err = int_field(&s, "decoder_ffn_embed_dim", true, &ffn, where, d);
	if (!err)
		err = int_field(&s, "decoder_attention_heads", true, &heads,
				where, d);
	/* Informational only (the parts SOURCE holds decide, see
	 * ms_meta_from_cfg): a value that is no positive int is ignored. */
	v = field(&s, "model_parallel_size");
	if (v && rs_pv_int(v, &mpv) == 0 && mpv > 0 && mpv <= UINT32_MAX)
		mp = (uint64_t)mpv;
	in_dim = out_dim = dim;
	if (!err)
		err = int_field(&s, "decoder_input_dim", false, &in_dim, where, d);
	if (!err)
		err = int_field(&s, "decoder_output_dim", false, &out_dim, where,
				d);
	if (!err)
		err = bool_field(&s, "decoder_learned_pos", &learned, where, d);
	if (!err)
		err = bool_field(&s, "decoder_normalize_before",
				 &c->m.pre_norm, where, d);
	if (!err)
		err = bool_field(&s, "no_decoder_final_norm", &no_final, where, d);
	if (!err)
		err = bool_field(&s, "share_decoder_input_output_embed",
				 &c->m.tied, where, d);
	if (!err)
		err = bool_field(&s, "no_scale_embedding", &no_scale, where, d);
	if (err)
		return err;
	if (!learned) {
		rs_diag_add(d, "%s: cfg: model.decoder_learned_pos is not true: sinusoidal positions are not supported (no OPT model has them)",
			    where);
		return -EINVAL;
	}
	if (in_dim != dim || out_dim != dim) {
		rs_diag_add(d, "%s: cfg: model.decoder_input_dim or decoder_output_dim differs from decoder_embed_dim (%llu): project_in/project_out layers are not supported",
			    where, (unsigned long long)dim);
		return -EINVAL;
	}
	err = int_field(&s, "max_target_positions", true, &pos, where, d);
	if (err)
		return err;
	if (layers > MS_CFG_MAX_LAYERS || dim > MS_CFG_MAX_DIM ||
	    ffn > MS_CFG_MAX_DIM || pos > MS_CFG_MAX_DIM) {
		rs_diag_add(d, "%s: cfg: decoder_layers %llu, decoder_embed_dim %llu, decoder_ffn_embed_dim %llu or max_target_positions %llu is past what any model has (%u layers, %u wide)",
			    where, (unsigned long long)layers,
			    (unsigned long long)dim, (unsigned long long)ffn,
			    (unsigned long long)pos, MS_CFG_MAX_LAYERS,
			    MS_CFG_MAX_DIM);
		return -EINVAL;
	}
	if (dim % heads) {
		rs_diag_add(d, "%s: cfg: model.decoder_attention_heads %llu does not divide decoder_embed_dim %llu",
			    where, (unsigned long long)heads,
			    (unsigned long long)dim);
		return -EINVAL;
	}
	/* metaseq's ModelParallelTransformerDecoder (arch
	 * transformer_lm_megatron, needed for model parallelism) fuses
	 * q/k/v into one qkv_proj; the plain TransformerDecoder keeps
	 * k_proj, v_proj, q_proj. */
	arch = ms_whole_str(field(&s, "_name"));
	if (!arch)
		arch = ms_whole_str(field(&s, "arch"));
	c->m.fused_qkv = arch ? strstr(arch, "megatron") != NULL : mp > 1;
	act = ms_whole_str(field(&s, "activation_fn"));
	snprintf(c->m.activation, sizeof(c->m.activation), "%s",
		 act ? act : "relu");
	if (act && strlen(act) >= sizeof(c->m.activation)) {
		rs_diag_add(d, "%s: cfg: model.activation_fn is too long",
			    where);
		return -EINVAL;
	}
	v = field(&s, "alibi");
	if (v && rs_pv_bool(v, &learned) == 0 && learned) {
		rs_diag_add(d, "%s: cfg: model.alibi is set: ALiBi models have no position table, which OPT's layout has",
			    where);
		return -EINVAL;
	}
	v = field(&s, "layernorm_embedding");
	if (v && rs_pv_bool(v, &learned) == 0 && learned) {
		rs_diag_add(d, "%s: cfg: model.layernorm_embedding is set: an embedding layer norm is not supported",
			    where);
		return -EINVAL;
	}
	c->scale_embedding = !no_scale;
	c->m.embed_scaled = !no_scale;
	c->m.from = "cfg";
	c->m.layers = (uint32_t)layers;
	c->m.hidden = (uint32_t)dim;
	c->m.ffn = (uint32_t)ffn;
	c->m.heads = (uint32_t)heads;
	c->m.max_positions = pos;
	/* LearnedPositionalEmbedding: padding_idx (the dictionary's pad,
	 * 1) + 1 rows more than the positions */
	c->m.position_rows = pos + 2;
	c->m.source_tp = (uint32_t)mp;
	c->m.final_norm = c->m.pre_norm && !no_final;
	return 0;
}

/* ---- the flat params cfg implies --------------------------------------- */

typedef struct {
	const char *name;
	uint64_t shape[2];
	int ndim;
} pdesc;

static int add_flat(ms_meta *m, size_t *cap, const char *key, size_t plen,
		    const pdesc *ps, size_t n)
{
	ms_flat *f;

	if (rs_array_reserve(&m->flats, cap, m->nflats + 1, sizeof(ms_flat)))
		return -ENOMEM;
	f = &m->flats[m->nflats];
	memset(f, 0, sizeof(*f));
	f->key = strdup(key);
	f->params = calloc(n, sizeof(ms_param));
	m->nflats++;
	if (!f->key || !f->params)
		return -ENOMEM;
	f->prefix_len = plen;
	for (size_t i = 0; i < n; i++) {
		ms_param *p = &f->params[f->nparams];

		if (!(p->name = strdup(ps[i].name)))
			return -ENOMEM;
		f->nparams++;
		p->ndim = ps[i].ndim;
		memcpy(p->shape, ps[i].shape, sizeof(ps[i].shape));
		rs_product(p->shape, p->ndim, &p->numel);  /* < 2^64: checked */
		f->total += p->numel;
	}
	return 0;
}

/* The elements shard 0 .. D-1 of flat param `key` hold together, and
 * shard 0's size; 0 when a shard lacks it. */
static bool stored(const ms_file *f, size_t nshards, const char *key,
		   uint64_t *sum, uint64_t *first)
{
	*sum = 0;
	*first = 0;
	for (size_t r = 0; r < nshards; r++) {
		const ms_tensor *t = ms_file_find(&f[r], key);

		if (!t || t->ndim != 1)
			return false;
		if (r == 0)
			*first = t->shape[0];
		*sum += t->shape[0];
	}
	return true;
}

int ms_meta_from_cfg(ms_cfg *c, const ms_file *f, size_t nshards,
		     uint32_t nparts, ms_meta *m, const char *where,
		     rs_diag *d)
{
	/* The parts SOURCE holds, not cfg's model_parallel_size, which
	 * metaseq's resharding tools leave stale: a part missing makes every
	 * layer's size disagree below. */
	const uint64_t H = c->m.hidden, M = nparts ? nparts : 1;
	const uint64_t Hp = H / M, F = c->m.ffn / M;
	uint64_t rest, sum, first, vp, total;
	size_t cap = 0, nroot = 0;
	pdesc root[5], layer[16];
	size_t nl = 0;
	int err;

	memset(m, 0, sizeof(*m));
	if (H % M || c->m.ffn % M || c->m.heads % M) {
		rs_diag_add(d, "%s: %u model parts do not divide cfg's decoder_embed_dim %u, decoder_ffn_embed_dim %u and decoder_attention_heads %u",
			    where, nparts, c->m.hidden, c->m.ffn, c->m.heads);
		return -EINVAL;
	}
	/* Each layer, in the order its modules register their params:
	 * self_attn (qkv_proj or k/v/q_proj, out_proj), self_attn_layer_norm,
	 * fc1, fc2, final_layer_norm. */
	if (c->m.fused_qkv) {
		layer[nl++] = (pdesc){ "self_attn.qkv_proj.weight", { 3 * Hp, H }, 2 };
		layer[nl++] = (pdesc){ "self_attn.qkv_proj.bias", { 3 * Hp }, 1 };
	} else {
		static const char *const kvq[3][2] = {
			{ "self_attn.k_proj.weight", "self_attn.k_proj.bias" },
			{ "self_attn.v_proj.weight", "self_attn.v_proj.bias" },
			{ "self_attn.q_proj.weight", "self_attn.q_proj.bias" },
		};

		for (int i = 0; i < 3; i++) {
			layer[nl++] = (pdesc){ kvq[i][0], { Hp, H }, 2 };
			layer[nl++] = (pdesc){ kvq[i][1], { Hp }, 1 };
		}
	}
	layer[nl++] = (pdesc){ "self_attn.out_proj.weight", { H, Hp }, 2 };
	layer[nl++] = (pdesc){ "self_attn.out_proj.bias", { H }, 1 };
	layer[nl++] = (pdesc){ "self_attn_layer_norm.weight", { H }, 1 };
	layer[nl++] = (pdesc){ "self_attn_layer_norm.bias", { H }, 1 };
	layer[nl++] = (pdesc){ "fc1.weight", { F, H }, 2 };
	layer[nl++] = (pdesc){ "fc1.bias", { F }, 1 };
	layer[nl++] = (pdesc){ "fc2.weight", { H, F }, 2 };
	layer[nl++] = (pdesc){ "fc2.bias", { H }, 1 };
	layer[nl++] = (pdesc){ "final_layer_norm.weight", { H }, 1 };
	layer[nl++] = (pdesc){ "final_layer_norm.bias", { H }, 1 };

	/* The root: embed_tokens (its rows unknown: the vocab), then
	 * embed_positions, the final layer_norm, an untied
	 * output_projection (as many rows as embed_tokens). */
	if (!stored(f, nshards, "flat_param_0", &sum, &first)) {
		rs_diag_add(d, "%s: model has no 1-d flat_param_0 (the root's flat param, which holds embed_tokens)",
			    where);
		return -EINVAL;
	}
	rest = c->m.position_rows * H + (c->m.final_norm ? 2 * H : 0);
	/* D shards of S elements hold between D*(S-1)+1 and D*S of the
	 * total (torch.chunk); with one shard, exactly S.  The vocab rows
	 * are the most that fit. */
	total = nshards == 1 ? sum : first * nshards;
	vp = total > rest ? (total - rest) / (H * (c->m.tied ? 1 : 2)) : 0;
	if (vp == 0 || (nshards == 1 &&
			vp * H * (c->m.tied ? 1 : 2) + rest != total)) {
		rs_diag_add(d, "%s: flat_param_0: %llu elements cannot hold decoder.embed_tokens.weight [V/%llu, %llu]%s plus embed_positions [%llu, %llu]%s, as cfg describes the model",
			    where, (unsigned long long)sum,
			    (unsigned long long)M, (unsigned long long)H,
			    c->m.tied ? "" : " and an untied output_projection",
			    (unsigned long long)c->m.position_rows,
			    (unsigned long long)H,
			    c->m.final_norm ? " and layer_norm [2 x hidden]" : "");
		return -EINVAL;
	}
	root[nroot++] = (pdesc){ "decoder.embed_tokens.weight", { vp, H }, 2 };
	root[nroot++] = (pdesc){ "decoder.embed_positions.weight",
				 { c->m.position_rows, H }, 2 };
	if (c->m.final_norm) {
		root[nroot++] = (pdesc){ "decoder.layer_norm.weight", { H }, 1 };
		root[nroot++] = (pdesc){ "decoder.layer_norm.bias", { H }, 1 };
	}
	if (!c->m.tied)
		root[nroot++] = (pdesc){ "decoder.output_projection.weight",
					 { vp, H }, 2 };
	c->m.vocab = vp * M;
	c->m.source_tp = (uint32_t)M;
	m->present = true;
	err = add_flat(m, &cap, "flat_param_0", 0, root, nroot);
	for (uint32_t i = 0; i < c->m.layers && !err; i++) {
		char key[64];
		int plen = snprintf(key, sizeof(key), "decoder.layers.%u", i);

		snprintf(key + plen, sizeof(key) - (size_t)plen, ".flat_param_0");
		if (!ms_file_find(&f[0], key)) {
			rs_diag_add(d, "%s: cfg says %u decoder layers but model has no %s",
				    where, c->m.layers, key);
			return -EINVAL;
		}
		err = add_flat(m, &cap, key, (size_t)plen, layer, nl);
	}
	if (err)
		return err;
	/* A flat param cfg does not account for (a layer past
	 * decoder_layers, a wrapper cfg does not describe) would be left as
	 * a meaningless 1-d tensor. */
	for (size_t i = 0; i < f[0].ntensors; i++) {
		const char *k = f[0].tensors[i].key, *dot = strrchr(k, '.');
		bool known = false;

		if (strncmp(dot ? dot + 1 : k, "flat_param_", 11) != 0)
			continue;
		for (size_t j = 0; j < m->nflats && !known; j++)
			known = strcmp(m->flats[j].key, k) == 0;
		if (!known) {
			rs_diag_add(d, "%s: model holds %s, which cfg (%u decoder layers) does not describe",
				    where, k, c->m.layers);
			return -EINVAL;
		}
	}
	if (c->m.tied) {
		m->aliases = calloc(1, sizeof(ms_alias));
		if (!m->aliases)
			return -ENOMEM;
		m->naliases = 1;
		m->aliases[0].src = strdup("decoder.embed_tokens.weight");
		m->aliases[0].dst = strdup("decoder.output_projection.weight");
		if (!m->aliases[0].src || !m->aliases[0].dst)
			return -ENOMEM;
	}
	if (ms_file_find(&f[0], "decoder.version")) {
		m->buffers = calloc(1, sizeof(char *));
		if (!m->buffers || !(m->buffers[0] = strdup("decoder.version")))
			return -ENOMEM;
		m->nbuffers = 1;
	}
	return 0;
}

/* A params file must agree with cfg: same flat params, and in each the
 * same names and shapes in the same order. */
int ms_meta_check(const ms_meta *want, const ms_meta *got, const char *path,
		  rs_diag *d)
{
	for (size_t k = 0; k < want->nflats; k++) {
		const ms_flat *w = &want->flats[k], *g = NULL;

		for (size_t j = 0; j < got->nflats && !g; j++)
			if (strcmp(got->flats[j].key, w->key) == 0)
				g = &got->flats[j];
		if (!g) {
			rs_diag_add(d, "%s: has no %s, which cfg implies", path,
				    w->key);
			return -EINVAL;
		}
		for (size_t i = 0; i < w->nparams || i < g->nparams; i++) {
			const ms_param *a = i < w->nparams ? &w->params[i] : NULL;
			const ms_param *b = i < g->nparams ? &g->params[i] : NULL;
			char sa[96], sb[96];

			if (a && b && strcmp(a->name, b->name) == 0 &&
			    a->ndim == b->ndim &&
			    memcmp(a->shape, b->shape,
				   (size_t)a->ndim * sizeof(uint64_t)) == 0)
				continue;
			ms_shape_text(a ? a->shape : NULL, a ? a->ndim : 0, sa,
				      sizeof(sa));
			ms_shape_text(b ? b->shape : NULL, b ? b->ndim : 0, sb,
				      sizeof(sb));
			rs_diag_add(d, "%s: %s: param %zu is %s %s, but cfg implies %s %s: the params file contradicts the checkpoint's cfg",
				    path, w->key, i, b ? b->name : "(none)", sb,
				    a ? a->name : "(none)", sa);
			return -EINVAL;
		}
	}
	for (size_t j = 0; j < got->nflats; j++) {
		bool known = false;

		for (size_t k = 0; k < want->nflats && !known; k++)
			known = strcmp(got->flats[j].key, want->flats[k].key) == 0;
		if (!known) {
			rs_diag_add(d, "%s: describes %s, which cfg does not imply",
				    path, got->flats[j].key);
			return -EINVAL;
		}
	}
	return 0;
}

void ms_shape_text(const uint64_t *shape, int ndim, char *out, size_t size)
{
	size_t at = (size_t)snprintf(out, size, "[");

	for (int i = 0; shape && i < ndim && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%llu",
				       i ? ", " : "",
				       (unsigned long long)shape[i]);
	if (at < size)
		snprintf(out + at, size - at, "]");
}

/* ---- cfg kept for the metaseq view ------------------------------------- */

/* Bounds on what is kept: a real cfg has a few hundred fields. */
#define MS_CFG_MAX_ITEMS 20000u
#define MS_CFG_MAX_STR 4096u

void ms_state_free(void *state)
{
	ms_state *st = state;

	if (!st)
		return;
	for (size_t i = 0; i < st->ncfg; i++) {
		free(st->cfg[i].section);
		free(st->cfg[i].key);
		free(st->cfg[i].s);
	}
	free(st->cfg);
	free(st);
}

/* Appends section.key = v when v is a scalar; 0 or -ENOMEM. */
static int keep(ms_state *st, const char *section, const rs_pvalue *kv,
		const rs_pvalue *v)
{
	const char *key = ms_whole_str(kv), *str;
	ms_cv c = { 0 };

	v = cfg_leaf(v);
	if (!key || !*key || strlen(key) > 255 || st->ncfg >= MS_CFG_MAX_ITEMS)
		return 0;
	switch (rs_pv_kind(v)) {
	case RS_PV_NONE:
		c.kind = MS_CV_NONE;
		break;
	case RS_PV_BOOL:
		c.kind = MS_CV_BOOL;
		rs_pv_bool(v, &c.b);
		break;
	case RS_PV_INT:
		c.kind = MS_CV_INT;
		rs_pv_int(v, &c.i);
		break;
	case RS_PV_FLOAT:
		c.kind = MS_CV_FLOAT;
		rs_pv_float(v, &c.f);
		break;
	case RS_PV_STR:
		str = ms_whole_str(v);
		if (!str || strlen(str) > MS_CFG_MAX_STR)
			return 0;
		c.kind = MS_CV_STR;
		if (!(c.s = strdup(str)))
			return -ENOMEM;
		break;
	default:
		return 0;
	}
	c.key = strdup(key);
	c.section = section ? strdup(section) : NULL;
	if (!c.key || (section && !c.section) ||
	    rs_array_reserve(&st->cfg, &st->cap, st->ncfg + 1, sizeof(ms_cv))) {
		free(c.key);
		free(c.section);
		free(c.s);
		return -ENOMEM;
	}
	st->cfg[st->ncfg++] = c;
	return 0;
}

static int keep_map(ms_state *st, const char *section, const rs_pvalue *map)
{
	int err = 0;

	for (size_t i = 0; i < rs_pv_len(map) && !err; i++)
		err = keep(st, section, rs_pv_key(map, i), rs_pv_val(map, i));
	return err;
}

int ms_cfg_copy(const rs_pvalue *top, ms_state *st)
{
	const rs_pvalue *cfg = cfg_map(rs_pv_get(top, "cfg"));
	int err = 0;

	if (!cfg)
		return keep_map(st, "model", cfg_map(rs_pv_get(top, "args")));
	for (size_t i = 0; i < rs_pv_len(cfg) && !err; i++) {
		const char *sec = ms_whole_str(rs_pv_key(cfg, i));
		const rs_pvalue *sub = cfg_map(rs_pv_val(cfg, i));

		if (sub && sec && *sec && strlen(sec) <= 255)
			err = keep_map(st, sec, sub);
		else
			err = keep(st, NULL, rs_pv_key(cfg, i), rs_pv_val(cfg, i));
	}
	return err;
}
