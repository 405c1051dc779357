/* megatron: legacy Megatron-LM / NeMo per-rank checkpoints (FORMATS.md §5),
 * as a source and as a view.
 *
 * SOURCE is either an iteration directory holding `mp_rank_TT[_PPP]/`
 * directories, or the checkpoint root holding
 * `latest_checkpointed_iteration.txt` and `iter_XXXXXXX/` (or `release/`):
 * the tracker names the iteration read; other iteration directories are
 * not shown by any view.
 *
 * Reader.  Every (tp, pp) rank must have `mp_rank_TT[_PPP]/
 * model_optim_rng.pt`, the PP suffix on all of them or none.  Each is a
 * torch.save zip; its data.pkl is parsed by the restricted pickle reader
 * with rs_megatron_allow (torch, the argparse Namespace and the numpy,
 * Megatron enum and rerun-state classes real args and rng states hold;
 * any other GLOBAL refuses the mount).  The dict holds `args`,
 * `checkpoint_version` (2.0 or later: older ones order query/key/value
 * per rank differently), `iteration`, `model` (or `model0`.. `model<V-1>`
 * with V virtual stages) and the state this reader leaves out
 * (`optimizer`, `opt_param_scheduler`, `rng_state`, `rerun_state_machine`).
 *   - args must be an argparse.Namespace; its tensor/pipeline/virtual
 *     sizes must match the directories and model keys, num_layers must
 *     divide into P*V chunks; uneven pipelines (standalone embedding
 *     stage, first/last stage layer counts, a pipeline layout) and
 *     expert parallelism (`mp_rank_TT_PPP_EEE`) are refused.
 *   - model dicts (plain dicts or state_dict OrderedDicts, nested at most
 *     RS_MEGATRON_MAX_NESTING deep) hold tensors only.  A key
 *     `layers.<n>.<rest>` is layer n of its chunk: chunk c of stage p
 *     numbers layer (c*P + p)*L/(P*V) + n globally.  A tensor becomes the
 *     catalog tensor named by its keys joined with '.' and the global
 *     layer number (`language_model.encoder.layers.5.mlp.dense_4h_to_h.
 *     weight`).  Tensors under an `embedding` key belong to the first
 *     chunk, other non-layer tensors (final norm, output layer) to the
 *     last; one found elsewhere is refused.
 *   - TP: the sharding rules (-o rules= first, then planner/rules.c)
 *     name the split axis; rank
 *     r's tensor is fragment r along it.  A gated dense_h_to_4h
 *     (args.swiglu) is [W_r; V_r] on rank r: two fragments, W_r at rows
 *     r*F/T and V_r at F + r*F/T of the global [W; V], so a view finds
 *     the multiplier 2 in the grid.  Replicated tensors are read from TP
 *     rank 0; every rank must hold them with the same shape and dtype.
 *     With T > 1 a tensor no rule knows is refused (its copies could be
 *     shards or replicas).  `word_embeddings_for_head` of tied weights is
 *     a copy of the word embeddings: checked, not catalogued.
 *   - Tensors are read with formats/torch_tensor.h; a dict met twice
 *     (the pickle memo can share one) is refused, so a small file cannot
 *     name exponentially many tensors.
 *   - Refused with one line naming the file: a missing rank or
 *     model_optim_rng.pt, a zip or pickle that does not parse, an unknown
 *     GLOBAL, iterations, versions or sizes that differ between ranks, a
 *     tensor one rank has and another lacks, shapes that do not tile,
 *     a layer missing from its chunk, tensor bytes outside their record.
 * The rank directories (and in the root form the iteration directories)
 * are hidden from other views; every other file is passed through.
 *
 * View (`-o format=megatron`): for every rank of (tp, pp) a file
 * `mp_rank_TT[_PPP]/model_optim_rng.pt` (PP suffix only when pp > 1), in
 * the iteration directory the source had (with its tracker file) or at the
 * top.  Each is a torch.save zip (records as torch writes them, CRC 0 in
 * the tensor records: torch.load ignores CRCs) whose data.pkl is {'args':
 * the source's Namespace with tensor_model_parallel_size,
 * pipeline_model_parallel_size, virtual_pipeline_model_parallel_size,
 * num_layers_per_virtual_pipeline_stage, padded_vocab_size (and the old
 * model_parallel_size, transformer_pipeline_model_parallel_size when
 * present) rewritten, 'checkpoint_version', 'iteration',
 * 'num_floating_point_operations_so_far' as stored, 'model' (or model0..
 * with vpp > 1)}.  Values are written back with rs_pw_value allowing only
 * the GLOBALs args hold (the Namespace, torch dtypes, Megatron enums,
 * PosixPath, SimpleNamespace, set): a source naming any other callable
 * there is refused rather than handed to a weights_only=False loader.
 * args come from TP rank 0 of stage 0 (its rank/local_rank fields too).
 * Models nest as in the source, in Megatron's order, layers numbered per
 * chunk, embeddings in the first chunk, final norm and output layer in
 * the last, `word_embeddings_for_head` in the last chunk when weights are
 * tied and it is not also the first.  Each tensor record holds exactly the
 * rank's shard (a gated dense_h_to_4h: W_r then V_r), in the view's dtype.
 * Optimizer, scheduler, rng and rerun state are left out: load with
 * --no-load-optim --no-load-rng (or --finetune).  vpp > 1 needs pp > 1.
 *
 * Errors: as checkpoint.h (lines to the diag list, then -EINVAL).
 */
#ifndef RS_MEGATRON_H
#define RS_MEGATRON_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/pickle.h"
#include "formats/torch_tensor.h"
#include "formats/torchzip.h"
#include "planner/rules.h"

/* `rules` (may be NULL: the built-ins) decide each tensor's TP axis, so
 * -o rules= places per-rank copies as it splits them. */
int rs_megatron_read(rs_checkpoint *ck, const rs_rules *rules, rs_diag *d);
int rs_megatron_build_view(const rs_checkpoint *ck, const rs_layout *l,
			   rs_vtree *t, rs_diag *d);

/* GLOBALs a legacy checkpoint's data.pkl may hold. */
extern const char *const rs_megatron_allow[];

/* ---- shared by formats/megatron_*.c ---------------------------------- */

#define RS_MEGATRON_MAX_NESTING 8

/* Where a catalogued tensor sits in a model dict. */
typedef enum {
	RS_MEG_FIRST,   /* the first model chunk (embeddings) */
	RS_MEG_LAST,    /* the last (final norm, output layer) */
	RS_MEG_LAYER,   /* the chunk holding its layer */
} rs_meg_place;

typedef struct {
	char **keys;    /* dict keys from model[<chunk>] down to the tensor;
			 * keys[layer_key] is the part after "layers.<n>." */
	int nkeys;
	int layer_key;  /* -1: no layer */
	int axis;       /* the source's TP split axis, -1: replicated */
	uint64_t layer; /* global layer number */
	rs_meg_place place;
} rs_meg_tensor;

/* Reader state the view needs (rs_checkpoint.extra). */
typedef struct {
	rs_pickle *pk;          /* data.pkl of TP rank 0, stage 0 */
	const rs_pvalue *top;   /* its top-level dict */
	const rs_pvalue *args;  /* its args (an argparse.Namespace object) */
	uint32_t tp, pp, vpp;
	uint64_t layers;
	bool tied;              /* word embeddings double as the output layer */
	long word_emb;          /* catalog index of the word embeddings, -1 */
	char *iter_dir;         /* root form: "iter_0000100" or "release";
				 * NULL when SOURCE is the iteration directory */
	bool *carry;            /* per entry: the megatron view copies it */
	rs_meg_tensor *tensors; /* per catalog tensor */
	size_t ntensors;
} rs_meg_state;

void rs_meg_state_free(void *state);

/* The reader while it merges rank files (megatron_read.c drives,
 * megatron_model.c walks one file's model dicts). */
typedef struct {
	rs_checkpoint *ck;
	rs_meg_state *st;
	rs_diag *d;
	const rs_rules *rules;  /* a tensor's split axis (-o rules= first) */
	bool gated;             /* args.swiglu */
	uint64_t lpc;           /* layers per model chunk */
	size_t *group;          /* [2*(p*V + c)]: catalog range [begin, end)
				 * of the tensors of chunk c of stage p */
	uint32_t *filled;       /* per catalog tensor: ranks that held it */
	size_t cap_tensors, cap_filled;
} rs_meg_reader;

/* megatron_pkl.c.  A torch.save tensor (_rebuild_tensor_v2/v3, perhaps in
 * _rebuild_parameter), read with rs_torch_tensor_read. */
bool rs_meg_is_tensor(const rs_pvalue *v);
/* A dict, or an OrderedDict (*pairs its items: NULL when empty). */
bool rs_meg_dict_like(const rs_pvalue *v, const rs_pvalue **pairs);
/* The first rank file's args (r->st->top set): fills st->args, layers,
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
 * its name for messages.  TP rank 0 of a stage adds the chunk's tensors
 * to the catalog; other ranks fill their fragments and must hold the same
 * tensors.  Files go stage by stage, TP rank 0 first. */
int rs_meg_add_rank(rs_meg_reader *r, const rs_zip *z,
		    const rs_pvalue *top, uint32_t p, uint32_t t, uint32_t src,
		    const char *path);

#endif
