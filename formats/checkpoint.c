/* The shared checkpoint model: set-up, the SOURCE walker, small metadata
 * files, and what views carry of SOURCE (formats/checkpoint.h). */
#include "formats/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/codec/torch_object.h"
#include "formats/codec/torchzip.h"
#include "planner/array.h"
#include "planner/names.h"

const char *const rs_megatron_allow[] = {
	"torch.*",
	"collections.OrderedDict",
	"_codecs.encode",
	"builtins.set",
	"builtins.frozenset",
	"builtins.bytearray",
	"argparse.Namespace",
	"types.SimpleNamespace",
	"pathlib.PosixPath",
	/* np.random.get_state() in rng_state */
	"numpy.core.multiarray._reconstruct",
	"numpy._core.multiarray._reconstruct",
	"numpy.core.multiarray.scalar",
	"numpy._core.multiarray.scalar",
	"numpy.ndarray",
	"numpy.dtype",
	"numpy.dtypes.*",
	/* enum members args hold (model_type, attention_backend, fp8_recipe)
	 * and the rerun state, as megatron/core/safe_globals.py lists them;
	 * older Megatron-LM kept the enums under megatron.model. */
	"megatron.core.enums.*",
	"megatron.core.transformer.enums.*",
	"megatron.core.rerun_state_machine.RerunDiagnostic",
	"megatron.core.rerun_state_machine.RerunMode",
	"megatron.core.rerun_state_machine.RerunState",
	"megatron.legacy.model.enums.*",
	"megatron.model.enums.*",
	NULL,
};

/* GLOBALs the view writes back from the source (args and the scalars
 * beside it): what real args hold, narrower than what the reader parses.
 * The source's pickle may name any torch.* function; a view must not pass
 * one on to a loader that unpickles with weights_only=False. */
const char *const rs_megatron_copy_allow[] = {
	"argparse.Namespace", "types.SimpleNamespace", "pathlib.PosixPath",
	"_codecs.encode", "builtins.set", "builtins.frozenset",
	"collections.OrderedDict",
	"torch.bool", "torch.uint8", "torch.int8", "torch.int16",
	"torch.int32", "torch.int64", "torch.float16", "torch.bfloat16",
	"torch.float32", "torch.float64", "torch.float8_e4m3fn",
	"torch.float8_e5m2",
	"megatron.core.enums.*", "megatron.core.transformer.enums.*",
	"megatron.legacy.model.enums.*", "megatron.model.enums.*",
	NULL,
};

/* Values of the enum members args hold that torch's weights_only loader
 * can rebuild (megatron-core's safe globals), as megatron-core 0.15.3
 * defines them: a getattr(cls, name) from Python 3.11.0-3.11.4 is written
 * as cls(value), as later Pythons write it (docs/FORMATS.md, "torch.save"). */
const rs_pw_member rs_megatron_members[] = {
	{ "megatron.core.enums.ModelType", "encoder_or_decoder", 1 },
	{ "megatron.core.enums.ModelType", "retro_encoder", 2 },
	{ "megatron.core.enums.ModelType", "retro_decoder", 3 },
	{ "megatron.core.transformer.enums.AttnBackend", "flash", 1 },
	{ "megatron.core.transformer.enums.AttnBackend", "fused", 2 },
	{ "megatron.core.transformer.enums.AttnBackend", "unfused", 3 },
	{ "megatron.core.transformer.enums.AttnBackend", "local", 4 },
	{ "megatron.core.transformer.enums.AttnBackend", "auto", 5 },
	{ NULL, NULL, 0 },
};

int rs_checkpoint_init(rs_checkpoint *ck, const char *root, rs_diag *d)
{
	struct stat st;
	size_t n;
	int err;

	memset(ck, 0, sizeof(*ck));
	rs_facts_init(&ck->facts);
	ck->model.norm_eps = ck->model.rope_theta = NAN;
	rs_catalog_init(&ck->catalog);
	ck->root_path = strdup(root);
	if (!ck->root_path)
		return -ENOMEM;
	n = strlen(ck->root_path);
	while (n > 1 && ck->root_path[n - 1] == '/')
		ck->root_path[--n] = 0;
	ck->dir_path = strdup(ck->root_path);
	if (!ck->dir_path)
		return -ENOMEM;
	if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
		rs_diag_add(d, "%s: not a directory (a checkpoint is a directory)",
			    ck->root_path);
		return -EINVAL;
	}
	ck->root_mtime = st.st_mtim;
	err = rs_sources_open(&ck->sources, root);
	if (err) {
		rs_diag_add(d, "%s: cannot open: %s", ck->root_path,
			    strerror(-err));
		return -EINVAL;
	}
	return 0;
}

static void free_entries(rs_entry *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
}

int rs_checkpoint_charge(rs_checkpoint *ck, uint64_t bytes, const char *path,
			 rs_diag *d)
{
	uint64_t max = ck->max_metadata ? ck->max_metadata
					: RS_DEFAULT_MAX_METADATA;

	if (bytes > max || ck->metadata_bytes > max - bytes) {
		rs_diag_add(d, "%s: the checkpoint's metadata (headers, pickles, JSON) passes %llu bytes here; -o max_metadata=SIZE raises the limit",
			    path, (unsigned long long)max);
		return -EINVAL;
	}
	ck->metadata_bytes += bytes;
	return 0;
}

static void blob_free(rs_blob *b)
{
	free(b->fqn);
	free(b->made[0]);
	free(b->made[1]);
}

void rs_checkpoint_drop_blobs(rs_checkpoint *ck, const char *prefix)
{
	size_t kept = 0;

	for (size_t i = 0; i < ck->nblobs; i++) {
		if (strncmp(ck->blobs[i].fqn, prefix, strlen(prefix)) == 0)
			blob_free(&ck->blobs[i]);
		else
			ck->blobs[kept++] = ck->blobs[i];
	}
	ck->nblobs = kept;
}

void rs_checkpoint_close(rs_checkpoint *ck)
{
	free_entries(ck->entries, ck->nentries);
	free_entries(ck->outer, ck->nouter);
	free(ck->iter_dir);
	free(ck->dir_path);
	for (size_t i = 0; i < ck->nblobs; i++)
		blob_free(&ck->blobs[i]);
	for (size_t i = 0; i < ck->nmade; i++) {
		free(ck->made[i].name);
		free(ck->made[i].bytes);
	}
	free(ck->made);
	free(ck->blobs);
	if (ck->extra_free)
		ck->extra_free(ck->extra);
	rs_catalog_free(&ck->catalog);
	rs_sources_free(ck->sources);
	rs_model_config_free(&ck->model);
	rs_facts_free(&ck->facts);
	free(ck->describe);
	free(ck->notice);
	free(ck->root_path);
	memset(ck, 0, sizeof(*ck));
}

int rs_checkpoint_read_file(rs_checkpoint *ck, const char *relpath,
			    size_t max, char **buf, size_t *len,
			    struct stat *st, rs_diag *d)
{
	char full[PATH_MAX], path[PATH_MAX + 64];
	struct stat own;
	char *text = NULL;
	int fd, err = -EINVAL;

	if (rs_path_join(full, ck->iter_dir ? ck->iter_dir : "", relpath)) {
		rs_diag_add(d, "%s/%s: path too long", ck->dir_path, relpath);
		return -EINVAL;
	}
	/* O_NONBLOCK: a FIFO of that name must not block the mount (it is
	 * refused below as not a regular file). */
	fd = rs_open_beneath(rs_sources_root_fd(ck->sources), full,
			     O_RDONLY | O_NONBLOCK);
	if (!st)
		st = &own;
	if (fd == -ENOENT)
		return -ENOENT;
	if (fd < 0) {
		/* openat2's words for a link out of SOURCE and a link loop
		 * (or, on old kernels, any final link: O_NOFOLLOW). */
		if (fd == -EXDEV)
			rs_diag_add(d, "%s/%s: symbolic link leads outside SOURCE",
				    ck->dir_path, relpath);
		else if (fd == -ELOOP)
			rs_diag_add(d, "%s/%s: symbolic link cannot be followed",
				    ck->dir_path, relpath);
		else
			rs_diag_add(d, "%s/%s: cannot open: %s", ck->dir_path,
				    relpath, strerror(-fd));
		return -EINVAL;
	}
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) ||
	    (uint64_t)st->st_size > max) {
		rs_diag_add(d, "%s/%s: not a regular file of at most %zu bytes",
			    ck->dir_path, relpath, max);
		goto out;
	}
	text = malloc((size_t)st->st_size + 1);
	if (!text) {
		err = -ENOMEM;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/%s", ck->dir_path, relpath);
	err = rs_checkpoint_charge(ck, (uint64_t)st->st_size, path, d);
	if (err) {
		free(text);
		goto out;
	}
	err = -EINVAL;
	if (pread(fd, text, (size_t)st->st_size, 0) != st->st_size) {
		rs_diag_add(d, "%s/%s: short read", ck->dir_path, relpath);
		free(text);
		goto out;
	}
	text[st->st_size] = 0;
	*buf = text;
	*len = (size_t)st->st_size;
	err = 0;
out:
	close(fd);
	return err;
}

/* --- what views carry --- */

/* Which source entries a view carries: files not hidden (what the view
 * rewrites), not byte items, not a dist checkpoint's metadata.json (the
 * view is not one, or writes its own); a directory only if something
 * inside it is carried.  Parents come before children, so one backward
 * pass settles directories. */
static void mark_carried(const rs_checkpoint *ck, bool *carried)
{
	bool dist = ck->format && ck->format->dist_backend;

	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];

		carried[i] = !e->is_dir && !e->hidden && !e->blob &&
			     !(dist && e->parent < 0 &&
			       strcmp(e->name, "metadata.json") == 0);
	}
	for (size_t i = ck->nentries; i-- > 0;)
		if (carried[i] && ck->entries[i].parent >= 0)
			carried[ck->entries[i].parent] = true;
}

/* Adds the entries v[0, n) that are carried (all, when `carried` is
 * NULL) to t under its root. */
static int add_entries(const rs_checkpoint *ck, const rs_entry *v, size_t n,
		       const bool *carried, rs_vtree *t)
{
	uint32_t *node = calloc(n + 1, sizeof(uint32_t));
	int err = node ? 0 : -ENOMEM;

	for (size_t i = 0; i < n && !err; i++) {
		const rs_entry *e = &v[i];
		uint32_t parent = e->parent < 0 ? 0 : node[e->parent];

		if (carried && !carried[i])
			continue;
		if (e->is_dir) {
			err = rs_vtree_add_dir(t, parent, e->name, e->mtime,
					       &node[i]);
			continue;
		}
		err = rs_vtree_add_file(t, parent, e->name, e->mtime, &node[i]);
		if (!err)
			err = rs_vtree_append_source(t, node[i], e->source, 0,
				rs_sources_id(ck->sources, e->source)->size);
	}
	free(node);
	return err;
}

rs_entry *rs_checkpoint_top_entry(const rs_checkpoint *ck, const char *name)
{
	for (size_t i = 0; i < ck->nentries; i++)
		if (ck->entries[i].parent < 0 &&
		    strcmp(ck->entries[i].name, name) == 0)
			return &ck->entries[i];
	return NULL;
}

int rs_checkpoint_add_made(const rs_checkpoint *ck, rs_vtree *t)
{
	int err = 0;

	for (size_t i = 0; i < ck->nmade && !err; i++) {
		uint32_t file;

		err = rs_vtree_add_file(t, 0, ck->made[i].name, ck->root_mtime,
					&file);
		if (!err)
			err = rs_vtree_append_literal(t, file, ck->made[i].bytes,
						      ck->made[i].len);
	}
	return err;
}

int rs_checkpoint_carry(const rs_checkpoint *ck, rs_vtree *t)
{
	bool *carried = calloc(ck->nentries + 1, sizeof(bool));
	int err = carried ? 0 : -ENOMEM;

	if (!err) {
		mark_carried(ck, carried);
		err = add_entries(ck, ck->entries, ck->nentries, carried, t);
	}
	free(carried);
	return err ? err : rs_checkpoint_add_made(ck, t);
}

int rs_checkpoint_carry_outer(const rs_checkpoint *ck, rs_vtree *t)
{
	return add_entries(ck, ck->outer, ck->nouter, NULL, t);
}

int rs_checkpoint_append_blob(const rs_checkpoint *ck, const rs_blob *b,
			      bool as_list, rs_vtree *t, uint32_t file,
			      uint64_t *length, rs_diag *d)
{
	char why[RS_TORCH_OBJECT_WHY_SIZE];
	rs_torch_object obj = {
		.source = b->source, .offset = b->offset, .length = b->length,
		.listed = b->listed,
	};
	int err;

	if (b->made[as_list]) {
		*length = b->made_len[as_list];
		return rs_vtree_append_literal(t, file, b->made[as_list],
					       b->made_len[as_list]);
	}
	err = rs_torch_object_append(ck->sources, &obj, as_list, t, file,
				     length, why, sizeof(why));

	if (err == -EINVAL)
		rs_diag_add(d, "%s/%s: ShardedObject %s: %s", ck->root_path,
			    rs_sources_path(ck->sources, b->source), b->fqn, why);
	return err;
}

/* --- the SOURCE walker --- */

int rs_path_join(char *out, const char *dir, const char *name)
{
	int n = dir[0] ? snprintf(out, PATH_MAX, "%s/%s", dir, name)
		       : snprintf(out, PATH_MAX, "%s", name);

	return (n < 0 || n >= PATH_MAX) ? -ENAMETOOLONG : 0;
}

void rs_list_free(char **names, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(names[i]);
	free(names);
}

int rs_list_dir(int dirfd, char ***names, size_t *count)
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
		rs_list_free(v, n);
		return err;
	}
	if (n)
		qsort(v, n, sizeof(*v), rs_names_cmp);
	*names = v;
	*count = n;
	return 0;
}

int rs_checkpoint_stat(const rs_checkpoint *ck, int dirfd, const char *name,
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

int rs_checkpoint_add_entry(rs_checkpoint *ck, const char *name, long parent,
			    bool is_dir, uint32_t source,
			    const struct stat *st, long *index)
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

int rs_checkpoint_add_file(rs_checkpoint *ck, const char *relpath,
			   const struct stat *st, uint32_t *index,
			   rs_diag *d)
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

/* One subdirectory: the reader's hook first, else walked as it is. */
static int walk_subdir(rs_checkpoint *ck, const rs_walk_hooks *h, int fd,
		       const char *relpath, const char *name, long parent,
		       const struct stat *st, int depth, rs_diag *d)
{
	rs_walk_dir w = { fd, relpath, name, parent, st, depth };
	long sub;
	int err = RS_WALK_DESCEND;

	if (h && h->directory)
		err = h->directory(ck, h, &w, d);
	if (err != RS_WALK_DESCEND)
		return err;
	err = rs_checkpoint_add_entry(ck, name, parent, true, 0, st, &sub);
	if (!err)
		err = rs_checkpoint_walk_dir(ck, h, fd, relpath, sub, depth, d);
	return err;
}

int rs_checkpoint_walk_dir(rs_checkpoint *ck, const rs_walk_hooks *h,
			   int dirfd, const char *relpath, long parent,
			   int depth, rs_diag *d)
{
	char path[PATH_MAX];
	char **names = NULL;
	size_t n = 0;
	int err, bad = 0;

	if (depth > RS_WALK_MAX_DEPTH) {
		rs_diag_add(d, "%s/%s: directories nested deeper than %d",
			    ck->root_path, relpath, RS_WALK_MAX_DEPTH);
		return -EINVAL;
	}
	err = rs_list_dir(dirfd, &names, &n);
	if (err) {
		rs_diag_add(d, "%s/%s: cannot list: %s", ck->root_path, relpath,
			    strerror(-err));
		return -EINVAL;
	}
	for (size_t i = 0; i < n && err != -ENOMEM; i++) {
		const char *name = names[i];
		struct stat st;
		uint32_t src;
		int subfd;

		err = 0;
		if (depth == 0 && strcmp(name, ".reshardfs") == 0) {
			rs_diag_add(d, "%s/.reshardfs: name reserved for the mount's control directory",
				    ck->root_path);
			bad = -EINVAL;
			continue;
		}
		if ((err = rs_path_join(path, relpath, name)) ||
		    rs_checkpoint_stat(ck, dirfd, name, path, &st, d)) {
			bad = -EINVAL;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (rs_checkpoint_add_file(ck, path, &st, &src, d) ||
			    rs_checkpoint_add_entry(ck, name, parent, false, src,
						    &st, NULL))
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
		err = walk_subdir(ck, h, subfd, path, name, parent, &st,
				  depth + 1, d);
		close(subfd);
		if (err)
			bad = -EINVAL;
	}
	rs_list_free(names, n);
	return err == -ENOMEM ? err : bad;
}

int rs_checkpoint_walk(rs_checkpoint *ck, const rs_walk_hooks *h,
		       rs_diag *d)
{
	int fd, err;

	if (!ck->iter_dir)
		return rs_checkpoint_walk_dir(ck, h,
					      rs_sources_root_fd(ck->sources),
					      "", -1, 0, d);
	fd = rs_open_beneath(rs_sources_root_fd(ck->sources), ck->iter_dir,
			     O_RDONLY | O_DIRECTORY);
	if (fd < 0) {
		rs_diag_add(d, "%s: cannot open: %s", ck->dir_path,
			    strerror(-fd));
		return -EINVAL;
	}
	err = rs_checkpoint_walk_dir(ck, h, fd, ck->iter_dir, -1, 0, d);
	close(fd);
	return err;
}

const char *rs_checkpoint_local(const rs_checkpoint *ck, const char *relpath)
{
	size_t n = ck->iter_dir ? strlen(ck->iter_dir) : 0;

	if (n && strncmp(relpath, ck->iter_dir, n) == 0 && relpath[n] == '/')
		return relpath + n + 1;
	return relpath;
}

/* --- the checkpoint root form --- */

/* Iteration directories are not part of the root's other entries: the
 * tracked one is the checkpoint, the others are not shown. */
static int skip_iterations(rs_checkpoint *ck, const rs_walk_hooks *h,
			   const rs_walk_dir *w, rs_diag *d)
{
	return w->parent < 0 && rs_is_iteration_name(w->name)
		       ? 0 : RS_WALK_DESCEND;
}

bool rs_is_iteration_name(const char *name)
{
	size_t n = strspn(name + (strncmp(name, "iter_", 5) == 0 ? 5 : 0),
			  "0123456789");

	return strcmp(name, "release") == 0 ||
	       (strncmp(name, "iter_", 5) == 0 && n > 0 && name[5 + n] == 0);
}

int rs_checkpoint_enter(rs_checkpoint *ck, const char *iter_dir, rs_diag *d)
{
	static const rs_walk_hooks outer = { skip_iterations, NULL };
	char *path = NULL;
	int err;

	/* The root's own entries first, into ck->entries, then kept apart:
	 * the reader walks the iteration into a fresh list. */
	err = rs_checkpoint_walk_dir(ck, &outer,
				     rs_sources_root_fd(ck->sources), "", -1,
				     0, d);
	if (err)
		return err;
	ck->outer = ck->entries;
	ck->nouter = ck->nentries;
	ck->cap_outer = ck->cap_entries;
	ck->entries = NULL;
	ck->nentries = ck->cap_entries = 0;
	ck->iter_dir = strdup(iter_dir);
	if (!ck->iter_dir || asprintf(&path, "%s/%s", ck->root_path,
				      iter_dir) < 0)
		return -ENOMEM;
	free(ck->dir_path);
	ck->dir_path = path;
	return 0;
}

/* Megatron-LM's common.pt is args, optimizer param groups and rng state,
 * an optimizer record param groups: kilobytes to a few MB. */
#define PICKLE_MAX (64u << 20)

int rs_checkpoint_read_pickle(rs_checkpoint *ck, uint32_t source,
			      uint64_t offset, uint64_t length, bool tensors,
			      rs_pickle **pk, char *msg, size_t size)
{
	char perr[RS_ZIP_MSG_SIZE];
	const rs_zip_entry *pe;
	rs_pickle_limits lim;
	rs_zip z = { 0 };
	uint8_t *buf = NULL;
	int fd, err;

	err = rs_sources_fd(ck->sources, source, &fd);
	if (!err)
		err = rs_zip_open(&z, fd, offset, length, perr, sizeof(perr));
	if (err) {
		snprintf(msg, size, "not a torch.save zip");
		err = -EINVAL;
		goto out;
	}
	pe = rs_zip_find(&z, "data.pkl");
	if (!pe || pe->size > PICKLE_MAX) {
		snprintf(msg, size, "no readable data.pkl");
		err = -EINVAL;
		goto out;
	}
	buf = malloc(pe->size ? pe->size : 1);
	if (!buf) {
		err = -ENOMEM;
		goto out;
	}
	if (rs_pread_full(fd, buf, pe->size, offset + pe->offset) != 0) {
		snprintf(msg, size, "no readable data.pkl");
		err = -EINVAL;
		goto out;
	}
	rs_pickle_limits_default(&lim);
	lim.allow = rs_megatron_allow;
	lim.torch_persids = tensors;
	err = rs_pickle_parse(buf, pe->size, &lim, pk, perr, sizeof(perr));
	if (err) {
		snprintf(msg, size, "%s", perr);
		err = err == -ENOMEM ? err : -EINVAL;
	}
out:
	free(buf);
	rs_zip_free(&z);
	return err;
}

int rs_checkpoint_open_torch_save(rs_checkpoint *ck, uint32_t source,
				  const char *path, const char *const *allow,
				  size_t max, rs_zip *z, rs_pickle **pk,
				  rs_diag *d)
{
	char msg[RS_ZIP_MSG_SIZE], perr[300];
	const rs_zip_entry *pkl;
	rs_pickle_limits lim;
	uint8_t *buf = NULL;
	int fd, err;

	err = rs_sources_fd(ck->sources, source, &fd);
	if (err) {
		rs_diag_add(d, "%s: cannot open: %s", path, strerror(-err));
		return -EINVAL;
	}
	err = rs_zip_open(z, fd, 0, rs_sources_id(ck->sources, source)->size,
			  msg, sizeof(msg));
	if (err) {
		rs_diag_add(d, "%s: %s", path, msg);
		return err == -ENOMEM ? err : -EINVAL;
	}
	pkl = rs_zip_find(z, "data.pkl");
	if (!pkl || pkl->size > max ||
	    !(buf = malloc(pkl->size ? pkl->size : 1)) ||
	    rs_pread_full(fd, buf, pkl->size, pkl->offset)) {
		rs_diag_add(d, "%s: no readable data.pkl of at most %zu bytes",
			    path, max);
		free(buf);
		return -EINVAL;
	}
	err = rs_checkpoint_charge(ck, pkl->size, path, d);
	if (err) {
		free(buf);
		return err;
	}
	rs_pickle_limits_default(&lim);
	lim.allow = allow;
	lim.torch_persids = true;
	err = rs_pickle_parse(buf, pkl->size, &lim, pk, perr, sizeof(perr));
	free(buf);
	if (err) {
		rs_diag_add(d, "%s: data.pkl: %s", path, perr);
		return err == -ENOMEM ? err : -EINVAL;
	}
	return 0;
}

int rs_checkpoint_open_torch_dict(rs_checkpoint *ck, uint32_t source,
				  const char *path, const char *const *allow,
				  size_t max, rs_zip *z, rs_pickle **pk,
				  rs_diag *d)
{
	int err = rs_checkpoint_open_torch_save(ck, source, path, allow, max,
						z, pk, d);

	if (!err && rs_pv_kind(rs_pickle_root(*pk)) != RS_PV_DICT) {
		rs_diag_add(d, "%s: data.pkl is not a dict", path);
		err = -EINVAL;
	}
	return err;
}

int rs_checkpoint_read_common(rs_checkpoint *ck, rs_diag *d)
{
	const rs_entry *common = rs_checkpoint_top_entry(ck, "common.pt");
	rs_pickle *pk = NULL;
	const rs_pvalue *args;
	char msg[RS_ZIP_MSG_SIZE];
	int err;

	if (!common || common->is_dir)
		return 0;
	err = rs_checkpoint_read_pickle(ck, common->source, 0,
					rs_sources_id(ck->sources, common->source)->size,
					true, &pk, msg, sizeof(msg));
	if (err)
		return err == -ENOMEM ? err : 0;        /* facts stay unknown */
	args = rs_pv_get(rs_pickle_root(pk), "args");
	if (rs_pv_call_is(args, "argparse.Namespace")) {
		char path[PATH_MAX + 16];

		snprintf(path, sizeof(path), "%s/common.pt", ck->dir_path);
		err = rs_facts_from_args(&ck->facts, rs_pv_state(args),
					 "common.pt args", path, d);
	}
	rs_pickle_free(pk);
	return err;
}
