/* checkpoint: the model every format shares - a parsed SOURCE, whatever
 * its format - and the one walker that lists SOURCE into it.
 *
 * A reader (one per folder under formats/, listed in formats/open.c) fills
 * an rs_checkpoint from SOURCE: a catalog of tensors (planner/catalog.h),
 * the table of source files their bytes live in (planner/source.h), the
 * entries (every file and directory of SOURCE, for views to pass through)
 * and the byte items (opaque blobs every view carries).  Metadata only:
 * no tensor byte is read.  A view builder then turns the checkpoint plus a
 * resolved layout into the virtual tree (planner/vtree.h).
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

#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"
#include "formats/facts.h"
#include "formats/model.h"
#include "planner/catalog.h"
#include "planner/diag.h"
#include "planner/layout.h"
#include "planner/rules.h"
#include "planner/source.h"
#include "planner/vtree.h"

typedef struct rs_checkpoint rs_checkpoint;

/* What a reader needs besides SOURCE (one struct for every reader, so
 * that they share one signature). */
typedef struct {
	const rs_rules *rules;    /* sharding rules (user's first); NULL:
				   * the built-ins.  Per-rank readers need
				   * them to place each rank's copy */
	const char *params_file;  /* -o params=FILE: names and shapes of a
				   * metaseq checkpoint's flat params, when
				   * its files lack shard_metadata */
	const char *hf_config;    /* -o hf_config=FILE: the config.json of
				   * a source under HF names that has none
				   * (DeepSpeed) */
	/* Limits on what a checkpoint may make the mount parse and hold
	 * (0: the defaults below; -o max_tensors=, -o max_metadata=). */
	uint64_t max_tensors, max_metadata;
} rs_open_opts;

/* A 1.3M-tensor safetensors header took 14 s and 1.8 GiB to mount; the
 * largest real models have about 100k tensors (DeepSeek-V3's HF files:
 * 92k) and well under 100 MB of headers and pickles together. */
#define RS_DEFAULT_MAX_TENSORS (1ull << 18)
#define RS_DEFAULT_MAX_METADATA (1ull << 30)

/* What a top-level name of SOURCE says to a format's detector. */
typedef enum {
	RS_DETECT_NONE = 0,
	RS_DETECT_FILES,        /* a name this format's files have; several
				 * formats' files at once are refused */
	RS_DETECT_MARKER,       /* decides alone (torch_dist's .metadata) */
} rs_detect;

/* One checkpoint format: a row of the format table (formats/open.c).
 * Each format's folder defines its row; only the table lists them. */
typedef struct {
	const char *name;       /* as -o format=, logs and stats spell it */
	/* Detection.  dist_backend: the "sharded_backend" of a Megatron dist
	 * checkpoint's metadata.json that names this format (NULL: not a
	 * dist format).  detect: what a top-level name of a SOURCE without
	 * metadata.json says (NULL: nothing); looks_like says what it looks
	 * for, for the refusal of a SOURCE no format claims. */
	const char *dist_backend;
	rs_detect (*detect)(const char *name, mode_t mode);
	const char *looks_like;
	/* Fills ck (ck->sources open, ck->format this row) from SOURCE. */
	int (*read)(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);
	/* Builds this format's view of any checkpoint into t (initialised);
	 * NULL: a source only. */
	int (*build_view)(const rs_checkpoint *ck, const rs_layout *l,
			  rs_vtree *t, rs_diag *d);
	/* The view shown without -o format=: NULL for this format's own,
	 * else the name of another row. */
	const char *default_view;
	/* The view is what Megatron's --load reads: of a checkpoint root it
	 * is a root too (the tracker, the root's other files, and the view
	 * inside the tracked iteration's directory). */
	bool keeps_root;
} rs_format_def;

/* A file or directory of SOURCE.  `parent` is the index of the enclosing
 * directory's entry, or -1 for SOURCE itself; directories come before
 * their contents. */
typedef struct {
	char *name;
	long parent;
	bool is_dir;
	uint32_t source;        /* files: index in the source table */
	struct timespec mtime;
	bool hidden;            /* the source format's own storage of its
				 * tensors: replaced by what a view writes */
	bool blob;              /* also listed as a byte item (rs_blob) */
} rs_entry;

/* An opaque byte item (a Megatron ShardedObject, `<key>/shard_<offsets>_
 * <shape>`): bytes [offset, offset+length) of a source file, carried into
 * any view unchanged.  Shared by the model, not one format's: the zarr and
 * torch_dist readers both find them, and the zarr and torch_dist views
 * both write them (rs_checkpoint_append_blob converts between the two
 * backends' forms). */
typedef struct {
	char *fqn;
	uint32_t source;
	uint64_t offset, length;
	bool listed;            /* torch_dist's [object], not the bare object */
	/* An item no source stores, made for the view (the bridge's None
	 * _extra_state for megatron-core): its torch.save bytes, bare
	 * (made[0]) and listed (made[1]), owned; NULL for a stored item. */
	uint8_t *made[2];
	size_t made_len[2];
} rs_blob;

/* A file no source stores, made for the view at its top (the bridge's
 * common.pt for megatron-core): bytes owned. */
typedef struct {
	char *name;
	uint8_t *bytes;
	size_t len;
} rs_made_file;


struct rs_checkpoint {
	const rs_format_def *format;
	char *root_path;        /* SOURCE as given; source-table paths are
				 * relative to it */
	struct timespec root_mtime;
	/* The checkpoint root form (a Megatron --save directory holding
	 * latest_checkpointed_iteration.txt and iter_XXXXXXX/): iter_dir is
	 * the tracked iteration's directory, which the reader reads as if it
	 * were SOURCE, and `outer` lists the root's other files and
	 * directories (the tracker among them; no iteration directory), for
	 * views that keep the root (rs_format_def.keeps_root).  Otherwise
	 * iter_dir is NULL and outer empty.  dir_path is the checkpoint
	 * directory as messages name it: root_path, or root_path/iter_dir. */
	char *iter_dir;
	char *dir_path;
	rs_entry *outer;
	size_t nouter, cap_outer;
	rs_catalog catalog;
	rs_sources *sources;
	rs_entry *entries;
	size_t nentries, cap_entries;
	rs_blob *blobs;
	size_t nblobs, cap_blobs;
	rs_made_file *made;
	size_t nmade;
	rs_model_facts facts;
	/* The architecture, where the reader knows it (the metaseq reader,
	 * from cfg) or the bridge gathered it (formats/bridge/bridge.h);
	 * family NULL otherwise: what the hf view writes its config.json
	 * from (formats/model.h). */
	rs_model_config model;
	/* Metadata bytes parsed so far (rs_checkpoint_charge), and the
	 * limits from rs_open_opts. */
	uint64_t metadata_bytes, max_metadata, max_tensors;
	/* What a format's reader keeps for its own view (the legacy Megatron
	 * args, the zarr array texts), freed with extra_free at close.  A
	 * view reads it only when ck->format is its own format's row. */
	void *extra;
	void (*extra_free)(void *extra);
	/* What the reader says of SOURCE beyond the catalog, lines for
	 * --dry-run, and a note a mount prints (a choice it made between
	 * two things SOURCE holds); NULL: none.  Owned. */
	char *describe;
	char *notice;
};

/* Sets up ck for SOURCE `root` (the path as given, trailing slashes cut):
 * checks it is a directory, opens the source table on it.  Reported
 * refusals give -EINVAL.  rs_checkpoint_close undoes it, also on error. */
int rs_checkpoint_init(rs_checkpoint *ck, const char *root, rs_diag *d);
void rs_checkpoint_close(rs_checkpoint *ck);

/* Reads the small metadata file `relpath` of the checkpoint directory
 * (SOURCE, or the tracked iteration in the root form) whole (beneath
 * SOURCE only, a regular file of at most `max` bytes), NUL-terminated;
 * *st receives its stat (may be NULL).  -ENOENT when it does not exist (no
 * line reported); any other problem is reported as one line and gives
 * -EINVAL (or -ENOMEM).  The caller frees *buf. */
int rs_checkpoint_read_file(rs_checkpoint *ck, const char *relpath,
			    size_t max, char **buf, size_t *len,
			    struct stat *st, rs_diag *d);

/* Counts `bytes` of metadata about to be parsed from file `path` (as
 * messages name it) against the checkpoint's limit: -EINVAL with one line
 * naming the file and the option when it would pass max_metadata.
 * rs_checkpoint_read_file charges what it reads; readers charge the
 * headers and the data.pkl pickles of torch.save files they read
 * themselves. */
int rs_checkpoint_charge(rs_checkpoint *ck, uint64_t bytes, const char *path,
			 rs_diag *d);

/* For views that write their own files beside the source's other files
 * (torch_dist, safetensors): adds every passthrough file of SOURCE to the
 * tree, under its directories - not hidden entries, byte items, or a dist
 * checkpoint's metadata.json. */
int rs_checkpoint_carry(const rs_checkpoint *ck, rs_vtree *t);

/* Removes (and frees) every byte item whose fqn starts with `prefix`. */
void rs_checkpoint_drop_blobs(rs_checkpoint *ck, const char *prefix);

/* The data.pkl of the torch.save zip at [offset, offset + length) of
 * source `source` (a common.pt, a ShardedObject item), parsed with
 * rs_megatron_allow; `tensors` allows torch storage persistent ids.  *pk
 * is set on success, the caller's to free.  -EINVAL with what is wrong in
 * msg; -ENOMEM. */
int rs_checkpoint_read_pickle(rs_checkpoint *ck, uint32_t source,
			      uint64_t offset, uint64_t length, bool tensors,
			      rs_pickle **pk, char *msg, size_t size);

/* Opens the torch.save file `source` (`path` as messages name it): its
 * zip into *z and its data.pkl (at most `max` bytes, charged to the
 * metadata limit) parsed with the allowlist `allow` into *pk.  Problems
 * are reported as one line naming the file (-EINVAL); -ENOMEM.  The
 * caller frees *z and *pk, also on error.  _dict: the same, and the
 * pickle must be a dict (a checkpoint's top level). */
int rs_checkpoint_open_torch_save(rs_checkpoint *ck, uint32_t source,
				  const char *path, const char *const *allow,
				  size_t max, rs_zip *z, rs_pickle **pk,
				  rs_diag *d);
int rs_checkpoint_open_torch_dict(rs_checkpoint *ck, uint32_t source,
				  const char *path, const char *const *allow,
				  size_t max, rs_zip *z, rs_pickle **pk,
				  rs_diag *d);

/* A dist checkpoint's common.pt, when it has one with args, into
 * ck->facts (formats/facts.h).  A common.pt this cannot parse leaves the
 * facts unknown and does not refuse the checkpoint; args it parses whose
 * values are out of range do (-EINVAL, reported).  0 or -ENOMEM. */
int rs_checkpoint_read_common(rs_checkpoint *ck, rs_diag *d);

/* GLOBALs Megatron-LM's saved state may name (args with their enums and
 * paths, numpy rng state, the rerun state machine): the legacy reader's
 * allowlist, and common.pt's. */
extern const char *const rs_megatron_allow[];

/* What a view may write back of such state: the GLOBALs of real args and
 * the scalars beside them (narrower than what is read: no torch.*
 * function reaches a loader that unpickles with weights_only=False), and
 * the values of the enum members args hold (rs_pw_value). */
extern const char *const rs_megatron_copy_allow[];
extern const rs_pw_member rs_megatron_members[];

/* The root form.  rs_checkpoint_enter (formats/open.c, once it found the
 * tracked iteration `iter_dir`) lists the root's entries but iteration
 * directories into ck->outer and makes the iteration the checkpoint
 * directory.  rs_checkpoint_carry_outer adds those entries to the top of
 * a tree.  rs_is_iteration_name: "iter_<digits>" or "release". */
int rs_checkpoint_enter(rs_checkpoint *ck, const char *iter_dir, rs_diag *d);
int rs_checkpoint_carry_outer(const rs_checkpoint *ck, rs_vtree *t);
bool rs_is_iteration_name(const char *name);

/* The entry named `name` at the top of the checkpoint directory (a file
 * or a directory), or NULL. */
rs_entry *rs_checkpoint_top_entry(const rs_checkpoint *ck, const char *name);

/* Adds ck->made at the top of t (rs_checkpoint_carry does it too, for
 * views that carry SOURCE's files with it). */
int rs_checkpoint_add_made(const rs_checkpoint *ck, rs_vtree *t);

/* Appends byte item b to `file`, as a list item (`as_list`, torch_dist's
 * form) or a bare object (zarr's), converting when b->listed differs
 * (formats/codec/torch_object.h).  *length receives the bytes added. */
int rs_checkpoint_append_blob(const rs_checkpoint *ck, const rs_blob *b,
			      bool as_list, rs_vtree *t, uint32_t file,
			      uint64_t *length, rs_diag *d);

/* --- the SOURCE walker ---------------------------------------------------
 *
 * rs_checkpoint_walk lists the checkpoint directory (SOURCE, or the
 * tracked iteration in the root form) into ck->entries (an entry's parent
 * -1 is that directory), names sorted within
 * each directory, every regular file added to the source table with its
 * identity.  A symbolic link is followed only to a file inside SOURCE;
 * links to directories, special files, `.reshardfs` at the top (the
 * mount's control directory) and nesting past RS_WALK_MAX_DEPTH are
 * refused.  Each problem is one line; the walk goes on to report the rest
 * and returns -EINVAL at the end. */

#define RS_WALK_MAX_DEPTH 16

/* A directory met by the walk. */
typedef struct {
	int fd;                 /* open on it (the walker closes it) */
	const char *relpath;    /* beneath SOURCE */
	const char *name;
	long parent;            /* its parent's entry, -1: SOURCE */
	const struct stat *st;
	int depth;              /* of its contents */
} rs_walk_dir;

/* A reader's say in the walk (NULL: every directory is walked as it is).
 * `directory` is asked first about each directory: 0 when it has listed
 * the directory itself (a zarr array), RS_WALK_DESCEND to have it walked
 * as a plain one, or a negative errno (reported: -EINVAL). */
#define RS_WALK_DESCEND 1
typedef struct rs_walk_hooks {
	int (*directory)(rs_checkpoint *ck, const struct rs_walk_hooks *h,
			 const rs_walk_dir *dir, rs_diag *d);
	void *arg;
} rs_walk_hooks;

int rs_checkpoint_walk(rs_checkpoint *ck, const rs_walk_hooks *h,
		       rs_diag *d);
/* The walk of one directory's contents (open at dirfd, beneath SOURCE at
 * relpath, its entry `parent`), for hooks that descend themselves. */
int rs_checkpoint_walk_dir(rs_checkpoint *ck, const rs_walk_hooks *h,
			   int dirfd, const char *relpath, long parent,
			   int depth, rs_diag *d);

/* The walker's steps, for hooks.  add_entry: one entry (*index receives
 * its position; may be NULL).  add_file: a regular file to the source
 * table (anything else reported, -EINVAL).  stat: `name` in dirfd, a
 * symbolic link followed only inside SOURCE (reported, -EINVAL).
 * list_dir: the sorted names of a directory but . and .. (free with
 * rs_list_free).  join: "dir/name" (or "name") into out[PATH_MAX]. */
int rs_checkpoint_add_entry(rs_checkpoint *ck, const char *name, long parent,
			    bool is_dir, uint32_t source,
			    const struct stat *st, long *index);
int rs_checkpoint_add_file(rs_checkpoint *ck, const char *relpath,
			   const struct stat *st, uint32_t *index,
			   rs_diag *d);
int rs_checkpoint_stat(const rs_checkpoint *ck, int dirfd, const char *name,
		       const char *relpath, struct stat *st, rs_diag *d);
/* A walker's relpath (beneath SOURCE) as a path in the checkpoint
 * directory: past "iter_dir/" in the root form. */
const char *rs_checkpoint_local(const rs_checkpoint *ck, const char *relpath);
int rs_list_dir(int dirfd, char ***names, size_t *count);
void rs_list_free(char **names, size_t count);
int rs_path_join(char *out, const char *dir, const char *name);

#endif
