/* metaseq: metaseq/OPT checkpoints saved as fairscale FSDP flat-parameter
 * shards (docs/FORMATS.md, "metaseq"), as a source and as a view.
 *
 * Files.  At the top of SOURCE, one checkpoint:
 *   <prefix>model_part-<m>-shard<d>.pt   FSDP shard d of model part m
 *   <prefix>model_part-<m>.pt            the only shard of part m
 *                                        (metaseq's reshard-model_part-<m>.pt)
 * where <prefix> is the same for every file ("checkpoint_last-",
 * "reshard-", ...).  Parts 0..M-1 must all be there, each with shards
 * 0..D-1 (D may differ between parts).  Other files are passed through;
 * the shard files are replaced by the view.
 *
 * Each file is a torch.save zip whose data.pkl is a dict; only "model",
 * "shard_metadata" and "cfg" (or fairseq's "args") are read.  The pickle is read by the restricted reader
 * (nothing runs) with an allowlist of the GLOBALs metaseq checkpoints name
 * (torch.*, collections.OrderedDict/defaultdict, argparse.Namespace,
 * metaseq.*, fairseq.*, omegaconf.*, numpy scalars and dtypes); any other
 * GLOBAL, anywhere in the pickle, refuses the mount.
 *
 * "model" maps state-dict keys to tensors: the flat params
 * ("flat_param_0", "decoder.layers.N.flat_param_0", 1-d, shard d's padded
 * chunk) and buffers ("decoder.version").  "shard_metadata" is fairscale's
 * local_metadata_dict():
 *   {"param_metadata": [{"fsdp_path": "decoder.layers.0",
 *                        "params": {"flat_param_0": {"names": [...],
 *                                   "shapes": [torch.Size], "numels": [...],
 *                                   "padding": int}},
 *                        "no_broadcast_optim_state": bool,
 *                        "shared_param_info": [(src, dst)]}, ...],
 *    "buffer_names": [...]}
 * Unflattening follows fairscale's consolidate_shard_weights: each shard's
 * flat param less its trailing `padding`, shards in rank order, split by
 * `numels` in `names` order, each piece reshaped to its shape and named
 * "<fsdp_path>.<name>".  Every piece becomes catalog fragments that point
 * at the stored bytes (a piece may straddle shards and start mid-row: it
 * is cut into boxes).  A shared param (dst) is the same tensor as its src.
 * Every model key that is not a flat param (buffers, unflattened weights)
 * is taken from shard 0, as fairscale does with buffers.
 *
 * Files without shard_metadata (or with an empty one) use `params_file`
 * when given (JSON, two forms, see rs_metaseq_read), else the flat params
 * cfg implies (formats/metaseq/metaseq_int.h, ms_meta_from_cfg: the
 * release form); a params file must agree with cfg where cfg describes
 * the model.  A single-shard part whose keys hold no flat_param is read
 * as unflattened weights as it is.  Otherwise the mount is refused with a
 * line naming what cfg lacks and asking for -o params=FILE.  What cfg
 * says of the model goes into ck->model (family "opt") for the hf view.
 *
 * Parts are merged as metaseq's stitch_fsdp_ckpt.py reshard_megatron_parts
 * does, matching key substrings in this order: "qkv" (a fused [k; v; q]
 * along dim 0 per part, split into k_proj/v_proj/q_proj each concatenated
 * over parts when the key holds ".qkv_proj.", else kept fused as
 * [K; V; Q]), "ffn_layernorm" (dim 0), "layer_norm" (part 0), "fc1",
 * "k_proj", "q_proj", "v_proj" (dim 0), "fc2"/"out_proj" (weight dim 1,
 * bias part 0), "embed_tokens.weight" (dim 0), anything else part 0.
 * Every part must hold the same names; part-0 tensors must have the same
 * dtype and shape in every part, concatenated ones the same dtype and the
 * same extents off the concatenation axis.
 *
 * Validation: sizes are overflow-checked; numels add up to the flat
 * param's unpadded size; each shape's product is its numel; a shard's
 * padding is at most its size; the shards of a part hold flat params of
 * one dtype and size; shard_metadata agrees between the shards of a part;
 * names are plain (no '/', NUL or control bytes, at most 255 bytes) and
 * unique; every tensor lies inside its storage and file; dtypes are ones
 * reshardfs knows; every number is range-checked before it narrows.
 * Every file's cfg must say what part 0's says of the model; the merged
 * vocab must hold dict.txt's symbols (when SOURCE has one), an untied
 * output projection the vocab's rows, the position table cfg's
 * max_target_positions + 2 (formats/metaseq/metaseq_int.h, ms_cfg_agree
 * and ms_check_sizes).
 *
 * View (-o format=metaseq; needs a metaseq source): one torch.save zip
 * per model part of the layout's tp, `restored.pt` at tp 1 and
 * `reshard-model_part-<m>.pt` otherwise, data.pkl {"model": {...},
 * "cfg": {...}}: part m's slice of every tensor (the layout's TP rules),
 * q/k/v fused back into qkv_proj = [k_m; v_m; q_m] when the source fused
 * them, a tied output projection left out, decoder.version kept; cfg the
 * source's scalars as plain dicts, interpolations resolved (what they
 * point to may be left out), with model_parallel_size the view's tp.
 * Loads with torch.load(weights_only=True).
 *
 * Errors: one line per problem in `d`, naming the file (and the flat param
 * or tensor), then -EINVAL; -ENOMEM.  Ownership: everything read goes into
 * `ck` (catalog, entries, model, and in ck->extra the cfg scalars the view
 * writes back).
 */
#ifndef RS_METASEQ_H
#define RS_METASEQ_H

#include "formats/checkpoint.h"

/* The metaseq row of the format table (its default view is
 * safetensors). */
extern const rs_format_def rs_metaseq_format;

#endif
