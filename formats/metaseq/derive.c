/* metaseq flat params from cfg: the description cfg implies for
 * release-form files without shard_metadata, and the check of a params
 * file against it (docs/FORMATS.md, "metaseq", "Deriving the flat
 * params"). */
#include "formats/metaseq/metaseq_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"
#include "planner/box.h"

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
