/* safetensors_int: what the safetensors reader and view share; private to
 * formats/safetensors/ (safetensors.h is the module's contract). */
#ifndef RS_SAFETENSORS_INT_H
#define RS_SAFETENSORS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/checkpoint.h"

/* The reference parser's MAX_HEADER_SIZE; the view refuses to write a
 * larger header too (no loader would read it). */
#define RS_SAFETENSORS_HEADER_MAX 100000000ull

/* What the reader keeps for the view in ck->extra: the merged
 * `__metadata__` pairs, in the order first seen (owned, freed with the
 * checkpoint). */
typedef struct {
	char *key, *value;
} rs_safetensors_pair;

typedef struct {
	rs_safetensors_pair *pairs;
	size_t n, cap;
} rs_safetensors_meta;

/* Reads SOURCE (already opened into ck->sources) into ck. */
int rs_safetensors_read(rs_checkpoint *ck, const rs_open_opts *o,
			rs_diag *d);

/* The part of rs_safetensors_read after reading a file: parses the header
 * text[0, len) of the file `source` (file_size bytes; its data starts at
 * 8 + len) and adds its tensors to ck, merging its __metadata__ into
 * ck->extra (made when NULL).  `where` names the file in messages.  Kept
 * apart so the header parser can be fuzzed without files. */
int rs_safetensors_read_header(rs_checkpoint *ck, uint32_t source,
			       const char *where, const char *text,
			       size_t len, uint64_t file_size, rs_diag *d);

/* The writer both views use (formats/safetensors/view.c): catalog tensor
 * i under names[i] (names NULL: the catalog's own; names[i] NULL: left
 * out), SOURCE's other files carried.  At tp 1, model.safetensors - or,
 * when shard_max is not 0 and the data pass it, HF's sharded form
 * (model-0000k-of-0000n.safetensors of at most shard_max data bytes each
 * but a larger tensor alone, and model.safetensors.index.json); at tp > 1
 * model-rank-<r>-part-0.safetensors per rank.  Errors as the views'. */
int rs_safetensors_write(const rs_checkpoint *ck, const rs_layout *l,
			 rs_vtree *t, const char *const *names,
			 uint64_t shard_max, rs_diag *d);

/* The hf view (formats/safetensors/hf.c). */
int rs_hf_build_view(const rs_checkpoint *ck, const rs_layout *l,
		     rs_vtree *t, rs_diag *d);

/* Builds the safetensors view of any checkpoint. */
int rs_safetensors_build_view(const rs_checkpoint *ck, const rs_layout *l,
			      rs_vtree *t, rs_diag *d);

/* The safetensors spelling of a dtype ("F32", "BF16", ...) and back;
 * NULL / RS_DTYPE_INVALID when there is none. */
const char *rs_safetensors_dtype_name(rs_dtype t);
rs_dtype rs_safetensors_dtype_from_name(const char *s);

#endif
