/* zarr reader: SOURCE directory -> catalog, source table and entries. */
#include "formats/zarr.h"

#include "formats/json_text.h"

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
/* Directory nesting passed through (ShardedObject dirs are one deep). */
#define RS_MAX_DEPTH 16
/* JSON numbers are doubles: integers above 2^53 are not exact. */
#define RS_JSON_MAX_INT 9007199254740992.0

static int add_entry(rs_checkpoint *ck, const char *name, long parent,
		     bool is_dir, uint32_t source, const struct stat *st,
		     long *index)
{
	rs_entry *e;

	int err = rs_array_reserve(&ck->entries, &ck->cap_entries,
				   ck->nentries + 1, sizeof(rs_entry));

	if (err)
		return err;
	e = &ck->entries[ck->nentries];
	e->name = strdup(name);
	if (!e->name)
		return -ENOMEM;
	e->parent = parent;
	e->is_dir = is_dir;
	e->source = source;
	e->mtime = st->st_mtim;
	e->hidden = false;
	e->blob = false;
	if (index)
		*index = (long)ck->nentries;
	ck->nentries++;
	return 0;
}

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
		double v = cJSON_IsNumber(item) ? item->valuedouble : -1;

		if (v < 0 || v > RS_JSON_MAX_INT || v != (double)(uint64_t)v) {
			rs_diag_add(d, "%s: \"%s\"[%d] is not a non-negative integer",
				    path, key, i);
			return -EINVAL;
		}
		out[i++] = (uint64_t)v;
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

/* qsort hands the comparator pointers to the array's char * elements:
 * strcmp itself would compare the pointers' bytes, not the names. */
static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of a directory (without . and ..).  *count set. */
static int list_dir(int dirfd, char ***names, size_t *count)
{
	int fd = dup(dirfd);
	DIR *dir;
	struct dirent *de;
	char **v = NULL;
	size_t n = 0, cap = 0;
	int err = 0;

	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		err = -errno;
		close(fd);
		return err;
	}
	rewinddir(dir);
	while ((errno = 0, de = readdir(dir))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		err = rs_array_reserve(&v, &cap, n + 1, sizeof(*v));
		if (err)
			goto out;
		v[n] = strdup(de->d_name);
		if (!v[n]) {
			err = -ENOMEM;
			goto out;
		}
		n++;
	}
	if (errno)
		err = -errno;
out:
	closedir(dir);
	if (err) {
		while (n)
			free(v[--n]);
		free(v);
		return err;
	}
	if (n)
		qsort(v, n, sizeof(*v), cmp_name);
	*names = v;
	*count = n;
	return 0;
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

static int join(char *out, const char *dir, const char *name)
{
	int n = dir[0] ? snprintf(out, PATH_MAX, "%s/%s", dir, name)
		       : snprintf(out, PATH_MAX, "%s", name);

	return (n < 0 || n >= PATH_MAX) ? -ENAMETOOLONG : 0;
}

/* Stats `relpath`; a symlink is followed only if it stays inside SOURCE. */
static int stat_entry(rs_checkpoint *ck, int dirfd, const char *name,
		      const char *relpath, struct stat *st, rs_diag *d)
{
	int fd;

	if (fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) != 0) {
		rs_diag_add(d, "%s/%s: cannot stat: %s", ck->root_path, relpath,
			    strerror(errno));
		return -EINVAL;
	}
	if (!S_ISLNK(st->st_mode))
		return 0;
	fd = rs_open_beneath(rs_sources_root_fd(ck->sources), relpath,
			     O_RDONLY | O_NONBLOCK);
	if (fd < 0) {
		rs_diag_add(d, "%s/%s: symbolic link %s", ck->root_path, relpath,
			    fd == -EXDEV ? "leads outside SOURCE"
					 : "cannot be followed");
		return -EINVAL;
	}
	if (fstat(fd, st) != 0 || S_ISDIR(st->st_mode)) {
		rs_diag_add(d, "%s/%s: symbolic links to directories are not supported",
			    ck->root_path, relpath);
		close(fd);
		return -EINVAL;
	}
	close(fd);
	return 0;
}

static int add_source_file(rs_checkpoint *ck, const char *relpath,
			   const struct stat *st, uint32_t *index, rs_diag *d)
{
	rs_file_id id;

	if (!S_ISREG(st->st_mode)) {
		rs_diag_add(d, "%s/%s: not a regular file or directory",
			    ck->root_path, relpath);
		return -EINVAL;
	}
	rs_file_id_from_stat(&id, st);
	return rs_sources_add(ck->sources, relpath, &id, index);
}


static int walk(rs_checkpoint *ck, int dirfd, const char *relpath,
		long parent, int depth, rs_diag *d);

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

static int read_array(rs_checkpoint *ck, int dirfd, const char *relpath,
		      const char *name, long parent, const struct stat *dst,
		      int depth, rs_diag *d)
{
	char path[PATH_MAX];
	rs_zarr_array arr = { 0 };
	struct stat st;
	char **names = NULL;
	size_t nnames = 0;
	bool *seen = NULL;
	rs_tensor *t;
	uint64_t chunk_bytes, idx[RS_MAX_DIMS];
	int err, bad = 0;

	err = add_entry(ck, name, parent, true, 0, dst, &arr.dir_entry);
	if (err)
		return err;
	if ((err = join(path, relpath, ".zarray")))
		return err;
	err = rs_checkpoint_read_file(ck, path, RS_ZARRAY_MAX_BYTES,
				      &arr.zarray_text, &arr.zarray_len, &st, d);
	if (err == -ENOENT)
		rs_diag_add(d, "%s/%s: vanished while reading", ck->root_path, path);
	if (err)
		return err == -ENOENT ? -EINVAL : err;
	{
		char shown[PATH_MAX + 64];

		snprintf(shown, sizeof(shown), "%s/%s", ck->root_path, path);
		err = rs_zarr_parse_meta(arr.zarray_text, arr.zarray_len, shown,
					 relpath, &ck->catalog, &arr.tensor, d);
		if (!err)
			err = rs_catalog_set_origin(&ck->catalog, arr.tensor, shown);
	}
	if (!err)
		err = add_source_file(ck, path, &st, &arr.zarray_source, d);
	if (err)
		goto fail_text;

	t = &ck->catalog.tensors[arr.tensor];
	chunk_bytes = rs_tensor_chunk_bytes(t);
	seen = calloc(t->nfrags ? t->nfrags : 1, sizeof(bool));
	if (!seen) {
		err = -ENOMEM;
		goto fail_text;
	}
	err = list_dir(dirfd, &names, &nnames);
	if (err)
		goto fail_seen;
	for (size_t i = 0; i < nnames; i++) {
		bool in_grid;
		uint32_t src;

		if (strcmp(names[i], ".zarray") == 0)
			continue;
		/* A nested walk may have grown the catalog: re-fetch. */
		t = &ck->catalog.tensors[arr.tensor];
		if ((err = join(path, relpath, names[i])))
			goto fail_names;
		if (stat_entry(ck, dirfd, names[i], path, &st, d)) {
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
				    add_entry(ck, names[i], arr.dir_entry, true, 0, &st, &sub) ||
				    walk(ck, subfd, path, sub, depth + 1, d))
					bad = -EINVAL;
				if (subfd >= 0)
					close(subfd);
			} else if (add_source_file(ck, path, &st, &src, d) ||
				   add_entry(ck, names[i], arr.dir_entry, false, src, &st, NULL)) {
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
		if ((err = add_source_file(ck, path, &st, &src, d)))
			goto fail_names;
		rs_catalog_set_chunk(t, idx, src, 0);
	}
	t = &ck->catalog.tensors[arr.tensor];
	if (check_complete(ck, t, seen, relpath, d))
		bad = -EINVAL;
	free_names(names, nnames);
	free(seen);

	err = rs_array_reserve(&ck->arrays, &ck->cap_arrays, ck->narrays + 1,
			       sizeof(rs_zarr_array));
	if (err)
		goto fail_text;
	ck->arrays[ck->narrays++] = arr;
	return bad;

fail_names:
	free_names(names, nnames);
fail_seen:
	free(seen);
fail_text:
	free(arr.zarray_text);
	return err;
}

static int walk(rs_checkpoint *ck, int dirfd, const char *relpath,
		long parent, int depth, rs_diag *d)
{
	char path[PATH_MAX];
	char **names = NULL;
	size_t n = 0;
	int err, bad = 0;

	if (depth > RS_MAX_DEPTH) {
		rs_diag_add(d, "%s/%s: directories nested deeper than %d",
			    ck->root_path, relpath, RS_MAX_DEPTH);
		return -EINVAL;
	}
	err = list_dir(dirfd, &names, &n);
	if (err) {
		rs_diag_add(d, "%s/%s: cannot list: %s", ck->root_path, relpath,
			    strerror(-err));
		return -EINVAL;
	}
	for (size_t i = 0; i < n && err != -ENOMEM; i++) {
		const char *name = names[i];
		struct stat st, zst;
		uint32_t src;
		int subfd;

		err = 0;
		if (depth == 0 && strcmp(name, ".reshardfs") == 0) {
			rs_diag_add(d, "%s/.reshardfs: name reserved for the mount's control directory",
				    ck->root_path);
			bad = -EINVAL;
			continue;
		}
		if ((err = join(path, relpath, name)) ||
		    stat_entry(ck, dirfd, name, path, &st, d)) {
			bad = -EINVAL;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (add_source_file(ck, path, &st, &src, d) ||
			    add_entry(ck, name, parent, false, src, &st, NULL))
				bad = -EINVAL;
			continue;
		}
		subfd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (subfd < 0) {
			rs_diag_add(d, "%s/%s: cannot open directory: %s",
				    ck->root_path, path, strerror(errno));
			bad = -EINVAL;
			continue;
		}
		if (fstatat(subfd, ".zarray", &zst, AT_SYMLINK_NOFOLLOW) == 0) {
			err = read_array(ck, subfd, path, name, parent, &st,
					 depth + 1, d);
		} else {
			long sub;

			err = add_entry(ck, name, parent, true, 0, &st, &sub);
			if (!err)
				err = walk(ck, subfd, path, sub, depth + 1, d);
		}
		close(subfd);
		if (err)
			bad = -EINVAL;
	}
	free_names(names, n);
	return err == -ENOMEM ? err : bad;
}

int rs_zarr_read(rs_checkpoint *ck, rs_diag *d)
{
	return walk(ck, rs_sources_root_fd(ck->sources), "", -1, 0, d);
}

static bool is_shard_file(const char *name)
{
	size_t n = strlen(name);

	return strncmp(name, "shard_", 6) == 0 && n > 9 &&
	       strcmp(name + n - 3, ".pt") == 0;
}

int rs_zarr_collect_blobs(rs_checkpoint *ck)
{
	bool *array_dir = calloc(ck->nentries + 1, sizeof(bool));
	int err = 0;

	if (!array_dir)
		return -ENOMEM;
	for (size_t a = 0; a < ck->narrays; a++)
		array_dir[ck->arrays[a].dir_entry] = true;
	for (size_t i = 0; i < ck->nentries && !err; i++) {
		rs_entry *e = &ck->entries[i];
		const rs_entry *dir = e->parent >= 0 ? &ck->entries[e->parent] : NULL;
		rs_blob *b;

		if (e->is_dir || !dir || dir->parent >= 0 ||
		    array_dir[e->parent] || !is_shard_file(e->name))
			continue;
		err = rs_array_reserve(&ck->blobs, &ck->cap_blobs,
				       ck->nblobs + 1, sizeof(rs_blob));
		if (err)
			break;
		b = &ck->blobs[ck->nblobs];
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
	free(array_dir);
	return err;
}
