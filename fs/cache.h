/* cache: bounded, LRU, single-flight store of materialised blocks.
 *
 * A block is identified by (chunk id, block index) and holds `len` bytes.
 * rs_cache_get returns a referenced block: on a hit at once; on a miss the
 * caller's `build` callback fills a fresh buffer while every other caller
 * asking for the same block waits for that one build (single flight).  A
 * failed build is not cached: its waiters get the same error, and the next
 * caller tries again.
 *
 * Memory: the bytes of all blocks - ready, being built and compressed -
 * and the bytes charged to it from outside (rs_cache_charge: the memfd
 * snapshots of fs/snapshot.h) stay within `budget`, except that blocks in
 * use (referenced) are never freed, so the cache can exceed it by the
 * blocks readers hold at once.  When evicting every unreferenced block is
 * not enough, the cache asks the owner of the charged bytes to give some
 * back (rs_cache_set_reclaim).
 * Eviction is least recently used first, except that blocks every byte of
 * which reads have taken (rs_cache_mark_read) go before all others.
 * With `compress`, blocks leaving the hot half of the budget are kept LZ4-
 * compressed in the cold half when that saves at least an eighth; a hit on
 * a cold block decompresses it back.
 *
 * Ownership: the cache owns blocks; a caller owns one reference per
 * successful rs_cache_get and returns it with rs_cache_release.  Data of a
 * referenced block stays valid and unchanged until released.
 * Thread safety: all functions may be called from any thread.
 */
#ifndef RS_CACHE_H
#define RS_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rs_cache rs_cache;
typedef struct rs_block rs_block;

/* Fills buf[0..len); returns 0 or a negative errno. */
typedef int (*rs_block_build)(void *arg, uint8_t *buf, uint64_t len);

typedef struct {
	uint64_t hits;
	uint64_t misses;
	uint64_t bytes;            /* bytes held, all states */
	uint64_t blocks;
	uint64_t cold_blocks;      /* held compressed */
	uint64_t evictions;
	uint64_t budget;
	uint64_t charged;          /* rs_cache_charge'd bytes held */
} rs_cache_stats;

int rs_cache_new(rs_cache **out, uint64_t budget, bool compress);
/* All references must have been released. */
void rs_cache_free(rs_cache *c);

int rs_cache_get(rs_cache *c, uint64_t chunk, uint64_t index, uint64_t len,
		 rs_block_build build, void *arg, rs_block **out);
/* Whether the block is cached or being built (a hint: it may be evicted
 * right after). */
bool rs_cache_has(rs_cache *c, uint64_t chunk, uint64_t index);
const uint8_t *rs_block_data(const rs_block *b);
uint64_t rs_block_len(const rs_block *b);
void rs_cache_release(rs_cache *c, rs_block *b);
/* A read took `bytes` of the block's bytes (a referenced block): true
 * when that makes the reads' bytes reach the block's length (once). */
bool rs_cache_mark_read(rs_cache *c, rs_block *b, uint64_t bytes);

void rs_cache_get_stats(rs_cache *c, rs_cache_stats *s);

/* Memory held outside the cache but counted in its budget.
 *
 * rs_cache_charge counts `bytes` in, evicting unreferenced blocks (then
 * reclaiming, below) to make room: 0, or -ENOSPC, with nothing charged,
 * when they do not fit beside the blocks in use and the charges that
 * cannot be reclaimed.  rs_cache_uncharge gives bytes back.
 *
 * The reclaim callback, when set, is called with the cache's lock held
 * whenever blocks alone cannot bring the cache within its budget: it
 * frees up to (at least, if it can) `want` charged bytes and returns how
 * many it freed, which the cache then stops counting (so the caller must
 * not also uncharge them).  It must not call back into the cache. */
typedef uint64_t (*rs_cache_reclaim)(void *arg, uint64_t want);
void rs_cache_set_reclaim(rs_cache *c, rs_cache_reclaim fn, void *arg);
int rs_cache_charge(rs_cache *c, uint64_t bytes);
void rs_cache_uncharge(rs_cache *c, uint64_t bytes);

#endif
