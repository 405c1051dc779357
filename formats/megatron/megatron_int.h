/* megatron_int: what the legacy Megatron reader's and view's files share;
 * private to formats/megatron/ (megatron.h is the module's contract).
 *
 *   read.c    finds the iteration and the rank files, drives the merge
 *   args.c    the rank files' args and top-level dicts
 *   model.c   walks one rank file's model dicts into the catalog
 *   view.c    the per-rank view
 */
#ifndef RS_MEGATRON_INT_H
#define RS_MEGATRON_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/codec/pickle.h"
#include "formats/codec/torch_tensor.h"
#include "formats/codec/torchzip.h"
#include "planner/rules.h"

/* o->rules (may be NULL: the built-ins) decide each tensor's TP axis, so
 * -o rules= places per-rank copies as it splits them. */
int rs_megatron_read(rs_checkpoint *ck, const rs_open_opts *o, rs_diag *d);
int rs_megatron_build_view(const rs_checkpoint *ck, const rs_layout *l,
			   rs_vtree *t, rs_diag *d);

#define RS_MEGATRON_MAX_NESTING 8

/* The key forms of megatron-core's expert modules in a rank file's model
 * (docs/FORMATS.md, "Legacy Megatron"), after "<layer>.mlp.experts.":
 * SequentialMLP `local_experts.<i>.linear_fc1.weight`, TEGroupedMLP
 * `linear_fc1.weight<i>`, the older GroupedMLP `weight1` / `weight2`
 * (every local expert in one matrix).  The catalog holds each expert
 * weight as one tensor `<layer>.mlp.experts.experts.<param>` with a
 * global expert axis first, megatron-core's dist-checkpoint name. */
typedef enum {
	RS_MEG_EXPERTS_NONE = 0,
	RS_MEG_EXPERTS_SEQUENTIAL,
	RS_MEG_EXPERTS_TE,
	RS_MEG_EXPERTS_GROUPED,
} rs_meg_experts;

/* One expert parameter (formats/megatron/experts.c's table). */
typedef struct {
	const char *param;      /* "linear_fc1.weight": catalog and
				 * sequential/TE key */
	const char *grouped;    /* GroupedMLP's key, NULL: none */
	int tp_axis;            /* of the (experts, ...) catalog tensor,
				 * -1: replicated */
	bool fc1;               /* gated with swiglu: [W_r; V_r] per rank */
} rs_meg_expert_param;

extern const rs_meg_expert_param rs_meg_expert_params[];
extern const size_t rs_meg_expert_nparams;

/* Whether `key` (one flat model key, its layer number already replaced)
 * names an expert weight: *form, *param (into rs_meg_expert_params),
 * *local (the local expert; -1 for GroupedMLP's all-experts matrix) and
 * *at (where the part after "mlp.experts." starts). */
bool rs_meg_expert_key(const char *key, rs_meg_experts *form, int *param,
		       long *local, size_t *at);

/* The key of local expert `local` of param `param` in `form`, after
 * "mlp.experts." (GroupedMLP: the whole matrix, local ignored). */
int rs_meg_expert_suffix(rs_meg_experts form, int param, uint64_t local,
			 char *out, size_t size);

/* Where a catalogued tensor sits in a model dict. */
typedef enum {
	RS_MEG_FIRST,   /* the first model chunk (embeddings) */
	RS_MEG_LAST,    /* the last (final norm, output layer) */
	RS_MEG_LAYER,   /* the chunk holding its layer */
} rs_meg_place;

typedef struct {
	char **keys;    /* dict keys from model[<chunk>] down to the tensor;
			 * keys[layer_key] is the key without its "<n>." */
	int nkeys;
	int layer_key;  /* -1: no layer */
	size_t layer_at; /* where "<n>." goes in keys[layer_key]: past
			  * "layers." ("layers.", legacy's nested dicts;
			  * "decoder.layers.", megatron-core's flat keys) */
	int axis;       /* the source's TP split axis, -1: replicated */
	uint64_t layer; /* global layer number */
	rs_meg_place place;
	/* expert weights: expert_param >= 0 (into rs_meg_expert_params);
	 * keys[nkeys-1] from expert_at on is "experts.<param>", the
	 * catalog's form; axis is the TP axis of the catalog tensor */
	int expert_param;
	size_t expert_at;
	uint8_t *have;  /* while reading: [global expert * tp + tp rank] */
} rs_meg_tensor;

/* Reader state the view needs (rs_checkpoint.extra). */
typedef struct {
	rs_pickle *pk;          /* data.pkl of TP rank 0, stage 0 */
	char *first_path;       /* that file, for messages about its args */
	const rs_pvalue *top;   /* its top-level dict */
	const rs_pvalue *args;  /* its args (an argparse.Namespace object) */
	uint32_t tp, pp, vpp;
	uint32_t ep;            /* expert-parallel rank directories (1: none) */
	uint64_t experts;       /* args.num_experts; 0: not an MoE model */
	rs_meg_experts form;    /* the expert modules' key form (NONE: no
				 * expert weight) */
	uint8_t *moe_layer;     /* [layers]: args say layer n is MoE (NULL
				 * without experts) */
	uint64_t layers;
	bool tied;              /* word embeddings double as the output layer */
	long word_emb;          /* catalog index of the word embeddings, -1 */
	rs_meg_tensor *tensors; /* per catalog tensor */
	size_t ntensors;
} rs_meg_state;

void rs_meg_state_free(void *state);

/* The reader while it merges rank files (read.c drives,
 * model.c walks one file's model dicts). */
typedef struct {
	rs_checkpoint *ck;
	rs_meg_state *st;
	rs_diag *d;
	const rs_rules *rules;  /* a tensor's split axis (-o rules= first) */
	bool gated;             /* args.swiglu */
	uint32_t ep_rank;       /* the EP rank of the file being merged */
	uint64_t lpc;           /* layers per model chunk */
	size_t *group;          /* [2*(p*V + c)]: catalog range [begin, end)
				 * of the tensors of chunk c of stage p */
	uint32_t *filled;       /* per catalog tensor: ranks that held it */
	size_t cap_tensors, cap_filled;
} rs_meg_reader;

/* args.c.  The first rank file's args (r->st->top set): fills st->args, layers,
 * vpp, tied and r->lpc, r->gated; refuses (reported, -EINVAL) what the
 * reader cannot map and checkpoint versions before 2.0.  st->tp and
 * st->pp come from the directories and must match. */
int rs_meg_read_args(rs_meg_reader *r, const char *path);
/* Another rank file (its top-level dict): the same iteration, version
 * and layout args as the first. */
int rs_meg_check_same(const rs_meg_reader *r, const rs_pvalue *top,
		      const char *path);

/* Merges the model chunks of one rank file: `top` is its parsed data.pkl
 * (a dict), `z` its zip (tensor records), `src` its source index, `path`
 * its name for messages.  Rank (TP 0, EP 0) of a stage adds the chunk's
 * tensors to the catalog; other ranks fill their fragments (TP shards;
 * EP ranks: their experts) and must hold the same tensors.  Files go
 * stage by stage, EP rank by EP rank, TP rank 0 first (r->ep_rank set). */
int rs_meg_add_rank(rs_meg_reader *r, const rs_zip *z,
		    const rs_pvalue *top, uint32_t p, uint32_t t, uint32_t src,
		    const char *path);

/* After every rank file: expert weights in exactly the layers
 * args.moe_layer_freq makes MoE layers; EP rank directories with none. */
int rs_meg_check_moe_layers(rs_meg_reader *r);

#endif
