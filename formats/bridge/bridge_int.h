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
	bool packed;            /* -o hf_experts=packed */
	uint64_t experts;       /* per MoE layer (the family's "experts"
				 * fact), 0: none */
} rs_map_dims;

/* One piece of a target: source k's rows [lo, hi) at target row `at`
 * (rows: the first axis after the layer axis). */
typedef struct {
	int k;                  /* the row's source */
	uint64_t lo, hi, at;    /* its rows [lo, hi) at target row `at` */
} rs_map_piece;

/* An op on one layer's sources (their shapes without the layer axis):
 * rs_map_run fills the pieces (malloc'd: the caller frees pcs) and the
 * target's shape, or returns -EINVAL with the reason in why, -ENOMEM. */
typedef struct {
	rs_map_op op;
	const rs_map_dims *dims;
	int nsrc;
	int ndim[RS_MAP_MAX_FROM];
	uint64_t shape[RS_MAP_MAX_FROM][RS_MAX_DIMS];
	/* out */
	rs_map_piece *pcs;
	size_t npcs;
	int out_ndim;
	uint64_t out_shape[RS_MAX_DIMS];
	char why[200];
} rs_map_job;

int rs_map_run(rs_map_job *j);

/* Applies rows user[0..nuser) (from the rules file user_path, for
 * messages) then family f's to ck->catalog, into a new catalog that
 * replaces it on success.  Every stored tensor must be taken by some row
 * (made into a target, or left out by one); a target is made by one row
 * from one stored tensor (per layer), and of one dtype - anything else is
 * refused naming both rows or tensors.  A target of a user's row has the
 * row as its origin (rs_tensor.origin), for later messages. */
int rs_remap(rs_checkpoint *ck, const rs_family *f, const rs_map_row *user,
	     size_t nuser, const char *user_path, const rs_map_dims *dims,
	     rs_diag *d);

/* The longest row pattern (rows.c takes at most 400 bytes from a rules
 * file): a longer one matches nothing. */
#define RS_MAP_PATTERN_MAX 1024

/* Whether `name` matches row pattern `pat`, by the rules of
 * formats/model.h: nums receives what each '#' stood for (up to 2, 24
 * bytes each); with `stacked`, the pattern's first "#." is left out (the
 * name of a tensor whose axis 0 is the layer).  A pattern with a '*' (a
 * drop row's) captures nothing.  Time linear in the name for a pattern
 * without '*', |pat| x |name| with.  Exposed for tests. */
bool rs_map_match(const char *pat, const char *name, bool stacked,
		  char nums[2][24], int *nnums);

/* Row object o (the k-th of file path, for messages) into *r: its
 * "target", "op", "sources" and "when" (formats/bridge/rows.c). */
struct cJSON;
int rs_bridge_row_parse(const struct cJSON *o, const char *path, size_t k,
			rs_map_row *r, rs_diag *d);

/* The index of tensor `name` in ck's catalog (also under the family's
 * strip prefix), or SIZE_MAX. */
size_t rs_bridge_find(const rs_checkpoint *ck, const rs_family *f,
		      const char *name);

/* The family's config facts (formats/bridge/config.c).  Toward HF:
 * rs_config_to_hf before the remap (the records' and the user's facts,
 * the family's checks, the ops' dims), rs_config_to_hf_finish after it
 * (the shapes' facts, ck->model.hf_config_out and fact_lines), with
 * the state the first left in *st (which the caller must hand to the
 * second, or free).  From HF:
 * SOURCE's config.json `cfg` (file `path`) against the family. */
typedef struct rs_config_eval rs_config_eval;
int rs_config_to_hf(rs_checkpoint *ck, const rs_family *f,
		    const rs_bridge_opts *o, rs_map_dims *dims,
		    rs_config_eval **st, rs_diag *d);
/* Frees st, whatever it returns. */
int rs_config_to_hf_finish(rs_config_eval *st, rs_diag *d);
void rs_config_eval_free(rs_config_eval *st);
int rs_config_from_hf(rs_checkpoint *ck, const rs_family *f,
		      const struct cJSON *cfg, const char *path,
		      rs_map_dims *dims, rs_diag *d);

#endif
