/* fs: the daemon's state and its FUSE lowlevel operations.
 *
 * This is the only layer that knows FUSE and the only place where errors
 * become errno replies.  Inode numbers: tree index + 1 for the view; two
 * more past the tree for the hidden control directory `.reshardfs` and its
 * `stats` file.
 */
#ifndef RS_FS_H
#define RS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "formats/open.h"
#include "fs/blocks.h"
#include "fs/group.h"
#include "fs/passthrough.h"
#include "fs/prefetch.h"
#include "fs/snapshot.h"
#include "planner/layout.h"
#include "planner/vtree.h"

/* Largest read reply, and the request size asked of the kernel. */
#define RS_MAX_READ (1u << 20)

/* Blocks a sequential reader asks for ahead of itself (fs/prefetch.h). */
#define RS_PREFETCH_AHEAD (2 * RS_BLOCK_SIZE)

typedef struct rs_open_file rs_open_file;

struct rs_fs {
	rs_checkpoint ck;
	rs_layout layout;
	rs_vtree tree;
	/* The block builder's context: sources and root_path borrowed from ck,
	 * exec and cache owned here (made in main, freed at teardown). */
	rs_blocks blocks;
	rs_prefetch *prefetch;
	/* Passthrough (fs/passthrough.h) and its memfd snapshots, made in
	 * main after the cache. */
	rs_snapshots *snapshots;
	rs_passthrough *pt;
	/* The read-once group (-o group=, fs/group.h), or NULL: the
	 * provider of ck's sources while the session runs. */
	rs_group *group;
	fuse_ino_t ctl_ino, stats_ino;
	const rs_format_def *view_format;
	_Atomic uint64_t bytes_served;
	_Atomic uint64_t reads;
	_Atomic uint64_t read_errors;
	/* Last file a sequential reader read to its end (node index + 1; 0:
	 * none), to spot readers that walk a directory in readdir order. */
	_Atomic uint32_t last_finished;
	pthread_mutex_t open_lock;
	rs_open_file *open_files;       /* every record not yet released */
};

/* State of one open file (fuse_file_info.fh): for a view file, how it is
 * served (the read path or passthrough), where the last read ended and how far ahead prefetch has been asked, to spot
 * sequential readers (races between reads on one handle only blur the
 * guess); for the stats file, the text generated at open.  Records are
 * kept on a list so that those the kernel never releases (files still open
 * at unmount) are freed at exit. */
typedef struct rs_open_file {
	struct rs_open_file *prev, *next;
	char *text;                     /* the stats file's JSON, else NULL */
	uint32_t node;
	rs_pt_open pt;                  /* how a view file is served */
	_Atomic uint64_t last_end;
	_Atomic uint64_t prefetched_to;
	/* This file follows, in readdir order, the last file read to its
	 * end: prefetch may run on into the files after it. */
	_Atomic bool in_dir_order;
	/* Bumped (release) when a read is done with the record and read
	 * (acquire) before release frees it.  The kernel already orders the
	 * two - RELEASE comes after every READ's reply - but through
	 * /dev/fuse, where thread checkers cannot see it. */
	_Atomic uint64_t reads_done;
} rs_open_file;

extern const struct fuse_lowlevel_ops rs_fs_ops;

/* Open-file records (fs/open_files.c).  new: a zeroed record on the list
 * (NULL when out of memory); release: off the list and freed, with its
 * text; free_all: every record left, at exit.  open_lock must have been
 * initialised. */
rs_open_file *rs_open_file_new(rs_fs *fs, uint32_t node);
void rs_open_file_release(rs_fs *fs, rs_open_file *of);
void rs_open_files_free_all(rs_fs *fs);

/* read(2) of a view file: replies with data or an error.  `of` (may be
 * NULL) is the open file, for sequential-read detection. */
void rs_fs_read(rs_fs *fs, fuse_req_t req, const rs_vnode *n,
		rs_open_file *of, size_t size, off_t off);

/* Checks every source a file is built from; -ESTALE (logged) when one
 * changed since mount. */
int rs_fs_check_sources(rs_fs *fs, const rs_vnode *n);

/* The user.reshardfs.sources xattr value of a file (malloc'd text). */
int rs_fs_sources_xattr(rs_fs *fs, const rs_vnode *n, char **out,
			size_t *len);

/* --dry-run: the view's format, layout, sizes and (verbose) each
 * tensor's split, printed to out (fs/dry_run.c). */
void rs_fs_dry_run(const rs_fs *fs, bool verbose, FILE *out);

/* The stats JSON document (malloc'd). */
char *rs_fs_stats_json(rs_fs *fs, size_t *len);

#endif
