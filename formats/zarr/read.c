/* zarr reader: SOURCE directory -> catalog, source table, entries and
 * the arrays' .zarray texts (formats/zarr/zarr.h). */
#include "formats/zarr/zarr.h"
#include "formats/zarr/zarr_int.h"

#include "formats/codec/json_text.h"

#include "planner/array.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A .zarray is a few hundred bytes; anything near this is hostile. */
#define RS_ZARRAY_MAX_BYTES (1u << 20)

static int read_int_list(const cJSON *arr, uint64_t *out, int *n,
			 const char *path, const char *key, rs_diag *d)
{
	const cJSON *item;
	int i = 0;

	if (!cJSON_IsArray(arr)) {
		rs_diag_add(d, "%s: \"%s\" must be a list of integers", path, key);
		return -EINVAL;
	}
	if (cJSON_GetArraySize(arr) > RS_MAX_DIMS) {
		rs_diag_add(d, "%s: \"%s\" has %d axes; at most %d are supported",
			    path, key, cJSON_GetArraySize(arr), RS_MAX_DIMS);
		return -EINVAL;
	}
	cJSON_ArrayForEach(item, arr) {
		if (!rs_json_u64(item, &out[i])) {
			rs_diag_add(d, "%s: \"%s\"[%d] is not a non-negative integer",
				    path, key, i);
			return -EINVAL;
		}
		i++;
	}
	*n = i;
	return 0;
}

int rs_zarr_parse_meta(const char *text, size_t len, const char *path,
		       const char *name, rs_catalog *c, size_t *tensor,
		       rs_diag *d)
{
	cJSON *root = NULL;
	const cJSON *v;
	uint64_t shape[RS_MAX_DIMS], chunks[RS_MAX_DIMS], total;
	int nshape = 0, nchunks = 0, err;
	rs_dtype dtype;
	char why[100];

	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: %s", path, why);
	if (err)
		goto out;
	err = -EINVAL;
	v = cJSON_GetObjectItemCaseSensitive(root, "zarr_format");
	if (!cJSON_IsNumber(v) || v->valuedouble != 2) {
		rs_diag_add(d, "%s: \"zarr_format\" must be 2", path);
		goto out;
	}
	if (read_int_list(cJSON_GetObjectItemCaseSensitive(root, "shape"),
			  shape, &nshape, path, "shape", d) ||
	    read_int_list(cJSON_GetObjectItemCaseSensitive(root, "chunks"),
			  chunks, &nchunks, path, "chunks", d))
		goto out;
	if (nshape != nchunks) {
		rs_diag_add(d, "%s: \"shape\" has %d axes but \"chunks\" has %d",
			    path, nshape, nchunks);
		goto out;
	}
	for (int i = 0; i < nchunks; i++)
		if (chunks[i] == 0) {
			rs_diag_add(d, "%s: \"chunks\"[%d] is 0", path, i);
			goto out;
		}
	v = cJSON_GetObjectItemCaseSensitive(root, "dtype");
	dtype = rs_dtype_from_zarr(cJSON_IsString(v) ? v->valuestring : NULL);
	if (dtype == RS_DTYPE_INVALID) {
		rs_diag_add(d, "%s: unsupported \"dtype\" %s", path,
			    cJSON_IsString(v) ? v->valuestring : "(not a string)");
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "compressor");
	if (v && !cJSON_IsNull(v)) {
		const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "id");

		rs_diag_add(d, "%s: compressor %s is not supported (only uncompressed arrays, as Megatron writes)",
			    path, cJSON_IsString(id) ? id->valuestring : "(unknown)");
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "filters");
	if (v && !cJSON_IsNull(v) &&
	    !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)) {
		rs_diag_add(d, "%s: \"filters\" are not supported", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "order");
	if (!cJSON_IsString(v) || strcmp(v->valuestring, "C") != 0) {
		rs_diag_add(d, "%s: \"order\" must be \"C\"", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "dimension_separator");
	if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, ".") == 0)) {
		rs_diag_add(d, "%s: only \".\" is supported as \"dimension_separator\"",
			    path);
		goto out;
	}
	if (!rs_product(shape, nshape, &total) ||
	    !rs_mul_u64(total, rs_dtype_size(dtype), &total)) {
		rs_diag_add(d, "%s: \"shape\" overflows 64-bit byte sizes", path);
		goto out;
	}
	err = rs_catalog_add_regular(c, name, dtype, nshape, shape, chunks,
				     tensor);
	if (err == -EOVERFLOW || err == -E2BIG || err == -EINVAL) {
		rs_diag_add(d, "%s: chunk grid too large (%s)", path,
			    err == -E2BIG ? "too many chunks" : "byte size overflows");
		err = -EINVAL;
	}
out:
	cJSON_Delete(root);
	return err;
}

/* "i.j.k" -> idx; canonical decimal only, so two names never map to one
 * chunk.  A 0-d array's only chunk is "0". */
static bool parse_chunk_name(const char *name, const rs_tensor *t,
			     uint64_t *idx, bool *in_grid)
{
	const char *p = name;
	int n = t->ndim ? t->ndim : 1;

	*in_grid = true;
	for (int i = 0; i < n; i++) {
		uint64_t v = 0;
		const char *start = p;

		if (*p < '0' || *p > '9')
			return false;
		while (*p >= '0' && *p <= '9') {
			if (p - start >= 19)
				return false;
			v = v * 10 + (uint64_t)(*p++ - '0');
		}
		if (p - start > 1 && *start == '0')
			return false;
		if (i < n - 1 && *p++ != '.')
			return false;
		if (t->ndim == 0)
			*in_grid = v == 0;
		else if (v >= t->grid_count[i])
			*in_grid = false;
		if (t->ndim)
			idx[i] = v;
	}
	return *p == 0;
}

/* Writes the chunk file name of linear grid index g. */
static void chunk_name(const rs_tensor *t, uint64_t g, char *out, size_t size)
{
	uint64_t idx[RS_MAX_DIMS];

	rs_grid_coords(g, t->grid_count, t->ndim, idx);
	rs_zarr_chunk_name(idx, t->ndim, out, size);
}

/* Reports missing chunks of a tensor (a few by name, then a count). */
static int check_complete(rs_checkpoint *ck, const rs_tensor *t,
			  const bool *seen, const char *dir, rs_diag *d)
{
	uint64_t missing = 0;

	for (uint64_t g = 0; g < t->nfrags; g++) {
		char name[RS_MAX_DIMS * 21];

		if (seen[g] || ++missing > 3)
			continue;
		chunk_name(t, g, name, sizeof(name));
		rs_diag_add(d, "%s/%s/%s: missing chunk file", ck->root_path,
			    dir, name);
	}
	if (missing > 3)
		rs_diag_add(d, "%s/%s: %llu more chunk files missing",
			    ck->root_path, dir, (unsigned long long)(missing - 3));
	return missing ? -EINVAL : 0;
}

/* The walker's hook: a directory holding .zarray is an array, read here;
 * any other is walked as it is. */
static int read_array(rs_checkpoint *ck, const rs_walk_hooks *h,
		      const rs_walk_dir *w, rs_diag *d)
{
	rs_zarr_state *zs = ck->extra;
	int dirfd = w->fd;
	const char *relpath = w->relpath;
	char path[PATH_MAX];
	rs_zarr_array arr = { 0 };
	struct stat st;
	char **names = NULL;
	size_t nnames = 0;
	bool *seen = NULL;
	rs_tensor *t;
	uint64_t chunk_bytes, idx[RS_MAX_DIMS];
	int err, bad = 0;

	if (fstatat(dirfd, ".zarray", &st, AT_SYMLINK_NOFOLLOW) != 0)
		return RS_WALK_DESCEND;
	err = rs_checkpoint_add_entry(ck, w->name, w->parent, true, 0, w->st,
				      &arr.dir_entry);
	if (err)
		return err;
	if ((err = rs_path_join(path, relpath, ".zarray")))
		return err;
	/* path is beneath SOURCE, the tensor's name is its directory's path
	 * in the checkpoint directory (they differ in the root form). */
	err = rs_checkpoint_read_file(ck, rs_checkpoint_local(ck, path),
				      RS_ZARRAY_MAX_BYTES, &arr.zarray_text,
				      &arr.zarray_len, &st, d);
	if (err == -ENOENT)
		rs_diag_add(d, "%s/%s: vanished while reading", ck->root_path, path);
	if (err)
		return err == -ENOENT ? -EINVAL : err;
	{
		char shown[PATH_MAX + 64];

		snprintf(shown, sizeof(shown), "%s/%s", ck->root_path, path);
		err = rs_zarr_parse_meta(arr.zarray_text, arr.zarray_len, shown,
					 rs_checkpoint_local(ck, relpath),
					 &ck->catalog, &arr.tensor, d);
		if (!err)
			err = rs_catalog_set_origin(&ck->catalog, arr.tensor, shown);
	}
	if (!err)
		err = rs_checkpoint_add_file(ck, path, &st, &arr.zarray_source,
					     d);
	if (err)
		goto fail_text;

	t = &ck->catalog.tensors[arr.tensor];
	chunk_bytes = rs_tensor_chunk_bytes(t);
	seen = calloc(t->nfrags ? t->nfrags : 1, sizeof(bool));
	if (!seen) {
		err = -ENOMEM;
		goto fail_text;
	}
	err = rs_list_dir(dirfd, &names, &nnames);
	if (err)
		goto fail_seen;
	for (size_t i = 0; i < nnames; i++) {
		bool in_grid;
		uint32_t src;

		if (strcmp(names[i], ".zarray") == 0)
			continue;
		/* A nested walk may have grown the catalog: re-fetch. */
		t = &ck->catalog.tensors[arr.tensor];
		if ((err = rs_path_join(path, relpath, names[i])))
			goto fail_names;
		if (rs_checkpoint_stat(ck, dirfd, names[i], path, &st, d)) {
			/* Reported; not again as a missing chunk. */
			if (parse_chunk_name(names[i], t, idx, &in_grid) && in_grid)
				seen[t->ndim ? rs_tensor_grid_index(t, idx) : 0] = true;
			bad = -EINVAL;
			continue;
		}
		if (!parse_chunk_name(names[i], t, idx, &in_grid)) {
			/* .zattrs and the like: passed through. */
			if (S_ISDIR(st.st_mode)) {
				long sub;
				int subfd = openat(dirfd, names[i],
						   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

				if (subfd < 0 ||
				    rs_checkpoint_add_entry(ck, names[i], arr.dir_entry,
							    true, 0, &st, &sub) ||
				    rs_checkpoint_walk_dir(ck, h, subfd, path, sub,
							   w->depth + 1, d))
					bad = -EINVAL;
				if (subfd >= 0)
					close(subfd);
			} else if (rs_checkpoint_add_file(ck, path, &st, &src, d) ||
				   rs_checkpoint_add_entry(ck, names[i], arr.dir_entry,
							   false, src, &st, NULL)) {
				bad = -EINVAL;
			}
			continue;
		}
		if (!in_grid) {
			rs_diag_add(d, "%s/%s: chunk index outside the array's grid",
				    ck->root_path, path);
			bad = -EINVAL;
			continue;
		}
		seen[t->ndim ? rs_tensor_grid_index(t, idx) : 0] = true;
		if (!S_ISREG(st.st_mode)) {
			/* A FIFO or device is never opened: it could block. */
			rs_diag_add(d, "%s/%s: chunk file is not a regular file",
				    ck->root_path, path);
			bad = -EINVAL;
			continue;
		}
		if ((uint64_t)st.st_size != chunk_bytes) {
			rs_diag_add(d, "%s/%s: chunk file has %lld bytes, expected %llu",
				    ck->root_path, path, (long long)st.st_size,
				    (unsigned long long)chunk_bytes);
			bad = -EINVAL;
			continue;
		}
		if ((err = rs_checkpoint_add_file(ck, path, &st, &src, d)))
			goto fail_names;
		rs_catalog_set_chunk(t, idx, src, 0);
	}
	t = &ck->catalog.tensors[arr.tensor];
	if (check_complete(ck, t, seen, relpath, d))
		bad = -EINVAL;
	rs_list_free(names, nnames);
	free(seen);

	err = rs_array_reserve(&zs->arrays, &zs->cap_arrays, zs->narrays + 1,
			       sizeof(rs_zarr_array));
	if (err)
		goto fail_text;
	zs->arrays[zs->narrays++] = arr;
	return bad;

fail_names:
	rs_list_free(names, nnames);
fail_seen:
	free(seen);
fail_text:
	free(arr.zarray_text);
	return err;
}

static void free_state(void *extra)
{
	rs_zarr_state *zs = extra;

	for (size_t i = 0; zs && i < zs->narrays; i++)
		free(zs->arrays[i].zarray_text);
	if (zs)
		free(zs->arrays);
	free(zs);
}

const rs_zarr_state *rs_zarr_state_of(const rs_checkpoint *ck)
{
	return ck->format == &rs_zarr_format ? ck->extra : NULL;
}

/* An array's directory and everything in it hold its tensor's storage:
 * views other than zarr's own replace them (parents come before their
 * contents, so one pass reaches every depth). */
static void hide_arrays(rs_checkpoint *ck, const rs_zarr_state *zs)
{
	for (size_t a = 0; a < zs->narrays; a++)
		ck->entries[zs->arrays[a].dir_entry].hidden = true;
	for (size_t i = 0; i < ck->nentries; i++) {
		rs_entry *e = &ck->entries[i];

		if (e->parent >= 0 && ck->entries[e->parent].hidden)
			e->hidden = true;
	}
}

static bool is_shard_file(const char *name)
{
	size_t n = strlen(name);

	return strncmp(name, "shard_", 6) == 0 && n > 9 &&
	       strcmp(name + n - 3, ".pt") == 0;
}

/* ShardedObjects, `<key>/shard_<...>.pt` files, as the byte items
 * `<key>/shard_<...>` other views carry (their entries marked `blob`). */
static int collect_blobs(rs_checkpoint *ck)
{
	int err = 0;

	for (size_t i = 0; i < ck->nentries && !err; i++) {
		rs_entry *e = &ck->entries[i];
		const rs_entry *dir = e->parent >= 0 ? &ck->entries[e->parent] : NULL;
		rs_blob *b;

		if (e->is_dir || !dir || dir->parent >= 0 || dir->hidden ||
		    !is_shard_file(e->name))
			continue;
		err = rs_array_reserve(&ck->blobs, &ck->cap_blobs,
				       ck->nblobs + 1, sizeof(rs_blob));
		if (err)
			break;
		b = &ck->blobs[ck->nblobs];
		memset(b, 0, sizeof(*b));
		if (asprintf(&b->fqn, "%s/%.*s", dir->name,
			     (int)(strlen(e->name) - 3), e->name) < 0) {
			err = -ENOMEM;
			break;
		}
		b->source = e->source;
		b->offset = 0;
		b->length = rs_sources_id(ck->sources, e->source)->size;
		b->listed = false;
		ck->nblobs++;
		e->blob = true;
	}
	return err;
}

int rs_zarr_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	static const rs_walk_hooks arrays = { read_array, NULL };
	rs_zarr_state *zs = calloc(1, sizeof(*zs));
	int err;

	if (!zs)
		return -ENOMEM;
	ck->extra = zs;
	ck->extra_free = free_state;
	err = rs_checkpoint_walk(ck, &arrays, d);
	if (err)
		return err;
	hide_arrays(ck, zs);
	return collect_blobs(ck);
}

const rs_format_def rs_zarr_format = {
	.name = "zarr",
	.dist_backend = "zarr",
	.read = rs_zarr_read,
	.build_view = rs_zarr_build_view,
	.keeps_root = true,
};
