/* bridge_int: what the bridge's files share; private to formats/bridge/
 * (bridge.h is the module's contract). */
#ifndef RS_BRIDGE_INT_H
#define RS_BRIDGE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/bridge/bridge.h"

/* What the ops need to know: heads, query groups, the true vocab. */
typedef struct {
	uint32_t heads, groups;
	uint64_t vocab;
	bool tied;
} rs_map_dims;

/* Applies rows user[0..nuser) then family f's to ck->catalog, into a new
 * catalog that replaces it on success.  Every stored tensor must be
 * taken by some row (made into a target, or left out by one). */
int rs_remap(rs_checkpoint *ck, const rs_family *f, const rs_map_row *user,
	     size_t nuser, const rs_map_dims *dims, rs_diag *d);

/* Whether `name` matches row pattern `pat`, by the rules of
 * formats/model.h: nums receives what each '#' stood for (up to 2, 24
 * bytes each); with `stacked`, the pattern's first "#." is left out (the
 * name of a tensor whose axis 0 is the layer).  Exposed for tests. */
bool rs_map_match(const char *pat, const char *name, bool stacked,
		  char nums[2][24], int *nnums);

/* The index of tensor `name` in ck's catalog (also under the family's
 * strip prefix), or SIZE_MAX. */
size_t rs_bridge_find(const rs_checkpoint *ck, const rs_family *f,
		      const char *name);

/* The Llama facts (formats/bridge/llama.c) into ck->model and dims. */
int rs_llama_from_mcore(rs_checkpoint *ck, const rs_family *f,
			const rs_bridge_opts *o, rs_map_dims *dims,
			rs_diag *d);
int rs_llama_check_mcore(rs_checkpoint *ck, const rs_bridge_opts *o,
			 rs_diag *d);
int rs_llama_from_hf(rs_checkpoint *ck, const rs_family *f,
		     rs_map_dims *dims, rs_diag *d);

#endif
