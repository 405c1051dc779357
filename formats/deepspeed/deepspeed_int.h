/* deepspeed_int: what the DeepSpeed reader's files and its view share;
 * private to formats/deepspeed/ (deepspeed.h is the module's contract).
 *
 *   read.c       finds the tag directory and the rank files, parses them
 *   zero.c       cuts the flat partitions into params (both layouts)
 *   universal.c  the universal checkpoint view
 */
#ifndef RS_DEEPSPEED_INT_H
#define RS_DEEPSPEED_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"

/* The flat tensors one optimizer file holds per group, and the name
 * each becomes (ds_state order). */
enum { DS_FP32 = 0, DS_EXP_AVG, DS_EXP_AVG_SQ, DS_NSTATES };
extern const char *const rs_ds_state_names[DS_NSTATES];

/* One flat fp32 tensor: rank r's part of group g for one state. */
typedef struct {
	uint32_t source;
	uint64_t offset;        /* of element 0 in the file */
	uint64_t numel;
	bool present;           /* the file holds it (a state may be absent
				 * before the first step) */
} ds_flat;

/* One trainable param, in flat order. */
typedef struct {
	char *name;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t numel;
	uint32_t group;
} ds_param;

/* What the reader keeps (rs_checkpoint.extra) for the view and
 * --dry-run. */
typedef struct {
	int stage;              /* 1, 2 or 3 */
	uint32_t world;         /* data-parallel ranks (partition_count) */
	uint32_t groups;
	rs_dtype trained;       /* the module's weights' dtype */
	char *tag;              /* the tag directory, "" when SOURCE is it */
	const char *tracker;    /* the file that named it, NULL: none */
	bool universal;         /* a universal checkpoint (zero/<param>/),
				 * not ZeRO partitions; stage is 0 */
	ds_param *params;       /* trainable, flat order */
	size_t nparams;
	ds_flat *flats;         /* [(state * world + rank) * groups + g] */
	bool has_state[DS_NSTATES];
	double *step;           /* per group; NAN: none stored */
	bool step_is_tensor;    /* torch keeps step a 0-d float32 tensor */
	size_t nfrozen, nshared, nbuffers;   /* nparams counts a universal
						 * checkpoint's params (params NULL) */
	uint32_t model_states;  /* rank 0's model-states file (source) */
	rs_pickle *opt0;        /* rank 0's optimizer pickle: its loss
				 * scaler and param groups */
	char *ds_version;
} rs_ds_state;

void rs_ds_state_free(void *state);

int rs_deepspeed_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);
int rs_universal_build_view(const rs_checkpoint *ck, const rs_layout *l,
			    rs_vtree *t, rs_diag *d);

/* Adds every trainable param of st and, for each state the optimizer
 * files hold, its optimizer.state.<state>.<name>, as fragments of the
 * flats (zero.c).  `where` names the tag directory in refusals: params
 * that do not fill the partitions exactly.  -EINVAL (reported),
 * -ENOMEM. */
int rs_ds_add_params(rs_checkpoint *ck, const rs_ds_state *st,
		     const char *where, rs_diag *d);

#endif
