/* checkpoint: a parsed SOURCE, whatever its format, and the view of it.
 *
 * rs_checkpoint_open recognises the format (FORMATS.md §1: a Megatron dist
 * checkpoint has metadata.json naming its backend), parses all metadata
 * (never tensor data), and fills a catalog, the table of source files, and
 * the list of entries passed through unchanged.  rs_checkpoint_build_view
 * turns it plus a resolved layout into the virtual tree.
 *
 * Errors: every problem found is reported to the diag list as one line
 * naming the file (or tensor) and what is wrong; the functions then return
 * -EINVAL.  Other negative errnos are resource failures.
 * Ownership: the checkpoint owns everything it points to.
 */
#ifndef RS_CHECKPOINT_H
#define RS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "planner/catalog.h"
#include "planner/diag.h"
#include "planner/layout.h"
#include "planner/rules.h"
#include "planner/source.h"
#include "planner/vtree.h"

typedef enum {
	RS_FORMAT_ZARR = 1,
	RS_FORMAT_TORCH_DIST,
	RS_FORMAT_MEGATRON,     /* legacy per-rank mp_rank_TT[_PPP] files
				 * (formats/megatron.h) */
	RS_FORMAT_METASEQ,      /* metaseq/fairscale flat shards, a source
				 * only (formats/metaseq.h) */
	RS_FORMAT_SAFETENSORS,  /* formats/safetensors.h */
} rs_format;

/* What rs_checkpoint_open needs besides SOURCE. */
typedef struct {
	const rs_rules *rules;    /* sharding rules (user's first); NULL:
				   * the built-ins.  Per-rank readers need
				   * them to place each rank's copy */
	const char *params_file;  /* -o params=FILE: names and shapes of a
				   * metaseq checkpoint's flat params, when
				   * its files lack shard_metadata */
} rs_open_opts;

/* A file or directory copied into the view unchanged.  `parent` is the
 * index of the enclosing passthrough directory, or -1 for SOURCE itself;
 * directories come before their contents. */
typedef struct {
	char *name;
	long parent;
	bool is_dir;
	uint32_t source;        /* files: index in the source table */
	struct timespec mtime;
	bool hidden;            /* replaced by what the view writes */
	bool blob;              /* also listed as a byte item (rs_blob) */
} rs_entry;

/* A zarr array: a directory with a .zarray, chunk files and perhaps other
 * files (listed as entries whose parent is `dir_entry`). */
typedef struct {
	size_t tensor;          /* index in the catalog */
	long dir_entry;         /* its directory in the entry list */
	uint32_t zarray_source;
	char *zarray_text;
	size_t zarray_len;
} rs_zarr_array;

/* An opaque byte item of a torch_dist checkpoint (a ShardedObject,
 * `<key>/shard_<offsets>_<shape>`): bytes [offset, offset+length) of a
 * source file, carried into any view unchanged. */
typedef struct {
	char *fqn;
	uint32_t source;
	uint64_t offset, length;
	bool listed;            /* torch_dist's [object], not the bare object */
} rs_blob;

typedef struct {
	rs_format format;
	char *root_path;
	struct timespec root_mtime;
	rs_catalog catalog;
	rs_sources *sources;
	rs_entry *entries;
	size_t nentries, cap_entries;
	rs_zarr_array *arrays;
	size_t narrays, cap_arrays;
	rs_blob *blobs;
	size_t nblobs, cap_blobs;
	/* What a format's reader keeps for its own view (the legacy
	 * Megatron args, say), freed with extra_free at close. */
	void *extra;
	void (*extra_free)(void *extra);
} rs_checkpoint;

int rs_checkpoint_open(const char *root, const rs_open_opts *o,
		       rs_checkpoint *ck, rs_diag *d);
void rs_checkpoint_close(rs_checkpoint *ck);

/* Reads the small metadata file `relpath` under SOURCE whole (beneath
 * SOURCE only, a regular file of at most `max` bytes), NUL-terminated;
 * *st receives its stat (may be NULL).  -ENOENT when it does not exist (no
 * line reported); any other problem is reported as one line and gives
 * -EINVAL (or -ENOMEM).  The caller frees *buf. */
int rs_checkpoint_read_file(const rs_checkpoint *ck, const char *relpath,
			    size_t max, char **buf, size_t *len,
			    struct stat *st, rs_diag *d);

/* Builds the view in format `view` (0: the source's own format). */
int rs_checkpoint_build_view(const rs_checkpoint *ck, rs_format view,
			     const rs_layout *l, rs_vtree *t, rs_diag *d);

/* For views that write their own files beside the source's other files
 * (torch_dist, safetensors): adds every passthrough file of SOURCE to the
 * tree, under its directories - not hidden entries (what the source's
 * reader marked as replaced by the view), byte items, zarr array
 * directories, or a dist checkpoint's metadata.json. */
int rs_checkpoint_carry(const rs_checkpoint *ck, rs_vtree *t);

/* Name of the format, for logs and stats; and back ("zarr",
 * "torch_dist", "megatron", "metaseq", "safetensors"), -EINVAL for an
 * unknown name. */
const char *rs_format_name(rs_format f);
int rs_format_parse(const char *name, rs_format *out);

/* The view a source is shown as without -o format=: its own format, or
 * safetensors for metaseq shards. */
rs_format rs_format_default_view(rs_format source);

#endif
