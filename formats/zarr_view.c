/* zarr view builder: catalog + layout -> virtual tree in zarr layout. */
#include "formats/zarr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json_text.h"

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
		uint64_t idx[RS_MAX_DIMS], rest = g;
		char name[RS_MAX_DIMS * 21];
		uint32_t src = ten->frags[g].source;

		for (int i = ten->ndim - 1; i >= 0; i--) {
			idx[i] = rest % ten->grid_count[i];
			rest /= ten->grid_count[i];
		}
		rs_zarr_chunk_name(idx, ten->ndim, name, sizeof(name));
		err = rs_vtree_add_file(t, dir, name, source_mtime(ck, src),
					&file);
		if (!err)
			err = rs_vtree_append_source(t, file, src, 0, bytes);
	}
	return err;
}

/* An array on a new grid: rewritten .zarray, one planned file per chunk. */
static int view_resharded(rs_vtree *t, const rs_checkpoint *ck,
			  const rs_zarr_array *arr, const rs_target *tg,
			  uint32_t dir, rs_diag *d)
{
	const rs_tensor *ten = &ck->catalog.tensors[arr->tensor];
	const char *keys[2] = { "shape", "chunks" };
	const uint64_t *values[2] = { tg->shape, tg->chunk };
	const int counts[2] = { ten->ndim, ten->ndim };
	struct timespec mtime = source_mtime(ck, arr->zarray_source);
	uint64_t count[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 }, bytes;
	char *text = NULL;
	size_t len;
	uint32_t file;
	int err;

	if (!rs_product(tg->chunk, ten->ndim, &bytes) ||
	    !rs_mul_u64(bytes, rs_dtype_size(ten->dtype), &bytes)) {
		rs_diag_add(d, "%s: target chunk size overflows", ten->name);
		return -EINVAL;
	}
	err = rs_json_replace_lists(arr->zarray_text, arr->zarray_len, keys,
				    values, counts, 2, &text, &len);
	if (err) {
		rs_diag_add(d, "%s/%s/.zarray: cannot rewrite \"shape\"/\"chunks\"",
			    ck->root_path, ten->name);
		return -EINVAL;
	}
	err = rs_vtree_add_file(t, dir, ".zarray", mtime, &file);
	if (!err)
		err = rs_vtree_append_literal(t, file, text, len);
	free(text);
	if (err)
		return err;

	for (int i = 0; i < ten->ndim; i++) {
		count[i] = tg->shape[i] / tg->chunk[i] +
			   (tg->shape[i] % tg->chunk[i] != 0);
		if (count[i] == 0)
			return 0; /* empty array: no chunk files */
	}
	for (;;) {
		char name[RS_MAX_DIMS * 21];
		rs_box box = { .ndim = ten->ndim };
		rs_plan plan;

		for (int i = 0; i < ten->ndim; i++) {
			uint64_t end = (idx[i] + 1) * tg->chunk[i];

			box.off[i] = idx[i] * tg->chunk[i];
			box.len[i] = (end > tg->shape[i] ? tg->shape[i] : end) -
				     box.off[i];
		}
		rs_zarr_chunk_name(idx, ten->ndim, name, sizeof(name));
		err = rs_vtree_add_file(t, dir, name, mtime, &file);
		if (err)
			return err;
		err = rs_plan_box(ten, &box, tg->chunk, &plan);
		if (!err)
			err = rs_vtree_append_plan(t, file, &plan);
		if (err)
			return err;

		int i = ten->ndim - 1;

		while (i >= 0 && ++idx[i] == count[i])
			idx[i--] = 0;
		if (i < 0)
			return 0;
	}
}

int rs_zarr_build_view(const rs_checkpoint *ck, const rs_layout *l,
		       rs_vtree *t, rs_diag *d)
{
	uint32_t *node = calloc(ck->nentries ? ck->nentries : 1, sizeof(*node));
	long *array_of = malloc((ck->nentries ? ck->nentries : 1) * sizeof(long));
	int err = -ENOMEM;

	if (!node || !array_of)
		goto out;
	for (size_t i = 0; i < ck->nentries; i++)
		array_of[i] = -1;
	for (size_t a = 0; a < ck->narrays; a++)
		array_of[ck->arrays[a].dir_entry] = (long)a;

	err = 0;
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t parent = e->parent < 0 ? 0 : node[e->parent];

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
			const rs_zarr_array *arr = &ck->arrays[array_of[i]];
			const rs_target *tg = &l->targets[arr->tensor];

			err = tg->changed
				? view_resharded(t, ck, arr, tg, node[i], d)
				: view_stored(t, ck, arr, node[i]);
		}
	}
out:
	free(array_of);
	free(node);
	return err;
}
