/* prefetch: work ahead of sequential readers.
 *
 * The kernel reads a FUSE file 128 KiB at a time, while a tensor block is
 * 4 MiB: without help, every 32nd request of a sequential reader waits for
 * a whole block to be gathered.  When a read continues where the last one
 * on the same open file ended, the read path asks for the next window: the
 * tensor blocks in it are built into the cache on the prefetch threads
 * (through the executor, like any miss).  Source ranges read straight into
 * replies are left to the kernel's own readahead on the source file: announcing
 * them as well (POSIX_FADV_WILLNEED) measured 25% slower from a cold
 * source (BENCHMARKS.md).  A reader that walks a directory in readdir order (it
 * opened the file after the one it last read to the end) also gets the
 * window continued past the end of a file into the next files, so `cp -r`
 * and a loader walking a directory find the next file's first block ready;
 * readers in any other order do not, since those blocks could be evicted
 * before their turn and read twice.
 *
 * Requests never block the caller: the queue is bounded and a full queue
 * drops the request (prefetch is advice).  Blocks already cached or being
 * built are skipped, and so are blocks reads have taken whole before
 * (rs_prefetch_read_whole): their bytes are in the readers' page cache,
 * and building one again after the cache let it go is a second read of
 * its sources that no reader asked for (with 4 ranks reading a
 * torch_dist view through a 256 MiB cache, prefetch windows that ran into
 * the next files in readdir order rebuilt blocks other ranks had read:
 * BENCHMARKS.md).  Prefetched blocks live in the cache under its budget
 * like any other.
 *
 * Thread safety: rs_prefetch_window may be called from any thread.
 */
#ifndef RS_PREFETCH_H
#define RS_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "planner/vtree.h"

typedef struct rs_fs rs_fs;
typedef struct rs_prefetch rs_prefetch;

/* Starts `threads` prefetch threads (after fuse_daemonize). */
int rs_prefetch_start(rs_prefetch **out, rs_fs *fs, unsigned threads);
/* Stops the threads; queued requests are dropped.  NULL is a no-op. */
void rs_prefetch_stop(rs_prefetch *p);

/* Asks for bytes [from, from+len) of file `node` of the view; with
 * `into_next`, continuing into the next files of its directory when the
 * range runs past its end. */
void rs_prefetch_window(rs_prefetch *p, uint32_t node, uint64_t from,
			uint64_t len, bool into_next);

/* The file before `node` in its directory's readdir order, or UINT32_MAX. */
uint32_t rs_prefetch_prev_sibling(const rs_vtree *t, uint32_t node);

/* A read took every byte of block `index` of chunk c. */
void rs_prefetch_read_whole(rs_prefetch *p, const rs_chunk *c,
			    uint64_t index);

/* Blocks built ahead of readers so far. */
uint64_t rs_prefetch_blocks(const rs_prefetch *p);

#endif
