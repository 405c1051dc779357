/* The format table, detection, and dispatch to readers and view builders
 * (formats/open.h).  Adding a format: its folder defines an rs_format_def
 * and this table lists it (docs/ARCHITECTURE.md, "How to add a format"). */
#include "formats/open.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/codec/json_text.h"
#include "formats/deepspeed/deepspeed.h"
#include "formats/megatron/megatron.h"
#include "formats/metaseq/metaseq.h"
#include "formats/safetensors/safetensors.h"
#include "formats/torch_dist/torch_dist.h"
#include "formats/zarr/zarr.h"

static const rs_format_def *const formats[] = {
	&rs_zarr_format,
	&rs_torch_dist_format,
	&rs_megatron_format,
	&rs_safetensors_format,
	&rs_metaseq_format,
	&rs_hf_format,
	&rs_deepspeed_format,
	&rs_universal_format,
};
#define NFORMATS (sizeof(formats) / sizeof(formats[0]))

#define RS_METADATA_MAX_BYTES (1u << 20)

static const rs_format_def *find(const char *name)
{
	for (size_t i = 0; i < NFORMATS; i++)
		if (strcmp(formats[i]->name, name) == 0)
			return formats[i];
	return NULL;
}

/* Writes items as "a, b or c" ("a and b" with `and`) into out. */
static void list_words(const char *const *items, size_t n, bool and,
		       char *out, size_t size)
{
	size_t at = 0;

	out[0] = 0;
	for (size_t i = 0; i < n && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%s",
				       i == 0 ? "" : i + 1 < n ? ", "
					       : and ? " and " : " or ",
				       items[i]);
}

#define TRACKER "latest_checkpointed_iteration.txt"

/* The checkpoint directory's descriptor: SOURCE's own (dup'd), or the
 * tracked iteration's in the root form.  The caller closes it. */
static int open_dir(const rs_checkpoint *ck)
{
	int root = rs_sources_root_fd(ck->sources), fd;

	if (ck->iter_dir)
		return rs_open_beneath(root, ck->iter_dir,
				       O_RDONLY | O_DIRECTORY);
	fd = dup(root);
	return fd < 0 ? -errno : fd;
}

/* What the names at the top of the checkpoint directory say: a marker
 * decides; else the files of exactly one format must be there.  Several
 * are refused rather than guessed between.  0 with ck->format set; 1 when
 * no format claims the directory (nothing reported); -EINVAL (reported),
 * -ENOMEM. */
static int detect_by_names(rs_checkpoint *ck, rs_diag *d)
{
	const rs_format_def *marked = NULL, *found[NFORMATS];
	const char *example[NFORMATS];
	char *names[NFORMATS] = { 0 };
	size_t nfound = 0;
	struct dirent *e;
	DIR *dir = NULL;
	int fd = open_dir(ck), err = -EINVAL;

	if (fd < 0 || !(dir = fdopendir(fd))) {
		rs_diag_add(d, "%s: cannot list: %s", ck->dir_path,
			    strerror(fd < 0 ? -fd : errno));
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	while ((e = readdir(dir))) {
		struct stat st;

		if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		for (size_t i = 0; i < NFORMATS; i++) {
			const rs_format_def *f = formats[i];
			rs_detect k = f->detect ? f->detect(e->d_name, st.st_mode)
						: RS_DETECT_NONE;
			size_t j;

			if (k == RS_DETECT_MARKER && !marked)
				marked = f;
			if (k != RS_DETECT_FILES)
				continue;
			/* Each format once, named by its first file. */
			for (j = 0; j < nfound && found[j] != f; j++)
				;
			if (j < nfound && strcmp(e->d_name, names[j]) > 0)
				continue;
			free(names[j]);
			names[j] = strdup(e->d_name);
			if (!names[j]) {
				err = -ENOMEM;
				goto out;
			}
			found[j] = f;
			nfound += j == nfound;
		}
	}
	if (marked) {
		ck->format = marked;
		err = 0;
	} else if (nfound == 1) {
		ck->format = found[0];
		err = 0;
	} else if (nfound > 1) {
		char text[NFORMATS * 300];
		char *items[NFORMATS] = { 0 };

		for (size_t i = 0; i < nfound; i++)
			if (asprintf(&items[i], "%s (%s)", found[i]->name,
				     names[i]) < 0)
				items[i] = NULL;
		for (size_t i = 0; i < nfound; i++)
			example[i] = items[i] ? items[i] : found[i]->name;
		list_words(example, nfound, true, text, sizeof(text));
		rs_diag_add(d, "%s: holds files of more than one checkpoint format: %s",
			    ck->dir_path, text);
		for (size_t i = 0; i < nfound; i++)
			free(items[i]);
	} else {
		err = 1;
	}
out:
	for (size_t i = 0; i < nfound; i++)
		free(names[i]);
	closedir(dir);
	return err;
}

/* The refusal of a directory no format claims: what it lacks, or, when it
 * holds iteration directories, which ones to mount. */
static int refuse_unknown(rs_checkpoint *ck, rs_diag *d)
{
	char **names = NULL, text[NFORMATS * 64], iters[3 * 300];
	const char *example[NFORMATS + 1];
	size_t n = 0, k = 0, last = 0;
	int fd = open_dir(ck), err;

	err = fd < 0 ? fd : rs_list_dir(fd, &names, &n);
	if (fd >= 0)
		close(fd);
	if (err == -ENOMEM)
		return err;
	iters[0] = 0;
	for (size_t i = 0; !err && i < n; i++)
		if (rs_is_iteration_name(names[i])) {
			if (k++ < 3)
				snprintf(iters + strlen(iters),
					 sizeof(iters) - strlen(iters), "%s%s",
					 k > 1 ? ", " : "", names[i]);
			last = i;
		}
	if (k) {
		rs_diag_add(d, "%s: holds iteration directories (%s%s) but no %s: mount one of them, e.g. reshardfs %s/%s MOUNTPOINT",
			    ck->dir_path, iters, k > 3 ? ", ..." : "", TRACKER,
			    ck->dir_path, names[last]);
	} else {
		example[k++] = "metadata.json";
		for (size_t i = 0; i < NFORMATS; i++)
			if (formats[i]->looks_like)
				example[k++] = formats[i]->looks_like;
		list_words(example, k, false, text, sizeof(text));
		rs_diag_add(d, "%s: not a checkpoint (no %s, or %s)",
			    ck->dir_path, text, TRACKER);
	}
	rs_list_free(names, n);
	return -EINVAL;
}

/* The tracker file's iteration, as Megatron reads it (the stripped text
 * is an iteration number or "release"), into name[size]: 0, 1 when there
 * is no tracker, -EINVAL (reported). */
static int read_tracker(rs_checkpoint *ck, char *name, size_t size,
			rs_diag *d)
{
	char *text = NULL, *s, *e;
	size_t len;
	int err = rs_checkpoint_read_file(ck, TRACKER, 64, &text, &len, NULL,
					  d);

	if (err == -ENOENT)
		return 1;
	if (err)
		return err;
	err = -EINVAL;
	for (s = text; *s && strchr(" \t\n\r\v\f", *s); s++)
		;
	for (e = text + len; e > s && strchr(" \t\n\r\v\f", e[-1]); e--)
		;
	*e = 0;
	if (memchr(text, 0, len) != NULL && memchr(text, 0, len) != e) {
		/* A NUL inside: Python's int() refuses it too. */
	} else if (strcmp(s, "release") == 0) {
		snprintf(name, size, "release");
		err = 0;
	} else if (*s && strspn(s, "0123456789") == strlen(s) &&
		   strlen(s) <= 10) {
		snprintf(name, size, "iter_%07llu", strtoull(s, NULL, 10));
		err = 0;
	}
	if (err)
		rs_diag_add(d, "%s/%s: holds neither an iteration number nor 'release'",
			    ck->root_path, TRACKER);
	free(text);
	return err;
}

/* metadata.json of the checkpoint directory names a dist checkpoint's
 * backend: 0 with ck->format set, 1 when there is none, -EINVAL. */
static int detect_dist(rs_checkpoint *ck, rs_diag *d)
{
	char *text = NULL;
	size_t len;
	cJSON *root = NULL;
	const cJSON *backend;
	char why[100];
	int err = rs_checkpoint_read_file(ck, "metadata.json",
					  RS_METADATA_MAX_BYTES, &text, &len,
					  NULL, d);

	if (err == -ENOENT)
		return 1;
	if (err)
		return err;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s/metadata.json: %s", ck->dir_path, why);
	if (err)
		goto out;
	err = -EINVAL;
	backend = cJSON_GetObjectItemCaseSensitive(root, "sharded_backend");
	if (!cJSON_IsString(backend)) {
		rs_diag_add(d, "%s/metadata.json: not a JSON object with a \"sharded_backend\" string",
			    ck->dir_path);
		goto out;
	}
	for (size_t i = 0; i < NFORMATS && err; i++)
		if (formats[i]->dist_backend &&
		    strcmp(backend->valuestring, formats[i]->dist_backend) == 0) {
			ck->format = formats[i];
			err = 0;
		}
	if (err) {
		const char *known[NFORMATS];
		char text_known[NFORMATS * 32];
		size_t n = 0;

		for (size_t i = 0; i < NFORMATS; i++)
			if (formats[i]->dist_backend)
				known[n++] = formats[i]->dist_backend;
		list_words(known, n, true, text_known, sizeof(text_known));
		rs_diag_add(d, "%s/metadata.json: sharded_backend \"%s\" is not supported (%s are)",
			    ck->dir_path, backend->valuestring, text_known);
	}
out:
	cJSON_Delete(root);
	free(text);
	return err;
}

/* The format of the checkpoint directory: its metadata.json, else its
 * names; 1 when neither says. */
static int detect_here(rs_checkpoint *ck, rs_diag *d)
{
	int err = detect_dist(ck, d);

	return err == 1 ? detect_by_names(ck, d) : err;
}

/* SOURCE itself, else (with a tracker file and nothing else that says)
 * the checkpoint root form: the tracked iteration. */
static int detect_format(rs_checkpoint *ck, rs_diag *d)
{
	char iter[32];
	struct stat st;
	int err = detect_here(ck, d);

	if (err != 1)
		return err;
	err = read_tracker(ck, iter, sizeof(iter), d);
	if (err == 1)
		return refuse_unknown(ck, d);
	if (err)
		return err;
	if (fstatat(rs_sources_root_fd(ck->sources), iter, &st,
		    AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
		rs_diag_add(d, "%s/%s: names %s, which is missing", ck->root_path,
			    TRACKER, iter);
		return -EINVAL;
	}
	err = rs_checkpoint_enter(ck, iter, d);
	if (!err)
		err = detect_here(ck, d);
	return err == 1 ? refuse_unknown(ck, d) : err;
}

int rs_checkpoint_open(const char *root, const rs_open_opts *o,
		       rs_checkpoint *ck, rs_diag *d)
{
	static const rs_open_opts none = { 0 };
	int err = rs_checkpoint_init(ck, root, d);

	if (!o)
		o = &none;
	ck->max_metadata = o->max_metadata ? o->max_metadata
					   : RS_DEFAULT_MAX_METADATA;
	ck->max_tensors = o->max_tensors ? o->max_tensors
					 : RS_DEFAULT_MAX_TENSORS;
	if (!err)
		err = detect_format(ck, d);
	if (!err)
		err = ck->format->read(ck, o, d);
	if (!err && ck->catalog.count > ck->max_tensors) {
		rs_diag_add(d, "%s: %zu tensors, more than %llu; -o max_tensors=N raises the limit",
			    ck->dir_path, ck->catalog.count,
			    (unsigned long long)ck->max_tensors);
		err = -EINVAL;
	}
	if (!err && ck->format->dist_backend)
		err = rs_checkpoint_read_common(ck, d);
	if (err)
		rs_checkpoint_close(ck);
	return err;
}

int rs_checkpoint_build_view(const rs_checkpoint *ck,
			     const rs_format_def *view, const rs_layout *l,
			     rs_vtree *t, rs_diag *d)
{
	size_t lines = rs_diag_count(d);
	int err = rs_vtree_init(t, ck->root_mtime);

	if (err)
		return err;
	if (!view)
		view = rs_format_default_view(ck->format);
	if (!view->build_view) {
		rs_diag_add(d, "%s: there is no %s view (choose -o format=)",
			    ck->root_path, view->name);
		return -EINVAL;
	}
	err = view->build_view(ck, l, t, d);
	/* A root shown as a root: the view in the tracked iteration's
	 * directory, beside the root's other files. */
	if (!err && ck->iter_dir && view->keeps_root) {
		struct stat st;
		struct timespec mtime = ck->root_mtime;
		uint32_t dir;

		if (fstatat(rs_sources_root_fd(ck->sources), ck->iter_dir, &st,
			    AT_SYMLINK_NOFOLLOW) == 0)
			mtime = st.st_mtim;
		err = rs_vtree_nest(t, ck->iter_dir, mtime, &dir);
		if (!err)
			err = rs_checkpoint_carry_outer(ck, t);
	}
	/* The mount's control directory has the name; a tensor (or a byte
	 * item's key) of that name would be hidden by it, or hide it. */
	if (!err) {
		uint32_t clash;

		if (rs_vtree_lookup(t, 0, ".reshardfs", &clash) == 0) {
			rs_diag_add(d, "%s: the %s view would hold \".reshardfs\" (a tensor or byte item of that name), the name of the mount's control directory",
				    ck->dir_path, view->name);
			err = -EINVAL;
		}
	}
	/* Two things of one name in the view (a tensor or byte item and a
	 * file of SOURCE or one the view writes): the tree refuses the
	 * second; say where, and what the tensor of that name came from. */
	if (err == -EEXIST && rs_diag_count(d) == lines) {
		char path[1024];
		const char *base;
		size_t i;

		rs_vtree_path(t, t->clash ? t->clash - 1 : 0, path, sizeof(path));
		base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
		for (i = 0; i < ck->catalog.count; i++)
			if (strcmp(ck->catalog.tensors[i].name, base) == 0)
				break;
		if (i < ck->catalog.count)
			rs_diag_add(d, "%s: the %s view would write two things at %s: tensor %s (from %s) and a file of SOURCE or of the view; rename the tensor",
				    ck->root_path, view->name, path,
				    ck->catalog.tensors[i].name,
				    ck->catalog.tensors[i].origin
					    ? ck->catalog.tensors[i].origin
					    : "SOURCE");
		else
			rs_diag_add(d, "%s: the %s view would write two things at %s: a file of SOURCE and a tensor, byte item or file of the view",
				    ck->root_path, view->name, path);
		err = -EINVAL;
	}
	return err;
}

const rs_format_def *rs_format_find_view(const char *name)
{
	const rs_format_def *f = find(name);

	return f && f->build_view ? f : NULL;
}

const rs_format_def *rs_format_default_view(const rs_format_def *source)
{
	const rs_format_def *v = source->default_view
					 ? find(source->default_view) : NULL;

	return v ? v : source;
}

void rs_format_view_names(char *out, size_t size)
{
	const char *names[NFORMATS];
	size_t n = 0;

	for (size_t i = 0; i < NFORMATS; i++)
		if (formats[i]->build_view)
			names[n++] = formats[i]->name;
	list_words(names, n, false, out, size);
}
