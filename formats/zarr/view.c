/* zarr view builder: catalog + layout -> virtual tree in zarr layout
 * (formats/zarr/zarr.h). */
#include "formats/zarr/zarr.h"
#include "formats/zarr/zarr_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/codec/json_text.h"

void rs_zarr_chunk_name(const uint64_t *idx, int ndim, char *out, size_t size)
{
	size_t at = 0;

	snprintf(out, size, "0");
	for (int i = 0; i < ndim && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%llu",
				       i ? "." : "", (unsigned long long)idx[i]);
}

static struct timespec source_mtime(const rs_checkpoint *ck, uint32_t src)
{
	const rs_file_id *id = rs_sources_id(ck->sources, src);
	struct timespec ts = { id->mtime_sec, id->mtime_nsec };

	return ts;
}

/* An array the layout keeps: .zarray and chunks passed through as stored. */
static int view_stored(rs_vtree *t, const rs_checkpoint *ck,
		       const rs_zarr_array *arr, uint32_t dir)
{
	const rs_tensor *ten = &ck->catalog.tensors[arr->tensor];
	uint64_t bytes = rs_tensor_chunk_bytes(ten);
	uint32_t file;
	int err;

	err = rs_vtree_add_file(t, dir, ".zarray",
				source_mtime(ck, arr->zarray_source), &file);
	if (!err)
		err = rs_vtree_append_source(t, file, arr->zarray_source, 0,
					     arr->zarray_len);
	for (uint64_t g = 0; g < ten->nfrags && !err; g++) {
		uint64_t idx[RS_MAX_DIMS];
		char name[RS_MAX_DIMS * 21];
		uint32_t src = ten->frags[g].source;

		rs_grid_coords(g, ten->grid_count, ten->ndim, idx);
		rs_zarr_chunk_name(idx, ten->ndim, name, sizeof(name));
		err = rs_vtree_add_file(t, dir, name, source_mtime(ck, src),
					&file);
		if (!err)
			err = rs_vtree_append_source(t, file, src, 0, bytes);
	}
	return err;
}

/* A .zarray as zarr-python writes it: json.dumps(indent=4, sort_keys=True). */
static char *zarray_text(const rs_tensor *ten, rs_dtype dtype,
			 const uint64_t *shape, const uint64_t *chunk,
			 size_t *len)
{
	char lists[2][RS_MAX_DIMS * 30 + 16];
	const uint64_t *v[2] = { chunk, shape };
	char *out = NULL;
	int n;

	for (int k = 0; k < 2; k++) {
		size_t at = 0;

		if (ten->ndim == 0) {
			snprintf(lists[k], sizeof(lists[k]), "[]");
			continue;
		}
		at += (size_t)snprintf(lists[k], sizeof(lists[k]), "[");
		for (int i = 0; i < ten->ndim; i++)
			at += (size_t)snprintf(lists[k] + at, sizeof(lists[k]) - at,
					       "%s\n        %llu", i ? "," : "",
					       (unsigned long long)v[k][i]);
		snprintf(lists[k] + at, sizeof(lists[k]) - at, "\n    ]");
	}
	n = asprintf(&out,
		     "{\n    \"chunks\": %s,\n    \"compressor\": null,\n"
		     "    \"dtype\": \"%s\",\n    \"fill_value\": null,\n"
		     "    \"filters\": null,\n    \"order\": \"C\",\n"
		     "    \"shape\": %s,\n    \"zarr_format\": 2\n}",
		     lists[0], rs_dtype_zarr_name(dtype), lists[1]);
	if (n < 0)
		return NULL;
	*len = (size_t)n;
	return out;
}

/* The stored .zarray text with the view's "shape", "chunks" and, for a
 * dtype view, "dtype"; every other byte as stored. */
static int rewrite_zarray(const rs_tensor *ten, const rs_zarr_array *arr,
			  const rs_target *tg, char **text, size_t *len)
{
	const char *keys[2] = { "shape", "chunks" };
	const uint64_t *values[2] = { tg->shape, tg->chunk };
	const int counts[2] = { ten->ndim, ten->ndim };
	const char *dkey[1] = { "dtype" };
	char quoted[32], *first;
	const char *dval[1] = { quoted };
	size_t first_len;
	int err;

	err = rs_json_replace_lists(arr->zarray_text, arr->zarray_len, keys,
				    values, counts, 2, &first, &first_len);
	if (err || tg->dtype == ten->dtype) {
		*text = err ? NULL : first;
		*len = first_len;
		return err;
	}
	snprintf(quoted, sizeof(quoted), "\"%s\"", rs_dtype_zarr_name(tg->dtype));
	err = rs_json_replace_values(first, first_len, dkey, dval, 1, text, len);
	free(first);
	return err;
}

/* An array on the target grid: its .zarray (the stored text rewritten
 * when there is one, else written anew) and one planned file per chunk,
 * converted to the view's dtype. */
static int view_planned(rs_vtree *t, const rs_checkpoint *ck,
			const rs_tensor *ten, const rs_zarr_array *arr,
			const rs_target *tg, struct timespec mtime,
			uint32_t dir, rs_diag *d)
{
	const uint64_t *shape = tg->shape, *chunk = tg->chunk;
	uint64_t count[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 }, bytes;
	char *text = NULL;
	size_t len;
	uint32_t file;
	int err;

	unsigned esize = rs_dtype_size(ten->dtype) > rs_dtype_size(tg->dtype)
				 ? rs_dtype_size(ten->dtype) : rs_dtype_size(tg->dtype);

	if (!rs_product(chunk, ten->ndim, &bytes) ||
	    !rs_mul_u64(bytes, esize, &bytes)) {
		rs_diag_add(d, "%s: target chunk size overflows", ten->name);
		return -EINVAL;
	}
	if (!rs_dtype_zarr_name(tg->dtype)) {
		rs_diag_add(d, "%s: dtype %s has no zarr spelling; choose -o format=torch_dist or -o dtype=",
			    ten->name, rs_dtype_name(tg->dtype));
		return -EINVAL;
	}
	if (arr)
		err = rewrite_zarray(ten, arr, tg, &text, &len);
	else
		err = (text = zarray_text(ten, tg->dtype, shape, chunk, &len))
			? 0 : -ENOMEM;
	if (err) {
		rs_diag_add(d, "%s/%s/.zarray: cannot rewrite \"shape\"/\"chunks\"",
			    ck->dir_path, ten->name);
		return -EINVAL;
	}
	err = rs_vtree_add_file(t, dir, ".zarray", mtime, &file);
	if (!err)
		err = rs_vtree_append_literal(t, file, text, len);
	free(text);
	if (err)
		return err;

	rs_grid_count(shape, chunk, ten->ndim, count);
	for (int i = 0; i < ten->ndim; i++)
		if (count[i] == 0)
			return 0; /* empty array: no chunk files */
	for (;;) {
		char name[RS_MAX_DIMS * 21];
		rs_box box;
		rs_plan plan;

		rs_grid_cell(idx, chunk, shape, ten->ndim, &box);
		rs_zarr_chunk_name(idx, ten->ndim, name, sizeof(name));
		err = rs_vtree_add_file(t, dir, name, mtime, &file);
		if (err)
			return err;
		err = rs_plan_box(ten, &box, chunk, &plan);
		if (!err)
			err = rs_vtree_append_plan(t, file, &plan, ten->dtype,
						   tg->dtype);
		if (err)
			return err;
		if (!rs_grid_next(idx, count, ten->ndim))
			return 0;
	}
}

/* The directory `name` under `parent`, made if it is not there yet. */
static int dir_at(rs_vtree *t, uint32_t parent, const char *name,
		  struct timespec mtime, uint32_t *dir)
{
	if (rs_vtree_lookup(t, parent, name, dir) == 0) {
		if (t->nodes[*dir].is_dir)
			return 0;
		t->clash = *dir + 1;
		return -EEXIST;
	}
	return rs_vtree_add_dir(t, parent, name, mtime, dir);
}

/* Tensors of a source that has no zarr arrays (torch_dist): one array
 * directory each, named by its key. */
static int view_catalog(rs_vtree *t, const rs_checkpoint *ck,
			const rs_layout *l, rs_diag *d)
{
	for (size_t i = 0; i < ck->catalog.count; i++) {
		const rs_tensor *ten = &ck->catalog.tensors[i];
		const rs_target *tg = &l->targets[i];
		uint32_t dir;
		int err;

		if (!rs_name_is_safe(ten->name)) {
			rs_diag_add(d, "%s: tensor name \"%s\" cannot be a directory name",
				    ck->dir_path, ten->name);
			return -EINVAL;
		}
		err = dir_at(t, 0, ten->name, ck->root_mtime, &dir);
		if (!err)
			err = view_planned(t, ck, ten, NULL, tg, ck->root_mtime,
					   dir, d);
		if (err)
			return err;
	}
	return 0;
}

/* Byte items: `<key>/shard_<offsets>_<shape>` becomes the file
 * `<key>/shard_<offsets>_<shape>.pt`, as the zarr backend stores them. */
static int view_blobs(rs_vtree *t, const rs_checkpoint *ck, rs_diag *d)
{
	for (size_t i = 0; i < ck->nblobs; i++) {
		const rs_blob *b = &ck->blobs[i];
		char path[4096], *slash;
		uint32_t dir = 0, file;
		int err;

		if (snprintf(path, sizeof(path), "%s.pt", b->fqn) >= (int)sizeof(path))
			return -ENAMETOOLONG;
		slash = strchr(path, '/');
		if (slash) {
			*slash = 0;
			if (strchr(slash + 1, '/') || !rs_name_is_safe(path) ||
			    !rs_name_is_safe(slash + 1)) {
				rs_diag_add(d, "%s: byte item \"%s\" cannot be a file path",
					    ck->dir_path, b->fqn);
				return -EINVAL;
			}
			err = dir_at(t, 0, path, ck->root_mtime, &dir);
			if (err)
				return err;
		}
		uint64_t len;

		err = rs_vtree_add_file(t, dir, slash ? slash + 1 : path,
					ck->root_mtime, &file);
		if (!err)
			err = rs_checkpoint_append_blob(ck, b, false, t, file, &len, d);
		if (err)
			return err;
	}
	return 0;
}

int rs_zarr_build_view(const rs_checkpoint *ck, const rs_layout *l,
		       rs_vtree *t, rs_diag *d)
{
	static const char zarr_meta[] =
		"{\"sharded_backend\": \"zarr\", \"sharded_backend_version\": 1, "
		"\"common_backend\": \"torch\", \"common_backend_version\": 1}";
	const rs_zarr_state *own = rs_zarr_state_of(ck);
	bool dist = ck->format->dist_backend != NULL, has_meta = false;
	uint32_t *node = calloc(ck->nentries ? ck->nentries : 1, sizeof(*node));
	long *array_of = malloc((ck->nentries ? ck->nentries : 1) * sizeof(long));
	int err = -ENOMEM;

	if (!node || !array_of)
		goto out;
	for (size_t i = 0; i < ck->nentries; i++)
		array_of[i] = -1;
	for (size_t a = 0; own && a < own->narrays; a++)
		array_of[own->arrays[a].dir_entry] = (long)a;

	err = 0;
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t parent = e->parent < 0 ? 0 : node[e->parent];

		/* A zarr source's hidden entries are its arrays: kept here. */
		if (e->hidden && !own)
			continue;
		if (!e->is_dir && e->parent < 0 && dist &&
		    strcmp(e->name, "metadata.json") == 0)
			has_meta = true;
		if (!e->is_dir && e->parent < 0 && dist && !own &&
		    strcmp(e->name, "metadata.json") == 0) {
			/* The view is a zarr checkpoint whatever the source. */
			err = rs_vtree_add_file(t, parent, e->name, e->mtime,
						&node[i]);
			if (!err)
				err = rs_vtree_append_literal(t, node[i], zarr_meta,
							      sizeof(zarr_meta) - 1);
			continue;
		}
		if (!e->is_dir) {
			err = rs_vtree_add_file(t, parent, e->name, e->mtime,
						&node[i]);
			if (!err)
				err = rs_vtree_append_source(
					t, node[i], e->source, 0,
					rs_sources_id(ck->sources, e->source)->size);
			continue;
		}
		err = rs_vtree_add_dir(t, parent, e->name, e->mtime, &node[i]);
		if (err || array_of[i] < 0)
			continue;
		{
			const rs_zarr_array *arr = &own->arrays[array_of[i]];
			const rs_target *tg = &l->targets[arr->tensor];

			err = tg->changed
				? view_planned(t, ck, &ck->catalog.tensors[arr->tensor],
					       arr, tg,
					       source_mtime(ck, arr->zarray_source),
					       node[i], d)
				: view_stored(t, ck, arr, node[i]);
		}
	}
	/* A source without metadata.json (plain DCP, per-rank, safetensors,
	 * metaseq) gets the one that makes the view a dist checkpoint
	 * (megatron-core's loader reads it first). */
	if (!err && !has_meta) {
		uint32_t file;

		err = rs_vtree_add_file(t, 0, "metadata.json", ck->root_mtime,
					&file);
		if (!err)
			err = rs_vtree_append_literal(t, file, zarr_meta,
						      sizeof(zarr_meta) - 1);
	}
	/* A zarr source's arrays and ShardedObject files came with its
	 * entries; other sources' tensors and byte items are laid out here. */
	if (!err && !own)
		err = view_catalog(t, ck, l, d);
	if (!err && !own)
		err = view_blobs(t, ck, d);
	if (!err)
		err = rs_checkpoint_add_made(ck, t);
out:
	free(array_of);
	free(node);
	return err;
}
