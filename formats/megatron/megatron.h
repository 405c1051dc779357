/* megatron: legacy Megatron-LM / NeMo per-rank checkpoints (docs/FORMATS.md, "Legacy Megatron"),
 * as a source and as a view.
 *
 * SOURCE is an iteration directory holding `mp_rank_TT[_PPP][_EEE]/`
 * directories (a checkpoint root around one is the model's business:
 * formats/checkpoint.h, "the root form").
 *
 * Reader.  Every (tp, pp, ep) rank must have `mp_rank_TT[_PPP][_EEE]/
 * model_optim_rng.pt`, the same suffixes on all of them (`_NNN` alone is
 * the EP rank when mp_rank_00_000's args.expert_model_parallel_size > 1,
 * else the PP rank).  Each is a
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
 *     stage, first/last stage layer counts, a pipeline layout) are
 *     refused.  args.expert_model_parallel_size must match the EP
 *     directories, args.expert_tensor_parallel_size (None: TP) must be
 *     TP (the file names carry no expert TP rank), args.num_experts must
 *     divide by EP, args.moe_layer_freq must name the layers holding
 *     experts.
 *   - experts (megatron_int.h, rs_meg_experts): each expert weight of a
 *     layer, in any of megatron-core's three key forms, becomes one
 *     catalog tensor `<layer>.mlp.experts.experts.<param>` with the
 *     global expert axis first (EP rank e's local expert i is e*L + i),
 *     its TP axis split like a dense fc1 (gated [W_t; V_t]) or fc2.
 *     Every local expert of every rank must be there once; other tensors
 *     of EP ranks > 0 must be EP rank 0's in shape and dtype.
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
 *   - Tensors are read with formats/codec/torch_tensor.h; a dict met twice
 *     (the pickle memo can share one) is refused, so a small file cannot
 *     name exponentially many tensors.
 *   - Refused with one line naming the file: a missing rank or
 *     model_optim_rng.pt, a zip or pickle that does not parse, an unknown
 *     GLOBAL, iterations, versions or sizes that differ between ranks, a
 *     tensor one rank has and another lacks, shapes that do not tile,
 *     a layer missing from its chunk, tensor bytes outside their record.
 * The rank directories are hidden from other views; every other file is
 * passed through.
 *
 * View (`-o format=megatron`): for every rank of (tp, pp, ep) a file
 * `mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt` (PP suffix only when pp > 1,
 * EP suffix only when ep > 1; without -o ep= the source's ep), at
 * the top (in the iteration's directory when SOURCE is a root).  Each is a torch.save zip (records as torch writes them, CRC 0 in
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
 * Enum members pickled as getattr(cls, name) (Python 3.11.0-3.11.4) are
 * written as cls(value), as newer Pythons write them, for the enums of
 * megatron-core's safe globals (ModelType, AttnBackend: their 0.15.3
 * values), so weights_only=True loads the view; other members keep the
 * getattr form.
 * args come from TP rank 0 of stage 0 (its rank/local_rank fields too).
 * Models nest as in the source, in Megatron's order, layers numbered per
 * chunk, embeddings in the first chunk, final norm and output layer in
 * the last, `word_embeddings_for_head` in the last chunk when weights are
 * tied and it is not also the first.  Each tensor record holds exactly the
 * rank's shard (a gated dense_h_to_4h: W_r then V_r), in the view's dtype.
 * An expert weight is one record per local expert of the file's EP rank,
 * keyed in SequentialMLP's or TEGroupedMLP's form (-o experts=; default
 * the source's, which a GroupedMLP source must not keep); args'
 * expert_model_parallel_size, expert_tensor_parallel_size and
 * moe_grouped_gemm are rewritten.  etp must be tp.
 * Optimizer, scheduler, rng and rerun state are left out: load with
 * --no-load-optim --no-load-rng (or --finetune).  vpp > 1 needs pp > 1.
 *
 * Errors: as checkpoint.h (lines to the diag list, then -EINVAL).
 */
#ifndef RS_MEGATRON_H
#define RS_MEGATRON_H

#include "formats/checkpoint.h"

/* The megatron row of the format table. */
extern const rs_format_def rs_megatron_format;

#endif
