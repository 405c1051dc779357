/* safetensors reader: *.safetensors files (and their index) -> catalog,
 * passthrough entries and the merged __metadata__. */
#include "formats/safetensors/safetensors.h"
#include "formats/safetensors/safetensors_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/codec/json_text.h"
#include "formats/codec/utf8.h"
#include "planner/array.h"
#include "planner/names.h"

#define INDEX_NAME "model.safetensors.index.json"
/* An index of a 1 TB model is a few MB. */
#define RS_ST_INDEX_MAX (64u << 20)
/* Mismatch lines reported one by one before a count. */
#define MAX_LISTED 5
/* Distinct __metadata__ keys kept (real files have one to a few); the
 * merge is quadratic in them. */
#define MAX_META_KEYS 4096

static const struct {
	const char *name;
	rs_dtype dtype;
} st_dtypes[] = {
	{ "BOOL", RS_DTYPE_BOOL },  { "U8", RS_DTYPE_U8 },
	{ "I8", RS_DTYPE_I8 },      { "I16", RS_DTYPE_I16 },
	{ "I32", RS_DTYPE_I32 },    { "I64", RS_DTYPE_I64 },
	{ "F16", RS_DTYPE_F16 },    { "BF16", RS_DTYPE_BF16 },
	{ "F32", RS_DTYPE_F32 },    { "F64", RS_DTYPE_F64 },
	{ "F8_E4M3", RS_DTYPE_F8E4M3 }, { "F8_E5M2", RS_DTYPE_F8E5M2 },
};
#define N_DTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

const char *rs_safetensors_dtype_name(rs_dtype t)
{
	for (size_t i = 0; i < N_DTYPES; i++)
		if (st_dtypes[i].dtype == t)
			return st_dtypes[i].name;
	return NULL;
}

rs_dtype rs_safetensors_dtype_from_name(const char *s)
{
	for (size_t i = 0; s && i < N_DTYPES; i++)
		if (strcmp(st_dtypes[i].name, s) == 0)
			return st_dtypes[i].dtype;
	return RS_DTYPE_INVALID;
}

/* One tensor entry of a header, before it joins the catalog. */
typedef struct {
	const char *name;       /* in the parsed header */
	rs_dtype dtype;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t begin, end;
} st_entry;

/* One weight_map pair of the index. */
typedef struct {
	const char *tensor, *file;      /* in the parsed index */
	bool seen;
} index_pair;

typedef struct {
	rs_checkpoint *ck;
	rs_diag *d;
	rs_safetensors_meta *meta;
	cJSON *index;
	index_pair *pairs;      /* sorted by tensor name */
	size_t npairs;
	size_t mismatches;
} reader;

static void show_shape(const uint64_t *shape, int n, char *out, size_t size)
{
	size_t at = (size_t)snprintf(out, size, "[");

	for (int i = 0; i < n && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%llu", i ? ", " : "",
				       (unsigned long long)shape[i]);
	if (at < size)
		snprintf(out + at, size - at, "]");
}

/* {"dtype": "F32", "shape": [..], "data_offsets": [b, e]} */
static int read_entry(reader *r, const char *where, const cJSON *v,
		      st_entry *e)
{
	const cJSON *dt, *shape, *offs, *it;
	const char *dup;
	int err;

	e->name = v->string;
	if (!cJSON_IsObject(v)) {
		rs_diag_add(r->d, "%s: tensor \"%s\" is not an object with \"dtype\", \"shape\" and \"data_offsets\"",
			    where, e->name);
		return -EINVAL;
	}
	err = rs_json_duplicate_key(v, &dup);
	if (err)
		return err;
	if (dup) {
		rs_diag_add(r->d, "%s: tensor \"%s\" gives \"%s\" twice", where,
			    e->name, dup);
		return -EINVAL;
	}
	dt = cJSON_GetObjectItemCaseSensitive(v, "dtype");
	if (!cJSON_IsString(dt)) {
		rs_diag_add(r->d, "%s: tensor \"%s\" has no \"dtype\" string",
			    where, e->name);
		return -EINVAL;
	}
	e->dtype = rs_safetensors_dtype_from_name(dt->valuestring);
	if (e->dtype == RS_DTYPE_INVALID) {
		rs_diag_add(r->d, "%s: tensor \"%s\" has dtype %s, which is not supported (BOOL U8 I8 I16 I32 I64 F16 BF16 F32 F64 F8_E4M3 F8_E5M2 are)",
			    where, e->name, dt->valuestring);
		return -EINVAL;
	}
	shape = cJSON_GetObjectItemCaseSensitive(v, "shape");
	if (!cJSON_IsArray(shape)) {
		rs_diag_add(r->d, "%s: tensor \"%s\" has no \"shape\" list", where,
			    e->name);
		return -EINVAL;
	}
	if (cJSON_GetArraySize(shape) > RS_MAX_DIMS) {
		rs_diag_add(r->d, "%s: tensor \"%s\" has %d axes; at most %d are supported",
			    where, e->name, cJSON_GetArraySize(shape), RS_MAX_DIMS);
		return -EINVAL;
	}
	e->ndim = 0;
	cJSON_ArrayForEach(it, shape) {
		if (!rs_json_u64(it, &e->shape[e->ndim])) {
			rs_diag_add(r->d, "%s: tensor \"%s\": \"shape\"[%d] is not a non-negative integer",
				    where, e->name, e->ndim);
			return -EINVAL;
		}
		e->ndim++;
	}
	offs = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
	if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
	    !rs_json_u64(cJSON_GetArrayItem(offs, 0), &e->begin) ||
	    !rs_json_u64(cJSON_GetArrayItem(offs, 1), &e->end)) {
		rs_diag_add(r->d, "%s: tensor \"%s\": \"data_offsets\" is not a pair of non-negative integers",
			    where, e->name);
		return -EINVAL;
	}
	return 0;
}

/* "__metadata__": a map of strings (or null), merged into r->meta: the
 * first file to give a key wins. */
static int read_metadata(reader *r, const char *where, const cJSON *v)
{
	rs_safetensors_meta *m = r->meta;
	const cJSON *it;
	const char *dup;
	int err;

	if (cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsObject(v)) {
		rs_diag_add(r->d, "%s: \"__metadata__\" is not a map of strings",
			    where);
		return -EINVAL;
	}
	err = rs_json_duplicate_key(v, &dup);
	if (err)
		return err;
	if (dup) {
		rs_diag_add(r->d, "%s: \"__metadata__\" gives \"%s\" twice", where,
			    dup);
		return -EINVAL;
	}
	cJSON_ArrayForEach(it, v) {
		rs_safetensors_pair *p;
		bool known = false;

		if (!cJSON_IsString(it)) {
			rs_diag_add(r->d, "%s: \"__metadata__\" value of \"%s\" is not a string",
				    where, it->string);
			return -EINVAL;
		}
		for (size_t i = 0; i < m->n && !known; i++)
			known = strcmp(m->pairs[i].key, it->string) == 0;
		if (known)
			continue;
		if (m->n == MAX_META_KEYS) {
			rs_diag_add(r->d, "%s: more than %d \"__metadata__\" keys",
				    where, MAX_META_KEYS);
			return -EINVAL;
		}
		err = rs_array_reserve(&m->pairs, &m->cap, m->n + 1, sizeof(*p));
		if (err)
			return err;
		p = &m->pairs[m->n];
		p->key = strdup(it->string);
		p->value = strdup(it->valuestring);
		if (!p->key || !p->value) {
			free(p->key);
			free(p->value);
			return -ENOMEM;
		}
		m->n++;
	}
	return 0;
}

static void free_meta(void *extra)
{
	rs_safetensors_meta *m = extra;

	for (size_t i = 0; m && i < m->n; i++) {
		free(m->pairs[i].key);
		free(m->pairs[i].value);
	}
	if (m)
		free(m->pairs);
	free(m);
}

/* The extra the view reads, made on first use. */
static int meta_of(rs_checkpoint *ck, rs_safetensors_meta **out)
{
	if (!ck->extra) {
		ck->extra = calloc(1, sizeof(rs_safetensors_meta));
		if (!ck->extra)
			return -ENOMEM;
		ck->extra_free = free_meta;
	}
	*out = ck->extra;
	return 0;
}

static int cmp_range(const void *a, const void *b)
{
	const st_entry *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

/* The ranges, sorted, must tile [0, end of file - data start) exactly, and
 * each hold exactly its shape's bytes (ST tensor.rs, Metadata::validate). */
static int check_ranges(reader *r, const char *where, st_entry *v, size_t n,
			uint64_t data_start, uint64_t size)
{
	uint64_t start = 0, end;

	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_range);
	for (size_t i = 0; i < n; i++) {
		st_entry *e = &v[i];
		uint64_t numel, bytes;
		char shape[RS_MAX_DIMS * 22 + 4];

		if (e->end < e->begin) {
			rs_diag_add(r->d, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin",
				    where, e->name, (unsigned long long)e->begin,
				    (unsigned long long)e->end);
			return -EINVAL;
		}
		if (e->begin > start) {
			rs_diag_add(r->d, "%s: tensor \"%s\" starts at byte %llu of the data, leaving a hole after byte %llu",
				    where, e->name, (unsigned long long)e->begin,
				    (unsigned long long)start);
			return -EINVAL;
		}
		if (e->begin < start) {
			rs_diag_add(r->d, "%s: tensor \"%s\" at data bytes [%llu, %llu) overlaps the tensor before it, which ends at byte %llu",
				    where, e->name, (unsigned long long)e->begin,
				    (unsigned long long)e->end,
				    (unsigned long long)start);
			return -EINVAL;
		}
		start = e->end;
		show_shape(e->shape, e->ndim, shape, sizeof(shape));
		if (!rs_product(e->shape, e->ndim, &numel) ||
		    !rs_mul_u64(numel, rs_dtype_size(e->dtype), &bytes)) {
			rs_diag_add(r->d, "%s: tensor \"%s\": shape %s overflows 64-bit byte sizes",
				    where, e->name, shape);
			return -EINVAL;
		}
		if (e->end - e->begin != bytes) {
			rs_diag_add(r->d, "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes, but shape %s of %s needs %llu",
				    where, e->name, (unsigned long long)e->begin,
				    (unsigned long long)e->end,
				    (unsigned long long)(e->end - e->begin), shape,
				    rs_safetensors_dtype_name(e->dtype),
				    (unsigned long long)bytes);
			return -EINVAL;
		}
	}
	if (!rs_add_u64(data_start, start, &end) || end > size) {
		rs_diag_add(r->d, "%s: the tensors' data runs to byte %llu of the data, past the end of the file (%llu bytes)",
			    where, (unsigned long long)start,
			    (unsigned long long)size);
		return -EINVAL;
	}
	if (end < size) {
		rs_diag_add(r->d, "%s: %llu bytes follow the last tensor's data (the data must end the file)",
			    where, (unsigned long long)(size - end));
		return -EINVAL;
	}
	return 0;
}

/* Adds the checked entries to the catalog, one C-order fragment each. */
static int add_tensors(reader *r, const char *where, uint32_t src,
		       const st_entry *v, size_t n, uint64_t data_start)
{
	for (size_t i = 0; i < n; i++) {
		const st_entry *e = &v[i];
		uint64_t chunk[RS_MAX_DIMS], idx[RS_MAX_DIMS] = { 0 };
		size_t index;
		rs_tensor *t;
		int err;

		/* One chunk holding the whole tensor; a zero-sized axis
		 * leaves no chunk at all (nothing is stored). */
		for (int k = 0; k < e->ndim; k++)
			chunk[k] = e->shape[k] ? e->shape[k] : 1;
		err = rs_catalog_add_regular(&r->ck->catalog, e->name, e->dtype,
					     e->ndim, e->shape, chunk, &index);
		if (err == -EOVERFLOW || err == -E2BIG || err == -EINVAL) {
			rs_diag_add(r->d, "%s: tensor \"%s\" is too large", where,
				    e->name);
			return -EINVAL;
		}
		if (!err)
			err = rs_catalog_set_origin(&r->ck->catalog, index, where);
		if (err)
			return err;
		t = &r->ck->catalog.tensors[index];
		if (t->nfrags == 1)
			rs_catalog_set_chunk(t, idx, src, data_start + e->begin);
	}
	return 0;
}

int rs_safetensors_read_header(rs_checkpoint *ck, uint32_t source,
			       const char *where, const char *text,
			       size_t len, uint64_t file_size, rs_diag *d)
{
	reader r = { .ck = ck, .d = d };
	char why[100];
	cJSON *root = NULL;
	const cJSON *it;
	st_entry *v = NULL;
	size_t nv = 0;
	int err = meta_of(ck, &r.meta);

	if (err)
		return err;
	if (!rs_utf8_valid(text, len, false)) {
		rs_diag_add(d, "%s: header is not valid UTF-8", where);
		return -EINVAL;
	}
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s: header: %s", where, why);
	if (err)
		return err;
	/* Shapes and offsets are integers; the reference parser refuses 3.0
	 * and 4.8e1, which cJSON reads as 3 and 48. */
	if (rs_json_first_fraction(text, len) != SIZE_MAX) {
		size_t at = rs_json_first_fraction(text, len);

		rs_diag_add(d, "%s: header: a number at byte %zu (%.*s) is not an integer literal",
			    where, at, (int)strspn(text + at, "+-.0123456789eE"),
			    text + at);
		err = -EINVAL;
		goto out;
	}
	cJSON_ArrayForEach(it, root)
		nv++;
	/* Refused before anything is made of them: a header of a million
	 * tiny entries is a few dozen MB but costs the mount gigabytes. */
	if (ck->max_tensors && nv > ck->max_tensors - ck->catalog.count + 1) {
		rs_diag_add(d, "%s: header lists %zu tensors, more than the %llu a checkpoint may have; -o max_tensors=N raises the limit",
			    where, nv, (unsigned long long)ck->max_tensors);
		err = -EINVAL;
		goto out;
	}
	v = calloc(nv ? nv : 1, sizeof(*v));
	if (!v) {
		err = -ENOMEM;
		goto out;
	}
	nv = 0;
	cJSON_ArrayForEach(it, root) {
		if (strcmp(it->string, "__metadata__") == 0)
			err = read_metadata(&r, where, it);
		else
			err = read_entry(&r, where, it, &v[nv++]);
		if (err)
			goto out;
	}
	err = check_ranges(&r, where, v, nv, 8 + (uint64_t)len, file_size);
	if (!err)
		err = add_tensors(&r, where, source, v, nv, 8 + (uint64_t)len);
out:
	free(v);
	cJSON_Delete(root);
	return err;
}

/* Reads one file's header length and header. */
static int read_file(reader *r, uint32_t src, const char *relpath)
{
	rs_checkpoint *ck = r->ck;
	uint64_t size = rs_sources_id(ck->sources, src)->size, n;
	unsigned char len8[8];
	char where[4200];
	char *text = NULL;
	int err;

	snprintf(where, sizeof(where), "%s/%s", ck->dir_path, relpath);
	if (size < 8) {
		rs_diag_add(r->d, "%s: %llu bytes, too short for the 8-byte header length",
			    where, (unsigned long long)size);
		return -EINVAL;
	}
	err = rs_sources_pread(ck->sources, src, len8, 8, 0);
	if (err)
		goto unreadable;
	n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n > RS_SAFETENSORS_HEADER_MAX) {
		rs_diag_add(r->d, "%s: header length %llu is over the %llu-byte limit",
			    where, (unsigned long long)n, RS_SAFETENSORS_HEADER_MAX);
		return -EINVAL;
	}
	if (n > size - 8) {
		rs_diag_add(r->d, "%s: header length %llu runs past the end of the file (%llu bytes)",
			    where, (unsigned long long)n,
			    (unsigned long long)size);
		return -EINVAL;
	}
	err = rs_checkpoint_charge(ck, n, where, r->d);
	if (err)
		return err;
	text = malloc(n + 1);
	if (!text)
		return -ENOMEM;
	err = rs_sources_pread(ck->sources, src, text, n, 8);
	if (err)
		goto unreadable;
	text[n] = 0;
	err = rs_safetensors_read_header(ck, src, where, text, n, size, r->d);
	free(text);
	return err;
unreadable:
	rs_diag_add(r->d, "%s: cannot read: %s", where, strerror(-err));
	free(text);
	return -EINVAL;
}

static int cmp_pair(const void *a, const void *b)
{
	return strcmp(((const index_pair *)a)->tensor,
		      ((const index_pair *)b)->tensor);
}

/* A file name, or a relative path of file names, beneath SOURCE: what the
 * index may name without reaching outside it. */
static bool path_is_safe(const char *p)
{
	char part[256];

	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (n == 0 || n >= sizeof(part))
			return false;
		memcpy(part, p, n);
		part[n] = 0;
		if (!rs_name_is_safe(part))
			return false;
		if (!slash)
			return true;
		p = slash + 1;
	}
}

/* The passthrough entry of the file at `relpath`, or -1. */
static long file_entry(const rs_checkpoint *ck, const char *relpath)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (!ck->entries[i].is_dir &&
		    strcmp(rs_checkpoint_local(ck, rs_sources_path(ck->sources,
							ck->entries[i].source)),
			   relpath) == 0)
			return (long)i;
	return -1;
}

static bool is_tensor_file(const rs_entry *e)
{
	size_t n = strlen(e->name);

	return !e->is_dir && e->parent < 0 && n > 12 &&
	       strcmp(e->name + n - 12, ".safetensors") == 0;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map":
 * {tensor: file}} -> r->pairs sorted by tensor, and the distinct files
 * sorted (pointers into r->index). */
static int read_index(reader *r, const char ***files, size_t *nfiles)
{
	rs_checkpoint *ck = r->ck;
	char where[4200], why[100], *text = NULL;
	const cJSON *wm, *it;
	const char *dup, **v;
	size_t len, n = 0, k = 0;
	int err;

	snprintf(where, sizeof(where), "%s/%s", ck->dir_path, INDEX_NAME);
	err = rs_checkpoint_read_file(ck, INDEX_NAME, RS_ST_INDEX_MAX, &text,
				      &len, NULL, r->d);
	if (err == -ENOENT)
		rs_diag_add(r->d, "%s: vanished while reading", where);
	if (err)
		return err == -ENOENT ? -EINVAL : err;
	if (!rs_utf8_valid(text, len, false)) {
		rs_diag_add(r->d, "%s: not valid UTF-8", where);
		free(text);
		return -EINVAL;
	}
	err = rs_json_parse_object(text, len, &r->index, why, sizeof(why));
	free(text);
	if (err == -EINVAL)
		rs_diag_add(r->d, "%s: %s", where, why);
	if (err)
		return err;
	wm = cJSON_GetObjectItemCaseSensitive(r->index, "weight_map");
	if (!cJSON_IsObject(wm)) {
		rs_diag_add(r->d, "%s: no \"weight_map\" object", where);
		return -EINVAL;
	}
	err = rs_json_duplicate_key(wm, &dup);
	if (err)
		return err;
	if (dup) {
		rs_diag_add(r->d, "%s: weight_map lists tensor \"%s\" twice",
			    where, dup);
		return -EINVAL;
	}
	cJSON_ArrayForEach(it, wm)
		n++;
	r->pairs = calloc(n ? n : 1, sizeof(*r->pairs));
	v = calloc(n ? n : 1, sizeof(*v));
	if (!r->pairs || !v) {
		free(v);
		return -ENOMEM;
	}
	cJSON_ArrayForEach(it, wm) {
		if (!cJSON_IsString(it)) {
			rs_diag_add(r->d, "%s: weight_map entry of tensor \"%s\" is not a file name",
				    where, it->string);
			free(v);
			return -EINVAL;
		}
		r->pairs[r->npairs++] = (index_pair){ it->string, it->valuestring, false };
		v[k++] = it->valuestring;
	}
	if (n > 1) {
		qsort(r->pairs, n, sizeof(*r->pairs), cmp_pair);
		qsort(v, n, sizeof(*v), rs_names_cmp);
	}
	n = 0;
	for (size_t i = 0; i < k; i++) {
		if (n && strcmp(v[n - 1], v[i]) == 0)
			continue;
		if (!path_is_safe(v[i])) {
			rs_diag_add(r->d, "%s: weight_map names \"%s\", not a file name or relative path beneath SOURCE",
				    where, v[i]);
			free(v);
			return -EINVAL;
		}
		v[n++] = v[i];
	}
	*files = v;
	*nfiles = n;
	return 0;
}

/* Every top-level *.safetensors file, sorted by name. */
static int list_files(const rs_checkpoint *ck, const char ***files,
		      size_t *nfiles)
{
	const char **v = calloc(ck->nentries + 1, sizeof(*v));
	size_t n = 0;

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < ck->nentries; i++)
		if (is_tensor_file(&ck->entries[i]))
			v[n++] = ck->entries[i].name;
	if (n > 1)
		qsort(v, n, sizeof(*v), rs_names_cmp);
	*files = v;
	*nfiles = n;
	return 0;
}

/* The tensors a file added (catalog indices first..) must be the ones
 * the index lists for it. */
static void check_listed(reader *r, const char *relpath, size_t first)
{
	const rs_catalog *c = &r->ck->catalog;

	for (size_t i = first; i < c->count; i++) {
		index_pair key = { .tensor = c->tensors[i].name }, *p;

		p = bsearch(&key, r->pairs, r->npairs, sizeof(*p), cmp_pair);
		if (p && strcmp(p->file, relpath) == 0) {
			p->seen = true;
			continue;
		}
		if (++r->mismatches > MAX_LISTED)
			continue;
		if (p)
			rs_diag_add(r->d, "%s/%s: holds tensor \"%s\", which %s lists in %s",
				    r->ck->dir_path, relpath, key.tensor,
				    INDEX_NAME, p->file);
		else
			rs_diag_add(r->d, "%s/%s: holds tensor \"%s\", which %s does not list",
				    r->ck->dir_path, relpath, key.tensor,
				    INDEX_NAME);
	}
}

static void check_unseen(reader *r)
{
	for (size_t i = 0; i < r->npairs; i++)
		if (!r->pairs[i].seen && ++r->mismatches <= MAX_LISTED)
			rs_diag_add(r->d, "%s/%s: lists tensor \"%s\" in %s, which does not hold it",
				    r->ck->dir_path, INDEX_NAME,
				    r->pairs[i].tensor, r->pairs[i].file);
}

/* Without an index: one name in two files is two answers. */
static int check_duplicates(reader *r)
{
	const rs_catalog *c = &r->ck->catalog;
	rs_names by_name;
	int err = rs_names_sort(&by_name, c->tensors, c->count,
				sizeof(rs_tensor), offsetof(rs_tensor, name));

	for (size_t p = 1; !err && (p = rs_names_next_dup(&by_name, p)) < c->count;
	     p++) {
		const rs_tensor *first = &c->tensors[rs_names_item(&by_name, p - 1)];
		const rs_tensor *again = &c->tensors[rs_names_item(&by_name, p)];

		if (++r->mismatches <= MAX_LISTED)
			rs_diag_add(r->d, "%s: tensor \"%s\" is also in %s",
				    again->origin, again->name, first->origin);
	}
	rs_names_free(&by_name);
	return err;
}

static int read_config(rs_checkpoint *ck, rs_diag *d);

int rs_safetensors_read(rs_checkpoint *ck, const rs_open_opts *o,
			rs_diag *d)
{
	reader r = { .ck = ck, .d = d };
	const char **files = NULL;
	size_t nfiles = 0;
	long index;
	int err, bad = 0;

	/* Everything in SOURCE as entries first: the tensor files are found
	 * (and their identity recorded) there. */
	err = rs_checkpoint_walk(ck, NULL, d);
	if (err)
		return err;
	err = meta_of(ck, &r.meta);
	if (err)
		return err;
	index = -1;
	for (size_t i = 0; i < ck->nentries && index < 0; i++)
		if (ck->entries[i].parent < 0 && !ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, INDEX_NAME) == 0)
			index = (long)i;
	err = index >= 0 ? read_index(&r, &files, &nfiles)
			 : list_files(ck, &files, &nfiles);
	for (size_t i = 0; i < nfiles && !err; i++) {
		long e = file_entry(ck, files[i]);
		size_t first = ck->catalog.count;

		if (e < 0) {
			rs_diag_add(d, "%s/%s: weight_map names \"%s\", which is not a file in SOURCE",
				    ck->dir_path, INDEX_NAME, files[i]);
			bad = -EINVAL;
			continue;
		}
		ck->entries[e].hidden = true;
		err = read_file(&r, ck->entries[e].source, files[i]);
		if (err == -EINVAL) {
			/* Reported; go on to report the other files too. */
			bad = -EINVAL;
			err = 0;
		} else if (!err && index >= 0) {
			check_listed(&r, files[i], first);
		}
	}
	if (!err && !bad && index >= 0)
		check_unseen(&r);
	if (!err && !bad && index < 0)
		err = check_duplicates(&r);
	if (r.mismatches > MAX_LISTED)
		rs_diag_add(d, "%s: and %zu more tensors misplaced (in a file the index does not say, or in two files)",
			    ck->dir_path, r.mismatches - MAX_LISTED);
	if (!err && r.mismatches)
		bad = -EINVAL;
	/* The view writes its own tensor files; with an index, top-level
	 * tensor files it does not name are not part of the model. */
	for (size_t i = 0; i < ck->nentries; i++)
		if (is_tensor_file(&ck->entries[i]) || (long)i == index)
			ck->entries[i].hidden = true;
	free(files);
	free(r.pairs);
	cJSON_Delete(r.index);
	if (!err && !bad)
		err = read_config(ck, d);
	return err ? err : bad;
}

/* HF's config.json, when SOURCE has one: the heads and KV heads the
 * layout must not cut (formats/facts.h).  A file that is not a JSON object
 * says nothing (it is passed through as stored either way); one whose
 * facts are out of range refuses the checkpoint. */
static int read_config(rs_checkpoint *ck, rs_diag *d)
{
	char *text = NULL, why[100], path[PATH_MAX + 16];
	size_t len;
	cJSON *cfg = NULL;
	rs_diag *quiet = rs_diag_new();
	int err = 0;

	if (!quiet)
		return -ENOMEM;
	if (rs_checkpoint_read_file(ck, "config.json", 1u << 20, &text, &len,
				    NULL, quiet) == 0 &&
	    rs_json_parse_object(text, len, &cfg, why, sizeof(why)) == 0) {
		snprintf(path, sizeof(path), "%s/config.json", ck->dir_path);
		err = rs_facts_from_hf(&ck->facts, cfg, path, d);
	}
	cJSON_Delete(cfg);
	free(text);
	rs_diag_free(quiet);
	return err;
}

static rs_detect detect(const char *name, mode_t mode)
{
	size_t n = strlen(name);

	if (S_ISDIR(mode))
		return RS_DETECT_NONE;
	return strcmp(name, INDEX_NAME) == 0 ||
	       (n > 12 && strcmp(name + n - 12, ".safetensors") == 0)
		       ? RS_DETECT_FILES : RS_DETECT_NONE;
}

const rs_format_def rs_safetensors_format = {
	.name = "safetensors",
	.detect = detect,
	.looks_like = "*.safetensors",
	.read = rs_safetensors_read,
	.build_view = rs_safetensors_build_view,
};
