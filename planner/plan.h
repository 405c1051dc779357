/* plan: copy operations that build a box of a tensor from its fragments.
 *
 * The destination is a dense C-order buffer with extents `dst_extent`
 * (a full chunk: a zarr edge chunk is larger than the part inside the
 * tensor).  Each op copies `count` rows of `len` bytes from one source file:
 *
 *     for i in [0, count): dst[dst_off + i*dst_stride .. +len)
 *                            = source[src_off + i*src_stride .. +len)
 *
 * Rows never overlap in the destination and ops never overlap each other.
 * Destination bytes no op writes are zeros (padding, rows past the stored
 * vocab).  Ops are plain data so any executor - a CPU thread or a GPU
 * kernel - can consume them as they are.
 *
 * Contiguous inner axes are coalesced into one row, runs that continue each
 * other are merged, and ops are sorted by dst_off.  Planning touches only
 * the fragments the box overlaps when the tensor's grid is regular.
 *
 * Ownership: a plan owns its op array; rs_plan_free releases it.  Functions
 * return 0, -ENOMEM, or -E2BIG when a plan would exceed RS_PLAN_MAX_OPS.
 */
#ifndef RS_PLAN_H
#define RS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/catalog.h"

#define RS_PLAN_MAX_OPS (1u << 22)

typedef struct {
	uint32_t source;
	uint64_t src_off;
	uint64_t dst_off;
	uint64_t len;
	uint64_t count;
	uint64_t src_stride;
	uint64_t dst_stride;
} rs_copy_op;

typedef struct {
	rs_copy_op *ops;
	size_t count;
	size_t cap;
	uint64_t size;     /* destination bytes */
	uint64_t covered;  /* destination bytes written by ops */
} rs_plan;

void rs_plan_init(rs_plan *p);
void rs_plan_free(rs_plan *p);

/* Plans `box` (global coordinates; it may reach past the stored shape, where
 * it reads zeros) into a destination laid out with `dst_extent`, which must
 * hold the box (box.len[i] <= dst_extent[i]).  The destination's byte size
 * must not overflow; the caller checks that. */
int rs_plan_box(const rs_tensor *t, const rs_box *box,
		const uint64_t *dst_extent, rs_plan *out);

/* The part of `in` that writes destination bytes [begin, end), with
 * destination offsets made relative to `begin`.  Its ops follow `in`'s op
 * by op, so they are not sorted by dst_off where strided ops interleave
 * (executors do not need them sorted). */
int rs_plan_slice(const rs_plan *in, uint64_t begin, uint64_t end,
		  rs_plan *out);

/* True when every op is a single contiguous run (count == 1): the
 * destination is then a concatenation of source byte ranges and zeros. */
bool rs_plan_is_runs(const rs_plan *p);

/* Rewrites `p` in place as single runs, one per row, sorted by destination,
 * when every strided op's rows are at least `min_len` bytes and the result
 * has at most `max_runs` runs: long rows are then served like any
 * contiguous range, without the cache.  Returns 0 (p is now runs), -E2BIG (rows too short or
 * too many; p unchanged) or -ENOMEM (p unchanged). */
int rs_plan_unroll_rows(rs_plan *p, uint64_t min_len, size_t max_runs);

#endif
