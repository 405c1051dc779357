/* bridge: a checkpoint shown under another ecosystem's tensor names -
 * Megatron as an HF transformers Llama (-o format=hf), an HF Llama under
 * megatron-core's names (-o names=mcore), metaseq as HF OPT - by the
 * family tables of formats/model.h.
 *
 * rs_bridge_apply runs between reading SOURCE and resolving the layout:
 * it picks the family (from the source's format and the options), gathers
 * the hyperparameters the target needs into ck->model, and replaces
 * ck->catalog by the target's tensors, each made of pieces of the stored
 * ones (fragments clipped and moved: no tensor is copied).  A view then
 * writes the renamed catalog as it writes any other.
 *
 * Hyperparameters (what the shapes cannot tell):
 *   Megatron -> HF: num_attention_heads, num_key_value_heads, vocab_size
 *     (the true vocab), rms_norm_eps, rope_theta, max_position_embeddings
 *     come from the checkpoint's args (common.pt, or the legacy rank
 *     files), else from -o hf_config=FILE (a JSON object of LlamaConfig
 *     fields; vocab_size also from -o vocab_size=).  What both give must
 *     agree, and so must what the shapes say (hidden_size,
 *     intermediate_size, num_hidden_layers, head_dim, tie_word_embeddings:
 *     tied when SOURCE has no output layer); a conflict is refused naming
 *     the field, and so is a missing fact, naming the option.
 *   HF -> megatron-core: SOURCE's config.json (model_type "llama").
 *
 * User rows: the "names" list of a -o rules= file (reshardfs(1)), tried
 * before the built-in rows of the family they name.
 *
 * Errors: every problem is one line in d; the function then returns
 * -EINVAL (or -ENOMEM).  Nothing is changed in ck on failure but
 * ck->model.
 */
#ifndef RS_BRIDGE_H
#define RS_BRIDGE_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "formats/model.h"

typedef struct {
	const rs_format_def *view;      /* the view to be built */
	const char *names;              /* -o names=: "mcore", or NULL */
	const char *hf_config;          /* -o hf_config=FILE, or NULL */
	const char *rules_file;         /* -o rules=FILE, or NULL */
	uint64_t vocab_size;            /* -o vocab_size=, 0: not given */
	bool packed;                    /* -o hf_experts=packed */
} rs_bridge_opts;

/* Whether the options ask for a bridge on ck: 1 yes (rs_bridge_apply
 * then), 0 no, -EINVAL (reported) when they ask for one this source
 * cannot take. */
int rs_bridge_wanted(const rs_checkpoint *ck, const rs_bridge_opts *o,
		     rs_diag *d);

int rs_bridge_apply(rs_checkpoint *ck, const rs_bridge_opts *o, rs_diag *d);

/* The "names" list of a rules file (the parsed JSON object `root`) as
 * rows for family f (rows naming another family or direction are left
 * out): *rows (owned; rs_bridge_rows_free) and *n.  -EINVAL with a line
 * naming the file and row on a malformed row. */
struct cJSON;
int rs_bridge_rows_parse(const struct cJSON *root, const rs_family *f,
			 const char *path, rs_map_row **rows, size_t *n,
			 rs_diag *d);
void rs_bridge_rows_free(rs_map_row *rows, size_t n);

#endif
