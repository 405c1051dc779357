/* deepspeed_int: what the DeepSpeed reader's files and its view share;
 * private to formats/deepspeed/ (deepspeed.h is the module's contract).
 *
 *   read.c            finds the tag directory and the rank files, reads
 *                     the optimizer files, drives the rest
 *   module.c          the model-states files: shapes, frozen, buffers
 *   zero.c            cuts the flat partitions into params (both layouts)
 *   save_dir.c        config.json, the files passed through, --dry-run
 *   universal_read.c  a universal checkpoint as a source
 *   universal.c       the universal checkpoint view
 */
#ifndef RS_DEEPSPEED_INT_H
#define RS_DEEPSPEED_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/codec/pickle.h"
#include "formats/codec/torchzip.h"
#include "formats/codec/torch_tensor.h"
#include "planner/names.h"

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
} rs_ds_flat;

/* One trainable param, in flat order. */
typedef struct {
	char *name;
	int ndim;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t numel;
	uint32_t group;
	size_t tensor[DS_NSTATES];      /* its catalog tensors (zero.c) */
} rs_ds_param;

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
	rs_ds_param *params;    /* trainable, flat order */
	size_t nparams, cap_params;
	rs_ds_flat *flats;      /* [(state * world + rank) * groups + g] */
	bool has_state[DS_NSTATES];
	double *step;           /* per group; NAN: none stored */
	/* counts; of a universal checkpoint nparams too (params NULL) */
	size_t nfrozen, nshared, nbuffers;
	uint32_t model_states;  /* rank 0's model-states file (source) */
	rs_pickle *opt0;        /* rank 0's optimizer pickle: its loss
				 * scaler and param groups */
	char *ds_version;
} rs_ds_state;

void rs_ds_state_free(void *state);

/* A model-states or optimizer pickle holds a few hundred bytes per
 * tensor; anything near this is not a checkpoint. */
#define RS_DS_PKL_MAX (256u << 20)
#define RS_DS_MAX_RANKS (1u << 16)
#define RS_DS_MAX_GROUPS 4096u
#define RS_DS_CONFIG_MAX (1u << 20)
#define RS_DS_TRACKER "latest"
/* where ds_to_universal.py names its output folder */
#define RS_DS_TRACKER_UC "latest_universal"

/* The reader (read.c drives; module.c, save_dir.c and universal_read.c
 * read their parts).  One rank file of the tag directory: */
typedef struct {
	long entry;             /* -1: not found */
	uint32_t source;
	char path[4400];        /* as messages name it */
	rs_zip z;
	rs_pickle *pk;
} rs_ds_file;

typedef struct {
	rs_checkpoint *ck;
	rs_ds_state *st;
	rs_diag *d;
	long tag;               /* the tag directory's entry, -1: SOURCE */
	char where[4200];       /* the tag directory, for messages */
	rs_ds_file *model;      /* [world] in stage 3, [1] else */
	rs_ds_file *optim;      /* [world] */
	uint32_t nmodel, noptim;
	int64_t count;          /* rank 0's partition_count */
	bool zero3_names;       /* zero_pp_rank_D_mp_rank_00_model_states.pt */
	long zero;              /* a universal checkpoint's zero/ entry, -1 */
	bool bf16_prefix;
} rs_ds_reader;

/* read.c: a rank file's name (*kind 'm' model states, 'o' optimizer;
 * *dp -1 when the name has none); f opened for its pickle (a dict unless
 * `any`), reported; a pickled name that may become a tensor's and a
 * directory's name; a tensor record of f checked against its zip,
 * reported with `what`; a stored step (0-d tensor or number) into *out. */
bool rs_ds_rank_name(const char *name, char *kind, long *dp, long *mp,
		     bool *bf16);

/* Names sorted for lookup (read.c): a model's dicts and the catalog hold
 * one per tensor, and rs_pv_get and a catalog walk are linear scans, which
 * a lookup per tensor would make quadratic at mount.  names[i] is item
 * i's ("" for a dict key that is not a str); the pointers stay valid
 * while the catalog grows, its names being allocated apart.  A dict that
 * names a key twice is -EEXIST (Python keeps the last value).  find: the
 * item named `name`, SIZE_MAX for none (and for NULL).  Free x also on
 * error. */
typedef struct {
	const char **names;
	rs_names by;
} rs_ds_index;
int rs_ds_index_dict(const rs_pvalue *dict, rs_ds_index *x);
int rs_ds_index_catalog(const rs_catalog *c, rs_ds_index *x);
size_t rs_ds_index_find(const rs_ds_index *x, const char *name);
void rs_ds_index_free(rs_ds_index *x);
int rs_ds_open(rs_ds_reader *r, rs_ds_file *f, bool any);
bool rs_ds_name_ok(const char *s, size_t len);
int rs_ds_tensor(rs_ds_reader *r, rs_ds_file *f, const rs_pvalue *v,
		 const char *what, rs_torch_tensor *t);
int rs_ds_read_step(rs_ds_reader *r, rs_ds_file *f, const rs_pvalue *v,
		    double *out);

/* module.c: from rank 0's model-states file (stage 3's frozen params from
 * every rank's); each adds catalog tensors and counts them in r->st.
 * rs_ds_add_stored: catalog tensor `name` of shape[ndim] from one stored
 * tensor of that shape, or from the first elements of nparts dense 1-d
 * parts laid end to end.  Errors: reported, -EINVAL; -ENOMEM. */
int rs_ds_read_param_shapes(rs_ds_reader *r, rs_ds_file *f);
int rs_ds_add_stored(rs_ds_reader *r, const char *name, size_t len,
		     const rs_torch_tensor *parts, const uint32_t *sources,
		     uint32_t nparts, const uint64_t *shape, int ndim,
		     const char *path);
void rs_ds_module_facts(rs_ds_reader *r, rs_ds_file *f);
int rs_ds_read_frozen(rs_ds_reader *r);
int rs_ds_read_module_frozen(rs_ds_reader *r);
int rs_ds_read_buffers(rs_ds_reader *r);
int rs_ds_read_shared(rs_ds_reader *r);

/* save_dir.c: config.json into ck->model (-o hf_config=, the save
 * directory's, or the one above a tag directory); the save's own files
 * hidden from the views; ck->describe and ck->notice. */
int rs_ds_read_config(rs_ds_reader *r, const rs_open_opts *o);
void rs_ds_hide_entries(rs_ds_reader *r);
int rs_ds_describe(rs_ds_reader *r);

/* universal_read.c: the entry `name` in directory `dir` (-1: none); a
 * universal checkpoint's zero/ (r->zero) into the catalog. */
long rs_ds_child(const rs_checkpoint *ck, long dir, const char *name);
int rs_ds_read_universal(rs_ds_reader *r);


int rs_deepspeed_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);
int rs_universal_build_view(const rs_checkpoint *ck, const rs_layout *l,
			    rs_vtree *t, rs_diag *d);

/* Adds every trainable param of st and, for each state the optimizer
 * files hold, its optimizer.state.<state>.<name>, as fragments of the
 * flats (zero.c), recording each one's index in the param.  `where` names the tag directory in refusals: params
 * that do not fill the partitions exactly.  -EINVAL (reported),
 * -ENOMEM. */
int rs_ds_add_params(rs_checkpoint *ck, rs_ds_state *st,
		     const char *where, rs_diag *d);

#endif
