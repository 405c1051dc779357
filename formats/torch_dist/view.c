/* torch_dist view builder: catalog + layout -> a DCP checkpoint.
 *
 * The view holds what Megatron's torch_dist backend would have written had
 * the job run at the target TP (docs/FORMATS.md, "torch_dist"):
 *   - `__<r>_0.distcp`, one per target TP rank: a torch.save zip per chunk
 *     that rank owns, its headers built here and its data served from the
 *     source through a plan (read straight from the source when contiguous);
 *   - `.metadata`: a torch.distributed.checkpoint Metadata pickle whose
 *     chunks follow the target grid, readable by torch's FileSystemReader
 *     and by Megatron's loader;
 *   - byte items (ShardedObjects) in rank 0's file: carried over unchanged
 *     from a torch_dist source, re-wrapped as torch_dist stores them from a
 *     zarr one (formats/codec/torch_object.h);
 *   - metadata.json saying torch_dist, and every other file passed through.
 *
 * Owners: a TP-split chunk belongs to rank (its index along the TP axis)
 * mod tp - so a gated fc1's W_r and V_r both go to rank r, as Megatron
 * saves them.  A replicated tensor is stored once, by rank 0: Megatron
 * saves only the main replica (replica_id 0), which is TP rank 0.  An
 * expert weight's chunk belongs to the rank that holds its expert and
 * expert-TP piece: megatron-core numbers expert ranks with expert TP
 * fastest, then EP, so expert x's piece j is rank (j mod etp) +
 * etp * (x / (experts / ep)).  There are max(tp, ep * etp) files, one per
 * rank of the target job's first data-parallel replica.
 *
 * CRCs: the CRC-32 of a chunk's data is not known without reading it, so
 * data entries carry CRC 0 (RS_ZIP_CRC_ZERO).  torch.load and DCP ignore
 * CRCs; a strict `unzip -t` of an item reports those entries as bad.
 */
#include "formats/torch_dist/torch_dist.h"
#include "formats/torch_dist/torch_dist_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torch_tensor.h"
#include "formats/codec/torchzip.h"
#include "planner/array.h"

static const char dcp_meta[] = "torch.distributed.checkpoint.metadata";

/* One stored item of the view. */
typedef struct {
	size_t tensor;          /* catalog index, or SIZE_MAX for a blob */
	const rs_blob *blob;
	rs_box box;             /* tensors: the chunk */
	uint64_t index;         /* chunk number within the tensor */
	uint32_t rank;
	uint64_t offset, length;/* in __<rank>_0.distcp */
} item;

/* The torch.save zip around a chunk depends only on its dtype and
 * extents: data.pkl holds just those, the zip's offsets count from its
 * own start, the data's CRC is 0 and the serialization id is fixed.  So
 * its literal bytes are laid out once per distinct (dtype, extents), kept
 * by the tree, and shared by every chunk of that shape: a 256-expert
 * MoE's 10^5 chunks have a few dozen shapes, and each copy is ~1.6 KB. */
typedef struct {
	rs_dtype dtype;
	int ndim;
	uint64_t len[RS_MAX_DIMS];
	uint64_t size;          /* the whole zip */
	rs_zip_piece *pieces;   /* LITERAL bytes in a buffer the tree keeps */
	size_t npieces;
} zip_shape;

typedef struct {
	const rs_checkpoint *ck;
	const rs_layout *l;
	rs_vtree *t;
	rs_diag *d;
	item *items;
	size_t nitems, cap_items;
	uint32_t *files;        /* vtree node of each rank's .distcp */
	uint32_t nfiles;
	zip_shape *shapes;
	size_t nshapes, cap_shapes;
	size_t *slots;          /* shape index + 1 (0: empty), open
				 * addressing, at most half full */
	size_t nslots;
} builder;

/* torch.Size((v...)) */
static void pw_size(rs_pwriter *w, const uint64_t *v, int n)
{
	rs_pw_global(w, "torch", "Size");
	rs_pw_tuple_begin(w);
	for (int i = 0; i < n; i++)
		rs_pw_int(w, (int64_t)v[i]);
	rs_pw_tuple_end(w);
	rs_pw_tuple_n(w, 1);
	rs_pw_reduce(w);
}

/* A dataclass: NEWOBJ(cls, ()) then BUILD(state dict); the caller pushes
 * the dict's items between rs_pw_dict_begin and the end. */
static void pw_object_begin(rs_pwriter *w, const char *module, const char *name)
{
	rs_pw_global(w, module, name);
	rs_pw_tuple_n(w, 0);
	rs_pw_newobj(w);
	rs_pw_dict_begin(w);
}

static void pw_object_end(rs_pwriter *w)
{
	rs_pw_dict_end(w);
	rs_pw_build(w);
}

/* data.pkl of one dense C-order tensor of `box.len` extents, over
 * storage "0". */
static int tensor_pickle(rs_dtype dtype, const rs_box *box, uint8_t **out,
			 size_t *len)
{
	rs_pwriter w;

	rs_pw_init(&w, 2);
	rs_pw_torch_tensor(&w, dtype, box->len, box->ndim, "0");
	return rs_pw_finish(&w, out, len);
}

static uint64_t shape_hash(rs_dtype dtype, int ndim, const uint64_t *len)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)dtype;

	h = (h ^ (uint64_t)ndim) * 1099511628211ull;
	for (int i = 0; i < ndim; i++)
		h = (h ^ len[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

static bool shape_is(const zip_shape *s, rs_dtype dtype, int ndim,
		     const uint64_t *len)
{
	return s->dtype == dtype && s->ndim == ndim &&
	       memcmp(s->len, len, sizeof(uint64_t) * (size_t)ndim) == 0;
}

static void slot_insert(size_t *slots, size_t nslots, const zip_shape *s,
			size_t index)
{
	size_t at = shape_hash(s->dtype, s->ndim, s->len) & (nslots - 1);

	while (slots[at])
		at = (at + 1) & (nslots - 1);
	slots[at] = index + 1;
}

/* Room in the index for one more shape. */
static int slots_reserve(builder *b)
{
	size_t n = b->nslots ? b->nslots : 64;
	size_t *slots;

	while ((b->nshapes + 1) * 2 > n)
		n *= 2;
	if (n == b->nslots)
		return 0;
	slots = calloc(n, sizeof(size_t));
	if (!slots)
		return -ENOMEM;
	for (size_t k = 0; k < b->nshapes; k++)
		slot_insert(slots, n, &b->shapes[k], k);
	free(b->slots);
	b->slots = slots;
	b->nslots = n;
	return 0;
}

static void shapes_free(builder *b)
{
	for (size_t k = 0; k < b->nshapes; k++)
		free(b->shapes[k].pieces);
	free(b->shapes);
	free(b->slots);
}

/* The zip of a chunk of `box.len` extents in `dtype` (above): found, or
 * laid out now and its literal bytes handed to the tree. */
static int zip_of(builder *b, rs_dtype dtype, const rs_box *box,
		  const zip_shape **out)
{
	uint64_t bytes = rs_dtype_size(dtype);
	zip_shape *s;
	rs_zip_layout z = { 0 };
	uint8_t *pkl = NULL, *lit = NULL;
	size_t pkl_len, lit_len = 0, at;
	int err;

	if (b->nslots) {
		at = shape_hash(dtype, box->ndim, box->len) & (b->nslots - 1);
		for (; b->slots[at]; at = (at + 1) & (b->nslots - 1)) {
			s = &b->shapes[b->slots[at] - 1];
			if (shape_is(s, dtype, box->ndim, box->len)) {
				*out = s;
				return 0;
			}
		}
	}
	err = slots_reserve(b);
	if (!err)
		err = rs_array_reserve(&b->shapes, &b->cap_shapes,
				       b->nshapes + 1, sizeof(zip_shape));
	if (err)
		return err;
	for (int i = 0; i < box->ndim; i++)
		bytes *= box->len[i];
	err = tensor_pickle(dtype, box, &pkl, &pkl_len);
	if (err)
		return err;
	err = rs_zip_layout_torch_save(&z, "archive", pkl, pkl_len, &bytes, 1);
	free(pkl);
	if (err)
		return err;
	s = &b->shapes[b->nshapes];
	memset(s, 0, sizeof(*s));
	s->dtype = dtype;
	s->ndim = box->ndim;
	memcpy(s->len, box->len, sizeof(uint64_t) * (size_t)box->ndim);
	s->size = z.size;
	for (size_t p = 0; p < z.npieces; p++)
		if (z.pieces[p].kind == RS_ZIP_PIECE_LITERAL)
			lit_len += z.pieces[p].length;
	s->pieces = calloc(z.npieces, sizeof(rs_zip_piece));
	lit = malloc(lit_len ? lit_len : 1);
	if (!s->pieces || !lit || rs_vtree_keep(b->t, lit)) {
		free(s->pieces);
		free(lit);
		rs_zip_layout_free(&z);
		return -ENOMEM;
	}
	lit_len = 0;
	for (size_t p = 0; p < z.npieces; p++) {
		s->pieces[p] = z.pieces[p];
		if (z.pieces[p].kind != RS_ZIP_PIECE_LITERAL)
			continue;
		memcpy(lit + lit_len, z.pieces[p].bytes, z.pieces[p].length);
		s->pieces[p].bytes = lit + lit_len;
		lit_len += z.pieces[p].length;
	}
	s->npieces = z.npieces;
	rs_zip_layout_free(&z);
	slot_insert(b->slots, b->nslots, s, b->nshapes);
	b->nshapes++;
	*out = s;
	return 0;
}

/* Appends one chunk as a torch.save zip to its rank's file. */
static int append_chunk(builder *b, item *it)
{
	const rs_tensor *ten = &b->ck->catalog.tensors[it->tensor];
	rs_dtype dtype = b->l->targets[it->tensor].dtype;
	uint32_t file = b->files[it->rank];
	const zip_shape *z;
	rs_plan plan;
	int err = zip_of(b, dtype, &it->box, &z);

	if (err)
		return err;
	it->offset = b->t->nodes[file].size;
	it->length = z->size;
	for (size_t p = 0; p < z->npieces && !err; p++) {
		const rs_zip_piece *pc = &z->pieces[p];

		if (pc->kind == RS_ZIP_PIECE_LITERAL) {
			err = rs_vtree_append_kept(b->t, file, pc->bytes,
						   pc->length);
			continue;
		}
		err = rs_plan_box(ten, &it->box, it->box.len, &plan);
		if (!err)
			err = rs_vtree_append_plan(b->t, file, &plan,
						   ten->dtype, dtype);
	}
	return err;
}

static int add_item(builder *b, item it)
{
	int err = rs_array_reserve(&b->items, &b->cap_items, b->nitems + 1,
				   sizeof(item));

	if (!err)
		b->items[b->nitems++] = it;
	return err;
}

/* The rank file a chunk (at grid index idx) goes to (above). */
static uint32_t owner(const rs_layout *l, const rs_target *tg,
		      const uint64_t *idx)
{
	uint32_t r = tg->axis >= 0
		? (uint32_t)(idx[tg->axis] % rs_layout_tp_of(l, tg)) : 0;
	int64_t x = tg->expert_axis >= 0 ? (int64_t)idx[tg->expert_axis]
					 : tg->expert;

	if (x >= 0 && l->experts)
		r += l->etp * (uint32_t)((uint64_t)x / (l->experts / l->ep));
	return r;
}

/* Every chunk of every tensor on the target grid, with its owner. */
static int plan_items(builder *b)
{
	for (size_t i = 0; i < b->ck->catalog.count; i++) {
		const rs_tensor *ten = &b->ck->catalog.tensors[i];
		const rs_target *tg = &b->l->targets[i];
		uint64_t count[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 }, n = 0;
		int err;

		rs_grid_count(tg->shape, tg->chunk, ten->ndim, count);
		for (int k = 0; k < ten->ndim; k++)
			if (count[k] == 0) {
				/* An empty tensor: torch saves one empty
				 * chunk of the whole shape, owned by rank
				 * 0; without it DCP's load reports the key
				 * missing. */
				item it = { .tensor = i };

				it.box.ndim = ten->ndim;
				memcpy(it.box.len, tg->shape,
				       sizeof(uint64_t) * (size_t)ten->ndim);
				err = add_item(b, it);
				if (err)
					return err;
				goto next;
			}
		for (;;) {
			item it = { .tensor = i, .index = n++ };

			rs_grid_cell(idx, tg->chunk, tg->shape, ten->ndim, &it.box);
			it.rank = owner(b->l, tg, idx);
			err = add_item(b, it);
			if (err)
				return err;
			if (!rs_grid_next(idx, count, ten->ndim))
				break;
		}
next:
		continue;
	}
	for (size_t i = 0; i < b->ck->nblobs; i++) {
		item it = { .tensor = SIZE_MAX, .blob = &b->ck->blobs[i] };
		int err = add_item(b, it);

		if (err)
			return err;
	}
	return 0;
}

static void pw_properties(rs_pwriter *w, rs_dtype dtype)
{
	/* TensorProperties pickles its state as (dtype, layout,
	 * requires_grad, memory_format, pin_memory). */
	rs_pw_global(w, dcp_meta, "TensorProperties");
	rs_pw_tuple_n(w, 0);
	rs_pw_newobj(w);
	rs_pw_tuple_begin(w);
	rs_pw_global(w, "torch", rs_dtype_torch_name(dtype));
	rs_pw_global(w, "torch.serialization", "_get_layout");
	rs_pw_cstr(w, "torch.strided");
	rs_pw_tuple_n(w, 1);
	rs_pw_reduce(w);
	rs_pw_bool(w, false);
	rs_pw_global(w, dcp_meta, "_MEM_FORMAT_ENCODING");
	rs_pw_int(w, 0);
	rs_pw_tuple_n(w, 1);
	rs_pw_reduce(w);
	rs_pw_bool(w, false);
	rs_pw_tuple_end(w);
	rs_pw_build(w);
}

static void pw_relpath(rs_pwriter *w, uint32_t rank)
{
	char name[32];

	snprintf(name, sizeof(name), "__%u_0.distcp", rank);
	rs_pw_cstr(w, name);
}

/* The Metadata pickle: state_dict_metadata and storage_data. */
static int metadata_pickle(builder *b, uint8_t **out, size_t *len)
{
	rs_pwriter w;
	size_t k = 0;

	rs_pw_init(&w, 4);
	pw_object_begin(&w, dcp_meta, "Metadata");
	rs_pw_cstr(&w, "state_dict_metadata");
	rs_pw_dict_begin(&w);
	while (k < b->nitems) {
		const item *it = &b->items[k];

		if (it->blob) {
			rs_pw_cstr(&w, it->blob->fqn);
			pw_object_begin(&w, dcp_meta, "BytesStorageMetadata");
			pw_object_end(&w);
			k++;
			continue;
		}
		const rs_tensor *ten = &b->ck->catalog.tensors[it->tensor];

		rs_pw_cstr(&w, ten->name);
		pw_object_begin(&w, dcp_meta, "TensorStorageMetadata");
		rs_pw_cstr(&w, "properties");
		pw_properties(&w, b->l->targets[it->tensor].dtype);
		rs_pw_cstr(&w, "size");
		pw_size(&w, b->l->targets[it->tensor].shape, ten->ndim);
		rs_pw_cstr(&w, "chunks");
		rs_pw_list_begin(&w);
		for (; k < b->nitems && b->items[k].tensor == it->tensor; k++) {
			pw_object_begin(&w, dcp_meta, "ChunkStorageMetadata");
			rs_pw_cstr(&w, "offsets");
			pw_size(&w, b->items[k].box.off, ten->ndim);
			rs_pw_cstr(&w, "sizes");
			pw_size(&w, b->items[k].box.len, ten->ndim);
			pw_object_end(&w);
		}
		rs_pw_list_end(&w);
		pw_object_end(&w);
	}
	rs_pw_dict_end(&w);
	rs_pw_cstr(&w, "planner_data");
	rs_pw_none(&w);
	rs_pw_cstr(&w, "storage_data");
	rs_pw_dict_begin(&w);
	for (k = 0; k < b->nitems; k++) {
		const item *it = &b->items[k];
		const rs_tensor *ten = it->blob ? NULL
						: &b->ck->catalog.tensors[it->tensor];

		pw_object_begin(&w, dcp_meta, "MetadataIndex");
		rs_pw_cstr(&w, "fqn");
		rs_pw_cstr(&w, it->blob ? it->blob->fqn : ten->name);
		rs_pw_cstr(&w, "offset");
		if (it->blob)
			rs_pw_none(&w);
		else
			pw_size(&w, it->box.off, ten->ndim);
		rs_pw_cstr(&w, "index");
		if (it->blob)
			rs_pw_none(&w);
		else
			rs_pw_int(&w, (int64_t)it->index);
		pw_object_end(&w);
		pw_object_begin(&w, "torch.distributed.checkpoint.filesystem",
				"_StorageInfo");
		rs_pw_cstr(&w, "relative_path");
		pw_relpath(&w, it->rank);
		rs_pw_cstr(&w, "offset");
		rs_pw_int(&w, (int64_t)it->offset);
		rs_pw_cstr(&w, "length");
		rs_pw_int(&w, (int64_t)it->length);
		pw_object_end(&w);
	}
	rs_pw_dict_end(&w);
	rs_pw_cstr(&w, "storage_meta");
	rs_pw_none(&w);
	rs_pw_cstr(&w, "version");
	rs_pw_cstr(&w, "1.0.0");
	pw_object_end(&w);
	return rs_pw_finish(&w, out, len);
}

/* A file the view writes itself, at the top.  A file or directory of
 * SOURCE carried into the view may hold its name (a stray `.metadata` or
 * `__0_0.distcp` in a zarr source): that is reported, not served. */
static int add_own_file(const rs_checkpoint *ck, rs_vtree *t,
			const char *name, uint32_t *file, rs_diag *d)
{
	int err = rs_vtree_add_file(t, 0, name, ck->root_mtime, file);

	if (err == -EEXIST) {
		rs_diag_add(d, "%s/%s: the torch_dist view writes a file of this name itself",
			    ck->dir_path, name);
		err = -EINVAL;
	}
	return err;
}

/* tp, or ep * etp when the experts spread over more ranks (at most
 * RS_LAYOUT_MAX_RANKS: planner/layout.c refuses more). */
static uint32_t rank_files(const rs_layout *l)
{
	uint64_t e = l->experts ? (uint64_t)l->ep * l->etp : 0;

	return e > l->tp ? (uint32_t)e : l->tp;
}

int rs_torch_dist_build_view(const rs_checkpoint *ck, const rs_layout *l,
			     rs_vtree *t, rs_diag *d)
{
	static const char meta_json[] =
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
		"\"common_backend\": \"torch\", \"common_backend_version\": 1}";
	builder b = { .ck = ck, .l = l, .t = t, .d = d };
	uint8_t *pkl = NULL;
	size_t pkl_len;
	uint32_t file;
	int err = -ENOMEM;

	b.nfiles = rank_files(l);
	b.files = calloc(b.nfiles, sizeof(uint32_t));
	if (!b.files)
		goto out;
	err = rs_checkpoint_carry(ck, t);
	if (!err)
		err = add_own_file(ck, t, "metadata.json", &file, d);
	if (!err)
		err = rs_vtree_append_literal(t, file, meta_json,
					      sizeof(meta_json) - 1);
	for (uint32_t r = 0; r < b.nfiles && !err; r++) {
		char name[32];

		snprintf(name, sizeof(name), "__%u_0.distcp", r);
		err = add_own_file(ck, t, name, &b.files[r], d);
	}
	if (!err)
		err = plan_items(&b);
	for (size_t k = 0; k < b.nitems && !err; k++) {
		item *it = &b.items[k];

		if (it->blob) {
			uint32_t f0 = b.files[0];

			it->offset = t->nodes[f0].size;
			err = rs_checkpoint_append_blob(ck, it->blob, true, t, f0,
							&it->length, d);
		} else {
			err = append_chunk(&b, it);
		}
	}
	if (!err)
		err = metadata_pickle(&b, &pkl, &pkl_len);
	if (!err)
		err = add_own_file(ck, t, ".metadata", &file, d);
	/* The pickle (84 MB for DeepSeek-V3's 1.8 x 10^5 chunks) is handed
	 * to the tree, not copied: no second copy at the peak. */
	if (!err && !(err = rs_vtree_keep(t, pkl))) {
		uint8_t *kept = pkl;

		pkl = NULL;
		err = rs_vtree_append_kept(t, file, kept, pkl_len);
	}
out:
	free(pkl);
	free(b.items);
	free(b.files);
	shapes_free(&b);
	return err;
}
