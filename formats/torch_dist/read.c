/* torch_dist reader: .metadata + .distcp items -> catalog, blobs, entries. */
#include "formats/torch_dist/torch_dist.h"
#include "formats/torch_dist/torch_dist_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/codec/pickle.h"
#include "formats/codec/torch_tensor.h"
#include "formats/codec/torchzip.h"
#include "planner/array.h"
#include "planner/names.h"

/* A .metadata of a 1 TB checkpoint is tens of MB; data.pkl of one tensor is
 * a few hundred bytes. */
#define RS_TORCH_DIST_METADATA_MAX (256u << 20)
#define RS_TORCH_DIST_DATAPKL_MAX (1u << 20)

/* Where one stored item lives (from storage_data). */
typedef struct {
	const char *fqn;
	int noff;               /* -1: a byte item (offset None) */
	uint64_t off[RS_MAX_DIMS];
	const char *path;
	uint64_t offset, length;
} item_ref;

typedef struct {
	rs_checkpoint *ck;
	rs_diag *d;
	char meta_path[4200];   /* "<root>/.metadata", for messages */
	item_ref *items;
	size_t nitems, cap_items;
	const rs_pvalue *mcore_data;    /* megatron-core's, if any */
	size_t flat_states;             /* optimizer.state.* unflattened */
} reader;

static int cmp_item(const void *a, const void *b)
{
	const item_ref *x = a, *y = b;
	int c = strcmp(x->fqn, y->fqn);

	if (c)
		return c;
	if (x->noff != y->noff)
		return x->noff < y->noff ? -1 : 1;
	for (int i = 0; i < x->noff; i++)
		if (x->off[i] != y->off[i])
			return x->off[i] < y->off[i] ? -1 : 1;
	return 0;
}

/* `s` (n bytes, NULs and all) for a message: a NUL shows as \x00 (the
 * diag list escapes the other control bytes), long ones are cut. */
static void show(const char *s, size_t n, char *out, size_t size)
{
	size_t at = 0;

	/* size >= 8: room for "\x00" or "...", and the NUL */
	for (size_t i = 0; i < n; i++) {
		if (at + 8 > size) {
			memcpy(out + at, "...", 4);
			return;
		}
		if (s[i]) {
			out[at++] = s[i];
		} else {
			memcpy(out + at, "\\x00", 4);
			at += 4;
		}
	}
	out[at] = 0;
}

/* A str value holding no NUL.  A C string stops at the first one, so a
 * relative_path "__0_0.distcp\0/../x" would read as "__0_0.distcp" and a
 * name "w\0x" as "w" (torch sees the whole string): such strings are
 * refused, never cut.  *len is the str's full length (0 if not a str). */
static const char *whole_str(const rs_pvalue *v, size_t *len)
{
	const char *s = rs_pv_str(v, len);

	if (!s)
		*len = 0;
	return s && strlen(s) == *len ? s : NULL;
}

/* storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo(
 * relative_path, offset, length)} -> items sorted for lookup. */
static int read_storage(reader *r, const rs_pvalue *storage)
{
	size_t n = rs_pv_len(storage);
	int err;

	if (rs_pv_kind(storage) != RS_PV_DICT) {
		rs_diag_add(r->d, "%s: storage_data is not a dict", r->meta_path);
		return -EINVAL;
	}
	err = rs_array_reserve(&r->items, &r->cap_items, n, sizeof(item_ref));
	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		const rs_pvalue *k = rs_pv_state(rs_pv_key(storage, i));
		const rs_pvalue *v = rs_pv_state(rs_pv_val(storage, i));
		const rs_pvalue *off = rs_pv_get(k, "offset");
		item_ref *it = &r->items[r->nitems];

		const rs_pvalue *fqn = rs_pv_get(k, "fqn");
		const rs_pvalue *path = rs_pv_get(v, "relative_path");
		char shown[300];
		size_t len;

		it->fqn = whole_str(fqn, &len);
		if (!it->fqn && rs_pv_str(fqn, NULL)) {
			show(rs_pv_str(fqn, NULL), len, shown, sizeof(shown));
			rs_diag_add(r->d, "%s: storage_data names \"%s\", a key with a NUL in it",
				    r->meta_path, shown);
			return -EINVAL;
		}
		it->path = whole_str(path, &len);
		if (!it->path && rs_pv_str(path, NULL) && it->fqn) {
			show(rs_pv_str(path, NULL), len, shown, sizeof(shown));
			rs_diag_add(r->d, "%s: storage_data of %s names \"%s\", not a plain file name in the checkpoint",
				    r->meta_path, it->fqn, shown);
			return -EINVAL;
		}
		it->noff = -1;
		if (!it->fqn || !it->path ||
		    !rs_pv_u64(rs_pv_get(v, "offset"), &it->offset) ||
		    !rs_pv_u64(rs_pv_get(v, "length"), &it->length) ||
		    (rs_pv_kind(off) != RS_PV_NONE && off &&
		     !rs_pv_dims(off, it->off, &it->noff, RS_MAX_DIMS))) {
			rs_diag_add(r->d, "%s: storage_data entry %zu is malformed",
				    r->meta_path, i);
			return -EINVAL;
		}
		if (!rs_name_is_safe(it->path)) {
			rs_diag_add(r->d, "%s: storage_data of %s names \"%s\", not a plain file name in the checkpoint",
				    r->meta_path, it->fqn, it->path);
			return -EINVAL;
		}
		r->nitems++;
	}
	/* An empty storage_data leaves items NULL: qsort(NULL, 0) is
	 * undefined. */
	if (r->nitems > 1)
		qsort(r->items, r->nitems, sizeof(item_ref), cmp_item);
	/* Python keeps the last of two equal MetadataIndex keys; a lookup
	 * here would find either.  Neither is right: refuse. */
	for (size_t i = 1; i < r->nitems; i++)
		if (cmp_item(&r->items[i - 1], &r->items[i]) == 0) {
			rs_diag_add(r->d, "%s: storage_data names %s %s twice",
				    r->meta_path,
				    r->items[i].noff < 0 ? "byte item" : "a chunk of",
				    r->items[i].fqn);
			return -EINVAL;
		}
	return 0;
}

static const item_ref *find_item(const reader *r, const char *fqn, int noff,
				 const uint64_t *off)
{
	item_ref key = { .fqn = fqn, .noff = noff };

	if (noff > 0)
		memcpy(key.off, off, (size_t)noff * sizeof(uint64_t));
	/* bsearch(NULL, 0) is undefined too. */
	if (!r->nitems)
		return NULL;
	return bsearch(&key, r->items, r->nitems, sizeof(item_ref), cmp_item);
}

/* The root-level passthrough entry (a file of SOURCE) named `name`. */
static long root_file(const rs_checkpoint *ck, const char *name)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent < 0 && !ck->entries[i].is_dir &&
		    strcmp(ck->entries[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* The item's bytes must lie inside its file. */
static int locate(reader *r, const item_ref *it, const char *fqn,
		  uint32_t *source)
{
	long e = root_file(r->ck, it->path);
	uint64_t end;

	if (e < 0) {
		rs_diag_add(r->d, "%s/%s: missing (it holds %s)", r->ck->dir_path,
			    it->path, fqn);
		return -EINVAL;
	}
	*source = r->ck->entries[e].source;
	if (!rs_add_u64(it->offset, it->length, &end) ||
	    end > rs_sources_id(r->ck->sources, *source)->size) {
		rs_diag_add(r->d, "%s/%s: item of %s at %llu+%llu lies past the end of the file",
			    r->ck->dir_path, it->path, fqn,
			    (unsigned long long)it->offset,
			    (unsigned long long)it->length);
		return -EINVAL;
	}
	return 0;
}

/* One tensor chunk: its torch.save zip gives the fragment. */
static int read_chunk(reader *r, const rs_tensor *t, rs_fragment *f,
		      const item_ref *it)
{
	char msg[RS_ZIP_MSG_SIZE], perr[200], where[4400];
	const rs_zip_entry *pkl;
	rs_pickle_limits lim;
	rs_torch_tensor tt;
	rs_pickle *pk = NULL;
	rs_zip z = { 0 };
	uint8_t *buf = NULL;
	char why[200];
	uint32_t src;
	int fd, err;

	err = locate(r, it, t->name, &src);
	if (err)
		return err;
	snprintf(where, sizeof(where), "%s/%s: item of %s at offset %llu",
		 r->ck->dir_path, it->path, t->name,
		 (unsigned long long)it->offset);
	err = rs_sources_fd(r->ck->sources, src, &fd);
	if (err) {
		rs_diag_add(r->d, "%s: cannot open: %s", where, strerror(-err));
		return -EINVAL;
	}
	err = rs_zip_open(&z, fd, it->offset, it->length, msg, sizeof(msg));
	if (err) {
		rs_diag_add(r->d, "%s: %s", where, msg);
		goto fail;
	}
	pkl = rs_zip_find(&z, "data.pkl");
	if (!pkl || pkl->size > RS_TORCH_DIST_DATAPKL_MAX ||
	    !(buf = malloc(pkl->size ? pkl->size : 1)) ||
	    pread(fd, buf, pkl->size, (off_t)(it->offset + pkl->offset)) !=
		    (ssize_t)pkl->size) {
		rs_diag_add(r->d, "%s: no readable data.pkl", where);
		goto fail;
	}
	if (rs_checkpoint_charge(r->ck, pkl->size, where, r->d) != 0)
		goto fail;
	rs_pickle_limits_default(&lim);
	lim.allow = rs_pickle_allow_torch;
	lim.torch_persids = true;
	err = rs_pickle_parse(buf, pkl->size, &lim, &pk, perr, sizeof(perr));
	if (err) {
		rs_diag_add(r->d, "%s: data.pkl: %s", where, perr);
		goto fail;
	}
	if (rs_torch_tensor_read(&z, rs_pickle_root(pk), &tt, why,
				 sizeof(why)) != 0) {
		rs_diag_add(r->d, "%s: data.pkl %s", where, why);
		goto fail;
	}
	if (tt.dtype != t->dtype) {
		rs_diag_add(r->d, "%s: stored as %s, but .metadata says %s", where,
			    rs_dtype_torch_storage(tt.dtype)
				    ? rs_dtype_torch_storage(tt.dtype)
				    : rs_dtype_name(tt.dtype),
			    rs_dtype_name(t->dtype));
		goto fail;
	}
	if (tt.ndim != t->ndim ||
	    memcmp(tt.shape, f->box.len, (size_t)tt.ndim * sizeof(uint64_t)) != 0) {
		rs_diag_add(r->d, "%s: tensor shape differs from the chunk's in .metadata",
			    where);
		goto fail;
	}
	f->source = src;
	/* An empty tensor's storage offset is never used (and unchecked). */
	f->offset = it->offset + tt.offset;
	memcpy(f->stride, tt.stride, sizeof(tt.stride));
	err = 0;
	goto out;
fail:
	err = -EINVAL;
out:
	rs_pickle_free(pk);
	free(buf);
	rs_zip_free(&z);
	return err;
}

static int check_tiling(reader *r, const rs_tensor *t)
{
	uint64_t covered, total;
	size_t a = 0, b = 0;
	int err = rs_tensor_check_tiling(t, &a, &b, &covered, &total);

	if (err == -EINVAL)
		rs_diag_add(r->d, "%s: %s: chunks %zu and %zu overlap",
			    r->meta_path, t->name, a, b);
	else if (err == -ENODATA)
		rs_diag_add(r->d, "%s: %s: its chunks cover %llu of its %llu elements; the rest has no stored bytes",
			    r->meta_path, t->name, (unsigned long long)covered,
			    (unsigned long long)total);
	else if (err == -ERANGE)
		rs_diag_add(r->d, "%s: %s: chunk %zu lies outside the tensor",
			    r->meta_path, t->name, a);
	else if (err == -E2BIG)
		rs_diag_add(r->d, "%s: %s: %zu chunks off any regular grid are too many to check",
			    r->meta_path, t->name, t->nfrags);
	return err == -ENOMEM ? err : err ? -EINVAL : 0;
}

/* A megatron-core flattened_range tensor (mcore_data names the shape it
 * was reformulated from) made that shape (flat_range.c).  0 when t is
 * none. */
static int unflatten(reader *r, rs_tensor *t)
{
	const rs_pvalue *orig = rs_pv_get(rs_pv_get(r->mcore_data, t->name),
					  "nd_reformulated_orig_global_shape");
	uint64_t shape[RS_MAX_DIMS];
	char why[200];
	int ndim = 0, err;

	if (!orig || rs_pv_kind(orig) == RS_PV_NONE)
		return 0;
	if (!rs_pv_dims(orig, shape, &ndim, RS_MAX_DIMS - 1)) {
		rs_diag_add(r->d, "%s: %s: mcore_data's nd_reformulated_orig_global_shape is not a shape of at most %d axes",
			    r->meta_path, t->name, RS_MAX_DIMS - 1);
		return -EINVAL;
	}
	err = rs_torch_dist_unflatten(t, ndim, shape, why, sizeof(why));
	if (err) {
		rs_diag_add(r->d, "%s: %s: a megatron-core flattened_range tensor, but %s",
			    r->meta_path, t->name, why);
		return err == -ENOMEM ? err : -EINVAL;
	}
	if (strncmp(t->name, "optimizer.state.", 16) == 0)
		r->flat_states++;
	return 0;
}

static int read_tensor(reader *r, const char *fqn, const rs_pvalue *meta)
{
	const rs_pvalue *chunks = rs_pv_get(meta, "chunks");
	const rs_pvalue *props = rs_pv_state(rs_pv_get(meta, "properties"));
	uint64_t shape[RS_MAX_DIMS];
	int ndim = 0, err = 0;
	size_t index;
	rs_dtype dtype;
	rs_tensor *t;

	/* TensorProperties pickles its state as a tuple (dtype, layout, ...);
	 * older torch used a dict. */
	const rs_pvalue *dt = rs_pv_kind(props) == RS_PV_TUPLE
		? rs_pv_item(props, 0) : rs_pv_get(props, "dtype");

	dtype = rs_torch_dtype(dt, false);
	if (dtype == RS_DTYPE_INVALID) {
		rs_diag_add(r->d, "%s: %s: unsupported dtype %s%s%s",
			    r->meta_path, fqn,
			    rs_pv_global_module(dt) ? rs_pv_global_module(dt) : "(not a torch dtype)",
			    rs_pv_global_name(dt) ? "." : "",
			    rs_pv_global_name(dt) ? rs_pv_global_name(dt) : "");
		return -EINVAL;
	}
	if (!rs_pv_dims(rs_pv_get(meta, "size"), shape, &ndim, RS_MAX_DIMS)) {
		rs_diag_add(r->d, "%s: %s: size is not a torch.Size of at most %d non-negative integers",
			    r->meta_path, fqn, RS_MAX_DIMS);
		return -EINVAL;
	}
	if (rs_pv_kind(chunks) != RS_PV_LIST) {
		rs_diag_add(r->d, "%s: %s: chunks is not a list", r->meta_path,
			    fqn);
		return -EINVAL;
	}
	err = rs_catalog_add_fragments(&r->ck->catalog, fqn, dtype, ndim, shape,
				       rs_pv_len(chunks), &index);
	if (err) {
		rs_diag_add(r->d, "%s: %s: shape or chunk count too large",
			    r->meta_path, fqn);
		return -EINVAL;
	}
	rs_catalog_set_origin(&r->ck->catalog, index, r->meta_path);
	t = &r->ck->catalog.tensors[index];
	for (size_t c = 0; c < t->nfrags; c++) {
		const rs_pvalue *cs = rs_pv_state(rs_pv_item(chunks, c));
		rs_fragment *f = &t->frags[c];
		int no = 0, ns = 0;
		const item_ref *it;

		f->box.ndim = ndim;
		if (!rs_pv_dims(rs_pv_get(cs, "offsets"), f->box.off, &no, RS_MAX_DIMS) ||
		    !rs_pv_dims(rs_pv_get(cs, "sizes"), f->box.len, &ns, RS_MAX_DIMS) ||
		    no != ndim || ns != ndim) {
			rs_diag_add(r->d, "%s: %s: chunk %zu is malformed or of another rank",
				    r->meta_path, fqn, c);
			return -EINVAL;
		}
		for (int i = 0; i < ndim; i++)
			if (f->box.off[i] > shape[i] ||
			    f->box.len[i] > shape[i] - f->box.off[i]) {
				rs_diag_add(r->d, "%s: %s: chunk %zu lies outside the tensor",
					    r->meta_path, fqn, c);
				return -EINVAL;
			}
		it = find_item(r, fqn, ndim, f->box.off);
		if (!it) {
			rs_diag_add(r->d, "%s: %s: chunk %zu has no storage_data entry",
				    r->meta_path, fqn, c);
			return -EINVAL;
		}
		err = read_chunk(r, t, f, it);
		if (err)
			return err;
	}
	err = unflatten(r, t);
	if (err)
		return err;
	/* Only a regular grid can be resharded; others keep their fragments
	 * and are served as they are - if they tile the tensor: a plan fills
	 * what no fragment holds with zeros, and two fragments of one place
	 * would be two answers. */
	rs_tensor_make_regular(t);
	return check_tiling(r, t);
}

/* Whether t is stored as megatron-core reformulates a flattened_range
 * state of model tensor m: m's grid counts, then one axis of m's chunk
 * volume.  The fully_sharded_model_space state is m's sharded tensor with
 * a flat range, so it has m's shape and m's cut. */
static bool reformulates(const rs_tensor *t, const rs_tensor *m)
{
	uint64_t numel = 1;

	if (!m->regular || m->ndim + 1 != t->ndim)
		return false;
	for (int i = 0; i < m->ndim; i++) {
		if (t->shape[i] != m->grid_count[i] ||
		    m->grid[i] * m->grid_count[i] != m->shape[i])
			return false;
		numel *= m->grid[i];    /* <= the checked size of m */
	}
	return t->shape[m->ndim] == numel;
}

/* megatron-core 0.13 under torch releases whose DCP writer rebuilds the
 * Metadata (dataclasses.replace) saves no mcore_data: its
 * fully_sharded_model_space state is then known only by its stored shape.
 * An optimizer.state.<state>.<key> tensor stored as the reformulation of
 * model tensor <key> (reformulates()) is taken as one; nothing else is.
 * Runs only when .metadata has no mcore_data at all. */
static int unflatten_by_model(reader *r)
{
	static const char prefix[] = "optimizer.state.";
	rs_catalog *c = &r->ck->catalog;
	rs_names by_name = { 0 };
	char why[200];
	int err;

	err = rs_names_sort(&by_name, c->tensors, c->count, sizeof(rs_tensor),
			    offsetof(rs_tensor, name));
	for (size_t i = 0; i < c->count && !err; i++) {
		rs_tensor *t = &c->tensors[i];
		const char *key;
		const rs_tensor *m;
		size_t hit;

		/* the prefix first: a shorter name has no state part */
		if (strncmp(t->name, prefix, strlen(prefix)) != 0 ||
		    !(key = strchr(t->name + strlen(prefix), '.')))
			continue;
		hit = rs_names_find(&by_name, key + 1);
		if (hit == SIZE_MAX)
			continue;
		m = &c->tensors[hit];
		if (!reformulates(t, m))
			continue;
		err = rs_torch_dist_unflatten(t, m->ndim, m->shape, why,
					      sizeof(why));
		if (err) {
			rs_diag_add(r->d, "%s: %s: stored as a megatron-core flattened_range tensor of %s, but %s",
				    r->meta_path, t->name, m->name, why);
			break;
		}
		r->flat_states++;
		rs_tensor_make_regular(t);
		err = check_tiling(r, t);
	}
	rs_names_free(&by_name);
	return err == -ENOMEM ? err : err ? -EINVAL : 0;
}

static int read_blob(reader *r, const char *fqn)
{
	const item_ref *it = find_item(r, fqn, -1, NULL);
	rs_blob *b;
	uint32_t src;
	int err;

	if (!it) {
		rs_diag_add(r->d, "%s: %s: byte item has no storage_data entry",
			    r->meta_path, fqn);
		return -EINVAL;
	}
	err = locate(r, it, fqn, &src);
	if (err)
		return err;
	err = rs_array_reserve(&r->ck->blobs, &r->ck->cap_blobs,
			       r->ck->nblobs + 1, sizeof(rs_blob));
	if (err)
		return err;
	b = &r->ck->blobs[r->ck->nblobs];
	memset(b, 0, sizeof(*b));
	b->fqn = strdup(fqn);
	if (!b->fqn)
		return -ENOMEM;
	b->source = src;
	b->offset = it->offset;
	b->length = it->length;
	b->listed = true;
	r->ck->nblobs++;
	return 0;
}


/* state_dict_metadata keys: strs without NULs (see whole_str), each once.
 * Python keeps the last of two equal keys; the catalog would hold both and
 * a view would show two tensors of one name. */
static int check_names(reader *r, const rs_pvalue *sdm)
{
	size_t n = rs_pv_len(sdm), len;
	const char **names = malloc((n ? n : 1) * sizeof(*names));
	char shown[300];
	size_t dup;
	int err = 0;

	if (!names)
		return -ENOMEM;
	for (size_t i = 0; i < n && !err; i++) {
		const rs_pvalue *k = rs_pv_key(sdm, i);

		names[i] = whole_str(k, &len);
		if (names[i])
			continue;
		if (rs_pv_str(k, NULL)) {
			show(rs_pv_str(k, NULL), len, shown, sizeof(shown));
			rs_diag_add(r->d, "%s: state_dict_metadata names \"%s\", a key with a NUL in it",
				    r->meta_path, shown);
		} else {
			rs_diag_add(r->d, "%s: a state_dict_metadata key is not a string",
				    r->meta_path);
		}
		err = -EINVAL;
	}
	if (!err)
		err = rs_names_first_dup(names, n, sizeof(*names), 0, &dup);
	if (!err && dup != SIZE_MAX) {
		rs_diag_add(r->d, "%s: state_dict_metadata names %s twice",
			    r->meta_path, names[dup]);
		err = -EINVAL;
	}
	free(names);
	return err;
}

/* .metadata and the .distcp files are replaced by what a view writes. */
static void hide_own_files(rs_checkpoint *ck)
{
	for (size_t i = 0; i < ck->nentries; i++) {
		const char *n = ck->entries[i].name;
		size_t len = strlen(n);

		if (ck->entries[i].parent < 0 && !ck->entries[i].is_dir &&
		    (strcmp(n, ".metadata") == 0 ||
		     (len > 7 && strcmp(n + len - 7, ".distcp") == 0)))
			ck->entries[i].hidden = true;
	}
}

int rs_torch_dist_read_metadata(rs_checkpoint *ck, const uint8_t *buf,
				size_t len, rs_diag *d)
{
	reader r = { .ck = ck, .d = d };
	rs_pickle_limits lim;
	rs_pickle *pk = NULL;
	const rs_pvalue *state, *sdm;
	char perr[200];
	int err;

	snprintf(r.meta_path, sizeof(r.meta_path), "%s/.metadata", ck->dir_path);
	rs_pickle_limits_default(&lim);
	lim.allow = rs_pickle_allow_torch;
	err = rs_pickle_parse(buf, len, &lim, &pk, perr, sizeof(perr));
	if (err) {
		rs_diag_add(d, "%s: %s", r.meta_path, perr);
		err = -EINVAL;
		goto out;
	}
	state = rs_pv_state(rs_pickle_root(pk));
	sdm = rs_pv_get(state, "state_dict_metadata");
	if (rs_pv_kind(sdm) != RS_PV_DICT) {
		rs_diag_add(d, "%s: not a DCP Metadata object", r.meta_path);
		err = -EINVAL;
		goto out;
	}
	r.mcore_data = rs_pv_get(state, "mcore_data");
	err = read_storage(&r, rs_pv_get(state, "storage_data"));
	if (!err)
		err = check_names(&r, sdm);
	for (size_t i = 0; i < rs_pv_len(sdm) && !err; i++) {
		const char *fqn = rs_pv_str(rs_pv_key(sdm, i), NULL);
		const rs_pvalue *meta = rs_pv_val(sdm, i);

		if (rs_pv_kind(meta) == RS_PV_OBJECT &&
		    rs_pv_global_name(rs_pv_func(meta)) &&
		    strcmp(rs_pv_global_name(rs_pv_func(meta)),
			   "BytesStorageMetadata") == 0) {
			/* Classes are matched by name: torch moved them
			 * between modules across versions. */
			err = read_blob(&r, fqn);
		} else {
			err = read_tensor(&r, fqn, rs_pv_state(meta));
		}
	}
	if (!err && (!r.mcore_data || rs_pv_kind(r.mcore_data) == RS_PV_NONE))
		err = unflatten_by_model(&r);
	if (!err && r.flat_states)
		err = rs_torch_dist_read_flat_state(ck, r.meta_path, d);
	if (!err)
		err = rs_torch_dist_read_distopt(ck, r.meta_path, d);
out:
	free(r.items);
	rs_pickle_free(pk);
	return err;
}

/* torch_dist's own top-level names: `.metadata` alone marks a plain DCP
 * directory (without metadata.json). */
static rs_detect detect(const char *name, mode_t mode)
{
	return S_ISREG(mode) && strcmp(name, ".metadata") == 0
		       ? RS_DETECT_MARKER : RS_DETECT_NONE;
}

int rs_torch_dist_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d)
{
	char *buf = NULL;
	size_t len = 0;
	int err;

	/* Everything in SOURCE as entries first: .distcp files are found
	 * (and their identity recorded) there. */
	err = rs_checkpoint_walk(ck, NULL, d);
	if (err)
		return err;
	err = rs_checkpoint_read_file(ck, ".metadata",
				      RS_TORCH_DIST_METADATA_MAX, &buf, &len,
				      NULL, d);
	if (err == -ENOENT) {
		rs_diag_add(d, "%s/.metadata: missing", ck->dir_path);
		return -EINVAL;
	}
	if (err)
		return err;
	err = rs_torch_dist_read_metadata(ck, (const uint8_t *)buf, len, d);
	if (!err)
		hide_own_files(ck);
	free(buf);
	return err;
}

const rs_format_def rs_torch_dist_format = {
	.name = "torch_dist",
	.dist_backend = "torch_dist",
	.detect = detect,
	.looks_like = ".metadata",
	.read = rs_torch_dist_read,
	.build_view = rs_torch_dist_build_view,
	.keeps_root = true,
};
