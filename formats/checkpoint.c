/* Format detection and dispatch to the reader and view builder. */
#include "formats/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/dcp.h"
#include "formats/megatron.h"
#include "formats/metaseq.h"
#include "formats/safetensors.h"
#include "formats/json_text.h"
#include "formats/zarr.h"

#define RS_METADATA_MAX_BYTES (1u << 20)

const char *rs_format_name(rs_format f)
{
	switch (f) {
	case RS_FORMAT_ZARR:
		return "zarr";
	case RS_FORMAT_TORCH_DIST:
		return "torch_dist";
	case RS_FORMAT_MEGATRON:
		return "megatron";
	case RS_FORMAT_METASEQ:
		return "metaseq";
	case RS_FORMAT_SAFETENSORS:
		return "safetensors";
	}
	return "unknown";
}

int rs_checkpoint_read_file(const rs_checkpoint *ck, const char *relpath,
			    size_t max, char **buf, size_t *len,
			    struct stat *st, rs_diag *d)
{
	int fd = rs_open_beneath(rs_sources_root_fd(ck->sources), relpath,
				 O_RDONLY);
	struct stat own;
	char *text = NULL;
	int err = -EINVAL;

	if (!st)
		st = &own;
	if (fd == -ENOENT)
		return -ENOENT;
	if (fd < 0) {
		/* openat2's words for a link out of SOURCE and a link loop
		 * (or, on old kernels, any final link: O_NOFOLLOW). */
		if (fd == -EXDEV)
			rs_diag_add(d, "%s/%s: symbolic link leads outside SOURCE",
				    ck->root_path, relpath);
		else if (fd == -ELOOP)
			rs_diag_add(d, "%s/%s: symbolic link cannot be followed",
				    ck->root_path, relpath);
		else
			rs_diag_add(d, "%s/%s: cannot open: %s", ck->root_path,
				    relpath, strerror(-fd));
		return -EINVAL;
	}
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) ||
	    (uint64_t)st->st_size > max) {
		rs_diag_add(d, "%s/%s: not a regular file of at most %zu bytes",
			    ck->root_path, relpath, max);
		goto out;
	}
	text = malloc((size_t)st->st_size + 1);
	if (!text) {
		err = -ENOMEM;
		goto out;
	}
	if (pread(fd, text, (size_t)st->st_size, 0) != st->st_size) {
		rs_diag_add(d, "%s/%s: short read", ck->root_path, relpath);
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

/* What a top-level name says about the format, or 0. */
static rs_format format_of_name(const char *name, bool is_dir)
{
	size_t n = strlen(name);

	if (is_dir && strncmp(name, "mp_rank_", 8) == 0)
		return RS_FORMAT_MEGATRON;
	if (!is_dir && strcmp(name, "latest_checkpointed_iteration.txt") == 0)
		return RS_FORMAT_MEGATRON;
	if (!is_dir && (strcmp(name, "model.safetensors.index.json") == 0 ||
			(n > 12 && strcmp(name + n - 12, ".safetensors") == 0)))
		return RS_FORMAT_SAFETENSORS;
	if (!is_dir && n > 3 && strcmp(name + n - 3, ".pt") == 0 &&
	    strstr(name, "model_part-"))
		return RS_FORMAT_METASEQ;
	return 0;
}

/* A checkpoint without metadata.json: per-rank Megatron directories,
 * safetensors files or metaseq shards at the top.  Several kinds at once
 * are refused rather than guessed between. */
static int detect_by_names(rs_checkpoint *ck, rs_diag *d)
{
	int fd = dup(rs_sources_root_fd(ck->sources));
	rs_format found = 0;
	bool mixed = false;
	struct dirent *e;
	DIR *dir;

	if (fd < 0 || !(dir = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		rs_diag_add(d, "%s: cannot list: %s", ck->root_path,
			    strerror(errno));
		return -EINVAL;
	}
	while ((e = readdir(dir))) {
		struct stat st;
		rs_format f;

		if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		f = format_of_name(e->d_name, S_ISDIR(st.st_mode));
		if (f && found && f != found)
			mixed = true;
		if (f)
			found = f;
	}
	closedir(dir);
	if (mixed) {
		rs_diag_add(d, "%s: holds files of more than one checkpoint format (per-rank Megatron, safetensors, metaseq)",
			    ck->root_path);
		return -EINVAL;
	}
	if (!found) {
		rs_diag_add(d, "%s: not a checkpoint (no metadata.json, .metadata, mp_rank_* directories, *.safetensors or *model_part-*.pt files)",
			    ck->root_path);
		return -EINVAL;
	}
	ck->format = found;
	return 0;
}

/* Reads metadata.json and decides the format (FORMATS.md §1). */
static int detect_format(rs_checkpoint *ck, rs_diag *d)
{
	char *text = NULL;
	size_t len;
	cJSON *root = NULL;
	const cJSON *backend;
	struct stat dst;
	char why[100];
	int err = rs_checkpoint_read_file(ck, "metadata.json",
					  RS_METADATA_MAX_BYTES, &text, &len,
					  NULL, d);

	if (err == -ENOENT) {
		/* A plain PyTorch DCP directory has .metadata only. */
		if (fstatat(rs_sources_root_fd(ck->sources), ".metadata", &dst,
			    AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(dst.st_mode)) {
			ck->format = RS_FORMAT_TORCH_DIST;
			return 0;
		}
		return detect_by_names(ck, d);
	}
	if (err)
		return err;
	err = rs_json_parse_object(text, len, &root, why, sizeof(why));
	if (err == -EINVAL)
		rs_diag_add(d, "%s/metadata.json: %s", ck->root_path, why);
	if (err)
		goto out;
	err = -EINVAL;
	backend = cJSON_GetObjectItemCaseSensitive(root, "sharded_backend");
	if (!cJSON_IsString(backend)) {
		rs_diag_add(d, "%s/metadata.json: not a JSON object with a \"sharded_backend\" string",
			    ck->root_path);
		goto out;
	}
	if (strcmp(backend->valuestring, "zarr") == 0) {
		ck->format = RS_FORMAT_ZARR;
		err = 0;
	} else if (strcmp(backend->valuestring, "torch_dist") == 0) {
		ck->format = RS_FORMAT_TORCH_DIST;
		err = 0;
	} else {
		rs_diag_add(d, "%s/metadata.json: sharded_backend \"%s\" is not supported (zarr and torch_dist are)",
			    ck->root_path, backend->valuestring);
	}
out:
	cJSON_Delete(root);
	free(text);
	return err;
}

int rs_checkpoint_open(const char *root, const rs_open_opts *o,
		       rs_checkpoint *ck, rs_diag *d)
{
	static const rs_open_opts none = { 0 };
	struct stat st;
	size_t n;
	int err;

	memset(ck, 0, sizeof(*ck));
	rs_catalog_init(&ck->catalog);
	ck->root_path = strdup(root);
	if (!ck->root_path)
		return -ENOMEM;
	n = strlen(ck->root_path);
	while (n > 1 && ck->root_path[n - 1] == '/')
		ck->root_path[--n] = 0;
	if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
		rs_diag_add(d, "%s: not a directory (a checkpoint is a directory)",
			    ck->root_path);
		err = -EINVAL;
		goto fail;
	}
	ck->root_mtime = st.st_mtim;
	err = rs_sources_open(&ck->sources, root);
	if (err) {
		rs_diag_add(d, "%s: cannot open: %s", ck->root_path,
			    strerror(-err));
		err = -EINVAL;
		goto fail;
	}
	err = detect_format(ck, d);
	if (err)
		goto fail;
	if (!o)
		o = &none;
	switch (ck->format) {
	case RS_FORMAT_ZARR:
		err = rs_zarr_read(ck, d);
		if (!err)
			err = rs_zarr_collect_blobs(ck);
		break;
	case RS_FORMAT_TORCH_DIST:
		err = rs_dcp_read(ck, d);
		break;
	case RS_FORMAT_MEGATRON:
		err = rs_megatron_read(ck, o->rules, d);
		break;
	case RS_FORMAT_METASEQ:
		err = rs_metaseq_read(ck, o->params_file, d);
		break;
	case RS_FORMAT_SAFETENSORS:
		err = rs_safetensors_read(ck, d);
		break;
	}
	if (err)
		goto fail;
	return 0;
fail:
	rs_checkpoint_close(ck);
	return err;
}

void rs_checkpoint_close(rs_checkpoint *ck)
{
	for (size_t i = 0; i < ck->nentries; i++)
		free(ck->entries[i].name);
	free(ck->entries);
	for (size_t i = 0; i < ck->narrays; i++)
		free(ck->arrays[i].zarray_text);
	free(ck->arrays);
	for (size_t i = 0; i < ck->nblobs; i++)
		free(ck->blobs[i].fqn);
	free(ck->blobs);
	if (ck->extra_free)
		ck->extra_free(ck->extra);
	rs_catalog_free(&ck->catalog);
	rs_sources_free(ck->sources);
	free(ck->root_path);
	memset(ck, 0, sizeof(*ck));
}

/* Which source entries a view carries: files not hidden (what the view
 * rewrites), not byte items, not in a zarr array directory, not a dist
 * checkpoint's metadata.json (the view is not one); a directory only if
 * something inside it is carried.  Parents come before children, so one
 * backward pass settles directories. */
static int mark_carried(const rs_checkpoint *ck, bool *carried)
{
	bool *in_array = calloc(ck->nentries + 1, sizeof(bool));
	bool dist = ck->format == RS_FORMAT_ZARR ||
		    ck->format == RS_FORMAT_TORCH_DIST;

	if (!in_array)
		return -ENOMEM;
	for (size_t a = 0; a < ck->narrays; a++)
		in_array[ck->arrays[a].dir_entry] = true;
	for (size_t i = 0; i < ck->nentries; i++) {
		const rs_entry *e = &ck->entries[i];

		if (e->parent >= 0 && in_array[e->parent])
			in_array[i] = true;
		carried[i] = !e->is_dir && !e->hidden && !e->blob &&
			     !in_array[i] &&
			     !(dist && e->parent < 0 &&
			       strcmp(e->name, "metadata.json") == 0);
	}
	for (size_t i = ck->nentries; i-- > 0;)
		if (carried[i] && ck->entries[i].parent >= 0)
			carried[ck->entries[i].parent] = true;
	free(in_array);
	return 0;
}

int rs_checkpoint_carry(const rs_checkpoint *ck, rs_vtree *t)
{
	bool *carried = calloc(ck->nentries + 1, sizeof(bool));
	uint32_t *node = calloc(ck->nentries + 1, sizeof(uint32_t));
	int err = carried && node ? mark_carried(ck, carried) : -ENOMEM;

	for (size_t i = 0; i < ck->nentries && !err; i++) {
		const rs_entry *e = &ck->entries[i];
		uint32_t parent = e->parent < 0 ? 0 : node[e->parent];

		if (!carried[i])
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
	free(carried);
	return err;
}

int rs_checkpoint_build_view(const rs_checkpoint *ck, rs_format view,
			     const rs_layout *l, rs_vtree *t, rs_diag *d)
{
	size_t lines = rs_diag_count(d);
	int err = rs_vtree_init(t, ck->root_mtime);

	if (err)
		return err;
	if (view == 0)
		view = rs_format_default_view(ck->format);
	switch (view) {
	case RS_FORMAT_ZARR:
		err = rs_zarr_build_view(ck, l, t, d);
		break;
	case RS_FORMAT_TORCH_DIST:
		err = rs_dcp_build_view(ck, l, t, d);
		break;
	case RS_FORMAT_MEGATRON:
		err = rs_megatron_build_view(ck, l, t, d);
		break;
	case RS_FORMAT_SAFETENSORS:
		err = rs_safetensors_build_view(ck, l, t, d);
		break;
	default:
		rs_diag_add(d, "%s: there is no %s view (choose -o format=)",
			    ck->root_path, rs_format_name(view));
		err = -EINVAL;
	}
	/* Two things of one name in the view (a tensor or byte item and a
	 * file of SOURCE): the tree refuses the second; say so, not "File
	 * exists". */
	if (err == -EEXIST && rs_diag_count(d) == lines) {
		rs_diag_add(d, "%s: a file or directory of SOURCE has the name of a tensor or byte item the %s view writes",
			    ck->root_path, rs_format_name(view));
		err = -EINVAL;
	}
	return err;
}

int rs_format_parse(const char *name, rs_format *out)
{
	static const rs_format views[] = {
		RS_FORMAT_ZARR, RS_FORMAT_TORCH_DIST, RS_FORMAT_MEGATRON,
		RS_FORMAT_SAFETENSORS,
	};

	for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
		if (strcmp(name, rs_format_name(views[i])) == 0) {
			*out = views[i];
			return 0;
		}
	return -EINVAL;
}

rs_format rs_format_default_view(rs_format source)
{
	/* metaseq shards have no view of their own: they are read to be
	 * loaded elsewhere, and safetensors is what any loader reads. */
	return source == RS_FORMAT_METASEQ ? RS_FORMAT_SAFETENSORS : source;
}
