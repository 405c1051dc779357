/* vtree: the virtual tree a view presents, built once at mount time.
 *
 * Every file is a list of segments laid end to end (docs/ARCHITECTURE.md, "One read"):
 *   LITERAL  bytes built at mount time (headers, rewritten metadata);
 *   ZERO     zeros (vocab padding rows, edge-chunk padding);
 *   SOURCE   one contiguous byte range of one source file, served without
 *            a user-space copy;
 *   TENSOR   a byte range of a chunk: a box of a tensor built by executing
 *            a plan, block by block, through the cache.
 * Sizes are exact at mount time; no tensor byte is read to build the tree.
 *
 * Node 0 is the root.  Nodes, segments and chunks are owned by the tree and
 * live until rs_vtree_free; pointers to them are stable once building ends
 * (the tree is read-only while mounted).  Functions return 0 or -errno.
 */
#ifndef RS_VTREE_H
#define RS_VTREE_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "planner/plan.h"

typedef enum {
	RS_SEG_LITERAL,
	RS_SEG_ZERO,
	RS_SEG_SOURCE,
	RS_SEG_TENSOR,
} rs_seg_kind;

/* A box of a tensor that must be materialised: its plan covers the whole
 * destination.  With a cast (from != to) the plan is made in `from`, the
 * stored dtype, and every element is converted to `to` as blocks are
 * built (gpu/executor.h); `size` is the chunk's bytes in the view:
 * plan.size / size(from) * size(to).  Without one, from = to = INVALID and
 * size = plan.size.  `id` is unique within the tree. */
typedef struct {
	uint64_t id;
	rs_plan plan;
	rs_dtype from, to;
	uint64_t size;
	/* The distinct source files its plan reads, sorted: what a read of
	 * any of its blocks must find unchanged, cached or not. */
	uint32_t *sources;
	uint32_t nsources;
} rs_chunk;

typedef struct {
	rs_seg_kind kind;
	bool kept;         /* LITERAL bytes owned by the tree (rs_vtree_keep),
			    * maybe shared by other segments: not the
			    * segment's to free */
	uint64_t offset;   /* in the file */
	uint64_t length;
	union {
		const uint8_t *bytes;                               /* LITERAL */
		struct { uint32_t index; uint64_t offset; } source; /* SOURCE */
		struct { const rs_chunk *chunk; uint64_t offset; } tensor;
	} u;
} rs_segment;

typedef struct {
	char *name;
	uint32_t parent;
	bool is_dir;
	uint64_t size;
	struct timespec mtime;
	/* directories */
	uint32_t *children;
	uint32_t nchildren;
	size_t cap_children;
	/* files */
	rs_segment *segs;
	uint32_t nsegs;
	size_t cap_segs;
	uint32_t *sources;      /* distinct source files read, sorted */
	uint32_t nsources;
	size_t cap_sources;
} rs_vnode;

typedef struct {
	rs_vnode *nodes;
	uint32_t count;
	size_t cap;
	rs_chunk **chunks;
	size_t nchunks, cap_chunks;
	/* (parent, name) -> node index + 1 (0 = empty), open addressing at
	 * most half full: O(1) duplicate checks while building, so a
	 * directory of many thousand chunk files is not quadratic. */
	uint32_t *slots;
	uint64_t mask;
	/* The node a name given twice met (node + 1; 0: none), so that a
	 * builder's caller can say which path two things would share. */
	uint32_t clash;
	/* Buffers the tree owns for literal segments that share them
	 * (rs_vtree_keep), freed with the tree. */
	void **kept;
	size_t nkept, cap_kept;
} rs_vtree;

int rs_vtree_init(rs_vtree *t, struct timespec root_mtime);
void rs_vtree_free(rs_vtree *t);

/* New directory or (empty) file under `parent`; `name` is copied and must
 * be a safe name (rs_name_is_safe).  -EEXIST on a duplicate name (the
 * node already there: t->clash). */
int rs_vtree_add_dir(rs_vtree *t, uint32_t parent, const char *name,
		     struct timespec mtime, uint32_t *index);
int rs_vtree_add_file(rs_vtree *t, uint32_t parent, const char *name,
		      struct timespec mtime, uint32_t *index);

/* Moves everything under the root into a new directory `name` of the
 * root (*dir: its node), so a view built at the top can be shown inside
 * an iteration directory.  -EEXIST when the root holds `name` already. */
int rs_vtree_nest(rs_vtree *t, const char *name, struct timespec mtime,
		  uint32_t *dir);

/* Node `node`'s path below the root ("a/b"), cut to fit `size`. */
void rs_vtree_path(const rs_vtree *t, uint32_t node, char *out, size_t size);

/* Appends a segment to the end of a file.  Literal bytes are copied. */
int rs_vtree_append_literal(rs_vtree *t, uint32_t file, const void *bytes,
			    uint64_t len);
int rs_vtree_append_zero(rs_vtree *t, uint32_t file, uint64_t len);
/* The tree takes ownership of `buf` (from malloc), freed with the tree;
 * on -ENOMEM the caller still owns it. */
int rs_vtree_keep(rs_vtree *t, void *buf);
/* Appends `len` literal bytes at `bytes` without copying them: they must
 * lie in a buffer the tree keeps (rs_vtree_keep), which any number of
 * segments may share - a torch.save header repeated for every chunk of
 * one shape is stored once. */
int rs_vtree_append_kept(rs_vtree *t, uint32_t file, const void *bytes,
			 uint64_t len);
int rs_vtree_append_source(rs_vtree *t, uint32_t file, uint32_t source,
			   uint64_t offset, uint64_t len);
int rs_vtree_append_tensor(rs_vtree *t, uint32_t file, const rs_chunk *c,
			   uint64_t offset, uint64_t len);

/* Takes ownership of *plan (left empty) as a new chunk, converted from
 * `from` to `to` (pass the same dtype twice for none). */
int rs_vtree_add_chunk(rs_vtree *t, rs_plan *plan, rs_dtype from, rs_dtype to,
		       const rs_chunk **out);

/* Strided rows at least this long are served as SOURCE segments, one per
 * row (read straight into the reply, no cache block), up to this many rows
 * per plan. */
#define RS_VTREE_DIRECT_MIN_ROW (64u << 10)
#define RS_VTREE_DIRECT_MAX_RUNS 4096u

/* Appends a whole plan's destination to a file, its elements converted
 * from `from` (the stored dtype) to `to` (the view's): without a cast, as
 * SOURCE and ZERO segments when it is a concatenation of source runs, or
 * of strided rows of at least RS_VTREE_DIRECT_MIN_ROW bytes (no cache
 * block); otherwise, and always with a cast, as one TENSOR segment over a
 * new chunk.  Takes ownership of *plan. */
int rs_vtree_append_plan(rs_vtree *t, uint32_t file, rs_plan *plan,
			 rs_dtype from, rs_dtype to);

/* Index of the segment holding file byte `off` (off < size). */
uint32_t rs_vtree_find_segment(const rs_vnode *n, uint64_t off);

/* Child of a directory by name, or -ENOENT: O(1), through the (parent,
 * name) hash index; safe from any thread once the tree is built. */
int rs_vtree_lookup(const rs_vtree *t, uint32_t dir, const char *name,
		    uint32_t *index);

#endif
