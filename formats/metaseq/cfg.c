/* metaseq cfg: the model's architecture read from a checkpoint's "cfg"
 * (or fairseq's older "args"), and cfg's scalars kept for the metaseq
 * view (docs/FORMATS.md, "metaseq", "Deriving the flat params"). */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

/* Bounds that keep every product of the derivation below 2^64 (OPT-175B:
 * 96 layers, 12288 wide, ffn 49152, 2048 positions). */
#define MS_CFG_MAX_LAYERS 100000u
#define MS_CFG_MAX_DIM (1u << 24)

typedef struct {
	ms_oc oc;
	size_t sections[4];     /* places where fields are looked up, in
				 * order */
	int n;
	const char *where;
	rs_diag *d;
} cfg_scope;

/* Field `key` of the first section that has it, interpolations
 * followed (None counts as absent); *out NULL when none has it.  A
 * lookup that OmegaConf, or a bound of reshardfs, refuses is one line. */
static int field(cfg_scope *s, const char *key, const rs_pvalue **out)
{
	for (int i = 0; i < s->n; i++) {
		int err = ms_oc_get(&s->oc, s->sections[i], key, out, NULL);

		if (err == -EINVAL)
			rs_diag_add(s->d, "%s: cfg: model.%s: %s", s->where,
				    key, s->oc.why);
		if (err)
			return err;
		if (*out && rs_pv_kind(*out) != RS_PV_NONE)
			return 0;
	}
	*out = NULL;
	return 0;
}

/* A positive int field of at most `max` (required unless *out is
 * preset, the default); the value is checked before it narrows. */
static int int_field(cfg_scope *s, const char *key, bool required,
		     uint64_t max, uint64_t *out)
{
	const rs_pvalue *v;
	char t[80];
	int64_t x;
	int err = field(s, key, &v);

	if (err || (!v && !required))
		return err;
	if (!v) {
		rs_diag_add(s->d, "%s: cfg: model.%s is missing", s->where, key);
		return -EINVAL;
	}
	if (rs_pv_int(v, &x) != 0 || x <= 0) {
		rs_diag_add(s->d, "%s: cfg: model.%s is %s, not a positive integer",
			    s->where, key, rs_pv_text(v, t, sizeof(t)));
		return -EINVAL;
	}
	if ((uint64_t)x > max) {
		rs_diag_add(s->d, "%s: cfg: model.%s is %lld, past %llu, the most reshardfs takes (more than any model has)",
			    s->where, key, (long long)x,
			    (unsigned long long)max);
		return -EINVAL;
	}
	*out = (uint64_t)x;
	return 0;
}

/* A bool field; missing: the default in *out (metaseq's dataclass
 * default). */
static int bool_field(cfg_scope *s, const char *key, bool *out)
{
	const rs_pvalue *v;
	char t[80];
	int err = field(s, key, &v);

	if (!err && v && rs_pv_bool(v, out) != 0) {
		rs_diag_add(s->d, "%s: cfg: model.%s is %s, not a bool",
			    s->where, key, rs_pv_text(v, t, sizeof(t)));
		return -EINVAL;
	}
	return err;
}

/* A str field (NULL when missing) of at most `max` bytes. */
static int str_field(cfg_scope *s, const char *key, size_t max,
		     const char **out)
{
	const rs_pvalue *v;
	char t[80];
	int err = field(s, key, &v);

	*out = NULL;
	if (err || !v)
		return err;
	*out = ms_whole_str(v);
	if (!*out || strlen(*out) > max) {
		rs_diag_add(s->d, "%s: cfg: model.%s is %s, not a string of at most %zu bytes",
			    s->where, key, rs_pv_text(v, t, sizeof(t)), max);
		return -EINVAL;
	}
	return 0;
}

/* Section `key` of cfg (a container, interpolations followed) appended
 * to the lookup order when there is one. */
static int add_section(cfg_scope *s, const char *key)
{
	const rs_pvalue *v;
	size_t place;
	int err = ms_oc_get(&s->oc, 0, key, &v, &place);

	if (err == -EINVAL)
		rs_diag_add(s->d, "%s: cfg: %s: %s", s->where, key, s->oc.why);
	if (!err && ms_cfg_map(v))
		s->sections[s->n++] = place;
	return err;
}

/* The sizes; checked against each other. */
static int read_sizes(cfg_scope *s, ms_cfg *c)
{
	uint64_t layers = 0, dim = 0, ffn = 0, heads = 0, pos = 0, in_dim,
		 out_dim;
	int err;

	err = int_field(s, "decoder_layers", true, MS_CFG_MAX_LAYERS, &layers);
	if (!err)
		err = int_field(s, "decoder_embed_dim", true, MS_CFG_MAX_DIM,
				&dim);
	if (!err)
		err = int_field(s, "decoder_ffn_embed_dim", true,
				MS_CFG_MAX_DIM, &ffn);
	if (!err)
		err = int_field(s, "decoder_attention_heads", true,
				MS_CFG_MAX_DIM, &heads);
	in_dim = out_dim = dim;
	if (!err)
		err = int_field(s, "decoder_input_dim", false, MS_CFG_MAX_DIM,
				&in_dim);
	if (!err)
		err = int_field(s, "decoder_output_dim", false, MS_CFG_MAX_DIM,
				&out_dim);
	if (!err)
		err = int_field(s, "max_target_positions", true,
				MS_CFG_MAX_DIM, &pos);
	if (err)
		return err;
	if (in_dim != dim || out_dim != dim) {
		rs_diag_add(s->d, "%s: cfg: model.decoder_input_dim or decoder_output_dim differs from decoder_embed_dim (%llu): project_in/project_out layers are not supported",
			    s->where, (unsigned long long)dim);
		return -EINVAL;
	}
	if (dim % heads) {
		rs_diag_add(s->d, "%s: cfg: model.decoder_attention_heads %llu does not divide decoder_embed_dim %llu",
			    s->where, (unsigned long long)heads,
			    (unsigned long long)dim);
		return -EINVAL;
	}
	/* all at most 2^24: the casts keep them */
	c->m.layers = (uint32_t)layers;
	c->m.hidden = (uint32_t)dim;
	c->m.ffn = (uint32_t)ffn;
	c->m.heads = (uint32_t)heads;
	c->m.max_positions = pos;
	/* LearnedPositionalEmbedding: padding_idx (the dictionary's pad,
	 * 1) + 1 rows more than the positions */
	c->m.position_rows = pos + 2;
	return 0;
}

/* The flags and names. */
static int read_kind(cfg_scope *s, ms_cfg *c)
{
	bool learned = false, alibi = false, ln_embed = false, no_scale = false;
	const char *arch = NULL, *act = NULL;
	int err;

	err = bool_field(s, "decoder_learned_pos", &learned);
	if (!err)
		err = bool_field(s, "decoder_normalize_before", &c->m.pre_norm);
	if (!err)
		err = bool_field(s, "no_decoder_final_norm", &c->no_final_norm);
	if (!err)
		err = bool_field(s, "share_decoder_input_output_embed",
				 &c->m.tied);
	if (!err)
		err = bool_field(s, "no_scale_embedding", &no_scale);
	if (!err)
		err = bool_field(s, "alibi", &alibi);
	if (!err)
		err = bool_field(s, "layernorm_embedding", &ln_embed);
	if (!err)
		err = str_field(s, "_name", 255, &arch);
	if (!err && !arch)
		err = str_field(s, "arch", 255, &arch);
	if (!err)
		err = str_field(s, "activation_fn", sizeof(c->m.activation) - 1,
				&act);
	if (err)
		return err;
	if (!learned) {
		rs_diag_add(s->d, "%s: cfg: model.decoder_learned_pos is not true: sinusoidal positions are not supported (no OPT model has them)",
			    s->where);
		return -EINVAL;
	}
	if (alibi) {
		rs_diag_add(s->d, "%s: cfg: model.alibi is set: ALiBi models have no position table, which OPT's layout has",
			    s->where);
		return -EINVAL;
	}
	if (ln_embed) {
		rs_diag_add(s->d, "%s: cfg: model.layernorm_embedding is set: an embedding layer norm is not supported",
			    s->where);
		return -EINVAL;
	}
	/* metaseq's ModelParallelTransformerDecoder (arch
	 * transformer_lm_megatron, needed for model parallelism) fuses
	 * q/k/v into one qkv_proj; the plain TransformerDecoder keeps
	 * k_proj, v_proj, q_proj. */
	c->m.fused_qkv = arch ? strstr(arch, "megatron") != NULL
			      : c->m.source_tp > 1;
	snprintf(c->arch, sizeof(c->arch), "%s", arch ? arch : "(none)");
	snprintf(c->m.activation, sizeof(c->m.activation), "%s",
		 act ? act : "relu");
	c->scale_embedding = !no_scale;
	c->m.embed_scaled = !no_scale;
	c->m.final_norm = c->m.pre_norm && !c->no_final_norm;
	return 0;
}

int ms_cfg_read(const rs_pvalue *top, const char *where, ms_cfg *c,
		rs_diag *d)
{
	const rs_pvalue *cfg = rs_pv_get(top, "cfg");
	const rs_pvalue *args = ms_cfg_map(rs_pv_get(top, "args")), *v;
	cfg_scope s = { .where = where, .d = d };
	int64_t mpv;
	int err;

	memset(c, 0, sizeof(*c));
	err = ms_oc_init(&s.oc, cfg);
	if (!err)
		err = add_section(&s, "model");
	if (!err && args)
		err = ms_oc_enter(&s.oc, rs_pv_get(top, "args"), MS_OC_TOP,
				  &s.sections[s.n++]);
	if (err || !s.n)
		goto out;       /* no cfg: nothing derived */
	err = add_section(&s, "common");
	if (!err)
		err = add_section(&s, "distributed_training");
	if (err)
		goto out;
	c->present = true;
	/* Informational only (the parts SOURCE holds decide, see
	 * ms_meta_from_cfg): a value that is no positive int, or that does
	 * not resolve, is ignored. */
	c->m.source_tp = 1;
	for (int i = 0; i < s.n; i++) {
		if (ms_oc_get(&s.oc, s.sections[i], "model_parallel_size", &v,
			      NULL) != 0 || !v || rs_pv_kind(v) == RS_PV_NONE)
			continue;
		if (rs_pv_int(v, &mpv) == 0 && mpv > 0 && mpv <= UINT32_MAX)
			c->m.source_tp = (uint32_t)mpv;
		break;
	}
	err = read_sizes(&s, c);
	if (!err)
		err = read_kind(&s, c);
	if (!err)
		c->m.from = "cfg";
out:
	ms_oc_free(&s.oc);
	return err;
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

/* Appends section.key = v when v is a scalar; 0 or -ENOMEM.  v (held by
 * place `at` of o) is kept as OmegaConf resolves it: the view's cfg is
 * plain dicts one level deep, where an interpolation into what is left
 * out (lists, deeper sections) would dangle; one that does not resolve
 * is kept as written. */
static int keep(ms_state *st, ms_oc *o, size_t at, const char *section,
		const rs_pvalue *kv, const rs_pvalue *v)
{
	const char *key = ms_whole_str(kv), *str;
	const size_t nplaces = o->nplaces;
	const rs_pvalue *r;
	ms_cv c = { 0 };
	size_t up;
	int err;

	if (!key || !*key || strlen(key) > 255 || st->ncfg >= MS_CFG_MAX_ITEMS)
		return 0;
	err = ms_oc_resolve(o, v, at, &r, &up);
	o->nplaces = nplaces;
	if (err == -ENOMEM)
		return err;
	v = err ? ms_cfg_leaf(v) : r;
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

/* The scalars of container v (held by place `up`) as section `section`. */
static int keep_map(ms_state *st, ms_oc *o, size_t up, const char *section,
		    const rs_pvalue *v)
{
	const rs_pvalue *map = ms_cfg_map(v);
	size_t at;
	int err = ms_oc_enter(o, v, up, &at);

	for (size_t i = 0; i < rs_pv_len(map) && !err; i++)
		err = keep(st, o, at, section, rs_pv_key(map, i),
			   rs_pv_val(map, i));
	return err;
}

int ms_cfg_copy(const rs_pvalue *top, ms_state *st)
{
	const rs_pvalue *cfg = ms_cfg_map(rs_pv_get(top, "cfg"));
	ms_oc o;
	int err = ms_oc_init(&o, rs_pv_get(top, "cfg"));

	if (!err && !cfg)
		err = keep_map(st, &o, MS_OC_TOP, "model", rs_pv_get(top, "args"));
	for (size_t i = 0; cfg && i < rs_pv_len(cfg) && !err; i++) {
		const char *sec = ms_whole_str(rs_pv_key(cfg, i));
		const rs_pvalue *sub = rs_pv_val(cfg, i);

		if (ms_cfg_map(sub) && sec && *sec && strlen(sec) <= 255)
			err = keep_map(st, &o, 0, sec, sub);
		else
			err = keep(st, &o, 0, NULL, rs_pv_key(cfg, i), sub);
	}
	ms_oc_free(&o);
	return err == -ENOMEM ? err : 0;
}
