/* blocks: tensor blocks built into the cache, and the checked
 * gathers every read of source bytes goes through.
 *
 * The FUSE-free core of the read path: fs/read.c assembles replies from
 * what it gives, the prefetch threads (fs/prefetch.h) build blocks ahead
 * through it, and unit tests build blocks with no mount at all.  Nothing
 * here knows FUSE; it needs only a source table, an executor and a cache.
 *
 * A chunk (planner/vtree.h) is served in blocks of RS_BLOCK_SIZE bytes of
 * its view bytes: block i holds [i*RS_BLOCK_SIZE, (i+1)*RS_BLOCK_SIZE),
 * the last one what is left.  A block is built on a cache miss by slicing
 * the chunk's plan and running the slice on the executor.
 *
 * Source files can change while they are read, so every gather from them
 * - a block build, the source ranges of a reply - runs between two checks
 * of the files it reads through their descriptors (rs_sources_verify):
 * its bytes are used only when both find the recorded identity, and a
 * build that saw a change is never cached.
 *
 * Errors: functions return 0 or a negative errno; -ESTALE (logged, naming
 * the file) when a source no longer matches its recorded identity or kept
 * changing while it was read.
 * Thread safety: every function may be called from any thread.
 */
#ifndef RS_BLOCKS_H
#define RS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "fs/cache.h"
#include "gpu/executor.h"
#include "planner/source.h"
#include "planner/vtree.h"

/* Tensor segments are materialised and cached in blocks of this size. */
#define RS_BLOCK_SIZE (4ull << 20)

/* What blocks are built with.  Every pointer is borrowed: the owner keeps
 * them alive while any block is built or gather runs. */
typedef struct {
	rs_sources *sources;
	rs_executor *exec;
	rs_cache *cache;
	const char *root_path;      /* SOURCE, for log lines */
} rs_blocks;

/* Block `index` of chunk `c`, from the cache or built now: a reference the
 * caller returns with rs_cache_release(b->cache, *out).  -EINVAL when the
 * chunk has no such block; a failed build's error, with nothing of it
 * cached (the next call builds it again). */
int rs_blocks_get(const rs_blocks *b, const rs_chunk *c, uint64_t index,
		  rs_block **out);

/* Block `index` of chunk `c` built into buf (rs_blocks_block_len bytes),
 * as rs_blocks_get builds it on a miss - the plan's slice run by the
 * executor between two checks of its sources - but neither looked up in
 * nor kept in the cache: for a caller that keeps the bytes itself (the
 * memfd snapshots of fs/snapshot.h).  0, -EINVAL when the chunk has no
 * such block, or the build's error (buf's bytes are then not valid). */
int rs_blocks_build_into(const rs_blocks *b, const rs_chunk *c,
			 uint64_t index, uint8_t *buf);

/* Bytes of block `index` of chunk c (0 past its end). */
uint64_t rs_blocks_block_len(const rs_chunk *c, uint64_t index);

/* A byte range of one source file that a gather reads. */
typedef struct {
	uint32_t source;
	uint64_t off, len;
} rs_source_span;

/* The distinct sources a gather reads, and, where the source table has a
 * provider (planner/source.h), the ranges it reads of them.  Zero-
 * initialise; the caller owns the arrays and frees them with
 * rs_source_set_free. */
typedef struct {
	uint32_t *v;
	size_t n, cap;
	rs_source_span *spans;
	size_t nspans, spans_cap;
} rs_source_set;

/* Adds source `index` unless it is there already.  0 or -ENOMEM. */
int rs_source_set_add(rs_source_set *set, uint32_t index);

/* Adds source `index` and the range [off, off+len) of it that the gather
 * reads.  0 or -ENOMEM. */
int rs_source_set_add_span(rs_source_set *set, uint32_t index, uint64_t off,
			   uint64_t len);
void rs_source_set_free(rs_source_set *set);

/* Runs gather(arg), which reads only sources in `set` (with a provider:
 * only the spans of the set, acquired from it for the gather and released
 * after), between two checks
 * of each of them (rs_sources_verify): 0 when both found every one as
 * recorded; gather's own error; -ESTALE (logged) when one changed.  Bytes
 * gather wrote are valid only on 0.  gather may be NULL: the sources are
 * then checked once (a reply served from cached blocks alone). */
int rs_blocks_gather(const rs_blocks *b, rs_source_set *set,
		     int (*gather)(void *arg), void *arg);

#endif
