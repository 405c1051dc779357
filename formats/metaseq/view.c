/* metaseq view: unflattened metaseq state dicts, one torch.save zip per
 * model part, as metaseq's own tools write them (formats/metaseq/metaseq.h,
 * "View").
 *
 * Each file is laid out at mount time as the megatron view lays out its
 * rank files (formats/megatron/view.c): data.pkl ({"model": {...},
 * "cfg": {...}}) and one data/<k> record per tensor, served through plans
 * from the source's fragments.  A fused qkv_proj record is three boxes
 * back to back, part m's k, v and q rows, which is what part m's
 * qkv_proj holds.
 */
#include "formats/metaseq/metaseq.h"
#include "formats/metaseq/metaseq_int.h"
#include "formats/codec/torch_tensor.h"
#include "formats/codec/torchzip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

#define MS_KEY_MAX 512

/* One tensor of a part file: its key, shape, and the catalog tensors its
 * record is made of (three for a fused qkv: k, v, q). */
typedef struct {
	char key[MS_KEY_MAX];
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	size_t src[3];
	int nsrc;
	uint64_t bytes;
} item;

typedef struct {
	const rs_checkpoint *ck;
	const ms_state *st;
	const rs_layout *l;
	rs_vtree *t;
	rs_diag *d;
	uint32_t part;
	item *items;
	size_t n, cap;
} builder;

/* The catalog index of `name`, or SIZE_MAX. */
static size_t find(const rs_catalog *c, const char *name)
{
	for (size_t i = 0; i < c->count; i++)
		if (strcmp(c->tensors[i].name, name) == 0)
			return i;
	return SIZE_MAX;
}

/* "<pre>.self_attn.<k|v|q>_proj.<post>" -> its kvq position (0, 1, 2)
 * and the fused key "<pre>.self_attn.qkv_proj.<post>"; -1 for any other
 * name. */
static int kvq_of(const char *name, char *fused, size_t size)
{
	static const char *const parts[3] = { ".self_attn.k_proj.",
					      ".self_attn.v_proj.",
					      ".self_attn.q_proj." };

	for (int s = 0; s < 3; s++) {
		const char *at = strstr(name, parts[s]);

		if (at && strstr(name, ".layers.") &&
		    snprintf(fused, size, "%.*s.self_attn.qkv_proj.%s",
			     (int)(at - name), name,
			     at + strlen(parts[s])) < (int)size)
			return s;
	}
	return -1;
}

static int add_item(builder *b, item *it)
{
	const rs_catalog *c = &b->ck->catalog;
	uint64_t rows = 0, bytes = 0;

	for (int s = 0; s < it->nsrc; s++) {
		uint64_t shape[RS_MAX_DIMS], n;
		size_t i = it->src[s];

		rs_target_shard_shape(&b->l->targets[i], shape);
		if (s == 0) {
			it->ndim = c->tensors[i].ndim;
			memcpy(it->shape, shape, sizeof(shape));
		} else if (c->tensors[i].ndim != it->ndim ||
			   (it->ndim > 1 &&
			    memcmp(shape + 1, it->shape + 1,
				   (size_t)(it->ndim - 1) * sizeof(uint64_t)) != 0) ||
			   c->tensors[i].dtype != c->tensors[it->src[0]].dtype) {
			rs_diag_add(b->d, "%s: %s: the k, v and q projections differ in shape or dtype, so they cannot be fused",
				    b->ck->dir_path, it->key);
			return -EINVAL;
		}
		if (!rs_product(shape, it->ndim, &n) ||
		    !rs_mul_u64(n, rs_dtype_size(b->l->targets[i].dtype), &n) ||
		    !rs_add_u64(bytes, n, &bytes) ||
		    (it->ndim && !rs_add_u64(rows, shape[0], &rows))) {
			rs_diag_add(b->d, "%s: %s: size overflows", b->ck->dir_path,
				    it->key);
			return -EINVAL;
		}
	}
	if (it->ndim)
		it->shape[0] = rows;
	it->bytes = bytes;
	if (rs_array_reserve(&b->items, &b->cap, b->n + 1, sizeof(item)))
		return -ENOMEM;
	b->items[b->n++] = *it;
	return 0;
}

/* The part's tensors in the catalog's order (metaseq's module order), a
 * fused qkv_proj where its k, v or q first comes, less a tied output
 * projection (metaseq rebuilds it from the embeddings, and
 * convert_to_singleton's restored.pt has none). */
static int collect(builder *b)
{
	const rs_catalog *c = &b->ck->catalog;
	int err = 0;

	b->n = 0;
	for (size_t i = 0; i < c->count && !err; i++) {
		const char *name = c->tensors[i].name;
		item it = { .nsrc = 1, .src = { i } };
		int s;

		if (b->st->tied &&
		    strcmp(name, "decoder.output_projection.weight") == 0)
			continue;
		s = b->st->fused_qkv ? kvq_of(name, it.key, sizeof(it.key)) : -1;
		if (s >= 0) {
			bool done = false;
			char other[MS_KEY_MAX];

			for (size_t k = 0; k < b->n && !done; k++)
				done = strcmp(b->items[k].key, it.key) == 0;
			if (done)
				continue;
			for (int j = 0; j < 3; j++) {
				static const char *const p[3] = { "k_proj",
								   "v_proj",
								   "q_proj" };
				const char *at = strstr(name, ".self_attn.");

				snprintf(other, sizeof(other), "%.*s.self_attn.%s.%s",
					 (int)(at - name), name, p[j],
					 at + strlen(".self_attn.") + 7);
				it.src[j] = find(c, other);
				if (it.src[j] == SIZE_MAX) {
					rs_diag_add(b->d, "%s: %s has no %s to fuse into %s",
						    b->ck->dir_path, name, other,
						    it.key);
					return -EINVAL;
				}
			}
			it.nsrc = 3;
		} else if (snprintf(it.key, sizeof(it.key), "%s", name) >=
			   (int)sizeof(it.key)) {
			rs_diag_add(b->d, "%s: %s: name too long", b->ck->dir_path,
				    name);
			return -EINVAL;
		}
		err = add_item(b, &it);
	}
	return err;
}

static void pw_cv(rs_pwriter *w, const ms_cv *v, uint32_t tp)
{
	if (strcmp(v->key, "model_parallel_size") == 0) {
		rs_pw_int(w, tp);
		return;
	}
	switch (v->kind) {
	case MS_CV_NONE: rs_pw_none(w); break;
	case MS_CV_BOOL: rs_pw_bool(w, v->b); break;
	case MS_CV_INT: rs_pw_int(w, v->i); break;
	case MS_CV_FLOAT: rs_pw_float(w, v->f); break;
	case MS_CV_STR: rs_pw_cstr(w, v->s); break;
	}
}

static bool same_section(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* cfg as plain dicts (what torch.load(weights_only=True) rebuilds, and
 * what metaseq's load_checkpoint_to_cpu hands to OmegaConf.create): the
 * source's scalars, section by section, model_parallel_size the view's
 * tp wherever it is (and in model and common when the source has none). */
static void pw_cfg(builder *b, rs_pwriter *w)
{
	const ms_state *st = b->st;
	bool has_model = false, has_common = false;

	rs_pw_dict_begin(w);
	for (size_t i = 0; i < st->ncfg; i++) {
		const ms_cv *v = &st->cfg[i];

		if (v->section)
			continue;
		rs_pw_cstr(w, v->key);
		pw_cv(w, v, b->l->tp);
	}
	for (size_t i = 0; i < st->ncfg; i++) {
		const char *sec = st->cfg[i].section;
		bool seen = false, has_mp = false;

		if (!sec)
			continue;
		for (size_t j = 0; j < i && !seen; j++)
			seen = same_section(st->cfg[j].section, sec);
		if (seen)
			continue;
		rs_pw_cstr(w, sec);
		rs_pw_dict_begin(w);
		for (size_t j = i; j < st->ncfg; j++) {
			if (!same_section(st->cfg[j].section, sec))
				continue;
			rs_pw_cstr(w, st->cfg[j].key);
			pw_cv(w, &st->cfg[j], b->l->tp);
			has_mp |= strcmp(st->cfg[j].key, "model_parallel_size") == 0;
		}
		if (!has_mp && (strcmp(sec, "model") == 0 ||
				strcmp(sec, "common") == 0)) {
			rs_pw_cstr(w, "model_parallel_size");
			rs_pw_int(w, b->l->tp);
		}
		rs_pw_dict_end(w);
		has_model |= strcmp(sec, "model") == 0;
		has_common |= strcmp(sec, "common") == 0;
	}
	for (int k = 0; k < 2; k++) {
		if (k == 0 ? has_model : has_common)
			continue;
		rs_pw_cstr(w, k == 0 ? "model" : "common");
		rs_pw_dict_begin(w);
		rs_pw_cstr(w, "model_parallel_size");
		rs_pw_int(w, b->l->tp);
		rs_pw_dict_end(w);
	}
	rs_pw_dict_end(w);
}

static int data_pkl(builder *b, uint8_t **out, size_t *len)
{
	rs_pwriter w;

	rs_pw_init(&w, 2);
	rs_pw_dict_begin(&w);
	rs_pw_cstr(&w, "model");
	rs_pw_dict_begin(&w);
	for (size_t k = 0; k < b->n; k++) {
		const item *it = &b->items[k];
		char record[24];

		snprintf(record, sizeof(record), "%zu", k);
		rs_pw_cstr(&w, it->key);
		rs_pw_torch_tensor(&w, b->l->targets[it->src[0]].dtype,
				   it->shape, it->ndim, record);
	}
	rs_pw_dict_end(&w);
	rs_pw_cstr(&w, "cfg");
	pw_cfg(b, &w);
	rs_pw_dict_end(&w);
	return rs_pw_finish(&w, out, len);
}

/* Record k: part `part`'s box of each of its catalog tensors. */
static int append_record(builder *b, uint32_t file, const item *it)
{
	int err = 0;

	for (int s = 0; s < it->nsrc && !err; s++) {
		const rs_tensor *ten = &b->ck->catalog.tensors[it->src[s]];
		const rs_target *tg = &b->l->targets[it->src[s]];
		uint32_t m = tg->axis >= 0 ? tg->multiplier : 1;

		for (uint32_t j = 0; j < m && !err; j++) {
			rs_box box = { .ndim = ten->ndim };
			rs_plan plan;

			memcpy(box.len, tg->shape, sizeof(box.len));
			if (tg->axis >= 0) {
				box.len[tg->axis] = tg->chunk[tg->axis];
				box.off[tg->axis] = rs_target_piece_offset(
					tg, b->l->tp, b->part, j);
			}
			if (ten->ndim && box.len[0] == 0)
				continue;
			err = rs_plan_box(ten, &box, box.len, &plan);
			if (!err)
				err = rs_vtree_append_plan(b->t, file, &plan,
							   ten->dtype, tg->dtype);
		}
	}
	return err;
}

/* One part file: the zip around data.pkl and the tensor records, in the
 * order torch.save writes them; the archive named after the file. */
static int build_file(builder *b, uint32_t file, const char *archive)
{
	rs_zip_layout z = { 0 };
	uint64_t *sizes = NULL;
	uint8_t *pkl = NULL;
	size_t pkl_len, n = b->n;
	int err = data_pkl(b, &pkl, &pkl_len);

	if (err)
		return err;
	sizes = malloc((n + 1) * sizeof(*sizes));
	if (!sizes) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t k = 0; k < n; k++)
		sizes[k] = b->items[k].bytes;
	err = rs_zip_layout_torch_save(&z, archive, pkl, pkl_len, sizes, n);
	for (size_t p = 0; p < z.npieces && !err; p++) {
		const rs_zip_piece *pc = &z.pieces[p];

		if (pc->kind == RS_ZIP_PIECE_LITERAL)
			err = rs_vtree_append_literal(b->t, file, pc->bytes,
						      pc->length);
		else
			err = append_record(b, file,
					    &b->items[pc->entry -
						      RS_ZIP_TORCH_SAVE_STORAGE0]);
	}
out:
	rs_zip_layout_free(&z);
	free(sizes);
	free(pkl);
	return err;
}

int rs_metaseq_build_view(const rs_checkpoint *ck, const rs_layout *l,
			  rs_vtree *t, rs_diag *d)
{
	builder b = { .ck = ck, .st = ck->extra, .l = l, .t = t, .d = d };
	int err;

	if (ck->format != &rs_metaseq_format || !b.st) {
		rs_diag_add(d, "%s: the metaseq view needs a metaseq source (choose -o format=safetensors, hf or zarr)",
			    ck->dir_path);
		return -EINVAL;
	}
	err = rs_checkpoint_carry(ck, t);
	if (!err)
		err = collect(&b);
	for (uint32_t m = 0; m < l->tp && !err; m++) {
		char name[80], archive[64];
		uint32_t file;

		if (l->tp == 1)
			snprintf(archive, sizeof(archive), "restored");
		else
			snprintf(archive, sizeof(archive),
				 "reshard-model_part-%u", m);
		snprintf(name, sizeof(name), "%s.pt", archive);
		b.part = m;
		err = rs_vtree_add_file(t, 0, name, ck->root_mtime, &file);
		if (err == -EEXIST) {
			rs_diag_add(d, "%s/%s: the metaseq view writes a file of this name itself",
				    ck->dir_path, name);
			err = -EINVAL;
		}
		if (!err)
			err = build_file(&b, file, archive);
	}
	free(b.items);
	return err;
}
