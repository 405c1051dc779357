/* Legacy Megatron view: per-rank model_optim_rng.pt files (megatron.h).
 *
 * Each rank file is a torch.save zip laid out at mount time: data.pkl (the
 * dict Megatron's save_checkpoint writes, args rewritten for the view's
 * layout, models nested as the source's) and one data/<k> record per
 * tensor, served through plans from the source's fragments.  The record of
 * a gated dense_h_to_4h is two boxes back to back, W_t then V_t, which is
 * what rank t's ColumnParallelLinear holds.
 */
#include "formats/megatron/megatron.h"
#include "formats/megatron/megatron_int.h"
#include "formats/codec/torch_tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/array.h"

/* One tensor of a rank file. */
typedef struct {
	size_t tensor;          /* catalog index */
	bool head;              /* word_embeddings_for_head (tied weights) */
	uint32_t chunk;
	char *keys[RS_MEGATRON_MAX_NESTING];
	int nkeys;
	int64_t expert;         /* global expert of an expert weight, -1 */
	bool none;              /* a None value (TE's _extra_state), no record */
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t bytes;
} item;

typedef struct {
	const rs_checkpoint *ck;
	const rs_meg_state *st;
	const rs_layout *l;
	rs_vtree *t;
	rs_diag *d;
	uint32_t tp, pp, vpp, ep;
	uint64_t lpc;           /* layers per model chunk of the view */
	rs_meg_experts form;    /* the view's expert key form */
	/* the rank file being built */
	uint32_t p, r, e;
	item *items;
	size_t nitems, cap_items;
	size_t *order;          /* storage key k -> item, in pickle order */
	size_t nkeys_written;
} builder;

static void free_items(builder *b)
{
	for (size_t i = 0; i < b->nitems; i++)
		for (int k = 0; k < b->items[i].nkeys; k++)
			free(b->items[i].keys[k]);
	b->nitems = 0;
}

/* Item `tensor` of the rank file; of an expert weight, its local expert
 * `local` (global expert e*L + local): one expert's shard, keyed in the
 * view's form; local RS_ITEM_EXTRA_STATE: TEGroupedMLP's None
 * `<fc>._extra_state` beside the weights. */
#define RS_ITEM_EXTRA_STATE (-2)
static int add_item(builder *b, size_t tensor, bool head, uint32_t chunk,
		    int64_t local)
{
	const rs_meg_tensor *mt = &b->st->tensors[tensor];
	const rs_tensor *ten = &b->ck->catalog.tensors[tensor];
	const rs_target *tg = &b->l->targets[tensor];
	uint64_t g = (uint64_t)chunk * b->pp + b->p;
	uint64_t shape[RS_MAX_DIMS];
	item *it;
	int err = rs_array_reserve(&b->items, &b->cap_items, b->nitems + 1,
				   sizeof(item));

	if (err)
		return err;
	it = &b->items[b->nitems++];
	memset(it, 0, sizeof(*it));
	it->tensor = tensor;
	it->head = head;
	it->chunk = chunk;
	it->expert = -1;
	it->ndim = ten->ndim;
	rs_target_shard_shape(tg, shape);
	if (local == RS_ITEM_EXTRA_STATE) {
		it->none = true;
		it->ndim = 0;
	} else if (local >= 0) {
		/* the expert axis (0: the reader's tensors) is cut out */
		it->expert = (int64_t)((uint64_t)b->e * (b->l->experts / b->ep) +
				       (uint64_t)local);
		it->ndim = ten->ndim - 1;
		memmove(shape, shape + 1, sizeof(uint64_t) * (RS_MAX_DIMS - 1));
	}
	memcpy(it->shape, shape, sizeof(it->shape));
	if (!rs_product(it->shape, it->ndim, &it->bytes) ||
	    !rs_mul_u64(it->bytes, rs_dtype_size(tg->dtype), &it->bytes))
		return -EOVERFLOW;
	if (head) {
		it->keys[0] = strdup("word_embeddings_for_head");
		it->keys[1] = strdup("weight");
		it->nkeys = 2;
		return it->keys[0] && it->keys[1] ? 0 : -ENOMEM;
	}
	for (int k = 0; k < mt->nkeys; k++) {
		char suffix[64] = "";
		size_t keep = strlen(mt->keys[k]);

		if (local != -1 && k == mt->nkeys - 1) {
			/* "<...>mlp.experts." + the form's key */
			const char *param =
				rs_meg_expert_params[mt->expert_param].param;

			keep = mt->expert_at;
			if (local == RS_ITEM_EXTRA_STATE)
				snprintf(suffix, sizeof(suffix), "%.*s._extra_state",
					 (int)(strchr(param, '.') - param), param);
			else if (rs_meg_expert_suffix(b->form, mt->expert_param,
						      (uint64_t)local, suffix,
						      sizeof(suffix)))
				return -EINVAL;
		}
		if (k == mt->layer_key) {
			if (asprintf(&it->keys[k], "%.*s%llu.%.*s%s",
				     (int)mt->layer_at, mt->keys[k],
				     (unsigned long long)(mt->layer - g * b->lpc),
				     (int)(keep - mt->layer_at),
				     mt->keys[k] + mt->layer_at, suffix) < 0)
				it->keys[k] = NULL;
		} else if (asprintf(&it->keys[k], "%.*s%s", (int)keep,
				    mt->keys[k], suffix) < 0) {
			it->keys[k] = NULL;
		}
		it->nkeys = k + 1;
		if (!it->keys[k])
			return -ENOMEM;
	}
	return 0;
}

/* A tensor's items: one per local expert of an expert weight. */
static int add_tensor(builder *b, size_t tensor, uint32_t chunk)
{
	const rs_meg_tensor *mt = &b->st->tensors[tensor];
	int err = 0;

	if (mt->expert_param < 0)
		return add_item(b, tensor, false, chunk, -1);
	for (uint64_t l = 0; l < b->l->experts / b->ep && !err; l++)
		err = add_item(b, tensor, false, chunk, (int64_t)l);
	/* TE's GroupedLinear holds an _extra_state (None: no fp8 state),
	 * which a strict load of its weights expects */
	if (!err && b->form == RS_MEG_EXPERTS_TE &&
	    strstr(rs_meg_expert_params[mt->expert_param].param, ".weight"))
		err = add_item(b, tensor, false, chunk, RS_ITEM_EXTRA_STATE);
	return err;
}

/* Layer tensors sort by (layer, catalog index): the catalog of a source
 * with virtual stages is in source-chunk order, not layer order. */
typedef struct {
	uint64_t layer;
	size_t index;
} by_layer;

static int cmp_layer(const void *a, const void *b)
{
	const by_layer *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->index < y->index ? -1 : x->index > y->index;
}

/* The tensors of rank file (p, r), per model chunk in Megatron's order:
 * embeddings, layers, final norm and output layer, the tied head. */
static int collect(builder *b)
{
	const rs_meg_state *st = b->st;
	by_layer *layer = malloc((st->ntensors + 1) * sizeof(*layer));
	int err = layer ? 0 : -ENOMEM;

	for (uint32_t c = 0; c < b->vpp && !err; c++) {
		uint64_t g = (uint64_t)c * b->pp + b->p;
		bool first = g == 0, last = g + 1 == (uint64_t)b->pp * b->vpp;
		size_t n = 0;

		for (size_t i = 0; i < st->ntensors && !err; i++) {
			const rs_meg_tensor *mt = &st->tensors[i];

			if (mt->place == RS_MEG_FIRST && first)
				err = add_item(b, i, false, c, -1);
			else if (mt->place == RS_MEG_LAYER && mt->layer / b->lpc == g)
				layer[n++] = (by_layer){ mt->layer, i };
		}
		if (n > 1)
			qsort(layer, n, sizeof(*layer), cmp_layer);
		for (size_t k = 0; k < n && !err; k++)
			err = add_tensor(b, layer[k].index, c);
		for (size_t i = 0; i < st->ntensors && !err && last; i++)
			if (st->tensors[i].place == RS_MEG_LAST)
				err = add_item(b, i, false, c, -1);
		/* GPTModel keeps a copy of tied embeddings on the last stage
		 * when the first is elsewhere (legacy/model/module.py). */
		if (!err && st->tied && last && !first && st->word_emb >= 0)
			err = add_item(b, (size_t)st->word_emb, true, c, -1);
	}
	free(layer);
	return err;
}

/* Dict level `depth` of the items in[0, n) (all sharing keys[0, depth)),
 * keys in order of first appearance, a tensor where a path ends. */
static int pw_level(builder *b, rs_pwriter *w, const size_t *in, size_t n,
		    int depth)
{
	size_t *group = malloc((n ? n : 1) * sizeof(*group));
	bool *done = calloc(n ? n : 1, sizeof(bool));
	int err = group && done ? 0 : -ENOMEM;

	rs_pw_dict_begin(w);
	for (size_t i = 0; i < n && !err; i++) {
		const char *key = b->items[in[i]].keys[depth];
		size_t m = 0;
		bool leaf = false;

		if (done[i])
			continue;
		for (size_t j = i; j < n; j++)
			if (!done[j] && strcmp(b->items[in[j]].keys[depth], key) == 0) {
				done[j] = true;
				group[m++] = in[j];
				leaf |= b->items[in[j]].nkeys == depth + 1;
			}
		rs_pw_cstr(w, key);
		if (leaf && m > 1) {
			rs_diag_add(b->d, "%s: model key %s is both a tensor and a dict",
				    b->st->first_path, key);
			err = -EINVAL;
		} else if (leaf && b->items[group[0]].none) {
			rs_pw_none(w);
		} else if (leaf) {
			const item *it = &b->items[group[0]];
			char record[24];

			snprintf(record, sizeof(record), "%zu", b->nkeys_written);
			rs_pw_torch_tensor(w, b->l->targets[it->tensor].dtype,
					   it->shape, it->ndim, record);
			b->order[b->nkeys_written++] = group[0];
		} else {
			size_t *sub = malloc(m * sizeof(*sub));

			err = sub ? 0 : -ENOMEM;
			if (sub) {
				memcpy(sub, group, m * sizeof(*sub));
				err = pw_level(b, w, sub, m, depth + 1);
			}
			free(sub);
		}
	}
	rs_pw_dict_end(w);
	free(group);
	free(done);
	return err;
}

static int pw_model(builder *b, rs_pwriter *w, uint32_t chunk)
{
	size_t *in = malloc((b->nitems + 1) * sizeof(*in)), n = 0;
	int err;

	if (!in)
		return -ENOMEM;
	for (size_t i = 0; i < b->nitems; i++)
		if (b->items[i].chunk == chunk)
			in[n++] = i;
	err = pw_level(b, w, in, n, 0);
	free(in);
	return err;
}

/* The view's value of an args field it rewrites; false to copy it. */
static bool pw_new_arg(const builder *b, rs_pwriter *w, const char *key)
{
	const rs_meg_state *st = b->st;
	uint64_t v = 0;
	bool none = false;

	if (strcmp(key, "tensor_model_parallel_size") == 0 ||
	    strcmp(key, "model_parallel_size") == 0)
		v = b->tp;
	else if (strcmp(key, "pipeline_model_parallel_size") == 0 ||
		 strcmp(key, "transformer_pipeline_model_parallel_size") == 0)
		v = b->pp;
	else if (strcmp(key, "virtual_pipeline_model_parallel_size") == 0)
		none = b->vpp == 1, v = b->vpp;
	else if (strcmp(key, "num_layers_per_virtual_pipeline_stage") == 0)
		none = b->vpp == 1, v = b->lpc;
	else if (strcmp(key, "padded_vocab_size") == 0 && st->word_emb >= 0)
		v = b->l->targets[st->word_emb].shape[0];
	else if (strcmp(key, "expert_model_parallel_size") == 0 && st->experts)
		v = b->ep;
	else if (strcmp(key, "expert_tensor_parallel_size") == 0 && st->experts)
		v = b->tp;
	else if (strcmp(key, "moe_grouped_gemm") == 0 && st->experts) {
		/* Megatron-LM builds TEGroupedMLP for it, else SequentialMLP */
		rs_pw_bool(w, b->form == RS_MEG_EXPERTS_TE);
		return true;
	} else
		return false;
	if (none)
		rs_pw_none(w);
	else
		rs_pw_int(w, (int64_t)v);
	return true;
}

/* args: the source's Namespace with the layout fields rewritten (and the
 * ones a loader checks added when missing). */
static int pw_args(builder *b, rs_pwriter *w)
{
	static const char *const needed[] = {
		"tensor_model_parallel_size", "pipeline_model_parallel_size",
		"virtual_pipeline_model_parallel_size",
	};
	const rs_pvalue *args = b->st->args, *state = rs_pv_state(args);
	char why[200];
	int err;

	err = rs_pw_value(w, rs_pv_func(args), rs_megatron_copy_allow,
			  rs_megatron_members, why, sizeof(why));
	if (!err)
		err = rs_pw_value(w, rs_pv_args(args), rs_megatron_copy_allow,
				  rs_megatron_members, why, sizeof(why));
	if (err) {
		rs_diag_add(b->d, "%s: args: %s", b->st->first_path, why);
		return -EINVAL;
	}
	if (rs_pv_kind(args) == RS_PV_REDUCE)
		rs_pw_reduce(w);
	else
		rs_pw_newobj(w);
	rs_pw_dict_begin(w);
	for (size_t i = 0; i < rs_pv_len(state); i++) {
		const rs_pvalue *k = rs_pv_key(state, i);
		const char *key = rs_pv_str(k, NULL);

		err = rs_pw_value(w, k, rs_megatron_copy_allow,
				  rs_megatron_members, why, sizeof(why));
		if (!err && !(key && pw_new_arg(b, w, key)))
			err = rs_pw_value(w, rs_pv_val(state, i), rs_megatron_copy_allow,
					  rs_megatron_members, why, sizeof(why));
		if (err) {
			rs_diag_add(b->d, "%s: args.%s: %s", b->st->first_path,
				    key ? key : "?", why);
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < sizeof(needed) / sizeof(needed[0]); i++)
		if (!rs_pv_get(state, needed[i])) {
			rs_pw_cstr(w, needed[i]);
			pw_new_arg(b, w, needed[i]);
		}
	for (size_t i = 0; i < 2 && b->st->experts; i++) {
		static const char *const ex[] = { "expert_model_parallel_size",
						  "expert_tensor_parallel_size" };

		if (!rs_pv_get(state, ex[i])) {
			rs_pw_cstr(w, ex[i]);
			pw_new_arg(b, w, ex[i]);
		}
	}
	rs_pw_dict_end(w);
	rs_pw_build(w);
	return 0;
}

static bool is_model_key(const char *k)
{
	if (strncmp(k, "model", 5) != 0)
		return false;
	for (k += 5; *k; k++)
		if (*k < '0' || *k > '9')
			return false;
	return true;
}

/* data.pkl: the source's top-level keys in their order, less the state
 * not resharded, the models in place of the source's. */
static int data_pkl(builder *b, uint8_t **out, size_t *len)
{
	const rs_pvalue *top = b->st->top;
	bool models_done = false;
	char why[200];
	rs_pwriter w;
	int err = 0;

	rs_pw_init(&w, 2);
	rs_pw_dict_begin(&w);
	for (size_t i = 0; i < rs_pv_len(top) && !err; i++) {
		const char *key = rs_pv_str(rs_pv_key(top, i), NULL);

		if (!key)
			continue;
		if (strcmp(key, "args") == 0) {
			rs_pw_cstr(&w, key);
			err = pw_args(b, &w);
		} else if (strcmp(key, "checkpoint_version") == 0 ||
			   strcmp(key, "iteration") == 0 ||
			   strcmp(key, "num_floating_point_operations_so_far") == 0) {
			rs_pw_cstr(&w, key);
			if (rs_pw_value(&w, rs_pv_val(top, i), rs_megatron_copy_allow,
					rs_megatron_members, why, sizeof(why))) {
				rs_diag_add(b->d, "%s: %s: %s", b->st->first_path,
					    key, why);
				err = -EINVAL;
			}
		} else if (is_model_key(key) && !models_done) {
			models_done = true;
			for (uint32_t c = 0; c < b->vpp && !err; c++) {
				char name[32];

				if (b->vpp == 1)
					snprintf(name, sizeof(name), "model");
				else
					snprintf(name, sizeof(name), "model%u", c);
				rs_pw_cstr(&w, name);
				err = pw_model(b, &w, c);
			}
		}
	}
	rs_pw_dict_end(&w);
	if (err) {
		rs_pw_free(&w);
		return err;
	}
	return rs_pw_finish(&w, out, len);
}

/* The data of record k: its item's boxes, W_t then V_t for gated. */
static int append_record(builder *b, uint32_t file, const item *it)
{
	const rs_tensor *ten = &b->ck->catalog.tensors[it->tensor];
	const rs_target *tg = &b->l->targets[it->tensor];
	uint32_t m = tg->axis >= 0 ? tg->multiplier : 1;
	int err = 0;

	if (!it->bytes)
		return 0;
	for (uint32_t j = 0; j < m && !err; j++) {
		rs_box box = { .ndim = ten->ndim };
		rs_plan plan;

		memcpy(box.len, tg->shape, sizeof(box.len));
		if (it->expert >= 0) {
			box.off[0] = (uint64_t)it->expert;
			box.len[0] = 1;
		}
		if (tg->axis >= 0) {
			box.len[tg->axis] = tg->chunk[tg->axis];
			box.off[tg->axis] = rs_target_piece_offset(
				tg, rs_layout_tp_of(b->l, tg), b->r, j);
		}
		err = rs_plan_box(ten, &box, box.len, &plan);
		if (!err)
			err = rs_vtree_append_plan(b->t, file, &plan, ten->dtype,
						   tg->dtype);
	}
	return err;
}

/* One rank file: the zip around data.pkl and the tensor records. */
static int build_file(builder *b, uint32_t file)
{
	rs_zip_layout z = { 0 };
	uint64_t *sizes = NULL;
	uint8_t *pkl = NULL;
	size_t pkl_len, n;
	int err;

	b->nkeys_written = 0;
	free(b->order);
	b->order = malloc((b->nitems + 1) * sizeof(*b->order));
	if (!b->order)
		return -ENOMEM;
	err = data_pkl(b, &pkl, &pkl_len);
	if (err)
		return err;
	n = b->nkeys_written;
	sizes = malloc((n + 1) * sizeof(*sizes));
	if (!sizes) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t k = 0; k < n; k++)
		sizes[k] = b->items[b->order[k]].bytes;
	err = rs_zip_layout_torch_save(&z, "model_optim_rng", pkl, pkl_len,
				       sizes, n);
	for (size_t p = 0; p < z.npieces && !err; p++) {
		const rs_zip_piece *pc = &z.pieces[p];

		if (pc->kind == RS_ZIP_PIECE_LITERAL)
			err = rs_vtree_append_literal(b->t, file, pc->bytes,
						      pc->length);
		else
			err = append_record(b, file,
					    &b->items[b->order[pc->entry -
						RS_ZIP_TORCH_SAVE_STORAGE0]]);
	}
out:
	rs_zip_layout_free(&z);
	free(sizes);
	free(pkl);
	return err;
}

/* What the layout asks must be a layout Megatron could have saved. */
static int check_layout(builder *b)
{
	const rs_layout *l = b->l;
	const rs_meg_state *st = b->st;

	if (b->vpp > 1 && b->pp == 1) {
		rs_diag_add(b->d, "vpp=%u: virtual pipeline stages need pp > 1",
			    b->vpp);
		return -EINVAL;
	}
	if (st->layers % ((uint64_t)b->pp * b->vpp) != 0) {
		rs_diag_add(b->d, "pp=%u vpp=%u: the checkpoint has %llu layers, which do not divide into %u x %u model chunks",
			    b->pp, b->vpp, (unsigned long long)st->layers, b->pp,
			    b->vpp);
		return -EINVAL;
	}
	if (st->experts) {
		/* Megatron-LM names a rank file by its TP, PP and EP ranks only
		 * (megatron.h): the expert TP of per-rank files is the TP. */
		if (l->etp != b->tp) {
			rs_diag_add(b->d, "etp=%u: per-rank files are named by TP, PP and EP rank only, so their expert TP is tp (%u); give etp=%u or leave it out",
				    l->etp, b->tp, b->tp);
			return -EINVAL;
		}
		if (!l->experts || l->experts % b->ep) {
			rs_diag_add(b->d, "ep=%u does not divide the %llu experts per layer",
				    b->ep, (unsigned long long)l->experts);
			return -EINVAL;
		}
		if (b->form == RS_MEG_EXPERTS_GROUPED) {
			rs_diag_add(b->d, "%s: GroupedMLP's weight1/weight2 hold the experts transposed, which this view does not write; choose -o experts=sequential or experts=grouped",
				    st->first_path);
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < b->ck->catalog.count; i++) {
		const rs_target *tg = &l->targets[i];
		bool expert = st->tensors[i].expert_param >= 0;

		if (expert && tg->expert_axis != 0) {
			rs_diag_add(b->d, "%s: an expert weight whose rule does not put the experts on axis 0",
				    b->ck->catalog.tensors[i].name);
			return -EINVAL;
		}
		/* an expert's record starts at its own axis 1 */
		if (tg->axis > (expert ? 1 : 0) && tg->multiplier > 1) {
			rs_diag_add(b->d, "%s: split along axis %d in %u parts per rank; a per-rank file can hold that only along axis 0",
				    b->ck->catalog.tensors[i].name, tg->axis,
				    tg->multiplier);
			return -EINVAL;
		}
	}
	b->lpc = st->layers / ((uint64_t)b->pp * b->vpp);
	return 0;
}

int rs_megatron_build_view(const rs_checkpoint *ck, const rs_layout *l,
			   rs_vtree *t, rs_diag *d)
{
	builder b = { .ck = ck, .st = ck->extra, .l = l, .t = t, .d = d,
		      .tp = l->tp, .pp = l->pp ? l->pp : 1,
		      .vpp = l->vpp ? l->vpp : 1, .ep = l->ep ? l->ep : 1 };
	int err;

	if (ck->format != &rs_megatron_format || !b.st) {
		rs_diag_add(d, "%s: the megatron view needs a per-rank Megatron source (choose -o format=zarr or torch_dist)",
			    ck->dir_path);
		return -EINVAL;
	}
	/* Without -o pp= (and vpp=), the source's pipeline layout. */
	if (!l->pp_given) {
		b.pp = b.st->pp;
		if (!l->vpp_given)
			b.vpp = b.st->vpp;
	}
	/* Without -o ep=, the source's expert parallelism; without -o
	 * experts=, its expert key form. */
	if (!l->ep_given)
		b.ep = b.st->ep;
	b.form = b.st->form;
	if (l->expert_keys == RS_EXPERT_KEYS_SEQUENTIAL)
		b.form = RS_MEG_EXPERTS_SEQUENTIAL;
	else if (l->expert_keys == RS_EXPERT_KEYS_GROUPED)
		b.form = RS_MEG_EXPERTS_TE;
	err = check_layout(&b);
	if (!err)
		err = rs_checkpoint_carry(ck, t);
	for (uint32_t p = 0; p < b.pp && !err; p++)
		for (uint32_t e = 0; e < b.ep && !err; e++)
		for (uint32_t r = 0; r < b.tp && !err; r++) {
			char name[48];
			uint32_t dir, file;
			int n;

			/* Megatron-LM's get_checkpoint_name */
			n = snprintf(name, sizeof(name), "mp_rank_%02u", r);
			if (b.pp > 1)
				n += snprintf(name + n, sizeof(name) - (size_t)n,
					      "_%03u", p);
			if (b.ep > 1)
				snprintf(name + n, sizeof(name) - (size_t)n, "_%03u",
					 e);
			b.p = p;
			b.r = r;
			b.e = e;
			err = rs_vtree_add_dir(t, 0, name, ck->root_mtime, &dir);
			if (!err)
				err = rs_vtree_add_file(t, dir, "model_optim_rng.pt",
							ck->root_mtime, &file);
			if (!err)
				err = collect(&b);
			if (!err)
				err = build_file(&b, file);
			free_items(&b);
		}
	free_items(&b);
	free(b.items);
	free(b.order);
	return err;
}
