/* snapshot: whole view files materialised into shared memory.
 *
 * The FUSE-free half of passthrough (fs/passthrough.h hands a snapshot's
 * file to the kernel, which then serves reads and mmap from it without the
 * daemon).  A snapshot of view file `node` holds every byte of the file,
 * assembled window by window (RS_BLOCK_SIZE bytes, written whole): literal
 * bytes, zeros, source ranges read with pread, tensor ranges built block
 * by block through the executor (rs_blocks_build_into); a window of
 * nothing but zero segments is left a hole (it reads as zeros and takes
 * no memory).  Every read of a source runs between two
 * checks of the files it reads (rs_blocks_gather), as a block build
 * does, so a snapshot holds the bytes the sources held as recorded at
 * mount or the build fails (-ESTALE); nothing of a failed build is kept.
 *
 * A snapshot is an unnamed file on the store's private huge-page tmpfs
 * (fs/huge_tmpfs.h), reopened read-only once built, where asked for and
 * the daemon can make one (CAP_SYS_ADMIN); otherwise a memfd, sealed once built
 * (F_SEAL_WRITE, SHRINK, GROW, SEAL).  Either way no descriptor the
 * daemon holds can change its bytes afterwards.
 *
 * Memory: a snapshot's size is charged to the block cache's budget
 * (rs_cache_charge) before it is built, so blocks and snapshots share
 * cache_size.  Snapshots held by open files are never freed; the others
 * stay, for the next open of their file, until the cache needs their
 * bytes: it reclaims them least recently used first (rs_cache_reclaim).
 * Builds of one file are single flight: a second open waits for the
 * first one's build and shares it.  A large file is built in parts, by
 * its opener and the store's build threads side by side (snapshot.c,
 * "building"); without build threads the opener builds every part.  (Pages a reader keeps mapped after
 * the snapshot is freed stay with its mapping, outside the budget.)
 *
 * Errors: 0 or a negative errno.  rs_snapshots_get: -E2BIG when the file
 * is larger than the store's max_size; -ENOSPC when its bytes do not fit
 * in the budget beside what open files hold; -ESTALE (logged by
 * fs/blocks.c) when a source changed during the build; the build's own
 * error otherwise (-EIO for a failed source read).
 * Thread safety: every function may be called from any thread.
 * Ownership: the store owns the snapshots and their descriptors; a caller
 * owns one reference per successful rs_snapshots_get. */
#ifndef RS_SNAPSHOT_H
#define RS_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "fs/blocks.h"
#include "planner/vtree.h"

typedef struct rs_snapshots rs_snapshots;
typedef struct rs_snapshot rs_snapshot;

typedef struct {
	uint64_t files;          /* snapshots held (open or idle) */
	uint64_t bytes;          /* their bytes (charged to the cache) */
	uint64_t bytes_peak;     /* the most held at once */
	uint64_t builds;         /* snapshots built */
	uint64_t bytes_built;    /* bytes of view files built */
	uint64_t build_ns;       /* time spent building */
	uint64_t build_errors;   /* builds that failed */
	uint64_t reuses;         /* gets served by a snapshot already held */
	uint64_t evictions;      /* idle snapshots freed for the budget */
	uint64_t parts;          /* parts built, of the builds that succeeded */
	uint64_t parts_on_threads;  /* parts the build threads took */
	uint64_t build_threads;  /* build threads running */
	bool huge_pages;         /* built on the huge-page tmpfs (known from
	                          * the first build on), not in memfds */
	char small_because[96];  /* why not, once known ("" otherwise) */
} rs_snapshot_stats;

/* Where snapshots live (-o snapshot_pages=): the huge-page tmpfs where
 * the daemon may make one (HUGE), memfds (SMALL), or HUGE unless the
 * machine is a VM whose host takes freed memory back (AUTO;
 * fs/huge_tmpfs.h says why). */
typedef enum { RS_PAGES_AUTO, RS_PAGES_HUGE, RS_PAGES_SMALL } rs_snapshot_pages;

/* The most build threads a store runs (-o threads= is at most
 * RS_MAX_THREADS, gpu/executor.h). */
#define RS_SNAPSHOT_MAX_THREADS 1024

/* A store for the files of `tree`, built through `blocks` (both borrowed:
 * they must outlive the store), none larger than max_size bytes, in the
 * pages `pages` asks for (decided at the first build).  It registers
 * itself as blocks->cache's reclaim callback. */
int rs_snapshots_new(rs_snapshots **out, const rs_blocks *blocks,
		     const rs_vtree *tree, uint64_t max_size,
		     rs_snapshot_pages pages);
/* Starts up to `threads` build threads (after fuse_daemonize: threads
 * do not survive its fork).  0, or a negative errno with the threads
 * started so far kept running. */
int rs_snapshots_start(rs_snapshots *s, unsigned threads);
/* Every reference must have been released; stops the build threads.
 * NULL is a no-op. */
void rs_snapshots_free(rs_snapshots *s);

/* The snapshot of file `node`: held, or built now.  *reused (may be NULL)
 * tells which. */
int rs_snapshots_get(rs_snapshots *s, uint32_t node, rs_snapshot **out,
		     bool *reused);
void rs_snapshots_release(rs_snapshots *s, rs_snapshot *snap);

/* The snapshot's read-only or sealed descriptor (owned by the store) and
 * its size. */
int rs_snapshot_fd(const rs_snapshot *snap);
uint64_t rs_snapshot_size(const rs_snapshot *snap);

/* Frees the snapshot of `node` if no open file holds it (its sources
 * changed: it will not be served again). */
void rs_snapshots_drop(rs_snapshots *s, uint32_t node);

void rs_snapshots_get_stats(rs_snapshots *s, rs_snapshot_stats *st);

#endif
