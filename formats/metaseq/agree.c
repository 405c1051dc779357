/* metaseq cross-checks: what the files say must agree - every file's
 * cfg with part 0's (which the derivation and the views use), and the
 * merged sizes with the ones they do not come from: dict.txt's symbols,
 * cfg's max_target_positions, the output projection's rows
 * (docs/FORMATS.md, "metaseq"). */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/source.h"

/* A dict.txt larger than this is no dictionary (OPT's: under 1 MB). */
#define MS_DICT_MAX_BYTES (64u << 20)
/* fairseq/metaseq Dictionary: <s>, <pad>, </s>, <unk> come before the
 * file's symbols (metaseq/data/dictionary.py, Dictionary.__init__). */
#define MS_DICT_SPECIALS 4u

/* ---- every file's cfg against part 0's --------------------------------- */

enum { F_U32, F_U64, F_BOOL, F_NOT, F_STR, F_ARCH };

/* The facts the derivation and the views take from part 0's cfg. */
static const struct {
	const char *name;
	size_t off;
	int kind;
} facts[] = {
	{ "decoder_layers", offsetof(ms_cfg, m.layers), F_U32 },
	{ "decoder_embed_dim", offsetof(ms_cfg, m.hidden), F_U32 },
	{ "decoder_ffn_embed_dim", offsetof(ms_cfg, m.ffn), F_U32 },
	{ "decoder_attention_heads", offsetof(ms_cfg, m.heads), F_U32 },
	{ "max_target_positions", offsetof(ms_cfg, m.max_positions), F_U64 },
	{ "decoder_normalize_before", offsetof(ms_cfg, m.pre_norm), F_BOOL },
	{ "no_decoder_final_norm", offsetof(ms_cfg, no_final_norm), F_BOOL },
	{ "share_decoder_input_output_embed", offsetof(ms_cfg, m.tied),
	  F_BOOL },
	{ "no_scale_embedding", offsetof(ms_cfg, scale_embedding), F_NOT },
	{ "activation_fn", offsetof(ms_cfg, m.activation), F_STR },
	{ "_name", offsetof(ms_cfg, m.fused_qkv), F_ARCH },
};

/* Fact i of c as text (what is compared, and shown). */
static void fact_text(const ms_cfg *c, size_t i, char *out, size_t size)
{
	const char *p = (const char *)c + facts[i].off;
	bool b;

	switch (facts[i].kind) {
	case F_U32: {
		uint32_t v;

		memcpy(&v, p, sizeof(v));
		snprintf(out, size, "%u", v);
		break;
	}
	case F_U64: {
		uint64_t v;

		memcpy(&v, p, sizeof(v));
		snprintf(out, size, "%llu", (unsigned long long)v);
		break;
	}
	case F_BOOL:
	case F_NOT:
		memcpy(&b, p, sizeof(b));
		snprintf(out, size, "%s",
			 b != (facts[i].kind == F_NOT) ? "True" : "False");
		break;
	case F_STR:
		snprintf(out, size, "%s", p);
		break;
	default:        /* F_ARCH: what matters is the fusion it implies */
		memcpy(&b, p, sizeof(b));
		snprintf(out, size, "%s (%s)", c->arch,
			 b ? "a fused qkv_proj" : "k_proj, v_proj, q_proj");
		break;
	}
}

const char *ms_cfg_why(const ms_cfg *c, const char *where)
{
	size_t wl = strlen(where);

	if (!c->present)
		return "it has none";
	return strncmp(c->why, where, wl) == 0 &&
	       strncmp(c->why + wl, ": ", 2) == 0 ? c->why + wl + 2 : c->why;
}

int ms_cfg_agree(const ms_file *files, size_t n, const char *dir,
		 rs_diag *d)
{
	const ms_cfg *c0 = &files[0].cfg;
	char w0[4400], wk[4400], a[128], b[128];

	snprintf(w0, sizeof(w0), "%s/%s", dir, files[0].name);
	for (size_t k = 1; k < n; k++) {
		const ms_cfg *ck = &files[k].cfg;

		snprintf(wk, sizeof(wk), "%s/%s", dir, files[k].name);
		if (ck->ok != c0->ok) {
			rs_diag_add(d, "%s: cfg %s the model, but %s's %s (%s): every file's cfg must say the same of the model",
				    wk, ck->ok ? "describes" : "does not describe",
				    files[0].name,
				    c0->ok ? "does" : "does not",
				    ck->ok ? ms_cfg_why(c0, w0) : ms_cfg_why(ck, wk));
			return -EINVAL;
		}
		for (size_t i = 0; ck->ok && i < sizeof(facts) / sizeof(facts[0]);
		     i++) {
			fact_text(ck, i, a, sizeof(a));
			fact_text(c0, i, b, sizeof(b));
			if (strcmp(a, b) == 0)
				continue;
			rs_diag_add(d, "%s: cfg: model.%s is %s, but %s in %s: every file's cfg must say the same of the model",
				    wk, facts[i].name, a, b, files[0].name);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- sizes against independent ones ----------------------------------- */

static const rs_tensor *find(const rs_checkpoint *ck, const char *name)
{
	for (size_t i = 0; i < ck->catalog.count; i++)
		if (strcmp(ck->catalog.tensors[i].name, name) == 0 &&
		    ck->catalog.tensors[i].ndim == 2)
			return &ck->catalog.tensors[i];
	return NULL;
}

/* The symbols metaseq's Dictionary.load makes of dict.txt: its 4
 * specials and one per line (every line adds one, "#metaseq:overwrite"
 * ones too; Python's text mode ends lines at \n, \r and \r\n).  0 when
 * SOURCE has no dict.txt. */
static int dict_symbols(rs_checkpoint *ck, uint64_t *out, rs_diag *d)
{
	const rs_entry *e = rs_checkpoint_top_entry(ck, "dict.txt");
	uint64_t size, lines = 0, off;
	char buf[1 << 16], prev = '\n';
	int fd, err;

	*out = 0;
	if (!e || e->is_dir)
		return 0;
	size = rs_sources_id(ck->sources, e->source)->size;
	if (size > MS_DICT_MAX_BYTES) {
		rs_diag_add(d, "%s/dict.txt: %llu bytes, more than the %u a dictionary may take (a bound of reshardfs)",
			    ck->dir_path, (unsigned long long)size,
			    MS_DICT_MAX_BYTES);
		return -EINVAL;
	}
	err = rs_sources_fd(ck->sources, e->source, &fd);
	for (off = 0; !err && off < size; off += sizeof(buf)) {
		size_t n = size - off < sizeof(buf) ? (size_t)(size - off)
						    : sizeof(buf);

		err = rs_pread_full(fd, buf, n, off);
		for (size_t i = 0; !err && i < n; i++) {
			lines += buf[i] == '\r' || (buf[i] == '\n' && prev != '\r');
			prev = buf[i];
		}
	}
	if (err) {
		rs_diag_add(d, "%s/dict.txt: cannot read: %s", ck->dir_path,
			    strerror(-err));
		return -EINVAL;
	}
	lines += prev != '\n' && prev != '\r';  /* a last line unended */
	*out = MS_DICT_SPECIALS + lines;
	return 0;
}

int ms_check_sizes(rs_checkpoint *ck, const ms_file *f0, bool derived,
		   rs_diag *d)
{
	const rs_tensor *emb = find(ck, "decoder.embed_tokens.weight");
	const rs_tensor *out = find(ck, "decoder.output_projection.weight");
	const rs_tensor *pos = find(ck, "decoder.embed_positions.weight");
	const ms_cfg *c = &f0->cfg;
	uint64_t symbols;
	int err;

	if (emb && out && out->shape[0] != emb->shape[0]) {
		rs_diag_add(d, "%s/%s: decoder.output_projection.weight has %llu rows but decoder.embed_tokens.weight %llu: both are the vocab",
			    ck->dir_path, f0->name,
			    (unsigned long long)out->shape[0],
			    (unsigned long long)emb->shape[0]);
		return -EINVAL;
	}
	if (c->ok && pos && pos->shape[0] != c->m.position_rows) {
		rs_diag_add(d, "%s/%s: decoder.embed_positions.weight has %llu rows, but cfg's max_target_positions %llu makes %llu (metaseq's LearnedPositionalEmbedding: 2 more)",
			    ck->dir_path, f0->name,
			    (unsigned long long)pos->shape[0],
			    (unsigned long long)c->m.max_positions,
			    (unsigned long long)c->m.position_rows);
		return -EINVAL;
	}
	err = dict_symbols(ck, &symbols, d);
	if (err || !emb || emb->shape[0] >= symbols)
		return err;
	rs_diag_add(d, "%s/%s: decoder.embed_tokens.weight has %llu rows (the vocab), fewer than the %llu symbols of %s/dict.txt (metaseq's 4 special ones and one per line)%s",
		    ck->dir_path, f0->name, (unsigned long long)emb->shape[0],
		    (unsigned long long)symbols, ck->dir_path,
		    derived ? ": without shard_metadata the rows are what flat_param_0 holds beyond cfg's other root params, so flat_param_0 is short or cfg is wrong"
			    : "");
	return -EINVAL;
}
