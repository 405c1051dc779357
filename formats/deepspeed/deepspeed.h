/* deepspeed: DeepSpeed ZeRO checkpoints (docs/FORMATS.md, "DeepSpeed
 * ZeRO") as a source, and the universal checkpoint as a view.
 *
 * SOURCE is a DeepSpeed save directory (a `latest` file naming its tag
 * directory; the HF Trainer's checkpoint-N is one), or a tag directory
 * (global_stepN/) itself.  The tag directory holds, for data-parallel
 * ranks 0..W-1 of model-parallel rank 00:
 *   - stages 1 and 2: mp_rank_00_model_states.pt and
 *     [bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt;
 *   - stage 3: zero_pp_rank_D_mp_rank_00_model_states.pt and the same
 *     optimizer files.
 * Each is a torch.save zip; its data.pkl is read by the restricted pickle
 * reader with rs_deepspeed_allow (torch, OrderedDict and the three
 * DeepSpeed classes an optimizer file names, as data).
 *
 * Reader.  The model is the fp32 master weights: the optimizer files'
 * flat fp32 partitions (single_partition_of_fp32_groups, stages 1-2;
 * fp32_flat_groups, stage 3), cut into the params that the model-states
 * file's param_shapes lists in flat order:
 *   - stages 1-2: group g's flat is the ranks' partitions end to end; its
 *     params lie one after another from element 0, and the flat ends
 *     where they end, both rounded up to 2W (DeepSpeed's alignment);
 *   - stage 3: every param is cut in W parts of ceil(numel/W) elements
 *     (the last padded), rank r's part at the param's place in rank r's
 *     groups laid end to end; those places fill every rank's groups.
 * The optimizer's exp_avg and exp_avg_sq lie in the same places of the
 * same-sized flats and become optimizer.state.exp_avg.<name> and
 * optimizer.state.exp_avg_sq.<name>; each group's step is kept for the
 * universal view.  Frozen params are frozen_param_fragments (whole in
 * stages 1-2; one ceil(numel/W) part per rank's model-states file in
 * stage 3), buffers are the model-states file's module entries that
 * buffer_names lists, and shared_params names other params' tensors (a
 * tied output layer): all as stored.  The module's 16-bit weights are
 * not read.  config.json (the save directory's, else the parent's of a
 * tag directory, else -o hf_config=) makes the hf view possible.
 * Refused with one line naming the file: a missing or extra rank file,
 * files that disagree on stage, world size or groups, param_shapes that
 * do not fill the partitions, a tensor outside its record or not fp32
 * where a master must be, a GLOBAL outside the allowlist, and what this
 * reader does not read (model parallelism, pipeline and expert files).
 *
 * Universal view (-o format=universal): what DeepSpeed's
 * load_universal reads at any world size (formats/deepspeed/universal.c).
 */
#ifndef RS_DEEPSPEED_H
#define RS_DEEPSPEED_H

#include "formats/checkpoint.h"

extern const rs_format_def rs_deepspeed_format;
extern const rs_format_def rs_universal_format;

/* GLOBALs a DeepSpeed checkpoint's pickles may name. */
extern const char *const rs_deepspeed_allow[];

#endif
